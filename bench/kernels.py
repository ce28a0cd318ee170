"""Paged decode attention on a CUDA GPU: correctness, achieved bandwidth, and peers, in one run.

Bandwidth = bytes of K/V the kernel must read (every token of every sequence once, per KV head)
divided by the median time of ``triton.testing.do_bench`` (which flushes L2 before every call),
reported against a device-to-device copy measured in the same run (bytes read + written).

Peers on the same shapes: dense SDPA on contiguous KV (cuDNN and FlashAttention backends),
torch FlexAttention with its experimental PagedAttention (page 128, compiled; a few shapes:
compiling is slow), and gather-then-SDPA (torch indexing builds contiguous KV, then SDPA).

Usage (on the GPU machine)::

    python bench/kernels.py --tune --out DIR       # a few points + tuning sweeps (minutes)
    python bench/kernels.py --tune-split --no-flex --out DIR   # split-KV partitions, fused vs separate merge
    python bench/kernels.py --out DIR              # the full grid -> DIR/kernels_h200.csv

Prints a summary table last; writes CSV rows as they are measured so a run cut short keeps them.
"""
from __future__ import annotations

import argparse
import csv
import math
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kvsim.kernels import KernelConfig, allocate_kv_cache, paged_attention, reshape_and_cache  # noqa: E402
from kvsim.kernels.attention import attention_workspace, num_sms, plan_launch, plan_partitions  # noqa: E402
from kvsim.kernels.reference import gather_kv  # noqa: E402

NUM_HEADS = 32
HEAD_SIZE = 128
DTYPE = torch.bfloat16
MAX_KV_BYTES = 48e9  # pool of one shape; gather-then-SDPA needs twice that
FIELDS = ["kind", "impl", "layout", "batch", "context_tokens", "block_size", "gqa", "num_kv_heads",
          "partition_size", "tile", "warps", "stages", "kv_bytes", "time_us", "tbps", "pct_copy",
          "pct_copy_same_bytes", "note"]


ROTATE_BYTES = 256 << 20  # > 4x the H200's 60 MB L2: rotating over this much data keeps L2 cold


def num_sets(kv_bytes: int) -> int:
    """Distinct data sets to rotate over so that every call reads KV that is not in L2."""
    return max(1, min(256, -(-ROTATE_BYTES // kv_bytes)))


def bench_us(fns) -> tuple[float, str]:
    """Median time per call (us) of back-to-back calls captured in one CUDA graph.

    ``fns`` is a list of calls over distinct data sets (rotated so that L2 never holds the data a
    call reads; see num_sets). The graph removes Python launch overhead, as serving engines do for
    decode; do_bench is the fallback for a callable that cannot be captured."""
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
    src = torch.randn(sets, n, device="cuda", dtype=DTYPE)
    dst = torch.empty_like(src)
    block = 4096
    t_kernel, _ = bench_us([lambda r=r: _copy_kernel[(triton.cdiv(n, block),)](src[r], dst[r], n, BLOCK=block)
                            for r in range(sets)])
    t_memcpy = 1e3 * triton.testing.do_bench(lambda: dst[0].copy_(src[0]), warmup=10, rep=40, return_mode="median")
    t = min(t_kernel, t_memcpy)
    return t, 4 * n / t / 1e6


def make_shape(batch, ctx, block_size, num_kv_heads, layout="flat", seed=0, sets=1):
    """Random bf16 pool with every sequence's blocks shuffled over the pool; query; tables.

    ``sets`` disjoint batches share the pool (query and tables have sets*batch rows; set r is rows
    [r*batch, (r+1)*batch)), so calls can rotate over data that is not in L2."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    blocks_per_seq = -(-ctx // block_size)
    batch = batch * sets
    num_blocks = batch * blocks_per_seq
    kc, vc = allocate_kv_cache(num_blocks, block_size, num_kv_heads, HEAD_SIZE, DTYPE, "cuda", layout,
                               fill=0.0)
    kc.normal_(generator=g)
    vc.normal_(generator=g)
    perm = torch.randperm(num_blocks, device="cuda", generator=g).to(torch.int32)
    tables = perm.view(batch, blocks_per_seq)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, NUM_HEADS, HEAD_SIZE, device="cuda", dtype=DTYPE, generator=g)
    return q, kc, vc, tables, lens


def ours(w, q, kc, vc, tables, lens, layout, meta, copy_peak, same_copy, partition_size=None,
         config=None, impl="triton"):
    ctx, batch = meta["context_tokens"], meta["batch"]
    scale = HEAD_SIZE ** -0.5
    fns = [lambda r=r: paged_attention(q[r * batch:(r + 1) * batch], kc, vc, tables[r * batch:(r + 1) * batch],
                                       lens[r * batch:(r + 1) * batch], scale, layout, partition_size,
                                       max_seq_len=ctx, validate=False, config=config)
           for r in range(q.shape[0] // batch)]
    ps, cfg = plan_launch(batch, meta["num_kv_heads"], ctx, HEAD_SIZE, layout, q.device, partition_size, config,
                          meta["gqa"])
    if ps is not None:
        cfg = replace(cfg, tile_tokens=min(cfg.tile_tokens, ps & -ps))
    t, how = bench_us(fns)
    tb = meta["kv_bytes"] / t / 1e6
    note = how + ("" if cfg.unmasked_full_tiles else "; all tiles masked")
    if ps is not None and not cfg.fused_reduce:
        note += "; separate reduce launch"
    w.add(kind="paged", impl=impl, layout=layout, note=note, partition_size=ps or 0, tile=cfg.tile_tokens,
          warps=cfg.num_warps, stages=cfg.num_stages, time_us=round(t, 2), tbps=round(tb, 4),
          pct_copy=round(100 * tb / copy_peak, 2), pct_copy_same_bytes=round(100 * tb / same_copy, 2),
          **meta)
    return t


def peer(w, impl, fns, meta, copy_peak, same_copy, kind="dense"):
    try:
        t, how = bench_us(fns)
    except Exception as err:  # a backend that refuses this shape is a result, not a crash
        w.add(kind=kind, impl=impl, note=f"error: {type(err).__name__}: {str(err)[:120]}", **meta)
        return None
    tb = meta["kv_bytes"] / t / 1e6
    w.add(kind=kind, impl=impl, time_us=round(t, 2), tbps=round(tb, 4), pct_copy=round(100 * tb / copy_peak, 2),
          pct_copy_same_bytes=round(100 * tb / same_copy, 2), note=how, **meta)
    return t


def sdpa_fn(q, k, v, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def fn():
        with sdpa_kernel([be]):
            return sdpa(q, k, v, enable_gqa=True)
    return fn


DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def correctness(out_dir: Path, dtypes=DTYPES) -> list[str]:
    """GPU correctness: fp32/fp16/bf16 vs float64, both layouts, v1/v2, shuffled vs identity bitwise,
    the fused split-KV merge bitwise equal to the separate reduce launch, counters back to zero."""
    lines = []
    torch.manual_seed(1)
    tols = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
    for layout in ("flat", "vllm"):
        for dtype, tol in ((d, tols[d]) for d in dtypes):
            for block_size, gqa, part in ((16, 4, None), (128, 8, 256), (16, 1, 128), (256, 4, 512)):
                hkv = NUM_HEADS // gqa
                lens = torch.tensor([1, 17, 700, 2500, 4096, 3], device="cuda", dtype=torch.int32)
                bps = -(-int(lens.max()) // block_size)
                nb = len(lens) * bps + 7
                kc, vc = allocate_kv_cache(nb, block_size, hkv, HEAD_SIZE, dtype, "cuda", layout)
                perm = torch.randperm(nb, device="cuda")[: len(lens) * bps].view(len(lens), bps)
                tables = perm.to(torch.int32)
                slots = torch.cat([tables[i, torch.arange(int(n), device="cuda") // block_size].long() * block_size
                                   + torch.arange(int(n), device="cuda") % block_size
                                   for i, n in enumerate(lens)])
                k = torch.randn(len(slots), hkv, HEAD_SIZE, device="cuda").to(dtype)
                v = torch.randn(len(slots), hkv, HEAD_SIZE, device="cuda").to(dtype)
                reshape_and_cache(k, v, kc, vc, slots, layout)
                q = torch.randn(len(lens), NUM_HEADS, HEAD_SIZE, device="cuda").to(dtype)
                scale = HEAD_SIZE ** -0.5
                workspace = attention_workspace(len(lens), hkv, "cuda")
                out = paged_attention(q, kc, vc, tables, lens, scale, layout, part, workspace=workspace)
                again = paged_attention(q, kc, vc, tables, lens, scale, layout, part, workspace=workspace)
                fused_ok = torch.equal(out, again) and not workspace.any()
                if part is not None:  # the merge fused and as a separate launch (other merge steps: rounding)
                    ps, cfg = plan_launch(len(lens), hkv, int(lens.max()), HEAD_SIZE, layout, q.device, part)
                    for fused in (True, False):
                        other = paged_attention(q, kc, vc, tables, lens, scale, layout, part,
                                                config=replace(cfg, fused_reduce=fused)).double()
                        fused_ok &= bool((out.double() - other).norm() <= tol * other.norm())
                # identity table: the same sequences' blocks copied contiguously, same kernel
                ident_k, ident_v = allocate_kv_cache(len(lens) * bps, block_size, hkv, HEAD_SIZE, dtype,
                                                     "cuda", layout)
                flat_ids = tables.flatten().long()
                ident_k.copy_(kc[flat_ids])
                ident_v.copy_(vc[flat_ids])
                ident_tables = torch.arange(len(lens) * bps, device="cuda", dtype=torch.int32).view(len(lens), bps)
                out_ident = paged_attention(q, ident_k, ident_v, ident_tables, lens, scale, layout, part)
                # the other tile loop (every tile masked; large flat v1 launches use it)
                out_masked = paged_attention(q, kc, vc, tables, lens, scale, layout, part,
                                             config=KernelConfig(64, unmasked_full_tiles=False))
                worst = 0.0
                for i, n in enumerate(lens.tolist()):
                    kk, vv = gather_kv(kc, vc, tables[i], n, layout)
                    ref = torch.nn.functional.scaled_dot_product_attention(
                        q[i].double()[None, :, None], kk.double().transpose(0, 1)[None],
                        vv.double().transpose(0, 1)[None], scale=scale, enable_gqa=True)[0, :, 0]
                    for o in (out, out_masked):
                        worst = max(worst, ((o[i].double() - ref).norm() / ref.norm()).item())
                ok = worst <= tol and torch.equal(out, out_ident) and not torch.isnan(out).any() and fused_ok
                lines.append(f"{'PASS' if ok else 'FAIL'} {layout} {str(dtype)[6:]} bs={block_size} gqa={gqa} "
                             f"part={part} max_rel_err={worst:.2e} (tol {tol:.0e}) "
                             f"bitwise_vs_identity={torch.equal(out, out_ident)} "
                             f"fused_and_separate_merge_agree={fused_ok}")
    (out_dir / "kernels_h200_correctness.txt").write_text("\n".join(lines) + "\n")
    return lines


def flex_paged(q, kc, vc, tables, lens, page):
    """FlexAttention + torch's experimental PagedAttention over the same pool (flat -> (1,H,N,D))."""
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    batch, bps = tables.shape
    nb, _, hkv, d = kc.shape
    kcache = kc.view(nb * page, hkv, d).permute(1, 0, 2).unsqueeze(0)  # (1, Hkv, N, D) strided view
    vcache = vc.view(nb * page, hkv, d).permute(1, 0, 2).unsqueeze(0)
    pa = PagedAttention(nb, page, batch, device="cuda")
    pa.page_table[:, :bps] = tables.long()
    rows = torch.arange(batch, device="cuda")[:, None]
    pa.physical_to_logical[rows, tables.long()] = torch.arange(bps, device="cuda")[None, :].expand(batch, bps)
    pa.capacity[:] = bps * page
    ctx = int(lens[0])
    mask = create_block_mask(lambda b, h, qi, kv: kv < ctx, batch, None, 1, bps * page,
                             device="cuda", BLOCK_SIZE=page)
    converted = pa.convert_logical_block_mask(mask, kv_len=lens.long())
    compiled = torch.compile(flex_attention, dynamic=False)
    qq = q[:, :, None, :]
    return lambda: compiled(qq, kcache, vcache, block_mask=converted, enable_gqa=True)


TUNE_POINTS = [(1, 512, 16, 8), (1, 2048, 16, 8), (1, 8192, 16, 4), (1, 32768, 16, 8), (1, 32768, 128, 1),
               (1, 131072, 128, 8), (8, 2048, 16, 8), (8, 8192, 16, 4), (8, 32768, 128, 1), (64, 512, 16, 8),
               (64, 4096, 16, 4), (64, 32768, 16, 8), (256, 2048, 16, 1), (256, 512, 128, 8)]
FLEX_POINTS = [(64, 4096, 128, 4), (1, 131072, 128, 8), (8, 8192, 128, 4), (256, 2048, 128, 8),
               (1, 32768, 128, 1), (64, 4096, 128, 1)]


def point_meta(batch, ctx, block_size, gqa):
    """(num_kv_heads, KV bytes read, CSV fields) of one grid point."""
    hkv = NUM_HEADS // gqa
    kv_bytes = batch * ctx * hkv * HEAD_SIZE * 2 * DTYPE.itemsize
    return hkv, kv_bytes, dict(batch=batch, context_tokens=ctx, block_size=block_size, gqa=gqa,
                               num_kv_heads=hkv, kv_bytes=kv_bytes)


def full_grid():
    for batch in (1, 8, 64, 256):
        for ctx in (512, 2048, 8192, 32768) + ((131072,) if batch == 1 else ()):
            for block_size in (16, 128):
                for gqa in (1, 4, 8):
                    yield batch, ctx, block_size, gqa


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tune", action="store_true", help="tuning sweeps (tiles, partitions) on a few points")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop measuring after this")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--no-correctness", action="store_true")
    ap.add_argument("--tune-split", action="store_true",
                    help="split-KV partition sweep, fused merge vs a separate reduce launch (small shapes)")
    args = ap.parse_args()
    t_start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    name = "kernels_h200_tune.csv" if args.tune else "kernels_h200_tune5.csv" if args.tune_split else "kernels_h200.csv"
    w = Writer(args.out / name)
    dev = torch.cuda.get_device_properties(0)
    env = (f"# {dev.name}, {dev.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}, "
           f"python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(env, flush=True)
    (args.out / "env.txt").write_text(env + "\n")
    if not args.no_correctness:
        for line in correctness(args.out, (torch.bfloat16,) if args.tune_split else DTYPES):
            print(line, flush=True)
        print(f"correctness done at {time.time() - t_start:.0f}s", flush=True)

    t_copy, copy_peak = copy_bw(4 << 30)
    w.add(kind="copy", impl="torch.copy_", kv_bytes=4 << 30, time_us=round(t_copy, 2), tbps=round(copy_peak, 4),
          pct_copy=100.0)
    print(f"copy: {copy_peak:.3f} TB/s", flush=True)
    same_copy_cache: dict[int, float] = {}
    dense_done: dict[tuple, dict] = {}
    if args.tune_split:
        return tune_split(w, args, t_start, copy_peak)
    grid = TUNE_POINTS if args.tune else list(full_grid())
    for batch, ctx, block_size, gqa in grid:
        if time.time() - t_start > args.budget_s:
            print("budget reached; stopping", flush=True)
            break
        hkv, kv_bytes, meta = point_meta(batch, ctx, block_size, gqa)
        if kv_bytes > MAX_KV_BYTES:
            w.add(kind="skip", impl="all", note=f"KV {kv_bytes / 1e9:.0f} GB > {MAX_KV_BYTES / 1e9:.0f} GB", **meta)
            continue
        sets = num_sets(kv_bytes)
        if kv_bytes not in same_copy_cache:
            same_copy_cache[kv_bytes] = copy_bw(kv_bytes)[1]
        same = same_copy_cache[kv_bytes]
        key = (batch, ctx, gqa)
        if key not in dense_done:
            # contiguous KV [sets*B, Hkv, L, D] for the dense peers
            k = torch.randn(sets * batch, hkv, ctx, HEAD_SIZE, device="cuda", dtype=DTYPE)
            v = torch.randn_like(k)
            qd = torch.randn(sets * batch, NUM_HEADS, 1, HEAD_SIZE, device="cuda", dtype=DTYPE)
            res = {}
            for be in ("cudnn", "flash"):
                fns = [sdpa_fn(qd[r * batch:(r + 1) * batch], k[r * batch:(r + 1) * batch],
                               v[r * batch:(r + 1) * batch], be) for r in range(sets)]
                res[be] = peer(w, f"sdpa-{be}", fns, dict(meta, block_size=0), copy_peak, same)
            del k, v
            dense_done[key] = res
        times = [t for t in dense_done[key].values() if t]
        best_dense = min(times) if times else None
        q, kc, vc, tables, lens = make_shape(batch, ctx, block_size, hkv, sets=sets)
        t_auto = ours(w, q, kc, vc, tables, lens, "flat", meta, copy_peak, same)
        ours(w, q, kc, vc, tables, lens, "flat", meta, copy_peak, same, partition_size=1 << 30, impl="triton-v1")
        if best_dense:
            print(f"B={batch:4d} L={ctx:6d} bs={block_size:3d} gqa={gqa}: ours {t_auto:9.2f} us "
                  f"({meta['kv_bytes'] / t_auto / 1e6 / copy_peak * 100:5.1f}% copy)  best dense "
                  f"{best_dense:9.2f} us  ratio {t_auto / best_dense:.3f}", flush=True)
        if args.tune:
            swept = set()
            for nparts in (2, 4, 8, 16, 32, 64, 128, 256):
                ps = 64 * math.ceil(ctx / nparts / 64)
                if ps < ctx and ps not in swept:
                    swept.add(ps)
                    ours(w, q, kc, vc, tables, lens, "flat", meta, copy_peak, same, partition_size=ps,
                         impl="triton-v2-sweep")
            if (batch, ctx, block_size, gqa) in {(1, 32768, 16, 8), (64, 4096, 16, 4), (8, 32768, 128, 1)}:
                for tile, warps, stages in ((32, 4, 2), (64, 4, 3), (64, 8, 2), (128, 4, 2), (128, 8, 3),
                                            (64, 4, 4), (32, 2, 2), (64, 2, 2)):
                    ours(w, q, kc, vc, tables, lens, "flat", meta, copy_peak, same,
                         config=KernelConfig(tile, warps, stages), impl="triton-tune")
        else:
            ps = plan_partitions(batch, hkv, ctx, 64, num_sms(q.device))
            ours(w, q, kc, vc, tables, lens, "flat", meta, copy_peak, same,
                 partition_size=ps if ps else max(64, min(512, ctx // 2) // 64 * 64), impl="triton-v2")
        if 2 * kv_bytes * sets <= MAX_KV_BYTES:
            def gather_sdpa(r):
                rows = slice(r * batch, (r + 1) * batch)
                bps = tables.shape[1]
                kk = kc[tables[rows].long()].view(batch, bps * block_size, hkv, HEAD_SIZE)[:, :ctx].transpose(1, 2)
                vv = vc[tables[rows].long()].view(batch, bps * block_size, hkv, HEAD_SIZE)[:, :ctx].transpose(1, 2)
                return torch.nn.functional.scaled_dot_product_attention(q[rows, :, None], kk, vv, enable_gqa=True)
            peer(w, "gather-sdpa", [lambda r=r: gather_sdpa(r) for r in range(sets)], meta, copy_peak, same,
                 kind="paged")
        del kc, vc
        if args.tune or ctx >= 2048:
            q, kc, vc, tables, lens = make_shape(batch, ctx, block_size, hkv, layout="vllm", sets=sets)
            ours(w, q, kc, vc, tables, lens, "vllm", meta, copy_peak, same)
            del kc, vc
        torch.cuda.empty_cache()

    if not args.no_flex:
        for batch, ctx, block_size, gqa in (FLEX_POINTS[:1] if args.tune else FLEX_POINTS):
            if time.time() - t_start > args.budget_s:
                break
            hkv, kv_bytes, meta = point_meta(batch, ctx, block_size, gqa)
            same = same_copy_cache.get(kv_bytes) or copy_bw(kv_bytes)[1]
            q, kc, vc, tables, lens = make_shape(batch, ctx, block_size, hkv)  # >= 256 MB: one set is cold
            t0 = time.time()
            try:
                fn = flex_paged(q, kc, vc, tables, lens, block_size)
            except Exception as err:
                w.add(kind="paged", impl="flex-paged", note=f"error: {type(err).__name__}: {str(err)[:120]}", **meta)
                continue
            peer(w, "flex-paged", [fn], meta, copy_peak, same, kind="paged")
            print(f"flex B={batch} L={ctx} gqa={gqa}: {time.time() - t0:.0f}s incl. compile", flush=True)
            del kc, vc
            torch.cuda.empty_cache()

    summarize(w.rows, copy_peak)
    print(f"total {time.time() - t_start:.0f}s", flush=True)
    return 0


SPLIT_POINTS = [(1, ctx, 16, gqa) for ctx in (512, 2048, 8192, 32768, 131072) for gqa in (1, 4, 8)] + \
    [(8, ctx, 16, gqa) for ctx in (512, 2048, 8192, 32768) for gqa in (1, 4, 8)] + \
    [(64, ctx, 16, gqa) for ctx in (512, 2048) for gqa in (1, 4, 8)] + [(64, 8192, 16, 8), (256, 512, 16, 8)]


def tune_split(w, args, t_start, copy_peak) -> int:
    """The split-KV dispatch: per point, v1, the dispatch rule, and every power of two of partitions
    (>= 32 tokens each) with the merge fused into the attention kernel and as a separate launch."""
    import kvsim.kernels.attention as attn
    for batch, ctx, block_size, gqa in SPLIT_POINTS:
        if time.time() - t_start > args.budget_s:
            print("budget reached; stopping", flush=True)
            return 0
        hkv, kv_bytes, meta = point_meta(batch, ctx, block_size, gqa)
        sets = num_sets(kv_bytes)
        same = copy_bw(kv_bytes)[1]
        q, kc, vc, tables, lens = make_shape(batch, ctx, block_size, hkv, sets=sets)

        def run(impl, ps=None, config=None, shape=(q, kc, vc, tables, lens), meta=meta, same=same):
            return ours(w, *shape, "flat", meta, copy_peak, same, partition_size=ps, config=config, impl=impl)
        line = {"v1": run("ts-v1", 1 << 30), "rule": run("ts-rule")}
        nparts = 2
        while nparts <= 512 and ctx // nparts >= 32:
            ps = ctx // nparts
            cfg = plan_launch(batch, hkv, ctx, HEAD_SIZE, "flat", q.device, ps)[1]
            for fused in (True, False):
                tag = f"p{nparts}{'f' if fused else 's'}"
                line[tag] = run(f"ts-{tag}", ps, replace(cfg, fused_reduce=fused))
            nparts *= 2
        if (batch, ctx) in {(1, 131072), (1, 32768)}:
            attn.MERGE_TILE_ELEMS *= 2
            line["merge-step-x2"] = run("ts-merge-step-x2")
            attn.MERGE_TILE_ELEMS //= 2
        print(f"B={batch} L={ctx} gqa={gqa}: " + " ".join(f"{k}={v:.1f}" for k, v in line.items()), flush=True)
        del kc, vc
        torch.cuda.empty_cache()
    return 0


def summarize(rows, copy_peak):
    auto = [r for r in rows if r["impl"] == "triton" and r["layout"] == "flat" and r["time_us"] != ""]
    if not auto:
        return
    pcts = [float(r["pct_copy"]) for r in auto]
    geo = math.exp(sum(math.log(p) for p in pcts) / len(pcts))
    worst = min(auto, key=lambda r: float(r["pct_copy"]))
    print(f"\nours (flat, dispatch): {len(auto)} points, geomean {geo:.1f}% of copy {copy_peak:.3f} TB/s, "
          f"min {float(worst['pct_copy']):.1f}% at B={worst['batch']} L={worst['context_tokens']} "
          f"bs={worst['block_size']} gqa={worst['gqa']}")
    dense = {}
    for r in rows:
        if r["kind"] == "dense" and r["time_us"] != "":
            key = (r["batch"], r["context_tokens"], r["gqa"])
            dense[key] = min(dense.get(key, 1e18), float(r["time_us"]))
    ratios = [float(r["time_us"]) / dense[(r["batch"], r["context_tokens"], r["gqa"])] for r in auto
              if (r["batch"], r["context_tokens"], r["gqa"]) in dense]
    if ratios:
        print(f"ours / best dense: geomean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}, "
              f"max {max(ratios):.3f}, points within 5%: {sum(x <= 1.05 for x in ratios)}/{len(ratios)}")


if __name__ == "__main__":
    sys.exit(main())
