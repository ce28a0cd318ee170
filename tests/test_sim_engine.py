"""Simulator engine: conservation, determinism, batching identity, breakdown, routing, forks."""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from kvsim import workloads
from kvsim.allocator import MEMORY_CLASSES
from kvsim.simulator import EngineConfig, FixedStepCost, Simulation, simulate
from kvsim.simulator.cost import WrappedCost
from kvsim.simulator.result import SUMMARY_KEYS
from kvsim.workloads import Request

CONV = "sharegpt:rate=4,n=120,seed=3,system=256,system_frac=0.5,turns=uniform(1,4),think_s=5"


def _reqs(spec: str = CONV, n: int | None = None) -> list:
    return list(itertools.islice(workloads.load(spec), n))


def _cfg(**kw) -> EngineConfig:
    base = dict(num_blocks=900, block_size=16, null_block=True, max_num_seqs=32,
                max_num_batched_tokens=1024, max_model_len=4096)
    base.update(kw)
    return EngineConfig(**base)


def _final_output(r: Request, max_model_len: int) -> int:
    return min(r.output_tokens, max_model_len - r.prompt_tokens)


@pytest.mark.parametrize("allocator", ["paged", "max", "pow2", "oracle"])
def test_conservation_every_request_finishes_once(allocator):
    reqs = _reqs()
    kw = {} if allocator == "paged" else dict(num_blocks=None, capacity_tokens=20000,
                                              null_block=False, allocator=allocator)
    cfg = _cfg(**kw)
    res = simulate(iter(reqs), cfg, FixedStepCost(0.02))
    table = res.requests
    fits = [r for r in reqs if r.prompt_tokens + 1 <= cfg.max_model_len]
    assert res.summary["requests_arrived"] == len(reqs)
    assert table["request_id"].is_unique
    done = table[~table["rejected"]]
    assert sorted(done["request_id"]) == sorted(r.request_id for r in fits)
    want = {r.request_id: _final_output(r, cfg.max_model_len) for r in fits}
    assert dict(zip(done["request_id"], done["num_output"])) == want
    assert res.summary["generated_tokens"] == sum(want.values())
    assert (done["finish_s"] >= done["first_token_s"]).all()
    assert (done["first_token_s"] > done["arrival_s"]).all()
    assert res.summary["requests_unfinished"] == 0


def test_determinism_byte_identical():
    a = simulate(iter(_reqs()), _cfg(num_blocks=400), FixedStepCost(0.02), seed=7)
    b = simulate(iter(_reqs()), _cfg(num_blocks=400), FixedStepCost(0.02), seed=7)
    assert a.summary_json(include_wall_clock=False) == b.summary_json(include_wall_clock=False)
    assert a.timeseries.to_csv() == b.timeseries.to_csv()
    assert a.requests.to_csv() == b.requests.to_csv()
    assert a.summary["num_preemptions"] > 0   # the case exercises preemption
    # without the per-request table (replay without --requests): the same summary
    c = simulate(iter(_reqs()), _cfg(num_blocks=400), FixedStepCost(0.02), seed=7,
                 record_requests=False)
    assert c.summary_json(include_wall_clock=False) == a.summary_json(include_wall_clock=False)
    assert c.requests.empty and list(c.requests.columns) == list(a.requests.columns)


CASES = {
    "paged-pc-preempting": (dict(num_blocks=250), {}),
    "paged-no-pc": (dict(num_blocks=250, enable_prefix_caching=False), {}),
    "paged-threshold-watermark": (dict(num_blocks=300, long_prefill_token_threshold=128,
                                       watermark=0.02, full_prompt_admission=False), {}),
    "pow2-first-fit": (dict(allocator="pow2", placement="first-fit", num_blocks=None,
                            capacity_tokens=6000, null_block=False), {}),
    "two-replicas-least-loaded": (dict(num_blocks=200), dict(replicas=2, router="least-loaded")),
    "three-replicas-affinity": (dict(num_blocks=150), dict(replicas=3, router="prefix-affinity")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_batched_decode_runs_identical_to_single_steps(case):
    cfg_kw, sim_kw = CASES[case]
    cfg = _cfg(**cfg_kw)
    reqs = _reqs(CONV.replace("n=120", "n=50"))
    results = [simulate(iter(reqs), cfg, FixedStepCost(0.025), sample_interval_s=0.5,
                        snapshot_times_s=(3.0,), batch_decode_steps=b, **sim_kw)
               for b in (True, False)]
    fast, slow = results
    assert fast.summary_json(include_wall_clock=False) == slow.summary_json(include_wall_clock=False)
    pd.testing.assert_frame_equal(fast.timeseries, slow.timeseries)
    pd.testing.assert_frame_equal(fast.requests, slow.requests)
    # the pools too, block for block: a run takes blocks step by step, in running order
    assert len(fast.snapshots) == len(slow.snapshots) > 0
    for (t_a, rep_a, a), (t_b, rep_b, b) in zip(fast.snapshots, slow.snapshots):
        assert (t_a, rep_a) == (t_b, rep_b)
        for name in ("cell_class", "owner", "ref_cnt", "fill", "block_key"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
        assert a.seq_lens == b.seq_lens and a.block_tables.keys() == b.block_tables.keys()
        for seq_id, table in a.block_tables.items():
            np.testing.assert_array_equal(table, b.block_tables[seq_id])
        # the step that ran last, as batched runs and single steps both record it
        np.testing.assert_array_equal(a.step_seq_ids, b.step_seq_ids)
        np.testing.assert_array_equal(a.step_num_new_tokens, b.step_num_new_tokens)
    assert fast.summary["num_steps"] > 200
    if "paged" in case:
        assert fast.summary["num_preemptions"] > 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_batched_identical_with_a_growing_step_time(tmp_path, async_scheduling):
    """A cost model whose decode steps grow with the context (run lengths found by search); under
    async scheduling a run goes on one step past an arrival (the step after it sees it)."""
    table = tmp_path / "cost.csv"
    table.write_text("num_scheduled_tokens,kv_read_tokens,step_s\n"
                     "1,0,0.010\n1,20000,0.016\n1024,0,0.050\n1024,20000,0.056\n")
    from kvsim.simulator import TableCost
    cfg = _cfg(num_blocks=250, async_scheduling=async_scheduling)
    reqs = _reqs(CONV.replace("n=120", "n=40"))
    fast, slow = (simulate(iter(reqs), cfg, TableCost(str(table)), sample_interval_s=0.7,
                           batch_decode_steps=b) for b in (True, False))
    assert fast.summary_json(include_wall_clock=False) == slow.summary_json(include_wall_clock=False)
    pd.testing.assert_frame_equal(fast.requests, slow.requests)
    pd.testing.assert_frame_equal(fast.timeseries, slow.timeseries)
    tpot = fast.requests["tpot_s"].dropna()
    assert tpot.min() > 0.010 and tpot.max() < 0.1


def test_batched_step_rows_identical_on_step_clock():
    reqs = _reqs("sharegpt:rate=0.3,n=60,seed=1")
    for r in reqs:
        r.arrival_step = int(r.arrival_s)
    cfg = _cfg(num_blocks=300)
    fast, slow = (simulate(iter(reqs), cfg, FixedStepCost(1.0), record_steps=True,
                           batch_decode_steps=b) for b in (True, False))
    pd.testing.assert_frame_equal(fast.timeseries, slow.timeseries)
    pd.testing.assert_frame_equal(fast.requests, slow.requests)
    ts = fast.timeseries
    assert (ts["sched_tokens"] <= cfg.max_num_batched_tokens).all()
    assert (ts["running"] <= cfg.max_num_seqs).all()
    assert ts["step"].is_monotonic_increasing and ts["step"].is_unique
    assert ts["cum_preemptions"].iloc[-1] == fast.summary["num_preemptions"] > 0


def test_breakdown_fractions_and_samples_sum_to_pool():
    cfg = _cfg(num_blocks=400)
    res = simulate(iter(_reqs()), cfg, FixedStepCost(0.02), sample_interval_s=0.25)
    fractions = res.summary["memory_breakdown"]
    assert list(fractions) == list(MEMORY_CLASSES)
    assert sum(fractions.values()) == pytest.approx(1.0, abs=1e-6)
    assert fractions["token_states"] > 0.3 and fractions["cached"] > 0
    ts = res.timeseries
    slots = ts[list(MEMORY_CLASSES)].sum(axis=1)
    assert (slots == cfg.num_blocks * cfg.block_size).all()
    assert np.all(np.diff(ts["time_s"]) > 0)
    assert list(res.summary) == list(SUMMARY_KEYS)


def test_contiguous_max_admits_by_reservation_only():
    """Orca-style: with room for exactly two max_model_len reservations, two requests run at
    once, nobody is preempted; the oracle policy (exact final length) packs more."""
    reqs = [Request(i, 0.0, 100, 50) for i in range(8)]
    common = dict(num_blocks=None, null_block=False, capacity_tokens=2048, max_model_len=1024)
    res_max = simulate(iter(reqs), _cfg(allocator="max", **common), FixedStepCost(0.01))
    res_oracle = simulate(iter(reqs), _cfg(allocator="oracle", **common), FixedStepCost(0.01))
    assert res_max.summary["max_running"] == 2
    assert res_max.summary["num_preemptions"] == res_oracle.summary["num_preemptions"] == 0
    assert res_oracle.summary["max_running"] == 8
    assert res_max.summary["memory_breakdown"]["internal_fragmentation"] > 0.5
    assert res_max.summary["requests_finished"] == res_oracle.summary["requests_finished"] == 8


def test_parallel_sampling_forks_share_prompt_blocks():
    reqs = [Request(i, 0.1 * i, 300, 40, n=3) for i in range(6)]
    cfg = _cfg(num_blocks=600)
    sim = Simulation(iter(reqs), cfg, FixedStepCost(0.01), sample_interval_s=0.05)
    t = 0.0
    while not sim.done:
        t += 0.013
        sim.run_until(t)
        for rep in sim.replicas:
            rep.sched.sync_allocator()
            rep.allocator.check_invariants()
    res = sim.result()
    assert res.summary["generated_tokens"] == 6 * 3 * 40
    assert len(res.requests) == 6 and res.summary["requests_finished"] == 6   # once each
    assert (res.requests["num_samples"] == 3).all()
    assert (res.requests["num_output"] == 40).all()
    assert res.summary["blocks_saved_by_sharing_max"] >= 2 * (300 // 16)


def test_beam_search_reselects_at_block_boundaries():
    reqs = [Request(i, 0.0, 64, 100, beam_width=4) for i in range(2)]
    cfg = _cfg(num_blocks=300)
    sim = Simulation(iter(reqs), cfg, FixedStepCost(0.01))
    freed = []
    orig_free = sim.replicas[0].allocator.free

    def spy(seq_id, preempted=False):
        freed.append(seq_id)
        orig_free(seq_id, preempted=preempted)

    sim.replicas[0].allocator.free = spy
    while not sim.done:
        sim.run_until(sim.now_s + 0.05)
        sim.replicas[0].sched.sync_allocator()
        sim.replicas[0].allocator.check_invariants()
    res = sim.result()
    assert res.summary["generated_tokens"] == 2 * 4 * 100
    assert sorted(res.requests["request_id"]) == [0, 1]
    # beams dropped at reselections free their sequences before the requests finish
    assert len(freed) > 2 * 4
    # same seed, same beams; another seed, other reselections
    again = simulate(iter(reqs), cfg, FixedStepCost(0.01))
    assert again.summary_json(include_wall_clock=False) == res.summary_json(include_wall_clock=False)


def test_rejects_requests_that_can_never_fit():
    reqs = [Request(0, 0.0, 5000, 10), Request(1, 0.0, 100, 10), Request(2, 0.0, 2000, 100)]
    cfg = _cfg(num_blocks=100, max_model_len=4096)  # 99 usable blocks = 1584 tokens
    res = simulate(iter(reqs), cfg, FixedStepCost(0.01))
    rejected = set(res.requests.loc[res.requests["rejected"], "request_id"])
    assert rejected == {0, 2}
    assert res.summary["requests_rejected"] == 2 and res.summary["requests_finished"] == 1


def test_unsorted_arrivals_are_an_error():
    reqs = [Request(0, 1.0, 10, 10), Request(1, 0.5, 10, 10)]
    with pytest.raises(ValueError, match="sort the trace"):
        simulate(iter(reqs), _cfg(), FixedStepCost(0.01))


def test_stepping_api_matches_full_run():
    reqs = _reqs(n=40)
    cfg = _cfg(num_blocks=300)
    sim = Simulation(iter(reqs), cfg, FixedStepCost(0.02), snapshot_times_s=(2.0,))
    sim.run_until(2.5)
    state = sim.state()
    assert state["time_s"] == pytest.approx(2.5)
    assert sum(state["breakdown"].values()) == cfg.num_blocks * cfg.block_size
    snap = sim.snapshot()
    assert snap.num_cells == cfg.num_blocks
    assert set(snap.block_tables) == {s.seq_id for s in sim.replicas[0].sched.running}
    while not sim.done:
        sim.run_until(sim.now_s + 5)
    stepped = sim.result()
    full = simulate(iter(reqs), cfg, FixedStepCost(0.02), snapshot_times_s=(2.0,))
    pd.testing.assert_frame_equal(stepped.requests, full.requests)
    assert len(stepped.snapshots) == len(full.snapshots) == 1
    assert stepped.snapshots[0][0] == 2.0
    np.testing.assert_array_equal(stepped.snapshots[0][2].owner, full.snapshots[0][2].owner)


def test_prefix_affinity_keeps_a_group_on_one_replica():
    group = ((11, 64),)
    reqs = [Request(i, 0.01 * i, 96, 8, segments=group + ((1000 + i, 32),), num_shareable_tokens=64)
            if i % 2 == 0 else Request(i, 0.01 * i, 96, 8) for i in range(40)]
    res = simulate(iter(reqs), _cfg(num_blocks=400), FixedStepCost(0.01), replicas=4,
                   router="prefix-affinity")
    table = res.requests.set_index("request_id")
    grouped = table.loc[[i for i in range(40) if i % 2 == 0], "replica"]
    assert grouped.nunique() == 1                        # one replica serves the whole group
    assert table.loc[[i for i in range(40) if i % 2], "replica"].nunique() == 4  # others spread
    spread = simulate(iter(reqs), _cfg(num_blocks=400), FixedStepCost(0.01), replicas=4,
                      router="round-robin")
    # one cold miss for the group (19 of 20 hit 64 tokens); round-robin spreads it and misses more
    assert res.summary["prefix_hit_tokens"] == 19 * 64
    assert spread.summary["prefix_hit_tokens"] < 19 * 64


def test_snapshots_record_the_last_steps_batch():
    """A snapshot carries the batch of the step that ended just before it (kvsim validate --step
    runs it through the kernels): the sequences still in the pool, in vLLM's batch order, with the
    tokens each computed; a step that admits an arrival mixes its prefill with the decodes."""
    reqs = _reqs(CONV.replace("n=120", "n=40"))
    step_s = 0.025
    times = [r.arrival_s + (j + 0.5) * step_s for r in reqs[5:25:4] for j in range(3)]
    res = simulate(iter(reqs), _cfg(), FixedStepCost(step_s), snapshot_times_s=times)
    mixed = 0
    for _, _, snap in res.snapshots:
        ids, new = snap.step_seq_ids, snap.step_num_new_tokens
        assert ids is not None and len(ids) == len(new) == len(set(ids.tolist()))
        for seq_id, n in zip(ids.tolist(), new.tolist()):
            assert seq_id in snap.block_tables and 1 <= n <= snap.seq_lens[seq_id]
        # running order: the earlier admitted first, so a prefill (new > 1) comes after decodes
        # of requests admitted before it, and the step's tokens fit the step budget
        assert new.sum() <= _cfg().max_num_batched_tokens
        mixed += int(new.max(initial=0) > 1 and (new == 1).any())
    assert mixed >= 3, "steps that admit an arrival should mix prefill and decode rows"


class _IdleStartCost(FixedStepCost):
    """10 ms steps, c_idle 50 ms, a way in and out of 1 ms each (a measured table's terms)."""

    def __init__(self, min_wait_s: float):
        super().__init__(0.01)
        self.idle_start_s, self.idle_start_min_wait_s = 0.05, min_wait_s
        self.frontend_s = (0.001, 0.0, 0.001)


def test_an_idle_start_costs_c_idle_only_after_the_tables_idle_wait():
    # a C = 1 loop: each request is sent when the client saw the last one finish (2 ms of way out
    # and in: the engine idle 2 ms); then one more request after 1 s. A table without an
    # '# idle wait:' line adds c_idle after any wait, one with 10 ms only after the long one.
    reqs = [Request(request_id=i, arrival_s=0.0, prompt_tokens=64, output_tokens=4) for i in range(5)]
    late = Request(request_id=9, arrival_s=1.0, prompt_tokens=64, output_tokens=4)

    def ttfts(min_wait_s, requests, limit):
        res = simulate(iter(requests), _cfg(), _IdleStartCost(min_wait_s), max_concurrency=limit)
        return res.requests.set_index("request_id")["ttft_s"]
    any_wait, hot = ttfts(0.0, reqs, 1), ttfts(0.010, reqs, 1)
    assert hot[0] == pytest.approx(any_wait[0]) and hot[0] > 0.05             # the first: idle
    assert all(any_wait[i] - hot[i] == pytest.approx(0.05, abs=1e-6) for i in range(1, 5))
    assert ttfts(0.010, [late], None)[9] == pytest.approx(ttfts(0.0, [late], None)[9])


def _burst_cost(*spans_s: tuple[float, float], graph_tokens: int = 512) -> WrappedCost:
    """10 ms steps, with a measured table's first step: sends 0.4 ms then 0.2 ms apart, the cutoff
    drawn from ``spans_s``, CUDA graphs to ``graph_tokens`` tokens."""
    from kvsim.simulator.cost_table import FirstStep

    cost = WrappedCost(FixedStepCost(0.01))
    cost.first_step = FirstStep(0.0004, 0.0002, spans_s, graph_tokens)
    return cost


def test_a_burst_at_an_idle_engine_is_split_as_the_tables_first_step_says():
    """vLLM's engine core schedules what has reached it when the first request of a burst wakes
    it: the first step takes the requests sent within the drawn cutoff and the next step the rest.
    Under async scheduling the first step's tokens come back with the next step's when that one
    runs on no CUDA graph (more tokens than the largest graph), with its own when it runs on one."""
    burst = [Request(request_id=i, arrival_s=0.0, prompt_tokens=256, output_tokens=4) for i in range(4)]

    def run(cost, async_scheduling=True):
        res = simulate(iter(burst), _cfg(async_scheduling=async_scheduling), cost, record_steps=True)
        return res.requests.set_index("request_id"), res.timeseries

    whole, steps = run(FixedStepCost(0.01))
    assert steps["new_reqs"].iloc[0] == 4 and whole["first_token_step"].nunique() == 1
    # a cutoff 0.5 ms after the first send: the sends at 0 and 0.4 ms make the first step
    eager, steps = run(_burst_cost((0.0005, 0.0005), graph_tokens=513))   # next: 512 + 2 tokens, eager
    assert steps["new_reqs"].iloc[0] == 2 and steps["new_reqs"].iloc[1] == 2
    assert eager.loc[0, "first_token_step"] == 0 and eager.loc[2, "first_token_step"] == 1
    assert eager.loc[0, "ttft_s"] == pytest.approx(eager.loc[2, "ttft_s"])        # with the next step's
    assert eager.loc[2, "ttft_s"] == pytest.approx(whole.loc[0, "ttft_s"] + 0.01)
    graph, _ = run(_burst_cost((0.0005, 0.0005), graph_tokens=514))     # the next step on a graph
    assert graph.loc[0, "ttft_s"] == pytest.approx(whole.loc[0, "ttft_s"])
    assert graph.loc[2, "ttft_s"] == pytest.approx(whole.loc[0, "ttft_s"] + 0.01)
    # a cutoff past every send: whole; async scheduling off: no split (and no table says how)
    assert run(_burst_cost((0.01, 0.01)))[1]["new_reqs"].iloc[0] == 4
    assert run(_burst_cost((0.0005, 0.0005)), async_scheduling=False)[1]["new_reqs"].iloc[0] == 4


def test_the_first_steps_draw_is_the_replicas_own_and_seeded():
    cost = _burst_cost((0.0, 0.0003), (0.0004, 0.0009), (0.0, 0.002))
    reqs = [Request(request_id=i, arrival_s=0.5 * (i // 8), prompt_tokens=64, output_tokens=2) for i in range(64)]

    def first_tokens(seed):
        res = simulate(iter(reqs), _cfg(async_scheduling=True), cost, seed=seed)
        return res.requests["first_token_step"].tolist()
    assert first_tokens(3) == first_tokens(3)
    assert len({tuple(first_tokens(s)) for s in range(6)}) > 1      # the draw moves with the seed


def test_a_split_bursts_rest_is_not_held_when_its_first_share_never_ran():
    """The rest of a split burst waits for the schedule after the first step; where the first
    share left the engine without a step (the head rejected), the rest are taken at once."""
    from kvsim.simulator.batch_hooks import LookaheadQueue
    from kvsim.simulator.cost_table import FirstStep

    class Sched:
        def __init__(self):
            self.added, self.unfinished = [], False

        def add_request(self, req, sent_ns):
            self.added.append(req)
            self.unfinished = True

        def has_unfinished(self):
            return self.unfinished

    sched = Sched()
    hooks = LookaheadQueue(sched, rec=None, first_step=FirstStep(0.0004, 0.0002, ((0.0001, 0.0001),), 512))
    for i in range(3):
        hooks.arrive(i, 0, 0)
    hooks.take_arrivals(0, at_once=True)
    assert sched.added == [0] and hooks.split == "first"
    hooks.take_arrivals(0, at_once=False)
    assert sched.added == [0]                      # held while the first share is in the engine
    sched.unfinished = False                       # ... which left without a step
    hooks.take_arrivals(5, at_once=True)
    assert sched.added[:2] == [0, 1] and hooks.inbox is not None


def test_a_split_bursts_held_first_tokens_come_out_with_their_second_in_the_token_log():
    """The token stream a benchmark client sees (simulator.token_log): a split burst's first share
    gets its first tokens with the next (eager) step's, and its second tokens, sampled by that
    step, at the same moment: gaps of 0, not that step's duration; with the next step on a CUDA
    graph every token stays where it was sampled."""
    burst = [Request(request_id=i, arrival_s=0.0, prompt_tokens=256, output_tokens=4) for i in range(4)]

    def log(graph_tokens):
        res = simulate(iter(burst), _cfg(async_scheduling=True), _burst_cost((0.0005, 0.0005), graph_tokens=graph_tokens),
                       record_token_times=True)
        t = res.token_times
        return res.requests.set_index("request_id"), {k: t[k].tolist() for k in t}

    reqs, t = log(513)                         # the next step (512 + 2 tokens) eager: held
    assert sum(t["num_tokens"]) == 16 and sum(t["num_gap_tokens"]) == 12
    first_end = int(round(reqs.loc[0, "first_token_s"] * 1e9))
    assert reqs.loc[0, "first_token_s"] == reqs.loc[2, "first_token_s"]
    at_first_step = [n for end, n in zip(t["end_ns"], t["num_tokens"]) if end < first_end]
    assert sum(at_first_step) == 0                       # nothing comes out at the first step's end
    zero_gaps = [g for d, g in zip(t["duration_ns"], t["num_gap_tokens"]) if d == 0]
    assert zero_gaps == [2]                              # the first share's second tokens
    reqs, t = log(514)                         # on a graph: no row of duration 0
    assert sum(t["num_tokens"]) == 16 and 0 not in t["duration_ns"]
