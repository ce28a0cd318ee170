"""`kvsim reproduce vllm-paper`: experiment definitions, measurements, report, and a scaled-down run.

The scaled-down run simulates the paper's experiments on a smaller pool and shorter traces and
checks the orderings the paper reports (Max < Pow2 < Oracle < paging in token-state share and in
concurrency; beam search saves more than parallel sampling) and the results.json key schema.
"""
from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from kvsim.allocator import MEMORY_CLASSES, PagedAllocator
from kvsim.cli.reproduce import register
from kvsim.errors import InputError
from kvsim.planner import reproduce as rp
from kvsim.planner import reproduce_report as report
from kvsim.planner.reproduce_report import render_html, render_markdown
from kvsim.workloads.request import Request


def _req(i, p, o, t=0.0):
    return Request(request_id=i, arrival_s=t, prompt_tokens=p, output_tokens=o)


# ---- setup and workloads ---------------------------------------------------------------------

def test_paper_setup_has_15_7k_slots_and_983_blocks():
    cfg = rp.ReproConfig()
    assert cfg.capacity_tokens == 15728          # 12 GiB / 800 KiB, paper Table 1: "15.7K"
    assert cfg.num_blocks == 983
    # Orca (Max) fits floor(15728 / 2048) = 7 sequences: Fig. 13's 7.00 in both traces
    assert cfg.capacity_tokens // cfg.max_model_len == 7


def test_kv_bytes_per_token_matches_the_opt13b_preset():
    from kvsim.planner.capacity import kv_bytes_per_token
    from kvsim.planner.presets import get_model

    assert kv_bytes_per_token(get_model("OPT-13B")) == rp.KV_BYTES_PER_TOKEN_OPT13B == 819200


def test_config_rejects_bad_values_with_numbers():
    with pytest.raises(InputError, match="block_size must be a power of two, got 12"):
        rp.ReproConfig(block_size=12)
    with pytest.raises(InputError, match="duration_s must be > 0, got 0"):
        rp.ReproConfig(duration_s=0)
    with pytest.raises(InputError, match="less than one max-length sequence"):
        rp.ReproConfig(kv_cache_bytes=1000 * rp.KV_BYTES_PER_TOKEN_OPT13B)


def test_filter_lengths_drops_what_vllms_benchmark_sampler_dropped():
    cfg = rp.ReproConfig()
    reqs = [_req(0, 100, 200), _req(1, 1025, 10), _req(2, 1000, 1049), _req(3, 1000, 1048),
            _req(4, 3, 50), _req(5, 50, 3), _req(6, 4, 4)]
    kept, counts = rp.filter_lengths(reqs, cfg)
    assert [r.request_id for r in kept] == [0, 3, 6]
    assert (counts.num_kept, counts.num_too_long, counts.num_too_short) == (3, 2, 2)


def test_sampling_traces_keep_the_basic_traces_arrivals_and_lengths():
    cfg = rp.ReproConfig(duration_s=20.0)
    basic, _ = rp.synthetic_requests("alpaca", 5.0, cfg, seed=3)
    par, _ = rp.synthetic_requests("alpaca", 5.0, cfg, seed=3, mode="parallel", n=4)
    beam, _ = rp.synthetic_requests("alpaca", 5.0, cfg, seed=3, mode="beam", n=6)
    assert len(basic) > 50
    key = [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in basic]
    assert key == [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in par]
    assert key == [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in beam]
    assert {(r.n, r.beam_width) for r in par} == {(4, 1)}
    assert {(r.n, r.beam_width) for r in beam} == {(1, 6)}
    assert all(r.num_shareable_tokens >= r.prompt_tokens for r in par)
    with pytest.raises(ValueError, match="mode must be basic, parallel or beam"):
        rp.synthetic_requests("alpaca", 5.0, cfg, seed=3, mode="greedy", n=2)


def test_synthetic_sharegpt_has_the_papers_means_and_no_request_over_2048():
    cfg = rp.ReproConfig(duration_s=1500.0)
    reqs, counts = rp.synthetic_requests("sharegpt", 2.0, cfg, seed=0)
    stats = rp.length_stats(reqs)
    assert counts.num_too_long == 0 and stats["max_total_tokens"] <= 2048
    assert stats["mean_prompt_tokens"] == pytest.approx(161.31, rel=0.12)
    assert stats["mean_output_tokens"] == pytest.approx(337.99, rel=0.08)


def test_real_sharegpt_file_is_filtered_and_thinned_to_the_rate(shared_traces):
    path = shared_traces / rp.SHAREGPT_LENGTHS_FILE
    cfg = rp.ReproConfig(duration_s=1800.0)
    reqs, counts, stats = rp.real_sharegpt_requests(path, 2.0, cfg, seed=0)
    assert stats["rows_in_file"] == 30731                  # SOURCES.md
    assert counts.num_kept + counts.num_too_long + counts.num_too_short == 30731
    assert stats["mean_prompt_tokens_file"] == pytest.approx(2340.0, abs=0.1)
    assert all(r.prompt_tokens <= 1024 and r.prompt_tokens + r.output_tokens <= 2048
               and min(r.prompt_tokens, r.output_tokens) >= 4 for r in reqs)
    assert all(r.arrival_s < 1800.0 for r in reqs)
    assert len(reqs) == pytest.approx(2.0 * 1800.0, rel=0.08)   # Poisson: sd ~ 1.7 %


def test_orca_pow2_runs_on_the_papers_rule_in_the_simulator():
    from kvsim.simulator import FixedStepCost

    cfg = rp.ReproConfig(duration_s=10.0, sample_interval_s=1.0)
    reqs = [_req(0, 40, 25)]
    res = rp.run_simulation(reqs, "orca_pow2", cfg, FixedStepCost(0.1), snapshot_times_s=(1.05,))
    (_, _, snap), = res.snapshots
    classes = np.bincount(snap.cell_class[snap.block_tables[0]], minlength=len(MEMORY_CLASSES))
    counts = dict(zip(MEMORY_CLASSES, classes))
    assert len(snap.block_tables[0]) == 128                  # buddy(40 + 32)
    assert counts["internal_fragmentation"] == 7             # 32 - 25 output slots never used
    assert counts["token_states"] + counts["reservation"] == 65
    assert rp.system_engine("orca_pow2", cfg).config.allocator == "pow2"   # no allocator swapped in


def test_the_papers_vllm_runs_the_v0_scheduler_and_the_v1_row_v1():
    cfg = rp.ReproConfig()
    v0, v1 = (rp.system_engine(s, cfg).config for s in ("vllm", "vllm_v1"))
    assert (v0.scheduler, v1.scheduler) == ("v0", "v1")
    assert v0.watermark == v1.watermark == 0.01 and not v0.null_block and not v1.null_block
    assert (v0.num_blocks, v0.max_num_batched_tokens) == (v1.num_blocks, v1.max_num_batched_tokens)
    # the paper's engines (and today's v1 row) schedule synchronously, although the roofline
    # describes a GPU (where build_engine defaults to vLLM 0.33's async scheduling)
    for s in rp.REPORT_SYSTEMS:
        assert not rp.system_engine(s, cfg).config.async_scheduling, s
    assert all(r.system == "vllm_v1" for r in rp.plan_runs(cfg, False) if r.mode != "basic")


# ---- measurements ----------------------------------------------------------------------------

def _fake_result(rows, snapshots=()):
    ts = pd.DataFrame(rows)
    return SimpleNamespace(timeseries=ts, summary={"requests_finished": 3, "num_preemptions": 1},
                           snapshots=list(snapshots), requests=pd.DataFrame())


def _row(t, running, waiting, **slots):
    row = {"time_s": t, "running": running, "waiting": waiting}
    row.update({c: slots.get(c, 0) for c in MEMORY_CLASSES})
    return row


def test_measure_averages_over_the_window_and_folds_classes():
    cfg = rp.ReproConfig(duration_s=3.0)
    rows = [_row(0.0, 2, 1, token_states=20, reservation=10, internal_fragmentation=30,
                 external_fragmentation=40),
            _row(1.0, 4, 0, token_states=60, reservation=10, free=30),
            _row(2.0, 0, 0, free=100),
            _row(3.0, 9, 9, token_states=100)]          # outside [0, duration): ignored
    m = rp.measure(_fake_result(rows), "orca_max", cfg)
    assert m.shares_pct == pytest.approx({"token_states": 80 / 3, "reservation": 20 / 3,
                                          "internal_fragmentation": 10.0,
                                          "external_and_other": 170 / 3})
    # over held slots only: 80 + 20 + 30 = 130
    assert m.shares_used_pct["token_states"] == pytest.approx(100 * 80 / 130)
    # only the first sample had a request waiting
    assert m.shares_saturated_pct["external_and_other"] == pytest.approx(40.0)
    assert m.mean_running == pytest.approx(2.0)
    assert m.saturated_fraction == pytest.approx(1 / 3)
    assert (m.num_finished, m.num_preemptions) == (3, 1)


def test_measure_names_missing_timeseries_columns():
    res = SimpleNamespace(timeseries=pd.DataFrame({"time_s": [0.0]}), summary={}, snapshots=[])
    with pytest.raises(KeyError, match="lacks columns"):
        rp.measure(res, "vllm", rp.ReproConfig())


def test_sharing_counts_from_real_fork_snapshots():
    # two samples of a 40-token prompt (2 full blocks + 8 tokens) with block_size 16
    a = PagedAllocator(num_blocks=16, block_size=16, enable_prefix_caching=False)
    assert a.allocate(0, 40)
    a.fork(0, 1)
    snap1 = a.snapshot()     # 3 blocks each referenced twice: saved 3 of 6
    assert a.append(0, 1)    # copy-on-write of the shared partial block
    snap2 = a.snapshot()     # 2 shared full blocks + 2 private tails: saved 2 of 6
    cfg = rp.ReproConfig(duration_s=100.0)
    saved, total, mean_ratio = rp.sharing_counts(_fake_result([], [(1.0, 0, snap1), (2.0, 0, snap2),
                                                                   (200.0, 0, snap1)]), cfg)
    assert (saved, total) == (5.0, 12.0)
    assert mean_ratio == pytest.approx((50.0 + 100 * 2 / 6) / 2)


# ---- results, report, CLI --------------------------------------------------------------------

def _results(**fig13_sharegpt):
    """A results dict with the paper's own numbers as 'measured' (for report tests)."""
    fig2 = {s: {c: (v if v is not None else 0.0) for c, v in by.items()}
            for s, by in rp.PAPER_FIG2.items()}
    fig13 = json.loads(json.dumps(rp.PAPER_FIG13))
    fig13["sharegpt"].update(fig13_sharegpt)
    return {"schema": "kvsim.reproduce.vllm-paper/1", "fig2": fig2, "fig13": fig13,
            "fig15": json.loads(json.dumps(rp.PAPER_FIG15)),
            "paper": {"fig2": rp.PAPER_FIG2, "fig13": rp.PAPER_FIG13, "fig15": rp.PAPER_FIG15},
            "sensitivity": {}, "runs": {}, "workloads": {},
            "setup": {**{k: getattr(rp.ReproConfig(), k) for k in (
                "model", "gpu", "kv_cache_bytes", "kv_bytes_per_token", "block_size", "max_model_len",
                "max_prompt_tokens", "min_tokens", "duration_s", "sharegpt_rate", "alpaca_rate",
                "fig15_workload", "fig15_rate", "seed", "placement", "watermark", "max_num_seqs",
                "max_num_batched_tokens", "step_time_scale", "sample_interval_s",
                "snapshot_interval_s")}, "capacity_tokens": 15728, "num_blocks": 983}}


def test_differences_flag_3_points_or_10_percent():
    res = _results(vllm=30.42 * 1.09, orca_oracle=13.62 * 1.11)
    res["fig2"]["orca_max"]["token_states"] = 20.4 + 3.5
    res["fig2"]["orca_pow2"]["token_states"] = 26.8 - 2.9
    flags = {d["key"]: d["flag"] for d in report.differences(res)}
    assert flags["fig2.orca_max.token_states"] is True
    assert flags["fig2.orca_pow2.token_states"] is False
    assert flags["fig13.sharegpt.vllm"] is False
    assert flags["fig13.sharegpt.orca_oracle"] is True
    assert flags["fig2.vllm.reservation"] is False      # the paper prints no value
    assert sum(flags.values()) == 2


def test_ordering_checks_catch_a_broken_order():
    res = _results()
    assert all(report.ordering_checks(res).values())
    res["fig13"]["sharegpt"]["orca_pow2"] = res["fig13"]["sharegpt"]["orca_oracle"]
    checks = report.ordering_checks(res)
    assert checks["fig13.sharegpt"] is False and checks["fig13.alpaca"] is True


def test_reports_show_paper_and_measured_values_deterministically(tmp_path):
    res = _results(vllm=12.34)
    md = render_markdown(res)
    assert "| Orca (Max) | paper | 20.4 | 13.3 | 57.3 | 8.9 |" in md
    assert "| ShareGPT-like (synthetic) | vLLM | 30.42 | 12.34 | 0.41 |" in md
    assert "`fig13.sharegpt.vllm`: paper 30.42, kvsim 12.34" in md
    assert "fig13.sharegpt: DOES NOT HOLD" in md
    html = render_html(res)
    assert html == render_html(res)                  # no random div ids, no clock
    assert 'id="kvsim-repro-fig2"' in html and 'id="kvsim-repro-fig15"' in html
    paths = report.write_outputs(res, tmp_path / "out")
    assert json.loads(paths["json"].read_text())["fig13"]["sharegpt"]["vllm"] == 12.34


def test_cli_rejects_an_out_path_that_is_a_file(tmp_path, monkeypatch):
    parser = argparse.ArgumentParser(prog="kvsim")
    register(parser.add_subparsers(dest="command"))
    target = tmp_path / "file"
    target.write_text("x")
    args = parser.parse_args(["reproduce", "vllm-paper", "--out", str(target), "--quiet"])
    assert args.func.__module__ == "kvsim.cli.reproduce" and args.quiet and not args.quick
    def must_not_run(config, progress):
        raise AssertionError("the simulations ran before --out was checked")

    monkeypatch.setattr(rp, "run_reproduction", must_not_run)
    with pytest.raises(InputError, match="exists and is not a directory"):
        args.func(args)


def test_a_missing_sharegpt_file_is_a_clear_error(tmp_path):
    cfg = rp.ReproConfig(sharegpt_file=str(tmp_path / "nope.csv"))
    with pytest.raises(InputError) as err:
        rp.find_sharegpt_file(cfg)
    assert err.value.file == str(tmp_path / "nope.csv")
    assert rp.find_sharegpt_file(rp.ReproConfig(sharegpt_file="")) is None


# ---- the scaled-down experiment --------------------------------------------------------------

def small_config(**overrides) -> rp.ReproConfig:
    """The paper's experiments scaled down: half the pool (Orca (Max) fits 3), 2-minute traces,
    and step times x2 so that every system is memory-bound as in the paper (docs/REPRODUCTION.md:
    with the plain roofline, vLLM is not)."""
    base = dict(duration_s=120.0, sharegpt_rate=1.5, alpaca_rate=30.0, fig15_rate=1.0,
                kv_cache_bytes=6 * 2**30, step_time_scale=2.0, sensitivity=False,
                sharegpt_file="", sample_interval_s=2.0, snapshot_interval_s=10.0)
    base.update(overrides)
    return rp.ReproConfig(**base)


@pytest.fixture(scope="module")
def small_results():
    return rp.run_reproduction(small_config(), progress=False)


def test_small_run_has_the_results_schema(small_results):
    flat = report.flatten({k: small_results[k] for k in ("fig2", "fig13", "fig15")})
    assert sorted(flat) == sorted(report.expected_figure_keys())
    assert all(isinstance(v, float) for v in flat.values())
    for s in rp.REPORT_SYSTEMS:
        assert sum(small_results["fig2"][s].values()) == pytest.approx(100.0, abs=0.05)
    # both schedulers are measured against the paper's vLLM
    assert small_results["paper"]["fig13"]["sharegpt"]["vllm_v1"] == 30.42
    assert json.loads(json.dumps(small_results, allow_nan=False)) == small_results


def test_small_run_reproduces_the_papers_orderings(small_results):
    fig2, fig13 = small_results["fig2"], small_results["fig13"]
    token = [fig2[s]["token_states"] for s in rp.SYSTEMS]
    assert token == sorted(token) and len(set(token)) == 4, token
    for wl in ("sharegpt", "alpaca"):
        conc = [fig13[wl][s] for s in rp.SYSTEMS]
        assert conc == sorted(conc) and len(set(conc)) == 4, (wl, conc)
    # Orca (Max) holds max_model_len per request: at most floor(pool / 2048) run at once
    assert fig13["sharegpt"]["orca_max"] <= small_config().capacity_tokens // 2048 == 3
    # Max wastes most of its reservation to internal fragmentation; Oracle has none
    assert fig2["orca_max"]["internal_fragmentation"] > 40.0
    assert fig2["orca_oracle"]["internal_fragmentation"] == 0.0
    fig15 = small_results["fig15"]
    for n in ("2", "4", "6"):
        assert 0.0 < fig15["parallel"][n] < fig15["beam"][n] < 100.0
    assert fig15["parallel"]["2"] < fig15["parallel"]["6"]


def test_small_run_shows_both_schedulers_side_by_side(small_results):
    """The paper's vLLM (v0: prompt-only steps stall every decode) keeps more requests in flight
    than the v1 scheduler on Alpaca's short requests, and the report shows both rows in Fig. 13
    against the paper's value."""
    fig13 = small_results["fig13"]
    assert fig13["alpaca"]["vllm"] > fig13["alpaca"]["vllm_v1"]
    md = render_markdown(small_results)
    fig13_md = md[md.index("## Fig. 13"):md.index("## Fig. 15")]
    for wl, label in (("sharegpt", "ShareGPT-like (synthetic)"), ("alpaca", "Alpaca-like (synthetic)")):
        paper = small_results["paper"]["fig13"][wl]["vllm"]
        for system, name in (("vllm", "vLLM"), ("vllm_v1", "vLLM, v1 scheduler")):
            assert f"| {label} | {name} | {paper:.2f} | {fig13[wl][system]:.2f} |" in fig13_md


def test_small_run_is_deterministic(small_results):
    again = rp.run_reproduction(small_config(), progress=False)
    assert json.dumps(again, sort_keys=True) == json.dumps(small_results, sort_keys=True)
