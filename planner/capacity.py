"""How many KV-cache blocks vLLM would allocate: its formula, step by step.

vLLM (v1, ``gpu_worker.determine_available_memory`` and ``kv_cache_utils``) sizes the pool as::

    available_kv_bytes = total_gpu_memory * gpu_memory_utilization - non_kv_bytes
    page_bytes(layer)  = block_size * kv_heads_per_rank * (head_size_k + head_size_v) * dtype_bytes
    bytes_per_block    = sum over layers of page_bytes(layer)
    num_gpu_blocks     = available_kv_bytes // bytes_per_block
    max_concurrency    = num_gpu_blocks / cdiv(max_model_len, block_size)

``non_kv_bytes`` is what vLLM *measures* in a profiling run (weights + peak activations of a
dummy batch of max_num_batched_tokens + memory allocated outside PyTorch). We cannot profile, so
we estimate it (``estimate_activation_bytes``; documented there and in docs/PLANNER.md) or
take it from the user (``non_kv_bytes=`` / ``--non-kv-gib``, e.g. copied from a vLLM log line).

Models with per-layer shapes (``ModelSpec.layers``: sliding windows, MLA, Mamba state; the
hybrid presets and ``--hf-config`` imports) take vLLM 0.33's KV-cache-group arithmetic instead
(``planner.kv_groups``: per-layer pages, groups, one unified page size, num_gpu_blocks =
available // page, max concurrency from each group's blocks per request); the report then
carries one row per group (``kv_groups``).

Tensor parallelism: each rank holds kv_heads / tp heads; when tp exceeds the KV heads vLLM
replicates them (one head per rank, tp must then be a multiple of kv_heads). MLA caches one latent
of kv_lora_rank + qk_rope_head_dim elements per token and layer, with no factor 2 and replicated on
every rank.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from kvsim.errors import InputError
from kvsim.planner.kv_groups import (KVCachePlan, default_block_size, kv_cache_groups,
                                     layer_kv_specs, mamba_checkpoint_alignment, plan_kv_cache)
from kvsim.planner.layers import AttentionLayer
from kvsim.planner.specs import GIB, GpuSpec, ModelSpec, dtype_bytes

# vLLM's default gpu_memory_utilization in the release our notes read (0.33: 0.92; 0.9 before)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
DEFAULT_BLOCK_SIZE = 16
# memory allocated outside PyTorch's allocator (CUDA context growth, cuBLAS/NCCL workspaces).
# vLLM logs show 0.20 GiB (vllm PR #14447) to 1.79 GiB (PR #10511, H100, TP=1); we take 0.5 GiB.
DEFAULT_NON_TORCH_BYTES = GIB // 2
KV_DTYPES = ("auto", "float16", "fp16", "bfloat16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2")


def vllm_batch_defaults(gpu: GpuSpec) -> tuple[int, int]:
    """vLLM's ``vllm serve`` defaults (``arg_utils.get_batch_defaults``) for this GPU.

    Returns:
        (max_num_seqs, max_num_batched_tokens): >= 160 GiB: (1024, 16384); >= 70 GiB and not an
        A100: (1024, 8192); otherwise (256, 2048).
    """
    gib = gpu.memory_bytes / GIB
    if gib >= 160:
        return 1024, 16384
    if gib >= 70 and "a100" not in gpu.name.lower():
        return 1024, 8192
    return 256, 2048


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads each tensor-parallel rank caches, by vLLM's rule.

    vLLM splits KV heads evenly when num_kv_heads >= tp (they must divide) and replicates them
    when tp > num_kv_heads (tp must be a multiple); MLA's latent is one "head" on every rank.
    Query heads must always divide by tp.

    Raises:
        InputError: tp < 1, or heads and tp incompatible (message carries the numbers).
    """
    if tp < 1:
        raise InputError(f"tp (tensor_parallel_size) must be >= 1, got {tp}")
    if model.num_attention_heads % tp:
        raise InputError(f"{model.name}: num_attention_heads ({model.num_attention_heads}) must be "
                         f"divisible by tp ({tp})")
    if model.is_mla:
        return 1
    kv = model.num_kv_heads
    if kv >= tp:
        if kv % tp:
            raise InputError(f"{model.name}: num_kv_heads ({kv}) must be divisible by tp ({tp})")
        return kv // tp
    if tp % kv:
        raise InputError(f"{model.name}: tp ({tp}) > num_kv_heads ({kv}) needs tp to be a multiple "
                         f"of num_kv_heads to replicate them")
    return 1


def resolve_kv_dtype_bytes(model: ModelSpec, kv_dtype: str) -> int:
    """Bytes per cached element: "auto" follows the model dtype (as vLLM's --kv-cache-dtype auto)."""
    if kv_dtype not in KV_DTYPES:
        raise InputError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    return model.dtype_bytes if kv_dtype == "auto" else dtype_bytes(kv_dtype)


def kv_bytes_per_token(model: ModelSpec, kv_dtype: str = "auto", tp: int = 1) -> int:
    """KV-cache bytes one token occupies on one tensor-parallel rank, summed over layers.

    Dense/GQA: layers * 2 (K and V) * kv_heads_per_rank * head_dim * dtype_bytes.
    MLA: layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes (no factor 2, not split by tp).
    With per-layer shapes: the attention layers' (a sliding window's token counted as if kept;
    Mamba state is per request, not per token).
    """
    elem = resolve_kv_dtype_bytes(model, kv_dtype)
    heads = kv_heads_per_rank(model, tp)
    if model.layers is not None:
        return sum(_layer_heads(x, tp) * (x.head_size + x.head_size_v) * elem
                   for x in model.layers if isinstance(x, AttentionLayer))
    if model.is_mla:
        return model.num_layers * (model.kv_lora_rank + model.qk_rope_head_dim) * elem
    return model.num_layers * 2 * heads * model.head_dim * elem


def _layer_heads(layer: AttentionLayer, tp: int) -> int:
    return 1 if layer.kind == "mla" else max(1, layer.num_kv_heads // tp)


def estimate_activation_bytes(model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int,
                              tp: int = 1) -> int:
    """Our stand-in for the PyTorch peak of vLLM's profiling run (vLLM measures it; we estimate).

    The profile runs one forward pass over max_num_batched_tokens dummy tokens, then the sampler
    over max_num_seqs rows. Peak = the larger of:
      - forward: tokens * act_bytes * (6 * hidden + 3 * intermediate / tp): at the MLP the
        residual stream, the normed input, the attention output and temporaries (~6 hidden-wide
        tensors) coexist with the gate/up output (2 I) and the activated product (I), which
        are sharded by tp;
      - sampler: max_num_seqs * vocab * 4 bytes (fp32 logits).
    Check against vLLM's log for Llama-3-8B on an H100 (PR #10511: 8192 tokens, 256 seqs):
    1.03 GiB estimated vs 1.26 GiB measured.
    """
    forward = max_num_batched_tokens * model.dtype_bytes * (
        6 * model.hidden_size + 3 * math.ceil(model.intermediate_size / tp))
    sampler = max_num_seqs * model.vocab_size * 4
    return max(forward, sampler)


@dataclass(frozen=True)
class CapacityReport:
    """Every number of the computation, for printing, JSON and tests (bytes are per GPU)."""

    model: str
    gpu: str
    tp: int
    block_size: int
    kv_dtype: str
    kv_dtype_bytes: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_heads_per_rank: int
    kv_bytes_per_token: int
    bytes_per_block: int
    total_memory_bytes: int
    budget_bytes: int            # total * gpu_memory_utilization
    weight_bytes: int            # per GPU (weights / tp)
    activation_bytes: int        # estimated (0 when non_kv_bytes was given)
    non_torch_bytes: int
    non_kv_bytes: int            # weights + activations + non-torch, or the given figure
    non_kv_given: bool
    available_kv_bytes: int
    num_gpu_blocks: int          # vLLM's num_gpu_blocks (block 0 becomes the null block)
    kv_cache_tokens: int         # "GPU KV cache size: N tokens"
    max_concurrency: float       # "Maximum concurrency for max_model_len tokens per request"
    # models with per-layer shapes: one row per KV-cache group (``group_rows``), and the plan
    kv_groups: tuple = ()
    weight_format: str = ""      # a quantized or re-typed checkpoint: how its weights are held
    kv_plan: KVCachePlan | None = field(default=None, repr=False, compare=False)

    @property
    def num_gpus(self) -> int:
        return self.tp

    def concurrency_for(self, num_tokens: int) -> float:
        """Requests of num_tokens tokens each that fit at once: num_blocks / cdiv(L, block_size)
        (with KV-cache groups: num_blocks / every group's blocks for such a request)."""
        if num_tokens <= 0:
            raise InputError(f"num_tokens must be > 0, got {num_tokens}")
        if self.kv_plan is not None:
            return self.kv_plan.concurrency_for(num_tokens)
        return self.num_gpu_blocks / math.ceil(num_tokens / self.block_size)

    def to_dict(self) -> dict:
        out = asdict(self)
        del out["kv_plan"]
        for key in ("kv_groups", "weight_format"):
            if not out[key]:
                del out[key]
        return out

    def concurrency_at_lengths(self, request_tokens) -> dict:
        """Requests of a trace's own lengths that fit in the KV cache at once.

        Args:
            request_tokens: prompt + output tokens of each request (a sequence of ints).
        Returns:
            ``{"mean" | "p50" | "p99": {"tokens", "blocks", "concurrency"}}``: at the mean, median
            and 99th-percentile length (capped at max_model_len), ``concurrency_for`` that length:
            what KV memory allows, before max_num_seqs caps the batch.
        """
        import numpy as np

        lengths = np.minimum(np.asarray(request_tokens, dtype=np.int64), self.max_model_len)
        if lengths.size == 0:
            raise InputError("the workload has no requests")
        out = {}
        for name, value in (("mean", lengths.mean()), ("p50", np.percentile(lengths, 50)),
                            ("p99", np.percentile(lengths, 99))):
            tokens = max(1, int(math.ceil(value)))
            out[name] = {"tokens": tokens, "blocks": math.ceil(tokens / self.block_size),
                         "concurrency": round(self.concurrency_for(tokens), 6)}
        return out


def compute_capacity(model: ModelSpec, gpu: GpuSpec, *, tp: int = 1, block_size: int | None = None,
                     kv_dtype: str = "auto",
                     gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                     max_model_len: int | None = None, max_num_seqs: int | None = None,
                     max_num_batched_tokens: int | None = None, non_kv_bytes: int | None = None,
                     non_torch_bytes: int = DEFAULT_NON_TORCH_BYTES,
                     check_max_model_len: bool = True, enable_prefix_caching: bool = True,
                     disable_hybrid_kv_cache_manager: bool = False) -> CapacityReport:
    """vLLM's num_gpu_blocks for a model on a GPU.

    Args:
        model, gpu: the specs.
        tp: tensor-parallel size (GPUs per replica).
        block_size: tokens per KV block (None: vLLM's, 16; 64 for MLA with per-layer shapes;
            a Mamba hybrid raises it until an attention page holds a Mamba state).
        kv_dtype: "auto" (model dtype), "fp16"/"bf16", or "fp8" (1 byte: half of 16-bit).
        gpu_memory_utilization: fraction of the GPU's total vLLM may use, in (0, 1].
        max_model_len: longest request (tokens); default the model's max_position_embeddings.
        max_num_seqs, max_num_batched_tokens: default vLLM's for the GPU (vllm_batch_defaults);
            they size the activation estimate.
        non_kv_bytes: per-GPU memory that is not KV cache, if known (replaces the estimate).
        non_torch_bytes: the non-PyTorch part of the estimate.
        check_max_model_len: raise, as vLLM does at start-up, when one max_model_len request
            does not fit.
        enable_prefix_caching: with Mamba layers, vLLM's "align" mode (state blocks of the
            attention block size) instead of one max_model_len block per request.
        disable_hybrid_kv_cache_manager: vLLM's flag: sliding-window layers keep every block.
    Returns:
        The CapacityReport.
    Raises:
        InputError: impossible configuration (one line, with the numbers).
    """
    max_num_seqs, max_num_batched_tokens, max_model_len = _limits(
        model, gpu, gpu_memory_utilization, block_size, max_num_seqs, max_num_batched_tokens,
        max_model_len)
    elem = resolve_kv_dtype_bytes(model, kv_dtype)
    heads = kv_heads_per_rank(model, tp)
    per_token = kv_bytes_per_token(model, kv_dtype, tp)
    if model.layers is None:
        block_size = DEFAULT_BLOCK_SIZE if block_size is None else block_size
        per_block = per_token * block_size
    total, budget, weights, activation, non_torch, non_kv = _non_kv_memory(
        model, gpu, tp, gpu_memory_utilization, non_kv_bytes, non_torch_bytes,
        max_num_batched_tokens, max_num_seqs)
    available = budget - non_kv
    if available <= 0:
        raise InputError(f"no memory left for the KV cache on {gpu.name}: budget {budget / GIB:.2f} GiB "
                         f"- non-KV {non_kv / GIB:.2f} GiB = {available / GIB:.2f} GiB; raise "
                         f"gpu_memory_utilization or tp")
    plan = rows = None
    if model.layers is not None:
        plan = plan_layers(model, tp=tp, kv_dtype_bytes=elem, block_size=block_size,
                           available_kv_bytes=available, max_model_len=max_model_len,
                           max_num_batched_tokens=max_num_batched_tokens,
                           enable_prefix_caching=enable_prefix_caching,
                           disable_hybrid=disable_hybrid_kv_cache_manager,
                           check_max_model_len=check_max_model_len)
        block_size, per_block, num_blocks = plan.block_size, plan.bytes_per_block, plan.num_gpu_blocks
        kv_tokens, concurrency, rows = plan.kv_cache_tokens, plan.max_concurrency, group_rows(plan)
    else:
        num_blocks, kv_tokens, concurrency = _uniform_pool(available, per_block, block_size,
                                                           max_model_len, check_max_model_len)
    return CapacityReport(
        model=model.name, gpu=gpu.name, tp=tp, block_size=block_size, kv_dtype=kv_dtype,
        kv_dtype_bytes=elem, gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, kv_heads_per_rank=heads,
        kv_bytes_per_token=per_token, bytes_per_block=per_block, total_memory_bytes=total,
        budget_bytes=budget, weight_bytes=weights, activation_bytes=activation,
        non_torch_bytes=non_torch, non_kv_bytes=non_kv, non_kv_given=non_kv_bytes is not None,
        available_kv_bytes=available, num_gpu_blocks=num_blocks, kv_cache_tokens=kv_tokens,
        max_concurrency=concurrency, kv_groups=rows or (), kv_plan=plan,
        weight_format=_weight_label(model))


def _uniform_pool(available: int, per_block: int, block_size: int, max_model_len: int,
                  check_max_model_len: bool) -> tuple[int, int, float]:
    """Every layer alike: (num_gpu_blocks, KV tokens, max_model_len requests that fit)."""
    num_blocks = available // per_block
    if check_max_model_len:
        needed = math.ceil(max_model_len / block_size) * per_block
        if needed > available:
            raise InputError(f"one request of max_model_len {max_model_len} needs {needed / GIB:.2f} GiB of KV "
                             f"cache, more than the {available / GIB:.2f} GiB available; the largest that "
                             f"fits is {num_blocks * block_size} tokens (lower max_model_len or raise "
                             f"gpu_memory_utilization)")
    return num_blocks, num_blocks * block_size, num_blocks / math.ceil(max_model_len / block_size)


def _limits(model: ModelSpec, gpu: GpuSpec, gpu_memory_utilization: float, block_size: int | None,
            max_num_seqs: int | None, max_num_batched_tokens: int | None,
            max_model_len: int | None) -> tuple[int, int, int]:
    """compute_capacity's settings checked; (max_num_seqs, max_num_batched_tokens,
    max_model_len) with vLLM's defaults for the GPU and the model taken."""
    if not 0 < gpu_memory_utilization <= 1:
        raise InputError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if block_size is not None and block_size < 1:
        raise InputError(f"block_size must be >= 1, got {block_size}")
    default_seqs, default_tokens = vllm_batch_defaults(gpu)
    max_num_seqs = default_seqs if max_num_seqs is None else max_num_seqs
    max_num_batched_tokens = default_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    if max_num_seqs < 1 or max_num_batched_tokens < 1:
        raise InputError(f"max_num_seqs and max_num_batched_tokens must be >= 1, got "
                         f"{max_num_seqs} and {max_num_batched_tokens}")
    derived_len = model.max_position_embeddings
    if max_model_len is None:
        if derived_len is None:
            raise InputError(f"{model.name}: max_model_len is required (no max_position_embeddings)")
        max_model_len = derived_len
    if max_model_len < 1:
        raise InputError(f"max_model_len must be >= 1, got {max_model_len}")
    if derived_len is not None and max_model_len > derived_len:
        raise InputError(f"max_model_len ({max_model_len}) exceeds {model.name}'s "
                         f"max_position_embeddings ({derived_len})")
    return max_num_seqs, max_num_batched_tokens, max_model_len


def _non_kv_memory(model: ModelSpec, gpu: GpuSpec, tp: int, gpu_memory_utilization: float,
                   non_kv_bytes: int | None, non_torch_bytes: int, max_num_batched_tokens: int,
                   max_num_seqs: int) -> tuple[int, int, int, int, int, int]:
    """(the GPU's bytes, vLLM's budget, weights, activations, non-PyTorch, non-KV in all) per
    GPU; the weights must fit the budget."""
    total = gpu.memory_bytes
    budget = int(total * gpu_memory_utilization)
    weights = math.ceil(model.weight_bytes / tp)
    if weights > budget:
        raise InputError(f"{model.name} weights need {weights / GIB:.2f} GiB per GPU at tp={tp}, more than "
                         f"{gpu.name}'s {total / GIB:.2f} GiB x gpu_memory_utilization "
                         f"{gpu_memory_utilization} = {budget / GIB:.2f} GiB")
    if non_kv_bytes is not None:
        if non_kv_bytes < 0:
            raise InputError(f"non_kv_bytes must be >= 0, got {non_kv_bytes}")
        return total, budget, weights, 0, 0, int(non_kv_bytes)
    activation = estimate_activation_bytes(model, max_num_batched_tokens, max_num_seqs, tp)
    return total, budget, weights, activation, non_torch_bytes, \
        weights + activation + non_torch_bytes


def _weight_label(model: ModelSpec) -> str:
    fmt = getattr(model.weights, "format", None)
    if fmt is None or (fmt.method == "dtype" and fmt.source == "torch_dtype"):
        return ""
    return f"{fmt.label} ({fmt.source})"


# vLLM 0.33's engine schedules asynchronously by default on a GPU: two batches in flight bound
# how far a sliding window may lag (its blocks per request at max_model_len)
VLLM_MAX_CONCURRENT_BATCHES = 2


def plan_layers(model: ModelSpec, *, tp: int, kv_dtype_bytes: int, block_size: int | None,
                available_kv_bytes: int, max_model_len: int, max_num_batched_tokens: int,
                enable_prefix_caching: bool = True, disable_hybrid: bool = False,
                check_max_model_len: bool = True) -> KVCachePlan:
    """vLLM's KV-cache plan of a model with per-layer shapes (planner.kv_groups), as its
    engine core computes it for ``available_kv_bytes`` per GPU.

    Raises:
        InputError: the model's shapes and tp disagree, no layer keeps anything, or one
            max_model_len request does not fit (vLLM's start-up error, with the largest
            max_model_len that would).
    """
    layers = model.layers
    try:
        specs, block = layer_kv_specs(
            layers, tp=tp, kv_dtype_bytes=kv_dtype_bytes, model_dtype=model.dtype,
            block_size=block_size or default_block_size(layers),
            enable_prefix_caching=enable_prefix_caching, max_model_len=max_model_len,
            disable_hybrid=disable_hybrid)
        plan = plan_kv_cache(specs, block, available_kv_bytes, max_model_len,
                             VLLM_MAX_CONCURRENT_BATCHES * max_num_batched_tokens,
                             check_max_model_len=check_max_model_len)
    except ValueError as err:
        raise InputError(f"{model.name}: {err}") from None
    return plan


def group_rows(plan: KVCachePlan) -> tuple[dict, ...]:
    """One row per KV-cache group: what vLLM logs and what the pool spends on it (per GPU)."""
    rows = []
    for g, blocks in zip(plan.groups, plan.blocks_per_request):
        spec = g.spec
        rows.append({"kind": spec.kind, "num_layers": len(g.layers),
                     "sliding_window": spec.sliding_window, "block_size": g.block_size,
                     "page_bytes_per_layer": spec.page_size_bytes, "page_bytes": g.page_bytes,
                     "bytes_per_token": g.page_bytes / g.block_size,
                     "blocks_per_request": blocks})
    return tuple(rows)


def model_kv_groups(model: ModelSpec, *, tp: int, kv_dtype: str, block_size: int | None,
                    enable_prefix_caching: bool, max_model_len: int,
                    disable_hybrid: bool = False) -> tuple[tuple, int]:
    """A hybrid model's KV-cache groups for a pool of any size (given in blocks): the
    simulator's groups (``kv_cache_group_specs``) and vLLM's block size for them."""
    layers = model.layers
    kv_heads_per_rank(model, tp)                       # tp must suit the heads
    try:
        specs, block = layer_kv_specs(
            layers, tp=tp, kv_dtype_bytes=resolve_kv_dtype_bytes(model, kv_dtype),
            model_dtype=model.dtype, block_size=block_size or default_block_size(layers),
            enable_prefix_caching=enable_prefix_caching, max_model_len=max_model_len,
            disable_hybrid=disable_hybrid)
    except ValueError as err:
        raise InputError(f"{model.name}: {err}") from None
    return kv_cache_group_specs(model, kv_cache_groups(specs)), block


def kv_cache_group_specs(model: ModelSpec, groups) -> tuple:
    """The simulator's groups (allocator.KVCacheGroupSpec) for vLLM's groups of a model
    (planner.kv_groups.KVGroup), or () when vLLM would run it as plain full attention (one
    full-attention or MLA group)."""
    from kvsim.allocator.group_managers import KVCacheGroupSpec
    from kvsim.planner.kv_groups import group_label

    if len(groups) == 1 and groups[0].kind == "full_attention":
        return ()
    out = []
    for g in groups:
        spec = g.spec
        alignment = None
        if spec.kind == "mamba":
            alignment = mamba_checkpoint_alignment(spec, model.layers[g.layers[0]])
        out.append(KVCacheGroupSpec(g.kind, sliding_window=spec.sliding_window,
                                    mamba_checkpoint_alignment=alignment,
                                    num_layers=len(g.layers), page_size_bytes=spec.page_size_bytes,
                                    name=group_label(g)))
    return tuple(out)
