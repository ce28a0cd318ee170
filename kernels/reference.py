"""Plain-torch float64 reference: dense attention on each sequence's contiguous K/V."""
from __future__ import annotations

import torch

from kvsim.kernels.layout import to_flat


def dense_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of one query token over contiguous K/V, in float64.

    Args:
        query: [num_heads, head_size].
        key, value: [seq_len, num_kv_heads, head_size]; query head h reads KV head
            h // (num_heads // num_kv_heads) (GQA).
        scale: softmax scale.
    Returns:
        [num_heads, head_size] float64.
    """
    q = query.to(torch.float64)
    group = q.shape[0] // key.shape[1]
    k = key.to(torch.float64).repeat_interleave(group, dim=1)   # [L, H, D]
    v = value.to(torch.float64).repeat_interleave(group, dim=1)
    logits = torch.einsum("hd,lhd->hl", q, k) * scale
    return torch.einsum("hl,lhd->hd", torch.softmax(logits, dim=-1), v)


def gather_kv(key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
              seq_len: int, layout: str = "flat") -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's K/V, made contiguous by following its block table.

    Returns:
        (key, value), each [seq_len, num_kv_heads, head_size].
    """
    k_flat, v_flat = to_flat(key_cache, value_cache, layout)
    block_size = k_flat.shape[1]
    num_blocks = -(-seq_len // block_size)
    ids = block_table[:num_blocks].to(device=k_flat.device, dtype=torch.long)
    k = k_flat[ids].reshape(-1, *k_flat.shape[2:])[:seq_len]
    v = v_flat[ids].reshape(-1, *v_flat.shape[2:])[:seq_len]
    return k, v


def reference_paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                              block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                              layout: str = "flat") -> torch.Tensor:
    """Float64 result that ``paged_attention`` must match: per sequence, gather its blocks into
    contiguous K/V and run :func:`dense_attention`.

    Returns:
        [num_seqs, num_heads, head_size] float64 on the CPU.
    """
    outs = []
    for i in range(query.shape[0]):
        k, v = gather_kv(key_cache, value_cache, block_tables[i], int(seq_lens[i]), layout)
        outs.append(dense_attention(query[i].cpu(), k.cpu(), v.cpu(), scale))
    return torch.stack(outs) if outs else torch.empty(0, *query.shape[1:], dtype=torch.float64)
