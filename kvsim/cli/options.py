"""The one set of ``kvsim`` flags: workload, model and GPU, KV pool, scheduler, step time, serving.

Every subcommand adds the groups it honours from here, so that a flag has one name, one type, one
help text and one meaning in every command (vLLM's spellings where vLLM has the flag:
``--tensor-parallel-size``/``--tp``, ``--kv-cache-dtype``/``--kv-dtype``, ``--max-num-seqs``...).
``engine_kwargs(args)`` maps the parsed flags onto the keyword arguments of
``planner.engine_setup.build_engine`` (vLLM's names), the one builder of EngineConfig + cost model.

Every command takes the same defaults: the batch limits are vLLM's ``vllm serve`` defaults for
the GPU (1024 sequences and 8192 tokens on an H100) in replay, compare, bench, validate, capacity
and plan alike, so the same model and GPU give the same pool everywhere (only the dashboard's
teaching pools, which have no GPU, take ``simulator.config.ENGINE_BATCH_DEFAULTS``). ``--rate`` and ``--rate-scale``
mean the same in every command too (workloads.retime): ``--rate R`` gives the workload R requests/s
(a spec's rate= replaced, Poisson arrivals for a trace without timestamps, a timestamped trace
re-timed to that mean rate), ``--rate-scale X`` X times its own rate (a trace keeps its pattern).

Only argparse and light modules are imported here: ``kvsim --help`` must not load the simulator.
"""
from __future__ import annotations

import argparse
import sys

from kvsim.cli.argtypes import (add_rate_args, fraction, nonneg_float, nonneg_int, positive_float,
                                positive_int)
from kvsim.errors import InputError
from kvsim.planner.capacity import DEFAULT_GPU_MEMORY_UTILIZATION, KV_DTYPES
from kvsim.planner.engine_setup import DEFAULT_GPU, DEFAULT_MODEL
from kvsim.planner.presets import (GPU_PRESETS, MODEL_PRESETS, custom_gpu, hf_config_source,  # noqa: F401
                                   load_hf_config)
from kvsim.planner.roofline import DEFAULT_STEP_OVERHEAD_S, MEASURED_FLOPS_EFFICIENCY
from kvsim.planner.specs import GIB
from kvsim.planner.weights import WEIGHT_DTYPES
from kvsim.simulator.config import ALLOCATORS, PLACEMENTS, ROUTERS, SCHEDULERS


# ------------------------------------------------------------------------------------- workload
def add_workload_args(p: argparse.ArgumentParser, *, required: bool = True, trace_format: bool = True) -> None:
    """WORKLOAD and the flags that say how to read it.

    Args:
        required: WORKLOAD is required (else optional: ``capacity``).
        trace_format: offer ``--format`` (commands that hand the file to workloads.load).
    """
    p.add_argument("workload", metavar="WORKLOAD", nargs=None if required else "?",
                   help="trace file (mooncake, azure, sharegpt, vllm-oracle, csv/jsonl; .gz too) or a "
                        "synthetic spec such as sharegpt:rate=2,n=1000,seed=0"
                        + ("" if required else " (optional: also replay it)"))
    if trace_format:
        p.add_argument("--format", help="trace format (default: sniffed from the file)")
    p.add_argument("--max-requests", type=positive_int, metavar="N",
                   help="replay only the first N requests")
    add_rate_args(p)
    p.add_argument("--max-concurrency", type=positive_int, metavar="C",
                   help="at most C requests in flight: a request is sent when it has arrived and fewer "
                        "than C are in the engine, else as the next one finishes (vllm bench serve's "
                        "--max-concurrency; a random: spec's concurrency=)")
    p.add_argument("--seed", type=int, default=0, help="seed of generated arrivals and lengths")


def max_concurrency(args) -> int | None:
    """The client's limit on requests in flight: ``--max-concurrency`` or the spec's
    ``concurrency=`` (both given: an error), None for an open loop."""
    from kvsim.workloads.source import spec_concurrency

    flag = getattr(args, "max_concurrency", None)
    spec = spec_concurrency(args.workload, getattr(args, "format", None))
    if flag is not None and spec is not None and flag != spec:
        raise InputError(f"--max-concurrency {flag} and the spec's concurrency={spec} disagree: give one")
    return flag if flag is not None else spec


# -------------------------------------------------------------------------------- model and GPU
def add_model_gpu_args(p: argparse.ArgumentParser) -> None:
    """Model, GPU, parallelism and memory: what sizes the pool and the roofline."""
    g = p.add_argument_group("model and GPU (pool size and roofline step time)")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"model preset ({', '.join(MODEL_PRESETS)}); default %(default)s")
    g.add_argument("--hf-config", metavar="PATH",
                   help="a Hugging Face config.json, or a model folder holding one, instead of a preset "
                        "(its absent and unread fields are named on stderr)")
    g.add_argument("--force-hf-config", action="store_true",
                   help="size a config.json whose model_type kvsim does not know as a generic decoder")
    g.add_argument("--gpu", default=DEFAULT_GPU,
                   help=f"GPU preset ({', '.join(GPU_PRESETS)}); default %(default)s")
    g.add_argument("--gpu-memory-gib", type=positive_float, metavar="GIB",
                   help="custom GPU: total memory as the driver reports it (GiB); with the two below")
    g.add_argument("--gpu-bandwidth-gbps", type=positive_float, metavar="GB/S",
                   help="custom GPU: memory bandwidth")
    g.add_argument("--gpu-tflops", type=positive_float, metavar="TFLOPS", help="custom GPU: dense BF16 peak")
    g.add_argument("--gpu-fp8-tflops", type=positive_float, metavar="TFLOPS",
                   help="custom GPU: dense FP8 peak")
    g.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=positive_int, default=1, metavar="N",
                   help="tensor-parallel size (default 1)")
    g.add_argument("--kv-dtype", "--kv-cache-dtype", dest="kv_dtype", default="auto", choices=KV_DTYPES,
                   metavar="DTYPE", help=f"KV-cache dtype ({', '.join(KV_DTYPES)}); auto = the "
                                         "model's dtype; fp8 halves KV bytes")
    g.add_argument("--weight-dtype", default="auto", choices=WEIGHT_DTYPES, metavar="DTYPE",
                   help=f"how the weights are served ({', '.join(WEIGHT_DTYPES)}); auto = the "
                        "config's quantization_config (fp8, MXFP4, AWQ/GPTQ), else its dtype")
    g.add_argument("--gpu-memory-utilization", type=fraction, default=DEFAULT_GPU_MEMORY_UTILIZATION,
                   metavar="U", help="fraction of GPU memory vLLM may use (default %(default)s, vLLM 0.33's)")
    g.add_argument("--non-kv-gib", type=nonneg_float, metavar="GIB",
                   help="per-GPU memory that is not KV cache (weights + activations + non-torch), "
                        "e.g. from a vLLM log; replaces our estimate")


def model_from_args(args):
    """The model: a preset name (resolved by the builder) or a ModelSpec from --hf-config."""
    if not args.hf_config:
        return args.model
    config, name = hf_config_source(args.hf_config)
    spec = load_hf_config(config, name=name, force=args.force_hf_config)
    for note in spec.config_notes:
        print(f"kvsim: note: {config}: {note}", file=sys.stderr)
    return spec


def gpu_from_args(args):
    """The GPU: a preset name, or a GpuSpec when the custom-GPU flags are given."""
    flags = (args.gpu_memory_gib, args.gpu_bandwidth_gbps, args.gpu_tflops)
    if all(v is None for v in flags) and args.gpu_fp8_tflops is None:
        return args.gpu
    if any(v is None for v in flags):
        raise InputError("a custom GPU needs --gpu-memory-gib, --gpu-bandwidth-gbps and --gpu-tflops "
                         "together", field="gpu")
    return custom_gpu(args.gpu_memory_gib, args.gpu_bandwidth_gbps, args.gpu_tflops, args.gpu_fp8_tflops)


def non_kv_bytes(args) -> int | None:
    return None if args.non_kv_gib is None else int(args.non_kv_gib * GIB)


# --------------------------------------------------------------------------------- the KV pool
def add_pool_args(p: argparse.ArgumentParser, *, explicit_size: bool = True) -> None:
    """Block size and, with ``explicit_size``, a pool given in blocks or tokens (else the model and
    GPU size it, vLLM's formula)."""
    g = p.add_argument_group("KV pool")
    g.add_argument("--block-size", type=positive_int, metavar="TOKENS",
                   help="tokens per KV block (default vLLM's: 16; 64 for MLA models with "
                        "per-layer shapes; Mamba hybrids align it to their state)")
    g.add_argument("--disable-hybrid-kv-cache-manager", action="store_true",
                   help="vLLM's flag: sliding-window layers keep every block (one "
                        "full-attention group)")
    if explicit_size:
        size = g.add_mutually_exclusive_group()
        size.add_argument("--num-blocks", type=positive_int, metavar="N",
                          help="vLLM's num_gpu_blocks (null block included: N-1 usable); "
                               "default: sized by --model on --gpu")
        size.add_argument("--kv-tokens", type=positive_int, metavar="N", help="usable KV-cache slots")
        g.add_argument("--kv-groups", metavar="GROUPS",
                       help="KV-cache groups of a pool given in blocks or tokens, in vLLM's "
                            "order: full | sliding:W | mamba | mamba_ckpt[:A], comma-separated "
                            "(e.g. sliding:128,full); a hybrid model that sizes the pool brings "
                            "its own")


# -------------------------------------------------------------------------------- the scheduler
def add_scheduler_args(p: argparse.ArgumentParser, *, batch_defaults: tuple[int, int] | None,
                       allocator: bool = True) -> None:
    """The allocator and vLLM's scheduler settings.

    Args:
        batch_defaults: (max_num_seqs, max_num_batched_tokens) defaults, or None for vLLM's
            defaults for the GPU.
        allocator: offer ``--allocator`` (``compare`` takes ``--allocators`` instead).
    """
    g = p.add_argument_group("allocator and scheduler")
    if allocator:
        g.add_argument("--allocator", choices=ALLOCATORS, default="paged",
                       help="paged (vLLM) or a contiguous reservation policy (default paged)")
    g.add_argument("--placement", choices=PLACEMENTS, default="buddy",
                   help="contiguous allocators: arena placement (default buddy)")
    seqs, tokens = batch_defaults if batch_defaults else (None, None)
    gpu_default = "default: vLLM's for the GPU"
    g.add_argument("--scheduler", choices=SCHEDULERS, default="v1",
                   help="v1: vLLM 0.33's scheduler (default); v0: vLLM 0.2-0.5 with chunked "
                        "prefill off (prompt-only steps, then decodes; no prefix caching, "
                        "watermark 0.01, max_num_batched_tokens default max(max_model_len, 2048))")
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="vLLM's AsyncScheduler, two batches in flight (default: on when the step "
                        "time comes from the GPU, i.e. the roofline or --cost-table, for the paged "
                        "v1 scheduler, as vLLM on a GPU; off with --step-clock or --step-s)")
    g.add_argument("--max-num-seqs", type=positive_int, default=seqs, metavar="N",
                   help=f"most requests running at once ({gpu_default if seqs is None else f'default {seqs}'})")
    # the command's default is applied in engine_kwargs: v0 has its own (vLLM v0's)
    g.add_argument("--max-num-batched-tokens", type=positive_int, metavar="TOKENS",
                   help=f"token budget of one step ({gpu_default if tokens is None else f'default {tokens}'})")
    p.set_defaults(default_max_num_batched_tokens=tokens)
    g.add_argument("--max-model-len", type=positive_int, metavar="TOKENS",
                   help="longest request, prompt + output (default: the model's context length "
                        "when the model sizes the pool, else 8192)")
    g.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    g.add_argument("--long-prefill-token-threshold", type=nonneg_int, default=0, metavar="TOKENS",
                   help="cap on one request's prefill chunk when several wait (0 = off)")
    g.add_argument("--no-full-prompt-admission", action="store_true",
                   help="admit when the first chunk fits (vLLM scheduler_reserve_full_isl=False)")
    g.add_argument("--watermark", type=float, default=0.0, metavar="FRACTION",
                   help="fraction of blocks kept free when admitting (default 0)")


# --------------------------------------------------------------------------------- step time
def add_step_time_args(p: argparse.ArgumentParser) -> tuple[str, ...]:
    """How long a step takes: the step clock, a fixed time, a measured table, or the roofline;
    returns the flags' dests (``flags_given``)."""
    before = len(p._actions)        # argparse keeps every action in order
    g = p.add_argument_group("step time (default: real vLLM's steps measured for --model on --gpu where "
                                 "tables/vllm/ has them, else the roofline)")
    cost = g.add_mutually_exclusive_group()
    cost.add_argument("--step-clock", action="store_true",
                      help="one step = one time unit (vLLM's step index)")
    cost.add_argument("--step-s", type=positive_float, metavar="S", help="fixed step time in seconds")
    cost.add_argument("--cost-table", metavar="CSV",
                      help="measured step times (a kvsim profile table); 'vllm': real vLLM's steps "
                           "measured for --model on --gpu (tables/vllm/; an error where none was); "
                           "'roofline': the roofline although such a table exists")
    g.add_argument("--force-cost-table", action="store_true",
                   help="use --cost-table's times although it was measured for another model, GPU, TP, KV "
                        "dtype or weight format (otherwise an error)")
    g.add_argument("--first-use-compiles", action="store_true",
                   help="a freshly started vLLM engine, on real vLLM's table: its first steps pay the Triton "
                        "compiles of first use (every model: the slot mapping's, 0.14 s at the first step of 1 "
                        "token and the first of a multiple of 16; gpt-oss, MXFP4 MoE: also its routing's, "
                        "0.73-1.49 s at each eager step whose token count, rounded up to 32, the engine has not "
                        "run, its expert matmuls', 1.1-1.5 s a kernel at each eager step of a new block size, "
                        "rows or blocks, and its token sort's; measured on an H100; an error with another clock)")
    g.add_argument("--eager-launch-ms", type=positive_float, default=None, metavar="MS",
                   help="your host's launch of a step on no CUDA graph (real vLLM's table: more tokens than its "
                        "largest graph; Python over every layer): each such step takes at least this long. "
                        "Real vLLM's, measured as the gap between two steps' scheduling: Qwen3-30B-A3B 47-92 ms "
                        "on four H100 hosts, Llama-3.1-8B 14-21 ms (default: as the table's host)")
    g.add_argument("--bandwidth-efficiency", type=fraction, default=1.0, metavar="FRACTION",
                   help="roofline: the share of the GPU's datasheet memory bandwidth a step reaches "
                        "(default 1.0; (0, 1])")
    g.add_argument("--flops-efficiency", type=fraction, default=None, metavar="FRACTION",
                   help="roofline: the share of the datasheet FLOP/s a step reaches ((0, 1]; default: "
                        "the share real vLLM's prefill steps reached for the model's weights on the H100 "
                        "and H200: " + ", ".join(f"{k} {v:g}" for k, v in MEASURED_FLOPS_EFFICIENCY.items()) + ")")
    g.add_argument("--step-overhead-ms", type=nonneg_float, default=DEFAULT_STEP_OVERHEAD_S * 1e3, metavar="MS",
                   help="roofline: fixed time added to every step (default %(default)g)")
    return tuple(a.dest for a in p._actions[before:])


def flags_given(p: argparse.ArgumentParser, dests: tuple[str, ...]) -> None:
    """Keep on the parser's namespace (``given_flags``) the flags among ``dests`` whose parsed
    value differs from the default: what a user set."""
    p.set_defaults(flag_defaults={d: p.get_default(d) for d in dests})


def given_flags(args) -> list[str]:
    """The flags (as typed: ``--eager-launch-ms``) ``flags_given`` watches that this run set."""
    return [f"--{d.replace('_', '-')}" for d, v in getattr(args, "flag_defaults", {}).items()
            if getattr(args, d, v) != v]


def roofline_kwargs(args) -> dict:
    """The roofline's knobs as build_engine (and PlanBase) name them; the defaults where a command
    has no step-time flags."""
    return {"bandwidth_efficiency": getattr(args, "bandwidth_efficiency", 1.0),
            "flops_efficiency": getattr(args, "flops_efficiency", None),
            "step_overhead_s": getattr(args, "step_overhead_ms", DEFAULT_STEP_OVERHEAD_S * 1e3) / 1e3}


def step_s_from_args(args) -> float | None:
    """The fixed step time the flags ask for (1.0 for the step clock), or None."""
    return 1.0 if getattr(args, "step_clock", False) else getattr(args, "step_s", None)


# --------------------------------------------------------------------------------- offload tiers
def add_offload_args(p: argparse.ArgumentParser) -> None:
    """KV offload tiers below the GPU pool (vLLM's native CPU offloading; docs/OFFLOAD.md).

    Values are read as plain numbers and checked by planner.tiers, so that a bad size or
    bandwidth is one line naming the flag (exit 2)."""
    g = p.add_argument_group("KV offload tiers (paged allocator with prefix caching)")
    g.add_argument("--cpu-offload-gib", type=float, metavar="GIB",
                   help="CPU DRAM for offloaded KV, total over tensor-parallel ranks (vLLM's "
                        "--kv-offloading-size); 0 or absent: no offloading")
    g.add_argument("--offload-bandwidth-gbps", type=float, metavar="GB/S",
                   help="GPU <-> CPU link, GB/s per direction (default: the GPU preset's PCIe "
                        "link; NVLink-C2C is about 450)")
    g.add_argument("--disk-offload-gib", type=float, metavar="GIB",
                   help="disk or remote tier behind the CPU tier (written through from it)")
    g.add_argument("--disk-bandwidth-gbps", type=float, metavar="GB/S",
                   help="CPU <-> disk bandwidth, GB/s per direction (with --disk-offload-gib)")
    g.add_argument("--disk-latency-ms", type=float, metavar="MS",
                   help="time to the first byte of a disk transfer (default 0)")


OFFLOAD_FLAGS = ("cpu_offload_gib", "offload_bandwidth_gbps", "disk_offload_gib",
                 "disk_bandwidth_gbps", "disk_latency_ms")


def offload_kwargs(args) -> dict:
    """``build_engine``'s offload keywords from the flags of add_offload_args (None: absent)."""
    return {name: getattr(args, name, None) for name in OFFLOAD_FLAGS}


# --------------------------------------------------------------------------------- serving
def add_serving_args(p: argparse.ArgumentParser) -> None:
    """Replicas behind a router."""
    g = p.add_argument_group("serving")
    g.add_argument("--replicas", type=positive_int, default=1, metavar="N", help="engine replicas (default 1)")
    g.add_argument("--router", choices=ROUTERS, default="round-robin",
                   help="how arrivals are spread over replicas (default round-robin)")


def engine_kwargs(args, **overrides) -> dict:
    """``build_engine`` keyword arguments from the flags of the groups above.

    Args:
        args: parsed flags of add_model_gpu_args, add_pool_args and add_scheduler_args (the
            pool size, the allocator and the step-time flags are optional).
        overrides: build_engine arguments that win (``compare`` sets the allocator per column).
    """
    scheduler = getattr(args, "scheduler", "v1")
    max_num_batched_tokens = args.max_num_batched_tokens
    if max_num_batched_tokens is None and scheduler == "v1":
        max_num_batched_tokens = args.default_max_num_batched_tokens
    kwargs = dict(
        model=model_from_args(args), gpu=gpu_from_args(args), tensor_parallel_size=args.tp,
        kv_cache_dtype=args.kv_dtype, weight_dtype=args.weight_dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        non_kv_bytes=non_kv_bytes(args), allocator=getattr(args, "allocator", "paged"),
        placement=args.placement, block_size=args.block_size,
        num_gpu_blocks=getattr(args, "num_blocks", None), kv_tokens=getattr(args, "kv_tokens", None),
        kv_cache_groups=getattr(args, "kv_groups", None) or (),
        disable_hybrid_kv_cache_manager=args.disable_hybrid_kv_cache_manager,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=not args.no_prefix_caching,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        scheduler_reserve_full_isl=not args.no_full_prompt_admission, watermark=args.watermark,
        scheduler=scheduler, async_scheduling=getattr(args, "async_scheduling", None),
        step_s=step_s_from_args(args), cost_table=getattr(args, "cost_table", None),
        force_cost_table=getattr(args, "force_cost_table", False),
        first_use_compiles=getattr(args, "first_use_compiles", False),
        eager_launch_s=(args.eager_launch_ms / 1e3 if getattr(args, "eager_launch_ms", None) is not None else None),
        **roofline_kwargs(args), **offload_kwargs(args))
    kwargs.update(overrides)
    return kwargs
