"""``kvsim plan`` for benchmark questions: a concurrency sweep drawn as throughput per GPU against
interactivity with its Pareto front, and the highest arrival rate that meets an SLO."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from kvsim.cli import main
from kvsim.errors import InputError
from kvsim.planner.rate_search import MAX_FACTOR, STEP, max_rate_under
from kvsim.planner.slo import meets, parse_slo
from kvsim.planner.sweep import PlanBase, PointTask, evaluate_point, mark_pareto

SLO = "p99_ttft_ms<=400,p99_tpot_ms<=40"


@pytest.mark.parametrize("workload", [
    "random:isl=1024,osl=128,isl_range=0.2,osl_range=0.2,n=200,seed=1",
    "sharegpt:rate=2,n=200,seed=0,system=256,system_frac=0.5,turns=uniform(1,3),think_s=5",
    "synthetic:prompt=lognormal(2000,0.8),output=fixed(64),rate=1,arrival=gamma(cv=2),n=150,seed=4",
])
def test_the_rate_found_meets_the_slo_and_5_percent_more_does_not(workload):
    base = PlanBase(workload=workload, model="Llama-3.1-8B", gpu="h100", max_model_len=8192)
    slo = parse_slo(SLO)
    found = max_rate_under(base, slo)
    assert found["status"] == "found" and found["max_rate"] > 0
    assert found["next_rate"] == pytest.approx(found["max_rate"] * STEP)
    # replayed afresh, at the answer and 5 % above it
    at = evaluate_point(PointTask(0, {"rate": found["max_rate"]}, base))
    above = evaluate_point(PointTask(0, {"rate": found["max_rate"] * 1.05}, base))
    assert meets(at, slo) and not meets(above, slo)
    assert at["p99_ttft_ms"] == found["row"]["p99_ttft_ms"]       # the kept replay is that replay
    assert len(found["probes"]) <= 40


def test_the_search_reports_never_and_always():
    base = PlanBase(workload="random:isl=512,osl=32,n=60,seed=1", model="Llama-3.1-8B", gpu="h100")
    never = max_rate_under(base, parse_slo("p99_ttft_ms<=0.001"))
    assert never["status"] == "never" and never["max_rate"] is None
    always = max_rate_under(base, parse_slo("p99_ttft_ms<=1e12"))
    assert always["status"] == "always" and always["max_rate"] >= MAX_FACTOR / 2
    with pytest.raises(InputError):
        max_rate_under(base, ())
    with pytest.raises(InputError):
        max_rate_under(base, parse_slo(SLO), params={"rate": 3})


def test_plan_max_rate_under_cli(tmp_path, capsys):
    out = tmp_path / "plan"
    argv = ["plan", "random:isl=1024,osl=128,n=150,seed=2", "--model", "Llama-3.1-8B", "--gpu", "h100",
            "--sweep", "max_num_seqs=32,256", "--max-rate-under", SLO, "--jobs", "2", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "max_rate" in text and "5 % above" in text
    df = pd.read_csv(out / "results.csv")
    assert list(df["search_status"]) == ["found", "found"]
    assert (df["p99_ttft_ms"] <= 400).all() and (df["p99_tpot_ms"] <= 40).all()
    assert df.loc[1, "max_rate"] > df.loc[0, "max_rate"]     # more sequences per step: a higher rate
    assert json.loads((out / "plan.json").read_text())["max_rate_under"] == ["p99_ttft_ms<=400", "p99_tpot_ms<=40"]
    # one line, exit 2: a rate axis beside the search, an unknown metric, a malformed SLO
    for bad in (["--sweep", "rate=1,2"], ["--max-rate-under", "p99_ttft_lag<=4"], ["--max-rate-under", "ttft<"]):
        assert main(argv[:2] + ["--model", "Llama-3.1-8B", "--gpu", "h100", "--quiet", "--max-rate-under", SLO] + bad) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_concurrency_sweep_draws_the_pareto_front(tmp_path, capsys):
    out = tmp_path / "plan"
    assert main(["plan", "random:isl=1024,osl=128,n=96,seed=1", "--model", "Llama-3.1-8B", "--gpu", "h100",
                 "--sweep", "gpu=h100,h200", "--sweep", "concurrency=1,4,16,64", "--jobs", "2", "--quiet",
                 "--out", str(out)]) == 0
    df = pd.read_csv(out / "results.csv")
    for gpu, g in df.groupby("gpu"):
        g = g.sort_values("concurrency")
        # more in flight: more throughput per GPU, fewer tokens/s for each user
        assert g["output_throughput_per_gpu"].is_monotonic_increasing and g["interactivity"].is_monotonic_decreasing
        assert (g["max_concurrent_requests"] == g["concurrency"]).all()
    # the H200 (more bandwidth) dominates the H100 at each concurrency: only its points are on the front
    assert set(df.loc[df["pareto"], "gpu"]) == {"h200"}
    html = (out / "report.html").read_text()
    assert "Pareto front" in html and "interactivity" in html
    assert "pareto" in capsys.readouterr().out


def test_mark_pareto():
    rows = [{"interactivity": 100, "output_throughput_per_gpu": 10, "error": None},
            {"interactivity": 50, "output_throughput_per_gpu": 40, "error": None},
            {"interactivity": 50, "output_throughput_per_gpu": 30, "error": None},     # dominated
            {"interactivity": 200, "output_throughput_per_gpu": 90, "error": "impossible"},
            {"interactivity": 10, "output_throughput_per_gpu": 40, "error": None}]     # dominated
    assert [r["pareto"] for r in mark_pareto(rows)] == [True, True, False, False, False]
