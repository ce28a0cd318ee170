"""Paged attention in Triton for the batches vLLM v1 runs: one kernel family for prefills, chunked
prefills over cached context and decodes, mixed in one launch (``unified_attention``).
``paged_attention`` (one new token per sequence) is its decode case: the same kernel, the same code.

A batch is ``num_seqs`` sequences. Sequence i brings ``q_len_i`` new tokens (rows
``query_start_loc[i] : query_start_loc[i+1]`` of the query) and has ``seq_lens[i]`` tokens of K/V in
the pool, the new ones included (``reshape_and_cache`` has run). New token j of sequence i sits at
position ``p = seq_lens[i] - q_len_i + j`` and attends to positions ``[0, p]``, or to
``[p - sliding_window + 1, p]``. K/V live in blocks of ``block_size`` slots scattered over the pool;
``block_tables[i, b]`` names the block that holds positions ``[b*block_size, (b+1)*block_size)``.
Paging must change where K/V live, never what attention computes: a shuffled block table gives the
same bits as an identity table (same tiles, same arithmetic, only the addresses differ).

Work decomposition::

    program (q-block, kv_head[, partition])
      q-block = BLOCK_Q consecutive new tokens of one sequence (1 for a decode-only launch)
      rows    = those tokens x the GROUP = num_heads // num_kv_heads query heads of kv_head, row r
                being token r // GROUP and head r % GROUP, padded to BLOCK_M >= 16 rows so that
                tl.dot runs on tensor cores; each K/V tile is read once for all of them (GQA)
      KV range [lo, hi): the union of the rows' windows, hi = the last row's position + 1
      loop over TILE tokens: block = block_tables[seq, t // BLOCK_SIZE] (per token: a tile may span
                several small blocks or part of a large one); S = Q K^T * scale; online softmax in
                fp32 (running max m, sum l, acc). Tiles that every row sees whole run without masks;
                only the tiles at the window's edge and on the causal diagonal are masked
      one partition: out = acc / l
      split-KV: store (acc, m, l) per partition; merge in partition order:
          M = max_p m_p;  out = sum_p acc_p 2^(m_p - M) / sum_p l_p 2^(m_p - M)

Programs find their sequence without the host: q-block b of sequence i is program
``query_start_loc[i] // BLOCK_Q + i + b`` (a binary search over query_start_loc inverts it), so the
grid ``num_tokens // BLOCK_Q + num_seqs`` bounds every batch and programs past their sequence's
last q-block return at once. A decode-only launch (num_tokens == num_seqs: every q_len is 1) maps
program i to sequence i and never reads query_start_loc.

Split-KV merges in one of two places:
- fused (one launch): after storing its partial result, each partition program takes a ticket from
  an int32 counter of its (q-block, kv_head) (``tl.atomic_add``, acq_rel, GPU scope, after a barrier
  so that all of the program's stores are released with it). The program that draws the last ticket
  merges all partitions, reading them back in partition order, so the result never depends on
  arrival order. It then writes the output and resets the counter to zero, so one counter buffer
  serves every call and CUDA-graph replay. Under TRITON_INTERPRET=1 programs run one after another,
  and the last one in launch order merges.
- separate (``_reduce_partitions_kernel``, a second launch of one program per query token x head):
  chosen when one program would merge more than FUSED_MERGE_MAX_ROWS partial rows (partitions x
  rows), where spreading the merge over the query heads measured faster.

Dispatch (``plan_attention``): decode-only launches use 16+ rows and the decode rule tuned on an
H200 (``plan_partitions``: split-KV below one wave of multiprocessors, fused merge up to 64 rows);
launches with prefills use PREFILL_ROWS rows per program. In a mixed launch, q-blocks that hold few
rows (decodes) take a second, small-row path of the same code (``KernelConfig.small_rows``), so a
decode next to a prefill costs what it costs in a decode launch. Constants were measured on an H200
(bench/kernels.py, docs/BENCHMARKS.md, "Kernels").

Host cost per call (eager mode): launch plans and cache geometry are cached, the split-KV scratch
and counters are per-device buffers that grow and are reused (no allocation per call besides the
output, which ``out=`` also avoids), and with ``validate=False`` plus ``max_seq_len`` there is no
host-device sync.

Triton portability (same source on triton 3.6 and 3.9, compiled and under TRITON_INTERPRET=1):
plain pointer arithmetic (no block pointers), no autotune decorator (configs chosen in Python),
block ids widened to int64 before multiplying by strides, rows padded to 16 for tl.dot on GPU,
input_precision="ieee" for fp32, and in the interpreter bf16 operands are upcast before tl.dot (its
bf16 dot reads raw bits).
"""
from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvsim.kernels.launcher import CachedLauncher
from kvsim.kernels.layout import cache_geometry, cache_strides

LOG2E = 1.4426950408889634

# dispatch constants (see module docstring); tuned on an H200, 132 SMs
TARGET_WAVES = 4
FUSED_MERGE_MAX_ROWS = 64  # partitions x query rows that one program merges, at most
MERGE_TILE_ELEMS = 4096  # fp32 partial-result elements one merge step loads on GPU (16 KB)
PREFILL_ROWS = 128  # query rows (tokens x heads of a group) of a program in a launch with prefills
PREFILL_TILE = 64  # KV tokens per tile there
# 8 warps capped at 128 registers a thread: two programs per multiprocessor, as with 4 warps (which
# take 255 registers and spill 280 B), with almost no spills; on the H200 (2026-12-01,
# bench/results/kernels_h200_kern2.csv) 1.14x the throughput of 4 warps at the geometric mean of the
# 16 prefill points, faster on every one (8 uncapped warps: 177 registers, one program, slower)
PREFILL_WARPS = 8
PREFILL_STAGES = 3
PREFILL_MAX_REGISTERS = 128  # ptxas register cap of the prefill configuration (None: ptxas chooses)
# a launch with prefills that fills the GPU is not split as a whole, but its decodes are, in
# partitions of this many tokens: unsplit, a few long decodes next to a short chunk are a handful of
# programs that each stream their whole context alone and finish last (1 x 1024 + 8 x 16k: 2.99x
# two dense launches on the H200); split, their partitions run beside the prefill's programs
SMALL_PARTITION_TOKENS = 2048
SPLIT_SCRATCH_MAX_BYTES = 256 << 20  # the small-path split keeps its partials within this
INTERPRETER_ROWS = 128  # the interpreter pays per program-iteration: big blocks


@dataclass(frozen=True)
class KernelConfig:
    """Launch configuration of the attention kernel (chosen in Python; no autotuner).

    tile_tokens: KV tokens per loop step (a power of two >= 16).
    unmasked_full_tiles: False masks every tile (measured faster for large decode launches).
    fused_reduce: split-KV: the last partition program merges (False: a second launch).
    block_rows: query rows per program (tokens x query heads of one KV head); None = planned.
        A decode-only launch always has one token per program.
    small_rows: mixed launches: q-blocks of at most this many rows run a path of this many rows
        (0 = none; None = planned).
    longest_first: launches with prefills start with the last q-blocks (the longest causal rows and
        the decodes listed after the prefills), so that short programs fill the tail.
    small_unmasked_full_tiles: ``unmasked_full_tiles`` of the small-row path.
    small_partition_tokens: launches with prefills that are not split as a whole: split-KV of the
        small-row path alone (the decodes), in partitions of this many tokens (0 = never; None =
        planned: SMALL_PARTITION_TOKENS on GPU). The q-blocks of the large path are not split.
    max_registers: cap on registers per thread (ptxas .maxnreg; None: ptxas chooses), e.g. 128 to
        keep two 8-warp programs per multiprocessor.
    """
    tile_tokens: int
    num_warps: int = 4
    num_stages: int = 2
    unmasked_full_tiles: bool = True
    fused_reduce: bool = True
    block_rows: int | None = None
    small_rows: int | None = None
    longest_first: bool = True
    small_unmasked_full_tiles: bool = True
    small_partition_tokens: int | None = None
    max_registers: int | None = None

    def __post_init__(self):
        for name in ("tile_tokens", "block_rows", "small_rows"):
            value = getattr(self, name)
            if value is None or (name == "small_rows" and value == 0):
                continue
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {value}")


@dataclass(frozen=True)
class LaunchPlan:
    """Everything about a launch that depends only on the problem's sizes (cached per size)."""
    decode_only: bool
    block_q: int           # query tokens per program
    block_rows: int        # rows per program (>= block_q * group, a power of two >= 16)
    small_rows: int        # rows of the small path (0: none)
    tile: int
    partition_size: int | None  # None: no split
    num_parts: int
    num_qblocks: int       # grid size along q-blocks (an upper bound for launches with prefills)
    fused: bool
    merge_rows: int        # rows one fused merge loads (a power of two >= 2)
    small_merge_rows: int
    parts_per_step: int
    reduce_parts_per_step: int
    reduce_warps: int
    config: KernelConfig
    big_split: bool = True  # with a split: the large path's q-blocks are split too (else only the small path)


_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return _INTERPRET


def default_config(head_size: int, device: torch.device) -> KernelConfig:
    """Base decode configuration: 64-token tiles, 4 warps, 2 stages on GPU (the H200 sweet spot at
    head size 128; 32 tokens at head size 256 to bound registers). The interpreter pays per
    program-iteration, not per element, so it takes 256-token tiles. ``plan_attention`` adapts the
    tile to the launch."""
    if device.type != "cuda":
        return KernelConfig(tile_tokens=256, num_warps=1, num_stages=1)
    return KernelConfig(tile_tokens=64 if head_size <= 128 else 32)


def num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (1 elsewhere: the interpreter runs programs one by one)."""
    if device.type != "cuda":
        return 1
    return _num_sms_cuda(device.index if device.index is not None else torch.cuda.current_device())


_SMS: dict[int, int] = {}


def _num_sms_cuda(index: int) -> int:
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def plan_partitions(num_seqs: int, num_kv_heads: int, max_seq_len: int, tile_tokens: int,
                    num_sms_: int) -> int | None:
    """The split-KV rule (measured on an H200, docs/BENCHMARKS.md, "Kernels").

    Without a split a launch has num_seqs (q-blocks) x num_kv_heads programs. Below one wave of the
    multiprocessors the GPU cannot keep enough loads in flight, so the KV is split into the largest
    power of two of partitions that keeps the launch within TARGET_WAVES waves (powers of two
    measured better than exact fills), with at least one tile per partition. A launch that already
    fills a wave is not split: splitting it measured no faster at any context.

    Args:
        num_seqs, num_kv_heads: programs along q-blocks and KV heads.
        max_seq_len: the longest KV range a program reads (tokens).
        tile_tokens: the kernel's tile; partitions are a multiple of it.
        num_sms_: multiprocessors of the device.
    Returns:
        None for no split, else the partition size in tokens.
    """
    num_programs = num_seqs * num_kv_heads
    if num_programs >= num_sms_:
        return None
    fill = TARGET_WAVES * num_sms_ // num_programs
    num_parts = min(1 << (fill.bit_length() - 1), max_seq_len // tile_tokens)
    if num_parts < 2:
        return None
    return tile_tokens * math.ceil(max_seq_len / num_parts / tile_tokens)


def merge_tile_elems(device: torch.device) -> int:
    """Elements of partial results the merge loads per step (partitions x rows x head size): 16 KB
    of fp32 on GPU; the interpreter pays per step, not per element, so it takes everything."""
    return MERGE_TILE_ELEMS if device.type == "cuda" else 1 << 20


def _p2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _decode_config(num_programs: int, layout: str, split: bool, base: KernelConfig, device,
                   fused: bool) -> KernelConfig:
    """The decode tile rule: the base tile for split launches and large launches; twice that for a
    launch of at most two waves (fewer, longer programs need more bytes in flight each: 68 vs 80 us
    at 256 programs x 2k tokens on the H200) and for the vLLM layout (its 16-byte runs along tokens
    want long tiles: 2.6x faster than 64-token tiles there). Full tiles run without token masks
    (7-10% faster on split and small launches, 15% on the vLLM layout), except for large flat
    launches, where masking every tile measured faster (up to 25%, 512 programs, block 128)."""
    few_programs = not split and num_programs <= 2 * num_sms(device)
    if layout == "vllm" or few_programs:
        return KernelConfig(2 * base.tile_tokens, base.num_warps, base.num_stages, fused_reduce=fused)
    return KernelConfig(base.tile_tokens, base.num_warps, base.num_stages, unmasked_full_tiles=split,
                        fused_reduce=fused)


def plan_attention(num_tokens: int, num_seqs: int, num_heads: int, num_kv_heads: int, head_size: int,
                   max_seq_len: int, max_query_len: int, layout: str, device: torch.device,
                   partition_size: int | None = None, config: KernelConfig | None = None,
                   sliding_window: int | None = None) -> LaunchPlan:
    """The whole dispatch rule in one place: rows per program, tile, split-KV, merge.

    Decode-only launches (num_tokens == num_seqs) run one token per program, 16+ rows, with the
    decode tile rule (``_decode_config``) and split-KV below one wave (``plan_partitions``).
    Launches with prefills run PREFILL_ROWS rows (fewer when every q_len x group is smaller), with
    PREFILL_TILE-token tiles, PREFILL_WARPS warps and PREFILL_STAGES stages; their q-blocks of few
    rows (decodes) run a small-row path, with every tile masked in large flat launches as the
    decode rule does; they split only when few programs would read long KV (few query tokens over
    a long context). Split-KV merges in the attention kernel when partitions x rows <= 64
    (FUSED_MERGE_MAX_ROWS), else in a separate reduce launch.

    Args:
        num_tokens, num_seqs, num_heads, num_kv_heads, head_size: the problem.
        max_seq_len, max_query_len: the longest seq_len and q_len (upper bounds are fine).
        layout: "flat" or "vllm".
        device: where it runs.
        partition_size: None = the rule (GPU) or no split (interpreter); an int forces split-KV with
            partitions of that many tokens (no split when one partition covers every range).
        config: an explicit configuration (kept as given where it says something).
        sliding_window: None or the window in tokens (bounds the KV range a program reads).
    Returns:
        LaunchPlan.
    """
    on_gpu = device.type == "cuda"
    group = num_heads // num_kv_heads
    decode_only = num_tokens == num_seqs
    base = config or default_config(head_size, device)
    group_rows = max(16, _p2(group))
    if decode_only:
        block_rows, small_rows = group_rows, 0
    else:
        want = base.block_rows or (PREFILL_ROWS if on_gpu else INTERPRETER_ROWS)
        block_rows = max(group_rows, min(want, _p2(max_query_len * group)))
        small_rows = base.small_rows if base.small_rows is not None else group_rows
        if small_rows >= block_rows:
            small_rows = 0
    block_q = 1 if decode_only else max(1, block_rows // group)
    num_qblocks = num_seqs if decode_only else num_tokens // block_q + num_seqs
    # the longest KV range one program reads
    span = max_seq_len if sliding_window is None else min(max_seq_len, sliding_window + block_q - 1)
    tile0 = base.tile_tokens if (decode_only or config is not None or not on_gpu or block_rows <= 32) \
        else PREFILL_TILE
    if partition_size is None and on_gpu:
        partition_size = plan_partitions(num_qblocks, num_kv_heads, span, tile0, num_sms(device))
    if partition_size is not None and partition_size >= span:
        partition_size = None  # one partition: no split computes the same thing without the merge
    big_split = True
    if partition_size is None and small_rows:
        partition_size = _small_partition(base.small_partition_tokens, on_gpu, span, tile0,
                                          num_tokens * num_heads * (head_size + 2) * 4)
        big_split = partition_size is None
    if partition_size is not None:
        num_parts = math.ceil(span / partition_size) + (sliding_window is not None)  # tile alignment
        # rows one program merges: a q-block of the split path (a decode's query heads when only
        # the small path is split)
        fused = num_parts * (block_q if big_split else 1) * group <= FUSED_MERGE_MAX_ROWS
    else:
        num_parts, fused = 1, True
    if config is not None or not on_gpu:
        cfg = base  # as given; the interpreter always fuses the merge unless told otherwise
    elif decode_only or block_rows <= 32:
        cfg = _decode_config(num_qblocks * num_kv_heads, layout, partition_size is not None, base, device, fused)
    else:
        # the small-row path (decodes) follows the decode rule: a large flat launch masks every tile
        large = num_qblocks * num_kv_heads > 2 * num_sms(device)
        cfg = KernelConfig(PREFILL_TILE, PREFILL_WARPS, PREFILL_STAGES, fused_reduce=fused,
                           max_registers=PREFILL_MAX_REGISTERS,
                           small_unmasked_full_tiles=partition_size is not None or not (large and layout == "flat"))
    tile = cfg.tile_tokens
    if partition_size is not None:
        # the tile must divide the partition so that no tile straddles two partitions
        tile = min(tile, partition_size & -partition_size)
    merge_rows = max(2, _p2(block_q * group))
    small_merge_rows = max(2, _p2((small_rows // group) * group)) if small_rows else 2
    block_d = max(16, _p2(head_size))
    parts_per_step = max(2, min(_p2(num_parts), merge_tile_elems(device) // (merge_rows * block_d)))
    return LaunchPlan(decode_only, block_q, block_rows, small_rows, tile, partition_size, num_parts,
                      num_qblocks, cfg.fused_reduce, merge_rows, small_merge_rows, parts_per_step,
                      min(128, max(2, _p2(num_parts))), (8 if num_parts > 32 else 4) if on_gpu else 1, cfg,
                      big_split)


def _small_partition(tokens: int | None, on_gpu: bool, span: int, tile: int, bytes_per_part: int) -> int | None:
    """Partition size of the small-path split of a launch with prefills (None: no split): ``tokens``
    (None: SMALL_PARTITION_TOKENS on GPU, off in the interpreter) rounded up to the tile, enlarged
    until the partials (``bytes_per_part`` per partition: they are laid out by query token) fit in
    SPLIT_SCRATCH_MAX_BYTES; no split when one partition would cover the longest range."""
    if tokens is None:
        tokens = SMALL_PARTITION_TOKENS if on_gpu else 0
    if not tokens:
        return None
    size = tile * math.ceil(tokens / tile)
    while size < span and math.ceil(span / size) * bytes_per_part > SPLIT_SCRATCH_MAX_BYTES:
        size *= 2
    return size if size < span else None


def plan_launch(num_seqs: int, num_kv_heads: int, max_seq_len: int, head_size: int, layout: str,
                device: torch.device, partition_size: int | None = None,
                config: KernelConfig | None = None, num_queries_per_kv: int = 1) -> tuple[int | None, KernelConfig]:
    """The decode dispatch (one token per sequence): (partition size or None, KernelConfig).
    A view of ``plan_attention`` for decode-only launches."""
    plan = plan_attention(num_seqs, num_seqs, num_kv_heads * num_queries_per_kv, num_kv_heads, head_size,
                          max_seq_len, 1, layout, device, partition_size, config)
    return plan.partition_size, plan.config


# ---------------------------------------------------------------------------------------------
# per-device buffers: counters of the fused merge and the split-KV scratch

_COUNTERS: dict[torch.device, torch.Tensor] = {}
_SCRATCH: dict[tuple, torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []  # replaced counter buffers: a captured CUDA graph may still use them


def attention_workspace(num_seqs: int, num_kv_heads: int, device: torch.device | str) -> torch.Tensor:
    """Arrival counters for the fused split-KV merge (int32 zeros), to pass as ``workspace=``.

    Args:
        num_seqs, num_kv_heads: the largest launch the workspace serves: one counter per (program
            along q-blocks, KV head); for a launch with prefills, pass num_tokens + num_seqs as
            num_seqs (a bound on its q-blocks).
        device: where the kernel runs.
    Returns:
        int32 zeros [num_seqs * num_kv_heads]; the kernels leave them at zero.
    """
    return torch.zeros(num_seqs * num_kv_heads, dtype=torch.int32, device=device)


def _check_not_capturing(device: torch.device, what: str) -> None:
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # a buffer allocated during capture would belong to the graph's memory pool
        raise ValueError(f"split-KV needs {what}: call once with this shape before capturing a CUDA "
                         "graph, or pass workspace=attention_workspace(...)")


def _counters(workspace: torch.Tensor | None, num_counters: int, device: torch.device) -> torch.Tensor:
    if workspace is not None:
        if workspace.dtype != torch.int32 or workspace.device != device or workspace.numel() < num_counters:
            raise ValueError(f"workspace must be int32 on {device} with at least {num_counters} elements "
                             f"(q-blocks x num_kv_heads), got {workspace.dtype} on {workspace.device} with "
                             f"{workspace.numel()}")
        return workspace
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < num_counters:
        _check_not_capturing(device, f"{num_counters} merge counters")
        if buf is not None:
            _RETIRED.append(buf)
        buf = torch.zeros(max(num_counters, 1 << 16), dtype=torch.int32, device=device)
        _COUNTERS[device] = buf
    return buf


def _scratch(device: torch.device, num_elems: int) -> torch.Tensor:
    """fp32 scratch for the partial results of split-KV, per device and stream, grown and reused.
    Inside CUDA-graph capture it comes from the graph's pool, as the graph must own it."""
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return torch.empty(num_elems, dtype=torch.float32, device=device)
        key = (device, torch.cuda.current_stream(device).cuda_stream)
    else:
        key = (device, 0)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < num_elems:
        buf = torch.empty(max(num_elems, 2 * buf.numel() if buf is not None else 0, 1 << 16),
                          dtype=torch.float32, device=device)
        _SCRATCH[key] = buf
    return buf


# ---------------------------------------------------------------------------------------------
# the kernel


@triton.jit
def _find_seq(qsl_ptr, target, num_seqs, BLOCK_Q: tl.constexpr, BY_QBLOCK: tl.constexpr):
    """The last sequence whose first program (BY_QBLOCK: q-block index query_start_loc[s] //
    BLOCK_Q + s; else its first token query_start_loc[s]) is <= target (binary search)."""
    # explicit int32 scalars: an int argument equal to 1 is specialised to a constant, and loop-carried
    # values must keep one type
    lo = tl.full([], 0, tl.int32)
    hi = tl.full([], 0, tl.int32) + num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        key = tl.load(qsl_ptr + mid)
        if BY_QBLOCK:
            key = key // BLOCK_Q + mid
        below = key <= target
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid - 1)
    return lo


@triton.jit
def _kv_range(seq_len, q_len, first, n_tok, sliding_window, WINDOW: tl.constexpr):
    """KV positions of the q-block of tokens [first, first + n_tok) of a sequence: (p_lo, p_hi, lo,
    full_lo). p_lo/p_hi: positions of its first and last token; [lo, p_hi] holds every position a
    row attends to; positions >= full_lo are in every row's window."""
    p_lo = seq_len - q_len + first
    p_hi = p_lo + n_tok - 1
    if WINDOW:
        lo = tl.maximum(p_lo - sliding_window + 1, 0)
        full_lo = tl.maximum(p_hi - sliding_window + 1, 0)
    else:
        lo = p_lo * 0
        full_lo = p_lo * 0
    return p_lo, p_hi, lo, full_lo


@triton.jit
def _attend_tile(q, m_i, l_i, acc, t0, lo, hi, pos, bt_row, k_base, v_base, k_d, v_d, d_ok, qk_scale,
                 sliding_window, k_stride_block, k_stride_token, v_stride_block, v_stride_token,
                 HEAD_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
                 V_TOKENS_CONTIGUOUS: tl.constexpr, RUN: tl.constexpr, UPCAST_DOT: tl.constexpr,
                 IEEE: tl.constexpr, MASKED: tl.constexpr, ROW_MASKS: tl.constexpr, WINDOW: tl.constexpr):
    """The tile of TILE tokens from t0: gather K/V through the block table, online-softmax update.
    MASKED: the tile may hold tokens outside [lo, hi) (never read into the result) or, with
    ROW_MASKS (several tokens per program), tokens past a row's position or before its window."""
    t = t0 + tl.arange(0, TILE)
    if MASKED:
        t_ok = t < hi
        if WINDOW:
            t_ok = t_ok & (t >= lo)
        # outside [lo, hi) the block-table entry may be unused: read block 0 instead (always in the pool)
        block = tl.load(bt_row + t // BLOCK_SIZE, mask=t_ok, other=0).to(tl.int64)
    else:
        block = tl.load(bt_row + t // BLOCK_SIZE).to(tl.int64)
    slot = t % BLOCK_SIZE
    # (the order of these statements is the decode-only kernel's: it decides the schedule ptxas
    # finds, see _attend_qblock)
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
        # a mask varying along tokens would stop 16-byte loads: load the whole runs (every address
        # is inside the pool) and zero the tokens outside the range, which may hold NaN (free slots)
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
        if ROW_MASKS:
            ok = t_ok[None, :] & (t[None, :] <= pos[:, None])
            if WINDOW:
                ok = ok & (t[None, :] > pos[:, None] - sliding_window)
        else:
            ok = t_ok[None, :]
        s = tl.where(ok, s * qk_scale, float("-inf"))
    else:
        s = s * qk_scale
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED and ROW_MASKS:
        # a row may have no token in this tile yet (m = -inf): exponentiate against 0 instead
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    alpha = tl.math.exp2(m_i - m_use)
    p = tl.math.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def _merge_partitions(tmp_ptr, m_ptr, l_ptr, t_rows, ml_rows, rows_ok, num_parts, stride_t_part,
                      ROWS: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_D: tl.constexpr,
                      PARTS_PER_STEP: tl.constexpr, CACHE: tl.constexpr, EMPTY_ROWS: tl.constexpr):
    """Merge the partial results (acc, m, l) of partitions 0 .. num_parts - 1 of ROWS query rows
    (t_rows / ml_rows: each row's offset in the partials; parts are contiguous in m and l), in
    partition order, so that the result never depends on which program finished last:
    M = max_p m_p;  L = sum_p l_p 2^(m_p - M);  A = sum_p acc_p 2^(m_p - M).
    EMPTY_ROWS: a row may have no token in a partition (m = -inf, l = 0, acc = 0; several tokens
    per q-block, or a window), so a row's running max may still be -inf; without it every row's
    first partition holds a token (one token per q-block, no window) and padding rows are set to 0,
    as the decode-only kernel did (the same code, hence the same registers).
    CACHE: load cache modifier (".cg": read from L2, where other programs wrote the partials).
    Returns (L, A), [ROWS] and [ROWS, BLOCK_D] (rows not ok: 0)."""
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_SIZE
    pp = tl.arange(0, PARTS_PER_STEP)
    big_m = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    big_l = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    for p0 in range(0, num_parts, PARTS_PER_STEP):
        p = p0 + pp
        ok = rows_ok[:, None] & (p < num_parts)[None, :]
        m_p = tl.load(m_ptr + ml_rows[:, None] + p[None, :], mask=ok, other=float("-inf"), cache_modifier=CACHE)
        l_p = tl.load(l_ptr + ml_rows[:, None] + p[None, :], mask=ok, other=0.0, cache_modifier=CACHE)
        a_p = tl.load(tmp_ptr + t_rows[:, None, None] + p[None, :, None] * stride_t_part + d[None, None, :],
                      mask=ok[:, :, None] & d_ok[None, None, :], other=0.0, cache_modifier=CACHE)
        if EMPTY_ROWS:
            m_new = tl.maximum(big_m, tl.max(m_p, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no token yet (or a padding row)
        else:
            m_new = tl.where(rows_ok, tl.maximum(big_m, tl.max(m_p, 1)), 0.0)
            m_use = m_new
        rescale_old = tl.math.exp2(big_m - m_use)
        w_p = tl.math.exp2(m_p - m_use[:, None])
        big_l = big_l * rescale_old + tl.sum(l_p * w_p, 1)
        acc = acc * rescale_old[:, None] + tl.sum(a_p * w_p[:, :, None], 1)
        big_m = m_new
    return big_l, acc


@triton.jit
def _col(x, COL: tl.constexpr):
    """x[:, None] for a tensor of rows (COL), x itself for a scalar."""
    if COL:
        return x[:, None]
    else:
        return x


@triton.jit
def _attend_qblock(
    out_ptr, tmp_ptr, m_ptr, l_ptr, counters_ptr, q_ptr, k_ptr, v_ptr, block_tables_ptr, stride_bt_seq,
    seq, qblock, kv_head, part, tok0, n_tok, seq_len, q_len, first, qk_scale, sliding_window,
    partition_size, num_kv_heads,
    stride_q_tok, stride_q_head, stride_o_tok, stride_o_head,
    stride_t_tok, stride_t_head, stride_t_part, stride_ml_tok, stride_ml_head,
    k_stride_block, k_stride_token, k_stride_head, k_stride_dx, k_stride_x,
    v_stride_block, v_stride_token, v_stride_head, v_stride_dx, v_stride_x,
    ROWS: tl.constexpr, MERGE_ROWS: tl.constexpr, GROUP: tl.constexpr, HEAD_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, K_X: tl.constexpr,
    V_X: tl.constexpr, V_TOKENS_CONTIGUOUS: tl.constexpr, RUN: tl.constexpr, SPLIT: tl.constexpr,
    UPCAST_DOT: tl.constexpr, IEEE: tl.constexpr, UNMASKED_FULL_TILES: tl.constexpr, FUSED: tl.constexpr,
    PARTS_PER_STEP: tl.constexpr, ROW_MASKS: tl.constexpr, WINDOW: tl.constexpr,
):
    """One program's work: the n_tok new tokens [first, first + n_tok) of a sequence (tok0: the
    first one's query row) x the GROUP query heads of kv_head, as ROWS rows; all of their KV range,
    or partition ``part`` of it (SPLIT; partitions of ``partition_size`` tokens).

    Two instances of this code: q-blocks of several tokens or with a window (``ROW_MASKS or
    WINDOW``: tile ranges, per-row masks), and the one-token q-block without a window (a decode):
    rows are the query heads, the range is counted in tokens from 0 and the loops are the decode-only
    kernel's own, because on Hopper that is what kept its register count at 128 (4 programs per
    multiprocessor) where the tile-range form took 140-146 (3 per multiprocessor, 1.13-1.33x slower
    on the H200; the analysis is in docs/KERNELS.md, "Code generation of the decode path")."""
    p_lo, p_hi, lo, full_lo = _kv_range(seq_len, q_len, first, n_tok, sliding_window, WINDOW)
    hi = p_hi + 1
    rows = tl.arange(0, ROWS)
    if ROW_MASKS:
        r_tok = rows // GROUP
        row_ok = (rows < (ROWS // GROUP) * GROUP) & (r_tok < n_tok)
        heads = kv_head * GROUP + rows % GROUP
    else:  # one token: the rows are its query heads
        row_ok = rows < GROUP
        heads = kv_head * GROUP + rows
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_SIZE
    # each row's query token (one token: a scalar), widened to int64 where it is used (where the
    # decode-only kernel widened it: the position in the code changes ptxas's schedule)
    if ROW_MASKS:
        tok = tok0 + r_tok
        pos = p_lo + tl.minimum(r_tok, n_tok - 1)  # padding rows: the last token's position
    else:
        tok = tok0
        pos = p_lo
    q = tl.load(q_ptr + _col(tok.to(tl.int64), ROW_MASKS) * stride_q_tok + heads[:, None] * stride_q_head + d[None, :],
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

    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    # the loops run for every program (empty past the q-block's range) and only the stores below are
    # guarded, as in the decode-only kernel before: guarding the whole body made MHA split launches
    # 1.2-1.3x slower on the H200 (bench/results/kernels_h200_decode_fix.csv)
    if ROW_MASKS or WINDOW:
        j_lo = lo // TILE
        j_hi = tl.cdiv(hi, TILE)
        if SPLIT:
            tiles_per_part = partition_size // TILE
            num_parts = tl.cdiv(j_hi - j_lo, tiles_per_part)
            a = j_lo + part * tiles_per_part
            j_hi = tl.minimum(j_hi, a + tiles_per_part)
        else:
            a = j_lo
        if UNMASKED_FULL_TILES:
            # tiles [a, b): window edge, masked; [b, c): seen whole by every row, no masks;
            # [c, j_hi): the causal diagonal (a decode's last, partial tile), masked
            b = tl.minimum(tl.maximum(tl.cdiv(full_lo, TILE), a), j_hi)
            c = tl.minimum(tl.maximum((p_lo + 1) // TILE, b), j_hi)
            if WINDOW:
                for j in range(a, b):
                    m_i, l_i, acc = _attend_tile(
                        q, m_i, l_i, acc, j * TILE, lo, hi, pos, bt_row, k_base, v_base, k_d, v_d, d_ok,
                        qk_scale, sliding_window, k_stride_block, k_stride_token, v_stride_block, v_stride_token,
                        HEAD_SIZE, BLOCK_D, BLOCK_SIZE, TILE, V_TOKENS_CONTIGUOUS, RUN, UPCAST_DOT, IEEE,
                        True, ROW_MASKS, WINDOW)
            for j in range(b, c):
                m_i, l_i, acc = _attend_tile(
                    q, m_i, l_i, acc, j * TILE, lo, hi, pos, bt_row, k_base, v_base, k_d, v_d, d_ok, qk_scale,
                    sliding_window, k_stride_block, k_stride_token, v_stride_block, v_stride_token,
                    HEAD_SIZE, BLOCK_D, BLOCK_SIZE, TILE, V_TOKENS_CONTIGUOUS, RUN, UPCAST_DOT, IEEE,
                    False, ROW_MASKS, WINDOW)
            for j in range(c, j_hi):
                m_i, l_i, acc = _attend_tile(
                    q, m_i, l_i, acc, j * TILE, lo, hi, pos, bt_row, k_base, v_base, k_d, v_d, d_ok, qk_scale,
                    sliding_window, k_stride_block, k_stride_token, v_stride_block, v_stride_token,
                    HEAD_SIZE, BLOCK_D, BLOCK_SIZE, TILE, V_TOKENS_CONTIGUOUS, RUN, UPCAST_DOT, IEEE,
                    True, ROW_MASKS, WINDOW)
        else:
            for j in range(a, j_hi):
                m_i, l_i, acc = _attend_tile(
                    q, m_i, l_i, acc, j * TILE, lo, hi, pos, bt_row, k_base, v_base, k_d, v_d, d_ok, qk_scale,
                    sliding_window, k_stride_block, k_stride_token, v_stride_block, v_stride_token,
                    HEAD_SIZE, BLOCK_D, BLOCK_SIZE, TILE, V_TOKENS_CONTIGUOUS, RUN, UPCAST_DOT, IEEE,
                    True, ROW_MASKS, WINDOW)
    else:
        # one token at position p_lo: KV [0, hi), partitions of partition_size tokens from 0; full
        # tiles without masks and one masked tail (every tile masked: UNMASKED_FULL_TILES off)
        if SPLIT:
            start = part * partition_size
            end = tl.minimum(start + partition_size, hi)
        else:
            start = 0
            end = hi
        end = tl.maximum(end, start)  # a partition past this token's range has no tokens
        if UNMASKED_FULL_TILES:
            num_full = (end - start) // TILE
            for i in range(0, num_full):
                m_i, l_i, acc = _attend_tile(
                    q, m_i, l_i, acc, start + i * TILE, lo, end, pos, bt_row, k_base, v_base, k_d, v_d, d_ok,
                    qk_scale, sliding_window, k_stride_block, k_stride_token, v_stride_block, v_stride_token,
                    HEAD_SIZE, BLOCK_D, BLOCK_SIZE, TILE, V_TOKENS_CONTIGUOUS, RUN, UPCAST_DOT, IEEE,
                    False, ROW_MASKS, WINDOW)
            tail = start + num_full * TILE
            if tail < end:
                m_i, l_i, acc = _attend_tile(
                    q, m_i, l_i, acc, tail, lo, end, pos, bt_row, k_base, v_base, k_d, v_d, d_ok, qk_scale,
                    sliding_window, k_stride_block, k_stride_token, v_stride_block, v_stride_token,
                    HEAD_SIZE, BLOCK_D, BLOCK_SIZE, TILE, V_TOKENS_CONTIGUOUS, RUN, UPCAST_DOT, IEEE,
                    True, ROW_MASKS, WINDOW)
        else:
            for t0 in range(start, end, TILE):
                m_i, l_i, acc = _attend_tile(
                    q, m_i, l_i, acc, t0, lo, end, pos, bt_row, k_base, v_base, k_d, v_d, d_ok, qk_scale,
                    sliding_window, k_stride_block, k_stride_token, v_stride_block, v_stride_token,
                    HEAD_SIZE, BLOCK_D, BLOCK_SIZE, TILE, V_TOKENS_CONTIGUOUS, RUN, UPCAST_DOT, IEEE,
                    True, ROW_MASKS, WINDOW)

    out_mask = row_ok[:, None] & d_ok[None, :]
    if SPLIT:
        if not (ROW_MASKS or WINDOW):
            num_parts = tl.cdiv(hi, partition_size)
        if part < num_parts:  # a partition past this q-block's range has no tokens: nothing to merge
            # unnormalised partial result (acc, m, l), merged in partition order (below, or by
            # _reduce_partitions_kernel)
            t_offs = _col(tok.to(tl.int64), ROW_MASKS) * stride_t_tok + heads[:, None] * stride_t_head + d[None, :]
            tl.store(tmp_ptr + t_offs + part * stride_t_part, acc, mask=out_mask)
            ml_offs = tok.to(tl.int64) * stride_ml_tok + heads * stride_ml_head + part
            tl.store(m_ptr + ml_offs, m_i, mask=row_ok)
            tl.store(l_ptr + ml_offs, l_i, mask=row_ok)
            if FUSED:
                # the last partition program of (q-block, kv_head) to arrive merges them all, in
                # partition order. The barrier orders every thread's stores above before the release
                # of the ticket (taken by one thread); the ticket's acquire makes the other
                # programs' partials visible to this one.
                tl.debug_barrier()
                counter = counters_ptr + qblock * num_kv_heads + kv_head
                ticket = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
                if ticket == num_parts - 1:
                    mr = tl.arange(0, MERGE_ROWS)
                    if ROW_MASKS:
                        mr_tok = mr // GROUP
                        mr_ok = (mr < (ROWS // GROUP) * GROUP) & (mr_tok < n_tok)
                        mr_heads = kv_head * GROUP + mr % GROUP
                        mr_rows = (tok0 + mr_tok).to(tl.int64)
                    else:
                        mr_ok = mr < GROUP
                        mr_heads = kv_head * GROUP + mr
                        mr_rows = tok.to(tl.int64)
                    big_l, big_acc = _merge_partitions(
                        tmp_ptr, m_ptr, l_ptr, mr_rows * stride_t_tok + mr_heads * stride_t_head,
                        mr_rows * stride_ml_tok + mr_heads * stride_ml_head, mr_ok, num_parts, stride_t_part,
                        MERGE_ROWS, HEAD_SIZE, BLOCK_D, PARTS_PER_STEP, ".cg", ROW_MASKS or WINDOW)
                    # every program of (q-block, kv_head) has taken its ticket: reset for the next call
                    tl.store(counter, 0)
                    out = big_acc / tl.where(mr_ok, big_l, 1.0)[:, None]
                    tl.store(out_ptr + _col(mr_rows, ROW_MASKS) * stride_o_tok + mr_heads[:, None] * stride_o_head + d[None, :],
                             out.to(out_ptr.dtype.element_ty), mask=mr_ok[:, None] & d_ok[None, :])
    else:
        out_offs = _col(tok.to(tl.int64), ROW_MASKS) * stride_o_tok + heads[:, None] * stride_o_head + d[None, :]
        out = acc / l_i[:, None]
        tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _attention_kernel(
    out_ptr, tmp_ptr, m_ptr, l_ptr, counters_ptr,
    q_ptr, k_ptr, v_ptr, block_tables_ptr, seq_lens_ptr, qsl_ptr,
    qk_scale, sliding_window, partition_size, num_seqs, num_qblocks,
    stride_q_tok, stride_q_head, stride_o_tok, stride_o_head,
    stride_t_tok, stride_t_head, stride_t_part, stride_ml_tok, stride_ml_head,
    num_kv_heads, stride_bt_seq,
    k_stride_block, k_stride_token, k_stride_head, k_stride_dx, k_stride_x,
    v_stride_block, v_stride_token, v_stride_head, v_stride_dx, v_stride_x,
    GROUP: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    SMALL_M: tl.constexpr, MERGE_ROWS: tl.constexpr, SMALL_MERGE_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, K_X: tl.constexpr, V_X: tl.constexpr,
    V_TOKENS_CONTIGUOUS: tl.constexpr, RUN: tl.constexpr, SPLIT: tl.constexpr, UPCAST_DOT: tl.constexpr,
    IEEE: tl.constexpr, UNMASKED_FULL_TILES: tl.constexpr, FUSED: tl.constexpr,
    PARTS_PER_STEP: tl.constexpr, DECODE_ONLY: tl.constexpr, WINDOW: tl.constexpr,
    LONGEST_FIRST: tl.constexpr, SMALL_UNMASKED: tl.constexpr, BIG_SPLIT: tl.constexpr,
):
    if DECODE_ONLY:
        # the KV heads of one sequence side by side, as the decode-only kernel before did: they read
        # neighbouring bytes of the same blocks (flat layout)
        kv_head = tl.program_id(0)
        pid = tl.program_id(1)
    else:
        pid = tl.program_id(0)
        kv_head = tl.program_id(1)
    part = tl.program_id(2)
    if DECODE_ONLY:
        qblock = pid
        seq = pid
        tok0 = pid
        q_len = 1
        first = 0
        n_tok = 1
    else:
        if LONGEST_FIRST:
            qblock = num_qblocks - 1 - pid
        else:
            qblock = pid
        seq = _find_seq(qsl_ptr, qblock, num_seqs, BLOCK_Q, True)
        q_start = tl.load(qsl_ptr + seq)
        q_len = tl.load(qsl_ptr + seq + 1) - q_start
        first = (qblock - (q_start // BLOCK_Q + seq)) * BLOCK_Q
        tok0 = q_start + first
        n_tok = tl.minimum(q_len - first, BLOCK_Q)
    if n_tok > 0:  # programs past their sequence's last q-block (the grid is a bound) do nothing
        seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
        # (a constexpr test outside: a variable set to False in Triton is a tensor, and both paths
        # would be compiled). The call sites below and the _attend_tile loops of _attend_qblock repeat
        # their argument lists because each is one compile-time instance (rows, masking): Triton
        # takes no *args and no loop over constexprs.
        if SMALL_M > 0:
            # mixed launch: a q-block of few rows (a decode) runs the small-row path
            if n_tok * GROUP <= SMALL_M:
                _attend_qblock(
                    out_ptr, tmp_ptr, m_ptr, l_ptr, counters_ptr, q_ptr, k_ptr, v_ptr, block_tables_ptr,
                    stride_bt_seq, seq, qblock, kv_head, part, tok0, n_tok, seq_len, q_len, first, qk_scale, sliding_window,
                    partition_size, num_kv_heads, stride_q_tok, stride_q_head, stride_o_tok, stride_o_head,
                    stride_t_tok, stride_t_head, stride_t_part, stride_ml_tok, stride_ml_head,
                    k_stride_block, k_stride_token, k_stride_head, k_stride_dx, k_stride_x,
                    v_stride_block, v_stride_token, v_stride_head, v_stride_dx, v_stride_x,
                    SMALL_M, SMALL_MERGE_ROWS, GROUP, HEAD_SIZE, BLOCK_D, BLOCK_SIZE, TILE, K_X, V_X,
                    V_TOKENS_CONTIGUOUS, RUN, SPLIT, UPCAST_DOT, IEEE, SMALL_UNMASKED, FUSED, PARTS_PER_STEP,
                    SMALL_M // GROUP > 1, WINDOW)
            elif BIG_SPLIT | (part == 0):
                # (not BIG_SPLIT: only the small path is split; the other q-blocks run whole, in partition 0)
                _attend_qblock(
                    out_ptr, tmp_ptr, m_ptr, l_ptr, counters_ptr, q_ptr, k_ptr, v_ptr, block_tables_ptr,
                    stride_bt_seq, seq, qblock, kv_head, part, tok0, n_tok, seq_len, q_len, first, qk_scale, sliding_window,
                    partition_size, num_kv_heads, stride_q_tok, stride_q_head, stride_o_tok, stride_o_head,
                    stride_t_tok, stride_t_head, stride_t_part, stride_ml_tok, stride_ml_head,
                    k_stride_block, k_stride_token, k_stride_head, k_stride_dx, k_stride_x,
                    v_stride_block, v_stride_token, v_stride_head, v_stride_dx, v_stride_x,
                    BLOCK_M, MERGE_ROWS, GROUP, HEAD_SIZE, BLOCK_D, BLOCK_SIZE, TILE, K_X, V_X,
                    V_TOKENS_CONTIGUOUS, RUN, SPLIT and BIG_SPLIT, UPCAST_DOT, IEEE, UNMASKED_FULL_TILES, FUSED, PARTS_PER_STEP,
                    BLOCK_Q > 1, WINDOW)
        else:
            _attend_qblock(
                out_ptr, tmp_ptr, m_ptr, l_ptr, counters_ptr, q_ptr, k_ptr, v_ptr, block_tables_ptr, stride_bt_seq,
                seq, qblock, kv_head, part, tok0, n_tok, seq_len, q_len, first, qk_scale, sliding_window,
                partition_size, num_kv_heads, stride_q_tok, stride_q_head, stride_o_tok, stride_o_head,
                stride_t_tok, stride_t_head, stride_t_part, stride_ml_tok, stride_ml_head,
                k_stride_block, k_stride_token, k_stride_head, k_stride_dx, k_stride_x,
                v_stride_block, v_stride_token, v_stride_head, v_stride_dx, v_stride_x,
                BLOCK_M, MERGE_ROWS, GROUP, HEAD_SIZE, BLOCK_D, BLOCK_SIZE, TILE, K_X, V_X,
                V_TOKENS_CONTIGUOUS, RUN, SPLIT, UPCAST_DOT, IEEE, UNMASKED_FULL_TILES, FUSED, PARTS_PER_STEP,
                BLOCK_Q > 1, WINDOW)


@triton.jit
def _reduce_partitions_kernel(
    out_ptr, tmp_ptr, m_ptr, l_ptr, seq_lens_ptr, qsl_ptr, sliding_window, partition_size, num_seqs,
    stride_o_tok, stride_o_head, stride_t_tok, stride_t_head, stride_t_part, stride_ml_tok, stride_ml_head,
    HEAD_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr, TILE: tl.constexpr,
    PARTS_PER_STEP: tl.constexpr, DECODE_ONLY: tl.constexpr, WINDOW: tl.constexpr, GROUP: tl.constexpr,
    SMALL_ONLY: tl.constexpr,
):
    """The unfused merge: one program per (query token, query head), launched after the attention
    kernel; it merges the partitions of its token's q-block. SMALL_ONLY > 0: only q-blocks of at
    most that many rows were split (the others wrote their output directly)."""
    tok = tl.program_id(0)
    head = tl.program_id(1)
    if DECODE_ONLY:
        seq = tok
        q_len = 1
        first = 0
        n_tok = 1
    else:
        seq = _find_seq(qsl_ptr, tok, num_seqs, BLOCK_Q, False)
        q_start = tl.load(qsl_ptr + seq)
        q_len = tl.load(qsl_ptr + seq + 1) - q_start
        first = (tok - q_start) // BLOCK_Q * BLOCK_Q
        n_tok = tl.minimum(q_len - first, BLOCK_Q)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    if DECODE_ONLY and not WINDOW:
        num_parts = tl.cdiv(seq_len, partition_size)  # partitions of the token's range [0, seq_len)
    else:
        p_lo, p_hi, lo, full_lo = _kv_range(seq_len, q_len, first, n_tok, sliding_window, WINDOW)
        num_parts = tl.cdiv(tl.cdiv(p_hi + 1, TILE) - lo // TILE, partition_size // TILE)
    # one query row: a "q-block" of one row; rows_ok has a second, padding row (no 1-element tensors)
    r = tl.arange(0, 2)
    r_ok = r < 1
    if SMALL_ONLY > 0:
        num_parts = tl.where(n_tok * GROUP <= SMALL_ONLY, num_parts, 0)
        r_ok = r_ok & (n_tok * GROUP + r * 0 <= SMALL_ONLY)
    heads = head + r
    tok64 = tok.to(tl.int64)
    l, acc = _merge_partitions(tmp_ptr, m_ptr, l_ptr, tok64 * stride_t_tok + heads * stride_t_head,
                               tok64 * stride_ml_tok + heads * stride_ml_head, r_ok, num_parts, stride_t_part,
                               2, HEAD_SIZE, BLOCK_D, PARTS_PER_STEP, "", not DECODE_ONLY or WINDOW)
    d = tl.arange(0, BLOCK_D)
    out = acc / tl.where(r_ok, l, 1.0)[:, None]
    tl.store(out_ptr + tok64 * stride_o_tok + heads[:, None] * stride_o_head + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=r_ok[:, None] & (d < HEAD_SIZE)[None, :])


# ---------------------------------------------------------------------------------------------
# host side


_GEOMETRY: dict[tuple, tuple] = {}


def _geometry(key_cache: torch.Tensor, value_cache: torch.Tensor, layout: str):
    """(CacheGeometry, K strides, V strides, K/V stride tuple), cached by shapes and strides."""
    key = (layout, key_cache.shape, key_cache.stride(), value_cache.shape, value_cache.stride(),
           key_cache.dtype, value_cache.dtype, key_cache.device, value_cache.device)
    hit = _GEOMETRY.get(key)
    if hit is None:
        geom = cache_geometry(key_cache, value_cache, layout)
        ks, vs = cache_strides(key_cache, value_cache, layout)
        hit = (geom, ks, vs, (ks.block, ks.token, ks.head, ks.dx, ks.x, vs.block, vs.token, vs.head, vs.dx, vs.x))
        _GEOMETRY[key] = hit
    return hit


def _int_tensor(name: str, t, device: torch.device, shape: tuple) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be an int32/int64 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but query is on {device}")
    if tuple(t.shape) != shape:
        dims = {"block_tables": "[num_seqs={}, max_num_blocks_per_seq]", "seq_lens": "[num_seqs={}] (1-D)",
                "query_start_loc": "[num_seqs + 1 = {}]"}[name]
        raise ValueError(f"{name} must be {dims.format(shape[0])}, got {tuple(t.shape)}")


def _check_values(geom, block_tables, seq_lens, query_start_loc, num_tokens, sliding_window):
    """Host checks of the values (a device sync): lengths, query_start_loc, block ids in use.
    Returns (max_seq_len, max_query_len)."""
    lens = seq_lens.to("cpu", torch.int64)
    num_seqs = len(lens)
    if query_start_loc is None:
        q_lens = torch.ones(num_seqs, dtype=torch.int64)
    else:
        qsl = query_start_loc.to("cpu", torch.int64)
        if int(qsl[0]) != 0 or int(qsl[-1]) != num_tokens:
            raise ValueError(f"query_start_loc must start at 0 and end at num_tokens={num_tokens}, got "
                             f"{int(qsl[0])} .. {int(qsl[-1])}")
        q_lens = qsl[1:] - qsl[:-1]
        if int(q_lens.min()) < 1:
            seq = int(torch.argmin(q_lens))
            raise ValueError(f"query_start_loc gives sequence {seq} {int(q_lens[seq])} new tokens: every "
                             "sequence needs at least 1")
    short = lens < q_lens
    if bool(short.any()):
        seq = int(torch.nonzero(short)[0])
        raise ValueError(f"seq_lens[{seq}] = {int(lens[seq])} is less than its {int(q_lens[seq])} new tokens"
                         + ("" if query_start_loc is not None else ": every sequence needs at least 1 token"))
    max_seq_len = int(lens.max())
    if max_seq_len > block_tables.shape[1] * geom.block_size:
        seq = int(torch.argmax(lens))
        raise ValueError(f"seq_lens[{seq}] = {max_seq_len} tokens needs more than the "
                         f"{block_tables.shape[1]} blocks of {geom.block_size} a block_tables row holds")
    tables = block_tables.to("cpu", torch.int64)
    cols = torch.arange(tables.shape[1])[None, :]
    used = cols < (lens[:, None] + geom.block_size - 1) // geom.block_size
    if sliding_window is not None:
        # blocks wholly before the first new token's window are never read (vLLM frees them)
        first = (lens - q_lens - sliding_window + 1).clamp(min=0)
        used &= cols >= (first // geom.block_size)[:, None]
    bad = used & ((tables < 0) | (tables >= geom.num_blocks))
    if bool(bad.any()):
        seq, col = (int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(f"block_tables[{seq}, {col}] = {int(tables[seq, col])} is outside the pool of "
                         f"{geom.num_blocks} blocks")
    return max_seq_len, int(q_lens.max())


_PLANS: dict[tuple, LaunchPlan] = {}
_STATIC: dict[tuple, tuple] = {}  # per (plan, dtypes, strides): grid, partial strides, constexprs, token
# the launch key of CachedLauncher: one token per _STATIC entry made (a plan made again after the
# caches were cleared, with other module constants, must not reuse the compiled kernel of the first)
_TOKENS = itertools.count()
_ATTENTION = CachedLauncher(_attention_kernel)
_REDUCE = CachedLauncher(_reduce_partitions_kernel)


def _static_launch(plan: LaunchPlan, geom, ks, vs, query: torch.Tensor, layout: str, sliding_window):
    """What a launch passes that depends only on its plan, dtypes and strides: (grid, partial-result
    strides, the attention kernel's constexprs and options, the reduce kernel's or None, a token that
    names this entry for CachedLauncher)."""
    num_tokens, num_heads, head_size = query.shape
    cfg = plan.config
    group = num_heads // geom.num_kv_heads
    block_d = max(16, _p2(head_size))
    split = plan.partition_size is not None
    if split:
        num_parts = plan.num_parts
        t_strides = (num_heads * num_parts * head_size, num_parts * head_size, head_size,
                     num_heads * num_parts, num_parts)
    else:
        t_strides = (0, 0, 0, 0, 0)
    grid = ((geom.num_kv_heads, plan.num_qblocks) if plan.decode_only else (plan.num_qblocks, geom.num_kv_heads)) \
        + (plan.num_parts if split else 1,)
    kw = dict(
        GROUP=group, HEAD_SIZE=head_size, BLOCK_Q=plan.block_q, BLOCK_M=plan.block_rows, SMALL_M=plan.small_rows,
        MERGE_ROWS=plan.merge_rows, SMALL_MERGE_ROWS=plan.small_merge_rows, BLOCK_D=block_d,
        BLOCK_SIZE=geom.block_size, TILE=plan.tile, K_X=ks.X, V_X=vs.X,
        V_TOKENS_CONTIGUOUS=layout == "vllm" and vs.token == 1 and vs.block % 16 == 0,
        RUN=min(plan.tile, geom.block_size), SPLIT=split,
        UPCAST_DOT=_INTERPRET and query.dtype == torch.bfloat16, IEEE=query.dtype == torch.float32,
        UNMASKED_FULL_TILES=cfg.unmasked_full_tiles, FUSED=split and plan.fused,
        PARTS_PER_STEP=plan.parts_per_step, DECODE_ONLY=plan.decode_only, WINDOW=sliding_window is not None,
        LONGEST_FIRST=cfg.longest_first, SMALL_UNMASKED=cfg.small_unmasked_full_tiles, BIG_SPLIT=plan.big_split,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.max_registers is not None:
        kw["maxnreg"] = cfg.max_registers
    reduce_kw = None
    if split and not plan.fused:
        reduce_kw = dict(
            HEAD_SIZE=head_size, BLOCK_D=block_d, BLOCK_Q=plan.block_q, TILE=plan.tile,
            PARTS_PER_STEP=plan.reduce_parts_per_step, DECODE_ONLY=plan.decode_only,
            WINDOW=sliding_window is not None, GROUP=group, SMALL_ONLY=0 if plan.big_split else plan.small_rows,
            num_warps=plan.reduce_warps)
    return grid, t_strides, kw, reduce_kw, next(_TOKENS)


def _launch(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale, layout,
            sliding_window, partition_size, max_seq_len, max_query_len, validate, config, workspace, out):
    if not isinstance(query, torch.Tensor) or query.dim() != 3:
        raise ValueError("query must be a tensor [num_tokens, num_heads, head_size], got "
                         f"{getattr(query, 'shape', type(query).__name__)}")
    geom, ks, vs, kv_strides = _geometry(key_cache, value_cache, layout)
    num_tokens, num_heads, head_size = query.shape
    device = query.device
    if query.dtype != key_cache.dtype:
        raise ValueError(f"query is {query.dtype} but the KV cache is {key_cache.dtype}")
    if head_size != geom.head_size:
        raise ValueError(f"query head_size {head_size} != cache head_size {geom.head_size}")
    if num_heads % geom.num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {geom.num_kv_heads}")
    if key_cache.device != device:
        raise ValueError(f"key_cache is on {key_cache.device} but query is on {device}")
    if query_start_loc is None:  # decode: one sequence per query row
        num_seqs = num_tokens
    else:  # as vLLM: one sequence per seq_lens entry
        num_seqs = seq_lens.shape[0] if isinstance(seq_lens, torch.Tensor) and seq_lens.dim() == 1 else -1
        _int_tensor("seq_lens", seq_lens, device, (max(num_seqs, 0),))
        _int_tensor("query_start_loc", query_start_loc, device, (num_seqs + 1,))
    _int_tensor("block_tables", block_tables, device, (num_seqs, block_tables.shape[-1] if
                                                       isinstance(block_tables, torch.Tensor) and block_tables.dim() == 2
                                                       else -1))
    _int_tensor("seq_lens", seq_lens, device, (num_seqs,))
    if device.type == "cpu" and not _INTERPRET:
        raise ValueError("CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 before "
                         "importing kernels")
    if sliding_window is not None and (not isinstance(sliding_window, int) or sliding_window < 1):
        raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window!r}")
    if partition_size is not None and (partition_size < 16 or partition_size % 16):
        raise ValueError(f"partition_size must be a positive multiple of 16, got {partition_size}")
    if query_start_loc is not None and num_tokens < num_seqs:
        raise ValueError(f"query has {num_tokens} tokens for {num_seqs} sequences: each needs at least 1")
    if out is None:
        out = torch.empty_like(query)
    elif out.shape != query.shape or out.dtype != query.dtype or out.device != device:
        raise ValueError(f"out must be {tuple(query.shape)} {query.dtype} on {device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    if num_seqs == 0:
        return out
    if validate:
        max_seq_len, max_query_len = _check_values(geom, block_tables, seq_lens, query_start_loc, num_tokens,
                                                   sliding_window)
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())  # a sync: callers that know it pass it
    if max_query_len is None:
        # no sync: a bound (every other sequence has at least one token)
        max_query_len = num_tokens - num_seqs + 1

    key = (num_tokens, num_seqs, num_heads, geom.num_kv_heads, head_size, max_seq_len, max_query_len, layout,
           device, partition_size, config, sliding_window)
    plan = _PLANS.get(key)
    if plan is None:
        plan = plan_attention(num_tokens, num_seqs, num_heads, geom.num_kv_heads, head_size, max_seq_len,
                              max_query_len, layout, device, partition_size, config, sliding_window)
        _PLANS[key] = plan
    if query.stride(-1) != 1:
        query = query.contiguous()
    lkey = (key, query.dtype, block_tables.dtype, seq_lens.dtype, None if query_start_loc is None else
            query_start_loc.dtype, query.stride(0), query.stride(1), out.stride(0), out.stride(1),
            block_tables.stride(0), kv_strides)
    static = _STATIC.get(lkey)
    if static is None:
        static = _STATIC[lkey] = _static_launch(plan, geom, ks, vs, query, layout, sliding_window)
    grid, t_strides, kw, reduce_kw, token = static
    split = plan.partition_size is not None
    if split:
        part_elems = num_tokens * num_heads * plan.num_parts
        scratch = _scratch(device, part_elems * (head_size + 2))
        tmp, m, l = scratch, scratch[part_elems * head_size:], scratch[part_elems * (head_size + 1):]
        counters = (_counters(workspace, plan.num_qblocks * geom.num_kv_heads, device) if plan.fused else out)
    else:
        tmp = m = l = counters = out
    # Arguments a launch does not read are passed as None or 1, which Triton turns into constants
    # and drops from the kernel's parameters: a decode-only launch then has the parameter block of
    # the decode-only kernel before, argument for argument. That matters: ptxas pairs 8-byte-aligned
    # parameters into 64-bit loads, and a shifted block cost 2 registers and 16 instructions.
    decode_only = plan.decode_only
    qsl = None if decode_only else query_start_loc
    num_seqs_arg = 1 if decode_only else num_seqs
    window_arg = sliding_window or 1
    _ATTENTION(grid, (out, tmp, m, l, counters, query, key_cache, value_cache, block_tables, seq_lens, qsl,
                      scale * LOG2E, window_arg, plan.partition_size if split else 0, num_seqs_arg,
                      1 if decode_only else plan.num_qblocks, query.stride(0), query.stride(1), out.stride(0),
                      out.stride(1), *t_strides, geom.num_kv_heads if split and plan.fused else 0,
                      block_tables.stride(0), *kv_strides),
               kw, token, (out, tmp, m, l, counters, query, key_cache, value_cache, block_tables, seq_lens)
               + (() if qsl is None else (qsl,)))
    if reduce_kw is not None:
        _REDUCE((num_tokens, num_heads, 1), (out, tmp, m, l, seq_lens, qsl, window_arg, plan.partition_size,
                                             num_seqs_arg, out.stride(0), out.stride(1), *t_strides),
                reduce_kw, token, (out, tmp, m, l, seq_lens) + (() if qsl is None else (qsl,)))
    return out


def unified_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                      scale: float, layout: str = "flat", sliding_window: int | None = None, *,
                      partition_size: int | None = None, max_seq_len: int | None = None,
                      max_query_len: int | None = None, validate: bool = True,
                      config: KernelConfig | None = None, workspace: torch.Tensor | None = None,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of a vLLM v1 batch (prefills, chunked prefills over cached context and
    decodes, in any mix) over its paged KV, in one launch (two when split-KV merges separately).

    Args:
        query: [num_tokens, num_heads, head_size], the new tokens of every sequence concatenated;
            same dtype as the caches (fp32/fp16/bf16).
        key_cache, value_cache: the pool in ``layout`` (see kernels.layout), the new tokens' K/V
            already written (``reshape_and_cache``).
        block_tables: int32/int64 [num_seqs, max_num_blocks_per_seq], any block order; entries past
            a sequence's last block (and, with a window, before its first new token's window) are
            never read.
        seq_lens: int32/int64 [num_seqs]: context plus new tokens.
        query_start_loc: int32/int64 [num_seqs + 1]: cumulative new-token counts from 0;
            q_len_i = query_start_loc[i+1] - query_start_loc[i] >= 1.
        scale: softmax scale (usually head_size ** -0.5).
        layout: "flat" or "vllm".
        sliding_window: None, or each token attends to the last ``sliding_window`` positions
            (itself included).
    Tuning (keyword only):
        partition_size: None = dispatch rule (``plan_attention``; no split on CPU); an int forces
            split-KV with partitions of that many tokens (a multiple of 16).
        max_seq_len, max_query_len: the longest seq_len / q_len if the caller knows them (vLLM's
            scheduler does). None: found by ``validate`` or, for max_seq_len, a device sync; for
            max_query_len a bound (num_tokens - num_seqs + 1).
        validate: check the lengths, query_start_loc and the block ids in use on the host (a device
            sync; benchmarks validate once, then pass False).
        config: kernel launch configuration; None = ``plan_attention``'s choice.
        workspace: split-KV only: int32 zeros counting the arriving partitions of the fused merge
            (``attention_workspace``); the kernel leaves them at zero, so one workspace serves every
            call, CUDA-graph replays included. None = a per-device buffer kept by this module (calls
            running concurrently on several streams of one device must then each pass their own).
        out: write the result here ([num_tokens, num_heads, head_size], query's dtype).
    Returns:
        [num_tokens, num_heads, head_size] in query's dtype: for each new token, attention over its
        sequence's positions [0, p] (or its window), equal to dense causal attention to the dtype's
        precision.
    Raises:
        ValueError: on shapes, dtypes, devices, layouts, lengths or block ids that do not fit.
    """
    if query_start_loc is None:
        raise ValueError("query_start_loc must be an int tensor [num_seqs + 1], got None")
    return _launch(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale, layout,
                   sliding_window, partition_size, max_seq_len, max_query_len, validate, config, workspace, out)


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                    layout: str = "flat", partition_size: int | None = None, *,
                    max_seq_len: int | None = None, validate: bool = True,
                    config: KernelConfig | None = None, workspace: torch.Tensor | None = None,
                    sliding_window: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention of one new token per sequence over its paged KV: ``unified_attention`` with
    every q_len = 1 (query_start_loc = 0, 1, ..., num_seqs; the kernel does not read it).

    Args:
        query: [num_seqs, num_heads, head_size]; the rest as in ``unified_attention``.
        seq_lens: int32/int64 [num_seqs], each >= 1 (the new token included).
    Returns:
        [num_seqs, num_heads, head_size] in query's dtype.
    Raises:
        ValueError: on shapes, dtypes, devices, layouts or block ids that do not fit.
    """
    return _launch(query, key_cache, value_cache, block_tables, seq_lens, None, scale, layout, sliding_window,
                   partition_size, max_seq_len, 1, validate, config, workspace, out)
