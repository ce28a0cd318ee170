"""Differential fuzzing: random small traces and configurations, kvsim against vLLM's scheduler.

The golden cases and bench/fidelity_vllm.py cover chosen rules; this draws many random
(trace, config) pairs, so that rare interactions (prefix groups of every length against every
block size, watermark with first-chunk admission, tiny token budgets, max_model_len caps, pools
barely larger than one request) meet. Each case is replayed by the vLLM oracle (all cases in one
oracle process: bench/oracle_batch.py) and by `kvsim replay --step-clock`; the report lists how
many are identical and, for the others, the configuration and the first diverging step.

Cases are deterministic in --seed; traces and oracle outputs are cached under
runs/fidelity/fuzz/ (git-ignored). Needs the oracle venv for uncached cases (see
bench/fidelity_vllm.py).

Usage:
    python bench/fidelity_fuzz.py [--num-cases 100] [--seed 0] [--jobs 2] [-v]
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.fidelity_diff import ORACLE_DIR, find_oracle_python, oracle_cli_args  # noqa: E402
from bench.fidelity_vllm import RUNS, _cache_key, compare_with_kvsim, oracle_skip_reason  # noqa: E402
from bench.make_oracle_fixtures import _lognormal_int, write_trace  # noqa: E402


def random_case(rng: random.Random) -> tuple[list[list], dict]:
    """A random trace (rows of the oracle format) and oracle arguments that can always finish
    (every request fits the pool on its own, prompt + 1 <= max_model_len)."""
    block_size = rng.choice([8, 16, 16, 32])
    num_requests = rng.randint(15, 100)
    rate = rng.choice([0.05, 0.2, 0.5, 1.0, 3.0])
    prompt_mean = rng.choice([20, 60, 200, 600, 1500])
    output_mean = rng.choice([3, 20, 60, 200])
    groups = []
    for g in range(rng.choice([0, 0, 1, 2, 3])):
        plen = rng.choice([rng.randint(1, block_size - 1), block_size, 2 * block_size,
                           rng.randint(1, 800)])
        groups.append((f"g{g}", plen))
    group_frac = rng.random()
    rows = []
    t = 0.0
    for _ in range(num_requests):
        t += rng.expovariate(rate)
        p = _lognormal_int(rng, prompt_mean, 1, 3000, sigma=0.8)
        o = _lognormal_int(rng, output_mean, 1, 1000, sigma=0.8)
        if groups and rng.random() < group_frac:
            name, plen = rng.choice(groups)
            own = 0 if rng.random() < 0.1 else p
            rows.append([int(t), plen + own, o, name, plen])
        else:
            rows.append([int(t), p, o, "", ""])
    max_prompt = max(r[1] for r in rows)
    if rng.random() < 0.25:  # a max_model_len that cuts many outputs
        max_model_len = max_prompt + 1 + rng.randint(0, 200)
    else:
        max_model_len = 8192 if max_prompt < 8000 else max_prompt + 1
    need_blocks = max(-(-min(r[1] + r[2], max_model_len) // block_size) for r in rows)
    num_gpu_blocks = need_blocks + 2 + rng.choice([0, 3, 20, need_blocks, 4 * need_blocks,
                                                    30 * need_blocks])
    max_num_seqs = rng.choice([1, 2, 4, 16, 128])
    budgets = [b for b in (16, 64, 256, 2048, 8192) if b >= max_num_seqs]
    args = {"num_gpu_blocks": num_gpu_blocks, "block_size": block_size,
            "max_num_seqs": max_num_seqs, "max_num_batched_tokens": rng.choice(budgets),
            "max_model_len": max_model_len,
            "prefix_caching": "on" if rng.random() < 0.7 else "off"}
    if rng.random() < 0.3:
        args["long_prefill_token_threshold"] = min(rng.choice([1, 8, 50, 300]), max_model_len)
    if rng.random() < 0.3:
        args["watermark"] = rng.choice([0.01, 0.05, 0.2])
    if rng.random() < 0.3:
        args["no_reserve_full_isl"] = True
    return rows, args


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-cases", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="oracle processes in parallel")
    ap.add_argument("--csv", help="default: runs/fidelity/fuzz/s<seed>.csv")
    ap.add_argument("--venv", help="the oracle's venv (default: autodetect)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each first divergence")
    a = ap.parse_args(argv)

    base = RUNS / "fuzz" / f"s{a.seed}"
    rng = random.Random(a.seed)
    cases = []  # (name, case dir, args)
    for i in range(a.num_cases):
        rows, args = random_case(rng)
        cdir = base / f"c{i:04d}"
        cdir.mkdir(parents=True, exist_ok=True)
        write_trace(cdir / "trace.csv", rows)
        (cdir / "args.json").write_text(json.dumps(args, sort_keys=True) + "\n")
        cases.append((f"s{a.seed}/c{i:04d}", cdir, args))

    def cached(cdir: Path, args: dict) -> bool:
        # outputs count only for the same trace, arguments and oracle source
        stamp = cdir / "oracle" / "cache_key"
        key = _cache_key(cdir / "trace.csv", args)
        done = (cdir / "oracle" / "requests.csv").exists() or (cdir / "oracle" / "error").exists()
        return done and stamp.exists() and (key is None or stamp.read_text() == key)

    todo = [c for c in cases if not cached(c[1], c[2])]
    if todo:
        py = find_oracle_python(a.venv)
        if py is None or not (ORACLE_DIR / "oracle.py").exists():
            print(f"{len(todo)} case(s) lack oracle outputs and the oracle is unavailable "
                  f"(venv: bash {ORACLE_DIR}/setup.sh {ROOT.parent / 'oracle-venv'}); "
                  "they are skipped", file=sys.stderr)
        else:
            t0 = time.perf_counter()
            procs = []
            for j in range(max(1, a.jobs)):
                part = todo[j::max(1, a.jobs)]
                if not part:
                    continue
                jobs = [{"argv": ["--trace", str(c[1] / "trace.csv"), "--out-dir",
                                  str(c[1] / "oracle"), *oracle_cli_args(c[2])]} for c in part]
                jobs_path = base / f"jobs{j}.json"
                jobs_path.write_text(json.dumps(jobs))
                procs.append(subprocess.Popen(
                    [py, str(ROOT / "bench" / "oracle_batch.py"), str(ORACLE_DIR),
                     str(jobs_path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                    text=True))
            for proc in procs:
                _, err = proc.communicate()
                if proc.returncode:
                    raise SystemExit(f"oracle batch failed: {err.strip()[-1000:]}")
            for _, cdir, args in todo:
                (cdir / "oracle" / "cache_key").write_text(_cache_key(cdir / "trace.csv", args))
            print(f"oracle: {len(todo)} cases in {time.perf_counter() - t0:.0f} s")

    rows_out = []
    num_identical = num_compared = 0
    for name, cdir, args in cases:
        odir = cdir / "oracle"
        reason = oracle_skip_reason(odir)
        if reason is not None:
            rows_out.append([name, json.dumps(args, sort_keys=True), "", "", "",
                             f"skipped: {reason}"])
            continue
        d, _, why = compare_with_kvsim(name, f"fuzz_{name.replace('/', '_')}",
                                       cdir / "trace.csv", args, odir)
        if d is None:
            print(f"kvsim unavailable: {why}")
            return 1
        num_compared += 1
        num_identical += d.identical
        first = d.first_step.split(":")[0] if d.first_step else ""
        rows_out.append([name, json.dumps(args, sort_keys=True), d.num_requests,
                         round(d.finish_match_share, 6), d.identical, first])
        if not d.identical:
            print(f"{name} {json.dumps(args, sort_keys=True)}: {first or 'requests differ'}")
            if a.verbose:
                print(d.format())
    print(f"identical: {num_identical}/{num_compared} random cases (seed {a.seed})")
    out_csv = Path(a.csv) if a.csv else base.with_suffix(".csv")
    with open(out_csv, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["case", "oracle_args", "requests", "finish_step_match_share", "identical",
                    "first_diverging_step"])
        w.writerows(rows_out)
    print(f"wrote {out_csv}")
    return 0 if num_identical == num_compared else 1


if __name__ == "__main__":
    sys.exit(main())
