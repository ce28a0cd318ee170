"""``kvsim cache-curve``: the prefix-cache hit rate for every cache size, in one pass.

    kvsim cache-curve ../shared/traces/mooncake/conversation_trace.jsonl --block-size 16 \\
        --model Llama-3.1-8B --gpu h100 --csv curve.csv --html curve.html [--target-hit-rate 0.3]

The workload's block keys at ``--block-size`` (the keys the allocator registers) go through the
one-pass LRU curve (allocator.cache_curve: stack depths) and Belady's MIN at ``--min-sizes``
sizes (the best any eviction policy can do); the GPU pool that vLLM gives ``--model`` on ``--gpu``
is marked (``--num-blocks`` / ``--kv-tokens`` mark a pool of your own). With ``--cpu-offload-gib``
or ``--target-hit-rate`` the CPU tier's curve is drawn too (the prompt-only stream vLLM offloads)
and the planner answers "the smallest GPU + CPU cache that reaches the target"
(planner.cache_plan). docs/OFFLOAD.md says when the curve equals a replay.
"""
from __future__ import annotations

from kvsim.cli import options


def register(subparsers) -> None:
    """Add ``kvsim cache-curve``."""
    p = subparsers.add_parser(
        "cache-curve", help="prefix-cache hit rate for every cache size (LRU) and MIN",
        description="The prefix-cache hit rate of a workload for every cache size in one pass "
                    "(LRU stack distances), Belady's MIN (the offline optimum) at some sizes, "
                    "and the GPU pool of a model on a GPU marked; CSV and an HTML figure.")
    options.add_workload_args(p)
    options.add_model_gpu_args(p)
    options.add_pool_args(p)
    g = p.add_argument_group("the curve")
    g.add_argument("--max-model-len", type=options.positive_int, metavar="TOKENS",
                   help="as the engine applies it (default: the model's context length)")
    g.add_argument("--min-sizes", type=options.nonneg_int, default=40, metavar="K",
                   help="sizes at which MIN is computed, log-spaced (default %(default)s; 0: none)")
    g.add_argument("--target-hit-rate", type=float, metavar="RATE",
                   help="the smallest GPU + CPU cache that reaches this hit rate (0..1)")
    g.add_argument("--cpu-offload-gib", type=float, metavar="GIB",
                   help="mark a CPU offload tier of this size (and draw its curve)")
    o = p.add_argument_group("outputs")
    o.add_argument("--csv", metavar="PATH", help="one row per cache size")
    o.add_argument("--html", metavar="PATH", help="the plotly figure, self-contained")
    p.set_defaults(func=run)


def run(args) -> int:
    import time

    from kvsim import workloads
    from kvsim.cli.outputs import write_files
    from kvsim.planner.cache_plan import curve_report
    from kvsim.planner.engine_setup import build_engine
    from kvsim.simulator.footprint import WorkloadSize, check_requests_in_memory
    from kvsim.simulator.result import prepare_output

    # the output contract (kvsim.cli.outputs): outputs checked before the work
    if args.csv:
        prepare_output(args.csv, (".csv",))
    if args.html:
        prepare_output(args.html, (".html",))
    setup = build_engine(model=options.model_from_args(args), gpu=options.gpu_from_args(args),
                         tensor_parallel_size=args.tp, kv_cache_dtype=args.kv_dtype,
                         gpu_memory_utilization=args.gpu_memory_utilization,
                         non_kv_bytes=options.non_kv_bytes(args), block_size=args.block_size,
                         num_gpu_blocks=args.num_blocks, kv_tokens=args.kv_tokens,
                         max_model_len=args.max_model_len, step_s=1.0)
    # the curve holds the workload's requests in a list: refuse a spec too large for memory
    check_requests_in_memory(WorkloadSize(**workloads.workload_size(
        args.workload, format=args.format, max_requests=args.max_requests)))
    started = time.perf_counter()
    requests = list(workloads.load_at_rate(args.workload, format=args.format, rate=args.rate,
                                           rate_scale=args.rate_scale,
                                           max_requests=args.max_requests, seed=args.seed))
    report = curve_report(requests, setup, kv_dtype=args.kv_dtype, tp=args.tp,
                          cpu_offload_gib=args.cpu_offload_gib,
                          target_hit_rate=args.target_hit_rate, num_min_sizes=args.min_sizes)
    report.lines[0] += f"; curves in {time.perf_counter() - started:.2f} s"
    print("\n".join(report.lines))

    def write_html():
        from kvsim.viz.cache_curve import cache_curve_figure

        fig = cache_curve_figure(report.table, x="cache_gib", marks=report.marks,
                                 title=f"Prefix-cache hit rate by cache size: {args.workload}")
        with open(args.html, "w", encoding="utf-8") as f:
            # a fixed div id: the same workload gives the same bytes (no random UUID)
            f.write(fig.to_html(include_plotlyjs=True, full_html=True, div_id="kvsim-cache-curve",
                                config={"displaylogo": False}))

    write_files([(path, write) for path, write in (
        (args.csv, lambda: report.table.to_csv(args.csv, index=False, float_format="%.6g")),
        (args.html, write_html)) if path])
    return 0
