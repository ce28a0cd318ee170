"""KV-cache layouts and the strides the kernels address them with.

Two layouts, both holding ``num_blocks`` blocks of ``block_size`` token slots:

``flat`` (vLLM's Triton/FlashAttention backends; one 4-D tensor each for K and V)::

    K, V: [num_blocks, block_size, num_kv_heads, head_size]

``vllm`` (vLLM's CUDA PagedAttention kernels; x = 16 // element size, so every thread reads
16 contiguous bytes of one key, and V runs along tokens)::

    K: [num_blocks, num_kv_heads, head_size // x, block_size, x]
    V: [num_blocks, num_kv_heads, head_size, block_size]

Every layout reduces to one addressing rule, which is what lets one Triton kernel serve both::

    address(block, offset, head, d) = block * s_block + offset * s_token + head * s_head
                                      + (d // X) * s_dx + (d % X) * s_x

with ``X = x`` for the vLLM K cache and ``X = 1`` (so ``s_x`` is unused) otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

LAYOUTS = ("flat", "vllm")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def x_for(dtype: torch.dtype) -> int:
    """Elements per 16-byte vector of the vLLM K layout (8 for fp16/bf16, 4 for fp32)."""
    return 16 // torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class CacheGeometry:
    """Sizes read off a K/V cache pair (validated by :func:`cache_geometry`)."""
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_size: int


@dataclass(frozen=True)
class Strides:
    """Element strides of one cache in the layout-independent addressing rule above."""
    block: int
    token: int
    head: int
    dx: int
    x: int
    X: int  # constexpr for the kernel: elements per x-vector (1 when d is not split)


def cache_shapes(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                 dtype: torch.dtype, layout: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of the K and V caches of ``layout``.

    Args:
        num_blocks, block_size, num_kv_heads, head_size: pool geometry.
        dtype: element type (decides x of the vLLM layout).
        layout: "flat" or "vllm".
    Returns:
        (key_cache_shape, value_cache_shape).
    """
    _check_layout(layout)
    if layout == "flat":
        shape = (num_blocks, block_size, num_kv_heads, head_size)
        return shape, shape
    x = x_for(dtype)
    if head_size % x:
        raise ValueError(f"vllm layout needs head_size divisible by x={x} for {dtype}, got {head_size}")
    return ((num_blocks, num_kv_heads, head_size // x, block_size, x),
            (num_blocks, num_kv_heads, head_size, block_size))


def allocate_kv_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                      dtype: torch.dtype, device, layout: str = "flat",
                      fill: float = float("nan")) -> tuple[torch.Tensor, torch.Tensor]:
    """A K/V cache pair of ``layout`` filled with ``fill`` (NaN by default: a slot that attention
    reads without a write poisons its output, so tests catch it).

    Returns:
        (key_cache, value_cache).
    """
    k_shape, v_shape = cache_shapes(num_blocks, block_size, num_kv_heads, head_size, dtype, layout)
    return (torch.full(k_shape, fill, dtype=dtype, device=device),
            torch.full(v_shape, fill, dtype=dtype, device=device))


def cache_geometry(key_cache: torch.Tensor, value_cache: torch.Tensor, layout: str) -> CacheGeometry:
    """Check that K and V caches match ``layout`` and each other; return their geometry."""
    _check_layout(layout)
    if key_cache.dtype != value_cache.dtype:
        raise ValueError(f"key_cache is {key_cache.dtype} but value_cache is {value_cache.dtype}")
    if key_cache.dtype not in DTYPES:
        raise ValueError(f"cache dtype must be one of float32/float16/bfloat16, got {key_cache.dtype}")
    if key_cache.device != value_cache.device:
        raise ValueError(f"key_cache is on {key_cache.device} but value_cache on {value_cache.device}")
    if layout == "flat":
        if key_cache.dim() != 4:
            raise ValueError("flat key_cache must be [num_blocks, block_size, num_kv_heads, head_size], "
                             f"got shape {tuple(key_cache.shape)}")
        geom = CacheGeometry(*key_cache.shape)
    else:
        x = x_for(key_cache.dtype)
        if key_cache.dim() != 5 or key_cache.shape[4] != x:
            raise ValueError("vllm key_cache must be [num_blocks, num_kv_heads, head_size/x, block_size, "
                             f"x={x}], got shape {tuple(key_cache.shape)}")
        nb, hkv, dx, bs, _ = key_cache.shape
        geom = CacheGeometry(nb, bs, hkv, dx * x)
    k_shape, v_shape = cache_shapes(geom.num_blocks, geom.block_size, geom.num_kv_heads,
                                    geom.head_size, key_cache.dtype, layout)
    if tuple(value_cache.shape) != v_shape:
        raise ValueError(f"value_cache shape {tuple(value_cache.shape)} does not match key_cache "
                         f"{tuple(key_cache.shape)} in the {layout} layout (expected {v_shape})")
    if min(geom.num_blocks, geom.block_size, geom.num_kv_heads, geom.head_size) < 1:
        raise ValueError(f"empty cache: {geom}")
    if geom.head_size > 256:
        raise ValueError(f"head_size must be at most 256, got {geom.head_size}")
    return geom


def cache_strides(key_cache: torch.Tensor, value_cache: torch.Tensor, layout: str) -> tuple[Strides, Strides]:
    """Strides of K and V in the addressing rule of this module's docstring."""
    if layout == "flat":
        sk, sv = key_cache.stride(), value_cache.stride()
        return (Strides(sk[0], sk[1], sk[2], sk[3], 0, 1), Strides(sv[0], sv[1], sv[2], sv[3], 0, 1))
    sk, sv = key_cache.stride(), value_cache.stride()
    return (Strides(sk[0], sk[3], sk[1], sk[2], sk[4], key_cache.shape[4]),
            Strides(sv[0], sv[3], sv[1], sv[2], 0, 1))


def to_flat(key_cache: torch.Tensor, value_cache: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Both caches as [num_blocks, block_size, num_kv_heads, head_size] (views for flat, copies for vllm)."""
    if layout == "flat":
        return key_cache, value_cache
    nb, hkv, dx, bs, x = key_cache.shape
    k = key_cache.permute(0, 3, 1, 2, 4).reshape(nb, bs, hkv, dx * x)
    v = value_cache.permute(0, 3, 1, 2)
    return k, v


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
