"""The attention kernels compiled for sm_90 (H100/H200) on a machine without a GPU: registers, spills
and SASS of every launch that the decode grid or a benchmark run makes, side by side with the
previous decode-only kernel, and a Triton cache of those kernels for a GPU run to start from (a
GPU session then spends its device time measuring, not compiling).

Two interpreters. ``record`` runs in the project's venv (torch; kernels under TRITON_INTERPRET=1 with
the dispatch rule forced to its CUDA branch on 132 multiprocessors, and the kernel launch replaced by a
recorder: only the arguments and their Triton specialisation are kept). ``compare``, ``precompile``
run with the GPU machine's Triton (3.6) and need no torch; each compile runs in its own process
(Triton's code generator keeps callee state between compiles of one process)::

    git show 4dc92b1:kernels/attention.py > /tmp/old_attention.py
    .venv/bin/python bench/codegen_sm90.py record --decode-grid --old /tmp/old_attention.py --out /tmp/grid.json
    T36/bin/python bench/codegen_sm90.py compare /tmp/grid.json --old /tmp/old_attention.py
    .venv/bin/python bench/codegen_sm90.py record --bench-plan PLAN.json --old /tmp/old_attention.py --out /tmp/run.json
    T36_PY312/bin/python bench/codegen_sm90.py precompile /tmp/run.json --old /tmp/old_attention.py --cache DIR

``precompile`` needs the GPU machine's Python minor version too (Triton's cache key hashes its
compiled extension, built per Python version): on the H200 machine, Python 3.12 and triton 3.6.0.
The GPU run copies DIR to the same absolute path and sets TRITON_CACHE_DIR to it. PLAN.json names
what the run measures: {"decode_points": [[batch, context, block, gqa], ...], "mixed_points": [...],
"mixed_variants": [...], "prefill_points": [...], "prefill_variants": [...], "correctness_cases": [...]}
(indices and names of bench/kernels.py).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NEW_MODULE, OLD_MODULE = "kvsim.kernels.attention", "legacy_attention"  # the names bench/kernels.py gives them
NUM_HEADS, HEAD_SIZE = 32, 128


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------------
# record (project venv)

def _encode(x):
    import torch
    if isinstance(x, torch.Tensor):
        return {"tensor": str(x.dtype).replace("torch.", ""), "align16": x.data_ptr() % 16 == 0}
    if x is None:
        return {"none": True}
    for kind in (bool, int, float):
        if isinstance(x, kind):
            return {kind.__name__: x}
    raise TypeError(f"unexpected kernel argument {x!r}")


def _spec_key(rec):
    """What Triton specialises a launch on: constexprs, dtypes, alignment, ints == 1 / % 16 / 64-bit."""
    def one(a):
        if "int" in a:
            v = a["int"]
            return "1" if v == 1 else ("D" if v % 16 == 0 else "N") + ("64" if abs(v) >= 2 ** 31 else "")
        return a["tensor"] + str(a["align16"]) if "tensor" in a else next(iter(a))
    return json.dumps([rec["module"], rec["kernel"], rec["kwargs"], [one(a) for a in rec["args"]]], sort_keys=True)


class Recorder:
    """Runs the wrappers of the new and old kernels on CPU tensors with the GPU dispatch rule and keeps
    every launch's arguments instead of running it."""

    def __init__(self, old_path):
        os.environ["TRITON_INTERPRET"] = "1"
        import torch
        from kvsim.kernels import attention as new
        self.torch, self.new = torch, new
        cuda = torch.device("cuda", 0)
        new._num_sms_cuda = lambda index: 132
        plan = new.plan_attention
        new.plan_attention = lambda *a, **k: plan(*a[:8], cuda, *a[9:], **k)
        self.old = None
        if old_path:
            old = self.old = _load(old_path, OLD_MODULE)
            old.num_sms = lambda device: 132
            old.merge_tile_elems = lambda device: 4096
            old_plan = old.plan_launch
            old.plan_launch = lambda ns, hkv, n, hs, layout, dev, *a, **k: old_plan(ns, hkv, n, hs, layout, cuda, *a, **k)
        self.launches: dict[str, dict] = {}

    def record(self, which, call) -> list[str]:
        """Run ``call`` (a wrapper call) with the kernels of ``which`` ("new"/"old") recorded."""
        mod = self.new if which == "new" else self.old
        sink = []

        class Kernel:
            def __init__(self, name):
                self.name = name

            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    kwargs = dict(kwargs, UPCAST_DOT=False) if "UPCAST_DOT" in kwargs else dict(kwargs)
                    sink.append(dict(module=NEW_MODULE if which == "new" else OLD_MODULE, kernel=self.name,
                                     grid=list(grid), args=[_encode(a) for a in args], kwargs=kwargs))
                return launch
        swaps = []
        for name in ("_attention_kernel", "_paged_attention_kernel", "_reduce_partitions_kernel"):
            if hasattr(mod, name):
                swaps.append((mod, name, getattr(mod, name)))
        for holder in ("_ATTENTION", "_REDUCE"):  # the new module launches through CachedLauncher
            if hasattr(mod, holder):
                swaps.append((getattr(mod, holder), "fn", getattr(mod, holder).fn))
        holders = {"_ATTENTION": "_attention_kernel", "_REDUCE": "_reduce_partitions_kernel"}
        for obj, attr, value in swaps:
            name = attr if attr != "fn" else holders[next(h for h in holders if getattr(mod, h, None) is obj)]
            setattr(obj, attr, Kernel(name))
        try:
            call()
        finally:
            for obj, attr, value in swaps:
                setattr(obj, attr, value)
        keys = []
        for rec in sink:
            if which == "old" and rec["kernel"] == "_reduce_partitions_kernel":  # its GPU-only choice
                rec["kwargs"]["num_warps"] = 8 if rec["kwargs"]["PARTS_PER_STEP"] > 32 else 4
            key = _spec_key(rec)
            self.launches.setdefault(key, rec)
            keys.append(key)
        return keys

    def decode(self, which, batch, context, block_size, gqa):
        torch, mod = self.torch, (self.new if which == "new" else self.old)
        from kvsim.kernels import allocate_kv_cache
        # one block in the pool: launches are recorded, never run, and strides do not depend on it
        kc, vc = allocate_kv_cache(1, block_size, NUM_HEADS // gqa, HEAD_SIZE, torch.bfloat16, "cpu", "flat", fill=0.0)
        q = torch.zeros(batch, NUM_HEADS, HEAD_SIZE, dtype=torch.bfloat16)
        tables = torch.zeros(batch, -(-context // block_size), dtype=torch.int32)
        lens = torch.full((batch,), context, dtype=torch.int32)
        return self.record(which, lambda: mod.paged_attention(q, kc, vc, tables, lens, HEAD_SIZE ** -0.5, "flat",
                                                               max_seq_len=context, validate=False))

    def unified(self, contexts, q_lens, block_size, gqa, dtype=None, layout="flat", **kw):
        torch = self.torch
        from kvsim.kernels import allocate_kv_cache
        dtype = dtype or torch.bfloat16
        lens = [c + q for c, q in zip(contexts, q_lens)]
        kc, vc = allocate_kv_cache(1, block_size, NUM_HEADS // gqa, HEAD_SIZE, dtype, "cpu", layout, fill=0.0)
        q = torch.zeros(sum(q_lens), NUM_HEADS, HEAD_SIZE, dtype=dtype)
        tables = torch.zeros(len(lens), max(-(-n // block_size) for n in lens), dtype=torch.int32)
        qsl = torch.tensor([0, *q_lens]).cumsum(0).to(torch.int32)
        sl = torch.tensor(lens, dtype=torch.int32)
        kw.setdefault("max_seq_len", max(lens))
        kw.setdefault("max_query_len", max(q_lens))
        kw.setdefault("validate", False)
        window = kw.pop("sliding_window", None)
        return self.record("new", lambda: self.new.unified_attention(q, kc, vc, tables, sl, qsl, HEAD_SIZE ** -0.5,
                                                                       layout, window, **kw))


def _bench():
    """bench/kernels.py (its points, variants and cases; imports torch and kvsim)."""
    sys.path.insert(0, str(REPO / "bench"))
    return _load(REPO / "bench" / "kernels.py", "bench_kernels")


def record_bench_plan(rec: Recorder, plan: dict) -> dict:
    """Every launch of ``bench/kernels.py`` run with the points, variants and cases of ``plan``."""
    bench = _bench()
    points = {}
    for p in plan.get("decode_points", []):
        points[":".join(map(str, p))] = {w: rec.decode(w, *p) for w in ("new", "old") if w == "new" or rec.old}
    for batch, context in bench.EAGER_DECODE:
        points[f"eager:{batch}:{context}"] = {w: rec.decode(w, batch, context, 16, 4)
                                              for w in ("new", "old") if w == "new" or rec.old}

    @contextlib.contextmanager
    def rule(constants):
        saved = {k: getattr(rec.new, k) for k in constants}
        for k, v in constants.items():
            setattr(rec.new, k, v)
        rec.new._PLANS.clear()
        rec.new._STATIC.clear()
        try:
            yield
        finally:
            for k, v in saved.items():
                setattr(rec.new, k, v)
            rec.new._PLANS.clear()
            rec.new._STATIC.clear()
    for i in plan.get("mixed_points", []):
        chunks, n_dec, dec_ctx = bench.MIXED_POINTS[i]
        contexts = [c for _, c in chunks] + [dec_ctx - 1] * n_dec
        q_lens = [q for q, _ in chunks] + [1] * n_dec
        for v in [None] + plan.get("mixed_variants", []):
            with rule(bench.VARIANTS[v] if v else {}):
                points[f"mixed:{i}:{v}"] = {"new": rec.unified(contexts, q_lens, 16, 4)}
    for i in plan.get("prefill_points", []):
        contexts, q_lens, gqa, bs = bench.PREFILL_POINTS[i]
        for v in [None] + plan.get("prefill_variants", []):
            with rule(bench.VARIANTS[v] if v else {}):
                points[f"prefill:{i}:{v}"] = {"new": rec.unified(contexts, q_lens, bs, gqa)}
    for batch, q_len in bench.EAGER_PREFILL:
        points[f"eager-prefill:{batch}:{q_len}"] = {"new": rec.unified([0] * batch, [q_len] * batch, 16, 4)}
    torch = rec.torch
    for i in plan.get("correctness_cases", []):
        dtype, layout, bs, gqa, contexts, q_lens, window, part, fused = bench.CORRECTNESS_CASES[i]
        lens = [c + q for c, q in zip(contexts, q_lens)]
        cfg = None
        if part is not None:  # as section_correctness builds it
            cfg = rec.new.plan_attention(sum(q_lens), len(lens), NUM_HEADS, NUM_HEADS // gqa, HEAD_SIZE, max(lens),
                                         max(q_lens), layout, torch.device("cuda"), part, None, window).config
            cfg = rec.new.KernelConfig(cfg.tile_tokens, cfg.num_warps, cfg.num_stages, cfg.unmasked_full_tiles, fused)
        points[f"correctness:{i}"] = {"new": rec.unified(
            contexts, q_lens, bs, gqa, dtype, layout, sliding_window=window, partition_size=part, config=cfg,
            workspace=torch.zeros(4096, dtype=torch.int32), validate=True, max_seq_len=None, max_query_len=None)}
    return points


# ---------------------------------------------------------------------------------------------
# compile (triton 3.6, no torch)

def _stub_modules():
    """What kernels/attention.py imports besides triton, stubbed: only its @triton.jit functions run."""
    sys.modules["torch"] = types.ModuleType("torch")
    for name in ("kvsim", "kvsim.kernels"):
        mod = types.ModuleType(name)
        mod.__path__ = []
        sys.modules[name] = mod
    layout = types.ModuleType("kvsim.kernels.layout")
    layout.cache_geometry = layout.cache_strides = None
    launcher = types.ModuleType("kvsim.kernels.launcher")
    launcher.CachedLauncher = lambda fn: types.SimpleNamespace(fn=fn)
    sys.modules.update({"kvsim.kernels.layout": layout, "kvsim.kernels.launcher": launcher})


def compile_one(rec: dict, src: str, dump: str | None) -> dict:
    """Compile one recorded launch as the runtime would (same specialisation and options)."""
    _stub_modules()
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    class Dtype:  # what Triton's specialisation reads of a torch dtype
        def __init__(self, name):
            self.name = name

        def __str__(self):
            return "torch." + self.name
    Dtype.__name__, Dtype.__module__ = "dtype", "torch"

    class Tensor:
        def __init__(self, dtype, aligned):
            self.dtype, self.ptr = Dtype(dtype), 0 if aligned else 2

        def data_ptr(self):
            return self.ptr

    def decode(a):
        if "tensor" in a:
            return Tensor(a["tensor"], a["align16"])
        return None if "none" in a else next(iter(a.values()))
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    fn = getattr(_load(src, rec["module"]), rec["kernel"])
    kwargs = dict(rec["kwargs"], debug=False, instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound, spec, options = create_function_from_signature(fn.signature, fn.params, backend)(
        *[decode(a) for a in rec["args"]], **kwargs)
    opts, sig, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, options)
    kernel = triton.compile(ASTSource(fn, sig, constexprs, attrs), target=target, options=opts.__dict__)
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([tools / "cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tools / "cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
    body = [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,6}\*/\s+(.*?);", sass)]
    ops = [b.split()[1] if b.startswith("@") else b.split()[0] for b in body]
    if dump:
        Path(dump + ".sass").write_text(sass)
        Path(dump + ".ttgir").write_text(kernel.asm["ttgir"])
    return dict(registers=int(re.search(r"REG:(\d+)", usage).group(1)),
                stack_bytes=int(re.search(r"STACK:(\d+)", usage).group(1)), shared_bytes=kernel.metadata.shared,
                instructions=len(ops), mma=sum(o.startswith(("HMMA", "HGMMA")) for o in ops),
                spill_ops=sum(o.startswith(("STL", "LDL")) for o in ops),
                sass=hashlib.sha1("\n".join(body).encode()).hexdigest()[:12])


def compile_all(launches: dict, old: str | None, jobs: int, cache: str | None = None) -> dict:
    """Stats of every launch, one process each (in ``cache`` when given: a Triton cache)."""
    env = dict(os.environ, **({"TRITON_CACHE_DIR": cache} if cache else {}))
    sources = {NEW_MODULE: str(REPO / "kernels" / "attention.py"), OLD_MODULE: old}

    def run(item):
        key, rec = item
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(rec, f)
        done = subprocess.run([sys.executable, __file__, "compile-one", f.name, sources[rec["module"]]], env=env,
                              capture_output=True, text=True)
        os.unlink(f.name)
        if done.returncode:
            return key, {"error": done.stderr[-400:]}
        return key, json.loads(done.stdout.splitlines()[-1])
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        return dict(pool.map(run, launches.items()))


def prune_cache(cache: str) -> None:
    """Keep what a cache hit loads (the cubin and the metadata): a tenth of the size to carry."""
    for grp in Path(cache).glob("*/__grp__*.json"):
        data = json.loads(grp.read_text())
        keep = {}
        for child, path in data["child_paths"].items():
            if child.endswith((".cubin", ".json")):
                keep[child] = path
            else:
                (grp.parent / Path(path).name).unlink(missing_ok=True)
        grp.write_text(json.dumps({"child_paths": keep}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--decode-grid", action="store_true")
    r.add_argument("--bench-plan", type=Path)
    r.add_argument("--old", help="the previous kernels/attention.py, recorded side by side")
    r.add_argument("--out", type=Path, required=True)
    for name in ("compare", "precompile"):
        c = sub.add_parser(name)
        c.add_argument("records", type=Path)
        c.add_argument("--old")
        c.add_argument("--jobs", type=int, default=2)
        if name == "precompile":
            c.add_argument("--cache", required=True)
    one = sub.add_parser("compile-one")
    one.add_argument("record")
    one.add_argument("src")
    one.add_argument("--dump")
    args = ap.parse_args()
    if args.cmd == "record":
        rec = Recorder(args.old)
        if args.decode_grid:
            points = {":".join(map(str, p)): {w: rec.decode(w, *p) for w in ("new", "old") if w == "new" or rec.old}
                      for p in _bench().decode_grid()}
        else:
            points = record_bench_plan(rec, json.loads(args.bench_plan.read_text()))
        args.out.write_text(json.dumps({"points": points, "launches": rec.launches}))
        print(f"{len(points)} points, {len(rec.launches)} distinct launches -> {args.out}")
    elif args.cmd == "compile-one":
        print(json.dumps(compile_one(json.loads(Path(args.record).read_text()), args.src, args.dump)))
    else:
        data = json.loads(args.records.read_text())
        stats = compile_all(data["launches"], args.old, args.jobs, getattr(args, "cache", None))
        errors = {k: s["error"] for k, s in stats.items() if "error" in s}
        for key, err in errors.items():
            print("FAILED", json.loads(key)[1], err)
        if args.cmd == "precompile":
            prune_cache(args.cache)
            print(f"{len(stats) - len(errors)} kernels in {args.cache}")
            return 1 if errors else 0
        same = 0
        for point, runs in data["points"].items():
            new, old = ([stats[k] for k in runs.get(w, [])] for w in ("new", "old"))
            fmt = lambda xs: "/".join(f"{s.get('registers')}r+{s.get('stack_bytes')}B {s.get('instructions')}i"  # noqa: E731
                                      for s in xs)
            identical = bool(old) and [s.get("sass") for s in new] == [s.get("sass") for s in old]
            same += identical
            print(f"{point:24s} new {fmt(new):32s}" + (f" old {fmt(old):32s}{' identical SASS' if identical else ''}"
                                                       if old else ""))
        print(f"{same}/{len(data['points'])} points with SASS identical to the previous kernel's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
