"""bench/vllm_compare.py: kvsim replays each committed real-vLLM closed-loop point on vLLM's
engine settings, with every request of the measured run, and reports finite errors."""
from __future__ import annotations

import csv
import json
import math

import pytest

from bench.vllm_compare import GPUS, RESULTS, ROOT, _simulated, main, measured, simulated


def test_measured_figures_are_vllm_bench_serves(tmp_path):
    m = measured(RESULTS / "llama8b-bf16" / "cl-1024-128-c4")
    assert m["completed"] == 8 and 0 < m["mean_ttft_ms"] < m["mean_e2el_ms"]
    # 128 tokens: E2E = TTFT + 127 gaps, and the median TPOT is of that order
    assert 0.5 < (m["mean_e2el_ms"] - m["mean_ttft_ms"]) / 127 / m["median_tpot_ms"] < 2


def test_compare_runs_on_the_committed_runs(tmp_path, capsys):
    out = tmp_path / "points.csv"
    assert main(["--engines", "llama8b-bf16", "--traces", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 12 and rows[-1]["point"] == "azure-conv"     # 11 closed-loop points, the excerpt
    for row in rows:
        for clock in ("roofline", "table"):
            for metric in ("mean_ttft_ms", "median_tpot_ms", "mean_e2el_ms"):
                assert math.isfinite(float(row[f"{clock}_{metric}_err"]))
    text = capsys.readouterr().out
    assert "median |error|" in text and "Azure trace excerpt" in text


def test_the_h100_runs_are_priced_with_the_h100_preset_and_tables(tmp_path):
    out = tmp_path / "points.csv"
    assert main(["--gpu", "H100", "--engines", "llama8b-bf16", "--clocks", "roofline,vllm-grid",
                 "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 11
    for row in rows:
        for clock in ("roofline", "vllm-grid"):
            assert math.isfinite(float(row[f"{clock}_mean_e2el_ms_err"]))
    # the H100's roofline is slower than the H200's on the same point (3.35 against 4.8 TB/s)
    h200 = tmp_path / "h200.csv"
    assert main(["--engines", "llama8b-bf16", "--clocks", "roofline", "--csv", str(h200)]) == 0
    by_point = {r["point"]: r for r in csv.DictReader(h200.open())}
    row = next(r for r in rows if r["point"] == "cl-1024-128-c64")
    assert float(row["roofline_median_tpot_ms"]) > float(by_point["cl-1024-128-c64"]["roofline_median_tpot_ms"])


def test_a_workload_served_twice_is_reported_per_serving(tmp_path, capsys):
    from bench.vllm_compare import base_engine, point_key, serving

    assert [base_engine(e) for e in ("gpt-oss-20b-twice", "gpt-oss-20b-warm", "llama8b-fp8-idle")] == \
        ["gpt-oss-20b", "gpt-oss-20b", "llama8b-fp8"]
    names = ["cl-1024-128-c64-again", "cl-256-512-c16", "cl-1024-128-c16-again", "cl-1024-128-c16"]
    assert sorted(names, key=point_key) == ["cl-256-512-c16", "cl-1024-128-c16", "cl-1024-128-c16-again",
                                            "cl-1024-128-c64-again"]
    assert [serving(n) for n in ("azure-conv", "azure-conv-again")] == ["", "again"]
    out = tmp_path / "points.csv"
    assert main(["--gpu", "H100", "--engines", "gpt-oss-20b-twice", "--clocks", "default", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["point"] for r in rows][-4:] == [n + "-again" for n in [r["point"] for r in rows][:4]]
    summary = [line for line in capsys.readouterr().out.splitlines() if line.endswith(" points")]
    assert [line.split()[:2] for line in summary] == [["gpt-oss-20b-twice", "default"],
                                                       ["gpt-oss-20b-twice", "again"]]


def test_a_burst_plan_run_is_priced_on_its_engine(tmp_path, capsys):
    # ENGINE-burst (plans.py --size burst): closed loops burst-ISL-xC whose C prompts go out
    # together, replayed on the engine's settings and tables, in order of ISL then C, and summed up
    from bench.vllm_compare import base_engine, point_key

    assert base_engine("qwen3-30b-a3b-burst") == "qwen3-30b-a3b"
    assert sorted(["burst-512-x12", "burst-2048-x3", "burst-512-x2", "burst-128-x8"], key=point_key) == \
        ["burst-128-x8", "burst-512-x2", "burst-512-x12", "burst-2048-x3"]
    out = tmp_path / "points.csv"
    assert main(["--gpu", "H100", "--engines", "llama8b-bf16-burst", "--clocks", "default", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["point"] for r in rows] == ["burst-128-x2", "burst-128-x8", "burst-512-x2", "burst-512-x4",
                                          "burst-512-x12", "burst-2048-x3"]
    assert all(math.isfinite(float(row["default_mean_ttft_ms_err"])) for row in rows)
    # a wave's prompts share its steps: at one length, the mean TTFT grows with the burst
    ttft = {r["point"]: float(r["default_mean_ttft_ms"]) for r in rows}
    assert ttft["burst-512-x2"] < ttft["burst-512-x4"] < ttft["burst-512-x12"]
    summary = [line for line in capsys.readouterr().out.splitlines() if line.endswith(" points")]
    assert summary and summary[0].split()[:2] == ["llama8b-bf16-burst", "default"] and "6 points" in summary[0]


def test_a_wave_plan_run_is_priced_without_its_warm_up(tmp_path):
    from bench.vllm_compare import base_engine, point_key

    assert base_engine("qwen3-30b-a3b-wave") == "qwen3-30b-a3b"
    assert base_engine("llama8b-bf16-noasync-wave") == "llama8b-bf16"     # the wave plan, async off
    assert sorted(["wave-768-x4-o256", "wave-768-x4-o16", "wave-768-x4-o2"], key=point_key) == \
        ["wave-768-x4-o2", "wave-768-x4-o16", "wave-768-x4-o256"]
    out = tmp_path / "points.csv"
    assert main(["--gpu", "H100", "--engines", "llama8b-bf16-wave", "--clocks", "default", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["point"] for r in rows] == ["wave-768-x4-o2", "wave-768-x4-o16", "wave-768-x4-o64", "wave-768-x4-o256"]
    # the same waves after longer decode phases: E2E grows with the output length on both sides
    for side in ("vllm", "default"):
        e2e = [float(r[f"{side}_mean_e2el_ms"]) for r in rows]
        assert e2e == sorted(e2e) and e2e[-1] > 10 * e2e[0]


def test_the_wave_plan_with_async_off_is_priced_by_the_table_and_what_async_hid(tmp_path):
    """llama8b-bf16-noasync-wave: the engine's table (measured with async scheduling on) plus its
    '# async off:' line; the roofline, which a synchronous run got before the line, is 10-11 %
    fast on these waves' TPOT at 64 and 256 output tokens."""
    out = tmp_path / "points.csv"
    assert main(["--gpu", "H100", "--engines", "llama8b-bf16-noasync-wave", "--clocks", "default",
                 "--csv", str(out)]) == 0
    rows = {r["point"]: r for r in csv.DictReader(out.open())}
    for point in ("wave-768-x4-o64", "wave-768-x4-o256"):
        assert abs(float(rows[point]["default_median_tpot_ms_err"])) < 0.05, rows[point]


def test_a_run_from_before_the_probe_logged_its_engine_core_takes_its_base_engines_with_its_own_pool():
    """The H200's llama8b-bf16-noasync (async scheduling off; its meta.json has an empty
    engine_core): llama8b-bf16's settings, its own KV cache (896,912 tokens / 16) and mode."""
    import json

    from bench.vllm_compare import GPUS, base_engine, engine_core

    assert base_engine("llama8b-bf16-noasync") == "llama8b-bf16"
    meta = json.loads((GPUS["H200"][0] / "llama8b-bf16-noasync" / "meta.json").read_text())
    core = engine_core(meta, "llama8b-bf16-noasync", "H200")
    assert core["num_gpu_blocks"] == 896912 // 16 and core["async_scheduling"] is False
    assert core["max_num_batched_tokens"] == 8192 and core["block_size"] == 16
    base = json.loads((GPUS["H200"][0] / "llama8b-bf16" / "meta.json").read_text())
    assert engine_core(base, "llama8b-bf16", "H200") == base["engine_core"]


def test_held_out_async_off_on_the_h100_is_priced_by_the_table_and_what_async_hid(tmp_path):
    """The H100's llama8b-bf16-noasync and qwen3-30b-a3b-noasync (closed loops and the Azure
    excerpt, async scheduling off; their largest closed loop is fitted, the tables' '# async off:'
    line, and marked so; the rest is held out): the default clock, each engine's table plus the
    line, is within 5 % on the excerpt's median TPOT and mean E2E; on the held-out closed loops
    within 5 % on median TPOT."""
    out = tmp_path / "points.csv"
    assert main(["--gpu", "H100", "--engines", "llama8b-bf16-noasync", "qwen3-30b-a3b-noasync",
                 "--clocks", "default,roofline", "--traces", "--csv", str(out)]) == 0
    rows = {(r["engine"], r["point"]): r for r in csv.DictReader(out.open())}
    for engine in ("llama8b-bf16-noasync", "qwen3-30b-a3b-noasync"):
        azure = rows[(engine, "azure-conv")]
        for metric in ("median_tpot_ms", "mean_e2el_ms"):
            assert abs(float(azure[f"default_{metric}_err"])) < 0.05, (engine, metric)
    # the roofline (the measured shares and the dense or MoE engine's line, as for a model without
    # a table) is further off for the MoE engine: 20-25 % fast on the excerpt
    qwen = rows[("qwen3-30b-a3b-noasync", "azure-conv")]
    assert float(qwen["roofline_mean_e2el_ms_err"]) < -0.1 < float(qwen["default_mean_e2el_ms_err"])
    assert {p for (e, p), r in rows.items() if r["fitted"] == "True"} == {"cl-1024-128-c64"}
    for engine in ("llama8b-bf16-noasync", "qwen3-30b-a3b-noasync"):
        tpot = sorted(abs(float(r["default_median_tpot_ms_err"])) for (e, p), r in rows.items()
                      if e == engine and p.startswith("cl-") and r["fitted"] == "False")
        assert len(tpot) == 3 and tpot[1] < 0.05, engine


def test_seeds_average_kvsims_figures_over_the_bursts_draws(tmp_path):
    """A measured table splits a burst at an idle engine by a seeded draw, so a closed loop's start
    is a draw: --seeds N reports the mean of kvsim's figures over engine seeds 0 .. N-1 (seed 0
    alone by default); the measured side does not move."""
    import pandas as pd

    def point(seeds):
        out = tmp_path / f"s{seeds}.csv"
        assert main(["--gpu", "H100", "--engines", "qwen3-30b-a3b-wave", "--clocks", "default",
                     "--seeds", str(seeds), "--csv", str(out)]) == 0
        return pd.read_csv(out).set_index("point")

    one, three = point(1), point(3)
    assert (one["vllm_mean_ttft_ms"] == three["vllm_mean_ttft_ms"]).all()
    folder = GPUS["H100"][0] / "qwen3-30b-a3b-wave"
    spec = json.loads((folder / "wave-768-x4-o16" / "workload.json").read_text())
    meta = json.loads((folder / "meta.json").read_text())
    alone = simulated("qwen3-30b-a3b-wave", spec, meta, "default", gpu="H100")
    assert one.loc["wave-768-x4-o16", "default_mean_ttft_ms"] == pytest.approx(alone["mean_ttft_ms"])
    runs = [_simulated("qwen3-30b-a3b-wave", spec, meta, "default", None, "H100", s) for s in range(3)]
    assert three.loc["wave-768-x4-o16", "default_mean_ttft_ms"] == pytest.approx(
        sum(r["mean_ttft_ms"] for r in runs) / 3)
    assert len({r["mean_ttft_ms"] for r in runs}) > 1          # the draw moves a wave's TTFT
    with pytest.raises(SystemExit):
        main(["--seeds", "0"])


def test_stall_free_keeps_the_requests_no_stall_delayed_on_both_sides(tmp_path):
    """--stall-free: a step of 0.4 s or more at 3x its price or more is a stall (a first-use
    compile); the requests whose time to first token overlaps one are left out of the real figures
    and of kvsim's (the loop is replayed whole); a long step at its price is no stall."""
    import gzip

    from bench.vllm_compare import stall_free
    from kvsim.simulator.cost import FixedStepCost

    point = tmp_path / "cl-256-16-c2"
    point.mkdir()
    cols = ["num_seqs", "num_prefill_seqs", "num_prefill_tokens", "num_decode_tokens", "num_scheduled_tokens",
            "kv_read_tokens", "attn_token_pairs", "max_context_tokens", "step_s", "t_done_s"]
    steps = [[1, 1, 256, 0, 256, 256, 32896, 256, 0.02, 0.02],       # request 0's prefill
             [1, 1, 256, 1, 257, 513, 33153, 257, 0.70, 0.80],       # request 1's: a 0.7 s stall
             [1, 1, 256, 1, 257, 513, 33153, 257, 0.02, 1.00]]       # request 2's
    with open(point / "steps.csv", "w", newline="") as f:
        csv.writer(f).writerows([cols, *steps])
    reqs = [{"request_id": f"cl-256-16-c2-{i}", "sent_s": s, "first_token_s": t, "finish_s": t + 0.2,
             "output_tokens": 16} for i, (s, t) in enumerate([(0.0, 0.021), (0.05, 0.81), (0.9, 1.01)])]
    with gzip.open(point / "requests.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in reqs))
    assert stall_free(point, FixedStepCost(0.01)) == {0, 2}
    assert stall_free(point, FixedStepCost(0.3)) == {0, 1, 2}         # 0.7 s is under 3 x 0.3 s
    kept = measured(point, {0, 2})
    assert kept["completed"] == 2 and kept["mean_ttft_ms"] == pytest.approx(1000 * (0.021 + 0.11) / 2)


def test_stall_free_runs_on_the_committed_runs_and_leaves_out_gpt_oss_compiles(tmp_path):
    whole, free = tmp_path / "whole.csv", tmp_path / "free.csv"
    argv = ["--gpu", "H100", "--engines", "gpt-oss-20b", "--clocks", "default"]
    assert main([*argv, "--csv", str(whole)]) == 0 and main([*argv, "--stall-free", "--csv", str(free)]) == 0
    rows = {name: {r["point"]: r for r in csv.DictReader(path.open())} for name, path in (("whole", whole),
                                                                                            ("free", free))}
    stalled = [p for p in rows["whole"] if float(rows["free"][p]["vllm_completed"]) < float(rows["whole"][p]["vllm_completed"])]
    assert stalled                                  # gpt-oss's first serving has compile stalls

    def ttft_error(name):                           # kvsim's mean |TTFT error| over the stalled points
        return sum(abs(float(rows[name][p]["default_mean_ttft_ms_err"])) for p in stalled) / len(stalled)
    assert ttft_error("free") < ttft_error("whole") / 2     # most of the gap is the compiles


def test_first_use_compiles_start_each_replay_from_what_its_engine_had_run(tmp_path):
    """--first-use-compiles: a gpt-oss replay pays the first-use compiles, the workloads in the
    engine's order, each replay's engine starting with the keys kvsim's replays of the earlier
    ones compiled (and the measured steps' of those it does not replay): the fresh engine's first
    loop pays (kvsim slower than without); its second serving of a loop, whose schedule kvsim
    repeats, pays nothing."""
    from bench.vllm_compare import engine_order, ran_before

    point = RESULTS.parent / "vllm_h100" / "gpt-oss-20b-jit" / "cl-1024-128-c16"
    warmup = ran_before(point)                            # the engine's first workload: the warm-up's steps
    assert warmup[:2] == [600, 4201] and len(warmup) == 25
    again = point.parent / "cl-1024-128-c16-again"
    order = engine_order(point.parent)
    assert len(ran_before(again)) > 500 and ran_before(again, set(order)) == warmup
    plain, first_use = tmp_path / "plain.csv", tmp_path / "first_use.csv"
    argv = ["--gpu", "H100", "--engines", "gpt-oss-20b-jit", "--clocks", "default"]
    assert main([*argv, "--csv", str(plain)]) == 0 and main([*argv, "--first-use-compiles", "--csv", str(first_use)]) == 0
    rows = {name: {r["point"]: float(r["default_mean_ttft_ms"]) for r in csv.DictReader(path.open())}
            for name, path in (("plain", plain), ("first_use", first_use))}
    assert rows["first_use"]["cl-1024-128-c16"] > rows["plain"]["cl-1024-128-c16"] + 100
    for point in (p for p in rows["plain"] if p.endswith("-again")):
        assert rows["first_use"][point] == rows["plain"][point], point


def test_a_table_of_ones_own_is_a_clock(tmp_path, capsys):
    """``--clocks file:PATH``: the table ``kvsim profile --engine vllm`` made on an H100 (shipped
    beside the runs) prices the held-out H100 points; a path that is not there is a usage error."""
    table = "bench/results/vllm_h100/profile/llama8b-bf16_H100.csv"
    if not (ROOT / table).exists():
        pytest.skip("no measured runs here")
    out = tmp_path / "points.csv"
    assert main(["--gpu", "H100", "--engines", "llama8b-bf16", "--clocks", f"default,file:{ROOT / table}",
                 "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 11
    errs = [float(r[f"file:{ROOT / table}_median_tpot_ms_err"]) for r in rows]
    assert all(math.isfinite(e) for e in errs) and errs != [float(r["default_median_tpot_ms_err"]) for r in rows]
    with pytest.raises(SystemExit) as err:
        main(["--gpu", "H100", "--engines", "llama8b-bf16", "--clocks", "file:/nonexistent.csv"])
    assert err.value.code == 2 and "no such file" in capsys.readouterr().err


def test_the_compile_free_gpt_oss_engines_compiled_nothing_in_their_loops(tmp_path):
    """gpt-oss-20b-keys2 served every eager routing key before its plan (harness.py
    --warmup-eager-keys, whole): its loops compiled no kernel but one slot mapping.
    gpt-oss-20b-cached2, a next engine on that machine with Triton's disk cache pointed at the
    first's (device_run.sh's TRITON_CACHE_DIR), loaded every kernel it met (each under 10 ms);
    kvsim's default clock prices both (the default clock of a warmed server)."""
    runs = GPUS["H100"][0]
    if not (runs / "gpt-oss-20b-keys2" / "meta.json").exists():
        pytest.skip("no measured runs here")
    meta = json.loads((runs / "gpt-oss-20b-keys2" / "meta.json").read_text())
    assert meta["warmup_eager_keys_served"] == 448 and meta["workloads"]
    for point in sorted((runs / "gpt-oss-20b-keys2").glob("cl-*")):
        with open(point / "jit.csv") as f:
            assert {r["kernel"] for r in csv.DictReader(f)} <= {"_compute_slot_mapping_kernel"}, point.name
    loads = []
    for point in sorted((runs / "gpt-oss-20b-cached2").glob("cl-*")):
        with open(point / "jit.csv") as f:
            loads += [float(r["t1_s"]) - float(r["t0_s"]) for r in csv.DictReader(f)]
    assert loads and max(loads) < 0.01
    cached = json.loads((runs / "gpt-oss-20b-cached2" / "meta.json").read_text())["engine_core"]["triton_cache"]
    assert "inductor_cache/triton" in cached["dir"] and cached["entries"] > 1000
    out = tmp_path / "points.csv"
    assert main(["--gpu", "H100", "--engines", "gpt-oss-20b-keys2", "gpt-oss-20b-cached2", "--clocks", "default",
                 "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 12 and all(math.isfinite(float(r["default_mean_e2el_ms_err"])) for r in rows)
