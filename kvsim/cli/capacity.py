"""``kvsim capacity``: vLLM's KV-cache capacity for a model on a GPU, optionally with a replay.

    kvsim capacity --model Llama-3.1-8B --gpu h100 --max-model-len 8192
    kvsim capacity --hf-config path/config.json --gpu-memory-gib 44 --gpu-bandwidth-gbps 864 \
        --gpu-tflops 362 --tp 2 --kv-dtype fp8 --json
    kvsim capacity --model Llama-3.1-8B --gpu h100 ../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv
"""
from __future__ import annotations

import json

from kvsim.cli import options
from kvsim.errors import InputError
from kvsim.planner.capacity import CapacityReport
from kvsim.planner.specs import GIB


def capacity_report(args) -> CapacityReport:
    """vLLM's sizing for the flags: the capacity report of the pool a replay would get."""
    from kvsim.planner.engine_setup import build_engine

    return build_engine(**options.engine_kwargs(args)).capacity


def format_report(r: CapacityReport) -> str:
    """The human-readable report (vLLM's own log wording for the last two lines)."""
    gib = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
    non_kv = (f"{gib(r.non_kv_bytes)} (given)" if r.non_kv_given else
              f"{gib(r.non_kv_bytes)} = weights {gib(r.weight_bytes)} + activations (est.) "
              f"{gib(r.activation_bytes)} + non-torch (est.) {gib(r.non_torch_bytes)}")
    lines = [
        f"model {r.model} on {r.tp} x {r.gpu}, KV dtype {r.kv_dtype} ({r.kv_dtype_bytes} B), "
        f"block_size {r.block_size}, max_model_len {r.max_model_len}",
        f"KV heads per GPU:          {r.kv_heads_per_rank}",
        f"KV bytes per token:        {r.kv_bytes_per_token:,} B per GPU ({r.kv_bytes_per_token / 1024:.1f} KiB)",
        f"bytes per block:           {r.bytes_per_block:,} B ({r.bytes_per_block / 2**20:.3f} MiB)",
        f"GPU memory x utilization:  {gib(r.total_memory_bytes)} x {r.gpu_memory_utilization} = {gib(r.budget_bytes)}",
        f"non-KV memory:             {non_kv}",
        f"available KV cache memory: {gib(r.available_kv_bytes)}",
        f"num_gpu_blocks:            {r.num_gpu_blocks:,}",
        f"GPU KV cache size:         {r.kv_cache_tokens:,} tokens",
        f"Maximum concurrency for {r.max_model_len:,} tokens per request: {r.max_concurrency:.2f}x",
    ]
    if r.weight_format:
        lines.insert(6, f"weights as served:         {r.weight_format}")
    if r.kv_groups:
        lines += format_groups(r)
    return "\n".join(lines)


def format_groups(r: CapacityReport) -> list[str]:
    """The per-group table of a model with per-layer shapes (vLLM's KV-cache groups: one block
    table each, all in the pool of num_gpu_blocks blocks of bytes_per_block)."""
    lines = [f"KV-cache groups ({len(r.kv_groups)}; every group's block is one pool block of "
             f"{r.bytes_per_block:,} B):",
             f"  {'group':<5} {'kind':<15} {'layers':>6} {'window':>7} {'block':>6} "
             f"{'page/layer B':>13} {'bytes/token':>12} {'blocks/request':>15}"]
    for i, g in enumerate(r.kv_groups):
        window = "-" if g["sliding_window"] is None else f"{g['sliding_window']:,}"
        # a Mamba block holds one request's state, not tokens
        per_token = "state" if g["kind"] == "mamba" else f"{g['bytes_per_token']:,.1f}"
        lines.append(f"  {i:<5} {g['kind']:<15} {g['num_layers']:>6} {window:>7} "
                     f"{g['block_size']:>6} {g['page_bytes_per_layer']:>13,} "
                     f"{per_token:>12} {g['blocks_per_request']:>15,}")
    return lines


def simulate_workload(args) -> dict:
    """Replay the workload through the capacity's pool (planner.sweep, one point); the sweep row."""
    from kvsim.cli.plan import plan_base
    from kvsim.planner.sweep import PointTask, evaluate_point

    row = evaluate_point(PointTask(0, {}, plan_base(args)))
    if row.get("error"):
        raise InputError(row["error"])
    return row


def _sim_figures(row: dict) -> dict:
    from kvsim.planner.slo import resolve_metric

    out = {}
    for label, metric in (("mean running requests", "mean_running"), ("max running requests", "max_running"),
                          ("preemptions", "preemptions"), ("p99 TTFT (s)", "ttft_p99")):
        try:
            out[label] = resolve_metric(row, metric)
        except InputError:
            out[label] = None
    return out


def trace_lengths(args):
    """prompt + output tokens of every request of the workload (at most --max-requests)."""
    from array import array

    from kvsim import workloads
    from kvsim.simulator.footprint import WorkloadSize, check_memory

    size = WorkloadSize(**workloads.workload_size(args.workload, max_requests=args.max_requests))
    if size.num_requests is not None:  # 8 bytes a request
        check_memory({"request lengths": 8 * size.num_requests}, f"{size.num_requests:,} request lengths")
    lengths = array("q")
    for req in workloads.load_at_rate(args.workload, rate=args.rate, rate_scale=args.rate_scale,
                                      max_requests=args.max_requests, seed=args.seed):
        lengths.append(req.prompt_tokens + req.output_tokens)
    return lengths


def format_trace_concurrency(r: CapacityReport, at: dict, source: str, num_requests: int) -> str:
    """The lead lines of ``capacity WORKLOAD``: how many of the trace's requests fit at once."""
    lines = [f"{source}: how many of its {num_requests:,} requests fit in the KV cache at once",
             f"({r.num_gpu_blocks:,} blocks of {r.block_size} tokens; length = prompt + output):"]
    for name in ("mean", "p50", "p99"):
        a = at[name]
        lines.append(f"  at the {name:<4} length {a['tokens']:>9,} tokens ({a['blocks']:>6,} blocks): "
                     f"{a['concurrency']:,.2f}")
    lines.append(f"  KV memory's limit; lengths capped at max_model_len {r.max_model_len:,}; the "
                 f"scheduler runs at most max_num_seqs = {r.max_num_seqs:,} at once")
    return "\n".join(lines)


def run(args) -> int:
    priced = options.given_flags(args)
    if priced and not args.workload:    # no replay without a workload: nothing to time
        raise InputError(f"{', '.join(priced)} {'prices' if len(priced) == 1 else 'price'} a replay's steps; "
                         f"kvsim capacity replays none without a WORKLOAD",
                         field=priced[0].lstrip("-").replace("-", "_"))
    report = capacity_report(args)
    out = {"capacity": report.to_dict()}
    if args.workload:
        lengths = trace_lengths(args)
        out["trace_concurrency"] = {"num_requests": len(lengths),
                                    **report.concurrency_at_lengths(lengths)}
    if args.concurrency_tokens:
        out["capacity"]["concurrency_for_tokens"] = {
            "tokens": args.concurrency_tokens, "concurrency": report.concurrency_for(args.concurrency_tokens)}
    if args.workload:
        row = simulate_workload(args)
        out["simulation"] = {k: v for k, v in row.items() if "wall" not in k}
        out["simulated"] = _sim_figures(row)
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    if args.workload:   # the number a user asks first: how many of these requests fit
        print(format_trace_concurrency(report, out["trace_concurrency"], args.workload, len(lengths)))
        print()
    print(format_report(report))
    if args.concurrency_tokens:
        print(f"Maximum concurrency for {args.concurrency_tokens:,} tokens per request: "
              f"{report.concurrency_for(args.concurrency_tokens):.2f}x")
    if args.workload:
        print(f"simulated on {args.workload}:")
        for label, value in out["simulated"].items():
            print(f"  {label:<22} {'n/a' if value is None else f'{value:,.4g}'}")
    return 0


def register(subparsers) -> None:
    """Add ``kvsim capacity``."""
    p = subparsers.add_parser(
        "capacity", help="KV-cache capacity (vLLM's num_gpu_blocks) for a model on a GPU",
        description="vLLM's KV-cache sizing: KV bytes per token, num_gpu_blocks, KV tokens and "
                    "maximum concurrency; with a WORKLOAD, also a simulated replay on that pool.")
    options.add_workload_args(p, required=False, trace_format=False)
    options.add_model_gpu_args(p)
    options.add_pool_args(p, explicit_size=False)
    options.add_scheduler_args(p, batch_defaults=None)
    options.flags_given(p, options.add_step_time_args(p))
    options.add_serving_args(p)
    p.add_argument("--concurrency-tokens", type=options.positive_int, metavar="L",
                   help="also print vLLM's maximum concurrency for L tokens per request")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)
