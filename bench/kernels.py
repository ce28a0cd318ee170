"""Unified paged attention on a CUDA GPU: prefill, mixed prefill + decode batches, decode, eager-mode
host cost and correctness, side by side with the dense peers, in one run.

Sections (``--sections``, in this order):
- ``correctness``: fp32/fp16/bf16 x flat/vLLM layout x (decode, split-KV fused and separate, mixed
  batches over cached context, sliding windows, block 16/128) against float64, shuffled vs identity
  table bitwise, merge counters back to zero.
- ``decode``: the 100-point grid of earlier runs (batch 1-256 x 512-128k tokens x block 16/128 x
  GQA 1/4/8): bandwidth vs a same-bytes copy and time vs dense SDPA (cuDNN, FlashAttention-2) on
  contiguous KV.
- ``prefill``: varlen prefills (1-64 sequences x 512-16k new tokens, no context, and over 4k-32k of
  cached context; equal and ragged lengths): TFLOP/s (useful causal FLOPs) vs dense peers on the
  same data: FlashAttention-2 varlen (one launch, bottom-right causal), SDPA cuDNN and FA2 padded,
  per-sequence SDPA for ragged batches, cuDNN varlen where torch has it, FlexAttention dense
  (document mask) and paged (torch's experimental PagedAttention, page 128).
- ``mixed``: 1-4 prefill chunks (512-8192 tokens over 0-32k of context) plus 0-256 decodes
  (0.5k-32k): one unified launch vs the best dense prefill plus the best dense decode (two launches).
- ``eager``: per-call time without CUDA graphs (``do_bench`` median, and the per-call time of 200
  calls back to back) vs SDPA at batch 1 and 8 x 512-32k tokens (decode, and prefill at 512/2k).
Every benchmarked shape is checked on the GPU: ours (and every dense peer) against an fp32
reference on sampled rows of every sequence; a peer that computes something else is excluded from
"best dense".

Timing: CUDA graphs of back-to-back calls over rotated data sets (L2-cold; docs/BENCHMARKS.md,
"Kernels"), except ``eager``. ``--tune``: the focused sweeps that chose the dispatch constants
(prefill configs, the mixed small-row path and program order, decode configs and the previous
kernel side by side with ``--legacy FILE``, the eager host cost split into wrapper and launch).

    python bench/kernels.py --out DIR [--sections ...] [--budget-s 540] [--legacy OLD_ATTENTION.py]
    python bench/kernels.py --tune --out DIR --legacy OLD_ATTENTION.py

Writes DIR/kernels_h200.csv (DIR/kernels_h200_tune5.csv with --tune) row by row, DIR/env.txt,
DIR/kernels_h200_correctness.txt; prints a summary last (bench/kernels_report.py makes the tables).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import json
import math
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

# kvsim must be installed (``make test`` does; on a GPU machine: pip install --target, or a kvsim/
# folder whose kernels/ links to the repository's): the repository root would shadow it
from kvsim.kernels import (KernelConfig, allocate_kv_cache, paged_attention, reshape_and_cache,
                           unified_attention)
from kvsim.kernels import attention as attn
from kvsim.kernels.reference import gather_kv, reference_unified_attention

NUM_HEADS = 32
HEAD_SIZE = 128
DEVICE = "cuda"
DTYPE = torch.bfloat16
SCALE = HEAD_SIZE ** -0.5
MAX_KV_BYTES = 48e9  # pool of one shape
ROTATE_BYTES = 256 << 20  # > 4x the H200's 60 MB L2: rotating over this much data keeps L2 cold
FIELDS = ["section", "kind", "impl", "layout", "batch", "new_tokens", "context_tokens", "decodes",
          "decode_context", "block_size", "gqa", "num_kv_heads", "partition_size", "tile", "warps", "stages",
          "config", "kv_bytes", "flops", "time_us", "tflops", "tbps", "pct_copy", "pct_copy_same_bytes",
          "loop_us", "max_rel_err", "correct", "note"]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


# ---------------------------------------------------------------------------------------------
# timing

def num_sets(kv_bytes: int) -> int:
    """Distinct data sets to rotate over so that every call reads KV that is not in L2."""
    return max(1, min(256, -(-ROTATE_BYTES // max(kv_bytes, 1))))


def bench_us(fns) -> tuple[float, str]:
    """Median time per call (us) of back-to-back calls captured in one CUDA graph.

    ``fns`` is a list of calls over distinct data sets (rotated so that L2 never holds the data a
    call reads). The graph removes Python launch overhead, as serving engines do; do_bench is the
    fallback for a callable that cannot be captured."""
    fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for f in fns:
        f()
    end.record()
    torch.cuda.synchronize()
    est_ms = max(start.elapsed_time(end) / len(fns), 1e-3)
    n = max(len(fns), min(2000, math.ceil(10.0 / est_ms)))
    n = len(fns) * math.ceil(n / len(fns))
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(n):
                fns[i % len(fns)]()
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            start.record()
            g.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / n)
        del g
        return sorted(times)[len(times) // 2], "graph"
    except Exception as err:  # not capturable: time with do_bench (flushes L2, includes launch gaps)
        torch.cuda.synchronize()
        return 1e3 * triton.testing.do_bench(fns[0], warmup=10, rep=40, return_mode="median"), \
            f"do_bench ({type(err).__name__})"


def eager_us(fn, calls: int = 200) -> tuple[float, float]:
    """(do_bench median per call, per-call time of ``calls`` calls back to back), both in us and
    without a CUDA graph: what a caller pays in eager mode (host work included when it dominates)."""
    t_bench = 1e3 * triton.testing.do_bench(fn, warmup=20, rep=100, return_mode="median")
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return t_bench, (time.perf_counter() - t0) / calls * 1e6


class Writer:
    def __init__(self, path: Path):
        self.rows: list[dict] = []
        self.f = open(path, "w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=FIELDS)
        self.w.writeheader()

    def add(self, **row):
        row = {k: row.get(k, "") for k in FIELDS}
        self.rows.append(row)
        self.w.writerow(row)
        self.f.flush()
        return row


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def copy_bw(num_bytes: int) -> tuple[float, float]:
    """(time_us, TB/s) of the faster of two device-to-device copies moving num_bytes (half read, half
    written): a Triton copy kernel timed like the kernels (CUDA graph, L2-cold rotation), and
    torch's copy_ (cudaMemcpy) under do_bench (in a graph cudaMemcpy runs on the slower copy engines)."""
    n = max(1, num_bytes // 4)  # bf16 elements: n*2 bytes read + n*2 written
    sets = num_sets(num_bytes)
    src = torch.randn(sets, n, device=DEVICE, dtype=DTYPE)
    dst = torch.empty_like(src)
    block = 4096
    t_kernel, _ = bench_us([lambda r=r: _copy_kernel[(triton.cdiv(n, block),)](src[r], dst[r], n, BLOCK=block)
                            for r in range(sets)])
    t_memcpy = 1e3 * triton.testing.do_bench(lambda: dst[0].copy_(src[0]), warmup=10, rep=40, return_mode="median")
    t = min(t_kernel, t_memcpy)
    return t, 4 * n / t / 1e6


# ---------------------------------------------------------------------------------------------
# batches: a paged pool (shuffled blocks) with the K/V of every position, and contiguous copies

@dataclass
class Batch:
    query: torch.Tensor          # [num_tokens, H, D]
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor   # int32 [num_seqs, max_blocks]
    seq_lens: torch.Tensor       # int32 [num_seqs]
    qsl: torch.Tensor            # int32 [num_seqs + 1]
    contexts: list[int]
    q_lens: list[int]
    num_kv_heads: int
    block_size: int

    @property
    def max_seq_len(self) -> int:
        return max(c + q for c, q in zip(self.contexts, self.q_lens))

    @property
    def max_query_len(self) -> int:
        return max(self.q_lens)

    def flops(self) -> float:
        """Useful causal FLOPs: 4 x head_size x heads x (sum over new tokens of positions seen)."""
        seen = sum(q * c + q * (q + 1) // 2 for c, q in zip(self.contexts, self.q_lens))
        return 4.0 * HEAD_SIZE * NUM_HEADS * seen

    def kv_bytes(self) -> int:
        return sum(c + q for c, q in zip(self.contexts, self.q_lens)) * self.num_kv_heads * HEAD_SIZE * 2 * 2

    def ours(self, **tuning):
        tuning.setdefault("max_seq_len", self.max_seq_len)
        tuning.setdefault("max_query_len", self.max_query_len)
        return lambda: unified_attention(self.query, self.key_cache, self.value_cache, self.block_tables,
                                         self.seq_lens, self.qsl, SCALE, validate=False, **tuning)

    def packed_kv(self):
        """Each sequence's K/V gathered in order and concatenated: [sum seq_len, Hkv, D] and cu_seqlens."""
        ks, vs = [], []
        for i, (c, q) in enumerate(zip(self.contexts, self.q_lens)):
            k, v = gather_kv(self.key_cache, self.value_cache, self.block_tables[i], c + q)
            ks.append(k)
            vs.append(v)
        cu_k = torch.tensor([0] + [c + q for c, q in zip(self.contexts, self.q_lens)], device=DEVICE).cumsum(0)
        return torch.cat(ks), torch.cat(vs), cu_k.to(torch.int32)


def build_batch(contexts, q_lens, block_size=16, gqa=4, seed=0) -> Batch:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    hkv = NUM_HEADS // gqa
    seq_lens = [c + q for c, q in zip(contexts, q_lens)]
    per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(per_seq)
    kc, vc = allocate_kv_cache(num_blocks, block_size, hkv, HEAD_SIZE, DTYPE, DEVICE, "flat", fill=0.0)
    kc.normal_(generator=g)
    vc.normal_(generator=g)
    perm = torch.randperm(num_blocks, device=DEVICE, generator=g).to(torch.int32)
    tables = torch.zeros(len(seq_lens), max(per_seq), dtype=torch.int32, device=DEVICE)
    start = 0
    for i, n in enumerate(per_seq):
        tables[i, :n] = perm[start:start + n]
        start += n
    q = torch.randn(sum(q_lens), NUM_HEADS, HEAD_SIZE, device=DEVICE, dtype=DTYPE, generator=g)
    qsl = torch.tensor([0, *q_lens], device=DEVICE).cumsum(0).to(torch.int32)
    return Batch(q, kc, vc, tables, torch.tensor(seq_lens, device=DEVICE, dtype=torch.int32), qsl, list(contexts),
                 list(q_lens), hkv, block_size)


def check_rows(batch: Batch, out: torch.Tensor, max_rows: int = 64, packed=None) -> float:
    """Worst norm-relative error of ``out`` against an fp32 reference (TF32 off) on sampled rows of
    every sequence (its first and last ``max_rows`` new tokens and ``max_rows`` in between)."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        k_all, v_all, cu_k = packed or batch.packed_kv()
        group = NUM_HEADS // batch.num_kv_heads
        worst = 0.0
        start = 0
        g = torch.Generator().manual_seed(0)
        for i, (c, q) in enumerate(zip(batch.contexts, batch.q_lens)):
            if q <= 3 * max_rows:
                rows = torch.arange(q)
            else:
                mid = max_rows + torch.randperm(q - 2 * max_rows, generator=g)[:max_rows]
                rows = torch.cat([torch.arange(max_rows), mid.sort().values, torch.arange(q - max_rows, q)])
            rows = rows.to(DEVICE)
            k = k_all[int(cu_k[i]):int(cu_k[i + 1])].float().repeat_interleave(group, 1).transpose(0, 1)  # [H, L, D]
            v = v_all[int(cu_k[i]):int(cu_k[i + 1])].float().repeat_interleave(group, 1).transpose(0, 1)
            qq = batch.query[start + rows].float().transpose(0, 1)  # [H, n, D]
            s = (qq @ k.transpose(1, 2)) * SCALE
            pos = c + rows
            s.masked_fill_(torch.arange(c + q, device=DEVICE)[None, None, :] > pos[None, :, None], float("-inf"))
            ref = (torch.softmax(s, -1) @ v).transpose(0, 1)  # [n, H, D]
            o = out[start + rows].float()
            worst = max(worst, float((o - ref).norm() / ref.norm()) if torch.isfinite(o).all() else float("inf"))
            start += q
        return worst
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


# ---------------------------------------------------------------------------------------------
# dense peers

def sdpa_fn(q, k, v, backend, causal=False, enable_gqa=True, attn_mask=None):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def fn():
        with sdpa_kernel([be]):
            return sdpa(q, k, v, is_causal=causal, attn_mask=attn_mask, enable_gqa=enable_gqa)
    return fn


def dense_prefill_peers(batch: Batch, packed) -> dict:
    """name -> (callable returning out [num_tokens, H, D]): the dense kernels on the same data."""
    k_all, v_all, cu_k = packed
    group = NUM_HEADS // batch.num_kv_heads
    peers = {}
    cu_q = batch.qsl
    max_q, max_k = batch.max_query_len, batch.max_seq_len

    def flash_varlen():
        return torch.ops.aten._flash_attention_forward(batch.query, k_all, v_all, cu_q, cu_k, max_q, max_k, 0.0,
                                                       True, False, scale=SCALE)[0]
    peers["flash-varlen"] = flash_varlen
    # (cuDNN varlen, aten._cudnn_attention_forward with cu_seqlens, failed with an AcceleratorError on
    # torch 2.11 in the tune run: not a peer)
    n = len(batch.q_lens)
    equal = len(set(batch.q_lens)) == 1 and len(set(batch.contexts)) == 1
    no_ctx = max(batch.contexts) == 0
    if equal or no_ctx:
        # padded: [B, H, max_q, D] over [B, Hkv, max_k, D]; equal lengths pad nothing
        qp = torch.zeros(n, max_q, NUM_HEADS, HEAD_SIZE, device=DEVICE, dtype=DTYPE)
        kp = torch.zeros(n, max_k, batch.num_kv_heads, HEAD_SIZE, device=DEVICE, dtype=DTYPE)
        vp = torch.zeros_like(kp)
        for i, (c, q) in enumerate(zip(batch.contexts, batch.q_lens)):
            qp[i, :q] = batch.query[int(batch.qsl[i]):int(batch.qsl[i]) + q]
            kp[i, :c + q] = k_all[int(cu_k[i]):int(cu_k[i + 1])]
            vp[i, :c + q] = v_all[int(cu_k[i]):int(cu_k[i + 1])]
        qp, kp, vp = (t.transpose(1, 2) for t in (qp, kp, vp))
        rows = torch.cat([torch.arange(q, device=DEVICE) + i * max_q for i, q in enumerate(batch.q_lens)])
        fns = {}
        if no_ctx:  # both start at position 0: SDPA's top-left causal mask is the right one
            fns = {be: sdpa_fn(qp, kp, vp, be, causal=True) for be in ("cudnn", "flash")}
        else:
            # new tokens after a context: the bottom-right causal mask (SDPA sends CausalBias to FA2);
            # cuDNN through its aten op, whose causal alignment the correctness check decides
            from torch.nn.attention.bias import causal_lower_right
            fns["flash"] = sdpa_fn(qp, kp, vp, "flash", attn_mask=causal_lower_right(max_q, max_k))
            ke, ve = kp.repeat_interleave(group, 1), vp.repeat_interleave(group, 1)
            fns["cudnn"] = (lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(
                qp, ke, ve, None, False, 0.0, True, False, scale=SCALE)[0])
        for be, fn in fns.items():
            peers[f"sdpa-{be}-padded"] = (lambda fn=fn: fn().transpose(1, 2).reshape(-1, NUM_HEADS, HEAD_SIZE)[rows])
            peers[f"sdpa-{be}-padded"].timed = fn
    if not equal and no_ctx:
        # per sequence, one launch each (in the graph: no launch gaps)
        for be in ("cudnn", "flash"):
            fns = []
            for i, q in enumerate(batch.q_lens):
                s = int(batch.qsl[i])
                fns.append(sdpa_fn(batch.query[s:s + q].transpose(0, 1)[None],
                                   k_all[int(cu_k[i]):int(cu_k[i + 1])].transpose(0, 1)[None],
                                   v_all[int(cu_k[i]):int(cu_k[i + 1])].transpose(0, 1)[None], be, causal=True))

            def per_seq(fns=fns):
                return torch.cat([f()[0].transpose(0, 1) for f in fns])
            per_seq.timed = (lambda fns=fns: [f() for f in fns])
            peers[f"sdpa-{be}-per-seq"] = per_seq
    return peers


def flex_dense(batch: Batch, packed):
    """FlexAttention on the packed contiguous K/V with a document + causal mask (compiled)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    k_all, v_all, cu_k = packed
    doc_q = torch.repeat_interleave(torch.arange(len(batch.q_lens), device=DEVICE),
                                    torch.tensor(batch.q_lens, device=DEVICE))
    lens = torch.tensor([c + q for c, q in zip(batch.contexts, batch.q_lens)], device=DEVICE)
    doc_k = torch.repeat_interleave(torch.arange(len(batch.q_lens), device=DEVICE), lens)
    pos_k = torch.arange(len(doc_k), device=DEVICE) - cu_k[:-1].long()[doc_k]
    pos_q = torch.cat([c + torch.arange(q, device=DEVICE) for c, q in zip(batch.contexts, batch.q_lens)])

    def mask(b, h, q_idx, kv_idx):
        return (doc_q[q_idx] == doc_k[kv_idx]) & (pos_k[kv_idx] <= pos_q[q_idx])
    bm = create_block_mask(mask, 1, None, len(doc_q), len(doc_k), device=DEVICE)
    compiled = torch.compile(flex_attention, dynamic=False)
    q = batch.query.transpose(0, 1)[None]
    k, v = k_all.transpose(0, 1)[None], v_all.transpose(0, 1)[None]
    fn = (lambda: compiled(q, k, v, block_mask=bm, scale=SCALE, enable_gqa=True))
    out = (lambda: fn()[0].transpose(0, 1))
    out.timed = fn
    return out


def flex_paged(batch: Batch):
    """FlexAttention + torch's experimental PagedAttention over the same pool (page = block size,
    equal lengths: q [B, H, q_len, D], bottom-right causal mask)."""
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    page = batch.block_size
    n, bps = batch.block_tables.shape
    nb, _, hkv, d = batch.key_cache.shape
    kcache = batch.key_cache.view(nb * page, hkv, d).permute(1, 0, 2).unsqueeze(0)
    vcache = batch.value_cache.view(nb * page, hkv, d).permute(1, 0, 2).unsqueeze(0)
    pa = PagedAttention(nb, page, n, device=DEVICE)
    pa.page_table[:, :bps] = batch.block_tables.long()
    rows = torch.arange(n, device=DEVICE)[:, None]
    pa.physical_to_logical[rows, batch.block_tables.long()] = torch.arange(bps, device=DEVICE)[None, :].expand(n, bps)
    pa.capacity[:] = bps * page
    ctx, q_len = batch.contexts[0], batch.q_lens[0]
    mask = create_block_mask(lambda b, h, qi, kv: kv <= qi + ctx, n, None, q_len, bps * page, device=DEVICE,
                             BLOCK_SIZE=page)
    converted = pa.convert_logical_block_mask(mask, kv_len=batch.seq_lens.long())
    compiled = torch.compile(flex_attention, dynamic=False)
    q = batch.query.view(n, q_len, NUM_HEADS, HEAD_SIZE).transpose(1, 2)
    fn = (lambda: compiled(q, kcache, vcache, block_mask=converted, scale=SCALE, enable_gqa=True))
    out = (lambda: fn().transpose(1, 2).reshape(-1, NUM_HEADS, HEAD_SIZE))
    out.timed = fn
    return out


# dispatch-rule variants measured side by side with the rule (``--prefill-variants``,
# ``--mixed-variants``): the module constants of kvsim.kernels.attention they change
VARIANTS = {
    "w8-maxreg128": dict(PREFILL_WARPS=8, PREFILL_MAX_REGISTERS=128),  # two 8-warp programs per SM (the rule)
    "w4": dict(PREFILL_WARPS=4, PREFILL_MAX_REGISTERS=None),  # the rule before 2026-12-01 (255 registers)
    "w8": dict(PREFILL_WARPS=8),
    "w8-t32-s2": dict(PREFILL_WARPS=8, PREFILL_TILE=32, PREFILL_STAGES=2),
    "no-decode-split": dict(SMALL_PARTITION_TOKENS=0),  # the rule before: decodes of a full launch unsplit
    "decode-split-4096": dict(SMALL_PARTITION_TOKENS=4096),
}


@contextlib.contextmanager
def rule(constants: dict):
    """Plan with these constants of kvsim.kernels.attention (plans made inside are dropped after)."""
    saved = {k: getattr(attn, k) for k in constants}
    for k, v in constants.items():
        setattr(attn, k, v)
    attn._PLANS.clear()
    attn._STATIC.clear()
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(attn, k, v)
        attn._PLANS.clear()
        attn._STATIC.clear()


def measure_ours(w, section, name, cfg, batch, packed, meta):
    """Our kernel under ``cfg``: None (the rule), a KernelConfig, or a dict of rule constants."""
    if isinstance(cfg, dict):
        with rule(cfg):
            return measure(w, section, name, batch.ours(), batch, packed, meta, kind="paged", config=cfg)
    return measure(w, section, name, batch.ours(config=cfg), batch, packed, meta, kind="paged", config=cfg or "")


def timed_fn(fn):
    return getattr(fn, "timed", fn)


# ---------------------------------------------------------------------------------------------
# sections

def point_meta(batch: Batch, **extra) -> dict:
    return dict(batch=len(batch.q_lens), new_tokens=sum(batch.q_lens), context_tokens=max(batch.contexts),
                block_size=batch.block_size, gqa=NUM_HEADS // batch.num_kv_heads, num_kv_heads=batch.num_kv_heads,
                flops=f"{batch.flops():.4g}", kv_bytes=batch.kv_bytes(), **extra)


def measure(w, section, impl, fn, batch, packed, meta, kind="dense", check=True, **row):
    """Time ``fn`` (graph), check its output on sampled rows, write a row; returns (time_us, ok)."""
    try:
        err = check_rows(batch, fn(), packed=packed) if check else float("nan")
        t, how = bench_us([timed_fn(fn)])
    except Exception as e:  # a backend that refuses this shape is a result, not a crash
        w.add(section=section, kind=kind, impl=impl, note=f"error: {type(e).__name__}: {str(e)[:150]}", **meta, **row)
        return None, False
    ok = not check or err <= TOL[DTYPE]
    w.add(section=section, kind=kind, impl=impl, time_us=round(t, 2),
          tflops=round(float(meta["flops"]) / t / 1e6, 2), max_rel_err=f"{err:.2e}", correct=ok, note=how,
          **meta, **row)
    return t, ok


PREFILL_POINTS = [  # (contexts, q_lens, gqa, block_size)
    ([0], [512], 4, 16), ([0], [2048], 4, 16), ([0], [8192], 4, 16), ([0], [16384], 4, 16),
    ([0] * 8, [2048] * 8, 4, 16), ([0] * 8, [8192] * 8, 4, 16),
    ([0] * 64, [512] * 64, 4, 16), ([0] * 64, [2048] * 64, 4, 16),
    ([0] * 8, [512, 768, 1024, 1536, 2048, 3072, 4096, 8192], 4, 16),
    ([4096], [512], 4, 16), ([8192], [2048], 4, 16), ([32768], [4096], 4, 16), ([16384] * 8, [2048] * 8, 4, 16),
    ([0] * 8, [2048] * 8, 1, 16), ([0] * 8, [2048] * 8, 8, 16), ([0] * 8, [2048] * 8, 4, 128),
]
FLEX_PREFILL = [([0] * 8, [2048] * 8, 4, 128)]


def ragged_64():
    g = torch.Generator().manual_seed(5)
    return ([0] * 64, [int(x) for x in torch.randint(128, 2049, (64,), generator=g)], 4, 16)


def section_prefill(w, args, t_start, points=None, configs=None, flex=True):
    points = points or PREFILL_POINTS + [ragged_64()]
    summary = []
    for contexts, q_lens, gqa, bs in points:
        torch.cuda.empty_cache()
        if time.time() - t_start > args.budget_s:
            print("budget reached; stopping prefill", flush=True)
            break
        batch = build_batch(contexts, q_lens, bs, gqa)
        packed = batch.packed_kv()
        meta = point_meta(batch)
        ours = {}
        for name, cfg in (configs or {"triton": None}).items():
            ours[name] = measure_ours(w, "prefill", name, cfg, batch, packed, meta)
        best = {}
        for name, fn in dense_prefill_peers(batch, packed).items():
            t, ok = measure(w, "prefill", name, fn, batch, packed, meta)
            if t and ok:
                best[name] = t
        want_flex = flex and not args.no_flex and (contexts, q_lens, gqa, bs) in FLEX_PREFILL
        if want_flex and time.time() - t_start < args.budget_s - 30:
            for name, make in (("flex-dense", lambda: flex_dense(batch, packed)), ("flex-paged", lambda: flex_paged(batch))):
                t0 = time.time()
                try:
                    fn = make()
                except Exception as e:
                    w.add(section="prefill", kind="dense", impl=name, note=f"error: {type(e).__name__}: {str(e)[:150]}",
                          **meta)
                    continue
                t, ok = measure(w, "prefill", name, fn, batch, packed, meta, kind="paged" if "paged" in name else "dense")
                if t and ok and name == "flex-dense":
                    best[name] = t
                print(f"  {name}: {time.time() - t0:.0f}s incl. compile", flush=True)
        t_ours = ours.get("triton", next(iter(ours.values())))[0]
        if best and t_ours:
            name = min(best, key=best.get)
            ratio = best[name] / t_ours  # ours' throughput over the best dense kernel's
            summary.append(ratio)
            print(f"prefill {len(q_lens):3d} seqs x {max(q_lens):6d} new (ctx {max(contexts):6d}) gqa={gqa} bs={bs}: "
                  f"ours {t_ours:9.1f} us {batch.flops() / t_ours / 1e6:6.1f} TFLOP/s; best dense {name} "
                  f"{best[name]:9.1f} us; ours/best throughput {ratio:.3f}"
                  + "".join(f"; {k} {v[0]:.1f}" for k, v in ours.items() if k != "triton" and v[0]), flush=True)
        batch = packed = None  # free the pool before the next point
        torch.cuda.empty_cache()
    return summary


MIXED_POINTS = [  # (chunks [(q_len, context)], num_decodes, decode_context)
    ([(512, 0)], 64, 4096), ([(2048, 8192)], 64, 4096), ([(1024, 4096)] * 2, 256, 2048),
    ([(512, 0)] * 4, 256, 512), ([(8192, 32768)], 16, 32768), ([(2048, 16384)] * 4, 128, 8192),
    ([(512, 4096)], 64, 32768), ([(4096, 0)] * 2, 0, 0), ([(1024, 0)], 8, 16384), ([(8192, 0)] * 4, 32, 2048),
    ([(512, 32768)] * 2, 64, 512),
]


def section_mixed(w, args, t_start, points=None, configs=None):
    ratios = []
    for chunks, n_dec, dec_ctx in points or MIXED_POINTS:
        torch.cuda.empty_cache()
        if time.time() - t_start > args.budget_s:
            print("budget reached; stopping mixed", flush=True)
            break
        contexts = [c for _, c in chunks] + [dec_ctx - 1] * n_dec
        q_lens = [q for q, _ in chunks] + [1] * n_dec
        batch = build_batch(contexts, q_lens, 16, 4)
        packed = batch.packed_kv()
        meta = point_meta(batch, decodes=n_dec, decode_context=dec_ctx)
        ours = {}
        for name, cfg in (configs or {"triton": None}).items():
            ours[name] = measure_ours(w, "mixed", name, cfg, batch, packed, meta)[0]
        # the dense baseline: the best prefill over the chunks + the best decode over the decodes
        n_chunks = len(chunks)
        pre = Batch(batch.query[:sum(q for q, _ in chunks)], batch.key_cache, batch.value_cache,
                    batch.block_tables[:n_chunks], batch.seq_lens[:n_chunks], batch.qsl[:n_chunks + 1],
                    contexts[:n_chunks], q_lens[:n_chunks], batch.num_kv_heads, 16)
        k_all, v_all, cu_k = packed
        pre_packed = (k_all[:int(cu_k[n_chunks])], v_all[:int(cu_k[n_chunks])], cu_k[:n_chunks + 1])
        best_pre = {}
        for name, fn in dense_prefill_peers(pre, pre_packed).items():
            t, ok = measure(w, "mixed", f"prefill:{name}", fn, pre, pre_packed, point_meta(pre))
            if t and ok:
                best_pre[name] = t
        best_dec = {}
        if n_dec:
            dec = Batch(batch.query[-n_dec:], batch.key_cache, batch.value_cache, batch.block_tables[n_chunks:],
                        batch.seq_lens[n_chunks:], None, contexts[n_chunks:], q_lens[n_chunks:], batch.num_kv_heads, 16)
            kd = k_all[int(cu_k[n_chunks]):].view(n_dec, dec_ctx, batch.num_kv_heads, HEAD_SIZE).transpose(1, 2)
            vd = v_all[int(cu_k[n_chunks]):].view(n_dec, dec_ctx, batch.num_kv_heads, HEAD_SIZE).transpose(1, 2)
            kd, vd = kd.contiguous(), vd.contiguous()
            qd = dec.query[:, :, None, :]  # [n_dec, H, 1, D]
            dec_packed = (k_all[int(cu_k[n_chunks]):], v_all[int(cu_k[n_chunks]):], cu_k[n_chunks:] - cu_k[n_chunks])
            for be in ("cudnn", "flash"):
                fn = sdpa_fn(qd, kd, vd, be)
                out = (lambda fn=fn: fn()[:, :, 0, :])
                out.timed = fn
                t, ok = measure(w, "mixed", f"decode:sdpa-{be}", out, dec, dec_packed, point_meta(dec))
                if t and ok:
                    best_dec[be] = t
        if best_pre and (best_dec or not n_dec) and ours.get("triton"):
            base = min(best_pre.values()) + (min(best_dec.values()) if n_dec else 0.0)
            w.add(section="mixed", kind="dense", impl="best-prefill+best-decode", time_us=round(base, 2),
                  note=f"{min(best_pre, key=best_pre.get)} + {min(best_dec, key=best_dec.get) if n_dec else '-'}",
                  **meta)
            ratios.append(ours["triton"] / base)
            print(f"mixed {chunks} + {n_dec} x {dec_ctx}: ours {ours['triton']:9.1f} us; dense prefill "
                  f"{min(best_pre.values()):9.1f} + decode {min(best_dec.values()) if n_dec else 0:8.1f} = "
                  f"{base:9.1f} us; ours/two launches {ours['triton'] / base:.3f}"
                  + "".join(f"; {k} {v:.1f}" for k, v in ours.items() if k != "triton" and v), flush=True)
        batch = packed = None  # free the pool before the next point
        torch.cuda.empty_cache()
    return ratios


# ---- decode: the grid of earlier runs

def make_decode(batch, ctx, block_size, num_kv_heads, sets=1, seed=0):
    """Random bf16 pool with every sequence's blocks shuffled over the pool; query; tables.
    ``sets`` disjoint batches share the pool so that calls can rotate over data not in L2."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    blocks_per_seq = -(-ctx // block_size)
    rows = batch * sets
    num_blocks = rows * blocks_per_seq
    kc, vc = allocate_kv_cache(num_blocks, block_size, num_kv_heads, HEAD_SIZE, DTYPE, DEVICE, "flat", fill=0.0)
    kc.normal_(generator=g)
    vc.normal_(generator=g)
    perm = torch.randperm(num_blocks, device=DEVICE, generator=g).to(torch.int32)
    tables = perm.view(rows, blocks_per_seq)
    lens = torch.full((rows,), ctx, dtype=torch.int32, device=DEVICE)
    q = torch.randn(rows, NUM_HEADS, HEAD_SIZE, device=DEVICE, dtype=DTYPE, generator=g)
    return q, kc, vc, tables, lens


def decode_meta(batch, ctx, block_size, gqa):
    hkv = NUM_HEADS // gqa
    kv_bytes = batch * ctx * hkv * HEAD_SIZE * 2 * DTYPE.itemsize
    return hkv, kv_bytes, dict(batch=batch, context_tokens=ctx, block_size=block_size, gqa=gqa,
                               num_kv_heads=hkv, kv_bytes=kv_bytes)


def decode_grid():
    for batch in (1, 8, 64, 256):
        for ctx in (512, 2048, 8192, 32768) + ((131072,) if batch == 1 else ()):
            for block_size in (16, 128):
                for gqa in (1, 4, 8):
                    yield batch, ctx, block_size, gqa


def decode_check(q, kc, vc, tables, lens, out, batch) -> float:
    """Worst norm-relative error of a decode output against fp32 on up to 4 sequences of set 0."""
    worst = 0.0
    for i in sorted({0, batch - 1, batch // 2, batch // 3}):
        k, v = gather_kv(kc, vc, tables[i], int(lens[i]))
        group = NUM_HEADS // k.shape[1]
        k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
        p = torch.softmax(torch.einsum("hd,lhd->hl", q[i].float(), k) * SCALE, -1)
        ref = torch.einsum("hl,lhd->hd", p, v)
        worst = max(worst, float((out[i].float() - ref).norm() / ref.norm()))
    return worst


def section_decode(w, args, t_start, copy_peak, grid=None, configs=None, legacy=None):
    same_copy_cache: dict[int, float] = {}
    dense_done: dict[tuple, dict] = {}
    for batch, ctx, block_size, gqa in grid or list(decode_grid()):
        if time.time() - t_start > args.budget_s:
            print("budget reached; stopping decode", flush=True)
            break
        hkv, kv_bytes, meta = decode_meta(batch, ctx, block_size, gqa)
        if kv_bytes > MAX_KV_BYTES:
            w.add(section="decode", kind="skip", impl="all", note=f"KV {kv_bytes / 1e9:.0f} GB > "
                  f"{MAX_KV_BYTES / 1e9:.0f} GB", **meta)
            continue
        sets = num_sets(kv_bytes)
        if kv_bytes not in same_copy_cache:
            same_copy_cache[kv_bytes] = copy_bw(kv_bytes)[1]
        same = same_copy_cache[kv_bytes]
        key = (batch, ctx, gqa)
        if key not in dense_done:
            k = torch.randn(sets * batch, hkv, ctx, HEAD_SIZE, device=DEVICE, dtype=DTYPE)
            v = torch.randn_like(k)
            qd = torch.randn(sets * batch, NUM_HEADS, 1, HEAD_SIZE, device=DEVICE, dtype=DTYPE)
            res = {}
            for be in ("cudnn", "flash"):
                fns = [sdpa_fn(qd[r * batch:(r + 1) * batch], k[r * batch:(r + 1) * batch],
                               v[r * batch:(r + 1) * batch], be) for r in range(sets)]
                try:
                    t, how = bench_us(fns)
                    tb = kv_bytes / t / 1e6
                    w.add(section="decode", kind="dense", impl=f"sdpa-{be}", time_us=round(t, 2), tbps=round(tb, 4),
                          pct_copy=round(100 * tb / copy_peak, 2), pct_copy_same_bytes=round(100 * tb / same, 2),
                          note=how, **dict(meta, block_size=0))
                    res[be] = t
                except Exception as err:
                    w.add(section="decode", kind="dense", impl=f"sdpa-{be}", note=f"error: {type(err).__name__}",
                          **dict(meta, block_size=0))
            del k, v
            dense_done[key] = res
        best_dense = min(dense_done[key].values()) if dense_done[key] else None
        q, kc, vc, tables, lens = make_decode(batch, ctx, block_size, hkv, sets=sets)
        impls = {"triton": (paged_attention, None)}
        for name, cfg in (configs or {}).items():
            impls[name] = (paged_attention, cfg)
        if legacy is not None:
            impls["legacy"] = (legacy.paged_attention, None)
        line, ready = {}, {}
        for impl, (fn_, cfg) in impls.items():
            kwargs = dict(max_seq_len=ctx, validate=False)
            if cfg is not None:
                kwargs["config"] = cfg
            fns = [lambda r=r: fn_(q[r * batch:(r + 1) * batch], kc, vc, tables[r * batch:(r + 1) * batch],
                                   lens[r * batch:(r + 1) * batch], SCALE, "flat", **kwargs) for r in range(sets)]
            try:
                ready[impl] = (fns, decode_check(q, kc, vc, tables, lens, fns[0](), batch), [])
            except Exception as e:
                w.add(section="decode", kind="paged", impl=impl, note=f"error: {type(e).__name__}: {str(e)[:150]}",
                      **meta)
        # side by side with the previous kernel: timed in A B B A order, so that a drift of the card's
        # clocks or of the neighbours' load within the point weighs on both alike; after one timing
        # that is thrown away (on the H200 the first timing of a multi-GB pool ran up to 15% slow,
        # whichever kernel took it: bench/results/kernels_h200_kern2.csv)
        order = list(ready) + (list(reversed(ready)) if legacy is not None else [])
        if ready:
            with contextlib.suppress(Exception):
                bench_us(ready[order[0]][0])
        for impl in order:
            if impl not in ready:
                continue
            try:
                ready[impl][2].append(bench_us(ready[impl][0]))
            except Exception as e:
                w.add(section="decode", kind="paged", impl=impl, note=f"error: {type(e).__name__}: {str(e)[:150]}",
                      **meta)
                del ready[impl]
        for impl, (fns, err, timings) in ready.items():
            cfg = impls[impl][1]
            t, how = sum(x for x, _ in timings) / len(timings), timings[0][1]
            if len(timings) > 1:
                how += f"; mean of {len(timings)} (ABBA): " + "/".join(f"{x:.2f}" for x, _ in timings)
            ps, cfg_used = attn.plan_launch(batch, hkv, ctx, HEAD_SIZE, "flat", q.device, None, cfg, gqa)
            tb = kv_bytes / t / 1e6
            note = how + ("" if cfg_used.unmasked_full_tiles else "; all tiles masked")
            if ps is not None and not cfg_used.fused_reduce:
                note += "; separate reduce launch"
            w.add(section="decode", kind="paged", impl=impl, layout="flat", note=note, partition_size=ps or 0,
                  tile=cfg_used.tile_tokens, warps=cfg_used.num_warps, stages=cfg_used.num_stages,
                  config=cfg or "", time_us=round(t, 2), tbps=round(tb, 4), pct_copy=round(100 * tb / copy_peak, 2),
                  pct_copy_same_bytes=round(100 * tb / same, 2), max_rel_err=f"{err:.2e}",
                  correct=err <= TOL[DTYPE], **meta)
            line[impl] = t
        if best_dense and "triton" in line:
            print(f"decode B={batch:4d} L={ctx:6d} bs={block_size:3d} gqa={gqa}: ours {line['triton']:9.2f} us "
                  f"({kv_bytes / line['triton'] / 1e6 / same * 100:5.1f}% same-bytes copy) best dense "
                  f"{best_dense:9.2f} us ratio {line['triton'] / best_dense:.3f}"
                  + "".join(f"; {k} {v:.2f}" for k, v in line.items() if k != "triton"), flush=True)
        kc = vc = None  # free the pool before the next point
        torch.cuda.empty_cache()


# ---- eager mode

EAGER_DECODE = [(b, ctx) for b in (1, 8) for ctx in (512, 2048, 8192, 32768)]
EAGER_PREFILL = [(1, 512), (1, 2048), (8, 512), (8, 2048)]


def section_eager(w, args, t_start, legacy=None):
    gqa = 4
    hkv = NUM_HEADS // gqa
    for batch, ctx in EAGER_DECODE:
        if time.time() - t_start > args.budget_s:
            break
        q, kc, vc, tables, lens = make_decode(batch, ctx, 16, hkv)
        k = torch.randn(batch, hkv, ctx, HEAD_SIZE, device=DEVICE, dtype=DTYPE)
        v = torch.randn_like(k)
        qd = q[:, :, None, :]
        impls = {
            "triton": lambda: paged_attention(q, kc, vc, tables, lens, SCALE, max_seq_len=ctx, validate=False),
            "triton-validate": lambda: paged_attention(q, kc, vc, tables, lens, SCALE),
            "sdpa-cudnn": sdpa_fn(qd, k, v, "cudnn"), "sdpa-flash": sdpa_fn(qd, k, v, "flash")}
        if legacy is not None:
            impls["legacy"] = lambda: legacy.paged_attention(q, kc, vc, tables, lens, SCALE, max_seq_len=ctx,
                                                             validate=False)
        line = {}
        paged = ("triton", "triton-validate", "legacy")
        for impl, fn in impls.items():
            direct = attn._ATTENTION.direct_calls
            try:
                t, loop = eager_us(fn)
                # ours checked after the timing (the launches that skip Triton's binder); SDPA runs on
                # other random data of the same shape
                err = decode_check(q, kc, vc, tables, lens, fn(), batch) if impl in paged else float("nan")
            except Exception as e:
                w.add(section="eager", kind="decode", impl=impl, note=f"error: {type(e).__name__}: {str(e)[:120]}",
                      batch=batch, context_tokens=ctx, gqa=gqa)
                continue
            w.add(section="eager", kind="decode", impl=impl, batch=batch, context_tokens=ctx, new_tokens=batch,
                  gqa=gqa, block_size=16, time_us=round(t, 2), loop_us=round(loop, 2), max_rel_err=f"{err:.2e}",
                  correct=err <= TOL[DTYPE] if impl in paged else "", note="do_bench median; loop_us: 200 calls back to back; direct "
                  f"launches {attn._ATTENTION.direct_calls - direct}")
            line[impl] = (t, loop)
        print(f"eager decode B={batch} L={ctx}: " + "; ".join(f"{k} {a:.1f}/{b:.1f}" for k, (a, b) in line.items())
              + "  (do_bench us / back-to-back us)", flush=True)
        kc = vc = k = v = None
    for batch, q_len in EAGER_PREFILL:
        if time.time() - t_start > args.budget_s:
            break
        b = build_batch([0] * batch, [q_len] * batch, 16, gqa)
        packed = b.packed_kv()
        impls = {"triton": b.ours(), **{k: fn for k, fn in dense_prefill_peers(b, packed).items()
                                        if k in ("flash-varlen", "sdpa-cudnn-padded", "sdpa-flash-padded")}}
        line = {}
        for impl, fn in impls.items():
            try:
                t, loop = eager_us(timed_fn(fn))
                err = check_rows(b, fn(), packed=packed)
            except Exception as e:
                w.add(section="eager", kind="prefill", impl=impl, note=f"error: {type(e).__name__}", batch=batch,
                      new_tokens=batch * q_len, gqa=gqa)
                continue
            w.add(section="eager", kind="prefill", impl=impl, batch=batch, new_tokens=batch * q_len, context_tokens=0,
                  gqa=gqa, block_size=16, time_us=round(t, 2), loop_us=round(loop, 2), max_rel_err=f"{err:.2e}",
                  correct=err <= TOL[DTYPE])
            line[impl] = (t, loop)
        print(f"eager prefill {batch} x {q_len}: " + "; ".join(f"{k} {a:.1f}/{c:.1f}" for k, (a, c) in line.items()),
              flush=True)


# ---- correctness across dtypes and layouts

CORRECTNESS_CASES = [  # (dtype, layout, block_size, gqa, contexts, q_lens, window, partition_size, fused)
    (torch.bfloat16, "flat", 16, 4, [0, 16, 700, 2500, 37, 4095], [1, 1, 1, 1, 1, 1], None, 128, True),
    (torch.bfloat16, "flat", 16, 8, [0, 16, 700, 2500, 37, 4095], [1, 1, 1, 1, 1, 1], None, 128, False),
    (torch.bfloat16, "flat", 16, 4, [0, 5, 700, 1500, 37], [200, 1, 130, 1, 17], None, None, True),
    (torch.bfloat16, "flat", 128, 4, [0, 300, 2000], [600, 1, 64], 256, None, True),
    (torch.bfloat16, "flat", 16, 8, [3000, 20], [4, 7], None, 256, True),
    (torch.bfloat16, "vllm", 16, 4, [0, 5, 700, 1500, 37], [200, 1, 130, 1, 17], None, None, True),
    (torch.bfloat16, "vllm", 16, 4, [16, 700, 2500, 4095], [1, 1, 1, 1], None, 256, True),
    (torch.float16, "flat", 16, 4, [0, 5, 700, 1500, 37], [200, 1, 130, 1, 17], None, 128, False),
    (torch.float16, "vllm", 128, 1, [0, 700, 2500], [200, 1, 50], 100, None, True),
    (torch.float32, "flat", 16, 4, [0, 5, 700, 1500, 37], [200, 1, 130, 1, 17], None, None, True),
    (torch.float32, "flat", 16, 4, [16, 700, 2500, 4095], [1, 1, 1, 1], None, 128, True),
]


def section_correctness(out_dir: Path, cases=None, budget_s=None) -> list[str]:
    """Against float64; shuffled vs identity table bitwise; merge counters back to zero; NaN-poisoned pool."""
    lines = []
    torch.manual_seed(1)
    t0 = time.time()
    for dtype, layout, bs, gqa, contexts, q_lens, window, part, fused in cases or CORRECTNESS_CASES:
        if budget_s is not None and time.time() - t0 > budget_s:
            lines.append("(budget reached: the remaining cases were not run)")
            break
        hkv = NUM_HEADS // gqa
        lens = [c + q for c, q in zip(contexts, q_lens)]
        per = [-(-n // bs) for n in lens]
        nb = sum(per) + 7
        kc, vc = allocate_kv_cache(nb, bs, hkv, HEAD_SIZE, dtype, DEVICE, layout)
        perm = torch.randperm(nb, device=DEVICE)
        tables = torch.zeros(len(lens), max(per), dtype=torch.int32, device=DEVICE)
        start, slots = 0, []
        for i, (n, p) in enumerate(zip(lens, per)):
            tables[i, :p] = perm[start:start + p].to(torch.int32)
            start += p
            pos = torch.arange(n, device=DEVICE)
            slots.append(tables[i, pos // bs].long() * bs + pos % bs)
        slots = torch.cat(slots)
        k = torch.randn(len(slots), hkv, HEAD_SIZE, device=DEVICE).to(dtype)
        v = torch.randn(len(slots), hkv, HEAD_SIZE, device=DEVICE).to(dtype)
        reshape_and_cache(k, v, kc, vc, slots, layout)
        q = torch.randn(sum(q_lens), NUM_HEADS, HEAD_SIZE, device=DEVICE).to(dtype)
        qsl = torch.tensor([0, *q_lens], device=DEVICE).cumsum(0).to(torch.int32)
        sl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
        ws = torch.zeros(4096, dtype=torch.int32, device=DEVICE)
        cfg = None if part is None else attn.plan_attention(
            len(q), len(lens), NUM_HEADS, hkv, HEAD_SIZE, max(lens), max(q_lens), layout, q.device, part,
            None, window).config
        if cfg is not None:
            cfg = KernelConfig(cfg.tile_tokens, cfg.num_warps, cfg.num_stages, cfg.unmasked_full_tiles, fused)

        def run(kc_, vc_, tables_):
            return unified_attention(q, kc_, vc_, tables_, sl, qsl, SCALE, layout, window, partition_size=part,
                                     config=cfg, workspace=ws)
        out = run(kc, vc, tables)
        again = run(kc, vc, tables)
        ids = torch.cat([tables[i, :p] for i, p in enumerate(per)]).long()
        ident = torch.zeros_like(tables)
        start = 0
        for i, p in enumerate(per):
            ident[i, :p] = torch.arange(start, start + p, dtype=torch.int32)
            start += p
        out_ident = run(kc[ids], vc[ids], ident)
        ref = reference_unified_attention(q, kc, vc, tables, sl, qsl, SCALE, layout, window)
        worst, s0 = 0.0, 0
        for n in q_lens:
            rows = slice(s0, s0 + n)
            worst = max(worst, float((out[rows].cpu().double() - ref[rows]).norm() / ref[rows].norm()))
            s0 += n
        bitwise = torch.equal(out, out_ident)
        ok = (worst <= TOL[dtype] and bitwise and torch.equal(out, again) and not ws.any()
              and not torch.isnan(out).any())
        lines.append(f"{'PASS' if ok else 'FAIL'} {str(dtype)[6:]} {layout} bs={bs} gqa={gqa} q_lens={q_lens} "
                     f"contexts={contexts} window={window} partition={part} fused={fused}: max_rel_err={worst:.2e} "
                     f"(tol {TOL[dtype]:.0e}) bitwise_vs_identity={bitwise} counters_zero={not ws.any()}")
        print(lines[-1], flush=True)
    (out_dir / "kernels_h200_correctness.txt").write_text("\n".join(lines) + "\n")
    return lines


# ---------------------------------------------------------------------------------------------

def load_legacy(path):
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("legacy_attention", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


TUNE_CORRECTNESS = [CORRECTNESS_CASES[i] for i in (0, 1, 2, 5, 7, 9)]
TUNE_PREFILL = [PREFILL_POINTS[i] for i in (2, 4, 10, 6)]
TUNE_MIXED = [MIXED_POINTS[i] for i in (0, 2, 5)]
TUNE_DECODE = [(1, 8192, 16, 4), (8, 512, 16, 4), (8, 2048, 16, 8), (64, 512, 16, 8), (1, 512, 16, 4),
               (64, 8192, 16, 4), (256, 2048, 16, 1), (1, 131072, 16, 8)]


def run_tune(w, args, t_start, copy_peak, legacy):
    """The sweeps behind the dispatch constants (a few points each), each section within its own
    share of the time budget."""
    def share(seconds):
        args.budget_s = time.time() - t_start + seconds
    share(45)
    section_correctness(args.out, TUNE_CORRECTNESS)
    print(f"correctness done at {time.time() - t_start:.0f}s", flush=True)
    prefill_cfgs = {"triton": None}
    for rows, tile, warps, stages in ((128, 64, 8, 2), (128, 128, 8, 2), (128, 32, 8, 3), (64, 64, 4, 3),
                                      (128, 64, 4, 3), (64, 128, 4, 2), (128, 64, 8, 4)):
        prefill_cfgs[f"r{rows}t{tile}w{warps}s{stages}"] = KernelConfig(tile, warps, stages, block_rows=rows)
    prefill_cfgs["default-in-order"] = KernelConfig(64, 8, 3, block_rows=128, longest_first=False)
    share(80)
    section_prefill(w, args, t_start, TUNE_PREFILL, prefill_cfgs, flex=False)
    print(f"prefill sweep done at {time.time() - t_start:.0f}s", flush=True)
    mixed_cfgs = {"triton": None, "no-small-path": KernelConfig(64, 8, 3, block_rows=128, small_rows=0),
                  "in-order": KernelConfig(64, 8, 3, block_rows=128, longest_first=False),
                  "rows64": KernelConfig(64, 4, 3, block_rows=64)}
    share(40)
    section_mixed(w, args, t_start, TUNE_MIXED, mixed_cfgs)
    print(f"mixed sweep done at {time.time() - t_start:.0f}s", flush=True)
    share(50)
    section_decode(w, args, t_start, copy_peak, TUNE_DECODE, {"t64w4s3": KernelConfig(64, 4, 3)}, legacy)
    print(f"decode sweep done at {time.time() - t_start:.0f}s", flush=True)
    share(25)
    section_eager(w, args, t_start, legacy)


def dry_run_setup() -> None:
    """--dry-run: the whole script on CPU under the Triton interpreter with tiny shapes and a wall
    clock instead of CUDA timing, to check its logic before spending GPU time (figures meaningless)."""
    g = globals()
    if not attn.interpreting():
        raise SystemExit("--dry-run needs TRITON_INTERPRET=1 in the environment")
    g.update(DEVICE="cpu", NUM_HEADS=4, HEAD_SIZE=32, SCALE=32 ** -0.5, DTYPE=torch.float16, ROTATE_BYTES=1 << 16)
    TOL[torch.float16] = 2e-3

    def wall_us(fns):
        fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
        t0 = time.perf_counter()
        for f in fns:
            f()
        return (time.perf_counter() - t0) / len(fns) * 1e6, "wall (dry run)"

    def wall_eager(fn, calls=2):
        return wall_us([fn] * calls)[0], wall_us([fn] * calls)[0]
    g.update(bench_us=wall_us, eager_us=wall_eager, copy_bw=lambda n: (1.0, 1.0))
    g["PREFILL_POINTS"][:] = [([0], [40], 2, 16), ([0, 0], [20, 70], 2, 16), ([30], [17], 2, 16)]
    g["FLEX_PREFILL"][:] = []
    g["MIXED_POINTS"][:] = [([(40, 0)], 3, 50), ([(17, 30)] * 2, 0, 0)]
    g["EAGER_DECODE"][:] = [(1, 40)]
    g["EAGER_PREFILL"][:] = [(1, 20)]
    g["CORRECTNESS_CASES"][:] = [(torch.float16, "flat", 16, 2, [0, 30], [20, 1], None, 32, True),
                                 (torch.float32, "vllm", 16, 2, [0, 30], [20, 1], 8, None, True)]
    g["decode_grid"] = lambda: iter([(1, 40, 16, 2), (2, 100, 16, 1)])
    g["ragged_64"] = lambda: ([0, 0, 0], [5, 9, 33], 2, 16)
    g.update(TUNE_CORRECTNESS=g["CORRECTNESS_CASES"][:1], TUNE_PREFILL=g["PREFILL_POINTS"][:1],
             TUNE_MIXED=g["MIXED_POINTS"][:1], TUNE_DECODE=[(1, 40, 16, 2)])


# a run plan's keys (the options of the same name) -> how a JSON value is written on the command line
_PLAN_OPTIONS = dict(
    decode_points=lambda v: ",".join(":".join(map(str, p)) for p in v),
    mixed_points=lambda v: ",".join(map(str, v)), mixed_variants=",".join,
    prefill_points=lambda v: ",".join(map(str, v)), prefill_variants=",".join,
    correctness_cases=lambda v: ",".join(map(str, v)),
    shares=lambda v: ",".join(f"{k}={x}" for k, x in v.items()))
_OPTION_DEFAULTS = dict(mixed_variants="rows64", prefill_variants="", shares="")


def apply_plan(args, plan: dict) -> None:
    """Fill the options the command line left out from a run plan, then the defaults."""
    unknown = set(plan) - set(_PLAN_OPTIONS)
    if unknown:
        raise SystemExit(f"{args.plan}: unknown plan keys {sorted(unknown)} (known: {sorted(_PLAN_OPTIONS)})")
    for option, value in plan.items():
        if getattr(args, option) is None:
            setattr(args, option, _PLAN_OPTIONS[option](value))
    for option, default in _OPTION_DEFAULTS.items():
        if getattr(args, option) is None:
            setattr(args, option, default)
    unknown = {v for spec in (args.mixed_variants, args.prefill_variants) for v in spec.split(",")
               if v and v != "rows64" and v not in VARIANTS}
    if unknown:
        raise SystemExit(f"unknown rule variants {sorted(unknown)} (known: {sorted(VARIANTS)}, rows64)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sections", default="correctness,decode,prefill,mixed,eager")
    ap.add_argument("--tune", action="store_true", help="the focused sweeps behind the dispatch constants")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop measuring after this")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--legacy", help="a previous kernels/attention.py to time side by side (decode, eager)")
    ap.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes: check the script itself")
    ap.add_argument("--decode-points", help="only these decode points, BATCH:CONTEXT:BLOCK:GQA,... (with --legacy: "
                    "side by side with the previous kernel)")
    ap.add_argument("--prefill-points", help="indices into PREFILL_POINTS (default: all and a ragged 64)")
    ap.add_argument("--mixed-points", help="indices into MIXED_POINTS (default: all)")
    ap.add_argument("--correctness-cases", help="indices into CORRECTNESS_CASES (default: all but the last)")
    ap.add_argument("--prefill-variants", help=f"rule variants timed beside the rule: {sorted(VARIANTS)}")
    ap.add_argument("--mixed-variants", help="rule variants (or rows64: 64-row programs; the default)")
    ap.add_argument("--shares", help="share of the budget per section, e.g. decode=0.4,mixed=0.2")
    ap.add_argument("--plan", type=Path, help="a JSON run plan (bench/kernels_h200_plan.json; the one that "
                    "bench/codegen_sm90.py precompiles): the options above that the command line leaves out")
    args = ap.parse_args()
    apply_plan(args, json.loads(args.plan.read_text()) if args.plan else {})
    if args.dry_run:
        dry_run_setup()
    t_start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    w = Writer(args.out / ("kernels_h200_tune5.csv" if args.tune else "kernels_h200.csv"))
    dev_name = (lambda p: f"{p.name}, {p.multi_processor_count} SMs")(torch.cuda.get_device_properties(0)) \
        if DEVICE == "cuda" else "CPU (dry run)"
    env = (f"# {dev_name}, torch {torch.__version__}, triton {triton.__version__}, "
           f"python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(env, flush=True)
    (args.out / "env.txt").write_text(env + "\n")
    legacy = load_legacy(args.legacy)
    t_copy, copy_peak = copy_bw(4 << 30)
    w.add(section="decode", kind="copy", impl="torch.copy_", kv_bytes=4 << 30, time_us=round(t_copy, 2),
          tbps=round(copy_peak, 4), pct_copy=100.0)
    print(f"copy: {copy_peak:.3f} TB/s", flush=True)
    decode_points = [tuple(int(x) for x in p.split(":")) for p in args.decode_points.split(",")] \
        if args.decode_points else None
    if args.tune:
        run_tune(w, args, t_start, copy_peak, legacy)
    else:
        sections = args.sections.split(",")
        total = args.budget_s
        # each section within its share of the budget, so that a slow one cannot starve the rest
        shares = dict(correctness=0.07, eager=0.07, mixed=0.13, prefill=0.25, decode=0.48)
        shares.update({k: float(v) for k, v in (x.split("=") for x in args.shares.split(",") if x)})
        share_sum = sum(shares[x] for x in sections)
        pick = lambda items, spec: [items[int(i)] for i in spec.split(",")] if spec else None  # noqa: E731
        variants = lambda spec: {"triton": None, **{  # noqa: E731
            v: KernelConfig(64, 4, 3, block_rows=64, small_unmasked_full_tiles=False) if v == "rows64" else VARIANTS[v]
            for v in spec.split(",") if v}}
        cases = pick(CORRECTNESS_CASES, args.correctness_cases) or CORRECTNESS_CASES[:-1]
        runs = dict(correctness=lambda: section_correctness(args.out, cases, total * shares["correctness"] / share_sum),
                    eager=lambda: section_eager(w, args, t_start, legacy),
                    mixed=lambda: section_mixed(w, args, t_start, pick(MIXED_POINTS, args.mixed_points),
                                                variants(args.mixed_variants)),
                    prefill=lambda: section_prefill(w, args, t_start, pick(PREFILL_POINTS, args.prefill_points),
                                                    variants(args.prefill_variants)),
                    decode=lambda: section_decode(w, args, t_start, copy_peak, grid=decode_points,
                                                  legacy=legacy if decode_points else None))
        for name in ("correctness", "eager", "mixed", "prefill", "decode"):
            if name in sections:
                args.budget_s = time.time() - t_start + total * shares[name] / share_sum
                runs[name]()
                print(f"{name} done at {time.time() - t_start:.0f}s", flush=True)
    summarize(w.rows)
    print(f"total {time.time() - t_start:.0f}s", flush=True)
    return 0


def summarize(rows):
    """Short summary per section (bench/kernels_report.py has the full tables)."""
    import collections
    by = collections.defaultdict(dict)
    for r in rows:
        if r["time_us"] != "" and r["correct"] in ("", True, "True"):
            key = (r["section"], r["batch"], r["new_tokens"], r["context_tokens"], r["decodes"], r["block_size"],
                   r["gqa"])
            by[key][r["impl"]] = float(r["time_us"])
    pre = [min(t for k, t in d.items() if k.startswith(("flash", "sdpa", "cudnn", "flex-dense"))) / d["triton"]
           for key, d in by.items() if key[0] == "prefill" and "triton" in d
           and any(k.startswith(("flash", "sdpa", "cudnn", "flex-dense")) for k in d)]
    if pre:
        print(f"prefill: ours/best dense throughput geomean {geomean(pre):.3f}, min {min(pre):.3f} over {len(pre)} "
              "points (target >= 0.8, min >= 0.6)")
    mix = [d["triton"] / d["best-prefill+best-decode"] for key, d in by.items()
           if key[0] == "mixed" and "triton" in d and "best-prefill+best-decode" in d]
    if mix:
        print(f"mixed: ours/two dense launches geomean {geomean(mix):.3f}, max {max(mix):.3f} over {len(mix)} points "
              "(target < 1)")
    dense = ("flash", "sdpa", "cudnn", "flex-dense", "prefill:", "decode:", "best-")
    for section in ("prefill", "mixed"):
        names = sorted({k for key, d in by.items() if key[0] == section for k in d
                        if not k.startswith(dense) and k not in ("triton", "flex-paged")})
        for v in names:
            if section == "prefill":
                xs = [min(t for k, t in d.items() if k.startswith(dense[:4])) / d[v] for key, d in by.items()
                      if key[0] == section and v in d and any(k.startswith(dense[:4]) for k in d)]
                what = "ours/best dense throughput"
            else:
                xs = [d[v] / d["best-prefill+best-decode"] for key, d in by.items()
                      if key[0] == section and v in d and "best-prefill+best-decode" in d]
                what = "ours/two dense launches"
            if xs:
                print(f"{section} variant {v}: {what} geomean {geomean(xs):.3f} over {len(xs)} points")
    for key, d in by.items():
        if key[0] == "eager" and "triton" in d:
            sdpa = {k: t for k, t in d.items() if k.startswith(("sdpa", "flash"))}
            if sdpa:
                best = min(sdpa, key=sdpa.get)
                print(f"eager {key[1]} x {key[3] or key[2]}: triton {d['triton']:.1f} us, {best} {sdpa[best]:.1f} us"
                      + (f", legacy {d['legacy']:.1f} us" if "legacy" in d else "")
                      + f" (target: triton <= sdpa: {'met' if d['triton'] <= sdpa[best] else 'not met'})")
    dec = [r for r in rows if r["section"] == "decode" and r["impl"] == "triton" and r["time_us"] != ""]
    if dec:
        same = [float(r["pct_copy_same_bytes"]) for r in dec]
        dense = {}
        for r in rows:
            if r["section"] == "decode" and r["kind"] == "dense" and r["time_us"] != "":
                k = (r["batch"], r["context_tokens"], r["gqa"])
                dense[k] = min(dense.get(k, 1e18), float(r["time_us"]))
        ratios = [float(r["time_us"]) / dense[(r["batch"], r["context_tokens"], r["gqa"])] for r in dec
                  if (r["batch"], r["context_tokens"], r["gqa"]) in dense]
        print(f"decode: {len(dec)} points, geomean {geomean(same):.1f}% of a same-bytes copy (target >= 85); "
              f"within 5% of best dense: {sum(x <= 1.05 for x in ratios)}/{len(ratios)} (target >= 91/100); "
              f"geomean ours/dense {geomean(ratios):.3f}")
        leg = {(r["batch"], r["context_tokens"], r["block_size"], r["gqa"]): float(r["time_us"]) for r in rows
               if r["section"] == "decode" and r["impl"] == "legacy" and r["time_us"] != ""}
        vs = [float(r["time_us"]) / leg[(r["batch"], r["context_tokens"], r["block_size"], r["gqa"])] for r in dec
              if (r["batch"], r["context_tokens"], r["block_size"], r["gqa"]) in leg]
        if vs:
            print(f"decode: ours/previous kernel geomean {geomean(vs):.3f}, max {max(vs):.3f} over {len(vs)} points")
    bad = [r for r in rows if r["correct"] in (False, "False") and r["kind"] == "paged"]
    print(f"correctness of ours on benchmarked shapes: {sum(r['correct'] in (True, 'True') for r in rows)} checks "
          f"passed, {len(bad)} of ours failed")


if __name__ == "__main__":
    sys.exit(main())
