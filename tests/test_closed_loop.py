"""Closed-loop workloads as vllm bench serve sends them: the ``random:`` dataset, its arrivals
(rate, burstiness) and a client's ``--max-concurrency`` (a request sent when it has arrived and
fewer than C are in flight, else when the next one leaves the engine)."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from kvsim import workloads
from kvsim.cli import main
from kvsim.errors import InputError
from kvsim.simulator import EngineConfig, FixedStepCost, simulate


def _cfg(**kw) -> EngineConfig:
    base = dict(num_blocks=3000, block_size=16, null_block=True, max_num_seqs=64,
                max_num_batched_tokens=1024, max_model_len=4096)
    base.update(kw)
    return EngineConfig(**base)


def _run(spec, cfg, step_s=0.01, **kw):
    w = workloads.workload_from_spec(spec)
    return simulate(iter(w), cfg, FixedStepCost(step_s), max_concurrency=w.max_concurrency, **kw)


def _max_overlap(starts, ends) -> int:
    """Most requests in flight at once over half-open [start, end) (a finish frees its slot
    before a send at the same instant), as vllm bench serve's peak concurrency."""
    events = sorted([(t, 1) for t in starts] + [(t, -1) for t in ends], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("concurrency", [1, 5, 16])
def test_each_request_is_sent_as_one_leaves(concurrency, async_scheduling):
    spec = f"random:isl=300,osl=40,isl_range=0.5,osl_range=0.5,n=60,concurrency={concurrency},seed=2"
    r = _run(spec, _cfg(async_scheduling=async_scheduling)).requests
    assert len(r) == 60 and not r["rejected"].any()
    sent = r.sort_values(["arrival_s", "request_id"])
    # requests go in order; the first C at once, then the k-th (k >= C) at the (k-C+1)-th finish
    assert list(sent["request_id"]) == list(range(60))
    finishes = np.sort(r["finish_s"].to_numpy())
    send = sent["arrival_s"].to_numpy()
    assert (send[:concurrency] == 0).all()
    assert np.allclose(send[concurrency:], finishes[:60 - concurrency], rtol=0, atol=1e-12)
    assert _max_overlap(r["arrival_s"], r["finish_s"]) == concurrency
    # rate inf: every request was due at 0, so its client-side wait is its send time; TTFT and
    # E2E count from the send, as vllm bench serve's do
    assert np.allclose(r["client_queue_s"], r["arrival_s"], atol=1e-12)
    assert np.allclose(r["ttft_s"], r["first_token_s"] - r["arrival_s"], atol=1e-12)
    assert np.allclose(r["e2e_s"], r["finish_s"] - r["arrival_s"], atol=1e-12)


def test_a_limit_above_the_workload_is_the_open_loop():
    spec = "random:isl=200,osl=30,isl_range=0.5,n=40,rate=20,seed=1"
    w = list(workloads.load(spec))
    cfg = _cfg()
    open_loop = simulate(iter(w), cfg, FixedStepCost(0.01))
    limited = simulate(iter(w), cfg, FixedStepCost(0.01), max_concurrency=40)
    assert open_loop.summary_json(include_wall_clock=False) == limited.summary_json(include_wall_clock=False)
    assert open_loop.requests.equals(limited.requests)


def test_with_a_rate_a_request_waits_for_its_time_and_for_a_slot():
    spec = "random:isl=400,osl=60,n=50,rate=40,burstiness=0.5,concurrency=4,seed=5"
    w = workloads.workload_from_spec(spec)
    due = {q.request_id: q.arrival_s for q in w}
    r = _run(spec, _cfg(), step_s=0.02).requests.set_index("request_id")
    waited = r["client_queue_s"] > 0
    assert waited.any() and (~waited).any()
    for rid, row in r.iterrows():
        assert row["arrival_s"] == pytest.approx(due[rid] + row["client_queue_s"], abs=1e-9)
        if row["client_queue_s"] > 0:    # sent exactly when an earlier request finished
            assert np.isclose(r["finish_s"], row["arrival_s"], rtol=0, atol=1e-9).any()
    assert _max_overlap(r["arrival_s"], r["finish_s"]) <= 4


def test_on_the_step_clock_the_next_request_arrives_at_the_next_step():
    # vLLM's loop: the request that finishes in step s is answered after it; the client's next
    # request is added before step s + 1 is scheduled (sync) or s + 2 (async: s + 1 is already
    # scheduled when s's output is processed)
    for async_scheduling, lag in ((False, 1), (True, 2)):
        cfg = _cfg(async_scheduling=async_scheduling)
        r = _run("random:isl=64,osl=8,osl_range=0.5,n=12,concurrency=3,seed=4", cfg, step_s=1.0).requests
        r = r.sort_values("arrival_s")
        later = r.iloc[3:]
        finishes = np.sort(r["finish_step"].to_numpy())[:len(later)]
        assert list(later["first_sched_step"]) == list(finishes + lag), async_scheduling


def test_a_rejected_request_frees_its_slot():
    reqs = [workloads.Request(i, 0.0, 5000 if i == 1 else 100, 10) for i in range(6)]
    res = simulate(iter(reqs), _cfg(), FixedStepCost(0.01), max_concurrency=2)
    r = res.requests.set_index("request_id")
    assert r.loc[1, "rejected"] and not r.drop(index=1)["rejected"].any()
    assert res.summary["requests_finished"] == 5


def test_random_spec_draws_vllm_bench_serve_lengths():
    w = workloads.workload_from_spec("random:isl=1000,osl=100,isl_range=0.1,osl_range=0.5,n=3000,"
                                     "prefix_len=64,seed=9")
    reqs = list(w)
    inputs = np.array([q.prompt_tokens - 64 for q in reqs])
    outputs = np.array([q.output_tokens for q in reqs])
    # integers uniform in [floor(L(1-r)), ceil(L(1+r))], both ends drawn
    assert inputs.min() == 900 and inputs.max() == 1100
    assert outputs.min() == 50 and outputs.max() == 150
    assert abs(inputs.mean() - 1000) < 5 and abs(outputs.mean() - 100) < 2
    # one prefix shared by every prompt, in front of it
    assert {q.segments[0] for q in reqs} == {reqs[0].segments[0]} and reqs[0].segments[0][1] == 64
    assert all(q.num_shareable_tokens == 64 for q in reqs)
    assert all(q.arrival_s == 0 for q in reqs) and w.max_concurrency is None
    # no ranges: every request the same
    same = list(workloads.load("random:isl=10,osl=3,n=4"))
    assert {(q.prompt_tokens, q.output_tokens) for q in same} == {(10, 3)}
    # defaults as vllm bench serve's: 1024 in, 128 out, 1000 requests
    assert workloads.workload_from_spec("random").num_requests == 1000
    assert {(q.prompt_tokens, q.output_tokens) for q in itertools.islice(workloads.load("random"), 5)} == {(1024, 128)}


def test_random_spec_arrivals_follow_rate_and_burstiness():
    n, rate = 400, 8.0
    for burstiness in ("0.25", "1", "4"):
        times = np.array([q.arrival_s for q in workloads.load(f"random:n={n},rate={rate},burstiness={burstiness},seed=3")])
        # vllm bench serve scales the summed gaps so that the last request goes at n / rate
        assert times[-1] == pytest.approx(n / rate) and times[0] > 0 and (np.diff(times) >= 0).all()
        cv = np.diff(times).std() / np.diff(times).mean()
        assert cv == pytest.approx(1 / math.sqrt(float(burstiness)), rel=0.2)
    even = np.array([q.arrival_s for q in workloads.load("random:n=5,rate=2,burstiness=inf")])
    assert np.allclose(even, [0.5, 1.0, 1.5, 2.0, 2.5])
    a = [q.arrival_s for q in workloads.load("random:n=50,rate=3,seed=1")]
    assert a == [q.arrival_s for q in workloads.load("random:n=50,rate=3,seed=1")]
    assert a != [q.arrival_s for q in workloads.load("random:n=50,rate=3,seed=2")]


@pytest.mark.parametrize("spec, key", [
    ("random:isl=100,isl_range=1", "isl_range"),
    ("random:isl=100,osl_range=-0.1", "osl_range"),
    ("random:isl=1,isl_range=0.5", "isl_range"),
    ("random:concurrency=0", "concurrency"),
    ("random:rate=0", "rate"),
    ("random:burstiness=0", "burstiness"),
    ("random:isl=0", "isl"),
    ("random:turns=3", "turns"),
])
def test_bad_random_specs_name_their_key(spec, key):
    with pytest.raises(InputError) as info:
        workloads.workload_from_spec(spec)
    assert key in str(info.value) and "\n" not in str(info.value)


def test_cli_max_concurrency(tmp_path, capsys):
    out = tmp_path / "r.csv"
    base = ["replay", "--num-blocks", "2000", "--quiet", "--step-s", "0.01", "--requests", str(out),
            "--out", str(tmp_path / "s.json")]
    assert main(base + ["random:isl=128,osl=16,n=30,seed=1", "--max-concurrency", "4"]) == 0
    import pandas as pd
    r = pd.read_csv(out)
    assert _max_overlap(r["arrival_s"], r["finish_s"]) == 4 and r["client_queue_s"].max() > 0
    first = json.loads((tmp_path / "s.json").read_text())
    # the spec's concurrency= is the same setting
    assert main(base + ["random:isl=128,osl=16,n=30,seed=1,concurrency=4"]) == 0
    again = json.loads((tmp_path / "s.json").read_text())
    first.pop("wall_clock_s"), again.pop("wall_clock_s")
    assert first == again
    capsys.readouterr()
    # both, disagreeing, and a bad value: one line, exit 2
    assert main(base + ["random:n=30,concurrency=4", "--max-concurrency", "8"]) == 2
    assert "disagree" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(base + ["random:n=30", "--max-concurrency", "0"])
    assert exc.value.code == 2
