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
from kvsim.errors import InputError


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
    from kvsim.allocator.block_stream import block_stream
    from kvsim.allocator.cache_curve import lru_curve
    from kvsim.planner.cache_plan import curve_table, plan_cache
    from kvsim.planner.engine_setup import build_engine
    from kvsim.planner.specs import GIB
    from kvsim.planner.tiers import block_bytes, checked_chunks, chunk_bytes
    from kvsim.simulator.result import prepare_output

    if args.target_hit_rate is not None and not 0 < args.target_hit_rate <= 1:
        raise InputError(f"must be in (0, 1], got {args.target_hit_rate}",
                         field="--target-hit-rate")
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
    cfg = setup.config
    per_rank, copies = block_bytes(setup.model, args.kv_dtype, args.tp, args.block_size)
    gib_per_block = per_rank * copies / GIB
    gpu_blocks = cfg.pool_blocks - int(cfg.null_block)
    started = time.perf_counter()
    reqs = list(workloads.load(args.workload, format=args.format, max_requests=args.max_requests,
                               rate=args.rate, seed=args.seed))
    stream = block_stream(reqs, args.block_size, max_model_len=cfg.max_model_len)
    curve = lru_curve(stream)
    want_cpu = args.cpu_offload_gib or args.target_hit_rate is not None
    cpu_curve = None
    if want_cpu:
        cpu_curve = lru_curve(block_stream(reqs, args.block_size, max_model_len=cfg.max_model_len,
                                           prompt_only=True), free_queue=False)
    del reqs
    cpu_chunks = None
    if args.cpu_offload_gib is not None:
        cpu_chunks = checked_chunks(args.cpu_offload_gib, per_rank, copies, "--cpu-offload-gib")
    extra = [gpu_blocks] + ([cpu_chunks] if cpu_chunks else [])
    table = curve_table(stream, curve, bytes_per_block=per_rank * copies,
                        num_min_sizes=args.min_sizes, extra_sizes=extra)
    if cpu_curve is not None:
        table["cpu_tier_hit_rate"] = cpu_curve.hit_rate(table["cache_blocks"].to_numpy())
    took = time.perf_counter() - started
    model_gpu = f"{setup.model.name} on {args.tp} x {setup.gpu.name}" if setup.capacity else \
        f"{cfg.pool_blocks:,} blocks"
    rate = float(curve.hit_rate(gpu_blocks))
    at_pool = table.loc[table["cache_blocks"] == gpu_blocks, "min_hit_rate"]
    min_note = f", MIN {float(at_pool.iloc[0]):.4f}" if at_pool.notna().any() else ""
    print(f"{stream.num_requests:,} requests ({stream.num_rejected:,} rejected by max_model_len "
          f"{cfg.max_model_len:,}), block size {args.block_size}: {stream.num_block_touches:,} "
          f"block touches, {stream.num_distinct_blocks:,} distinct blocks; curve in {took:.2f} s")
    print(f"GPU pool ({model_gpu}): {gpu_blocks:,} blocks, {gpu_blocks * gib_per_block:.2f} GiB: "
          f"LRU hit rate {rate:.4f}{min_note}")
    print(f"an unbounded cache: {float(curve.hit_rate(curve.max_useful_blocks)):.4f} from "
          f"{curve.max_useful_blocks:,} blocks ({curve.max_useful_blocks * gib_per_block:.2f} GiB)")
    if cpu_chunks:
        print(f"CPU tier ({args.cpu_offload_gib:g} GiB, {cpu_chunks:,} chunks): CPU-tier curve "
              f"{float(cpu_curve.hit_rate(cpu_chunks)):.4f}")
    if args.target_hit_rate is not None:
        print(plan_cache(curve, cpu_curve, args.target_hit_rate, gpu_blocks=gpu_blocks,
                         chunk_bytes=chunk_bytes(per_rank, copies), min_stream=stream).describe())
    if args.csv:
        table.to_csv(args.csv, index=False, float_format="%.6g")
    if args.html:
        from kvsim.viz.cache_curve import cache_curve_figure

        marks = {f"GPU pool ({model_gpu})": gpu_blocks * gib_per_block}
        if cpu_chunks:
            marks[f"CPU tier {args.cpu_offload_gib:g} GiB"] = cpu_chunks * gib_per_block
        fig = cache_curve_figure(table, x="cache_gib", marks=marks,
                                 title=f"Prefix-cache hit rate by cache size: {args.workload}")
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(fig.to_html(include_plotlyjs=True, full_html=True))
    return 0
