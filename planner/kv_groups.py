"""vLLM 0.33's KV-cache plan for any mix of layers: per-rank page sizes, groups, num_gpu_blocks.

From the per-layer shapes (``kvsim.planner.layers``) to what vLLM's engine core logs, step by
step, as ``v1/core/kv_cache_planning.py`` and ``kv_cache_utils.py`` do it:

1. **Per-layer specs on one rank** (``layer_kv_specs``). Attention:
   ``page = block_size x kv_heads_per_rank x (head_size + head_size_v) x kv_dtype_bytes``;
   MLA: ``head_size = kv_lora_rank + qk_rope_head_dim``, no V, one latent on every rank.
   Mamba: the state bytes (conv + SSM), whatever the block size. For a model with Mamba
   layers the attention block size is first raised until an attention page holds a Mamba
   state (``Platform._align_hybrid_block_size``), and the Mamba page is padded to it.
2. **Groups** (``kv_cache_groups``). One group if every layer has the same spec, or the same
   type (all full attention and MLA, all sliding with one window, all Mamba alike). Otherwise
   pages are unified (smaller pages scale their block size or are padded), layers are
   bucketed by spec, and every bucket is cut into groups of ``group_size`` layers:
   the smallest bucket's size, or the largest if it is under 1.5 times the smallest. Each
   group has its own block table; all groups share one pool of blocks of one size.
3. **Pool** (``plan_kv_cache``). ``bytes_per_block`` = the largest group's sum of pages;
   ``num_gpu_blocks = available_kv_bytes // bytes_per_block``. A request at
   ``max_model_len`` needs, per group, ``cdiv(max_memory, page)`` blocks: full attention
   ``cdiv(L, B)``; sliding window ``cdiv(min(W - 1 + in-flight tokens, L), B) + 1``; Mamba 1
   block (2, plus a checkpoint block for Mamba2, with prefix caching). Maximum concurrency =
   ``num_gpu_blocks / sum of those``; "GPU KV cache size" = ``int(concurrency x L)`` tokens.

Layout: layer-outermost (LBNHC, FlashAttention's), as on an H100/H200.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from kvsim.planner.layers import AttentionLayer, Layer, MambaLayer
from kvsim.planner.specs import dtype_bytes

cdiv = lambda a, b: -(-a // b)  # noqa: E731


@dataclass(frozen=True)
class LayerKVSpec:
    """One layer's KV cache on one rank (vLLM's FullAttentionSpec / SlidingWindowSpec /
    MLAAttentionSpec / MambaSpec, the fields planning reads)."""

    kind: str                       # "full_attention" | "sliding_window" | "mla" | "mamba"
    block_size: int
    unpadded_page_bytes: int        # bytes of the content of one block
    page_size_padded: int | None = None
    sliding_window: int | None = None
    mamba_cache_mode: str = "none"  # "align" with prefix caching, else "none"
    num_prefill_checkpoint_blocks: int = 0
    attention_bytes_per_token: int = 0   # attention: page bytes per token (scales with block)

    @property
    def page_size_bytes(self) -> int:
        return self.page_size_padded if self.page_size_padded is not None \
            else self.unpadded_page_bytes

    @property
    def type_key(self) -> tuple:
        """Specs that may share one group as "the same type" (vLLM's uniform-type rule)."""
        if self.kind in ("full_attention", "mla"):
            return ("full_attention", self.block_size)
        if self.kind == "sliding_window":
            return ("sliding_window", self.block_size, self.sliding_window)
        return ("mamba", self.block_size, self.page_size_bytes,
                self.num_prefill_checkpoint_blocks)

    def with_block_size(self, block_size: int) -> "LayerKVSpec":
        return replace(self, block_size=block_size,
                       unpadded_page_bytes=self.attention_bytes_per_token * block_size)

    def max_memory_bytes(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        """What one request of ``max_model_len`` tokens may hold (vLLM's
        ``max_memory_usage_bytes``)."""
        if self.kind == "sliding_window":
            tokens = min(self.sliding_window - 1 + max_in_flight_tokens, max_model_len)
            return (cdiv(tokens, self.block_size) + 1) * self.page_size_bytes
        if self.kind == "mamba":
            if self.mamba_cache_mode == "align":
                return self.page_size_bytes * (2 + self.num_prefill_checkpoint_blocks)
            return self.page_size_bytes
        return cdiv(max_model_len, self.block_size) * self.page_size_bytes


@dataclass(frozen=True)
class KVGroup:
    """A KV-cache group: layers sharing one block table."""

    kind: str                       # kind of its layers ("full_attention" for MLA too)
    layers: tuple[int, ...]         # layer indices
    specs: tuple[LayerKVSpec, ...]  # per layer (equal except in a uniform-type group)

    @property
    def spec(self) -> LayerKVSpec:
        """The group's spec as the scheduler sees it (vLLM: the first layer's)."""
        return self.specs[0]

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    @property
    def page_bytes(self) -> int:
        """Bytes of one block of this group: every layer's page."""
        return sum(s.page_size_bytes for s in self.specs)

    @property
    def bytes_per_token(self) -> float:
        return self.page_bytes / self.block_size

    def blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        return cdiv(self.spec.max_memory_bytes(max_model_len, max_in_flight_tokens),
                    self.spec.page_size_bytes)


@dataclass(frozen=True)
class BackendRules:
    """What vLLM's attention backends impose on block sizes (defaults: an H100/H200, SM90).

    Args:
        kernel_block_size: smallest kernel block of the attention backend (FlashAttention:
            multiples of 16); block sizes are rounded to it.
        mla_block_size: MLA's backend block (FlashMLA: 64).
        linear_attention_checkpoint_alignment: Gated DeltaNet's prefill checkpoint alignment
            (FlashInfer's GDN prefill on SM90: 64; None: Triton/FLA, no checkpoints).
    """

    kernel_block_size: int = 16
    mla_block_size: int = 64
    linear_attention_checkpoint_alignment: int | None = 64


HOPPER = BackendRules()


def default_block_size(layers: Sequence[Layer], rules: BackendRules = HOPPER) -> int:
    """vLLM's block size before hybrid alignment: 16, or the MLA backend's block."""
    if any(isinstance(x, AttentionLayer) and x.kind == "mla" for x in layers):
        return rules.mla_block_size
    return 16


def kv_heads_on_rank(num_kv_heads: int, tp: int) -> int:
    """vLLM's rule: split when num_kv_heads >= tp, else replicate one per rank."""
    return max(1, num_kv_heads // tp)


def layer_kv_specs(layers: Sequence[Layer], *, tp: int, kv_dtype_bytes: int,
                   model_dtype: str, block_size: int, enable_prefix_caching: bool,
                   max_model_len: int, rules: BackendRules = HOPPER,
                   disable_hybrid: bool = False) -> tuple[list[LayerKVSpec | None], int]:
    """Every layer's spec on one rank, and the block size vLLM settles on.

    Args:
        layers: per-layer shapes (None: no KV cache).
        kv_dtype_bytes: attention cache element size; ``model_dtype`` sizes Mamba conv states.
        block_size: the requested block size (vLLM's ``--block-size``, default 16).
        disable_hybrid: vLLM's ``--disable-hybrid-kv-cache-manager`` (sliding-window layers
            keep every block, as full attention).
    Returns:
        (specs per layer, final block size).
    """
    if disable_hybrid:
        # vLLM's --disable-hybrid-kv-cache-manager: windows are computed but their blocks kept
        if any(isinstance(x, MambaLayer) for x in layers):
            raise ValueError("Mamba / linear-attention layers need the hybrid KV-cache manager")
        layers = [replace(x, kind="full_attention", sliding_window=None)
                  if isinstance(x, AttentionLayer) and x.kind == "sliding_window" else x
                  for x in layers]
    mamba_layers = [x for x in layers if isinstance(x, MambaLayer)]
    attention = [x for x in layers if isinstance(x, AttentionLayer)]
    align = enable_prefix_caching and bool(mamba_layers)
    mamba_bytes = {id(x): _mamba_state_bytes(x, tp, model_dtype) for x in mamba_layers}
    mamba_block = max_model_len
    if mamba_layers and attention:
        block_size = _hybrid_block_size(attention[0], max(mamba_bytes.values()), tp,
                                        kv_dtype_bytes, block_size, align, mamba_layers, rules)
    if align:
        mamba_block = block_size
    padded = None
    if mamba_layers and attention:
        padded = block_size * _attention_bytes_per_token(attention[0], tp, kv_dtype_bytes)
    specs: list[LayerKVSpec | None] = []
    for layer in layers:
        if layer is None:
            specs.append(None)
        elif isinstance(layer, MambaLayer):
            state = mamba_bytes[id(layer)]
            checkpoint = layer.variant == "mamba2" or (
                align and rules.linear_attention_checkpoint_alignment is not None)
            specs.append(LayerKVSpec("mamba", mamba_block, state,
                                     page_size_padded=padded if padded != state else None,
                                     mamba_cache_mode="align" if align else "none",
                                     num_prefill_checkpoint_blocks=int(checkpoint)))
        else:
            per_token = _attention_bytes_per_token(layer, tp, kv_dtype_bytes)
            specs.append(LayerKVSpec(layer.kind, block_size, per_token * block_size,
                                     sliding_window=layer.sliding_window,
                                     attention_bytes_per_token=per_token))
    return specs, block_size


def mamba_checkpoint_alignment(spec: LayerKVSpec, layer: MambaLayer,
                               rules: BackendRules = HOPPER) -> int | None:
    """The scheduler's prefill-checkpoint alignment of a Mamba group (None: none): Mamba2
    exports at any token (1); Gated DeltaNet on the Mamba block grid."""
    if spec.mamba_cache_mode != "align" or not spec.num_prefill_checkpoint_blocks:
        return None
    return 1 if layer.variant == "mamba2" else spec.block_size


def _attention_bytes_per_token(layer: AttentionLayer, tp: int, kv_dtype_bytes: int) -> int:
    heads = 1 if layer.kind == "mla" else kv_heads_on_rank(layer.num_kv_heads, tp)
    return heads * (layer.head_size + layer.head_size_v) * kv_dtype_bytes


def _mamba_state_bytes(layer: MambaLayer, tp: int, model_dtype: str) -> int:
    conv, ssm = layer.state_shapes(tp)
    ssm_dtype = model_dtype if layer.ssm_dtype == "auto" else layer.ssm_dtype
    return math.prod(conv) * dtype_bytes(model_dtype) + math.prod(ssm) * dtype_bytes(ssm_dtype)


def _hybrid_block_size(attention: AttentionLayer, mamba_page: int, tp: int,
                       kv_dtype_bytes: int, block_size: int, align: bool,
                       mamba_layers: Sequence[MambaLayer], rules: BackendRules) -> int:
    """The smallest backend-aligned block whose attention page holds a Mamba state."""
    per_token = _attention_bytes_per_token(attention, tp, kv_dtype_bytes)
    kernel = rules.mla_block_size if attention.kind == "mla" else rules.kernel_block_size
    alignment = max(kernel, block_size)
    if attention.kind == "mla":
        alignment = max(alignment, 128)
    if align:
        checkpoint = rules.linear_attention_checkpoint_alignment \
            if all(m.variant == "gated_delta_net" for m in mamba_layers) else None
        alignment = math.lcm(alignment, checkpoint or 1)
    attn_block = alignment * cdiv(mamba_page, alignment * per_token)
    attn_block = kernel * cdiv(attn_block, kernel)
    return max(block_size, attn_block)


def _unify_page_sizes(specs: list[LayerKVSpec]) -> list[LayerKVSpec]:
    """vLLM's ``unify_kv_cache_spec_page_size``: scale or pad smaller pages to the largest."""
    largest = max(s.page_size_bytes for s in specs)
    out = []
    for s in specs:
        page = s.page_size_bytes
        if page == largest:
            out.append(s)
        elif s.kind == "mamba":
            out.append(replace(s, page_size_padded=largest))
        elif largest % page == 0:
            out.append(s.with_block_size(s.block_size * (largest // page)))
        elif s.kind != "mla":
            out.append(replace(s, page_size_padded=largest))
        else:
            raise ValueError(f"an MLA page of {page} B cannot be unified with a {largest} B page")
    return out


def kv_cache_groups(specs: Sequence[LayerKVSpec | None]) -> list[KVGroup]:
    """vLLM's ``get_kv_cache_groups`` (hybrid KV-cache manager on, layer-outermost layout)."""
    indexed = [(i, s) for i, s in enumerate(specs) if s is not None]
    if not indexed:
        return []
    layer_specs = [s for _, s in indexed]
    if len(set(layer_specs)) == 1 or len({s.type_key for s in layer_specs}) == 1:
        return [KVGroup(_group_kind(layer_specs[0]), tuple(i for i, _ in indexed),
                        tuple(layer_specs))]
    if len({s.page_size_bytes for s in layer_specs}) > 1:
        unified = _unify_page_sizes(layer_specs)
        indexed = [(i, s) for (i, _), s in zip(indexed, unified)]
    buckets: dict[LayerKVSpec, list[int]] = {}
    for i, s in indexed:
        buckets.setdefault(s, []).append(i)
    sizes = [len(v) for v in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < min(sizes) * 1.5:
        group_size = max(sizes)
    groups = []
    for spec, members in buckets.items():
        num_groups = cdiv(len(members), group_size)
        for k in range(num_groups):
            layer_ids = tuple(members[k::num_groups])
            groups.append(KVGroup(_group_kind(spec), layer_ids, (spec,) * len(layer_ids)))
    return groups


def group_label(group: KVGroup) -> str:
    """A group's short name: "full", "sliding:128", "mla", "mamba"."""
    spec = group.spec
    if spec.kind == "sliding_window":
        return f"sliding:{spec.sliding_window}"
    return {"full_attention": "full", "mla": "mla", "mamba": "mamba"}[spec.kind]


def _group_kind(spec: LayerKVSpec) -> str:
    return "full_attention" if spec.kind == "mla" else spec.kind


@dataclass(frozen=True)
class KVCachePlan:
    """vLLM's KV-cache configuration for a model on a rank (every byte figure per GPU)."""

    groups: tuple[KVGroup, ...]
    block_size: int                 # the attention groups' block size vLLM settles on
    bytes_per_block: int            # the largest group's page bytes
    available_kv_bytes: int
    num_gpu_blocks: int
    blocks_per_request: tuple[int, ...] = field(default=())   # per group, at max_model_len
    max_concurrency: float = 0.0
    kv_cache_tokens: int = 0        # "GPU KV cache size: N tokens"
    max_model_len: int = 0
    max_in_flight_tokens: int = 0

    def concurrency_for(self, num_tokens: int) -> float:
        """Requests of ``num_tokens`` tokens that fit at once (vLLM's maximum concurrency)."""
        return self.num_gpu_blocks / sum(g.blocks_per_request(num_tokens,
                                                              self.max_in_flight_tokens)
                                         for g in self.groups)

    @property
    def is_hybrid(self) -> bool:
        return len(self.groups) > 1

    def needed_bytes(self) -> int:
        """Memory one max_model_len request needs (vLLM's check, null block reserved)."""
        return self.bytes_per_block * sum(self.blocks_per_request)


def plan_kv_cache(specs: Sequence[LayerKVSpec | None], block_size: int, available_kv_bytes: int,
                  max_model_len: int, max_in_flight_tokens: int,
                  check_max_model_len: bool = True) -> KVCachePlan:
    """Groups, num_gpu_blocks and max concurrency, as vLLM's engine core computes them.

    Args:
        specs: per-layer specs on one rank (``layer_kv_specs``).
        available_kv_bytes: memory for the KV cache on one GPU.
        max_in_flight_tokens: scheduled tokens not yet settled: ``max_num_batched_tokens`` x
            batches in flight (2 with vLLM's default async scheduling).
        check_max_model_len: raise, as vLLM does at start-up, when one max_model_len request
            does not fit (the null block set aside).
    Raises:
        ValueError: no KV memory, or one max_model_len request does not fit (one line, with
            the largest max_model_len that would).
    """
    groups = kv_cache_groups(specs)
    if not groups:
        raise ValueError("the model has no layer with a KV cache or state")
    bytes_per_block = max(g.page_bytes for g in groups)

    def needed(model_len: int) -> int:
        return bytes_per_block * sum(g.blocks_per_request(model_len, max_in_flight_tokens)
                                     for g in groups)

    usable = available_kv_bytes - bytes_per_block      # the null block is never handed out
    if available_kv_bytes <= 0:
        raise ValueError("no memory left for the KV cache (available_kv_bytes <= 0)")
    if check_max_model_len and needed(max_model_len) > usable:
        lo, hi, best = 1, max_model_len, 0              # vLLM's estimate_max_model_len
        while lo <= hi:
            mid = (lo + hi) // 2
            if needed(mid) <= usable:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        raise ValueError(f"one request of max_model_len {max_model_len} needs "
                         f"{needed(max_model_len) / 2**30:.2f} GiB of KV cache, more than the "
                         f"{max(usable, 0) / 2**30:.2f} GiB available; the largest that fits "
                         f"is {best} tokens (lower max_model_len or raise "
                         f"gpu_memory_utilization)")
    num_blocks = available_kv_bytes // bytes_per_block
    per_request = tuple(g.blocks_per_request(max_model_len, max_in_flight_tokens)
                        for g in groups)
    concurrency = num_blocks / sum(per_request)
    return KVCachePlan(tuple(groups), block_size, bytes_per_block, available_kv_bytes,
                       num_blocks, per_request, concurrency, int(concurrency * max_model_len),
                       max_model_len, max_in_flight_tokens)
