"""Golden fidelity: kvsim's step-clock replay makes vLLM 0.33's scheduling decisions, step for step.

tests/fixtures/oracle/<case>/ holds a small trace and what vLLM's own v1 Scheduler +
KVCacheManager decided on it (the oracle's steps.csv / requests.csv, trimmed; regenerate with
bench/make_oracle_fixtures.py). manifest.json maps each case to the oracle's arguments; the
test replays the trace through `kvsim replay ... --format vllm-oracle --step-clock` with the
equivalent flags and requires identical decisions. On a mismatch the message names the first
diverging step and request with both sides' values (docs/FIDELITY.md lists the rules).
"""
from __future__ import annotations

import csv
import json
import shutil

import pytest

from bench.fidelity_diff import (
    FIXTURE_DIR,
    REQUEST_FIELDS,
    STEP_FIELDS,
    STEP_REQUIRED,
    compare,
    compare_dirs,
    compare_summary,
    kvsim_argv,
    load_requests,
    load_steps,
)

MANIFEST = json.loads((FIXTURE_DIR / "manifest.json").read_text())
CASES = sorted(MANIFEST)


def test_manifest_cases_are_complete():
    """Every manifest case has its trace and the oracle's outputs with the compared columns,
    and the oracle's requests all finished with the requested output length (or the
    max_model_len cap)."""
    assert len(CASES) >= 8
    for case in CASES:
        entry = MANIFEST[case]
        trace = FIXTURE_DIR / entry["trace"]
        case_dir = FIXTURE_DIR / case
        with open(trace, newline="") as f:
            trace_rows = list(csv.DictReader(f))
        with open(case_dir / "requests.csv", newline="") as f:
            req_rows = list(csv.DictReader(f))
        with open(case_dir / "steps.csv", newline="") as f:
            header = next(csv.reader(f))
        assert header == STEP_FIELDS, case
        assert list(req_rows[0]) == REQUEST_FIELDS, case
        assert len(req_rows) == len(trace_rows) <= 300, case
        max_model_len = entry["oracle_args"].get("max_model_len", 8192)
        for t, r in zip(trace_rows, req_rows):
            want = min(int(t["output_tokens"]), max_model_len - int(t["prompt_tokens"]))
            assert int(r["num_output"]) == want, (case, r["request_id"])
            assert int(r["finish_step"]) >= int(r["first_token_step"]) >= int(
                r["first_sched_step"]) >= int(t["arrival_step"]), (case, r["request_id"])
        summary = json.loads((case_dir / "summary.json").read_text())
        assert summary["summary"]["unfinished"] == 0, case
        assert kvsim_argv(trace, entry["oracle_args"], "out")[:4] == [
            "replay", str(trace), "--format", "vllm-oracle"]


def test_kvsim_argv_maps_every_oracle_knob():
    argv = kvsim_argv("t.csv", {"num_gpu_blocks": 120, "block_size": 32, "max_num_seqs": 4,
                                "max_num_batched_tokens": 256, "max_model_len": 400,
                                "prefix_caching": "off", "long_prefill_token_threshold": 64,
                                "no_reserve_full_isl": True, "watermark": 0.05,
                                "kv_groups": "sliding:128,full"}, "o")
    text = " ".join(argv)
    for piece in ["--step-clock", "--allocator paged", "--block-size 32", "--num-blocks 120",
                  "--max-num-seqs 4", "--max-num-batched-tokens 256", "--max-model-len 400",
                  "--no-prefix-caching", "--long-prefill-token-threshold 64",
                  "--no-full-prompt-admission", "--watermark 0.05", "--requests o/requests.csv",
                  "--kv-groups sliding:128,full"]:
        assert piece in text
    defaults = " ".join(kvsim_argv("t.csv", {"num_gpu_blocks": 10}, "o"))
    for absent in ["--no-prefix-caching", "--watermark", "--long-prefill", "--no-full-prompt",
                   "--kv-groups"]:
        assert absent not in defaults
    assert "--async-scheduling" not in defaults
    assert "--async-scheduling" in kvsim_argv("t.csv", {"num_gpu_blocks": 10,
                                                        "async_scheduling": True}, "o")
    # bench/closed_loop_oracle.py's client: at most C requests in flight
    assert " --max-concurrency 8 " in " ".join(kvsim_argv("t.csv", {"num_gpu_blocks": 10, "max_concurrency": 8}, "o"))
    assert "--max-concurrency" not in defaults
    with pytest.raises(ValueError, match="hash_algo"):
        kvsim_argv("t.csv", {"num_gpu_blocks": 10, "hash_algo": "sha256"}, "o")


def test_diff_reports_first_divergence(tmp_path):
    """The checker itself: a fixture equals itself, and a planted change is reported at the
    right step and request with both values."""
    src = FIXTURE_DIR / "preemption_storm"
    same = compare_dirs("self", src, src)
    assert same.identical and same.finish_match_share == 1.0
    o_req = load_requests(src / "requests.csv")
    o_steps, cols = load_steps(src / "steps.csv")
    assert set(STEP_REQUIRED) <= set(cols)
    k_steps = {s: dict(v) for s, v in o_steps.items()}
    k_req = {r: dict(v) for r, v in o_req.items()}
    first_preempt = min(s for s, v in o_steps.items() if v["preempted"])
    k_steps[first_preempt]["preempted"] = 0
    k_steps[first_preempt + 5]["running"] += 1
    victim = next(r for r, v in o_req.items() if v["num_preemptions"])
    k_req[victim]["finish_step"] += 3
    d = compare("planted", o_req, o_steps, k_req, k_steps, cols)
    assert not d.identical
    assert d.step_mismatches["preempted"] == 1 and d.step_mismatches["running"] == 1
    assert d.request_mismatches["finish_step"] == 1
    assert d.finish_step_matches == len(o_req) - 1
    assert d.first_step.startswith(f"step {first_preempt}: differs in ['preempted']")
    assert f"request {victim}" in d.first_request and "finish_step vllm=" in d.first_request
    assert "FIRST diverging step" in d.format()


def test_compare_summary_names_the_differing_counter(tmp_path):
    oracle = FIXTURE_DIR / "preemption_storm" / "summary.json"
    o = json.loads(oracle.read_text())["summary"]
    kv = {"requests_finished": o["requests"], "num_steps": o["busy_steps"],
          "simulated_duration_s": float(o["total_steps"]),
          "num_preemptions": o["total_preemptions"], "preempted_requests": o["preempted_requests"],
          "prefix_query_tokens": o["prefix_queries"], "prefix_hit_tokens": o["prefix_hits"],
          "preempted_prefix_query_tokens": o["preempted_prefix_queries"],
          "preempted_prefix_hit_tokens": o["preempted_prefix_hits"],
          "max_running": o["max_running"]}
    path = tmp_path / "result.json"
    path.write_text(json.dumps(kv))
    assert compare_summary(path, oracle) == []
    kv["num_preemptions"] += 1
    del kv["max_running"]
    path.write_text(json.dumps(kv))
    assert compare_summary(path, oracle) == [
        f"num_preemptions={o['total_preemptions'] + 1} vs vllm total_preemptions="
        f"{o['total_preemptions']}", f"max_running=None vs vllm max_running={o['max_running']}"]


def test_load_steps_rejects_missing_columns(tmp_path):
    bad = tmp_path / "steps.csv"
    bad.write_text("step,running\n0,1\n")
    with pytest.raises(ValueError, match="waiting"):
        load_steps(bad)


@pytest.mark.parametrize("case", CASES)
def test_kvsim_reproduces_vllm_decisions(case, tmp_path):
    from kvsim import cli

    entry = MANIFEST[case]
    trace = tmp_path / "trace.csv"
    shutil.copy(FIXTURE_DIR / entry["trace"], trace)
    out = tmp_path / "kvsim"
    out.mkdir()
    argv = kvsim_argv(trace, entry["oracle_args"], out)
    rc = cli.main(argv)
    assert rc == 0, f"kvsim {' '.join(argv)} exited with {rc}"
    d = compare_dirs(case, FIXTURE_DIR / case, out)
    assert d.identical, f"{entry['description']}\n{d.format()}\ncommand: kvsim {' '.join(argv)}"
    # the user-facing summary must carry vLLM's own counters too
    diffs = compare_summary(out / "result.json", FIXTURE_DIR / case / "summary.json")
    assert not diffs, f"{case}: result.json differs from vLLM's summary: {'; '.join(diffs)}"
    if "cpu_chunks" in entry["oracle_args"]:
        # and the CPU tier's totals: chunks loaded and stored, flush stalls (the worker stub's
        # timing is kvsim's, so these are decisions too)
        from bench.fidelity_offload import tier_differences

        tier = tier_differences(FIXTURE_DIR / case, out)
        assert not tier, f"{case}: the CPU tier differs from vLLM's: {'; '.join(tier)}"
