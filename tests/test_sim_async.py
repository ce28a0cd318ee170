"""Async scheduling (vLLM's AsyncScheduler, two batches in flight): one test per rule of
docs/FIDELITY.md section 1.6, on hand-built cases whose expected values vLLM's own scheduler
gives too (the oracle, ../shared/tools/vllm_oracle, was run on each), plus the rules' necessity
on a golden fixture and the speed-ups' identity."""
from __future__ import annotations

import itertools
import json
import shutil

import pytest

from bench.fidelity_diff import FIXTURE_DIR, compare_dirs, kvsim_argv
from kvsim import workloads
from kvsim.simulator import EngineConfig, FixedStepCost, simulate
from kvsim.simulator.async_scheduling import AsyncScheduler


def _run(reqs, async_scheduling, **kw):
    base = dict(num_blocks=64, block_size=16, null_block=True, max_num_seqs=8,
                max_num_batched_tokens=2048, max_model_len=1024,
                async_scheduling=async_scheduling)
    base.update(kw)
    res = simulate(iter(reqs), EngineConfig(**base), FixedStepCost(1.0), record_steps=True)
    table = res.requests.set_index("request_id")
    return res, table



def test_finished_request_holds_its_seat_until_the_next_step_is_scheduled(step_clock_trace):
    """Rules 29-30: request 0 samples its last token in step 2; vLLM frees it only after step 3
    is scheduled, so with max_num_seqs 2 request 2 starts in step 4, not 3 (oracle: 3 / 4)."""
    reqs = step_clock_trace((0, 16, 3), (0, 16, 10), (1, 16, 2))
    for is_async, start in ((False, 3), (True, 4)):
        res, t = _run(reqs, is_async, max_num_seqs=2)
        assert t.loc[0, "finish_step"] == 2
        assert t.loc[2, "first_sched_step"] == start
        step3 = res.timeseries.set_index("step").loc[3]
        # async: request 0 is still RUNNING in step 3 (and counted), but not scheduled
        assert (step3["running"], step3["sched_reqs"]) == ((2, 1) if is_async else (2, 2))


def test_nothing_to_schedule_while_a_batch_is_in_flight_is_not_a_step(step_clock_trace):
    """Rule 31: max_num_seqs 1; after request 0's last step, schedule() finds nothing (0 holds
    the seat), the engine processes the batch in flight and schedules again at the same step:
    request 1 starts in step 2 as in the synchronous engine, and no empty step is counted."""
    reqs = step_clock_trace((0, 16, 2), (0, 16, 1))
    for is_async in (False, True):
        res, t = _run(reqs, is_async, max_num_seqs=1)
        assert list(t["first_sched_step"]) == [0, 2]
        assert list(t["finish_step"]) == [1, 2]
        assert res.summary["num_steps"] == 3 and res.summary["simulated_duration_s"] == 3.0


def test_a_request_whose_last_token_is_in_flight_can_be_preempted(step_clock_trace):
    """Rule 32: 4 usable blocks, both prompts take 2; request 1 samples its only token in
    step 0. In step 1 request 0 needs a block: vLLM still holds request 1 (running[-1]) and
    preempts it, although it needs nothing more; it finishes in step 0 all the same, while
    waiting (oracle: num_preemptions 1 with async, 0 without)."""
    reqs = step_clock_trace((0, 32, 6), (0, 32, 1))
    for is_async in (False, True):
        res, t = _run(reqs, is_async, num_blocks=5)
        assert t.loc[1, "finish_step"] == 0 and t.loc[1, "num_output"] == 1
        assert t.loc[1, "num_preemptions"] == int(is_async)
        assert t.loc[0, "finish_step"] == 5
        assert res.summary["num_preemptions"] == int(is_async)
        assert res.timeseries.set_index("step").loc[1, "preempted"] == int(is_async)
        assert res.summary["requests_finished"] == 2


def _golden(case, tmp_path):
    entry = json.loads((FIXTURE_DIR / "manifest.json").read_text())[case]
    tmp_path.mkdir()
    trace = tmp_path / "trace.csv"
    shutil.copy(FIXTURE_DIR / entry["trace"], trace)
    from kvsim import cli
    assert cli.main(kvsim_argv(trace, entry["oracle_args"], tmp_path) + ["--quiet"]) == 0
    return compare_dirs(case, FIXTURE_DIR / case, tmp_path)


def test_preempted_with_a_decode_in_flight_frees_that_block_unhashed(tmp_path, monkeypatch):
    """Rule 34, necessary: with it kvsim makes vLLM's decisions on the preemption storm;
    hashing every block at preemption (the synchronous rule) hits one block too many on a
    re-admission."""
    assert _golden("async_preemption_storm", tmp_path / "with").identical
    monkeypatch.setattr(AsyncScheduler, "_hashed_on_preemption", lambda self, seq: None)
    d = _golden("async_preemption_storm", tmp_path / "without")
    assert not d.identical and d.step_mismatches["pc_preempted_hits"] > 0


def test_async_result_records_the_mode(step_clock_trace):
    reqs = step_clock_trace((0, 16, 3))
    for is_async in (False, True):
        res, _t = _run(reqs, is_async)
        engine = res.summary["config"]["engine"]
        # synchronous runs keep the keys they always had
        assert engine.get("async_scheduling", False) is is_async
        assert ("async_scheduling" in engine) is is_async


def test_async_in_time_mode_frees_after_the_next_schedule(step_clock_trace):
    """With a step time, tokens and finishes are timed at the end of their step as in the
    synchronous engine; only the decisions move (here: the third request starts a step later)."""
    reqs = step_clock_trace((0, 16, 3), (0, 16, 10), (1, 16, 2))
    for r in reqs:
        r.arrival_s = r.arrival_step * 0.05
    cfg = dict(num_blocks=64, block_size=16, null_block=True, max_num_seqs=2,
               max_num_batched_tokens=2048, max_model_len=1024)
    sync, asyn = (simulate(iter(reqs), EngineConfig(**cfg, async_scheduling=a),
                           FixedStepCost(0.05)).requests.set_index("request_id")
                  for a in (False, True))
    assert sync.loc[0, "finish_s"] == asyn.loc[0, "finish_s"] == pytest.approx(0.15)
    assert asyn.loc[2, "first_sched_s"] - sync.loc[2, "first_sched_s"] == pytest.approx(0.05)


CONV = "sharegpt:rate=4,n=50,seed=3,system=256,system_frac=0.5,turns=uniform(1,4),think_s=5"


@pytest.mark.parametrize("num_blocks,pc", [(250, True), (250, False), (900, True)])
def test_async_decode_runs_identical_to_single_steps(num_blocks, pc, batched_equals_stepped):
    """The decode clock and batched decode runs make the same decisions in async mode."""
    reqs = list(itertools.islice(workloads.load(CONV), None))
    cfg = EngineConfig(num_blocks=num_blocks, block_size=16, null_block=True, max_num_seqs=32,
                       max_num_batched_tokens=1024, max_model_len=4096,
                       enable_prefix_caching=pc, async_scheduling=True)
    fast = batched_equals_stepped(reqs, cfg)
    if num_blocks == 250:
        assert fast.summary["num_preemptions"] > 0


def _timed(reqs, async_scheduling, step_s=0.01, **kw):
    base = dict(num_blocks=256, block_size=16, max_num_seqs=8, max_num_batched_tokens=2048,
                max_model_len=1024, async_scheduling=async_scheduling)
    base.update(kw)
    res = simulate(iter(reqs), EngineConfig(**base), FixedStepCost(step_s), record_steps=True)
    return res.requests.set_index("request_id")


def test_a_request_arriving_while_a_step_runs_waits_one_more_step_under_async_scheduling():
    """vLLM's batch queue schedules step k + 1 when step k starts, so a request that arrives
    while step k runs joins step k + 2 (scheduled when step k ends, run after step k + 1); the
    synchronous engine schedules it into step k + 1. 10 ms steps; request 0 decodes from t = 0,
    request 1 arrives 3 ms into step 5 (t = 53 ms): synchronously its prefill is step 6 (60-70
    ms, TTFT 17 ms), async step 7 (70-80 ms, TTFT 27 ms). At an idle engine nothing is in
    flight: a lone request's prefill starts at once either way."""
    long = workloads.Request(0, 0.0, 16, 40)
    late = workloads.Request(1, 0.053, 16, 4)
    sync, asyn = (_timed([long, late], a) for a in (False, True))
    assert sync.loc[1, "ttft_s"] == pytest.approx(0.017) and asyn.loc[1, "ttft_s"] == pytest.approx(0.027)
    assert sync.loc[1, "first_sched_step"] == 6 and asyn.loc[1, "first_sched_step"] == 7
    assert sync.loc[0, "ttft_s"] == asyn.loc[0, "ttft_s"] == pytest.approx(0.010)
    lone = [workloads.Request(0, 0.0, 16, 4), workloads.Request(1, 1.0, 16, 4)]
    assert (_timed(lone, True)["ttft_s"] == _timed(lone, False)["ttft_s"]).all()
    # an arrival just as step 5 ends (60 ms) is seen by the schedule vLLM makes then, step 7's
    # (step 6's was made at 50 ms)
    on_time = workloads.Request(1, 0.060, 16, 4)
    assert _timed([long, on_time], True).loc[1, "first_sched_step"] == 7
    # ... and with nothing else to run (request 0 finished in flight), vLLM waits for the batch in
    # flight and schedules the arrival then: no extra step
    short = workloads.Request(0, 0.0, 16, 6)       # its last token in step 5 (50-60 ms)
    alone = workloads.Request(1, 0.053, 16, 4)
    t = _timed([short, alone], True)
    assert t.loc[1, "ttft_s"] == pytest.approx(0.017)
