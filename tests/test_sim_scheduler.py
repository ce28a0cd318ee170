"""Scheduler decisions, driven step by step on a small paged pool (vLLM v1 rules)."""
from __future__ import annotations

import pytest

from kvsim.allocator import PagedAllocator
from kvsim.simulator import EngineConfig
from kvsim.simulator.admission import WAIT
from kvsim.simulator.scheduler import PREEMPTED, RUNNING, Scheduler
from kvsim.workloads import Request


def _sched(num_blocks=12, **kw):
    base = dict(num_blocks=num_blocks, block_size=4, null_block=True, max_num_seqs=8,
                max_num_batched_tokens=64, max_model_len=256)
    base.update(kw)
    cfg = EngineConfig(**base)
    alloc = PagedAllocator(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_caching,
                           null_block=True)
    return Scheduler(cfg, alloc), alloc


def _step(sched, alloc, t):
    out = sched.schedule(t, t)
    sched.finish_step(out, t + 1, t)
    sched.sync_allocator()
    alloc.check_invariants()
    return out


def test_budgets_and_chunked_prefill():
    sched, alloc = _sched(num_blocks=64, max_num_batched_tokens=10, max_num_seqs=2)
    for i in range(3):
        sched.add_request(Request(i, 0.0, 8, 4), 0)
    out = _step(sched, alloc, 0)
    # FCFS: request 0 whole prompt (8), request 1 gets the 2 tokens left; 3rd waits (budget)
    assert [(s.req.request_id, n) for s, n in out.scheduled] == [(0, 8), (1, 2)]
    assert out.num_scheduled_tokens == 10
    out = _step(sched, alloc, 1)
    # running first: 0 decodes one token, 1 continues its prefill; max_num_seqs=2 keeps 2 out
    assert [(s.req.request_id, n) for s, n in out.scheduled] == [(0, 1), (1, 6)]
    assert [s.req.request_id for s in sched.waiting] == [2]


def test_long_prefill_threshold_only_when_others_wait():
    sched, alloc = _sched(num_blocks=64, long_prefill_token_threshold=4)
    sched.add_request(Request(0, 0.0, 12, 2), 0)
    out = _step(sched, alloc, 0)
    assert out.scheduled[0][1] == 12      # alone: nobody to starve, the whole budget
    sched.add_request(Request(1, 0.0, 12, 2), 1)
    out = _step(sched, alloc, 1)
    assert [n for _, n in out.scheduled] == [1, 4]


def test_preempts_last_admitted_and_readmits_with_own_prefix_hits():
    # 11 usable blocks of 4 tokens
    sched, alloc = _sched(num_blocks=12)
    a = sched.add_request(Request(0, 0.0, 16, 20), 0)   # 4 blocks, grows
    b = sched.add_request(Request(1, 0.0, 16, 20), 0)
    c = sched.add_request(Request(2, 0.0, 16, 20), 0)  # 4+4+4 > 11
    t = 0
    out = _step(sched, alloc, t)
    assert [s.req.request_id for s, _ in out.scheduled] == [0, 1]   # c does not fit (full prompt)
    victim_seen = None
    while victim_seen is None:
        t += 1
        out = _step(sched, alloc, t)
        if out.num_preempted:
            victim_seen = t
    # the victim is the LAST admitted running request, and nobody is admitted in that step
    assert b.status == PREEMPTED and a.status == RUNNING
    assert sched.waiting[0] is b and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert out.num_new == 0 and out.num_resumed == 0
    tokens_at_preemption = b.num_tokens
    # run until b comes back: it hits its own blocks (registered when it was preempted)
    while b.status != RUNNING:
        t += 1
        out = _step(sched, alloc, t)
    assert out.num_resumed == 1
    assert out.pc_preempted_queries == tokens_at_preemption
    # its head blocks survived (a's growth evicted its tail first: LRU, tail-first free)
    assert 0 < out.pc_preempted_hits < tokens_at_preemption and out.pc_preempted_hits % 4 == 0
    assert b.num_cached_tokens_total == out.pc_preempted_hits
    assert out.pc_queries == 16 * out.num_new          # re-admissions are counted apart (vLLM)
    assert c.status != RUNNING or c.first_sched_step > victim_seen


def test_full_prompt_admission_toggle_and_watermark():
    # 11 usable blocks of 4 tokens
    for full, admitted in ((True, [0]), (False, [0, 1])):
        sched, alloc = _sched(num_blocks=12, max_num_batched_tokens=8, full_prompt_admission=full)
        sched.add_request(Request(0, 0.0, 4, 8), 0)
        sched.add_request(Request(1, 0.0, 44, 8), 0)   # 11 blocks + 1 > 11 usable
        out = _step(sched, alloc, 0)
        assert [s.req.request_id for s, _ in out.scheduled] == admitted
    sched, alloc = _sched(num_blocks=20, watermark=0.5)   # 10 blocks kept free at admission
    sched.add_request(Request(0, 0.0, 4, 8), 0)
    out = _step(sched, alloc, 0)
    assert len(out.scheduled) == 1                        # nothing running: no watermark
    sched.add_request(Request(1, 0.0, 32, 8), 1)          # 8 blocks + 10 > 18 free
    out = _step(sched, alloc, 1)
    assert [s.req.request_id for s, _ in out.scheduled] == [0]


def test_prefix_hit_reduces_prefill_and_is_capped_below_prompt():
    sched, alloc = _sched(num_blocks=64)
    shared = ((7, 16),)
    sched.add_request(Request(0, 0.0, 16, 4, segments=shared, num_shareable_tokens=16), 0)
    _step(sched, alloc, 0)
    sched.add_request(Request(1, 0.0, 16, 4, segments=shared, num_shareable_tokens=16), 1)
    out = _step(sched, alloc, 1)
    # identical 16-token prompt: the last token is recomputed, so 3 of 4 blocks hit
    assert out.pc_queries == 16 and out.pc_hits == 12
    assert [n for s, n in out.scheduled if s.req.request_id == 1] == [4]


def test_plan_decode_run_matches_stepping():
    sched, alloc = _sched(num_blocks=14)
    for i in range(3):
        sched.add_request(Request(i, 0.0, 6, 30), 0)
    _step(sched, alloc, 0)
    _step(sched, alloc, 1)
    k = sched.plan_decode_run(1000)
    assert k >= 1
    free_before = alloc.num_free_blocks
    for t in range(2, 2 + k):
        out = _step(sched, alloc, t)
        assert out.num_decode_seqs == 3 and not out.num_preempted
    # the plan stops right before a step that would preempt or finish someone
    out = _step(sched, alloc, 2 + k)
    assert out.num_preempted or out.finished or alloc.num_free_blocks < free_before


def test_contiguous_growth_never_fails():
    from kvsim.allocator import ContiguousAllocator
    cfg = EngineConfig(allocator="oracle", capacity_tokens=64, block_size=4, max_model_len=64,
                       max_num_batched_tokens=64)
    alloc = ContiguousAllocator(64, policy="oracle", max_model_len=64)
    sched = Scheduler(cfg, alloc)
    for i in range(3):
        sched.add_request(Request(i, 0.0, 10, 20), 0)
    out = sched.schedule(0, 0)
    assert [s.req.request_id for s, _ in out.scheduled] == [0, 1]   # 30 + 30 <= 64 < 90
    sched.finish_step(out, 1, 0)
    t = 1
    while sched.running or sched.waiting:
        out = sched.schedule(t, t)
        assert not out.num_preempted and len(sched.running) <= 2
        sched.finish_step(out, t + 1, t)
        sched.sync_allocator()
        alloc.check_invariants()
        t += 1
        assert t < 100
    assert sched.num_generated_tokens == 60


@pytest.mark.parametrize("bad", [dict(block_size=0), dict(num_blocks=None),
                                 dict(watermark=1.5), dict(allocator="slab"),
                                 dict(max_model_len=1), dict(long_prefill_token_threshold=-1)])
def test_config_validation_messages(bad):
    kw = dict(num_blocks=10)
    kw.update(bad)
    with pytest.raises(ValueError):
        EngineConfig(**kw)


def _pool_state(sched, alloc):
    sched.sync_allocator()
    alloc.check_invariants()
    return {sid: list(alloc.block_table(sid)) for sid in alloc.seq_ids}, alloc.pool.free_queue()


@pytest.mark.parametrize("seed", range(6))
def test_decode_clock_decides_exactly_like_stepping_each_request(seed):
    """The decode clock is an optimisation: with it switched off every request is scheduled one
    by one. Both must schedule the same tokens, preempt and finish the same requests, and hand out
    the same blocks (ids included), step for step, through preemptions and prefix hits."""
    import random
    rng = random.Random(seed)
    reqs = []
    for i in range(40):
        prompt, output = rng.randint(1, 60), rng.randint(1, 40)
        shared = min(prompt, 8 * rng.randint(1, 4)) if rng.random() < 0.5 else 0
        segments = ((rng.randint(0, 3), shared), (1000 + i, prompt - shared))
        # a quarter share their outputs too (a conversation's next turn would): off the clock
        shareable = prompt + output if rng.random() < 0.25 else shared
        reqs.append(Request(i, 0.0, prompt, output, segments=tuple(s for s in segments if s[1]),
                            num_shareable_tokens=shareable))
    kw = dict(num_blocks=rng.choice([30, 60, 200]), max_num_batched_tokens=rng.choice([16, 64]),
              long_prefill_token_threshold=rng.choice([0, 8]))
    (clocked, a1), (each, a2) = _sched(**kw), _sched(**kw)
    each.clock.enabled = False
    arrivals = sorted(rng.sample(range(120), len(reqs)))
    engaged = 0
    t = 0
    while t < 2000 and (arrivals or clocked.running or clocked.waiting):
        while arrivals and arrivals[0] <= t:
            req = reqs[len(reqs) - len(arrivals)]
            arrivals.pop(0)
            clocked.add_request(req, t)
            each.add_request(req, t)
        engaged += clocked.clock.num_clocked
        o1, o2 = clocked.schedule(t, t), each.schedule(t, t)
        assert [(s.seq_id, n) for s, n in o1.scheduled] == [(s.seq_id, n) for s, n in o2.scheduled]
        assert (o1.num_scheduled_tokens, o1.num_decode_seqs, o1.kv_read_tokens, o1.num_preempted) \
            == (o2.num_scheduled_tokens, o2.num_decode_seqs, o2.kv_read_tokens, o2.num_preempted)
        f1, f2 = clocked.finish_step(o1, t + 1, t), each.finish_step(o2, t + 1, t)
        assert [s.seq_id for s in f1] == [s.seq_id for s in f2]
        # the clock tells a clocked request's true counters, as stepping it one by one does
        assert [clocked.clock.counters(s) for s in clocked.running] == \
            [(s.num_computed_tokens, s.num_output_tokens, s.num_tokens) for s in each.running]
        assert _pool_state(clocked, a1) == _pool_state(each, a2)
        t += 1
    assert not clocked.running and not clocked.waiting and t < 2000
    assert clocked.num_preemptions == each.num_preemptions
    assert engaged > 0 and each.clock.num_clocked == 0   # the clock did run in one and not the other


# ---------------------------------------------------------------------------- one admission rule
def _two_decoders_at_a_block_boundary(head_prompt_tokens, **kw):
    """Two requests decoding whose next token starts a block (both take one in the next step),
    then a waiting head of ``head_prompt_tokens``: 11 usable blocks of 4 tokens, 2 held."""
    sched, alloc = _sched(num_blocks=12, max_num_batched_tokens=64, **kw)
    for i in range(2):
        sched.add_request(Request(i, 0.0, 4, 30), 0)
    _step(sched, alloc, 0)                   # prefill 4 tokens each, first token sampled
    head = sched.add_request(Request(2, 0.0, head_prompt_tokens, 4), 1)
    return sched, alloc, head


@pytest.mark.parametrize("prompt, admitted", [(28, True), (29, False)])
def test_run_planning_counts_the_first_steps_blocks_like_admission(prompt, admitted):
    # 9 blocks free now, 7 after the next step's two decodes take theirs: a 29-token head (8
    # blocks) fits now but not when admission runs, after the running requests' allocations
    sched, alloc, head = _two_decoders_at_a_block_boundary(prompt)
    assert alloc.num_free_blocks == 9 and sched.clock.crossing_histogram()[1] == 2
    k = sched.plan_decode_run(1000)
    out = _step(sched, alloc, 1)
    assert (head.status == RUNNING) == admitted
    assert (out.num_new == 1) == admitted
    assert (k == 0) == admitted              # the run stops exactly where admission admits


def test_watermark_binds_run_planning_as_it_binds_admission():
    # a 20-token head (5 blocks) fits the 7 blocks left, but not with a 3-block watermark
    for watermark, admitted in ((0.0, True), (0.25, False)):
        sched, alloc, head = _two_decoders_at_a_block_boundary(20, watermark=watermark)
        k = sched.plan_decode_run(1000)
        _step(sched, alloc, 1)
        assert (head.status == RUNNING) == admitted and (k == 0) == admitted


def test_admission_and_run_planning_ask_the_same_rule():
    """Closing the one admission rule closes both: the planner then plans a run over a head that
    fits, and the step admits nobody (a planner with its own copy of the rule would not)."""
    sched, alloc, head = _two_decoders_at_a_block_boundary(8)
    assert sched.plan_decode_run(1000) == 0          # the head fits: no run
    sched._admission = lambda *args, **kw: WAIT
    assert sched.plan_decode_run(1000) > 0
    out = _step(sched, alloc, 1)
    assert out.num_new == 0 and head.status != RUNNING
    del sched._admission
    assert sched.plan_decode_run(1000) == 0
    out = _step(sched, alloc, 2)
    assert out.num_new == 1 and head.status == RUNNING


@pytest.mark.parametrize("seed", range(8))
def test_decode_runs_end_exactly_where_admission_would_admit(seed):
    """On random workloads (paged with hits, watermark, thresholds, full-prompt admission on and
    off; contiguous): whenever nothing but the waiting head could stop a decode run, the planner
    plans none exactly when the next step admits the head; and no step of a planned run admits
    anyone."""
    import random
    from collections import deque

    from kvsim.allocator import ContiguousAllocator
    rng = random.Random(seed)
    contiguous = seed % 4 == 3
    kw = dict(num_blocks=rng.choice([24, 40, 80]), max_num_batched_tokens=rng.choice([16, 64]),
              long_prefill_token_threshold=rng.choice([0, 8]),
              watermark=rng.choice([0.0, 0.1]), full_prompt_admission=rng.random() < 0.5,
              max_num_seqs=rng.choice([3, 8]))
    if contiguous:
        cfg = EngineConfig(allocator="oracle", capacity_tokens=200, block_size=4,
                           max_model_len=256, max_num_batched_tokens=kw["max_num_batched_tokens"],
                           max_num_seqs=kw["max_num_seqs"])
        alloc = ContiguousAllocator(200, policy="oracle", max_model_len=256)
        sched = Scheduler(cfg, alloc)
    else:
        sched, alloc = _sched(**kw)
    reqs = []
    for i in range(40):
        prompt, output = rng.randint(1, 50), rng.randint(2, 40)
        shared = min(prompt, 8 * rng.randint(1, 4)) if rng.random() < 0.5 else 0
        segments = ((rng.randint(0, 3), shared), (1000 + i, prompt - shared))
        reqs.append(Request(i, 0.0, prompt, output, segments=tuple(s for s in segments if s[1]),
                            num_shareable_tokens=shared))
    arrivals = sorted(rng.sample(range(150), len(reqs)))
    run_left = 0
    only_the_head = 0
    t = 0
    while t < 3000 and (arrivals or sched.running or sched.waiting):
        while arrivals and arrivals[0] <= t:
            sched.add_request(reqs[len(reqs) - len(arrivals)], t)
            arrivals.pop(0)
            run_left = 0          # the engine ends a run at an arrival
        k = sched.plan_decode_run(1000)
        waiting, sched.waiting = sched.waiting, deque()
        k_without_head = sched.plan_decode_run(1000)
        sched.waiting = waiting
        out = _step(sched, alloc, t)
        admitted = out.num_new + out.num_resumed > 0
        if k > 0:
            assert not admitted and not out.num_preempted
            run_left = max(run_left, k)
        if run_left > 0:
            assert not admitted, "a step inside a planned decode run admitted a request"
            run_left -= 1
        if waiting and k_without_head > 0:
            only_the_head += 1
            assert (k == 0) == admitted, "run planning and admission disagree about the head"
        t += 1
    assert not sched.running and not sched.waiting and t < 3000
    assert only_the_head > 0      # the head did decide some runs
