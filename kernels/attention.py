"""Paged decode attention in Triton: v1 (one pass per sequence) and v2 (split-KV plus a merge).

One query token per sequence attends to the ``seq_len`` tokens of its KV, which live in blocks of
``block_size`` slots scattered over a pool; ``block_tables[seq, i]`` names the physical block that
holds tokens ``[i*block_size, (i+1)*block_size)``. Changing where KV lives must never change what
attention computes: paged attention on a shuffled block table is bitwise equal to the same kernel on
an identity table (the tile order and arithmetic are the same, only addresses differ).

Work decomposition (both versions)::

    program (seq, kv_head[, partition])
      Q rows  = the GROUP = num_heads // num_kv_heads query heads of kv_head, padded to BLOCK_H >= 16
                rows so tl.dot runs on tensor cores; each K/V tile is read once per group (GQA)
      loop over TILE tokens:  block = block_tables[seq, t // BLOCK_SIZE]   (per token: a tile may span
                              several small blocks or part of a large one)
                              S = Q K^T * scale; online softmax in fp32 (running max m, sum l, acc)
      v1: out = acc / l
      v2: store (acc, m, l) per partition; merge the partitions in partition order:
          M = max_p m_p;  out = sum_p acc_p 2^(m_p - M) / sum_p l_p 2^(m_p - M)

The v2 merge runs in one of two places:
- fused (one launch): after storing its partial result, each partition program takes a ticket from
  an int32 counter of its (seq, kv_head) (``tl.atomic_add``, acq_rel, GPU scope, after a barrier so
  that all of the program's stores are released with it). The program that draws the last ticket
  merges all partitions, reading them back from memory in partition order, so the result never
  depends on arrival order. It then writes the output and resets the counter to zero, so one
  counter buffer serves every call and CUDA-graph replay. Under TRITON_INTERPRET=1 programs run one
  after another, and the last one in launch order merges.
- separate (``_reduce_partitions_kernel``, a second launch of one program per query head): chosen
  when one program would merge more than FUSED_MERGE_MAX_ROWS partial rows (partitions x GROUP),
  where spreading the merge over the query heads measured faster.

Dispatch (``plan_launch``, ``plan_partitions``): v1 gives num_seqs * num_kv_heads programs. Under
one wave of the GPU's multiprocessors, the sequence is split into a power of two of partitions so
that the launch fills at most ``TARGET_WAVES`` waves. Small batch x long context is therefore carried
by split-KV (batch 1 at 128k tokens has 4-32 programs unsplit). Constants were tuned on an H200
(bench/kernels.py, docs/BENCHMARKS.md, "Kernels").

Tiles: full tiles run without token masks and one masked tile takes the tail (large flat v1
launches mask every tile: measured faster there). Tokens past seq_len are never loaded into the
result: masked loads, or for the vLLM V layout whole 16-byte runs zeroed after loading (free slots
may hold NaN).

Triton portability (same source on triton 3.6 and 3.9, compiled and under TRITON_INTERPRET=1):
plain pointer arithmetic (no block pointers), no autotune decorator (configs chosen in Python),
block ids widened to int64 before multiplying by strides, GQA rows padded to 16 for tl.dot on GPU,
input_precision="ieee" for fp32, and in the interpreter bf16 operands are upcast before tl.dot (its
bf16 dot reads raw bits).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvsim.kernels.layout import cache_geometry, cache_strides

LOG2E = 1.4426950408889634

# dispatch constants (see module docstring); tuned on an H200, 132 SMs
TARGET_WAVES = 4
FUSED_MERGE_MAX_ROWS = 64  # partitions x query heads per KV head that one program merges, at most
# launch order: the programs of one sequence's KV heads side by side (they read neighbouring bytes
# of the same blocks in the flat layout); measured no different from sequence-fastest on the H200
HEAD_FASTEST_GRID = True
MERGE_TILE_ELEMS = 4096  # fp32 partial-result elements one merge step loads on GPU (16 KB)


@dataclass(frozen=True)
class KernelConfig:
    """Launch configuration of the attention kernel (chosen in Python; no autotuner)."""
    tile_tokens: int
    num_warps: int = 4
    num_stages: int = 2
    unmasked_full_tiles: bool = True  # False: every tile masked (measured faster for large v1 launches)
    fused_reduce: bool = True  # split-KV: the last partition program merges (False: a second launch)

    def __post_init__(self):
        if self.tile_tokens < 16 or self.tile_tokens & (self.tile_tokens - 1):
            raise ValueError(f"tile_tokens must be a power of two >= 16, got {self.tile_tokens}")


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def default_config(head_size: int, device: torch.device) -> KernelConfig:
    """Base configuration: 64-token tiles, 4 warps, 2 stages on GPU (the H200 sweet spot at head size
    128; 32 tokens at head size 256 to bound registers). The interpreter pays per program-iteration,
    not per element, so it takes 256-token tiles. ``plan_launch`` adapts the tile to the launch."""
    if device.type != "cuda":
        return KernelConfig(tile_tokens=256, num_warps=1, num_stages=1)
    return KernelConfig(tile_tokens=64 if head_size <= 128 else 32)


def plan_launch(num_seqs: int, num_kv_heads: int, max_seq_len: int, head_size: int, layout: str,
                device: torch.device, partition_size: int | None = None,
                config: KernelConfig | None = None, num_queries_per_kv: int = 1) -> tuple[int | None, KernelConfig]:
    """Choose v1 or v2 and the kernel configuration (the whole dispatch rule in one place).

    On GPU, with no explicit config: the base tile (``default_config``) for v2 and for large v1
    launches; twice that for a v1 launch of at most two waves (fewer, longer programs need more bytes
    in flight each: 68 vs 80 us at 256 programs x 2k tokens on the H200) and for the vLLM layout
    (its 16-byte runs along tokens want long tiles: 2.6x faster than 64-token tiles there). Full
    tiles run without token masks (7-10% faster on split and small launches, 15% on the vLLM
    layout), except for large flat v1 launches, where masking every tile measured faster.
    Split-KV merges its partitions inside the attention kernel (fused) when one program merges at
    most FUSED_MERGE_MAX_ROWS partial rows (partitions x query heads per KV head); above that a
    separate reduce launch, one program per query head, spreads the merge and measured faster.

    Args:
        num_seqs, num_kv_heads, max_seq_len, head_size, layout: the problem.
        device: where it runs.
        partition_size: None = ``plan_partitions`` (GPU) or v1 (interpreter); else forced v2.
        config: an explicit configuration (kept as given; partitions are planned with its tile).
        num_queries_per_kv: query heads per KV head (GQA group), for the choice of merge.
    Returns:
        (partition_size or None for v1, KernelConfig).
    """
    base = config or default_config(head_size, device)
    if partition_size is None and device.type == "cuda":
        partition_size = plan_partitions(num_seqs, num_kv_heads, max_seq_len, base.tile_tokens, num_sms(device))
    if partition_size is not None and partition_size >= max_seq_len:
        partition_size = None  # one partition: v1 computes the same thing without the reduce
    if config is not None or device.type != "cuda":
        return partition_size, base
    fused = (partition_size is None
             or math.ceil(max_seq_len / partition_size) * num_queries_per_kv <= FUSED_MERGE_MAX_ROWS)
    few_programs = partition_size is None and num_seqs * num_kv_heads <= 2 * num_sms(device)
    if layout == "vllm" or few_programs:
        return partition_size, KernelConfig(2 * base.tile_tokens, base.num_warps, base.num_stages,
                                            fused_reduce=fused)
    # a v1 launch of more than two waves, flat layout: masking every tile measured up to 25% faster
    # there (H200, 512 programs, block 128) while unmasked full tiles win everywhere else
    return partition_size, KernelConfig(base.tile_tokens, base.num_warps, base.num_stages,
                                        unmasked_full_tiles=partition_size is not None, fused_reduce=fused)


def merge_tile_elems(device: torch.device) -> int:
    """Elements of partial results the merge loads per step (partitions x group heads x head size):
    16 KB of fp32 on GPU; the interpreter pays per step, not per element, so it takes everything."""
    return MERGE_TILE_ELEMS if device.type == "cuda" else 1 << 20


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def attention_workspace(num_seqs: int, num_kv_heads: int, device: torch.device | str) -> torch.Tensor:
    """Arrival counters for the fused split-KV merge (int32 zeros), to pass as ``workspace=``.

    Args:
        num_seqs, num_kv_heads: the largest batch the workspace serves (one counter per pair).
        device: where the kernel runs.
    Returns:
        int32 zeros [num_seqs * num_kv_heads]; paged_attention leaves them at zero.
    """
    return torch.zeros(num_seqs * num_kv_heads, dtype=torch.int32, device=device)


def _counters(workspace: torch.Tensor | None, num_counters: int, device: torch.device) -> torch.Tensor:
    if workspace is not None:
        if workspace.dtype != torch.int32 or workspace.device != device or workspace.numel() < num_counters:
            raise ValueError(f"workspace must be int32 on {device} with at least {num_counters} elements "
                             f"(num_seqs * num_kv_heads), got {workspace.dtype} on {workspace.device} with "
                             f"{workspace.numel()}")
        return workspace
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < num_counters:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # a buffer allocated during capture would belong to the graph's memory pool
            raise ValueError(f"the fused split-KV merge needs {num_counters} counters: call once before "
                             "capturing a CUDA graph, or pass workspace=attention_workspace(...)")
        buf = torch.zeros(max(num_counters, 1 << 16), dtype=torch.int32, device=device)
        _COUNTERS[device] = buf
    return buf


def num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (1 elsewhere: the interpreter runs programs one by one)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def plan_partitions(num_seqs: int, num_kv_heads: int, max_seq_len: int, tile_tokens: int,
                    num_sms_: int) -> int | None:
    """The dispatch rule between v1 and v2 (measured on an H200, docs/BENCHMARKS.md, "Kernels").

    v1 launches num_seqs * num_kv_heads programs. Below one wave of the multiprocessors the GPU
    cannot keep enough loads in flight, so the sequence is split into the largest power of two of
    partitions that keeps the launch within TARGET_WAVES waves (powers of two measured better than
    exact fills), with at least one tile per partition. A launch that already fills a wave runs
    v1: splitting it measured no faster at any context (2 partitions of a 256-program launch ran
    up to 25% slower).

    Args:
        num_seqs, num_kv_heads: v1 launches one program per (sequence, KV head).
        max_seq_len: longest context in the batch (tokens).
        tile_tokens: the kernel's tile; partitions are a multiple of it.
        num_sms_: multiprocessors of the device.
    Returns:
        None for v1, else the partition size in tokens for v2.
    """
    num_programs = num_seqs * num_kv_heads
    if num_programs >= num_sms_:
        return None
    fill = TARGET_WAVES * num_sms_ // num_programs
    num_parts = min(1 << (fill.bit_length() - 1), max_seq_len // tile_tokens)
    if num_parts < 2:
        return None
    return tile_tokens * math.ceil(max_seq_len / num_parts / tile_tokens)


@triton.jit
def _attend_tile(q, m_i, l_i, acc, t0, end, bt_row, k_base, v_base, k_d, v_d, d_ok, qk_scale,
                 k_stride_block, k_stride_token, v_stride_block, v_stride_token,
                 HEAD_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
                 V_TOKENS_CONTIGUOUS: tl.constexpr, RUN: tl.constexpr, UPCAST_DOT: tl.constexpr,
                 IEEE: tl.constexpr, MASKED: tl.constexpr):
    """One tile of TILE tokens from t0: gather K/V through the block table, online-softmax update.
    MASKED: the tile may run past ``end`` (tokens there are never read into the result)."""
    t = t0 + tl.arange(0, TILE)
    t_ok = t < end
    if MASKED:
        # past the end the block-table entry may be unused: read block 0 instead (always in the pool)
        block = tl.load(bt_row + t // BLOCK_SIZE, mask=t_ok, other=0).to(tl.int64)
    else:
        block = tl.load(bt_row + t // BLOCK_SIZE).to(tl.int64)
    slot = t % BLOCK_SIZE
    if MASKED:
        kv_mask = t_ok[:, None] & d_ok[None, :]
    else:
        kv_mask = d_ok[None, :]
    k_ptrs = k_base + (block * k_stride_block + slot * k_stride_token)[:, None] + k_d[None, :]
    v_tok = block * v_stride_block + slot * v_stride_token
    if V_TOKENS_CONTIGUOUS:
        # vLLM V layout [.., head_size, block_size]: tokens of one block are adjacent and a tile
        # starts at a multiple of min(TILE, BLOCK_SIZE), so 16-byte loads run along tokens
        v_tok = tl.max_contiguous(tl.multiple_of(v_tok, RUN), RUN)
    v_ptrs = v_base + v_tok[:, None] + v_d[None, :]
    if HEAD_SIZE == BLOCK_D and not MASKED:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    elif V_TOKENS_CONTIGUOUS and MASKED:
        # a mask varying along tokens would stop 16-byte loads: load the whole runs (every address is
        # inside the pool) and zero the tokens past the end, which may hold NaN (free slots)
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        v = tl.where(t_ok[:, None], v, 0.0)
    else:
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    if UPCAST_DOT:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    if MASKED:
        s = tl.where(t_ok[None, :], s * qk_scale, float("-inf"))
    else:
        s = s * qk_scale
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def _paged_attention_kernel(
    out_ptr, tmp_ptr, m_ptr, l_ptr, counters_ptr,
    q_ptr, k_ptr, v_ptr, block_tables_ptr, seq_lens_ptr,
    qk_scale, partition_size,
    stride_q_seq, stride_q_head,
    stride_o_seq, stride_o_head,
    stride_t_seq, stride_t_head, stride_t_part,
    stride_ml_seq, stride_ml_head,
    stride_c_seq,
    stride_bt_seq,
    k_stride_block, k_stride_token, k_stride_head, k_stride_dx, k_stride_x,
    v_stride_block, v_stride_token, v_stride_head, v_stride_dx, v_stride_x,
    GROUP: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, K_X: tl.constexpr, V_X: tl.constexpr,
    V_TOKENS_CONTIGUOUS: tl.constexpr, RUN: tl.constexpr, SPLIT: tl.constexpr, UPCAST_DOT: tl.constexpr,
    IEEE: tl.constexpr, HEAD_FASTEST: tl.constexpr, UNMASKED_FULL_TILES: tl.constexpr,
    FUSED: tl.constexpr, GROUP_P2: tl.constexpr, PARTS_PER_STEP: tl.constexpr,
):
    if HEAD_FASTEST:
        kv_head = tl.program_id(0)
        seq = tl.program_id(1)
    else:
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    if SPLIT:
        start = part * partition_size
        end = tl.minimum(start + partition_size, seq_len)
    else:
        start = 0
        end = seq_len

    rows = tl.arange(0, BLOCK_H)
    row_ok = rows < GROUP
    heads = kv_head * GROUP + rows
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_SIZE
    q = tl.load(q_ptr + seq.to(tl.int64) * stride_q_seq + heads[:, None] * stride_q_head + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)
    # address pieces that do not depend on the token
    k_d = (d // K_X) * k_stride_dx + (d % K_X) * k_stride_x
    if K_X > 1:
        # vLLM K layout: runs of x elements (16 bytes) are contiguous; tell the compiler so that
        # it issues 16-byte loads
        k_d = tl.max_contiguous(tl.multiple_of(k_d, K_X), K_X)
    v_d = (d // V_X) * v_stride_dx + (d % V_X) * v_stride_x
    k_base = k_ptr + kv_head.to(tl.int64) * k_stride_head
    v_base = v_ptr + kv_head.to(tl.int64) * v_stride_head
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    # full tiles carry no token masks (vectorised, pipelined loads); one masked tile takes the tail
    end = tl.maximum(end, start)  # a v2 partition past the sequence's end has no tokens
    if UNMASKED_FULL_TILES:
        num_full = (end - start) // TILE
        for i in range(0, num_full):
            m_i, l_i, acc = _attend_tile(
                q, m_i, l_i, acc, start + i * TILE, end, bt_row, k_base, v_base, k_d, v_d, d_ok, qk_scale,
                k_stride_block, k_stride_token, v_stride_block, v_stride_token,
                HEAD_SIZE, BLOCK_D, BLOCK_SIZE, TILE, V_TOKENS_CONTIGUOUS, RUN, UPCAST_DOT, IEEE, False)
        tail = start + num_full * TILE
        if tail < end:
            m_i, l_i, acc = _attend_tile(
                q, m_i, l_i, acc, tail, end, bt_row, k_base, v_base, k_d, v_d, d_ok, qk_scale,
                k_stride_block, k_stride_token, v_stride_block, v_stride_token,
                HEAD_SIZE, BLOCK_D, BLOCK_SIZE, TILE, V_TOKENS_CONTIGUOUS, RUN, UPCAST_DOT, IEEE, True)
    else:
        for t0 in range(start, end, TILE):
            m_i, l_i, acc = _attend_tile(
                q, m_i, l_i, acc, t0, end, bt_row, k_base, v_base, k_d, v_d, d_ok, qk_scale,
                k_stride_block, k_stride_token, v_stride_block, v_stride_token,
                HEAD_SIZE, BLOCK_D, BLOCK_SIZE, TILE, V_TOKENS_CONTIGUOUS, RUN, UPCAST_DOT, IEEE, True)

    out_mask = row_ok[:, None] & d_ok[None, :]
    if SPLIT:
        num_parts = tl.cdiv(seq_len, partition_size)
        if part < num_parts:  # a partition past this sequence's end has no tokens: nothing to merge
            # unnormalised partial result (acc, m, l), merged in partition order (below, or by
            # _reduce_partitions_kernel)
            t_offs = seq.to(tl.int64) * stride_t_seq + heads[:, None] * stride_t_head + d[None, :]
            tl.store(tmp_ptr + t_offs + part * stride_t_part, acc, mask=out_mask)
            ml_offs = seq.to(tl.int64) * stride_ml_seq + heads * stride_ml_head + part
            tl.store(m_ptr + ml_offs, m_i, mask=row_ok)
            tl.store(l_ptr + ml_offs, l_i, mask=row_ok)
            if FUSED:
                # the last partition program of (seq, kv_head) to arrive merges them all, in
                # partition order. The barrier orders every thread's stores above before the release
                # of the ticket (taken by one thread); the ticket's acquire makes the other
                # programs' partials visible to this one.
                tl.debug_barrier()
                counter = counters_ptr + seq * stride_c_seq + kv_head
                ticket = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
                if ticket == num_parts - 1:
                    _, big_l, big_acc = _merge_partitions(
                        tmp_ptr, m_ptr, l_ptr, seq, kv_head, num_parts, stride_t_seq, stride_t_head,
                        stride_t_part, stride_ml_seq, stride_ml_head, GROUP, GROUP_P2, HEAD_SIZE, BLOCK_D,
                        PARTS_PER_STEP, ".cg")
                    # every program of (seq, kv_head) has taken its ticket: reset for the next call
                    tl.store(counter, 0)
                    _store_output(out_ptr, seq, kv_head, big_l, big_acc, stride_o_seq, stride_o_head,
                                  GROUP, GROUP_P2, HEAD_SIZE, BLOCK_D)
    else:
        out_offs = seq.to(tl.int64) * stride_o_seq + heads[:, None] * stride_o_head + d[None, :]
        out = acc / l_i[:, None]
        tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _merge_partitions(tmp_ptr, m_ptr, l_ptr, seq, kv_head, num_parts,
                      stride_t_seq, stride_t_head, stride_t_part, stride_ml_seq, stride_ml_head,
                      GROUP: tl.constexpr, GROUP_P2: tl.constexpr, HEAD_SIZE: tl.constexpr,
                      BLOCK_D: tl.constexpr, PARTS_PER_STEP: tl.constexpr, CACHE: tl.constexpr):
    """Merge the partial results (acc, m, l) of partitions 0 .. num_parts - 1 of the GROUP query
    heads of (seq, kv_head), in partition order, so that the result never depends on which program
    finished last:  M = max_p m_p;  L = sum_p l_p 2^(m_p - M);  A = sum_p acc_p 2^(m_p - M).
    CACHE: load cache modifier (".cg": read from L2, where other programs wrote the partials).
    Returns (M, L, A), [GROUP_P2] and [GROUP_P2, BLOCK_D] (padding rows: M = 0, L = 0, A = 0)."""
    g = tl.arange(0, GROUP_P2)
    g_ok = g < GROUP
    heads = kv_head * GROUP + g
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_SIZE
    pp = tl.arange(0, PARTS_PER_STEP)
    ml_base = seq.to(tl.int64) * stride_ml_seq + heads * stride_ml_head
    t_base = seq.to(tl.int64) * stride_t_seq + heads * stride_t_head
    big_m = tl.full([GROUP_P2], float("-inf"), dtype=tl.float32)
    big_l = tl.zeros([GROUP_P2], dtype=tl.float32)
    acc = tl.zeros([GROUP_P2, BLOCK_D], dtype=tl.float32)
    for p0 in range(0, num_parts, PARTS_PER_STEP):
        p = p0 + pp
        ok = g_ok[:, None] & (p < num_parts)[None, :]
        m_p = tl.load(m_ptr + ml_base[:, None] + p[None, :], mask=ok, other=float("-inf"), cache_modifier=CACHE)
        l_p = tl.load(l_ptr + ml_base[:, None] + p[None, :], mask=ok, other=0.0, cache_modifier=CACHE)
        a_p = tl.load(tmp_ptr + t_base[:, None, None] + p[None, :, None] * stride_t_part + d[None, None, :],
                      mask=ok[:, :, None] & d_ok[None, None, :], other=0.0, cache_modifier=CACHE)
        # finite for the group's heads (partition 0 always holds a token); padding rows stay at 0
        m_new = tl.where(g_ok, tl.maximum(big_m, tl.max(m_p, 1)), 0.0)
        rescale_old = tl.math.exp2(big_m - m_new)
        w_p = tl.math.exp2(m_p - m_new[:, None])
        big_l = big_l * rescale_old + tl.sum(l_p * w_p, 1)
        acc = acc * rescale_old[:, None] + tl.sum(a_p * w_p[:, :, None], 1)
        big_m = m_new
    return big_m, big_l, acc


@triton.jit
def _store_output(out_ptr, seq, kv_head, l, acc, stride_o_seq, stride_o_head,
                  GROUP: tl.constexpr, GROUP_P2: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_D: tl.constexpr):
    """out = acc / l for the GROUP heads of (seq, kv_head)."""
    g = tl.arange(0, GROUP_P2)
    g_ok = g < GROUP
    heads = kv_head * GROUP + g
    d = tl.arange(0, BLOCK_D)
    out = acc / tl.where(g_ok, l, 1.0)[:, None]
    tl.store(out_ptr + seq.to(tl.int64) * stride_o_seq + heads[:, None] * stride_o_head + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & (d < HEAD_SIZE)[None, :])


@triton.jit
def _reduce_partitions_kernel(
    out_ptr, tmp_ptr, m_ptr, l_ptr, seq_lens_ptr, partition_size,
    stride_o_seq, stride_o_head,
    stride_t_seq, stride_t_head, stride_t_part,
    stride_ml_seq, stride_ml_head,
    HEAD_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, PARTS_PER_STEP: tl.constexpr,
):
    """The unfused merge: one program per (seq, query head), launched after the attention kernel."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    num_parts = tl.cdiv(tl.load(seq_lens_ptr + seq).to(tl.int32), partition_size)
    # one query head = a "group" of one head whose "kv_head" is the head itself
    _, l, acc = _merge_partitions(tmp_ptr, m_ptr, l_ptr, seq, head, num_parts,
                                  stride_t_seq, stride_t_head, stride_t_part, stride_ml_seq, stride_ml_head,
                                  1, 2, HEAD_SIZE, BLOCK_D, PARTS_PER_STEP, "")
    _store_output(out_ptr, seq, head, l, acc, stride_o_seq, stride_o_head, 1, 2, HEAD_SIZE, BLOCK_D)


def _check_inputs(query, key_cache, value_cache, block_tables, seq_lens, layout, validate):
    geom = cache_geometry(key_cache, value_cache, layout)
    if not isinstance(query, torch.Tensor) or query.dim() != 3:
        raise ValueError("query must be a tensor [num_seqs, num_heads, head_size], got "
                         f"{getattr(query, 'shape', type(query).__name__)}")
    num_seqs, num_heads, head_size = query.shape
    if query.dtype != key_cache.dtype:
        raise ValueError(f"query is {query.dtype} but the KV cache is {key_cache.dtype}")
    if head_size != geom.head_size:
        raise ValueError(f"query head_size {head_size} != cache head_size {geom.head_size}")
    if num_heads % geom.num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {geom.num_kv_heads}")
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be an int32/int64 tensor, got "
                             f"{getattr(t, 'dtype', type(t).__name__)}")
    for name, t in (("key_cache", key_cache), ("block_tables", block_tables), ("seq_lens", seq_lens)):
        if t.device != query.device:
            raise ValueError(f"{name} is on {t.device} but query is on {query.device}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be [num_seqs={num_seqs}, max_num_blocks_per_seq], "
                         f"got {tuple(block_tables.shape)}")
    if seq_lens.shape != (num_seqs,):
        raise ValueError(f"seq_lens must be [num_seqs={num_seqs}], got {tuple(seq_lens.shape)}")
    if query.device.type == "cpu" and not interpreting():
        raise ValueError("CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 before "
                         "importing kernels")
    if num_seqs == 0:
        return geom, 0
    if not validate:
        return geom, None
    lens = seq_lens.to("cpu", torch.int64)
    if int(lens.min()) < 1:
        seq = int(torch.argmin(lens))
        raise ValueError(f"seq_lens[{seq}] = {int(lens[seq])}: every sequence needs at least 1 token")
    max_seq_len = int(lens.max())
    if max_seq_len > block_tables.shape[1] * geom.block_size:
        seq = int(torch.argmax(lens))
        raise ValueError(f"seq_lens[{seq}] = {max_seq_len} tokens needs more than the "
                         f"{block_tables.shape[1]} blocks of {geom.block_size} a block_tables row holds")
    tables = block_tables.to("cpu", torch.int64)
    used = torch.arange(tables.shape[1])[None, :] < (lens[:, None] + geom.block_size - 1) // geom.block_size
    bad = used & ((tables < 0) | (tables >= geom.num_blocks))
    if bool(bad.any()):
        seq, col = (int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(f"block_tables[{seq}, {col}] = {int(tables[seq, col])} is outside the pool of "
                         f"{geom.num_blocks} blocks")
    return geom, max_seq_len


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                    layout: str = "flat", partition_size: int | None = None, *,
                    max_seq_len: int | None = None, validate: bool = True,
                    config: KernelConfig | None = None,
                    workspace: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention of one query token per sequence over its paged KV.

    Args:
        query: [num_seqs, num_heads, head_size], same dtype as the caches (fp32/fp16/bf16).
        key_cache, value_cache: the pool in ``layout`` (see kernels.layout).
        block_tables: int32/int64 [num_seqs, max_num_blocks_per_seq]; entries past a sequence's
            last block are never read.
        seq_lens: int32/int64 [num_seqs], each >= 1.
        scale: softmax scale (usually head_size ** -0.5).
        layout: "flat" or "vllm".
        partition_size: None = dispatch rule (``plan_partitions``; v1 on CPU); an int forces v2
            with partitions of that many tokens (a multiple of 16), v1 when one partition covers
            every sequence.
        max_seq_len: longest seq_len, if the caller knows it (saves a device sync).
        validate: check seq_lens and the block table range on the host (a device sync; benchmarks
            validate once, then pass False).
        config: kernel launch configuration; None = ``plan_launch``'s choice.
        workspace: split-KV only: the int32 zeros that count arriving partitions for the fused
            merge (``attention_workspace``); the kernel leaves them at zero, so one workspace
            serves every call, CUDA-graph replays included. None = a per-device buffer kept by
            this module (calls running concurrently on several streams of one device must then
            each pass their own).
    Returns:
        [num_seqs, num_heads, head_size] in query's dtype.
    Raises:
        ValueError: on shapes, dtypes, devices, layouts or block ids that do not fit.
    """
    geom, checked_max = _check_inputs(query, key_cache, value_cache, block_tables, seq_lens, layout,
                                      validate)
    num_seqs, num_heads, head_size = query.shape
    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    if max_seq_len is None:
        max_seq_len = checked_max if checked_max is not None else int(seq_lens.max())
    if partition_size is not None and (partition_size < 16 or partition_size % 16):
        raise ValueError(f"partition_size must be a positive multiple of 16, got {partition_size}")
    partition_size, config = plan_launch(num_seqs, geom.num_kv_heads, max_seq_len, head_size, layout,
                                         query.device, partition_size, config, num_heads // geom.num_kv_heads)
    tile = config.tile_tokens
    if partition_size is not None:
        # the tile must divide the partition so that no tile straddles two partitions
        tile = min(tile, partition_size & -partition_size)

    query = query if query.stride(-1) == 1 else query.contiguous()
    group = num_heads // geom.num_kv_heads
    ks, vs = cache_strides(key_cache, value_cache, layout)
    fp32 = query.dtype == torch.float32
    common = dict(
        GROUP=group, HEAD_SIZE=head_size, BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_D=max(16, triton.next_power_of_2(head_size)), BLOCK_SIZE=geom.block_size, TILE=tile,
        K_X=ks.X, V_X=vs.X, V_TOKENS_CONTIGUOUS=layout == "vllm" and vs.token == 1 and vs.block % 16 == 0,
        RUN=min(tile, geom.block_size), HEAD_FASTEST=HEAD_FASTEST_GRID,
        UNMASKED_FULL_TILES=config.unmasked_full_tiles,
        UPCAST_DOT=interpreting() and query.dtype == torch.bfloat16, IEEE=fp32,
        num_warps=config.num_warps, num_stages=config.num_stages)
    args_tail = (query, key_cache, value_cache, block_tables, seq_lens, scale * LOG2E,
                 partition_size or 0, query.stride(0), query.stride(1))
    kv_strides = (ks.block, ks.token, ks.head, ks.dx, ks.x, vs.block, vs.token, vs.head, vs.dx, vs.x)
    if partition_size is None:
        grid = (geom.num_kv_heads, num_seqs, 1) if HEAD_FASTEST_GRID else (num_seqs, geom.num_kv_heads, 1)
        _paged_attention_kernel[grid](
            out, out, out, out, out, *args_tail, out.stride(0), out.stride(1), 0, 0, 0, 0, 0, 0,
            block_tables.stride(0), *kv_strides, SPLIT=False, FUSED=False, GROUP_P2=1, PARTS_PER_STEP=1,
            **common)
        return out

    num_parts = triton.cdiv(max_seq_len, partition_size)
    tmp = torch.empty((num_seqs, num_heads, num_parts, head_size), dtype=torch.float32, device=query.device)
    m = torch.empty((num_seqs, num_heads, num_parts), dtype=torch.float32, device=query.device)
    l = torch.empty_like(m)
    block_d = common["BLOCK_D"]
    grid = ((geom.num_kv_heads, num_seqs, num_parts) if HEAD_FASTEST_GRID
            else (num_seqs, geom.num_kv_heads, num_parts))
    ml_strides = (tmp.stride(0), tmp.stride(1), tmp.stride(2), m.stride(0), m.stride(1))
    if config.fused_reduce:
        counters = _counters(workspace, num_seqs * geom.num_kv_heads, query.device)
        # at least 2 rows and 2 partitions per merge step: Triton tensors of one element are avoided
        group_p2 = max(2, triton.next_power_of_2(group))
        _paged_attention_kernel[grid](
            out, tmp, m, l, counters, *args_tail, out.stride(0), out.stride(1), *ml_strides,
            geom.num_kv_heads, block_tables.stride(0), *kv_strides, SPLIT=True, FUSED=True, GROUP_P2=group_p2,
            PARTS_PER_STEP=max(2, min(triton.next_power_of_2(num_parts),
                                      merge_tile_elems(query.device) // (group_p2 * block_d))),
            **common)
        return out
    _paged_attention_kernel[grid](
        out, tmp, m, l, out, *args_tail, out.stride(0), out.stride(1), *ml_strides, 0,
        block_tables.stride(0), *kv_strides, SPLIT=True, FUSED=False, GROUP_P2=1, PARTS_PER_STEP=1, **common)
    _reduce_partitions_kernel[(num_seqs, num_heads)](
        out, tmp, m, l, seq_lens, partition_size, out.stride(0), out.stride(1), *ml_strides,
        HEAD_SIZE=head_size, BLOCK_D=block_d, PARTS_PER_STEP=min(128, max(2, triton.next_power_of_2(num_parts))),
        num_warps=(8 if num_parts > 32 else 4) if query.device.type == "cuda" else 1)
    return out
