"""Decision-level fidelity of kvsim against vLLM 0.33's own scheduler, on the oracle's traces.

For each case (trace x num_gpu_blocks x prefix caching x max_num_batched_tokens, and the same
cases under vLLM's AsyncScheduler: names ending in `_async`) it runs the vLLM oracle
(../shared/tools/vllm_oracle/oracle.py: vLLM's unmodified v1 Scheduler or AsyncScheduler and
KVCacheManager, CPU only) and `kvsim replay --format vllm-oracle --step-clock
[--async-scheduling]` with the same settings, and prints per case: total steps, preemptions, prefix-hit tokens (first admissions),
max running, for both sides, and the share of requests whose finish step is identical, plus the
first diverging step. A CSV gets every figure. The golden fixtures of tests/fixtures/oracle/
are included too (their oracle outputs are committed, so they need no oracle venv).

Oracle outputs are cached under runs/fidelity/oracle/ (git-ignored), keyed by the trace, the
arguments and oracle.py itself, so a rerun costs only kvsim's time. Without the oracle's venv
(default ../oracle-venv; build it with `bash ../shared/tools/vllm_oracle/setup.sh
../oracle-venv`, about 1.5 minutes and 3.2 GB), uncached oracle cases are skipped with a message.

Usage:
    python bench/fidelity_vllm.py [--cases SUBSTR ...] [--jobs 2] [--csv FILE] [--no-golden]
                                  [--oracle-only]
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io
import json
import subprocess
import sys
import time
from datetime import datetime
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.fidelity_diff import (  # noqa: E402
    FIXTURE_DIR,
    ORACLE_DIR,
    compare_dirs,
    compare_summary,
    find_oracle_python,
    kvsim_argv,
    load_steps,
    oracle_cli_args,
    step_totals,
)

RUNS = ROOT / "runs" / "fidelity"

# the oracle's example traces (run_examples.sh): 2000 requests, about 1 arrival per 3 steps,
# prompt mean 500, output mean 200; b: half of the requests get a shared 512-token prefix
EXAMPLE_TRACES = {
    "a": ["--num-requests", "2000", "--seed", "1"],
    "b": ["--num-requests", "2000", "--seed", "1", "--shared-prefix-frac", "0.5",
          "--shared-prefix-len", "512"],
}
# the oracle README's scale run: 6000 requests, 2500 blocks (one configuration)
SCALE_TRACE = ("c", ["--num-requests", "6000", "--seed", "2"])
# a real workload: the first 2000 requests of the Azure LLM inference conversation trace
# (../shared/traces), arrivals mapped to engine steps of AZURE_STEP_S seconds
AZURE_TRACE = ROOT.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
AZURE_NUM_REQUESTS = 2000
AZURE_STEP_S = 0.03  # also used for Mooncake's millisecond timestamps
# a real prefix-sharing workload: the first MOONCAKE_NUM_REQUESTS of the Mooncake conversation
# trace; each request's prefix group is the block chain it shares (longest, 512-token hash ids)
# with any other request, prompts clipped to MOONCAKE_MAX_PROMPT tokens
MOONCAKE_TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
MOONCAKE_NUM_REQUESTS = 1000
MOONCAKE_MAX_PROMPT = 16000
MOONCAKE_ARGS = {"max_model_len": 16384, "max_num_batched_tokens": 8192}
NUM_BLOCKS = (1500, 2500)
PREFIX_CACHING = ("on", "off")
BUDGETS_TOKENS = (2048, 8192)


def example_cases() -> list[tuple[str, str, dict]]:
    """(case name, trace key, oracle args) for traces a, b x blocks x PC x budget."""
    cases = []
    for trace in EXAMPLE_TRACES:
        for nb in NUM_BLOCKS:
            for pc in PREFIX_CACHING:
                for budget in BUDGETS_TOKENS:
                    cases.append((f"{trace}_nb{nb}_pc{pc}_T{budget}", trace,
                                  {"num_gpu_blocks": nb, "prefix_caching": pc,
                                   "max_num_batched_tokens": budget}))
    # vLLM's GPU default: AsyncScheduler with 2 batches in flight (EngineCore
    # .step_with_batch_queue), against `kvsim replay --step-clock --async-scheduling`
    for name, trace, args in list(cases):
        cases.append((f"{name}_async", trace, {**args, "async_scheduling": True}))
    cases.append(("c6000_nb2500_pcon_T2048", "c",
                  {"num_gpu_blocks": 2500, "prefix_caching": "on",
                   "max_num_batched_tokens": 2048}))
    for nb in NUM_BLOCKS:
        cases.append((f"azure_conv_nb{nb}_T2048", "azure",
                      {"num_gpu_blocks": nb, "max_num_batched_tokens": 2048}))
    for pc in PREFIX_CACHING:
        cases.append((f"mooncake_nb4000_pc{pc}_T8192", "mooncake",
                      {"num_gpu_blocks": 4000, "prefix_caching": pc, **MOONCAKE_ARGS}))
    return cases


def _azure_trace(path: Path) -> bool:
    """The Azure conversation trace's first requests in the oracle's format (prompts clipped
    to max_model_len - 1 = 8191 tokens); False when ../shared/traces is absent."""
    if not AZURE_TRACE.exists():
        return False
    rows = []
    with open(AZURE_TRACE, newline="") as f:
        for row in csv.DictReader(f):
            if len(rows) == AZURE_NUM_REQUESTS:
                break
            t = datetime.fromisoformat(row["TIMESTAMP"][:26])
            rows.append((t, min(int(row["ContextTokens"]), 8191),
                         max(1, int(row["GeneratedTokens"]))))
    t0 = rows[0][0]
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["arrival_step", "prompt_tokens", "output_tokens"])
        for t, p, o in rows:
            w.writerow([int((t - t0).total_seconds() / AZURE_STEP_S), max(1, p), o])
    return True


def _mooncake_trace(path: Path) -> bool:
    """The Mooncake trace's first requests in the oracle's format (one prefix group per request:
    the longest chain of 512-token blocks it shares with another request, labelled by that
    chain's last block id); False when ../shared/traces is absent."""
    if not MOONCAKE_TRACE.exists():
        return False
    reqs = []
    with open(MOONCAKE_TRACE) as f:
        for line in f:
            if len(reqs) == MOONCAKE_NUM_REQUESTS:
                break
            reqs.append(json.loads(line))
    chain_count: dict[tuple, int] = {}
    for r in reqs:
        for k in range(1, len(r["hash_ids"]) + 1):
            key = tuple(r["hash_ids"][:k])
            chain_count[key] = chain_count.get(key, 0) + 1
    t0 = reqs[0]["timestamp"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["arrival_step", "prompt_tokens", "output_tokens", "prefix_group", "prefix_len"])
        for r in reqs:
            prompt = max(1, min(r["input_length"], MOONCAKE_MAX_PROMPT))
            ids = r["hash_ids"]
            shared = max((k for k in range(1, len(ids) + 1)
                          if chain_count[tuple(ids[:k])] > 1), default=0)
            plen = min(shared * 512, prompt)
            group = f"m{ids[shared - 1]}" if plen else ""
            w.writerow([int((r["timestamp"] - t0) / 1000 / AZURE_STEP_S), prompt,
                        max(1, r["output_length"]), group, plen if plen else ""])
    return True


def make_trace(key: str) -> Path | None:
    """The trace of a case (generated once: gen_trace.py of the oracle, or the Azure
    conversion), or None when its source is absent."""
    path = RUNS / "traces" / f"{key}.csv"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        if key in ("azure", "mooncake"):
            made = _azure_trace(path) if key == "azure" else _mooncake_trace(path)
            return path if made else None
        if not (ORACLE_DIR / "gen_trace.py").exists():
            return None
        gen_args = SCALE_TRACE[1] if key == SCALE_TRACE[0] else EXAMPLE_TRACES[key]
        subprocess.run([sys.executable, str(ORACLE_DIR / "gen_trace.py"), "--out", str(path),
                        *gen_args], check=True)
    return path


def _cache_key(trace: Path, args: dict) -> str | None:
    oracle_src = ORACLE_DIR / "oracle.py"
    if not oracle_src.exists():
        return None
    h = hashlib.sha256()
    h.update(trace.read_bytes())
    h.update(json.dumps(args, sort_keys=True).encode())
    h.update(oracle_src.read_bytes())
    return h.hexdigest()[:16]


def run_oracle(name: str, trace: Path | None, args: dict,
               oracle_python: str | None) -> tuple[Path | None, str]:
    """The oracle's output folder for a case (cached), or None with the reason."""
    out = RUNS / "oracle" / name
    if trace is None:
        return None, "trace source absent (../shared/traces, or gen_trace.py in KVSIM_ORACLE_DIR)"
    key = _cache_key(trace, args)
    stamp = out / "cache_key"
    if stamp.exists() and (out / "requests.csv").exists():
        if key is None:
            return out, f"cached (oracle source absent, {ORACLE_DIR}; not re-validated)"
        if stamp.read_text() == key:
            return out, "cached"
    if key is None:
        return None, f"oracle absent: {ORACLE_DIR / 'oracle.py'} (set KVSIM_ORACLE_DIR)"
    if oracle_python is None:
        return None, ("oracle venv absent: build it with "
                      f"`bash {ORACLE_DIR}/setup.sh {ROOT.parent / 'oracle-venv'}`")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    run = subprocess.run([oracle_python, str(ORACLE_DIR / "oracle.py"), "--trace", str(trace),
                          "--out-dir", str(out), *oracle_cli_args(args)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        return None, f"oracle failed: {run.stderr.strip()[-500:]}"
    stamp.write_text(key)
    return out, f"ran in {time.perf_counter() - t0:.1f} s"


def run_kvsim(name: str, trace: Path, args: dict) -> tuple[Path | None, str, float]:
    """kvsim's output folder for a case, or None with the reason; and its wall seconds."""
    from kvsim import cli
    out = RUNS / "kvsim" / name
    out.mkdir(parents=True, exist_ok=True)
    argv = kvsim_argv(trace, args, out) + ["--quiet"]
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # kvsim's one-line summary per case
        rc = cli.main(argv)
    wall_s = time.perf_counter() - t0
    if rc != 0:
        return None, f"kvsim exited {rc}: kvsim {' '.join(argv)}", wall_s
    return out, "ok", wall_s


def oracle_skip_reason(odir: Path) -> str | None:
    """Why a case has nothing to compare (the oracle's error file: vLLM refused it, or no
    output yet); None when the oracle's requests.csv is there."""
    if (odir / "error").exists():
        return (odir / "error").read_text().strip()
    return None if (odir / "requests.csv").exists() else "no oracle output"


def compare_with_kvsim(name: str, tag: str, trace: Path, args: dict, odir: Path):
    """Replay a case with kvsim (output under runs/fidelity/kvsim/<tag>) and compare it with
    the oracle's output in ``odir``. Returns (FidelityDiff, kvsim's folder, "ok"), or
    (None, None, why kvsim failed)."""
    kv_dir, why, _ = run_kvsim(tag, trace, args)
    if kv_dir is None:
        return None, None, why
    return compare_dirs(name, odir, kv_dir), kv_dir, why


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", help="only cases whose name contains one of these")
    ap.add_argument("--jobs", type=int, default=2, help="oracle runs in parallel")
    ap.add_argument("--csv", default=str(RUNS / "fidelity_vllm.csv"))
    ap.add_argument("--no-golden", action="store_true", help="skip the golden fixture cases")
    ap.add_argument("--venv", help="the oracle's venv (default: autodetect)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each first divergence")
    ap.add_argument("--oracle-only", action="store_true",
                    help="only run (or refresh the cache of) the oracle cases; no kvsim")
    a = ap.parse_args(argv)

    oracle_python = find_oracle_python(a.venv)
    if oracle_python is None:
        print(f"note: vLLM oracle venv not found; uncached oracle cases are skipped. Build it "
              f"with: bash {ORACLE_DIR}/setup.sh {ROOT.parent / 'oracle-venv'}", file=sys.stderr)
    cases: list[tuple[str, Path, dict, Path | None]] = []  # name, trace, args, oracle dir
    for name, tkey, args in example_cases():
        cases.append((name, make_trace(tkey), args, None))
    if not a.no_golden:
        manifest = json.loads((FIXTURE_DIR / "manifest.json").read_text())
        for name, entry in manifest.items():
            cases.append((f"golden/{name}", FIXTURE_DIR / entry["trace"], entry["oracle_args"],
                          FIXTURE_DIR / name))
    if a.cases:
        cases = [c for c in cases if any(s in c[0] for s in a.cases)]

    todo = [c for c in cases if c[3] is None]
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        results = dict(zip([c[0] for c in todo], pool.map(
            lambda c: run_oracle(c[0], c[1], c[2], oracle_python), todo)))

    if a.oracle_only:
        for name in results:
            print(f"{name:34} oracle: {results[name][1]}")
        return 0

    header = ["case", "requests", "steps_vllm", "steps_kvsim", "preemptions_vllm",
              "preemptions_kvsim", "prefix_hit_tokens_vllm", "prefix_hit_tokens_kvsim",
              "max_running_vllm", "max_running_kvsim", "finish_step_match_share", "identical",
              "first_diverging_step", "summary_identical", "kvsim_wall_s", "oracle_loop_s"]
    rows = []
    print(f"{'case':34} {'steps vllm/kvsim':>17} {'preempt':>11} {'prefix hits':>17} "
          f"{'max run':>8} {'finish=':>8}  first divergence")
    for name, trace, args, oracle_dir in cases:
        if oracle_dir is None:
            oracle_dir, why = results[name]
            if oracle_dir is None or trace is None:
                print(f"{name:34} skipped: {why}")
                continue
        o_steps, _ = load_steps(oracle_dir / "steps.csv")
        o = step_totals(o_steps)
        summary_path = oracle_dir / "summary.json"
        loop_s = (json.loads(summary_path.read_text())["summary"].get("loop_s", "")
                  if summary_path.exists() else "")
        kv_dir, why, wall_s = run_kvsim(name.replace("/", "_"), trace, args)  # trace exists here
        if kv_dir is None:
            print(f"{name:34} {o['total_steps']:>8}/{'-':<8} {o['preemptions']:>5}/{'-':<5} "
                  f"{o['prefix_hit_tokens']:>8}/{'-':<8} {o['max_running']:>4}/{'-':<3} "
                  f"{'-':>8}  kvsim skipped: {why}")
            rows.append([name, "", o["total_steps"], "", o["preemptions"], "",
                         o["prefix_hit_tokens"], "", o["max_running"], "", "", "", "", "", "",
                         loop_s])
            continue
        d = compare_dirs(name, oracle_dir, kv_dir)
        summary_diffs = (compare_summary(kv_dir / "result.json", oracle_dir / "summary.json")
                         if (oracle_dir / "summary.json").exists() else [])
        if summary_diffs:
            print(f"  summary differs: {'; '.join(summary_diffs)}")
        k_steps, _ = load_steps(kv_dir / "steps.csv")
        k = step_totals(k_steps)
        first = d.first_step.split(":")[0] if d.first_step else ""
        print(f"{name:34} {o['total_steps']:>8}/{k['total_steps']:<8} "
              f"{o['preemptions']:>5}/{k['preemptions']:<5} "
              f"{o['prefix_hit_tokens']:>8}/{k['prefix_hit_tokens']:<8} "
              f"{o['max_running']:>4}/{k['max_running']:<3} "
              f"{100 * d.finish_match_share:>7.1f}%  {'identical' if d.identical else first}")
        if a.verbose and not d.identical:
            print(d.format())
        rows.append([name, d.num_requests, o["total_steps"], k["total_steps"], o["preemptions"],
                     k["preemptions"], o["prefix_hit_tokens"], k["prefix_hit_tokens"],
                     o["max_running"], k["max_running"], round(d.finish_match_share, 6),
                     d.identical, first, not summary_diffs, round(wall_s, 3), loop_s])
    Path(a.csv).parent.mkdir(parents=True, exist_ok=True)
    with open(a.csv, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
    print(f"wrote {a.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
