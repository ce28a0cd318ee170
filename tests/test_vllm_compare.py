"""bench/vllm_compare.py: kvsim replays each committed real-vLLM closed-loop point on vLLM's
engine settings, with every request of the measured run, and reports finite errors."""
from __future__ import annotations

import csv
import math

from bench.vllm_compare import RESULTS, main, measured


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
