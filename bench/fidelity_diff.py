"""Compare kvsim's step-clock replay with vLLM's own scheduling decisions (the oracle's files).

Shared by tests/test_fidelity_golden.py (golden fixtures) and bench/fidelity_vllm.py (large
traces). The oracle (../shared/tools/vllm_oracle/oracle.py) writes, per engine step, what vLLM
0.33's v1 Scheduler + KVCacheManager decided (steps.csv) and, per request, when it was first
scheduled, got its first token, finished (requests.csv). kvsim's `replay --step-clock` writes
the same quantities under the same names (`--requests`, `--timeseries`). This module builds
kvsim's command line from the oracle's arguments, loads both sides and reports the FIRST
divergence (earliest step) with both sides' values, because later differences usually follow
from the first one.
"""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_DIR = ROOT / "tests" / "fixtures" / "oracle"
ORACLE_DIR = Path(os.environ.get("KVSIM_ORACLE_DIR",
                                  ROOT.parent / "shared" / "tools" / "vllm_oracle"))
# the oracle's environment: a fixed hash seed. vLLM 0.33's CPU tier marks a store's chunks
# evictable in the order of a set of their keys (CPUOffloadingManager.complete_store over
# TransferJobStatus.keys), so which of two equally old chunks it evicts first follows Python's
# string-hash seed: trace b at 1,500 blocks, a 64-chunk tier and 4 steps per chunk stores 9,730
# chunks with PYTHONHASHSEED=1 and 9,731 with 0, 2 and 3
ORACLE_ENV = {**os.environ, "PYTHONHASHSEED": "0"}

# columns kept from the oracle's files in the golden fixtures
STEP_FIELDS = ["step", "sched_reqs", "sched_tokens", "running", "waiting", "kv_usage",
               "kv_used_blocks", "preempted", "pc_queries", "pc_hits", "pc_preempted_queries",
               "pc_preempted_hits", "finished"]
REQUEST_FIELDS = ["request_id", "first_sched_step", "cached_tokens_first", "first_token_step",
                  "finish_step", "num_output", "num_preemptions"]

# compared per request (all required in kvsim's --requests file)
REQUEST_COMPARED = ["first_sched_step", "first_token_step", "finish_step", "num_preemptions",
                    "cached_tokens_first"]
# compared per step: required in kvsim's time series, then optional extras (compared if present)
STEP_REQUIRED = ["running", "waiting", "sched_tokens", "kv_usage", "preempted", "pc_hits"]
STEP_OPTIONAL = ["sched_reqs", "kv_used_blocks", "pc_queries", "pc_preempted_queries",
                 "pc_preempted_hits", "finished"]
KV_USAGE_TOLERANCE = 1e-6  # the oracle rounds kv_usage to 6 decimals

# the oracle's defaults (oracle.py), which kvsim's command line always states explicitly
ORACLE_DEFAULTS = {"block_size": 16, "max_num_seqs": 128, "max_num_batched_tokens": 2048,
                   "max_model_len": 8192, "prefix_caching": "on",
                   "long_prefill_token_threshold": 0, "no_reserve_full_isl": False,
                   "watermark": 0.0}


def find_oracle_python(venv: str | None = None) -> str | None:
    """The oracle venv's python: `venv`, $KVSIM_ORACLE_VENV, ../oracle-venv, or the
    tool's own default folder; None when none exists (build one with the tool's setup.sh)."""
    candidates = [venv, os.environ.get("KVSIM_ORACLE_VENV"), str(ROOT.parent / "oracle-venv"),
                  str(ORACLE_DIR / ".vllm-oracle-venv")]
    for cand in candidates:
        if cand and (Path(cand) / "bin" / "python").exists():
            return str(Path(cand) / "bin" / "python")
    return None


def oracle_cli_args(args: dict) -> list[str]:
    """Oracle command-line flags for a case's argument dict (keys are oracle.py's dests)."""
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        else:
            out += [flag, str(value)]
    return out


def kvsim_argv(trace: str | Path, oracle_args: dict, out_dir: str | Path) -> list[str]:
    """`kvsim` arguments (without the program name) equivalent to an oracle run.

    Args:
        trace: the oracle trace CSV.
        oracle_args: the oracle's arguments (oracle.py dests: num_gpu_blocks, block_size, ...);
            missing ones take the oracle's defaults.
        out_dir: where kvsim writes result.json, requests.csv and steps.csv.
    Returns:
        The argument list for `kvsim.cli.main`.
    """
    # kv_groups: bench/hybrid_oracle.py's groups (the same spelling as `kvsim --kv-groups`)
    unknown = set(oracle_args) - set(ORACLE_DEFAULTS) - {
        "num_gpu_blocks", "kv_groups", "async_scheduling", "max_concurrency", "cpu_chunks",
        "transfer_steps_per_chunk"}
    if unknown:
        raise ValueError(f"oracle arguments without a kvsim equivalent: {sorted(unknown)}")
    a = {**ORACLE_DEFAULTS, **oracle_args}
    out = Path(out_dir)
    argv = ["replay", str(trace), "--format", "vllm-oracle", "--step-clock",
            "--allocator", "paged", "--block-size", str(a["block_size"]),
            "--num-blocks", str(a["num_gpu_blocks"]), "--max-num-seqs", str(a["max_num_seqs"]),
            "--max-num-batched-tokens", str(a["max_num_batched_tokens"]),
            "--max-model-len", str(a["max_model_len"])]
    if a["prefix_caching"] == "off":
        argv.append("--no-prefix-caching")
    if a["long_prefill_token_threshold"]:
        argv += ["--long-prefill-token-threshold", str(a["long_prefill_token_threshold"])]
    if a["no_reserve_full_isl"]:
        argv.append("--no-full-prompt-admission")
    if a["watermark"]:
        argv += ["--watermark", str(a["watermark"])]
    if a.get("kv_groups"):
        argv += ["--kv-groups", a["kv_groups"]]
    if a.get("async_scheduling"):
        argv.append("--async-scheduling")
    if a.get("max_concurrency"):     # bench/closed_loop_oracle.py's client
        argv += ["--max-concurrency", str(a["max_concurrency"])]
    if a.get("cpu_chunks"):          # bench/offload_oracle.py's CPU tier and worker stub
        argv += offload_argv(a["cpu_chunks"], a.get("transfer_steps_per_chunk", 1),
                             a["block_size"])
    argv += ["--out", str(out / "result.json"), "--requests", str(out / "requests.csv"),
             "--timeseries", str(out / "steps.csv")]
    return argv


# the model whose blocks kvsim's CPU tier counts in an offload case (the oracle's are a page)
OFFLOAD_MODEL = "Llama-3.1-8B"


def offload_argv(cpu_chunks: int, steps_per_chunk: int, block_size: int) -> list[str]:
    """kvsim's flags for bench/offload_oracle.py's tier: ``cpu_chunks`` chunks of one block of
    OFFLOAD_MODEL, over a link that moves one chunk per step (``steps_per_chunk`` steps per
    chunk; 0: at once, a link far faster than any step)."""
    from kvsim.planner.presets import get_model
    from kvsim.planner.tiers import GIB, block_bytes, chunk_bytes

    chunk = chunk_bytes(*block_bytes(get_model(OFFLOAD_MODEL), "auto", 1, block_size))
    per_s = chunk / steps_per_chunk if steps_per_chunk else chunk * 1e15   # rounds to 0 ns
    return ["--model", OFFLOAD_MODEL, "--cpu-offload-gib", repr(cpu_chunks * chunk / GIB),
            "--offload-bandwidth-gbps", repr(per_s / 1e9)]


def _num(value) -> float | None:
    if value is None or value == "":
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    if x != x:  # NaN (pandas' empty cell)
        return None
    return x


def _read_table(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict("records")
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def load_requests(path: str | Path) -> dict[str, dict[str, float | None]]:
    """request_id -> {field: value} of a requests file (oracle's or kvsim's --requests)."""
    rows = _read_table(Path(path))
    if not rows:
        return {}
    missing = [c for c in ["request_id", *REQUEST_COMPARED] if c not in rows[0]]
    if missing:
        raise ValueError(f"{path}: requests file lacks column(s) {missing}; kvsim's --requests "
                         f"must use the oracle's names {['request_id', *REQUEST_COMPARED]}")
    out = {}
    for row in rows:
        rid = row["request_id"]
        key = str(int(float(rid))) if _num(rid) is not None else str(rid)
        out[key] = {c: _num(row.get(c)) for c in REQUEST_COMPARED}
    return out


def load_steps(path: str | Path) -> tuple[dict[int, dict[str, float | None]], list[str]]:
    """step -> {column: value} for the busy steps of a step table (oracle's steps.csv or
    kvsim's --timeseries); also returns the compared columns it has.

    kvsim may name the step column `step` or `time_s` (the step clock makes them equal) and
    may record idle steps; rows with no scheduled token are dropped, as the oracle never
    records them.
    """
    rows = _read_table(Path(path))
    if not rows:
        return {}, []
    cols = set(rows[0])
    step_col = "step" if "step" in cols else ("time_s" if "time_s" in cols else None)
    missing = [c for c in STEP_REQUIRED if c not in cols]
    if step_col is None or missing:
        raise ValueError(f"{path}: step table lacks column(s) "
                         f"{(['step'] if step_col is None else []) + missing}; kvsim's "
                         f"--timeseries under --step-clock must have one row per engine step "
                         f"with the oracle's names {['step', *STEP_REQUIRED]}")
    have = [c for c in STEP_REQUIRED + STEP_OPTIONAL if c in cols]
    out: dict[int, dict[str, float | None]] = {}
    for row in rows:
        t = _num(row[step_col])
        if t is None or t != int(t):
            raise ValueError(f"{path}: step {row[step_col]!r} is not a whole engine step")
        vals = {c: _num(row.get(c)) for c in have}
        if not vals["sched_tokens"]:
            continue
        out[int(t)] = vals
    return out, have


@dataclass
class Divergence:
    """How a kvsim run differs from the oracle's on one case."""

    case: str
    num_requests: int = 0
    num_steps_oracle: int = 0
    num_steps_kvsim: int = 0
    # per compared request field: how many requests differ
    request_mismatches: dict[str, int] = field(default_factory=dict)
    # per compared step column: how many common steps differ
    step_mismatches: dict[str, int] = field(default_factory=dict)
    steps_only_oracle: int = 0
    steps_only_kvsim: int = 0
    finish_step_matches: int = 0
    first_request: str = ""
    first_step: str = ""

    @property
    def identical(self) -> bool:
        return not (any(self.request_mismatches.values()) or any(self.step_mismatches.values())
                    or self.steps_only_oracle or self.steps_only_kvsim)

    @property
    def finish_match_share(self) -> float:
        return self.finish_step_matches / self.num_requests if self.num_requests else 1.0

    def format(self) -> str:
        """Multi-line report: counts, then the first diverging request and step."""
        if self.identical:
            return (f"{self.case}: identical to vLLM ({self.num_requests} requests, "
                    f"{self.num_steps_oracle} busy steps)")
        req = {k: v for k, v in self.request_mismatches.items() if v}
        stp = {k: v for k, v in self.step_mismatches.items() if v}
        lines = [
            f"{self.case}: kvsim diverges from vLLM's scheduler",
            f"  finish step identical for {self.finish_step_matches}/{self.num_requests} "
            f"requests ({100 * self.finish_match_share:.1f} %)",
            f"  requests differing per field: {req or 'none'}",
            f"  busy steps: oracle {self.num_steps_oracle}, kvsim {self.num_steps_kvsim} "
            f"(only in oracle {self.steps_only_oracle}, only in kvsim {self.steps_only_kvsim}); "
            f"steps differing per column: {stp or 'none'}",
        ]
        if self.first_step:
            lines.append("  FIRST diverging step: " + self.first_step)
        if self.first_request:
            lines.append("  FIRST diverging request: " + self.first_request)
        return "\n".join(lines)


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return str(int(v)) if v == int(v) else f"{v:.6f}"


def _row_str(row: dict | None, cols: list[str]) -> str:
    if row is None:
        return "(no busy step)"
    return " ".join(f"{c}={_fmt(row.get(c))}" for c in cols)


STEP_VALUED = ("first_sched_step", "first_token_step", "finish_step")


def _divergence_step(o: dict, k: dict, bad: list[str]) -> float:
    """The earliest step at which a request's story differs: the smaller of the two sides'
    values of a differing step field, or the first scheduling for the other fields."""
    at = []
    for c in bad:
        vals = [o[c], k[c]] if c in STEP_VALUED else [o["first_sched_step"], k["first_sched_step"]]
        at += [v for v in vals if v is not None and v >= 0]
    return min(at) if at else 0


def compare(case: str, oracle_requests: dict, oracle_steps: dict, kvsim_requests: dict,
            kvsim_steps: dict, kvsim_step_cols: list[str]) -> Divergence:
    """Compare per request and per step.

    Args:
        case: a name for the report.
        oracle_requests, kvsim_requests: from load_requests.
        oracle_steps, kvsim_steps: from load_steps; kvsim_step_cols: the columns kvsim has.
    Returns:
        A Divergence; `.identical` when every compared value matches.
    """
    d = Divergence(case=case, num_requests=len(oracle_requests),
                   num_steps_oracle=len(oracle_steps), num_steps_kvsim=len(kvsim_steps))
    d.request_mismatches = dict.fromkeys(REQUEST_COMPARED, 0)
    first_req_key: tuple | None = None
    for rid, o in oracle_requests.items():
        k = kvsim_requests.get(rid)
        if k is None:
            d.request_mismatches["finish_step"] += 1
            key = (o["first_sched_step"] or 0, rid)
            if first_req_key is None or key < first_req_key:
                first_req_key = key
                d.first_request = f"request {rid}: missing from kvsim's --requests file"
            continue
        if k["finish_step"] == o["finish_step"]:
            d.finish_step_matches += 1
        bad = [c for c in REQUEST_COMPARED if k[c] != o[c]]
        for c in bad:
            d.request_mismatches[c] += 1
        if bad:
            at = _divergence_step(o, k, bad)
            key = (at, int(rid) if rid.isdigit() else rid)
            if first_req_key is None or key < first_req_key:
                first_req_key = key
                d.first_request = (f"request {rid} (from step {_fmt(at)}): "
                                   + "; ".join(f"{c} vllm={_fmt(o[c])} kvsim={_fmt(k[c])}"
                                               for c in bad))
    extra = sorted(set(kvsim_requests) - set(oracle_requests))
    if extra:
        d.request_mismatches["finish_step"] += len(extra)
        if not d.first_request:
            d.first_request = f"kvsim has requests the oracle does not: {extra[:5]}"

    cols = [c for c in STEP_REQUIRED + STEP_OPTIONAL if c in kvsim_step_cols]
    d.step_mismatches = dict.fromkeys(cols, 0)
    steps = sorted(set(oracle_steps) | set(kvsim_steps))
    for s in steps:
        o, k = oracle_steps.get(s), kvsim_steps.get(s)
        if o is None or k is None:
            if o is None:
                d.steps_only_kvsim += 1
            else:
                d.steps_only_oracle += 1
            if not d.first_step:
                d.first_step = (f"step {s}: busy in {'kvsim' if o is None else 'vLLM'} only\n"
                                f"    vllm : {_row_str(o, cols)}\n    kvsim: {_row_str(k, cols)}")
            continue
        bad = []
        for c in cols:
            ov, kv = o.get(c), k.get(c)
            if c == "kv_usage" and ov is not None and kv is not None:
                same = abs(ov - kv) <= KV_USAGE_TOLERANCE
            else:
                same = ov == kv
            if not same:
                d.step_mismatches[c] += 1
                bad.append(c)
        if bad and not d.first_step:
            d.first_step = (f"step {s}: differs in {bad}\n"
                            f"    vllm : {_row_str(o, cols)}\n    kvsim: {_row_str(k, cols)}")
    return d


def compare_dirs(case: str, oracle_dir: str | Path, kvsim_dir: str | Path) -> Divergence:
    """Compare an oracle output folder (steps.csv, requests.csv) with a kvsim output folder
    written with kvsim_argv (steps.csv = --timeseries, requests.csv = --requests)."""
    o_req = load_requests(Path(oracle_dir) / "requests.csv")
    o_steps, _ = load_steps(Path(oracle_dir) / "steps.csv")
    k_req = load_requests(Path(kvsim_dir) / "requests.csv")
    k_steps, k_cols = load_steps(Path(kvsim_dir) / "steps.csv")
    return compare(case, o_req, o_steps, k_req, k_steps, k_cols)


# kvsim's result.json summary key -> the oracle's summary.json key for the same quantity
SUMMARY_PAIRS = [
    ("requests_finished", "requests"),            # every oracle case finishes every request
    ("num_steps", "busy_steps"),                  # steps that scheduled tokens
    ("simulated_duration_s", "total_steps"),      # step clock: end of the last step
    ("num_preemptions", "total_preemptions"),
    ("preempted_requests", "preempted_requests"),
    ("prefix_query_tokens", "prefix_queries"),    # first admissions (vLLM's metric)
    ("prefix_hit_tokens", "prefix_hits"),
    ("preempted_prefix_query_tokens", "preempted_prefix_queries"),  # re-admissions
    ("preempted_prefix_hit_tokens", "preempted_prefix_hits"),
    ("max_running", "max_running"),
]


def compare_summary(kvsim_result: str | Path, oracle_summary: str | Path) -> list[str]:
    """Differences between kvsim's result.json summary and the oracle's summary.json, one line
    each (`kvsim_key=... vs vllm oracle_key=...`); empty when they agree."""
    k = json.loads(Path(kvsim_result).read_text())
    k = k.get("summary", k)
    o = json.loads(Path(oracle_summary).read_text())["summary"]
    out = []
    for k_key, o_key in SUMMARY_PAIRS:
        kv = k.get(k_key)
        if kv is None or _num(kv) != _num(o[o_key]):
            out.append(f"{k_key}={kv} vs vllm {o_key}={o[o_key]}")
    return out


def step_totals(steps: dict[int, dict]) -> dict[str, float]:
    """Headline figures of a step table: total steps (last busy step + 1), busy steps,
    preemptions, prefix-hit tokens of first admissions, max running."""
    if not steps:
        return {"total_steps": 0, "busy_steps": 0, "preemptions": 0, "prefix_hit_tokens": 0,
                "max_running": 0}
    return {
        "total_steps": max(steps) + 1,
        "busy_steps": len(steps),
        "preemptions": int(sum(r.get("preempted") or 0 for r in steps.values())),
        "prefix_hit_tokens": int(sum(r.get("pc_hits") or 0 for r in steps.values())),
        "max_running": int(max(r.get("running") or 0 for r in steps.values())),
    }
