"""Plain-torch float64 reference: dense (causal) attention on each sequence's contiguous K/V."""
from __future__ import annotations

import torch

from kvsim.kernels.layout import to_flat


def dense_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of one query token (the sequence's last) over contiguous K/V, in float64.

    Args:
        query: [num_heads, head_size].
        key, value: [seq_len, num_kv_heads, head_size]; query head h reads KV head
            h // (num_heads // num_kv_heads) (GQA).
        scale: softmax scale.
    Returns:
        [num_heads, head_size] float64.
    """
    return dense_causal_attention(query[None], key, value, scale)[0]


def dense_causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float,
                           sliding_window: int | None = None) -> torch.Tensor:
    """Causal attention of a sequence's last ``q_len`` tokens over its contiguous K/V, in float64.

    Args:
        query: [q_len, num_heads, head_size], the tokens at positions L - q_len .. L - 1.
        key, value: [L, num_kv_heads, head_size]; query head h reads KV head
            h // (num_heads // num_kv_heads) (GQA).
        scale: softmax scale.
        sliding_window: None, or position p attends to [p - sliding_window + 1, p] only.
    Returns:
        [q_len, num_heads, head_size] float64.
    """
    q = query.to(torch.float64)
    group = q.shape[1] // key.shape[1]
    k = key.to(torch.float64).repeat_interleave(group, dim=1)   # [L, H, D]
    v = value.to(torch.float64).repeat_interleave(group, dim=1)
    num_kv = k.shape[0]
    pos = torch.arange(num_kv - q.shape[0], num_kv)[:, None]
    t = torch.arange(num_kv)[None, :]
    ok = t <= pos
    if sliding_window is not None:
        ok &= t > pos - sliding_window
    logits = torch.einsum("qhd,lhd->hql", q, k) * scale
    logits = logits.masked_fill(~ok[None], float("-inf"))
    return torch.einsum("hql,lhd->qhd", torch.softmax(logits, dim=-1), v)


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
    """Float64 result that ``paged_attention`` must match (one new token per sequence).

    Returns:
        [num_seqs, num_heads, head_size] float64 on the CPU.
    """
    query_start_loc = torch.arange(query.shape[0] + 1)
    return reference_unified_attention(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
                                       scale, layout)


def reference_unified_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                block_tables: torch.Tensor, seq_lens: torch.Tensor,
                                query_start_loc: torch.Tensor, scale: float, layout: str = "flat",
                                sliding_window: int | None = None) -> torch.Tensor:
    """Float64 result that ``unified_attention`` must match: per sequence, gather its blocks into
    contiguous K/V and run :func:`dense_causal_attention` on its new tokens.

    Returns:
        [num_tokens, num_heads, head_size] float64 on the CPU.
    """
    qsl = query_start_loc.tolist()
    outs = []
    for i in range(len(qsl) - 1):
        k, v = gather_kv(key_cache, value_cache, block_tables[i], int(seq_lens[i]), layout)
        outs.append(dense_causal_attention(query[qsl[i]:qsl[i + 1]].cpu(), k.cpu(), v.cpu(), scale, sliding_window))
    return torch.cat(outs) if outs else torch.empty(0, *query.shape[1:], dtype=torch.float64)
