"""``kvsim capacity``: vLLM's KV-cache capacity for a model on a GPU, optionally with a replay.

    kvsim capacity --model Llama-3.1-8B --gpu h100 --max-model-len 8192
    kvsim capacity --hf-config path/config.json --gpu-memory-gib 44 --gpu-bandwidth-gbps 864 \
        --gpu-tflops 362 --tp 2 --kv-dtype fp8 --json
    kvsim capacity --model Llama-3.1-8B --gpu h100 ../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv
"""
from __future__ import annotations

import argparse
import json
import sys

from kvsim.planner.capacity import (DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION, KV_DTYPES,
                              CapacityReport, compute_capacity)
from kvsim.planner.presets import GPU_PRESETS, MODEL_PRESETS, custom_gpu, get_gpu, get_model, load_hf_config
from kvsim.planner.specs import GIB, GpuSpec, ModelSpec
from kvsim.errors import InputError


def add_model_gpu_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``capacity`` and ``plan``: model, GPU, parallelism and cache settings."""
    g = p.add_argument_group("model and GPU")
    g.add_argument("--model", default="Llama-3.1-8B",
                   help=f"model preset ({', '.join(MODEL_PRESETS)}); default %(default)s")
    g.add_argument("--hf-config", metavar="PATH", help="a Hugging Face config.json instead of a preset")
    g.add_argument("--gpu", default="H100-80GB-SXM",
                   help=f"GPU preset ({', '.join(GPU_PRESETS)}); default %(default)s")
    g.add_argument("--gpu-memory-gib", type=float, metavar="GIB",
                   help="custom GPU: total memory as the driver reports it (GiB); with the two below")
    g.add_argument("--gpu-bandwidth-gbps", type=float, metavar="GB/S", help="custom GPU: memory bandwidth")
    g.add_argument("--gpu-tflops", type=float, metavar="TFLOPS", help="custom GPU: dense BF16 peak")
    g.add_argument("--gpu-fp8-tflops", type=float, metavar="TFLOPS", help="custom GPU: dense FP8 peak")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    g.add_argument("--kv-dtype", default="auto", choices=KV_DTYPES,
                   help="KV-cache dtype; auto = model dtype; fp8 halves KV bytes")
    g.add_argument("--gpu-memory-utilization", type=float, default=DEFAULT_GPU_MEMORY_UTILIZATION,
                   help="fraction of GPU memory vLLM may use (default %(default)s, vLLM 0.33's)")
    g.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="tokens per KV block")
    g.add_argument("--max-model-len", type=int, help="longest request; default the model's context length")
    g.add_argument("--max-num-seqs", type=int, help="default: vLLM's for the GPU")
    g.add_argument("--max-num-batched-tokens", type=int, help="default: vLLM's for the GPU")
    g.add_argument("--non-kv-gib", type=float, metavar="GIB",
                   help="per-GPU memory that is not KV cache (weights + activations + non-torch), "
                        "e.g. from a vLLM log; replaces our estimate")


def model_from_args(args) -> ModelSpec:
    return load_hf_config(args.hf_config) if args.hf_config else get_model(args.model)


def gpu_from_args(args) -> GpuSpec:
    flags = (args.gpu_memory_gib, args.gpu_bandwidth_gbps, args.gpu_tflops)
    if all(v is None for v in flags) and args.gpu_fp8_tflops is None:
        return get_gpu(args.gpu)
    if any(v is None for v in flags):
        raise InputError("a custom GPU needs --gpu-memory-gib, --gpu-bandwidth-gbps and --gpu-tflops "
                         "together", field="gpu")
    return custom_gpu(args.gpu_memory_gib, args.gpu_bandwidth_gbps, args.gpu_tflops, args.gpu_fp8_tflops)


def capacity_from_args(args, model: ModelSpec, gpu: GpuSpec) -> CapacityReport:
    return compute_capacity(
        model, gpu, tp=args.tp, block_size=args.block_size, kv_dtype=args.kv_dtype,
        gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        non_kv_bytes=None if args.non_kv_gib is None else int(args.non_kv_gib * GIB))


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
    return "\n".join(lines)


def base_from_args(args, gpu: GpuSpec | None = None):
    """The sweep's base configuration (planner.sweep.PlanBase) from ``capacity``/``plan`` flags.

    Args:
        args: parsed flags; the replay flags only ``plan`` has (rate, allocator, ...) are optional.
        gpu: a GpuSpec to use instead of the --gpu preset (a custom GPU from flags).
    """
    from kvsim.planner.sweep import PlanBase

    engine = {k: v for k, v in (("max_num_seqs", args.max_num_seqs),
                                ("max_num_batched_tokens", args.max_num_batched_tokens)) if v is not None}
    if getattr(args, "no_prefix_caching", False):
        engine["enable_prefix_caching"] = False
    return PlanBase(workload=args.workload, model=args.model, hf_config=args.hf_config,
                    gpu=args.gpu if gpu is None else gpu.name, custom_gpu=gpu, tp=args.tp,
                    kv_dtype=args.kv_dtype, gpu_memory_utilization=args.gpu_memory_utilization,
                    block_size=args.block_size, max_model_len=args.max_model_len,
                    non_kv_gib=args.non_kv_gib, rate=getattr(args, "rate", None),
                    max_requests=args.max_requests, allocator=getattr(args, "allocator", "paged"),
                    replicas=getattr(args, "replicas", 1), router=getattr(args, "router", "round-robin"),
                    seed=args.seed, engine=engine)


def simulate_workload(args, gpu: GpuSpec) -> dict:
    """Replay the workload through the capacity's pool (paged, vLLM-like); returns the sweep row."""
    from kvsim.planner.sweep import PointTask, evaluate_point

    row = evaluate_point(PointTask(0, {}, base_from_args(args, gpu)))
    if row.get("error"):
        raise ValueError(row["error"])
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


def run(args) -> int:
    model = model_from_args(args)
    gpu = gpu_from_args(args)
    report = capacity_from_args(args, model, gpu)
    if args.concurrency_tokens is not None and args.concurrency_tokens <= 0:
        raise InputError(f"must be > 0, got {args.concurrency_tokens}", field="--concurrency-tokens")
    out = {"capacity": report.to_dict()}
    if args.concurrency_tokens:
        out["capacity"]["concurrency_for_tokens"] = {
            "tokens": args.concurrency_tokens, "concurrency": report.concurrency_for(args.concurrency_tokens)}
    if args.workload:
        try:
            from kvsim.simulator import simulate  # noqa: F401
        except ImportError:
            print(format_report(report) if not args.json else json.dumps(out, indent=2))
            print("kvsim: the simulator is not available in this install; no replay", file=sys.stderr)
            return 1
        row = simulate_workload(args, gpu)
        out["simulation"] = {k: v for k, v in row.items() if "wall" not in k}
        out["simulated"] = _sim_figures(row)
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
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
                    "maximum concurrency; with a WORKLOAD, also a simulated replay.")
    p.add_argument("workload", nargs="?", help="optional trace path or synthetic spec to replay")
    add_model_gpu_args(p)
    p.add_argument("--concurrency-tokens", type=int, metavar="L",
                   help="also print vLLM's maximum concurrency for L tokens per request")
    p.add_argument("--max-requests", type=int, help="replay only the first N requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)
