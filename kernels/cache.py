"""reshape_and_cache: scatter new tokens' K/V into the paged pool through slot_mapping.

``slot_mapping[i] = block_table[seq, pos // block_size] * block_size + pos % block_size`` is where
token i's K/V goes (exactly what the allocator's ``slot_mapping(seq_id)`` produces); a negative slot
marks a padding token and is skipped, as in vLLM. One program writes TOKENS tokens x all heads.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvsim.kernels.attention import interpreting
from kvsim.kernels.layout import cache_geometry, cache_strides


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, num_tokens,
    stride_key_tok, stride_key_head, stride_value_tok, stride_value_head,
    k_stride_block, k_stride_token, k_stride_head, k_stride_dx, k_stride_x,
    v_stride_block, v_stride_token, v_stride_head, v_stride_dx, v_stride_x,
    NUM_KV_HEADS: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_HD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TOKENS: tl.constexpr, K_X: tl.constexpr, V_X: tl.constexpr,
):
    tok = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    tok_ok = tok < num_tokens
    slot = tl.load(slot_ptr + tok, mask=tok_ok, other=-1).to(tl.int64)
    write = tok_ok & (slot >= 0)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    hd = tl.arange(0, BLOCK_HD)
    head = hd // HEAD_SIZE
    d = hd % HEAD_SIZE
    hd_ok = hd < NUM_KV_HEADS * HEAD_SIZE
    mask = write[:, None] & hd_ok[None, :]
    src = tok.to(tl.int64)[:, None]
    key = tl.load(key_ptr + src * stride_key_tok + (head * stride_key_head + d)[None, :], mask=mask)
    value = tl.load(value_ptr + src * stride_value_tok + (head * stride_value_head + d)[None, :], mask=mask)
    k_dst = (block * k_stride_block + offset * k_stride_token)[:, None] + \
        (head * k_stride_head + (d // K_X) * k_stride_dx + (d % K_X) * k_stride_x)[None, :]
    v_dst = (block * v_stride_block + offset * v_stride_token)[:, None] + \
        (head * v_stride_head + (d // V_X) * v_stride_dx + (d % V_X) * v_stride_x)[None, :]
    tl.store(k_cache_ptr + k_dst, key, mask=mask)
    tl.store(v_cache_ptr + v_dst, value, mask=mask)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor, layout: str = "flat",
                      *, validate: bool = True) -> None:
    """Write ``key``/``value`` of new tokens into the caches at ``slot_mapping`` (in place).

    Args:
        key, value: [num_tokens, num_kv_heads, head_size], the caches' dtype.
        key_cache, value_cache: the pool in ``layout``.
        slot_mapping: int32/int64 [num_tokens]; slot = block * block_size + offset; < 0 skips.
        layout: "flat" or "vllm".
        validate: check that every slot is inside the pool (a device sync).
    Raises:
        ValueError: on mismatched shapes, dtypes, devices, or a slot past the pool.
    """
    geom = cache_geometry(key_cache, value_cache, layout)
    expected = (slot_mapping.shape[0] if isinstance(slot_mapping, torch.Tensor) and slot_mapping.dim() == 1
                else None, geom.num_kv_heads, geom.head_size)
    for name, t in (("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != expected:
            raise ValueError(f"{name} must be [num_tokens, num_kv_heads={geom.num_kv_heads}, "
                             f"head_size={geom.head_size}] matching slot_mapping, got "
                             f"{tuple(getattr(t, 'shape', ()))}")
        if t.dtype != key_cache.dtype:
            raise ValueError(f"{name} is {t.dtype} but the cache is {key_cache.dtype}")
        if t.device != key_cache.device:
            raise ValueError(f"{name} is on {t.device} but the cache is on {key_cache.device}")
    if slot_mapping.dtype not in (torch.int32, torch.int64) or slot_mapping.device != key_cache.device:
        raise ValueError(f"slot_mapping must be an int32/int64 tensor on {key_cache.device}, got "
                         f"{slot_mapping.dtype} on {slot_mapping.device}")
    if key_cache.device.type == "cpu" and not interpreting():
        raise ValueError("CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 before "
                         "importing kernels")
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    num_slots = geom.num_blocks * geom.block_size
    if validate:
        top = int(slot_mapping.max())
        if top >= num_slots:
            i = int(torch.argmax(slot_mapping))
            raise ValueError(f"slot_mapping[{i}] = {top} is past the pool's {num_slots} slots")
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    ks, vs = cache_strides(key_cache, value_cache, layout)
    hd = geom.num_kv_heads * geom.head_size
    block_hd = triton.next_power_of_2(hd)
    # the interpreter pays per program: big tiles there; on GPU about 4096 elements per program
    if key.device.type == "cuda":
        tokens = max(2, 4096 // block_hd)
    else:
        tokens = max(16, min(256, triton.next_power_of_2(num_tokens)))
    _reshape_and_cache_kernel[(triton.cdiv(num_tokens, tokens),)](
        key, value, key_cache, value_cache, slot_mapping, num_tokens,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        ks.block, ks.token, ks.head, ks.dx, ks.x, vs.block, vs.token, vs.head, vs.dx, vs.x,
        NUM_KV_HEADS=geom.num_kv_heads, HEAD_SIZE=geom.head_size,
        BLOCK_HD=block_hd, BLOCK_SIZE=geom.block_size, TOKENS=tokens,
        K_X=ks.X, V_X=vs.X, num_warps=4 if key.device.type == "cuda" else 1)
