"""``kvsim replay``: replay a workload (trace file or synthetic spec) through the simulator.

    kvsim replay WORKLOAD --allocator paged --num-blocks 4096 --out result.json \\
        [--timeseries ts.parquet] [--requests req.csv]
    kvsim replay TRACE.csv --format vllm-oracle --step-clock --allocator paged --block-size 16 \\
        --num-blocks 1500 --max-num-seqs 128 --max-num-batched-tokens 2048 --max-model-len 8192 \\
        --out result.json --requests req.csv --timeseries steps.csv

Pool size: ``--num-blocks N`` is vLLM's num_gpu_blocks (block 0 is the null block, N-1 usable;
contiguous allocators get the same usable memory, (N-1)*block_size slots), ``--kv-tokens N`` the
usable KV slots, or ``--model M --gpu G [--gpu-memory-utilization U]`` vLLM's own formula
(planner.capacity). Step time: ``--step-clock`` (one step = one time unit, vLLM's step index;
time series one row per step with the vLLM oracle's column names), ``--step-s S`` (fixed),
``--cost-table CSV`` (measured, simulator.cost.TableCost) or, by default, the planner's roofline
of ``--model`` on ``--gpu``.
"""
from __future__ import annotations

import argparse
import sys

from kvsim import workloads
from kvsim.simulator.config import ALLOCATORS, PLACEMENTS, EngineConfig
from kvsim.simulator.cost import FixedStepCost, TableCost
from kvsim.simulator.engine import ROUTERS, simulate
from kvsim.simulator.result import prepare_output

DEFAULT_MODEL = "Llama-3.1-8B"
DEFAULT_GPU = "H100-80GB-SXM"


def _int_at_least(lo: int):
    """An argparse type: an integer >= lo (argparse turns the error into a one-line usage error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {value}")
        return value
    return parse


_positive_int = _int_at_least(1)
_nonneg_int = _int_at_least(0)


def add_workload_and_engine_args(p: argparse.ArgumentParser, *, allocator: bool = True) -> None:
    """Arguments shared by ``replay`` and ``compare``."""
    p.add_argument("workload", metavar="WORKLOAD",
                   help="trace file (mooncake, azure, sharegpt, vllm-oracle, csv/jsonl) or a "
                        "synthetic spec such as sharegpt:rate=2,n=1000,seed=0")
    p.add_argument("--format", help="trace format (default: sniffed from the file)")
    p.add_argument("--max-requests", type=_positive_int, help="replay only the first N requests")
    p.add_argument("--rate", type=float, help="arrivals/s for sources without timestamps")
    if allocator:
        p.add_argument("--allocator", choices=ALLOCATORS, default="paged",
                       help="paged (vLLM) or a contiguous reservation policy (default paged)")
    p.add_argument("--placement", choices=PLACEMENTS, default="buddy",
                   help="contiguous allocators: arena placement (default buddy)")
    p.add_argument("--block-size", type=_positive_int, default=16, help="tokens per block")
    pool = p.add_mutually_exclusive_group()
    pool.add_argument("--num-blocks", type=_positive_int,
                      help="vLLM's num_gpu_blocks (null block included: N-1 usable)")
    pool.add_argument("--kv-tokens", type=_positive_int, help="usable KV-cache slots")
    p.add_argument("--model", help=f"model preset for capacity and roofline (default {DEFAULT_MODEL})")
    p.add_argument("--gpu", help=f"GPU preset for capacity and roofline (default {DEFAULT_GPU})")
    p.add_argument("--gpu-memory-utilization", type=float, help="vLLM's (default 0.92)")
    p.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel size")
    p.add_argument("--max-num-seqs", type=_positive_int, default=256)
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=8192)
    p.add_argument("--max-model-len", type=_positive_int,
                   help="default 8192 (with --model: the model's context length)")
    p.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    p.add_argument("--long-prefill-token-threshold", type=_nonneg_int, default=0)
    p.add_argument("--no-full-prompt-admission", action="store_true",
                   help="admit when the first chunk fits (vLLM scheduler_reserve_full_isl=False)")
    p.add_argument("--watermark", type=float, default=0.0,
                   help="fraction of blocks kept free when admitting (default 0)")
    p.add_argument("--replicas", type=_positive_int, default=1)
    p.add_argument("--router", choices=ROUTERS, default="round-robin")
    p.add_argument("--seed", type=int, default=0)
    cost = p.add_mutually_exclusive_group()
    cost.add_argument("--step-clock", action="store_true",
                      help="one step = one time unit (vLLM's step index); per-step time series")
    cost.add_argument("--step-s", type=float, help="fixed step time in seconds")
    cost.add_argument("--cost-table", metavar="CSV", help="measured step times (TableCost)")
    p.add_argument("--sample-interval-s", type=float, help="time-series period (default 1 s)")
    p.add_argument("--snapshot-times-s", default="",
                   help="comma-separated times of pool snapshots (kept in memory only)")
    p.add_argument("--no-decode-batching", action="store_true",
                   help="schedule every step in detail (slow; for checking)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _planner_spec(args):
    """(model, gpu) presets from the planner, or None if it is not installed."""
    try:
        from kvsim.planner.presets import get_gpu, get_model
    except ImportError:
        return None
    return get_model(args.model or DEFAULT_MODEL), get_gpu(args.gpu or DEFAULT_GPU)


def build_config(args, allocator: str):
    """EngineConfig and cost model from parsed arguments (raises ValueError on bad input)."""
    B = args.block_size
    spec = None
    max_model_len = args.max_model_len
    num_gpu_blocks = None
    if args.num_blocks is not None:
        num_gpu_blocks = args.num_blocks
    elif args.kv_tokens is not None:
        num_gpu_blocks = args.kv_tokens // B + 1
        if num_gpu_blocks < 2:
            raise ValueError(f"--kv-tokens {args.kv_tokens} is less than one block of {B} tokens")
    else:
        spec = _planner_spec(args)
        if spec is None:
            raise ValueError("give --num-blocks or --kv-tokens (planner/ is not installed for "
                             "--model/--gpu)")
        from kvsim.planner.capacity import compute_capacity
        kwargs = {}
        if args.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = args.gpu_memory_utilization
        report = compute_capacity(spec[0], spec[1], tp=args.tp, block_size=B,
                                  max_model_len=max_model_len, max_num_seqs=args.max_num_seqs,
                                  max_num_batched_tokens=args.max_num_batched_tokens, **kwargs)
        num_gpu_blocks = report.num_gpu_blocks
        max_model_len = report.max_model_len
    if max_model_len is None:
        max_model_len = 8192
    paged = allocator == "paged"
    config = EngineConfig(
        allocator=allocator, placement=args.placement, block_size=B,
        num_blocks=num_gpu_blocks if paged else None,
        capacity_tokens=None if paged else (num_gpu_blocks - 1) * B,
        null_block=paged, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=max_model_len,
        enable_prefix_caching=not args.no_prefix_caching,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        full_prompt_admission=not args.no_full_prompt_admission, watermark=args.watermark)
    if args.step_clock:
        cost = FixedStepCost(1.0)
    elif args.step_s is not None:
        cost = FixedStepCost(args.step_s)
    elif args.cost_table:
        cost = TableCost(args.cost_table)
    else:
        spec = spec or _planner_spec(args)
        if spec is None:
            raise ValueError("no step-time model: give --step-clock, --step-s or --cost-table "
                             "(planner/ is not installed for the roofline)")
        from kvsim.planner.roofline import RooflineCost
        cost = RooflineCost(spec[0], spec[1], tp=args.tp)
    return config, cost


def _snapshot_times(text: str) -> list[float]:
    times = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            times.append(float(part))
        except ValueError:
            raise ValueError(f"--snapshot-times-s: not a number: {part!r}") from None
    return times


def run_one(args, allocator: str, record_requests: bool = True):
    """Load the workload and simulate it with one allocator; returns the Result."""
    config, cost = build_config(args, allocator)
    requests = workloads.load(args.workload, format=args.format, max_requests=args.max_requests,
                              rate=args.rate, seed=args.seed)
    return simulate(requests, config, cost, replicas=args.replicas, router=args.router,
                    sample_interval_s=args.sample_interval_s,
                    snapshot_times_s=_snapshot_times(args.snapshot_times_s), seed=args.seed,
                    progress=not args.quiet, record_steps=args.step_clock,
                    batch_decode_steps=not args.no_decode_batching,
                    record_requests=record_requests)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "replay", help="replay a workload through one allocator",
        description="Replay a trace or synthetic workload through the vLLM-faithful scheduler "
                    "and one allocator; write the summary (JSON), time series and requests.")
    add_workload_and_engine_args(p)
    p.add_argument("--out", required=True, help="summary JSON (stable keys)")
    p.add_argument("--timeseries", help="time series (.parquet or .csv)")
    p.add_argument("--requests", help="per-request table (.csv or .parquet)")
    p.set_defaults(func=run)


def run(args) -> int:
    # check every output before the run: minutes of simulation must not be lost at the end
    prepare_output(args.out)
    for path in (args.timeseries, args.requests):
        if path:
            prepare_output(path, (".csv", ".parquet"))
    result = run_one(args, args.allocator, record_requests=bool(args.requests))
    result.write_json(args.out)
    if args.timeseries:
        result.write_timeseries(args.timeseries)
    if args.requests:
        result.write_requests(args.requests)
    s = result.summary
    print(f"{s['requests_finished']} requests finished ({s['requests_rejected']} rejected) in "
          f"{s['simulated_duration_s']:.3f} simulated s, {s['num_steps']} steps, "
          f"{s['num_preemptions']} preemptions, prefix hit rate {s['prefix_hit_rate']:.3f}, "
          f"wall {s['wall_clock_s']:.2f} s -> {args.out}")
    if s["requests_rejected"]:
        print(f"kvsim: warning: {s['requests_rejected']} requests could never fit "
              "(prompt >= max_model_len, or larger than the pool); see --requests 'rejected'",
              file=sys.stderr)
    return 0
