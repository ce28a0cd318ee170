"""Hit-rate curve speed: the LRU curve at every cache size and MIN at K sizes, against one replay.

Trace: ../shared/traces/mooncake/conversation_trace.jsonl (12,031 requests), block size 16.
Curve: load the trace, build the block stream (runs), the LRU curve at every size (one pass),
Belady's MIN at ``--min-sizes`` log-spaced sizes (one pass each). Replay: the same trace through
`simulate` as `kvsim replay TRACE --model Llama-3.1-8B --gpu h100` runs it (vLLM's num_gpu_blocks
from planner.capacity, roofline step times, max_model_len 131072, max_num_seqs 256,
max_num_batched_tokens 8192). Order: curve, replay, curve (the machine is shared and noisy; the
curve's figure is the faster of its two runs).

    python bench/cache_curve.py [--trace PATH] [--block-size 16] [--min-sizes 64]
    python bench/cache_curve.py --gap 2048,8192,28873,131072 [--one-at-a-time]

Prints CPU and wall seconds of each part, and the hit rates at the GPU pool's size: the replay's,
the LRU curve's and MIN's. ``--gap`` replays the trace at those pool sizes (num_gpu_blocks) and
prints, per size, the replay's hit rate, the LRU curve's at the pool's usable blocks and at the
blocks the replay left for reuse on average (cached + free), and MIN's; ``--one-at-a-time``
re-times the trace so that each request arrives after the previous one finished (where the
curve is exact).
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
MODEL, GPU, MAX_MODEL_LEN = "Llama-3.1-8B", "H100-80GB-SXM", 131072


def _timed(fn):
    cpu0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - cpu0, time.perf_counter() - t0


def curve(trace: str, block_size: int, num_min_sizes: int, pool_blocks: int) -> dict:
    from kvsim import workloads
    from kvsim.allocator.block_stream import block_stream
    from kvsim.allocator.cache_curve import lru_curve, min_hit_blocks

    parts = {}
    reqs, *parts["load"] = _timed(lambda: list(workloads.load(trace)))
    stream, *parts["stream"] = _timed(lambda: block_stream(reqs, block_size,
                                                           max_model_len=MAX_MODEL_LEN))
    lru, *parts["lru (every size)"] = _timed(lambda: lru_curve(stream))
    sizes = np.unique(np.concatenate([
        np.geomspace(64, max(65, lru.max_useful_blocks), num_min_sizes).astype(np.int64),
        [pool_blocks]]))
    opt, *parts[f"min ({len(sizes)} sizes)"] = _timed(lambda: min_hit_blocks(stream, sizes))
    at_pool = int(np.searchsorted(sizes, pool_blocks))
    return {"parts": parts, "stream": stream, "lru": lru,
            "min_rate_at_pool": opt[at_pool] * block_size / stream.num_query_tokens}


def replay(trace: str, block_size: int) -> tuple[dict, float, float, int]:
    from kvsim import workloads
    from kvsim.planner.capacity import compute_capacity
    from kvsim.planner.presets import get_gpu, get_model
    from kvsim.planner.roofline import RooflineCost
    from kvsim.simulator import EngineConfig, simulate

    model, gpu = get_model(MODEL), get_gpu(GPU)
    report = compute_capacity(model, gpu, max_model_len=MAX_MODEL_LEN, max_num_seqs=256,
                              max_num_batched_tokens=8192, block_size=block_size)
    config = EngineConfig(num_blocks=report.num_gpu_blocks, null_block=True,
                          block_size=block_size, max_num_seqs=256, max_num_batched_tokens=8192,
                          max_model_len=MAX_MODEL_LEN)
    result, cpu, wall = _timed(lambda: simulate(workloads.load(trace), config,
                                                RooflineCost(model, gpu), progress=False))
    return result.summary, cpu, wall, report.num_gpu_blocks


def gap(trace: str, block_size: int, pools: list[int], one_at_a_time: bool) -> None:
    """Replays at several pool sizes against the curve (see the module doc)."""
    from dataclasses import replace

    from kvsim import workloads
    from kvsim.allocator.block_stream import block_stream
    from kvsim.allocator.cache_curve import lru_curve, min_hit_blocks
    from kvsim.planner.presets import get_gpu, get_model
    from kvsim.planner.roofline import RooflineCost
    from kvsim.simulator import EngineConfig, simulate

    reqs = list(workloads.load(trace))
    if one_at_a_time:       # 1000 s apart: longer than any request takes on one H100
        reqs = [replace(r, arrival_s=1000.0 * i) for i, r in enumerate(reqs)]
    stream = block_stream(reqs, block_size, max_model_len=MAX_MODEL_LEN)
    lru = lru_curve(stream)
    opt = min_hit_blocks(stream, [p - 1 for p in pools])
    model, gpu = get_model(MODEL), get_gpu(GPU)
    print("| num_gpu_blocks | replay | LRU at pool | replay - LRU, tokens | mean cached + free "
          "blocks | LRU there | MIN at pool | preemptions | mean running |\n"
          "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for pool, best in zip(pools, opt):
        config = EngineConfig(num_blocks=pool, null_block=True, block_size=block_size,
                              max_num_seqs=256, max_num_batched_tokens=8192,
                              max_model_len=MAX_MODEL_LEN)
        s = simulate(iter(reqs), config, RooflineCost(model, gpu), progress=False).summary
        reuse = int((s["memory_breakdown"]["cached"] + s["memory_breakdown"]["free"]) * (pool - 1))
        diff = s["prefix_hit_tokens"] - int(lru.hit_tokens(pool - 1))
        print(f"| {pool:,} | {s['prefix_hit_rate']:.4f} | {float(lru.hit_rate(pool - 1)):.4f} | "
              f"{diff:,} | {reuse:,} | {float(lru.hit_rate(reuse)):.4f} | "
              f"{best * block_size / stream.num_query_tokens:.4f} | {s['num_preemptions']:,} | "
              f"{s['mean_running']:.1f} |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--min-sizes", type=int, default=64)
    ap.add_argument("--gap", help="comma-separated pool sizes (num_gpu_blocks) to replay")
    ap.add_argument("--one-at-a-time", action="store_true")
    args = ap.parse_args()
    if not Path(args.trace).is_file():
        print(f"cache_curve: trace not found: {args.trace}", file=sys.stderr)
        return 2
    if args.gap:
        gap(args.trace, args.block_size, [int(p) for p in args.gap.split(",")],
            args.one_at_a_time)
        return 0
    from kvsim.planner.capacity import compute_capacity
    from kvsim.planner.presets import get_gpu, get_model
    pool = compute_capacity(get_model(MODEL), get_gpu(GPU), max_model_len=MAX_MODEL_LEN,
                            max_num_seqs=256, max_num_batched_tokens=8192,
                            block_size=args.block_size).num_gpu_blocks
    usable = pool - 1                    # the null block
    first = curve(args.trace, args.block_size, args.min_sizes, usable)
    summary, replay_cpu, replay_wall, _ = replay(args.trace, args.block_size)
    second = curve(args.trace, args.block_size, args.min_sizes, usable)
    best = min((first, second), key=lambda c: sum(cpu for cpu, _ in c["parts"].values()))
    stream, lru = best["stream"], best["lru"]
    print(f"{platform.node()} {platform.processor() or platform.machine()}, "
          f"python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    print(f"trace {args.trace}: {stream.num_requests:,} requests, block size {args.block_size}: "
          f"{stream.num_block_touches:,} block touches, {stream.num_distinct_blocks:,} distinct "
          f"blocks, {len(stream.reuse_runs):,} reuse runs, {len(stream.next_runs):,} next runs")
    print("| part | CPU s | wall s |\n|---|---:|---:|")
    total_cpu = total_wall = 0.0
    for name, (cpu, wall) in best["parts"].items():
        print(f"| {name} | {cpu:.2f} | {wall:.2f} |")
        total_cpu += cpu
        total_wall += wall
    print(f"| **curve, total** | **{total_cpu:.2f}** | **{total_wall:.2f}** |")
    print(f"| one replay ({MODEL} on {GPU}, {pool:,} blocks) | {replay_cpu:.2f} | "
          f"{replay_wall:.2f} |")
    print(f"hit rate at the GPU pool ({usable:,} usable blocks): replay "
          f"{summary['prefix_hit_rate']:.4f}, LRU curve {float(lru.hit_rate(usable)):.4f}, "
          f"MIN {best['min_rate_at_pool']:.4f}; infinite cache "
          f"{float(lru.hit_rate(lru.max_useful_blocks)):.4f} from "
          f"{lru.max_useful_blocks:,} blocks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
