"""``kvsim bench``: vllm bench serve's table and result JSON for a replay, and ``--compare``
against a measured vllm bench serve result (written here by hand in its documented format)."""
from __future__ import annotations

import json

import pytest

from kvsim.cli import main

SPEC = "random:isl=256,osl=32,isl_range=0.2,osl_range=0.2,n=60,concurrency=8,seed=1"
BASE = ["bench", SPEC, "--num-blocks", "3000", "--step-s", "0.01", "--quiet"]


def _measured(tmp_path, **metrics):
    """A vllm bench serve --save-result JSON (its keys; values made up)."""
    data = {"date": "20261204-120000", "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B",
            "num_prompts": 60, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 8,
            "duration": 2.0, "completed": 60, "failed": 0, "total_input_tokens": 15360,
            "total_output_tokens": 1920, "request_throughput": 30.0, "request_goodput": None,
            "output_throughput": 960.0, "total_token_throughput": 8640.0,
            "mean_ttft_ms": 40.0, "median_ttft_ms": 38.0, "std_ttft_ms": 5.0, "p99_ttft_ms": 60.0,
            "mean_tpot_ms": 12.0, "median_tpot_ms": 12.0, "std_tpot_ms": 1.0, "p99_tpot_ms": 15.0,
            "mean_itl_ms": 12.0, "median_itl_ms": 11.0, "std_itl_ms": 2.0, "p99.9_itl_ms": 30.0,
            "mean_e2el_ms": 420.0, "median_e2el_ms": 410.0, "std_e2el_ms": 30.0, "p99_e2el_ms": 500.0,
            "input_lens": [256] * 60, "output_lens": [32] * 60, "ttfts": [0.04] * 60,
            "itls": [[0.012] * 31] * 60, "generated_texts": [""] * 60, "errors": [""] * 60}
    data.update(metrics)
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def test_bench_prints_the_table_and_writes_vllm_keys(tmp_path, capsys):
    out = tmp_path / "k.json"
    assert main(BASE + ["--goodput", "ttft:100", "tpot:20", "--metric-percentiles", "50,99.9",
                        "--result-json", str(out)]) == 0
    text = capsys.readouterr().out
    for label in ("Serving Benchmark Result", "Successful requests:", "Maximum request concurrency:",
                  "Request goodput (req/s):", "Median TTFT (ms):", "P99.9 ITL (ms):", "P50 E2EL (ms):",
                  "Mean Client Queue Time (ms):"):
        assert label in text, label
    m = json.loads(out.read_text())
    assert m["completed"] == 60 and m["max_concurrency"] == 8 and m["backend"] == "kvsim"
    assert m["request_throughput"] == pytest.approx(60 / m["duration"])
    assert m["max_concurrent_requests"] == 8
    for key in ("p50_ttft_ms", "p99.9_tpot_ms", "median_itl_ms", "std_e2el_ms", "request_goodput",
                "input_lens", "start_times", "mean_client_queue_time_ms"):
        assert key in m, key
    assert 0 < m["request_goodput"] <= m["request_throughput"]
    # the same seed, the same bytes
    again = tmp_path / "k2.json"
    assert main(BASE + ["--goodput", "ttft:100", "tpot:20", "--metric-percentiles", "50,99.9",
                        "--result-json", str(again)]) == 0
    assert again.read_bytes() == out.read_bytes()


def test_compare_sets_a_measured_run_beside_with_errors(tmp_path, capsys):
    out = tmp_path / "k.json"
    assert main(BASE + ["--result-json", str(out)]) == 0
    ours = json.loads(out.read_text())
    capsys.readouterr()
    measured = _measured(tmp_path, mean_ttft_ms=ours["mean_ttft_ms"] * 2,
                         request_throughput=ours["request_throughput"] / 1.25)
    assert main(BASE + ["--compare", str(measured)]) == 0
    text = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line[:1].isalpha() and "%" in line}
    assert rows["mean_ttft_ms"][-2] == "-50.0" and rows["request_throughput"][-2] == "+25.0"
    # the measured file's own percentiles are computed (p99.9 ITL), std is not compared
    assert "p99.9_itl_ms" in rows and "p99_e2el_ms" in rows and "std_ttft_ms" not in rows
    assert "median_tpot_ms" in rows and "completed" in rows


@pytest.mark.parametrize("content, where", [
    ("{\n  \"mean_ttft_ms\": 1,\n  oops\n}", "vllm.json:3"),
    ("[1, 2]", "JSON object"),
    ("{\"model_id\": \"x\"}", "no vllm bench serve metric"),
    ("{\"mean_ttft_ms\": \"fast\"}", "mean_ttft_ms"),
])
def test_a_bad_compare_file_is_one_line(tmp_path, capsys, content, where):
    path = tmp_path / "vllm.json"
    path.write_text(content)
    assert main(BASE + ["--compare", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert where in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("extra, word", [
    (["--goodput", "itl:5"], "unknown metric"),
    (["--goodput", "ttft"], "KEY:MS"),
    (["--metric-percentiles", "0"], "outside"),
    (["--compare", "/nonexistent/v.json"], "cannot read"),
])
def test_bad_bench_options_are_one_line(capsys, extra, word):
    assert main(BASE + extra) == 2
    err = capsys.readouterr().err.strip()
    assert word in err and len(err.splitlines()) == 1
