"""Sweep grids, SLO parsing, the sweep runner (fake simulator: deterministic, picklable) and the CLIs."""
import json
import math
from dataclasses import dataclass

import pandas as pd
import pytest

import kvsim.planner.sweep as sweep
from kvsim.planner.slo import Constraint, parse_slo, resolve_metric
from kvsim.planner.sweep import PlanBase, cheapest, expand_grid, mark_slo, parse_sweep, run_sweep
from kvsim.errors import InputError
from kvsim.simulator.cost import StepBatch


# --- grid ----------------------------------------------------------------------------------------
def test_parse_sweep_types_values_per_key():
    axes = parse_sweep(["block_size=8,16", "gpu_memory_utilization=0.8, 0.9", "gpu=h100,h200",
                        "enable_prefix_caching=true,off"])
    assert axes == {"block_size": [8, 16], "gpu_memory_utilization": [0.8, 0.9], "gpu": ["h100", "h200"],
                    "enable_prefix_caching": [True, False]}


def test_scheduling_modes_are_sweepable():
    axes = parse_sweep(["scheduler=v1,v0", "async_scheduling=on,false"])
    assert axes == {"scheduler": ["v1", "v0"], "async_scheduling": [True, False]}
    assert sweep.ENGINE_KEYS["scheduler"] == "scheduler"
    assert sweep.ENGINE_KEYS["async_scheduling"] == "async_scheduling"


@pytest.mark.parametrize("spec,match", [
    ("block_size", r"expected KEY=V1,V2"),
    ("blocksize=8", r"unknown key 'blocksize'; sweepable: model, gpu"),
    ("block_size=8,,16", r"block_size: empty value"),
    ("tp=two", r"tp: cannot read 'two' as int"),
    ("enable_prefix_caching=maybe", r"cannot read 'maybe'"),
])
def test_parse_sweep_errors(spec, match):
    with pytest.raises(InputError, match=match):
        parse_sweep([spec])
    with pytest.raises(InputError, match="given twice"):
        parse_sweep(["tp=1", "tp=2"])


def test_expand_grid_is_the_ordered_cartesian_product():
    grid = expand_grid({"a": [1, 2], "b": ["x", "y", "z"]})
    assert len(grid) == 6
    assert grid[:4] == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 1, "b": "z"}, {"a": 2, "b": "x"}]
    assert expand_grid({}) == [{}]


# --- SLO -----------------------------------------------------------------------------------------
def test_parse_slo_terms_and_units():
    assert parse_slo("ttft_p99<2,preemptions=0") == (Constraint("ttft_p99", "<", 2.0),
                                                     Constraint("preemptions", "=", 0.0))
    assert parse_slo(" tpot_p50 <= 50ms , throughput>=1e3") == (Constraint("tpot_p50", "<=", 0.05),
                                                                 Constraint("throughput", ">=", 1000.0))


@pytest.mark.parametrize("text,match", [
    ("", "empty SLO"),
    ("ttft_p99 2", r"term 1 'ttft_p99 2': expected METRIC OP NUMBER"),
    ("ttft_p99<2,preemptions=>0", r"term 2 'preemptions=>0'"),
    ("ttft_p99<two", r"term 1"),
])
def test_parse_slo_errors(text, match):
    with pytest.raises(InputError, match=match):
        parse_slo(text)


def test_slo_metrics_resolve_through_aliases_and_report_unknown_ones():
    row = {"ttft_p99_s": 1.5, "num_preemptions": 0, "model": "x"}
    assert resolve_metric(row, "ttft_p99") == 1.5
    assert parse_slo("ttft_p99<2,preemptions=0")[1].holds(row)
    assert not parse_slo("ttft_p99<1.5")[0].holds(row)
    assert not Constraint("ttft_p99", "<", 9).holds({"ttft_p99_s": math.nan})
    with pytest.raises(InputError, match=r"unknown metric 'tbt'; result columns: num_preemptions, ttft_p99_s"):
        resolve_metric(row, "tbt")


# --- runner with a fake simulator ----------------------------------------------------------------
@dataclass
class FakeResult:
    summary: dict


def fake_simulate(requests, config, cost_model, *, replicas=1, router="round-robin", seed=0,
                  max_concurrency=None, record_token_times=False):
    """Stands in for simulator.simulate: a pure function of the pool and the cost model."""
    blocks = config.num_blocks
    prefill = StepBatch(num_seqs=1, num_prefill_tokens=1000, num_scheduled_tokens=1000, kv_read_tokens=1000,
                        attn_token_pairs=500_000)
    return FakeResult({"ttft_p99_s": cost_model.step_time_s(prefill) * 1e5 / blocks,
                       "num_preemptions": max(0, 20_000 - blocks) // 1000,
                       "mean_running_requests": blocks / 1000, "nested": {"x": len(requests)},
                       "wall_s": 0.123})


@pytest.fixture
def fake_backend(monkeypatch):
    """Seven placeholder requests instead of loading a workload (the fake simulator counts them)."""
    monkeypatch.setattr(sweep, "load_requests", lambda workload, **kw: list(range(7)))


BASE = PlanBase(workload="synthetic", model="Llama-3.1-8B", gpu="h100", max_model_len=8192)


def test_sweep_rows_follow_grid_order_and_capacity(fake_backend):
    points = expand_grid(parse_sweep(["gpu_memory_utilization=0.5,0.9", "block_size=16,32"]))
    rows = run_sweep(points, BASE, simulate=fake_simulate)
    assert [r["point"] for r in rows] == [0, 1, 2, 3]
    assert [(r["gpu_memory_utilization"], r["block_size"]) for r in rows] == [(0.5, 16), (0.5, 32),
                                                                            (0.9, 16), (0.9, 32)]
    assert rows[0]["num_gpu_blocks"] == 2 * rows[1]["num_gpu_blocks"] or \
        rows[0]["num_gpu_blocks"] == 2 * rows[1]["num_gpu_blocks"] + 1  # twice as many half-size blocks
    assert rows[2]["num_gpu_blocks"] > rows[0]["num_gpu_blocks"]
    assert rows[0]["nested.x"] == 7 and rows[0]["error"] is None


def test_parallel_sweep_equals_serial_sweep(fake_backend):
    points = expand_grid(parse_sweep(["block_size=8,16,32", "gpu=h100,a100-80"]))
    serial = run_sweep(points, BASE, simulate=fake_simulate)
    parallel = run_sweep(points, BASE, jobs=2, simulate=fake_simulate)
    assert pd.DataFrame(serial).to_csv() == pd.DataFrame(parallel).to_csv()


def test_impossible_points_become_error_rows_not_failures(fake_backend):
    rows = run_sweep(expand_grid({"model": ["Llama-3.1-8B", "Llama-3.1-70B"]}), BASE, simulate=fake_simulate)
    assert rows[0]["error"] is None
    assert "weights need 131.42 GiB" in rows[1]["error"]
    marked = mark_slo(rows, parse_slo("ttft_p99<100"))
    assert [r["meets_slo"] for r in marked] == [True, False]


def test_cheapest_is_fewest_gpus_times_price_rank(fake_backend):
    points = expand_grid({"gpu": ["h200", "l40s", "h100"], "tp": [1, 2]})
    rows = mark_slo(run_sweep(points, BASE, simulate=fake_simulate), parse_slo("preemptions=0"))
    by_point = {r["point"]: r for r in rows}
    # one L40S (cost 1 x rank 2) would be cheapest, but its small pool preempts; two L40S
    # (2 x 2 = 4) meet the SLO and undercut one H100 (1 x 5)
    assert not by_point[2]["meets_slo"] and by_point[3]["meets_slo"] and by_point[4]["meets_slo"]
    best = cheapest(rows)
    assert (best["gpu"], best["tp"], best["cost"]) == ("l40s", 2, 4)
    without_l40s = [r for r in rows if r["gpu"] != "l40s"]
    assert (cheapest(without_l40s)["gpu"], cheapest(without_l40s)["cost"]) == ("h100", 5)
    assert cheapest(mark_slo(rows, parse_slo("preemptions<0"))) is None


def test_unknown_backend_and_missing_ray():
    with pytest.raises(ValueError, match="backend must be 'local' or 'ray'"):
        run_sweep([{}], BASE, backend="slurm")
    try:
        import ray  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match=r"pip install 'kvsim\[ray\]'"):
            run_sweep([{}], BASE, backend="ray")


# --- CLI: one-line errors, exit code 2 -----------------------------------------------------------
def kvsim(monkeypatch, argv):
    from kvsim.cli import main
    return main(argv)


@pytest.mark.parametrize("value", ["0", "1.5"])
def test_a_utilization_outside_0_1_is_a_usage_error(capsys, value):
    # argparse refuses it before any work (kvsim.cli.argtypes.fraction): the short usage and the error
    from kvsim.cli import main
    with pytest.raises(SystemExit) as exit_:
        main(["capacity", "--gpu-memory-utilization", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "--gpu-memory-utilization: must be " in err[1] and value in err[1], err


@pytest.mark.parametrize("argv,match", [
    (["capacity", "--model", "Llama-3.1-70B", "--gpu", "h100"], r"weights need 131.42 GiB per GPU"),
    (["capacity", "--model", "gpt-5"], r"unknown model 'gpt-5'; presets: Llama-3.1-8B"),
    (["capacity", "--gpu", "tpu-v9"], r"unknown GPU 'tpu-v9'; presets: A100-40GB"),
    (["capacity", "--tp", "3"], r"num_attention_heads \(32\) must be divisible by tp \(3\)"),
    (["capacity", "--gpu-memory-gib", "40"], r"custom GPU needs --gpu-memory-gib, --gpu-bandwidth-gbps"),
    (["plan", "x.csv", "--sweep", "colour=red"], r"field 'sweep': unknown key 'colour'"),
    (["plan", "x.csv", "--slo", "ttft<"], r"field 'slo': term 1 'ttft<'"),
])
def test_bad_input_exits_2_with_one_line(monkeypatch, capsys, argv, match):
    assert kvsim(monkeypatch, argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvsim: error: ")
    import re
    assert re.search(match, err), err


def test_malformed_hf_config_exits_2_naming_the_file(monkeypatch, capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"num_hidden_layers": 2,}')
    assert kvsim(monkeypatch, ["capacity", "--hf-config", str(path)]) == 2
    assert f"{path}:1: invalid JSON" in capsys.readouterr().err


def test_capacity_json_output(monkeypatch, capsys):
    assert kvsim(monkeypatch, ["capacity", "--model", "llama-3.1-8b", "--gpu", "h100", "--max-model-len",
                               "8192", "--gpu-memory-utilization", "0.9", "--max-num-seqs", "256",
                               "--max-num-batched-tokens", "8192", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["capacity"]
    assert (out["num_gpu_blocks"], out["kv_bytes_per_token"], out["kv_cache_tokens"]) == (28_062, 131_072, 448_992)


def test_capacity_text_output_uses_vllms_wording(monkeypatch, capsys):
    assert kvsim(monkeypatch, ["capacity", "--model", "DeepSeek-V2-Lite", "--max-model-len", "8192",
                               "--concurrency-tokens", "1000"]) == 0
    out = capsys.readouterr().out
    assert "KV bytes per token:        31,104 B" in out
    assert "Maximum concurrency for 8,192 tokens per request:" in out
    assert "Maximum concurrency for 1,000 tokens per request:" in out


def test_roofline_efficiencies_are_sweepable(fake_backend):
    import dataclasses
    base = dataclasses.replace(BASE, step_overhead_s=0.0)
    rows = run_sweep(expand_grid(parse_sweep(["flops_efficiency=1,0.5"])), base, simulate=fake_simulate)
    # the fake's TTFT is a 1000-token prefill step: compute-bound, so half the FLOP rate doubles it
    assert rows[1]["ttft_p99_s"] == pytest.approx(2 * rows[0]["ttft_p99_s"], rel=1e-3)


def test_clock_lines_name_each_clock_once_with_its_points():
    from kvsim.planner.sweep import clock_lines

    rows = [{"point": i, "gpu": g, "config.clock": c} for i, (g, c) in
            enumerate([("h100", "table A"), ("a100", "carried A"), ("h100", "table A"), ("x", None)])]
    assert clock_lines(rows[:1] + rows[2:]) == ["clock: table A"]       # an impossible point has none
    assert clock_lines(rows) == ["clock (points 0, 2): table A", "clock (point 1): carried A"]
    assert clock_lines(rows, lambda r: r["gpu"]) == ["clock (points h100, h100): table A", "clock (point a100): carried A"]
    many = [{"point": i, "config.clock": "a" if i % 2 else "b"} for i in range(50)]
    assert clock_lines(many)[0].endswith("38, ...): b") and clock_lines([]) == []
