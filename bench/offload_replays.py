"""CPU offload tiers on a real trace: hit rate, TTFT and throughput against the CPU tier's size.

Replays ../shared/traces/mooncake/conversation_trace.jsonl (12,031 requests) as
`kvsim replay TRACE --model Llama-3.1-8B --gpu h100 --cpu-offload-gib G` does (vLLM's pool for
the model on the GPU, roofline step times, max_model_len 131072, the GPU's PCIe 5.0 link), once
per size, and prints one Markdown row per size. ``--rate-scale`` stretches the arrival times
(2.0 = half the arrival rate), to see the tiers on a server that keeps up.

    python bench/offload_replays.py [--gib 0,64,256,1024] [--rate-scale 1.0] [--trace PATH]
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--gib", default="0,64,256,1024")
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--model", default="Llama-3.1-8B")
    ap.add_argument("--gpu", default="H100-80GB-SXM")
    args = ap.parse_args()
    if not Path(args.trace).is_file():
        print(f"offload_replays: trace not found: {args.trace}", file=sys.stderr)
        return 2
    from kvsim import workloads
    from kvsim.planner.engine_setup import build_engine
    from kvsim.simulator import simulate

    reqs = list(workloads.load(args.trace))
    if args.rate_scale != 1.0:
        reqs = [replace(r, arrival_s=r.arrival_s * args.rate_scale) for r in reqs]
    print(f"{platform.node()}, python {platform.python_version()}, {time.strftime('%Y-%m-%d')}: "
          f"{args.trace} ({len(reqs):,} requests, arrival times x{args.rate_scale:g}), "
          f"{args.model} on {args.gpu}")
    print("| CPU offload GiB | chunks | GPU hit rate | CPU hit tokens | GPU + CPU hit rate | "
          "TTFT p50 s | TTFT p99 s | output tok/s | prompt tokens computed | loaded GiB | "
          "stored GiB | wall s |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for gib in (float(g) for g in args.gib.split(",")):
        setup = build_engine(model=args.model, gpu=args.gpu, cpu_offload_gib=gib)
        t0 = time.perf_counter()
        s = simulate(iter(reqs), setup.config, setup.cost, offload=setup.offload).summary
        wall = time.perf_counter() - t0
        o = s.get("offload")
        chunks = o["tiers"][0]["num_chunks"] if o else 0
        cpu_hits = o["hit_tokens"]["cpu"] if o else 0
        combined = o["combined_hit_rate"] if o else s["prefix_hit_rate"]
        moved = (sum(o["loaded_bytes"].values()) / 2**30, sum(o["stored_bytes"].values()) / 2**30) \
            if o else (0.0, 0.0)
        print(f"| {gib:g} | {chunks:,} | {s['prefix_hit_rate']:.4f} | {cpu_hits:,} | "
              f"{combined:.4f} | {s['ttft_s']['p50']:.2f} | {s['ttft_s']['p99']:.2f} | "
              f"{s['output_throughput_tokens_per_s']:.1f} | {s['computed_prompt_tokens']:,} | "
              f"{moved[0]:.1f} | {moved[1]:.1f} | {wall:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
