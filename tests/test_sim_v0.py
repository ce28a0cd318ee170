"""The v0 scheduler (vLLM 0.2-0.5, chunked prefill off): hand-built cases whose v0 decisions
differ from vLLM v1's, the configuration rules, the step pricing and the speed-ups' identity.
docs/SIMULATOR.md ("The v0 scheduler") gives the rules with vLLM's source lines."""
from __future__ import annotations

import itertools

import pytest

from kvsim import workloads
from kvsim.simulator import EngineConfig, FixedStepCost, simulate
from kvsim.workloads import Request



def _cfg(scheduler, **kw):
    base = dict(num_blocks=64, block_size=16, max_num_seqs=8, max_num_batched_tokens=2048,
                max_model_len=2048, enable_prefix_caching=False, scheduler=scheduler)
    base.update(kw)
    if scheduler == "v1":   # the same usable blocks: v1 reserves the null block
        base["num_blocks"] += 1
        base["null_block"] = True
    return EngineConfig(**base)


def _run(reqs, scheduler, **kw):
    res = simulate(iter(reqs), _cfg(scheduler, **kw), FixedStepCost(1.0), record_steps=True)
    return res, res.requests.set_index("request_id")


def test_a_prompt_step_runs_prompts_only(step_clock_trace):
    """Request 1 arrives while 0 decodes: v0 spends step 2 on its prompt alone (0 gets no
    token), v1 runs both in one step."""
    reqs = step_clock_trace((0, 16, 5), (2, 16, 1))
    res, t = _run(reqs, "v0")
    step2 = res.timeseries.set_index("step").loc[2]
    assert (step2["sched_reqs"], step2["prefill_tokens"], step2["decode_reqs"]) == (1, 16, 0)
    assert t.loc[0, "finish_step"] == 5 and t.loc[1, "finish_step"] == 2
    _res, t1 = _run(reqs, "v1")
    assert t1.loc[0, "finish_step"] == 4


def test_decode_preempts_when_no_block_is_free_even_if_none_is_needed(step_clock_trace):
    """4 blocks, both 20-token prompts take 2: in step 1 neither decode needs a new block, but
    v0's can_append_slots wants one free block per turn, so request 0's turn preempts the
    latest arrival (1), which comes back as a 21-token prompt in step 2 (a prompt step), is
    preempted again in step 3 and gets its last token from a 22-token prompt in step 4. v1
    preempts nobody."""
    reqs = step_clock_trace((0, 20, 3), (0, 20, 3))
    res, t = _run(reqs, "v0", num_blocks=4)
    assert list(t["num_preemptions"]) == [0, 2]
    rows = res.timeseries.set_index("step")
    assert list(rows["preempted"]) == [0, 1, 0, 1, 0]
    assert list(rows["sched_reqs"]) == [2, 1, 1, 1, 1]
    assert list(rows["prefill_tokens"]) == [40, 0, 21, 0, 22]   # 1 samples in prompt steps
    assert list(t["finish_step"]) == [3, 4]
    assert res.summary["requests_finished"] == 2
    _res, t1 = _run(reqs, "v1", num_blocks=4)
    assert list(t1["num_preemptions"]) == [0, 0]


def test_prompts_fill_the_budget_in_order_head_of_line(step_clock_trace):
    """Budget 64: prompts 40, 30, 10 arrive together. v0 admits 40 (30 would exceed the budget
    and blocks the 10 behind it), then 30 + 10 in a second prompt step, whole; v1 fills step 0
    with 40 + a 24-token chunk of the second prompt."""
    reqs = step_clock_trace((0, 40, 4), (0, 30, 4), (0, 10, 4))
    res, t = _run(reqs, "v0", max_num_batched_tokens=64, max_model_len=64)
    assert list(t["first_sched_step"]) == [0, 1, 1]
    assert list(res.timeseries["sched_tokens"][:2]) == [40, 40]
    res1, t1 = _run(reqs, "v1", max_num_batched_tokens=64, max_model_len=64)
    assert list(t1["first_sched_step"][:2]) == [0, 0]
    assert res1.timeseries["sched_tokens"].iloc[0] == 64


def test_a_prompt_waits_for_a_seat_under_max_num_seqs(step_clock_trace):
    """max_num_seqs 2: three prompts arrive together; v0 admits two in step 0, and the third
    only once request 0 has finished (step 1), in a prompt step of its own that stalls
    request 1's decode. With a free seat (max_num_seqs 3) all three start in step 0."""
    reqs = step_clock_trace((0, 16, 2), (0, 16, 4), (0, 16, 4))
    res, t = _run(reqs, "v0", max_num_seqs=2)
    assert list(t["first_sched_step"]) == [0, 0, 2]
    step2 = res.timeseries.set_index("step").loc[2]
    assert (step2["sched_reqs"], step2["decode_reqs"], step2["running"]) == (1, 0, 2)
    assert list(t["finish_step"]) == [1, 4, 5]
    _res, t3 = _run(reqs, "v0", max_num_seqs=3)
    assert list(t3["first_sched_step"]) == [0, 0, 0]


def test_watermark_of_one_percent_applies_to_an_empty_engine(step_clock_trace):
    """100 blocks: int(0.01 * 100) = 1 block must stay free at admission, even into an empty
    engine. A 100-block prompt can never be admitted (rejected); a 99-block one is. v1 (no
    watermark by default, and none into an empty engine) admits both."""
    reqs = step_clock_trace((0, 1600, 1), (10, 1584, 2))
    res, t = _run(reqs, "v0", num_blocks=100)
    assert list(t["rejected"]) == [True, False]
    assert res.summary["requests_rejected"] == 1
    assert _cfg("v0").watermark == 0.01 and _cfg("v0", watermark=0.05).watermark == 0.05
    _res, t1 = _run(reqs, "v1", num_blocks=100)
    assert not t1["rejected"].any()


def test_v0_configuration_rules():
    cfg = _cfg("v0", enable_prefix_caching=True)
    assert (cfg.enable_prefix_caching, cfg.null_block) == (False, False)   # vLLM v0 defaults
    assert cfg.as_dict()["scheduler"] == "v0" and "scheduler" not in _cfg("v1").as_dict()
    for bad, match in [(dict(allocator="max", num_blocks=None, capacity_tokens=4096), "contiguous KV manager"),
                       (dict(async_scheduling=True), "async"),
                       (dict(long_prefill_token_threshold=64), "chunk"),
                       (dict(max_num_batched_tokens=1024), "max_model_len"),
                       (dict(max_num_seqs=4096, max_num_batched_tokens=2048), "max_num_seqs")]:
        with pytest.raises(ValueError, match=match):
            _cfg("v0", **bad)
    with pytest.raises(ValueError, match="scheduler must be"):
        _cfg("v2")
    forked = Request(0, 0.0, 16, 4, n=2)
    with pytest.raises(ValueError, match="parallel sampling"):
        simulate(iter([forked]), _cfg("v0"), FixedStepCost(1.0))


class _Recorder:
    """A cost model (0.02 s a step) that remembers every batch it priced."""

    def __init__(self):
        self.batches = []

    def step_time_s(self, batch):
        self.batches.append(batch)
        return 0.02

    def run_time_s(self, batch, num_steps):
        self.batches.append(batch)
        return 0.02 * num_steps


def test_a_prompt_step_prices_prefill_only():
    reqs = list(itertools.islice(workloads.load("sharegpt:rate=8,n=120,seed=4"), None))
    cost = _Recorder()
    res = simulate(iter(reqs), _cfg("v0", num_blocks=400), cost)
    assert res.summary["requests_finished"] == 120
    kinds = {(b.num_prefill_tokens > 0, b.num_decode_tokens > 0) for b in cost.batches}
    assert kinds == {(True, False), (False, True)}    # never both in one step


@pytest.mark.parametrize("num_blocks", [150, 900])
def test_v0_decode_runs_identical_to_single_steps(num_blocks, batched_equals_stepped):
    reqs = list(itertools.islice(workloads.load("sharegpt:rate=6,n=80,seed=2"), None))
    fast = batched_equals_stepped(reqs, _cfg("v0", num_blocks=num_blocks, max_num_seqs=32))
    if num_blocks == 150:
        assert fast.summary["num_preemptions"] > 0


def test_running_requests_are_always_the_earliest_arrivals(monkeypatch):
    """FCFS head-of-line admission and the latest arrival as victim keep every running request
    ahead of every waiting one in arrival order, at every step: the orders that vLLM 0.2-0.4
    (re-sorted by arrival), 0.6 (admission order) and kvsim serve decodes in are one order
    (docs/SIMULATOR.md, "Running order")."""
    from kvsim.simulator.scheduler_v0 import V0Scheduler
    checked = []
    schedule = V0Scheduler.schedule

    def checking(self, now_ns, step_index):
        out = schedule(self, now_ns, step_index)
        if self.running and self.waiting:
            assert max(s.seq_id for s in self.running) < min(s.seq_id for s in self.waiting)
            checked.append(step_index)
        return out
    monkeypatch.setattr(V0Scheduler, "schedule", checking)
    reqs = list(itertools.islice(workloads.load("sharegpt:rate=6,n=80,seed=2"), None))
    res = simulate(iter(reqs), _cfg("v0", num_blocks=150, max_num_seqs=32), FixedStepCost(0.025),
                   batch_decode_steps=False)
    assert res.summary["num_preemptions"] > 0 and len(checked) > 100
