"""`kvsim plan` / `kvsim capacity WORKLOAD` end to end through the real simulator and workloads."""
import json

import pandas as pd
import pytest

from kvsim.cli import main
from kvsim.planner.slo import resolve_metric
from kvsim.planner.sweep import PlanBase, expand_grid, run_sweep

# 300 ShareGPT-like requests at 20/s onto a small pool (H100 at 25% memory: ~1,700 blocks)
WORKLOAD = "sharegpt:rate=20,n=300,seed=3"
COMMON = ["--model", "Llama-3.1-8B", "--gpu", "h100", "--max-model-len", "4096"]


def kvsim(monkeypatch, argv):
    return main(argv)


def test_plan_writes_identical_results_serial_and_parallel(monkeypatch, capsys, tmp_path):
    argv = ["plan", WORKLOAD, *COMMON, "--sweep", "gpu_memory_utilization=0.25,0.9",
            "--sweep", "block_size=16,64", "--slo", "ttft_p99<30,preemptions=0", "--quiet"]
    assert kvsim(monkeypatch, argv + ["--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert kvsim(monkeypatch, argv + ["--out", str(tmp_path / "b"), "--jobs", "2"]) == 0
    a, b = tmp_path / "a", tmp_path / "b"
    assert (a / "results.csv").read_bytes() == (b / "results.csv").read_bytes()
    assert (a / "results.json").read_bytes() == (b / "results.json").read_bytes()
    table = pd.read_parquet(a / "results.parquet")
    assert list(table["point"]) == [0, 1, 2, 3]
    assert not any("wall" in c for c in table.columns)  # wall-clock time lives in timings.csv
    assert "wall_clock_s" in pd.read_csv(a / "timings.csv").columns
    plan = json.loads((a / "plan.json").read_text())
    assert plan["slo"] == ["ttft_p99<30", "preemptions=0"]
    # at 90% memory nothing is preempted; among the qualifying points the cheapest is reported
    ok = table[table["meets_slo"]]
    assert not ok.empty and (ok["gpu_memory_utilization"] == 0.9).all()
    assert plan["cheapest"]["point"] == int(ok["point"].min())
    assert f"cheapest meeting the SLO: point {plan['cheapest']['point']}" in out
    html = (a / "report.html").read_text()
    assert html.count("plotly-graph-div") >= 3 and "cheapest meeting the SLO" in html


def test_smaller_pool_preempts_at_least_as_often():
    rows = run_sweep(expand_grid({"gpu_memory_utilization": [0.25, 0.9]}),
                     PlanBase(workload=WORKLOAD, model="Llama-3.1-8B", gpu="h100", max_model_len=4096))
    small, large = rows
    assert small["num_gpu_blocks"] < large["num_gpu_blocks"]
    assert resolve_metric(small, "preemptions") >= resolve_metric(large, "preemptions") == 0
    assert small["requests_finished"] == large["requests_finished"] == 300


def test_capacity_with_a_workload_reports_the_replay(monkeypatch, capsys):
    assert kvsim(monkeypatch, ["capacity", WORKLOAD, *COMMON, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["simulation"]["num_gpu_blocks"] == out["capacity"]["num_gpu_blocks"]
    assert set(out["simulated"]) == {"mean running requests", "max running requests", "preemptions",
                                     "p99 TTFT (s)"}
    assert out["simulated"]["max running requests"] >= 1


def test_plan_errors_exit_2(monkeypatch, capsys, tmp_path):
    assert kvsim(monkeypatch, ["plan", str(tmp_path / "missing.csv"), *COMMON]) == 2
    assert kvsim(monkeypatch, ["plan", WORKLOAD, *COMMON, "--slo", "latency<1", "--out",
                               str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "unknown metric 'latency'; result columns:" in err
    assert (tmp_path / "o" / "results.csv").exists()  # computed results are written before the error
    assert kvsim(monkeypatch, ["plan", WORKLOAD, "--model", "Llama-3.1-70B", "--gpu", "h100"]) == 2
    assert "every point is impossible" in capsys.readouterr().err


@pytest.mark.slow
def test_ray_backend_matches_local():
    """Ray is an optional extra for users; `make test` installs it (requirements-test.txt)."""
    import ray

    points = expand_grid({"block_size": [16, 64]})
    base = PlanBase(workload=WORKLOAD, model="Llama-3.1-8B", gpu="h100", max_model_len=4096,
                    gpu_memory_utilization=0.25)
    # a local Ray of 2 CPUs, as on CI's 2-core machine; run_sweep joins it instead of starting one
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        via_ray = run_sweep(points, base, backend="ray")
    finally:
        ray.shutdown()
    drop = lambda rows: [{k: v for k, v in r.items() if "wall" not in k} for r in rows]  # noqa: E731
    assert drop(via_ray) == drop(run_sweep(points, base))


def test_contiguous_allocators_get_the_paged_pools_usable_memory():
    rows = run_sweep(expand_grid({"allocator": ["paged", "max"]}),
                     PlanBase(workload=WORKLOAD, gpu_memory_utilization=0.25, max_model_len=4096))
    paged, contiguous = rows
    assert paged["config.engine.num_blocks"] == paged["num_gpu_blocks"]
    # vLLM's null block is not usable, so the contiguous pool gets (N - 1) blocks' worth of tokens
    assert contiguous["config.engine.capacity_tokens"] == (contiguous["num_gpu_blocks"] - 1) * 16
    assert resolve_metric(contiguous, "mean_running") < resolve_metric(paged, "mean_running")


def test_scheduling_modes_sweep_through_the_real_simulator():
    """Each point's mode reaches the engine and its result; v0 with async is an impossible
    point (an error row), not a failure of the sweep."""
    rows = run_sweep(expand_grid({"scheduler": ["v1", "v0"], "async_scheduling": [True, False]}),
                     PlanBase(workload=WORKLOAD, gpu_memory_utilization=0.25, max_model_len=4096))
    v1_async, v1_sync, v0_async, v0_sync = rows
    assert v1_async["config.engine.async_scheduling"] is True
    assert "config.engine.async_scheduling" not in v1_sync or \
        not v1_sync["config.engine.async_scheduling"]
    assert "no async scheduling" in v0_async["error"]
    assert v0_sync["config.engine.scheduler"] == "v0"
    # v0 sizes its pool for its own default budget (max_model_len tokens, not 8192)
    assert v0_sync["config.engine.max_num_batched_tokens"] == 4096
    for row in (v1_async, v1_sync, v0_sync):
        assert row["requests_finished"] == 300


def test_plan_says_which_clock_priced_its_points(monkeypatch, capsys):
    """One clock line when every point ran the same clock; where the sweep changes it (async
    scheduling off on a table with a measured '# async off:' line; a GPU with no table: the H100's
    carried there, extrapolated) one line per clock, naming its points."""
    spec = "random:isl=512,osl=16,n=8,concurrency=4,seed=1"
    base = ["plan", spec, "--model", "Llama-3.1-8B", "--max-model-len", "4096", "--quiet"]
    assert kvsim(monkeypatch, base + ["--gpu", "h100", "--sweep", "block_size=16,32"]) == 0
    clocks = [line for line in capsys.readouterr().out.splitlines() if line.startswith("clock")]
    assert len(clocks) == 1 and clocks[0].startswith("clock: measured table") and "llama8b-bf16" in clocks[0]
    assert kvsim(monkeypatch, base + ["--gpu", "h100", "--sweep", "async_scheduling=true,false"]) == 0
    clocks = [line for line in capsys.readouterr().out.splitlines() if line.startswith("clock")]
    assert [c.split(":")[0] for c in clocks] == ["clock (point 0)", "clock (point 1)"]
    assert "async scheduling off" not in clocks[0] and "async scheduling off: +" in clocks[1]
    assert kvsim(monkeypatch, base + ["--sweep", "gpu=h100,l40s,a100"]) == 0
    clocks = [line for line in capsys.readouterr().out.splitlines() if line.startswith("clock")]
    assert [c.split(":")[0] for c in clocks] == ["clock (point 0)", "clock (point 1)", "clock (point 2)"]
    assert "carried" not in clocks[0]
    assert all("carried from H100" in c and "extrapolated" in c for c in clocks[1:])
    assert kvsim(monkeypatch, base + ["--gpu", "h100", "--cost-table", "roofline", "--sweep", "block_size=16,32,64"]) == 0
    clocks = [line for line in capsys.readouterr().out.splitlines() if line.startswith("clock")]
    assert len(clocks) == 1 and clocks[0].startswith("clock: roofline")
