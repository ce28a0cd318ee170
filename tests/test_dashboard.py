"""kvsim.dashboard's logic, called directly (no Streamlit): sources, scenario, playback,
comparison, planning, kernel check, launch. The pages over it are tested in test_app.py."""
import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsim import workloads
from kvsim.dashboard import comparison, launch, planning, playback, sources
from kvsim.dashboard.kernel_check import check_snapshot
from kvsim.dashboard.scenario import (MIN_FRAMES, SNAPSHOT_CELL_BUDGET, Scenario, engine_setup,
                                      frame_times, num_frames_for, simulate_scenario)
from kvsim.dashboard.sources import Workload
from kvsim.errors import InputError
from kvsim.viz.pool import CODE_CACHED, CODE_FREE, cell_codes, code_colors, tile_codes

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "workloads"
SMALL = Workload("builtin", workloads.DEFAULT_WORKLOAD, 40)


@pytest.fixture(scope="module")
def runs():
    """The default scenario's two runs on 40 requests (paged left, max right)."""
    sc = Scenario(SMALL)
    return sc, simulate_scenario(sc, sources.load_requests(SMALL))


# ---------------------------------------------------------------- sources
def test_dashboard_logic_does_not_import_streamlit():
    code = ("import sys; import kvsim.dashboard.comparison, kvsim.dashboard.kernel_check, "
            "kvsim.dashboard.launch, kvsim.dashboard.planning, kvsim.dashboard.playback, "
            "kvsim.dashboard.scenario, kvsim.dashboard.sources, kvsim.cli.dashboard; "
            "print('streamlit' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_upload_limits(tmp_path):
    with pytest.raises(InputError, match=r"^big\.csv: 20\.0 MB is over the 20 MB upload limit"):
        sources.store_upload("big.csv", b"x" * (sources.MAX_UPLOAD_MB * 2**20 + 1), store=tmp_path)
    with pytest.raises(InputError, match=r"^empty\.csv: the file is empty$"):
        sources.store_upload("empty.csv", b"  \n", store=tmp_path)
    # never parsed as anything but a trace: a pickle is refused by its suffix
    with pytest.raises(InputError, match=r"^evil\.pkl: unsupported file type \.pkl; use \.csv"):
        sources.store_upload("evil.pkl", b"\x80\x04K\x01.", store=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing refused was written


def test_upload_is_kept_under_its_digest_with_the_users_name(tmp_path):
    w = sources.store_upload("ok.csv", b"a,b\n1,2\n", 30, 1.5, store=tmp_path)
    assert w.kind == "upload" and (w.max_requests, w.rate) == (30, 1.5)
    assert Path(w.ref).name == "ok.csv" and Path(w.ref).read_bytes() == b"a,b\n1,2\n"
    assert sources.store_upload("ok.csv", b"a,b\n1,2\n", store=tmp_path).ref == w.ref
    other = sources.store_upload("ok.csv", b"a,b\n3,4\n", store=tmp_path)
    assert other.ref != w.ref and Path(w.ref).read_bytes() == b"a,b\n1,2\n"
    # the user reads their file name, never the storage folder
    err = InputError("not a number: 'abc'", file=w.ref, line=3, field="b")
    assert sources.user_message(err, w) == "ok.csv:3: field 'b': not a number: 'abc'"
    assert sources.user_message(err, SMALL) == str(err)


def test_shared_trace_files_lists_traces_only(tmp_path):
    assert sources.shared_trace_files(tmp_path / "absent") == []
    (tmp_path / "azure").mkdir()
    for name in ("azure/conv.csv", "a.jsonl", "notes.md", "azure/x.parquet"):
        (tmp_path / name).write_text("x")
    assert sources.shared_trace_files(tmp_path) == ["a.jsonl", "azure/conv.csv"]
    assert sources.workload_source(Workload("shared", "azure/conv.csv")) == str(
        sources.SHARED_TRACES / "azure/conv.csv")
    assert sources.workload_source(SMALL) == workloads.DEFAULT_WORKLOAD


def test_traces_without_timestamps_get_arrivals_at_the_rate():
    lengths = Workload("upload", str(FIXTURES / "sharegpt.csv"), 2, rate=4.0)
    assert sources.needs_rate(lengths)
    arrivals = [r.arrival_s for r in sources.load_requests(lengths)]
    assert len(arrivals) == 2 and 0 == arrivals[0] < arrivals[1]
    timed = Workload("upload", str(FIXTURES / "azure.csv"), 3)
    assert not sources.needs_rate(timed) and len(sources.load_requests(timed)) == 3
    with pytest.raises(InputError, match="ContextTokens"):  # other loader errors propagate
        sources.needs_rate(Workload("upload", str(FIXTURES / "bad" / "azure_non_numeric.csv")))


def test_shared_traces_with_and_without_timestamps(shared_traces):
    w = Workload("shared", "sharegpt_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
                 30, rate=4.0)
    assert sources.needs_rate(w)
    arrivals = [r.arrival_s for r in sources.load_requests(w)]
    assert len(arrivals) == 30 and arrivals == sorted(arrivals)
    assert 30 / 4.0 / 3 < arrivals[-1] < 30 / 4.0 * 3  # about n / rate seconds
    assert not sources.needs_rate(Workload("shared", "mooncake/conversation_trace.jsonl", 5))
    assert "mooncake/conversation_trace.jsonl" in sources.shared_trace_files()


# ---------------------------------------------------------------- scenario
def test_engine_setup_sizes_both_sides_with_the_same_memory():
    sc = Scenario(SMALL, capacity_tokens=4096, block_size=32, step_s=0.01)
    paged = engine_setup(sc, "paged")
    assert (paged.config.num_blocks, paged.config.capacity_tokens) == (128, None)
    assert not paged.config.null_block and paged.cost.step_s == 0.01
    contiguous = engine_setup(sc, "max").config
    assert (contiguous.num_blocks, contiguous.capacity_tokens) == (None, 4096)
    assert contiguous.max_model_len == sc.max_model_len == 4096
    # replay's batch limits, not a GPU's (no model or GPU is involved)
    assert (contiguous.max_num_seqs, contiguous.max_num_batched_tokens) == (256, 8192)


def test_frame_times_and_frame_budget():
    assert list(frame_times(10.0, 3)) == [0.0, 5.0, 10.0]
    with pytest.raises(ValueError, match="num_frames must be >= 2, got 1"):
        frame_times(1.0, 1)
    assert num_frames_for(Scenario(SMALL)) == 100  # 8192 tokens: 512 blocks + 8192 slots
    for tokens in (65_536, 262_144):
        cells = tokens // 16 + tokens
        n = num_frames_for(Scenario(SMALL, capacity_tokens=tokens))
        assert n * cells <= SNAPSHOT_CELL_BUDGET < (n + 1) * cells
    assert num_frames_for(Scenario(SMALL, capacity_tokens=2**21)) == MIN_FRAMES


def test_both_sides_are_snapshotted_at_the_same_times(runs):
    sc, (left, right) = runs
    assert (left.allocator, right.allocator) == sc.allocators
    np.testing.assert_array_equal(left.frame_times_s, right.frame_times_s)
    assert len(left.snapshots) == len(right.snapshots) == sc.num_frames
    assert left.frame_times_s[-1] == pytest.approx(max(left.end_s, right.end_s))
    assert {left.snapshots[0].kind, right.snapshots[0].kind} == {"paged", "contiguous"}
    for run in (left, right):
        assert run.summary["requests_finished"] == 40
        assert run.summary["simulated_duration_s"] == pytest.approx(run.end_s)
        # past its end a side shows its final pool: nothing held any more
        done = [s for s, t in zip(run.snapshots, run.frame_times_s) if t >= run.end_s]
        assert done and all(not s.block_tables for s in done)
    busy = left.snapshots[playback.default_frame(sc.num_frames)]
    assert busy.block_tables  # the opening frame shows requests holding memory


def test_scenario_is_deterministic(runs):
    sc, first = runs
    again = simulate_scenario(sc, sources.load_requests(SMALL))
    for a, b in zip(first, again):
        assert {**a.summary, "wall_clock_s": 0} == {**b.summary, "wall_clock_s": 0}
        pd.testing.assert_frame_equal(a.timeseries, b.timeseries)


def test_impossible_pool_is_an_input_error():
    with pytest.raises(InputError, match="kv_tokens 8 is less than one block of 16 tokens"):
        simulate_scenario(Scenario(SMALL, capacity_tokens=8), sources.load_requests(SMALL))


# ---------------------------------------------------------------- playback
def test_frame_step_is_the_users_pick_within_the_budget():
    cheap = playback.frame_cost_s([(True, 512), (False, 8192)])
    assert playback.frame_step_s(100.0, 0.5, cheap) == (0.5, "")
    step, note = playback.frame_step_s(100.0, None, cheap)   # auto: about DEFAULT_FRAMES frames
    assert step == pytest.approx(100.0 / playback.DEFAULT_FRAMES) and note == ""
    big = playback.frame_cost_s([(True, 131_072), (False, 2_097_152)])
    step, note = playback.frame_step_s(100.0, 0.01, big)   # 10,000 frames asked: too many
    most = int(playback.FRAME_TIME_BUDGET_S / big)
    assert step == pytest.approx(100.0 / (most - 1)) and "not 0.01 s" in note
    times = playback.playback_times(10.0, 3.0)
    assert list(times) == [0.0, 3.0, 6.0, 9.0, 10.0]   # the last frame at the end
    assert list(playback.playback_times(9.0, 3.0)) == [0.0, 3.0, 6.0, 9.0]
    # 1037 x 0.1 is 103.69999999999999: the last frame is the end itself, or the slower side's
    # final pool was never drawn (a request still running on the last frame)
    assert playback.playback_times(103.7, 0.1)[-1] == 103.7


def test_playback_frames_replay_every_pool_and_end_when_all_requests_are_done(runs):
    sc, pair = runs
    times = pair[0].playback.times_s
    np.testing.assert_array_equal(times, pair[1].playback.times_s)
    assert times[-1] == pytest.approx(max(r.end_s for r in pair))
    # frames at the coarse snapshots' times: replaying the changes gives each snapshot's codes
    end_s = times[-1]
    aligned = simulate_scenario(Scenario(SMALL, frame_s=end_s / 99), sources.load_requests(SMALL))
    for run in aligned:
        frames = run.playback
        assert len(frames.times_s) == len(run.frame_times_s) == 100
        for f, snap in enumerate(run.snapshots):
            expect = tile_codes(cell_codes(snap.cell_class, snap.owner, snap.ref_cnt),
                                frames.cells_per_tile)
            np.testing.assert_array_equal(frames.codes_at(f), expect)
    for run in pair:
        frames = run.playback
        fig = frames.figures
        # after the last finish: no request runs or waits, and only cached blocks stay
        assert fig["running"][-1] == fig["waiting"][-1] == fig["kv_usage"][-1] == 0
        assert fig["finished"][-1] == run.summary["requests_finished"] == 40
        assert fig["token_states"][-1] == fig["reservation"][-1] == fig["internal_fragmentation"][-1] == 0
        held = {c for c in np.unique(frames.codes_at(len(times) - 1))}
        assert held <= {CODE_FREE, CODE_CACHED}
        assert (fig["preemptions"][-1] == run.summary["num_preemptions"])


def test_player_payload_round_trips(runs):
    _, pair = runs
    data = playback.decode_player(playback.with_start_frame(comparison.live_payload(pair), 7))
    assert data["start_frame"] == 7 and data["num_frames"] == len(pair[0].playback.times_s)
    for side, run in zip(data["sides"], pair):
        frames = run.playback
        np.testing.assert_array_equal(side["first"], frames.first)
        np.testing.assert_array_equal(side["change_tile"], frames.change_tile)
        assert side["rows"] * side["cols"] >= side["num_tiles"] == frames.num_tiles
        np.testing.assert_allclose(side["figures"]["running"], frames.figures["running"])
        assert side["title"] == comparison.side_label(run) and side["end_s"] == run.end_s
    assert data["colors"] == code_colors()


def test_playback_helpers():
    state = {"k_frame": 9}
    playback.clamp_frame(state, 3)
    assert state["k_frame"] == 2
    assert playback.start_frame({}, 100) == playback.default_frame(100) == 10
    assert playback.start_frame({"live_frame": 250}, 100) == 99
    assert playback.frame_at(np.array([0.0, 1.0, 2.0]), 1.5) == 1
    ts = pd.DataFrame({"time_s": [0.0, 1.0, 2.0], "v": [1, 2, 3]})
    assert playback.sample_at(ts, 1.5)["v"] == 2 and playback.sample_at(ts, -1)["v"] == 1
    with pytest.raises(ValueError, match="the timeseries is empty"):
        playback.sample_at(ts.iloc[:0], 1.0)
    assert list(playback.upto(ts, 1.0)["v"]) == [1, 2]
    assert playback.fmt_duration(12.34) == "12.3 s"
    assert playback.fmt_duration(125.0) == "2 min 05.0 s"


def test_a_pool_too_large_for_memory_is_refused_before_anything_is_allocated():
    with pytest.raises(InputError, match=r"would need [0-9,.]+ GiB of memory"):
        simulate_scenario(Scenario(SMALL, capacity_tokens=10**13), sources.load_requests(SMALL))


def test_prefix_caching_on_and_off_side_by_side():
    sc = Scenario(SMALL, allocators=("paged", "paged"), enable_prefix_caching=(True, False))
    on, off = simulate_scenario(sc, sources.load_requests(SMALL))
    assert [comparison.run_label(i, r) for i, r in enumerate((on, off))] == [
        "left: paged (vLLM blocks)", "right: paged (vLLM blocks), prefix caching off"]
    assert on.summary["prefix_hit_rate"] > 0 == off.summary["prefix_hit_rate"]
    assert on.summary["computed_prompt_tokens"] < off.summary["computed_prompt_tokens"]
    assert engine_setup(sc, "paged", 1).config.enable_prefix_caching is False


# ---------------------------------------------------------------- comparison
def test_every_simulator_allocator_is_explained():
    from kvsim.simulator.config import ALLOCATORS
    assert set(comparison.ALLOCATOR_NOTES) == set(ALLOCATORS) == set(comparison.ALLOCATOR_LABELS)


def test_summaries_side_by_side(runs):
    _, pair = runs
    labels = [comparison.run_label(i, r) for i, r in enumerate(pair)]
    assert labels == ["left: paged (vLLM blocks)", "right: contiguous, reserve max_model_len"]
    table = comparison.summary_table(pair)
    assert list(table.columns) == labels
    assert set(table.loc["requests_finished"]) == {"40"}
    assert set(comparison.HEADLINE) <= set(table.index)  # every headline bar has its metric
    flat = comparison.flat_summaries(pair)[labels[0]]
    assert flat["ttft_s.p90"] == pair[0].summary["ttft_s"]["p90"]


def test_prefix_hit_rate_over_time(runs):
    _, pair = runs
    hits = comparison.prefix_frame(pair)
    paged, contiguous = (hits[comparison.run_label(i, r)] for i, r in enumerate(pair))
    assert hits["time_s"].is_monotonic_increasing
    # the default workload shares a system prompt: the paged side hits, the contiguous never
    assert 0 < paged.dropna().iloc[-1] <= 1
    assert (contiguous.dropna() == 0).all()


def test_pool_figure_title_says_when_a_side_is_done(runs):
    sc, (left, right) = runs
    faster = min((left, right), key=lambda r: r.end_s)
    last = len(faster.snapshots) - 1
    title = comparison.pool_figure(faster, last, sc.block_size).layout.title.text
    assert title.startswith(comparison.ALLOCATOR_LABELS[faster.allocator] + " · t = ")
    assert title.endswith("(all requests done)") == (faster.frame_times_s[last] > faster.end_s)
    assert "done" not in comparison.pool_figure(left, 1, sc.block_size).layout.title.text
    # a frame past the last one shows the last (a run may have fewer frames than the slider)
    assert (comparison.pool_figure(left, 10_000, sc.block_size).layout.title.text ==
            comparison.pool_figure(left, last, sc.block_size).layout.title.text)


def test_rejected_requests_warning(runs):
    _, (left, _) = runs
    assert comparison.rejected_warning(0, left, 4096) is None
    rejecting = Scenario(SMALL, max_model_len=1024)
    run = simulate_scenario(rejecting, sources.load_requests(SMALL))[1]
    text = comparison.rejected_warning(1, run, 1024)
    n = run.summary["requests_rejected"]
    assert n > 0 and text.startswith(f"right: contiguous, reserve max_model_len: {n} of 40 ")
    assert "max_model_len = 1024" in text


# ---------------------------------------------------------------- planning
def test_capacity_and_its_sweep_mark_impossible_points():
    with pytest.raises(ValueError, match="max_model_len"):
        planning.capacity("Llama-3.1-8B", "L4", max_model_len=1_000_000)
    base = tuple(sorted(dict(tp=1, kv_dtype="auto", gpu_memory_utilization=0.9,
                             block_size=16).items()))
    sweep = planning.capacity_sweep("Llama-3.1-8B", "L4", "max_model_len", base)
    assert list(sweep["max_model_len"]) == list(planning.SWEEPS["max_model_len"][1])
    ok = sweep[sweep["error"].isna()]
    assert ok["max_concurrency"].is_monotonic_decreasing and len(ok) >= 3
    assert ok["num_gpu_blocks"].nunique() == 1  # the pool does not depend on max_model_len
    assert sweep["error"].notna().any()  # 131072 tokens of Llama KV do not fit on an L4
    assert sweep["num_gpu_blocks"].isna().sum() == sweep["error"].notna().sum()


def test_simulated_sweep_replays_each_allocator_on_the_gpu_pool():
    base = tuple(sorted(dict(model="Llama-3.1-8B", gpu="A100-40GB", tp=1,
                             max_model_len=4096).items()))
    table = planning.simulated_sweep(SMALL, ("paged", "max"), "rate", base)
    assert table["error"].isna().all()
    assert sorted(set(table["allocator"])) == ["max", "paged"]
    paged = table[table["allocator"] == "paged"].sort_values("rate")
    assert list(paged["rate"]) == list(planning.SIM_SWEEPS["rate"][1])
    # the same 40 requests arrive faster: throughput cannot fall
    assert paged["request_throughput_per_s"].is_monotonic_increasing
    assert (paged["requests_finished"] == 40).all()
    assert set(planning.SIM_SWEEP_METRICS) <= set(table.columns)


def test_a_cpu_tier_below_the_paged_side_and_its_occupancy():
    sc = Scenario(SMALL, capacity_tokens=2048, cpu_offload_gib=0.5)
    assert engine_setup(sc, "paged").offload[0].num_chunks == 256     # 2 MiB Llama blocks
    assert engine_setup(sc, "max").offload == ()
    paged, contiguous = simulate_scenario(sc, sources.load_requests(SMALL))
    assert "offload" in paged.summary and "offload" not in contiguous.summary
    now = playback.sample_at(paged.timeseries, paged.end_s)
    rows = comparison.tier_rows(paged, now)
    assert [r["tier"] for r in rows] == ["GPU pool", "CPU tier"]
    assert 0 < rows[1]["cached"] <= 1 and "/ 256 chunks" in rows[1]["label"]
    assert rows[0]["held"] == pytest.approx(float(now["kv_usage"]))
    assert [r["tier"] for r in comparison.tier_rows(contiguous, playback.sample_at(
        contiguous.timeseries, 0.0))] == ["GPU pool"]
    from kvsim.viz.tiers import tier_occupancy_figure
    fig = tier_occupancy_figure(rows)
    assert list(fig.data[1].y) == ["CPU tier", "GPU pool"] and fig.layout.barmode == "stack"


def test_the_cache_curve_marks_the_gpu_pool():
    base = tuple(sorted(dict(tp=1, kv_dtype="auto", gpu_memory_utilization=0.9, block_size=16,
                             max_model_len=8192).items()))
    report = planning.cache_curve(SMALL, "Llama-3.1-8B", "L4", base, cpu_offload_gib=8.0,
                                  target_hit_rate=0.2)
    (label, gib), (cpu_label, cpu_gib) = report.marks.items()
    assert label.startswith("GPU pool (Llama-3.1-8B on 1 x L4)") and 0 < gib < 24
    assert cpu_label == "CPU tier 8 GiB" and cpu_gib == pytest.approx(8.0)
    assert report.table["lru_hit_rate"].is_monotonic_increasing
    assert report.plan is not None and report.lines[-1] == report.plan.describe()
    with pytest.raises(InputError, match="target"):
        planning.cache_curve(SMALL, "Llama-3.1-8B", "L4", base, target_hit_rate=2.0)


def test_the_cache_curve_takes_an_uploaded_config(tmp_path):
    """An uploaded config.json is the model of the curve's GPU pool and of its CPU tier's chunks
    (planning.resolve_model), as on the capacity page."""
    import json

    config = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024,
              "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
              "vocab_size": 1000, "_name_or_path": "tiny-llama"}
    path = planning.store_hf_config("config.json", json.dumps(config).encode(), store=tmp_path)
    base = tuple(sorted(dict(tp=1, kv_dtype="auto", gpu_memory_utilization=0.9, block_size=16,
                             max_model_len=2048).items()))
    report = planning.cache_curve(SMALL, path, "L4", base, cpu_offload_gib=1.0)
    label, gib = next(iter(report.marks.items()))
    assert label.startswith("GPU pool (tiny-llama on 1 x L4)")
    # 4 layers x 2 KV heads x 64 dims x 2 (K, V) x 2 bytes = 2 KiB a token, 32 KiB a block:
    # 1 GiB is 32,768 chunks
    assert "1 GiB, 32,768 chunks" in report.lines[-1]


# ---------------------------------------------------------------- kernel check
def test_kernel_check_on_a_scenario_snapshot(runs):
    sc, (left, _) = runs
    snap = left.snapshots[playback.default_frame(sc.num_frames)]
    checks, info = check_snapshot(snap, "flat", "float32", 2, False)
    assert len(checks) == min(2, len(snap.block_tables))
    assert checks["passed"].all() and checks["bitwise_equal"].all() and info["passed"]
    assert (checks["max_rel_err"] < info["tolerance"]).all()
    assert info["device"] == "cpu" and info["dtype"] == "float32"
    # a moment with shared prefix blocks: 4 checked sequences read them, first-4-by-id would not
    from kvsim.kernels.bridge import _readers, choose_sequences, pool_arrays

    def coverage(snapshot, ids):
        arrays = pool_arrays(snapshot)
        tables = {s: arrays.block_tables[s][:-(-arrays.seq_lens[s] // arrays.block_size)]
                  for s in ids if arrays.seq_lens[s] > 0}
        return int((_readers(tables, arrays.num_blocks) >= 2).sum()), tables

    best = max(left.snapshots, key=lambda snap: coverage(snap, snap.block_tables)[0])
    shared, tables = coverage(best, best.block_tables)
    assert shared > 0 and len(tables) > 4
    chosen = choose_sequences(tables, best.num_cells, 4)
    by_id = sorted(tables)[:4]
    assert coverage(best, chosen)[0] >= coverage(best, by_id)[0] and coverage(best, chosen)[0] > 0
    _, info = check_snapshot(best, "flat", "float32", 4, False)
    assert info["num_shared_blocks"] == shared and info["num_shared_blocks_checked"] == coverage(best, chosen)[0]


def test_kernel_check_of_the_frames_engine_step(runs):
    """The whole step that produced a frame, in one unified launch: every scheduled sequence still
    in the pool, in batch order, each with the tokens it computed in that step."""
    sc, (left, _) = runs
    snap = left.snapshots[playback.default_frame(sc.num_frames)]
    assert snap.step_seq_ids is not None and len(snap.step_seq_ids)
    checks, info = check_snapshot(snap, "flat", "float32", 1, False, step=True)
    assert checks["seq_id"].tolist() == snap.step_seq_ids.tolist()       # all of it, max_seqs aside
    assert checks["num_new_tokens"].tolist() == snap.step_num_new_tokens.tolist()
    assert (checks["num_computed_tokens"] + checks["num_new_tokens"]).tolist() == \
        [snap.seq_lens[s] for s in snap.step_seq_ids.tolist()]
    assert checks["passed"].all() and checks["bitwise_equal"].all() and info["passed"]


# ---------------------------------------------------------------- launch
def test_streamlit_command_serves_the_packaged_entry_script():
    cmd = launch.streamlit_command(9000, True)
    assert cmd[:5] == [sys.executable, "-m", "streamlit", "run", str(launch.ENTRY_SCRIPT)]
    flags = dict(zip(cmd[5::2], cmd[6::2]))
    assert flags["--server.port"] == "9000" and flags["--server.headless"] == "true"
    assert flags["--browser.gatherUsageStats"] == "false"
    assert launch.streamlit_command(9000, False)[-1] == "false"


def test_entry_script_is_alone_in_its_folder():
    # Streamlit puts this folder first on sys.path: anything else in it becomes a top-level name
    assert [p.name for p in launch.ENTRY_SCRIPT.parent.iterdir()
            if p.name != "__pycache__"] == ["kvsim_dashboard.py"]


def test_repository_streamlit_config_matches_the_launch_flags():
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    flat = {f"{section}.{key}": value for section, table in config.items()
            for key, value in table.items()}
    assert flat == launch.STREAMLIT_OPTIONS


def test_dashboard_subcommand_becomes_streamlit(monkeypatch):
    from kvsim.cli import dashboard
    calls = []
    monkeypatch.setattr(dashboard.os, "execv", lambda path, argv: calls.append((path, argv)))
    parser = argparse.ArgumentParser()
    dashboard.register(parser.add_subparsers())
    args = parser.parse_args(["dashboard", "--port", "9001", "--open"])
    args.func(args)
    assert calls == [(sys.executable, launch.streamlit_command(9001, False))]


@pytest.mark.parametrize("port, why", [("70000", "must be <= 65535, got 70000"),
                                       ("0", "must be >= 1, got 0")])
def test_dashboard_subcommand_bad_port_is_a_usage_error(capsys, port, why):
    from kvsim.cli import main
    with pytest.raises(SystemExit) as stop:
        main(["dashboard", "--port", port])
    assert stop.value.code == 2
    assert f"argument --port: {why} (" in capsys.readouterr().err.splitlines()[-1]


def test_hybrid_scenario_snapshots_every_group_and_a_window_leaves_blocks_behind():
    from kvsim.dashboard.hybrid import (SHAPES, HybridScenario, groups_frame,
                                        most_released_request, simulate_hybrid)
    from kvsim.dashboard.sources import Workload, load_requests

    sc = HybridScenario(Workload("builtin", "sharegpt:rate=4,n=60,seed=1", 60),
                        groups="sliding:32,full", num_gpu_blocks=400, num_frames=12)
    run = simulate_hybrid(sc, load_requests(sc.workload))
    assert len(run.snapshots) == 12 and run.frame_times_s[-1] > 0
    busy = [s for s in run.snapshots if s.group_block_tables]
    released = [s for s in busy if most_released_request(s) is not None and any(
        0 in t[0] for t in s.group_block_tables.values())]
    assert released, "a window of 32 tokens must have freed blocks behind some request"
    snap = released[0]
    seq = most_released_request(snap)
    sliding, full = snap.group_block_tables[seq]
    assert 0 in list(sliding) and 0 not in list(full)
    frame = groups_frame(snap, run.summary)
    assert list(frame["group"]) == ["sliding:32", "full"]
    assert frame["released positions"][0] > 0 == frame["released positions"][1]
    assert set(SHAPES.values()) >= {"sliding:128,full"}


def test_uploads_may_be_gzipped_and_whole_traces_are_replayed(tmp_path):
    import gzip

    rows = "arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i},{50 + i},{5 + i}\n" for i in range(30))
    w = sources.store_upload("mine.csv.gz", gzip.compress(rows.encode()), None, store=tmp_path)
    assert Path(w.ref).name == "mine.csv.gz" and w.max_requests is None
    assert len(sources.load_requests(w)) == 30   # every request: no cap
    assert sources.requests_note(w) == "30 requests (all of them)"
    capped = Workload("upload", w.ref, 100)
    assert sources.requests_note(capped) == "30 requests: the trace has only 30 caps the 100 asked"
    assert sources.requests_note(Workload("upload", w.ref, 10)) is None
    spec = Workload("builtin", "sharegpt:rate=2,n=50,seed=0", 200)
    assert sources.requests_note(spec) == "50 requests: the spec's n=50 caps the 200 asked"
    with pytest.raises(InputError, match=r"unsupported file type \.pkl\.gz"):
        sources.store_upload("x.pkl.gz", b"\x1f\x8b...", store=tmp_path)
    assert sources.trace_suffix("A.JSONL.GZ") == ".jsonl" and sources.trace_suffix("a.csv") == ".csv"


def test_rejections_say_which_setting_fixes_them(runs):
    sc, _ = runs
    lengths = Scenario(SMALL, max_model_len=1024)
    run = simulate_scenario(lengths, sources.load_requests(SMALL))[0]   # paged: prompts too long
    text = comparison.rejected_warning(0, run, 1024)
    assert "have a prompt longer than max_model_len = 1024 (raise max_model_len" in text
    tiny = Scenario(SMALL, capacity_tokens=2048, max_model_len=4096)
    left, right = simulate_scenario(tiny, sources.load_requests(SMALL))
    text = comparison.rejected_warning(1, right, 4096)   # max: reserves 4096 > 2048 tokens
    assert "enlarge the KV pool or lower max_model_len; raising it makes this worse" in text
    assert "raise max_model_len" not in text


def test_the_favicon_is_drawn_locally():
    from kvsim.dashboard import router

    assert router.page_icon().size == (32, 32)
    assert "toolbarMode" in "".join(launch.STREAMLIT_OPTIONS) and launch.STREAMLIT_OPTIONS["client.toolbarMode"] == "viewer"
