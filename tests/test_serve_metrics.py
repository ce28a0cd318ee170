"""vllm bench serve's metrics (simulator.serve_metrics), each formula pinned on a case computed by
hand: three requests on a fixed 10 ms step clock."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kvsim.simulator import EngineConfig, FixedStepCost, simulate
from kvsim.simulator.serve_metrics import (parse_goodput, parse_percentiles, percentile_key, serve_metrics,
                                           weighted_percentile)
from kvsim.workloads import Request


def _three():
    """A (prompt 10, 3 tokens) and B (prompt 20, 1 token) sent at 0, C (prompt 10, 2 tokens) at
    15 ms. Steps of 10 ms: [0, 10) prefills A and B (first tokens at 10 ms; B is done);
    [10, 20) decodes A; C arrives inside it, so [20, 30) decodes A (done at 30) and prefills C
    (first token at 30); [30, 40) decodes C (done at 40)."""
    reqs = [Request(0, 0.0, 10, 3), Request(1, 0.0, 20, 1), Request(2, 0.015, 10, 2)]
    cfg = EngineConfig(num_blocks=100, block_size=16, null_block=True, max_num_seqs=8,
                       max_num_batched_tokens=256, max_model_len=256)
    return simulate(iter(reqs), cfg, FixedStepCost(0.01), record_token_times=True)


def test_every_metric_is_vllm_bench_serves_formula_on_a_hand_computed_case():
    res = _three()
    r = res.requests.set_index("request_id")
    # the engine's times, as the docstring works them out
    assert list(r["first_token_s"]) == pytest.approx([0.01, 0.01, 0.03])
    assert list(r["finish_s"]) == pytest.approx([0.03, 0.01, 0.04])
    m = serve_metrics(res.requests, res.token_times, percentiles=[50, 90, 99], goodput={"ttft": 12})
    ms = pytest.approx
    assert m["duration"] == ms(0.04) and m["completed"] == 3 and m["failed"] == 0
    assert m["total_input_tokens"] == 40 and m["total_output_tokens"] == 6
    assert m["request_throughput"] == ms(3 / 0.04) and m["output_throughput"] == ms(6 / 0.04)
    assert m["total_token_throughput"] == ms(46 / 0.04)
    # TTFT from the send: 10, 10, 15 ms; numpy's linear percentile: p90 = 10 + 0.8 x 5
    assert m["mean_ttft_ms"] == ms(35 / 3) and m["median_ttft_ms"] == ms(10) and m["p90_ttft_ms"] == ms(14)
    assert m["p99_ttft_ms"] == ms(10 + 0.98 * 5) and m["p50_ttft_ms"] == ms(10)
    assert m["std_ttft_ms"] == ms(np.std([10, 10, 15]))
    # TPOT excludes the first token and one-token requests: A (30-10)/2, C (25-15)/1
    assert m["mean_tpot_ms"] == ms(10) and m["std_tpot_ms"] == ms(0, abs=1e-9)
    # ITL: A's two gaps and C's one, 10 ms each
    assert m["mean_itl_ms"] == ms(10) and m["p99_itl_ms"] == ms(10)
    # E2E: 30, 10, 25 ms
    assert m["mean_e2el_ms"] == ms(65 / 3) and m["median_e2el_ms"] == ms(25) and m["p90_e2el_ms"] == ms(29)
    # goodput ttft <= 12 ms: A and B (B's TPOT counts as 0)
    assert m["request_goodput"] == ms(2 / 0.04)
    assert serve_metrics(res.requests, res.token_times, goodput={"ttft": 12, "tpot": 9.99})["request_goodput"] == ms(1 / 0.04)
    assert serve_metrics(res.requests, res.token_times, goodput={"e2el": 25})["request_goodput"] == ms(2 / 0.04)
    assert serve_metrics(res.requests, res.token_times)["request_goodput"] is None
    # A [0, 30) and B [0, 10) overlap, C [15, 40) overlaps A: at most 2 in flight; all 6 tokens
    # come out within the first second
    assert m["max_concurrent_requests"] == 2 and m["max_output_tokens_per_s"] == 6
    assert m["input_lens"] == [10, 20, 10] and m["output_lens"] == [3, 1, 2]
    assert m["start_times"] == ms([0, 0, 0.015]) and "client_queue_time" not in "".join(m)


def test_client_queue_metrics_come_with_a_concurrency_limit():
    reqs = [Request(i, 0.0, 10, 3) for i in range(3)]
    cfg = EngineConfig(num_blocks=100, block_size=16, null_block=True, max_num_seqs=8,
                       max_num_batched_tokens=256, max_model_len=256)
    res = simulate(iter(reqs), cfg, FixedStepCost(0.01), max_concurrency=2, record_token_times=True)
    m = serve_metrics(res.requests, res.token_times, max_concurrency=2, percentiles=[99])
    # two run 0-30 ms; the third waits for them and runs 30-60 ms
    assert m["queue_times"] == pytest.approx([0, 0, 0.03]) and m["duration"] == pytest.approx(0.06)
    assert m["mean_client_queue_time_ms"] == pytest.approx(10) and m["max_concurrent_requests"] == 2
    assert "mean_e2el_including_client_queue_ms" not in m       # only with a finite rate
    with_rate = serve_metrics(res.requests, res.token_times, max_concurrency=2, request_rate=10.0)
    assert with_rate["mean_e2el_including_client_queue_ms"] == pytest.approx((30 + 30 + 60) / 3)


def test_rejected_requests_are_failed():
    reqs = [Request(0, 0.0, 10, 3), Request(1, 0.0, 400, 3)]
    cfg = EngineConfig(num_blocks=100, block_size=16, null_block=True, max_num_seqs=8,
                       max_num_batched_tokens=256, max_model_len=256)
    res = simulate(iter(reqs), cfg, FixedStepCost(0.01), record_token_times=True)
    m = serve_metrics(res.requests, res.token_times)
    assert m["completed"] == 1 and m["failed"] == 1 and m["total_input_tokens"] == 10
    assert m["output_lens"] == [3, 0] and m["ttfts"][1] == 0.0 and m["errors"][1]


def test_weighted_percentile_is_numpys_on_the_repeated_list():
    rng = np.random.default_rng(0)
    for _ in range(50):
        values = rng.random(rng.integers(1, 8))
        weights = rng.integers(1, 5, len(values))
        full = np.repeat(values, weights)
        for p in (0.5, 25, 50, 90, 99, 99.9, 100):
            assert weighted_percentile(values, weights, p) == pytest.approx(np.percentile(full, p), rel=1e-12)


def test_empty_lists_count_as_zero():
    res = _three()
    one = res.requests[res.requests["request_id"] == 1]      # one token: no TPOT, no gaps
    m = serve_metrics(one, None)
    assert m["mean_tpot_ms"] == 0 and m["p99_tpot_ms"] == 0 and "mean_itl_ms" not in m


def test_option_parsing_and_names():
    assert parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    for bad in (["ttft"], ["itl:5"], ["ttft:x"], ["ttft:-1"]):
        with pytest.raises(ValueError) as info:
            parse_goodput(bad)
        assert "\n" not in str(info.value)
    assert parse_percentiles("50, 99.9") == [50.0, 99.9]
    for bad in ("0", "101", "x", ""):
        with pytest.raises(ValueError):
            parse_percentiles(bad)
    assert percentile_key(99.0) == "p99" and percentile_key(99.9) == "p99.9" and not math.isnan(99)


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("num_blocks", [3000, 500])       # 500: preemptions
def test_token_rows_are_the_same_with_decode_runs_and_add_up(async_scheduling, num_blocks):
    """Decode runs batched give the token rows of stepping one by one; the rows hold every
    generated token, and their gaps are each request's tokens after its first."""
    from kvsim import workloads
    from kvsim.simulator.cost_table import load_cost_table
    from pathlib import Path

    cost = load_cost_table(Path(__file__).resolve().parent.parent / "tables" / "Llama-3.1-8B_H200.csv")
    cfg = EngineConfig(num_blocks=num_blocks, block_size=16, null_block=True, max_num_seqs=32,
                       max_num_batched_tokens=1024, max_model_len=4096, async_scheduling=async_scheduling)
    spec = "sharegpt:rate=6,n=80,seed=3,system=256,system_frac=0.5,turns=uniform(1,3),think_s=3"
    runs = [simulate(iter(workloads.load(spec)), cfg, cost, record_token_times=True, batch_decode_steps=b)
            for b in (True, False)]
    a, b = (r.token_times for r in runs)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    res = runs[0]
    assert a["num_tokens"].sum() == res.summary["generated_tokens"]
    assert a["num_gap_tokens"].sum() == (res.requests["num_output"] - 1).sum()
    assert len(set(a["duration_ns"])) > 10 and (np.diff(a["end_ns"]) > 0).all()
    if num_blocks == 500:
        assert res.summary["num_preemptions"] > 0
