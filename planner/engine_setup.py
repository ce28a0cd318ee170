"""The one builder: (model, GPU, settings) -> the simulator's EngineConfig and step-cost model.

Every caller that turns a user's settings into a simulation goes through ``build_engine``: the
``kvsim`` commands (replay, compare, validate, capacity with a workload, plan's sweep points),
the paper reproduction, the dashboard and the benchmarks. Keyword arguments carry vLLM's names
(``vllm serve`` / ``EngineArgs``) where the setting is vLLM's; kvsim's own settings (allocator,
placement, step-time model) keep kvsim's names.

    setup = build_engine(model="Llama-3.1-8B", gpu="h100", max_model_len=8192)
    simulate(requests, setup.config, setup.cost)        # setup.capacity: vLLM's sizing report

Pool size, the first that applies:

    num_gpu_blocks   given: vLLM's num_gpu_blocks (as ``--num-gpu-blocks-override``)
    kv_tokens        given: usable KV slots, kv_tokens // block_size usable blocks
    otherwise        vLLM's formula for ``model`` on ``gpu`` (planner.capacity), in ``.capacity``

The null block, one rule: with ``null_block=True`` (vLLM v1, the default) block 0 of the pool is
vLLM's null block, so ``num_gpu_blocks - 1`` blocks are usable and a contiguous allocator gets
that same usable memory, ``(num_gpu_blocks - 1) * block_size`` slots. ``null_block=False`` counts
a pool with no reserved block: every block is usable (vLLM 0.1, which the paper reproduction
simulates, had none; the dashboard's teaching pools).

Step time, the first that applies: ``step_s`` (fixed; 1.0 is the step clock, simulated time =
vLLM's step index), ``cost_table`` (a measured CSV, simulator.cost_table), else real vLLM's own
steps measured for this model, GPU, weights, KV dtype, TP and scheduling mode where one of the
shipped tables fits (planner.vllm_tables.fitting_table), else the roofline of ``model`` on ``gpu``
(planner.roofline; ``cost_table="roofline"``, or a roofline parameter given, keeps it where a table
would fit). ``step_time_scale`` multiplies whichever it is.

Hybrid models (per-layer shapes: sliding windows, Mamba state; the hybrid presets and
``--hf-config`` imports): when the model sizes the pool, vLLM's KV-cache groups come with it
(``capacity.kv_groups``; block_size None takes vLLM's: 16, MLA's 64, a Mamba hybrid's aligned
block) and the simulator runs them (GroupedPagedAllocator + HybridScheduler, or
AsyncHybridScheduler with async scheduling, vLLM's default on a GPU). A pool given in blocks or
tokens takes ``kv_cache_groups`` (``simulator.config.parse_kv_groups``), or, for a hybrid model,
the model's groups and block size.

Scheduling: ``scheduler`` "v1" (vLLM 0.33) or "v0" (vLLM 0.2-0.5, prompt-only steps;
simulator/scheduler_v0.py). ``async_scheduling`` left None follows vLLM, which turns
AsyncScheduler on by default for generation on a GPU: on when the step time comes from a GPU (the
roofline or a measured ``cost_table``) for vLLM 0.33's scheduler (KV-cache groups and offload
tiers included, simulator/modes.py), off with a fixed ``step_s`` (the step clock included: there
the caller chooses), a contiguous allocator or v0. vLLM v0's own
defaults apply with ``scheduler="v0"``: max_num_seqs 256 and max_num_batched_tokens
max(max_model_len, 2048) when left None (vLLM 0.4 ``SchedulerConfig``).

Offload tiers (docs/OFFLOAD.md): ``cpu_offload_gib`` (vLLM's ``--kv-offloading-size``, the total
over tensor-parallel ranks; 0 is no tier) with the host link's ``offload_bandwidth_gbps`` (default: the GPU
preset's PCIe link, planner.tiers), and behind it optionally ``disk_offload_gib`` with
``disk_bandwidth_gbps`` and ``disk_latency_ms``. ``EngineSetup.offload`` then holds the tiers the
simulator takes (``simulate(..., offload=setup.offload)``); chunks are one GPU block on every
rank (an MLA latent once, as vLLM's replicated layout), with a hybrid model's KV-cache groups
one group's block. The tiers run on the v1 scheduler: OffloadScheduler, or
AsyncOffloadScheduler with async scheduling (vLLM's default on a GPU, as without tiers), over
KV-cache groups (Hybrid / AsyncHybridOffloadScheduler, sliding windows and full attention); v0,
Mamba groups with a tier and a disk tier behind groups are an InputError.

Defaults a caller leaves as None: model and GPU (``DEFAULT_MODEL`` on ``DEFAULT_GPU``, resolved
only when sizing or the roofline needs them; a name given is always resolved, so a typo is an
error even when unused), max_num_seqs / max_num_batched_tokens (vLLM's ``vllm serve`` defaults
for the GPU), max_model_len (the model's context length when the model sized the pool, else
EngineConfig's 8192: a pool given in blocks says nothing about a model).
"""
from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvsim.errors import InputError
from kvsim.planner.capacity import (DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION, CapacityReport,
                                    compute_capacity, kv_cache_group_specs, model_kv_groups,
                                    vllm_batch_defaults)
from kvsim.planner.presets import get_gpu, get_model
from kvsim.planner.roofline import (DEFAULT_STEP_OVERHEAD_S, RooflineCost, measured_decode, measured_mixed_layer_s,
                                    measured_flops_efficiency)
from kvsim.planner.specs import GpuSpec, ModelSpec
from kvsim.planner.tiers import block_bytes, build_tiers
from kvsim.planner.weights import serve_weights_as
from kvsim.planner.vllm_tables import (ROOFLINE, VLLM, fitting_table, shipped_cost, shipped_header, table_gpu,
                                       vllm_table_for)
from kvsim.simulator.config import EngineConfig, parse_kv_groups
from kvsim.simulator.modes import MODES, Mode
from kvsim.simulator.cost import CarriedCost, CostModel, FixedStepCost, ScaledCost, SyncCost

if TYPE_CHECKING:
    from kvsim.simulator.offload import TierConfig

DEFAULT_MODEL = "Llama-3.1-8B"
DEFAULT_GPU = "H100-80GB-SXM"
# a pool given in blocks or tokens has no model to take a context length from
DEFAULT_MAX_MODEL_LEN: int = EngineConfig.__dataclass_fields__["max_model_len"].default
V0_MAX_NUM_SEQS = 256   # vLLM 0.2-0.5 EngineArgs.max_num_seqs


def default_async_scheduling(step_s: float | None, allocator: str = "paged",
                             scheduler: str = "v1") -> bool:
    """vLLM's default scheduling mode for an engine: async for generation on a GPU
    (``VllmConfig``, docs/FIDELITY.md 1.6), i.e. when the step time comes from a GPU (the
    roofline or a measured cost table, ``step_s`` None) for vLLM 0.33's paged scheduler; a fixed
    step time (the step clock included), a contiguous allocator or v0: synchronous."""
    return step_s is None and allocator == "paged" and scheduler == "v1"


@dataclass(frozen=True)
class EngineSetup:
    """What ``build_engine`` returns: everything a simulation of one replica needs.

    config: the simulator's EngineConfig.
    cost: the step-cost model (simulator.cost.CostModel).
    capacity: vLLM's sizing report when model and GPU sized the pool, else None.
    model, gpu: the specs used (resolved when named, needed for sizing or the roofline), or None.
    offload: the offload tiers (simulator.offload.TierConfig), () without.
    clock: the step clock as planner.held_out names it (clock_key: a shipped real-vLLM table or the
        roofline, as kvsim's default runs it), None for a clock the user changed or made.
    """

    config: EngineConfig
    cost: CostModel
    capacity: CapacityReport | None = None
    model: ModelSpec | None = None
    gpu: GpuSpec | None = None
    offload: tuple[TierConfig, ...] = ()
    clock: dict | None = None


def _resolve(value, resolve):
    """A spec as given, a preset name resolved, or None."""
    return resolve(value) if isinstance(value, str) else value


@dataclass(frozen=True)
class EngineSettings:
    """A user's serving settings, with vLLM's names (``vllm serve`` / ``EngineArgs``) where the
    setting is vLLM's; ``build_engine`` takes them as keywords or as one EngineSettings.

    model: preset name or ModelSpec (default DEFAULT_MODEL where needed).
    gpu: preset name or GpuSpec (default DEFAULT_GPU where needed).
    tensor_parallel_size: GPUs per replica (KV heads and weights are split over them).
    kv_cache_dtype: "auto" (the model's dtype), "fp16"/"bf16", "fp8", ...
    weight_dtype: "auto" (the checkpoint's quantization_config, else its dtype), or the format the
        weights are served in ("bf16", "fp8", "int4", "mxfp4", ...).
    gpu_memory_utilization: fraction of GPU memory vLLM may use (None: vLLM 0.33's 0.92).
    non_kv_bytes: per-GPU memory that is not KV cache, if measured (replaces the estimate).
    allocator: "paged" or a contiguous policy ("max", "pow2", "oracle").
    placement: contiguous allocators' arena placement ("buddy", "first-fit").
    block_size: tokens per KV block (None: vLLM's for the model; 16 without per-layer shapes).
    num_gpu_blocks: the pool in vLLM's blocks (null block included when ``null_block``).
    kv_tokens: the pool in usable KV slots (rounded down to whole blocks).
    null_block: reserve block 0 as vLLM v1 does (see the module docstring).
    kv_cache_groups: KV-cache groups for a pool given in blocks or tokens ("full,sliding:128", or
        a tuple of KVCacheGroupSpec); a hybrid model that sizes the pool brings its own.
    disable_hybrid_kv_cache_manager: vLLM's flag: sliding-window layers keep every block (one
        full-attention group).
    max_model_len: longest sequence, prompt + output.
    max_num_seqs: most requests running at once.
    max_num_batched_tokens: token budget of one step.
    enable_prefix_caching: reuse cached full blocks (paged only).
    long_prefill_token_threshold: cap on one request's prefill chunk (0 = off).
    scheduler_reserve_full_isl: admit a request only when its whole prompt fits (vLLM's default);
        False admits when the first chunk fits.
    watermark: fraction of blocks kept free when admitting (0 = off; v0: 0 means vLLM v0's 0.01).
    scheduler: "v1" or "v0" (see the module docstring).
    async_scheduling: vLLM's AsyncScheduler (two batches in flight); None: vLLM's default (see
        the module docstring).
    step_s: fixed step time in seconds (1.0 = step clock).
    cost_table: a measured step-time CSV (simulator.cost_table.load_cost_table: a ``kvsim
        profile`` table, or the older TableCost columns), "vllm": the shipped table of real
        vLLM's steps for the model, GPU, weights and KV dtype (planner.vllm_tables; an error
        where none fits), "roofline": the roofline although a table fits; None: the shipped
        table where one fits, else the roofline. A profile
        table measured for another model, GPU (when the GPU sizes the pool), tensor parallel
        size, KV dtype or weight format is an InputError naming each difference, unless
        ``force_cost_table``.
    first_use_compiles: a freshly started engine: on real vLLM's table its steps pay the first-use
        Triton compiles (simulator.first_use: every model's slot mapping; an MXFP4 MoE model's
        routing, its token sort and its expert matmuls); an InputError with another clock.
    eager_launch_s: the host's launch of a step on no CUDA graph (real vLLM's table: more tokens
        than its largest graph): each such step takes at least this long (EagerLaunchCost); None:
        as the table's host launched them. An InputError with another clock.
    step_overhead_s, bandwidth_efficiency, flops_efficiency: roofline parameters; flops_efficiency
        None: the share of the datasheet FLOP/s that real vLLM's prefill steps reach for the
        model's weights (planner.roofline.measured_flops_efficiency), 1.0 the datasheet.
    step_time_scale: multiplies every step time (sensitivity checks).
    cpu_offload_gib, offload_bandwidth_gbps, disk_offload_gib, disk_bandwidth_gbps,
        disk_latency_ms: offload tiers (module doc); None (or 0 GiB of CPU): no tier.
    """

    # model and GPU: preset names (aliases work) or specs (load_hf_config, custom_gpu)
    model: str | ModelSpec | None = None
    gpu: str | GpuSpec | None = None
    tensor_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    weight_dtype: str = "auto"
    gpu_memory_utilization: float | None = None
    non_kv_bytes: int | None = None
    # the KV pool
    allocator: str = "paged"
    placement: str = "buddy"
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    kv_tokens: int | None = None
    null_block: bool = True
    kv_cache_groups: str | tuple = ()
    disable_hybrid_kv_cache_manager: bool = False
    # the scheduler
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0
    scheduler: str = "v1"
    async_scheduling: bool | None = None
    # step time
    step_s: float | None = None
    cost_table: str | os.PathLike | None = None
    force_cost_table: bool = False
    first_use_compiles: bool = False
    eager_launch_s: float | None = None
    step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S
    bandwidth_efficiency: float = 1.0
    flops_efficiency: float | None = None
    step_time_scale: float = 1.0
    # offload tiers below the GPU pool
    cpu_offload_gib: float | None = None
    offload_bandwidth_gbps: float | None = None
    disk_offload_gib: float | None = None
    disk_bandwidth_gbps: float | None = None
    disk_latency_ms: float | None = None

    @property
    def sized(self) -> bool:
        """The model on the GPU sizes the pool (no num_gpu_blocks or kv_tokens)."""
        return self.num_gpu_blocks is None and self.kv_tokens is None

    @property
    def roofline(self) -> bool:
        return self.step_s is None and self.cost_table is None

    @property
    def offloaded(self) -> bool:
        return self.cpu_offload_gib is not None


@dataclass(frozen=True)
class _Pool:
    """What sizing the pool decides: vLLM's report (when the model sized it), the blocks, their
    size, the groups, and the lengths the scheduler then takes."""

    report: CapacityReport | None
    num_gpu_blocks: int
    block_size: int
    kv_cache_groups: tuple
    max_model_len: int
    max_num_batched_tokens: int


def build_engine(settings: EngineSettings | None = None, /, **kwargs) -> EngineSetup:
    """Turn a model, a GPU and serving settings into an EngineConfig and a cost model.

    The settings are EngineSettings' fields, as keywords or as one EngineSettings. Stages: check
    the settings against each other, resolve the model and GPU specs, apply the scheduler's
    batch limits, size the pool (vLLM's formula, or the blocks or tokens given), the engine's
    config (vLLM's default scheduling mode where kvsim runs it), the step-time model, the offload
    tiers.

    Returns:
        EngineSetup(config, cost, capacity, model, gpu, offload).
    Raises:
        InputError: an unknown preset, an impossible configuration (capacity, EngineConfig,
            cost model), a cost table that cannot be read; the message carries the numbers.
    """
    s = settings if settings is not None else EngineSettings(**kwargs)
    if settings is not None and kwargs:
        raise TypeError("give EngineSettings or keywords, not both")
    # the default clock: real vLLM's table where one fits, unless the roofline is asked for (by
    # name or by its own parameters)
    default_clock = s.roofline and (s.step_overhead_s, s.bandwidth_efficiency, s.flops_efficiency) == \
        (DEFAULT_STEP_OVERHEAD_S, 1.0, None)
    if s.cost_table == ROOFLINE:
        s = replace(s, cost_table=None)
    model, gpu = _specs(s)
    s = _checked(s)
    vllm_clock = s.cost_table == VLLM     # real vLLM's table for the model on the GPU
    if s.sized or s.roofline or s.offloaded or vllm_clock:   # the tiers' chunk size: the model's block
        model = model or get_model(DEFAULT_MODEL)
    if model is not None:
        model = serve_weights_as(model, s.weight_dtype)
    if s.sized or s.roofline or s.offloaded or vllm_clock or s.max_num_seqs is None or \
            s.max_num_batched_tokens is None:
        gpu = gpu or get_gpu(DEFAULT_GPU)
    v0_tokens = s.scheduler == "v0" and s.max_num_batched_tokens is None
    s = _batch_limits(s, gpu)
    pool = _size_pool(s, model, gpu, v0_tokens)
    config = _engine_config(s, pool)
    carry_from = None
    if vllm_clock or default_clock:
        s, carry_from = _vllm_clock(s, model, gpu, config.async_scheduling, required=vllm_clock)
    cost = _step_cost(s, model, gpu, config.async_scheduling, carry_from)
    clock = _clock_key(s, model, gpu, config.async_scheduling, carry_from)
    if clock is not None:
        shared = s.cost_table is not None and cost is shipped_cost(s.cost_table)
        cost = _with_held_out_note(cost, clock, shared)
    offload = _offload_tiers(
        model, gpu, s.tensor_parallel_size, s.kv_cache_dtype, pool.block_size,
        pool.kv_cache_groups,
        cpu_offload_gib=s.cpu_offload_gib, offload_bandwidth_gbps=s.offload_bandwidth_gbps,
        disk_offload_gib=s.disk_offload_gib, disk_bandwidth_gbps=s.disk_bandwidth_gbps,
        disk_latency_ms=s.disk_latency_ms)
    if offload:   # before any work: the rule the simulator's OffloadScheduler applies
        from kvsim.simulator.offload_scheduler import check_offload_config
        check_offload_config(config)
    return EngineSetup(config=config, cost=cost, capacity=pool.report, model=model, gpu=gpu,
                       offload=offload, clock=clock)


def _specs(s: EngineSettings) -> tuple[ModelSpec | None, GpuSpec | None]:
    """The settings that exclude each other, then the model's and the GPU's specs (a name given
    is always resolved, so a typo is an error even when unused)."""
    if s.num_gpu_blocks is not None and s.kv_tokens is not None:
        raise InputError("give at most one of num_gpu_blocks and kv_tokens, got "
                         f"num_gpu_blocks={s.num_gpu_blocks}, kv_tokens={s.kv_tokens}")
    if s.step_s is not None and s.cost_table is not None:
        raise InputError(f"give at most one of step_s and cost_table, got step_s={s.step_s}, "
                         f"cost_table={s.cost_table}")
    return _resolve(s.model, get_model), _resolve(s.gpu, get_gpu)


def _checked(s: EngineSettings) -> EngineSettings:
    """The KV-cache groups parsed and checked with the pool and the block size; 0 GiB of CPU
    tier is no tier."""
    groups = s.kv_cache_groups
    if isinstance(groups, str):
        groups = parse_kv_groups(groups)
    if groups and s.sized:
        raise InputError("kv_cache_groups go with a pool given in blocks or tokens (a model that "
                         "sizes the pool brings its own groups)", field="kv_groups")
    block_size = s.block_size
    if block_size is not None and (block_size < 1 or (
            block_size & (block_size - 1) and not groups)):
        # the paged pool indexes blocks by shifts (allocator.paged); vLLM's are 8, 16, 32, ...
        # KV-cache groups take any size (vLLM aligns a Mamba hybrid's blocks: 1040, 576, ...)
        raise InputError(f"block size must be a power of two (such as 16 or 32), got {block_size}"
                         + ("" if block_size < 1 else "; KV-cache groups (--kv-groups) take any "
                            "size, as vLLM's Mamba hybrids do"), field="block_size")
    s = replace(s, kv_cache_groups=groups)
    if s.cpu_offload_gib == 0:
        # 0 GiB is "no CPU tier" (a sweep's baseline point): the other tier flags do not apply
        s = replace(s, cpu_offload_gib=None, offload_bandwidth_gbps=None, disk_offload_gib=None,
                    disk_bandwidth_gbps=None, disk_latency_ms=None)
    return s


def _batch_limits(s: EngineSettings, gpu: GpuSpec | None) -> EngineSettings:
    """max_num_seqs and max_num_batched_tokens left None: vLLM v0's defaults with v0 (vLLM 0.4
    EngineArgs / SchedulerConfig: 256 sequences, max(max_model_len, 2048) tokens), else vLLM's
    ``vllm serve`` defaults for the GPU."""
    seqs, tokens = s.max_num_seqs, s.max_num_batched_tokens
    if s.scheduler == "v0":
        seqs = V0_MAX_NUM_SEQS if seqs is None else seqs
        tokens = max(s.max_model_len or 0, 2048) if tokens is None else tokens
    if seqs is None or tokens is None:
        default_seqs, default_tokens = vllm_batch_defaults(gpu)
        seqs = default_seqs if seqs is None else seqs
        tokens = default_tokens if tokens is None else tokens
    return replace(s, max_num_seqs=seqs, max_num_batched_tokens=tokens)


def _size_pool(s: EngineSettings, model: ModelSpec | None, gpu: GpuSpec | None,
               v0_tokens: bool) -> _Pool:
    """The pool: vLLM's formula for the model on the GPU (its groups and block size with it), or
    the blocks or tokens given (a hybrid model's groups whatever the pool). ``v0_tokens``: v0's
    budget was left to its default, which grows to the model's context length."""
    report, groups, block_size = None, s.kv_cache_groups, s.block_size
    num_gpu_blocks, max_model_len = s.num_gpu_blocks, s.max_model_len
    max_num_batched_tokens = s.max_num_batched_tokens
    if s.sized:
        def size(max_model_len: int | None, max_num_batched_tokens: int):
            return compute_capacity(
                model, gpu, tp=s.tensor_parallel_size, block_size=block_size,
                kv_dtype=s.kv_cache_dtype,
                gpu_memory_utilization=(DEFAULT_GPU_MEMORY_UTILIZATION
                                        if s.gpu_memory_utilization is None
                                        else s.gpu_memory_utilization),
                max_model_len=max_model_len, max_num_seqs=s.max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens, non_kv_bytes=s.non_kv_bytes,
                enable_prefix_caching=s.enable_prefix_caching,
                disable_hybrid_kv_cache_manager=s.disable_hybrid_kv_cache_manager)

        report = size(max_model_len, max_num_batched_tokens)
        if v0_tokens and report.max_model_len > max_num_batched_tokens:
            # the model's context length sets v0's default budget: size again with it
            max_num_batched_tokens = report.max_model_len
            report = size(report.max_model_len, max_num_batched_tokens)
        num_gpu_blocks, max_model_len = report.num_gpu_blocks, report.max_model_len
        block_size = report.block_size
        if report.kv_plan is not None and s.allocator == "paged":
            # (a contiguous pool reserves whole sequences: groups do not apply)
            groups = kv_cache_group_specs(model, report.kv_plan.groups)
    elif not groups and s.allocator == "paged" and model is not None and \
            model.layers is not None:
        # a hybrid model on a pool given in blocks or tokens: its groups, whatever the pool
        groups, block_size = model_kv_groups(
            model, tp=s.tensor_parallel_size, kv_dtype=s.kv_cache_dtype, block_size=block_size,
            enable_prefix_caching=s.enable_prefix_caching,
            max_model_len=max_model_len or DEFAULT_MAX_MODEL_LEN,
            disable_hybrid=s.disable_hybrid_kv_cache_manager)
    block_size = DEFAULT_BLOCK_SIZE if block_size is None else block_size
    if s.kv_tokens is not None:
        num_gpu_blocks = s.kv_tokens // block_size + int(s.null_block)
        if num_gpu_blocks < 1 + int(s.null_block):
            raise InputError(f"kv_tokens {s.kv_tokens} is less than one block of {block_size} "
                             "tokens", field="kv_tokens")
    if max_model_len is None:
        max_model_len = DEFAULT_MAX_MODEL_LEN
    if v0_tokens and max_model_len > max_num_batched_tokens:
        max_num_batched_tokens = max_model_len
    return _Pool(report, num_gpu_blocks, block_size, tuple(groups), max_model_len,
                 max_num_batched_tokens)


def _engine_config(s: EngineSettings, pool: _Pool) -> EngineConfig:
    """The simulator's EngineConfig; async scheduling left None is vLLM's default where kvsim
    runs that mode (simulator/modes.py)."""
    async_scheduling = s.async_scheduling
    if async_scheduling is None:
        async_scheduling = default_async_scheduling(s.step_s, s.allocator, s.scheduler) and \
            MODES[Mode(s.scheduler, "grouped" if pool.kv_cache_groups else "paged",
                       ("async", "offload") if s.offloaded else ("async",))].runs is not None
    paged = s.allocator == "paged"
    # the one null-block rule: a contiguous pool gets the paged pool's usable blocks
    usable_blocks = pool.num_gpu_blocks - int(s.null_block)
    return EngineConfig(
        allocator=s.allocator, placement=s.placement, block_size=pool.block_size,
        num_blocks=pool.num_gpu_blocks if paged else None,
        capacity_tokens=None if paged else usable_blocks * pool.block_size,
        null_block=s.null_block and paged, max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=pool.max_num_batched_tokens, max_model_len=pool.max_model_len,
        enable_prefix_caching=s.enable_prefix_caching,
        long_prefill_token_threshold=s.long_prefill_token_threshold,
        full_prompt_admission=s.scheduler_reserve_full_isl, watermark=s.watermark,
        scheduler=s.scheduler, async_scheduling=async_scheduling,
        kv_cache_groups=pool.kv_cache_groups)


def carried(cost: CostModel, model: ModelSpec, source: GpuSpec, target: GpuSpec, tp: int = 1,
            kv_dtype: str = "auto") -> CarriedCost:
    """A table measured on ``source`` carried to ``target``: each step times the ratio of the two
    GPUs' rooflines of the same step (datasheet bandwidth and peak FLOPs, the same fixed part).
    Measured: the H100 tables carried to the H200 and back beat the roofline on every real-vLLM
    engine (docs/ACCURACY.md); to any other GPU it is an extrapolation, which the clock says."""
    roofs = [RooflineCost(model, g, tp=tp, kv_dtype=kv_dtype) for g in (source, target)]
    return CarriedCost(cost, *roofs, f"carried from {source.name} to {target.name} by their rooflines' "
                                     "ratio (extrapolated: not measured on this GPU)")


def _vllm_clock(s: EngineSettings, model: ModelSpec, gpu: GpuSpec, async_scheduling: bool,
                required: bool) -> tuple[EngineSettings, GpuSpec | None]:
    """Real vLLM's table for the run (planner.vllm_tables): the one measured for its model, GPU,
    weights, KV dtype, TP and scheduling mode; else (the default clock, not ``required``) one
    measured for all of it on another GPU, carried to this one by the two GPUs' rooflines (the
    GPU it was measured on is returned); else the settings unchanged (the roofline)."""
    setup = dict(model=model.name, gpu=gpu.name, tp=s.tensor_parallel_size, kv_dtype=s.kv_cache_dtype,
                 weights=_weight_method(model), async_scheduling=async_scheduling)
    table = vllm_table_for(**setup) if required else fitting_table(**setup)
    if table is not None:
        return replace(s, cost_table=str(table)), None
    table = fitting_table(**{**setup, "gpu": None})
    source = table_gpu(table) if table is not None else None
    if source is None:
        return s, None
    return replace(s, cost_table=str(table)), source


# the tables whose measured '# async off:' line a synchronous roofline takes: a dense model's
# from Llama-3.1-8B bf16, an MoE model's from Qwen3-30B-A3B (both served on the H100's host)
ASYNC_OFF_TABLES = {"dense": "llama8b-bf16-fine_H100.csv", "moe": "qwen3-30b-a3b-fine_H100.csv"}


# the tables whose measured way in and out (their '# frontend:' line: vLLM's frontend, CPU and IPC,
# no GPU work) the roofline takes, by the GPU whose machine served them and the model's kind; on
# another GPU the H100's
FRONTEND_TABLES = {"H100-80GB-SXM": {"dense": "llama8b-bf16-fine_H100.csv", "moe": "qwen3-30b-a3b-fine_H100.csv"},
                   "H200": {"dense": "llama8b-bf16_H200.csv", "moe": "qwen3-30b-a3b_H200.csv"}}


def _kind(model: ModelSpec) -> str:
    """'moe' for a model with routed experts, else 'dense' (the measured engine a roofline borrows from)."""
    return "moe" if model.weights is not None and model.weights.breakdown.num_experts else "dense"


def measured_frontend(model: ModelSpec, gpu: GpuSpec) -> tuple[float, float, float, str] | None:
    """A request's way in and a token's way out (in_s, in_s per prompt token, out_s, source) for a
    roofline: the '# frontend:' line of the measured engine of the model's kind on the GPU
    (FRONTEND_TABLES), on a GPU without one the H100's, said extrapolated; None where that table
    has no line or is not there."""
    from kvsim.simulator.cost_table import frontend_line   # numpy: not for `--help`

    tables = FRONTEND_TABLES.get(gpu.name)
    name = (tables or FRONTEND_TABLES["H100-80GB-SXM"])[_kind(model)]
    header = shipped_header(name)     # the line alone: no table fitted for it
    way = frontend_line(header, name) if header is not None else None
    if not way or not any(way):
        return None
    where = "" if tables else f", extrapolated to {gpu.name}"
    return (*way, f"{name}'s frontend line: real vLLM 0.23.0's lone prompts{where}")


def extrapolated_async_off(model: ModelSpec) -> tuple[float, float, str] | None:
    """What async scheduling hides a step, for a model no async-off run measured: the '# async off:'
    line (s per step, s per sequence, source) of the measured engine of its kind (ASYNC_OFF_TABLES:
    dense or MoE), said extrapolated; None where that table has no line."""
    from kvsim.simulator.cost_table import async_off_line   # numpy: not for `--help`

    name = ASYNC_OFF_TABLES[_kind(model)]
    header = shipped_header(name)     # the line alone: no table fitted for it
    line = async_off_line(header, name) if header is not None else None
    if line is None:
        return None
    return line[0], line[1], f"{name}'s line, extrapolated to {model.name}: {line[2]}"


def _step_cost(s: EngineSettings, model: ModelSpec | None, gpu: GpuSpec | None,
               async_scheduling: bool, carry_from: GpuSpec | None = None) -> CostModel:
    """The step-time model: a fixed step, a measured table (checked against this setup unless
    forced; ``carry_from``: measured on that GPU, carried to ``gpu``), else the roofline; scaled by
    ``step_time_scale``."""
    if s.step_s is not None:
        cost: CostModel = FixedStepCost(s.step_s)
    elif s.cost_table is not None:
        # here, not at the top: it imports numpy, which `kvsim replay --help` does not need
        cost = shipped_cost(s.cost_table)
        wrong = cost.mismatches(model=model.name if model is not None else None,
                                gpu=gpu.name if s.sized and gpu is not None and carry_from is None else None,
                                tp=s.tensor_parallel_size, kv_dtype=s.kv_cache_dtype,
                                weights=_weight_method(model), async_scheduling=async_scheduling) \
            if hasattr(cost, "mismatches") and not s.force_cost_table else []
        if wrong:
            raise InputError(f"{s.cost_table} was measured for another setup than this run's: "
                             f"{'; '.join(wrong)}. Match it, or pass --force-cost-table to use "
                             "its times anyway", field="cost_table")
        if s.first_use_compiles:
            cost = _with_first_use_compiles(cost, s.cost_table)
        # async off on a table measured with it on: each step also pays what async hid (CPU work:
        # carried to another GPU unscaled, as the frontend's times are)
        hidden = getattr(cost, "async_off", None)
        # a table whose grid's steps carry the probe's scheduling times knows its host's launch of a
        # step on no CUDA graph: its prices are that host's, and so is that floor under them
        table_launch = getattr(cost, "eager_launch_s", None) if getattr(cost, "first_step", None) else None
        measured_async = "async scheduling True" in getattr(cost, "provenance", {}).get("executor", "")
        if carry_from is not None:
            cost = carried(cost, model, carry_from, gpu, s.tensor_parallel_size, s.kv_cache_dtype)
        if s.eager_launch_s is not None:     # the host's CPU: not carried with the GPU
            cost = _with_eager_launch(cost, s.eager_launch_s, s.cost_table)
        elif table_launch is not None:       # the table's own host's ('# eager launch:' line)
            cost = _with_eager_launch(cost, table_launch, s.cost_table, None)
        if async_scheduling is False and measured_async and hidden is not None:
            cost = SyncCost(cost, *hidden)
    else:
        if s.first_use_compiles:
            raise InputError("first-use compiles are priced on real vLLM's table (kvsim profile --engine vllm), "
                             "not on this run's clock", field="first_use_compiles")
        if s.eager_launch_s is not None:
            raise InputError("an eager step's launch is priced on real vLLM's table (its largest CUDA graph), "
                             "not on this run's clock", field="eager_launch_s")
        flops, source = (s.flops_efficiency, "") if s.flops_efficiency is not None else \
            measured_flops_efficiency(model, gpu)
        # real vLLM's decode shares (bandwidth of weights and KV, time a layer) unless the memory
        # side or the fixed cost is given
        given = (s.step_overhead_s, s.bandwidth_efficiency) != (DEFAULT_STEP_OVERHEAD_S, 1.0)
        cost = RooflineCost(model, gpu, tp=s.tensor_parallel_size, kv_dtype=s.kv_cache_dtype,
                            step_overhead_s=s.step_overhead_s,
                            bandwidth_efficiency=s.bandwidth_efficiency,
                            flops_efficiency=flops, flops_source=source,
                            decode=None if given else measured_decode(gpu),
                            mixed_layer_s=0.0 if given else measured_mixed_layer_s(model),
                            frontend=None if given else measured_frontend(model, gpu))
        # async off: the measured shares come from steps that async scheduling overlapped with
        # their CPU work; a synchronous run pays it, as the nearest measured engine's line says
        hidden = extrapolated_async_off(model) if async_scheduling is False and not given else None
        if hidden is not None:
            cost = SyncCost(cost, *hidden)
    if s.step_time_scale != 1.0:
        cost = ScaledCost(cost, s.step_time_scale)
    return cost


def _clock_key(s: EngineSettings, model: ModelSpec | None, gpu: GpuSpec | None, async_scheduling: bool,
               carry_from: GpuSpec | None) -> dict | None:
    """The clock as planner.held_out names it: a shipped real-vLLM table (carried from the GPU it
    was measured on, or not; pricing first-use compiles, or not) or the roofline with its measured
    shares, unchanged; None for any other (a fixed step, a table of the user's or forced onto this
    setup, a scale, an eager launch, a roofline parameter given)."""
    from kvsim.planner.held_out import clock_key
    from kvsim.planner.vllm_tables import TABLES_DIR

    if model is None or gpu is None or s.step_s is not None or s.step_time_scale != 1.0 \
            or s.eager_launch_s is not None:
        return None
    if s.cost_table is None:
        if (s.step_overhead_s, s.bandwidth_efficiency, s.flops_efficiency) != (DEFAULT_STEP_OVERHEAD_S, 1.0, None):
            return None
        table = measured_on = None
    else:
        path = Path(s.cost_table).resolve()
        if path.parent != TABLES_DIR or s.force_cost_table:
            return None
        table, measured_on = path.name, (carry_from or gpu).name
    return clock_key(table=table, measured_on=measured_on, gpu=gpu.name, model=model.name,
                     moe=_kind(model) == "moe", weights=_weight_method(model), kv_dtype=s.kv_cache_dtype,
                     tp=s.tensor_parallel_size, async_scheduling=async_scheduling,
                     first_use_compiles=s.first_use_compiles)


# a shipped table's model with its clock line's held-out note, one a (table, note): the table is
# read and fitted once per process, and every run of one clock gets the same object
_NOTED: dict[tuple[int, str], CostModel] = {}


def _with_held_out_note(cost: CostModel, clock: dict, shared: bool) -> CostModel:
    """``cost`` whose clock line ends with the clock's held-out figures against real vLLM
    (planner.held_out) and which keeps them (``held_out``: None where that clock was not measured),
    or ``cost`` itself where no figures of its kind were measured. A ``shared``
    model (a shipped table's, shared by every run of the process) is not changed: its copy with the
    note is (one a note)."""
    from kvsim.planner.held_out import held_out_figures, held_out_note

    note = held_out_note(clock)
    if note is None:
        return cost
    if shared:
        key = (id(cost), note)      # the shipped model lives as long as the process: its id is stable
        if key not in _NOTED:
            _NOTED[key] = _noted(copy.copy(cost), note, held_out_figures(clock))
        return _NOTED[key]
    return _noted(cost, note, held_out_figures(clock))      # built for this run alone


def _noted(cost: CostModel, note: str, figures: dict | None) -> CostModel:
    """``cost`` with its clock line's held-out note and (where measured) its figures (the engine's
    summary: ``config.clock_held_out``)."""
    cost.held_out_note = note
    cost.held_out = figures
    return cost


def _with_first_use_compiles(cost, table) -> CostModel:
    """A copy of real vLLM's ``table``'s cost model that prices a fresh engine's first-use compiles
    (simulator.first_use: the slot mapping's for every model; an MXFP4 MoE model's routing, its
    token sort and the expert matmuls too, eager beyond the table's largest CUDA graph); an
    InputError for a table that is not real vLLM's (kvsim's own executor's), or an MXFP4 MoE
    model's without the graph size (its '# first step:' line)."""
    from kvsim.simulator.first_use import (FirstUseCompiles, SlotMappingCompiles, expert_matmul_compiles,
                                           routing_compiles, routing_sort_compiles)

    provenance = getattr(cost, "provenance", {})
    if not provenance.get("executor", "").startswith("vllm"):
        raise InputError(f"first-use compiles are priced on real vLLM's table (kvsim profile --engine vllm); "
                         f"{table} is not one", field="first_use_compiles")
    name = provenance.get("model")
    try:
        measured = get_model(name) if name else None
    except InputError:
        measured = None
    rules = [SlotMappingCompiles()]
    if measured is not None and _weight_method(measured) == "mxfp4" and measured.num_active_params < measured.num_params:
        first_step = getattr(cost, "first_step", None)
        if first_step is None:
            raise InputError(f"first-use compiles of an MXFP4 MoE model's routing need the table's largest CUDA "
                             f"graph ('# first step:' line); {table} has none", field="first_use_compiles")
        rules.append(routing_compiles(first_step.graph_tokens, name))
        routed = measured.weights.breakdown
        for family in (expert_matmul_compiles, routing_sort_compiles):
            rules += family(first_step.graph_tokens, name, routed.num_experts, routed.num_experts_per_tok)
    cost = copy.copy(cost)       # the shipped table's model is shared by every run of the process
    cost.first_use_compiles = FirstUseCompiles(tuple(rules))
    return cost


def _with_eager_launch(cost, launch_s: float, table, source: str | None = "the host's, given") -> CostModel:
    """``cost`` on a host whose eager steps launch in ``launch_s`` (simulator.cost.EagerLaunchCost;
    the largest CUDA graph from real vLLM's table's '# first step:' line; ``source`` None: the
    table's own '# eager launch:' line); an InputError for a launch that is not a positive number
    of seconds or a table without that line."""
    if not (launch_s > 0 and math.isfinite(launch_s)):
        raise InputError(f"an eager step's launch must be a positive number of seconds, got {launch_s}",
                         field="eager_launch_s")
    first_step = getattr(cost, "first_step", None)
    if first_step is None:
        raise InputError(f"an eager step's launch needs real vLLM's table with its largest CUDA graph ('# first "
                         f"step:' line); {table} has none", field="eager_launch_s")
    from kvsim.simulator.cost import EagerLaunchCost

    return EagerLaunchCost(cost, launch_s, first_step.graph_tokens, source)


def _weight_method(model: ModelSpec | None) -> str | None:
    """How the model's weights are served (``WeightFormat.method``), None when not known."""
    fmt = getattr(getattr(model, "weights", None), "format", None)
    return fmt.method if fmt is not None else None


def _offload_tiers(model: ModelSpec | None, gpu: GpuSpec | None, tp: int, kv_dtype: str,
                   block_size: int, groups: tuple = (), **flags) -> tuple[TierConfig, ...]:
    """The simulator's tiers for the flags (planner.tiers checks them, one-line errors). A
    chunk is one GPU block of the model; with a hybrid model's KV-cache groups, one block of
    one group (vLLM: the worker's KV bytes per block, the largest group's page over its
    layers), so that every group's chunk fills one slot. Groups given by hand
    (``--kv-groups``) say nothing of bytes: a chunk is then the model's whole block."""
    per_rank, copies = block_bytes(model, kv_dtype, tp, block_size) if model else (1, tp)
    if groups and all(g.page_size_bytes for g in groups):
        per_rank = max(g.page_size_bytes * g.num_layers for g in groups)
    tiers = build_tiers(gpu_name=gpu.name if gpu else None, bytes_per_block=per_rank, tp=copies,
                        **flags)
    # here, not at the top: the offload module loads the allocator package (numpy), which
    # `kvsim replay --help` does not need
    from kvsim.simulator.offload import TierConfig
    return tuple(TierConfig(t.name, t.num_chunks(per_rank, copies),
                            t.chunk_bytes(per_rank, copies), t.bytes_per_s, t.latency_s)
                 for t in tiers)

