"""How many more requests gpt-oss-120b runs at once thanks to its sliding-window layers: the
Azure conversation trace replayed on one H100 and one H200, with vLLM's hybrid KV-cache manager
(18 sliding-window layers of 128 tokens + 18 full-attention layers: two KV-cache groups) and
with every layer full (vLLM's --disable-hybrid-kv-cache-manager: one group of 36 layers).

Both sides: vLLM's pool for the model on the GPU (planner.capacity: MXFP4 weights, vLLM 0.33's
gpu_memory_utilization 0.92, the GPU's `vllm serve` batch limits), max_model_len 131072, prefix
caching on, the roofline step time; the trace at its own rate and re-timed to 4x and 8x (the
pool binds only when enough requests are in flight).

    python bench/hybrid_concurrency.py [--scales 1 4 8] [--gpus H100-80GB-SXM H200]
                                       [--max-requests N] [--json runs/hybrid_concurrency.json]

Prints one row per (GPU, rate, mode) and the ratio of mean running requests.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AZURE = ROOT.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"


def run_one(gpu: str, rate: float | None, full: bool, max_requests: int | None) -> dict:
    from kvsim.planner.capacity import vllm_batch_defaults
    from kvsim.planner.engine_setup import build_engine
    from kvsim.planner.presets import get_gpu
    from kvsim.planner.sweep import load_requests
    from kvsim.simulator import simulate

    seqs, tokens = vllm_batch_defaults(get_gpu(gpu))
    setup = build_engine(model="gpt-oss-120b", gpu=gpu, max_num_seqs=seqs,
                         max_num_batched_tokens=tokens, disable_hybrid_kv_cache_manager=full)
    requests = load_requests(str(AZURE), rate=rate, max_requests=max_requests)
    t0 = time.perf_counter()
    s = simulate(requests, setup.config, setup.cost, record_requests=False).summary
    cap = setup.capacity
    return {"gpu": gpu, "mode": "every layer full" if full else "hybrid (sliding + full)",
            "rate_per_s": round(len(requests) / max(requests[-1].arrival_s
                                                     - requests[0].arrival_s, 1e-9), 3),
            "num_gpu_blocks": cap.num_gpu_blocks, "kv_cache_tokens": cap.kv_cache_tokens,
            "max_concurrency_131k": round(cap.max_concurrency, 2),
            "requests": s["requests_finished"], "mean_running": s["mean_running"],
            "max_running": s["max_running"], "mean_waiting": s["mean_waiting"],
            "preemptions": s["num_preemptions"], "ttft_p50_s": s["ttft_s"]["p50"],
            "ttft_p99_s": s["ttft_s"]["p99"], "e2e_mean_s": s["e2e_s"]["mean"],
            "output_tokens_per_s": s["output_throughput_tokens_per_s"],
            "mean_kv_usage": s["mean_kv_usage"], "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", type=float, nargs="*", default=[1, 4, 8])
    ap.add_argument("--gpus", nargs="*", default=["H100-80GB-SXM", "H200"])
    ap.add_argument("--max-requests", type=int)
    ap.add_argument("--json", default=str(ROOT / "runs" / "hybrid_concurrency.json"))
    a = ap.parse_args(argv)
    if not AZURE.exists():
        print(f"skipped: {AZURE} is absent")
        return 0
    from kvsim.planner.sweep import load_requests

    base = load_requests(str(AZURE), max_requests=a.max_requests)
    native = len(base) / (base[-1].arrival_s - base[0].arrival_s)
    rows = []
    cols = ["gpu", "mode", "rate_per_s", "num_gpu_blocks", "mean_running", "max_running",
            "preemptions", "ttft_p50_s", "ttft_p99_s", "output_tokens_per_s", "wall_s"]
    print("  ".join(cols))
    for gpu in a.gpus:
        for scale in a.scales:
            pair = []
            for full in (False, True):
                row = run_one(gpu, None if scale == 1 else native * scale, full, a.max_requests)
                row["rate_scale"] = scale
                pair.append(row)
                rows.append(row)
                print("  ".join(str(row[c]) for c in cols), flush=True)
            print(f"  {gpu} x{scale:g}: hybrid runs {pair[0]['mean_running'] / pair[1]['mean_running']:.2f}x "
                  f"the mean running requests ({pair[0]['mean_running']:.1f} vs "
                  f"{pair[1]['mean_running']:.1f}), max {pair[0]['max_running']} vs "
                  f"{pair[1]['max_running']}", flush=True)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
