"""Decision fidelity for hybrid models: kvsim against vLLM's scheduler with KV-cache groups.

vLLM 0.33's real Scheduler + HybridKVCacheCoordinator (bench/hybrid_oracle.py, on CPU) and
`kvsim replay --step-clock --kv-groups ...` replay the same traces; compared per request (first
scheduled step, first token, finish step, preemptions, cached tokens at first admission) and
per step (bench/fidelity_diff.py). Configurations are the KV-cache groups kvsim's planner gives
the bundled models (in vLLM's order, at vLLM's block size):

  gpt-oss      sliding window 128 + full attention, 16-token blocks
  gemma3       6 sliding-window (1024) groups + 1 full, 16-token blocks
  deepseek     MLA: one full-attention group, 64-token blocks (FlashMLA)
  nemotron-h   6 Mamba2 groups (prompt checkpoints) + 1 full, 1040-token blocks; and the same
               groups at 64-token blocks (Mamba caching exercised by short prompts)
  qwen3-next   3 Gated DeltaNet groups (checkpoints on the block grid) + 1 full, 576-token blocks

Workloads: the oracle's example traces a (unique prompts) and b (half share a 512-token prefix),
the first 2000 requests of the Azure conversation trace, the first 1000 of the Mooncake
conversation trace (prefix groups from its hash chains), and --num-random small random traces
(random groups, windows, block sizes, pools, budgets; bench/fidelity_fuzz.py's generator).
Prefix caching is on unless a case says otherwise. Outputs are cached under
runs/fidelity/hybrid/ (git-ignored).

With --async-scheduling every case runs under vLLM's AsyncScheduler (two batches in flight,
vLLM's default on a GPU) on both sides; case names then end in ``_async``.

Usage:
    python bench/fidelity_hybrid.py [--cases NAME ...] [--num-random 60] [--seed 0]
                                    [--async-scheduling] [--oracle-only] [--jobs 2] [-v]
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.fidelity_diff import (REQUEST_COMPARED, ORACLE_DIR, ORACLE_ENV,  # noqa: E402
                                 find_oracle_python, load_requests, oracle_cli_args)
from bench.fidelity_fuzz import random_case  # noqa: E402
from bench.fidelity_vllm import (MOONCAKE_ARGS, RUNS, compare_with_kvsim, make_trace,  # noqa: E402
                                 oracle_skip_reason)
from bench.make_oracle_fixtures import write_trace  # noqa: E402

HYBRID = RUNS / "hybrid"
CONFIGS = {  # name -> (kv groups, block size)
    "gpt-oss": ("sliding:128,full", 16),
    "gemma3": (",".join(["sliding:1024"] * 6 + ["full"]), 16),
    "deepseek": ("full", 64),
    "nemotron-h": (",".join(["mamba_ckpt"] * 6 + ["full"]), 1040),
    "nemotron-h-b64": (",".join(["mamba_ckpt"] * 6 + ["full"]), 64),
    "qwen3-next": (",".join(["mamba_ckpt:576"] * 3 + ["full"]), 576),
}
# (config, trace, pools): pools in blocks chosen so that some preempt and some do not
NAMED = [
    ("gpt-oss", "a", (1500, 3000)), ("gpt-oss", "b", (1500, 3000)),
    ("gpt-oss", "azure", (2000, 4000)), ("gpt-oss", "mooncake", (6000,)),
    ("gemma3", "b", (4000, 8000)), ("gemma3", "azure", (8000,)),
    ("deepseek", "b", (400, 800)), ("deepseek", "azure", (600,)),
    ("nemotron-h", "b", (60, 120)), ("nemotron-h", "azure", (120,)),
    ("nemotron-h-b64", "b", (600, 1200)), ("nemotron-h-b64", "mooncake", (3000,)),
    ("qwen3-next", "b", (60, 120)), ("qwen3-next", "mooncake", (400,)),
]


def named_cases() -> list[tuple[str, str, dict]]:
    out = []
    for config, trace, pools in NAMED:
        groups, block = CONFIGS[config]
        for nb in pools:
            for pc in ("on",) + (("off",) if trace == "b" else ()):
                args = {"kv_groups": groups, "block_size": block, "num_gpu_blocks": nb,
                        "prefix_caching": pc}
                if trace == "mooncake":
                    args.update(MOONCAKE_ARGS)
                out.append((f"{config}_{trace}_nb{nb}_pc{pc}", trace, args))
    return out


def random_hybrid_case(rng: random.Random) -> tuple[list[list], dict]:
    """A random trace and hybrid configuration (fidelity_fuzz's trace and pool generator, then
    random groups: full attention with sliding windows and / or Mamba groups)."""
    rows, args = random_case(rng)
    block = args["block_size"]
    kinds = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        kinds.append(rng.choice(["sliding", "mamba", "mamba_ckpt"]))
    groups = []
    for kind in kinds:
        if kind == "sliding":
            groups.append(f"sliding:{rng.choice([1, block - 1, block, 3 * block + 5, 128, 700])}")
        else:
            groups.append(kind)
    # hybrid models keep some attention (vLLM sizes Mamba blocks off it); sliding alone is a
    # plain sliding-window model
    if rng.random() < 0.85 or all(g.startswith("mamba") for g in groups):
        groups.insert(rng.randrange(len(groups) + 1), "full")
    args["kv_groups"] = ",".join(groups)
    # every group takes blocks: scale the pool so that a request still fits on its own
    args["num_gpu_blocks"] = (args["num_gpu_blocks"] - 1) * len(groups) + 1
    if "mamba" in args["kv_groups"]:
        args.pop("no_reserve_full_isl", None)  # vLLM's Mamba prefix caching needs the gate
    return rows, args


def _cache_key(trace: Path, args: dict) -> str:
    h = hashlib.sha256()
    h.update(trace.read_bytes())
    h.update(json.dumps(args, sort_keys=True).encode())
    h.update(f"PYTHONHASHSEED={ORACLE_ENV['PYTHONHASHSEED']}".encode())
    for src in (ORACLE_DIR / "oracle.py", ROOT / "bench" / "hybrid_oracle.py",
                ROOT / "bench" / "offload_oracle.py"):
        h.update(src.read_bytes() if src.exists() else b"")
    return h.hexdigest()[:16]


# a case's arguments that are not oracle.py's: bench/oracle_batch.py's job keys
JOB_KEYS = ("kv_groups", "cpu_chunks", "transfer_steps_per_chunk")


def run_oracle_batch(cases: list[tuple[str, Path, dict, Path]], jobs: int,
                     venv: str | None, workdir: Path = HYBRID) -> None:
    """Run the uncached cases through vLLM (a few processes, vLLM imported once in each)."""
    todo = []
    for name, trace, args, out in cases:
        stamp = out / "cache_key"
        done = (out / "requests.csv").exists() or (out / "error").exists()
        if not (done and stamp.exists() and stamp.read_text() == _cache_key(trace, args)):
            todo.append((name, trace, args, out))
    if not todo:
        return
    python = find_oracle_python(venv)
    if python is None or not (ORACLE_DIR / "oracle.py").exists():
        print(f"{len(todo)} case(s) lack oracle outputs and the oracle is unavailable; skipped",
              file=sys.stderr)
        return
    t0 = time.perf_counter()
    procs = []
    for j in range(max(1, jobs)):
        part = todo[j::max(1, jobs)]
        if not part:
            continue
        batch = [{**{k: args[k] for k in JOB_KEYS if k in args},
                  "argv": ["--trace", str(trace), "--out-dir", str(out),
                           *oracle_cli_args({k: v for k, v in args.items()
                                             if k not in JOB_KEYS})]}
                 for _, trace, args, out in part]
        path = workdir / f"jobs{j}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(batch))
        procs.append(subprocess.Popen([python, str(ROOT / "bench" / "oracle_batch.py"),
                                       str(ORACLE_DIR), str(path)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True, env=ORACLE_ENV))
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"oracle batch failed: {err.strip()[-1500:]}")
    for _, trace, args, out in todo:
        (out / "cache_key").write_text(_cache_key(trace, args))
    print(f"oracle: {len(todo)} cases in {time.perf_counter() - t0:.0f} s")


def collect_cases(named: list[tuple[str, str, dict]], random_fn, num_random: int, seed: int,
                  root: Path, only: list[str] | None = None, mode: str = "",
                  extra: dict | None = None) -> list[tuple[str, Path, dict, Path]]:
    """(name, trace, args, oracle folder) of the named cases (those containing one of
    ``only``; a case whose trace source is absent is skipped) and of ``num_random`` cases drawn
    by ``random_fn(rng)`` (none when ``only`` is given); ``mode`` ends each name, ``extra``
    joins each case's arguments."""
    extra = extra or {}
    cases = []
    for name, key, args in named:
        if only and not any(s in name for s in only):
            continue
        trace = make_trace(key)
        if trace is None:
            print(f"{name}: skipped, trace source absent")
            continue
        cases.append((name + mode, trace, {**args, **extra}, root / "oracle" / (name + mode)))
    rng = random.Random(seed)
    for i in range(num_random if not only else 0):
        rows, args = random_fn(rng)
        cdir = root / "random" / f"s{seed}" / f"c{i:04d}"
        cdir.mkdir(parents=True, exist_ok=True)
        write_trace(cdir / "trace.csv", rows)
        cases.append((f"random_s{seed}_c{i:04d}{mode}", cdir / "trace.csv", {**args, **extra},
                      cdir / f"oracle{mode}"))
    return cases


def compare_cases(cases: list[tuple[str, Path, dict, Path]], tag: str, csv_path: str,
                  verbose: bool, extra_check=None) -> int:
    """Replay each case with kvsim and compare it with vLLM's outputs; print the diverging
    cases and the totals, write one row per case to ``csv_path``. ``extra_check(oracle folder,
    kvsim folder)`` lists further differences (a case with any is not identical). Returns the
    exit status (1: kvsim failed on a case)."""
    out_rows, compared, identical, requests, requests_identical = [], 0, 0, 0, 0
    for name, trace, args, odir in cases:
        why = oracle_skip_reason(odir)
        if why is not None:
            out_rows.append([name, json.dumps(args, sort_keys=True), "", "", "", "", why, ""])
            continue
        d, kv_dir, why = compare_with_kvsim(name, f"{tag}_{name}", trace, args, odir)
        if d is None:
            print(f"{name}: kvsim failed: {why}")
            return 1
        more = extra_check(odir, kv_dir) if extra_check else []
        compared += 1
        same_case = d.identical and not more
        identical += same_case
        want, got = load_requests(odir / "requests.csv"), load_requests(kv_dir / "requests.csv")
        same = sum(all(got.get(rid, {}).get(c) == row[c] for c in REQUEST_COMPARED)
                   for rid, row in want.items())
        requests += len(want)
        requests_identical += same
        first = d.first_step.split(":")[0] if d.first_step else ""
        out_rows.append([name, json.dumps(args, sort_keys=True), len(want), same,
                         round(d.finish_match_share, 6), same_case, first, "; ".join(more)])
        if not same_case:
            print(f"{name}: {first or 'requests differ'} ({same}/{len(want)} requests)"
                  + (f"; {'; '.join(more)}" if more else ""))
            if verbose:
                print(d.format())
    print(f"identical: {identical}/{compared} cases; requests with every compared field equal: "
          f"{requests_identical}/{requests} ({100 * requests_identical / max(requests, 1):.2f} %)")
    Path(csv_path).parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["case", "args", "requests", "requests_identical", "finish_step_match_share",
                    "identical", "first_diverging_step", "other_differences"])
        w.writerows(out_rows)
    print(f"wrote {csv_path}")
    return 0


def case_parser(description: str, num_random: int, csv_path: str | None) -> argparse.ArgumentParser:
    """The flags of a fidelity script over named and random oracle cases."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--cases", nargs="*", help="only named cases containing one of these")
    ap.add_argument("--num-random", type=int, default=num_random)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--oracle-only", action="store_true", help="run and cache vLLM only")
    ap.add_argument("--csv", default=csv_path)
    ap.add_argument("--venv")
    ap.add_argument("-v", "--verbose", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = case_parser(__doc__.splitlines()[0], 60, None)
    ap.add_argument("--async-scheduling", action="store_true",
                    help="every case under vLLM's AsyncScheduler (names end in _async)")
    a = ap.parse_args(argv)
    mode = "_async" if a.async_scheduling else ""
    extra = {"async_scheduling": True} if a.async_scheduling else {}
    a.csv = a.csv or str(HYBRID / f"fidelity_hybrid{mode}.csv")
    cases = collect_cases(named_cases(), random_hybrid_case, a.num_random, a.seed, HYBRID,
                          a.cases, mode, extra)
    run_oracle_batch(cases, a.jobs, a.venv)
    if a.oracle_only:
        return 0
    return compare_cases(cases, "hybrid", a.csv, a.verbose)


if __name__ == "__main__":
    sys.exit(main())
