"""Offload tiers: the connector alone (lookups, loads, stores, disk promotion, timing, flushes),
then in the simulator."""
from dataclasses import replace

import pytest

from kvsim import workloads
from kvsim.allocator import PagedAllocator
from kvsim.allocator.offload import HIT, MISS, PENDING
from kvsim.planner.presets import get_gpu, get_model
from kvsim.planner.roofline import RooflineCost
from kvsim.simulator import EngineConfig, FixedStepCost, simulate
from kvsim.simulator.engine import Simulation
from kvsim.simulator.offload import NS_PER_S, OffloadConnector, TierConfig
from kvsim.simulator.recorder import SAMPLE_COLUMNS
from kvsim.simulator.scheduler import Scheduler
from kvsim.workloads import Request

MS = NS_PER_S // 1000
B = 4
CHUNK = 1_000_000                      # bytes per chunk: 1 ms at 1 GB/s


def connector(cpu_chunks=8, disk_chunks=None):
    tiers = [TierConfig("cpu", cpu_chunks, CHUNK, 1e9)]
    if disk_chunks:
        tiers.append(TierConfig("disk", disk_chunks, CHUNK, 0.5e9, latency_s=0.003))
    return OffloadConnector(tiers, B)


def run_step(conn, start_ms, forward_ms=10):
    """One engine step: flush/poll/submit at its start, completions applied at its end."""
    stall = conn.step(start_ms * MS, forward_ms * MS)
    end = start_ms * MS + stall + forward_ms * MS
    conn.apply(end)
    return stall, end


KEYS = [11, 12, 13, 14, 15]


def test_a_prompt_is_written_through_and_readable_two_steps_later():
    conn = connector()
    conn.offer("a", KEYS, num_prompt_tokens=18, num_computed_tokens=18, block_table=[1, 2, 3, 4])
    assert [conn.cpu.lookup(k) for k in KEYS] == [PENDING] * 4 + [MISS]
    run_step(conn, 0)          # step 0: stores queued (vLLM submits them in the next step)
    assert conn.next_event_ns is None
    run_step(conn, 10)         # step 1: submitted, start when its forward ends (20 ms), 4 ms
    assert conn.next_event_ns == 24 * MS
    run_step(conn, 20)         # step 2 polls at 20 ms: not done yet
    assert conn.cpu.lookup(11) == PENDING
    assert conn.lookup("b", KEYS, 20, 0) is None          # a pending chunk defers the request
    run_step(conn, 30)         # step 3 polls at 30 ms: found, applied at its end
    assert [conn.cpu.lookup(k) for k in KEYS[:4]] == [HIT] * 4
    assert conn.stats.stored_bytes["cpu"] == 4 * CHUNK and conn.stats.num_deferred == 1


def test_lookup_counts_whole_chunks_after_the_gpu_hit_up_to_num_tokens():
    conn = connector()
    conn.offer("a", KEYS, 20, 20, [1, 2, 3, 4, 5])
    for t in (0, 10, 20, 30):
        run_step(conn, t)
    assert conn.lookup("b", KEYS, num_tokens=20, num_gpu_hit_tokens=4) == 16   # not -1
    assert conn.lookup("c", KEYS, num_tokens=19, num_gpu_hit_tokens=4) == 12   # whole chunks
    assert conn.lookup("d", [11, 12, 99], num_tokens=12, num_gpu_hit_tokens=0) == 8
    assert conn.lookup("e", KEYS, num_tokens=20, num_gpu_hit_tokens=20) == 0
    assert conn.lookup("f", KEYS, 20, 0, peek=True) == 20 and conn.stats.lookups == 4


def test_a_load_starts_after_the_forward_and_the_request_runs_after_the_poll():
    conn = connector()
    conn.offer("a", KEYS, 20, 20, [1, 2, 3, 4, 5])
    for t in (0, 10, 20, 30):
        run_step(conn, t)
    conn.request_finished("a")
    assert conn.lookup("b", KEYS, 20, 4) == 16
    conn.start_load("b", KEYS, 4, 16, 20)
    assert conn.lookup("c", KEYS, 20, 0) is None          # b is loading these chunks
    assert conn.is_loading("b") and not conn.load_done("b")
    run_step(conn, 40)         # forward ends at 50 ms: 4 chunks, done at 54 ms
    assert conn.next_event_ns == 54 * MS
    run_step(conn, 50)         # polled at 50 ms: not yet
    assert not conn.load_done("b")
    run_step(conn, 60)
    assert conn.load_done("b") and not conn.is_loading("b")
    assert conn.stats.hit_tokens["cpu"] == 16 and conn.stats.loaded_bytes["cpu"] == 4 * CHUNK
    assert conn.stats.query_tokens == 16 and conn.cpu.num_evictable == 5


def test_a_chunk_evicted_from_cpu_comes_back_from_disk():
    conn = connector(cpu_chunks=2, disk_chunks=16)
    conn.offer("a", [1, 2], 8, 8, [1, 2])
    for t in (0, 10, 20, 30):
        run_step(conn, t)
    conn.request_finished("a")
    assert conn.disk.lookup(1) == PENDING      # cascaded to disk when the CPU store completed
    assert conn.next_event_ns == 47 * MS       # at once: 3 ms latency + 2 chunks of 2 ms
    run_step(conn, 40)
    run_step(conn, 50)
    assert conn.disk.lookup(1) == HIT and conn.stats.stored_bytes["disk"] == 2 * CHUNK
    conn.offer("x", [7, 8], 8, 8, [5, 6])      # evicts 1 and 2 from the CPU tier
    for t in (60, 70, 80, 90):
        run_step(conn, t)
    conn.request_finished("x")
    assert conn.cpu.lookup(1) == MISS
    # 7 and 8 are pinned while they are copied on to disk (until 107 ms): no room to promote
    assert conn.lookup("b", [1, 2, 3], 12, 0) == 0
    run_step(conn, 100)
    run_step(conn, 110)
    assert conn.lookup("b", [1, 2, 3], 12, 0) is None      # promotion started: deferred
    assert conn.cpu.lookup(1) == PENDING and conn.cpu.lookup(2) == PENDING
    run_step(conn, 120)        # one read for both, now: 3 ms latency + 2 chunks of 2 ms
    assert conn.next_event_ns == 127 * MS
    run_step(conn, 130)
    assert conn.lookup("b", [1, 2, 3], 12, 0) == 8
    assert conn.stats.hit_tokens["disk"] == 8 and conn.stats.loaded_bytes["disk"] == 2 * CHUNK


def test_preempting_a_request_with_pending_stores_stalls_the_next_step():
    conn = connector()
    conn.offer("a", KEYS, 20, 20, [1, 2, 3, 4, 5])
    conn.preempted("a")
    stall, _ = run_step(conn, 0)               # flushed: submitted now, 5 ms, the step waits
    assert stall == 5 * MS and conn.stats.flush_stall_ns == 5 * MS
    assert conn.cpu.lookup(11) == HIT


def test_reused_blocks_of_a_finished_request_flush_its_store():
    conn = connector()
    conn.offer("a", KEYS[:2], 8, 8, [6, 7])
    conn.request_finished("a")
    conn.check_reused_blocks([3, 4])           # other blocks handed out: no flush
    assert run_step(conn, 0)[0] == 0
    conn.check_reused_blocks([2, 7])           # block 7 handed out again (a hit counts too)
    stall, _ = run_step(conn, 10)              # submitted at once, and the forward waits
    assert stall == 2 * MS and conn.stats.stored_bytes["cpu"] == 2 * CHUNK
    assert not conn.busy


def test_a_refused_offer_is_offered_again():
    conn = connector(cpu_chunks=2)
    conn.offer("a", [1, 2], 8, 8, [1, 2])      # pending: not evictable
    conn.offer("b", [3], 4, 4, [3])
    assert conn.stats.num_failed_offers == 1 and conn.cpu.lookup(3) == MISS
    assert conn.retry == {"b"}                 # the scheduler offers it in every step
    for t in (0, 10, 20, 30):
        run_step(conn, t)
    conn.offer("b", [3], 4, 4, [3])            # the same chunk again: now 1 or 2 can go
    assert conn.cpu.lookup(3) == PENDING and not conn.retry


def test_idle_submits_what_waits_and_says_when_to_wake():
    conn = connector()
    conn.offer("a", KEYS, 20, 20, [1, 2, 3, 4, 5])
    assert conn.idle_until(100 * MS) == 105 * MS
    conn.poll(105 * MS)
    assert conn.cpu.lookup(15) == HIT and not conn.busy


def test_tier_configs_are_checked():
    with pytest.raises(ValueError):
        TierConfig("cpu", 0, CHUNK, 1e9)
    with pytest.raises(ValueError, match="cpu, optionally"):
        OffloadConnector([TierConfig("disk", 4, CHUNK, 1e9)], B)


# ---- in the simulator ------------------------------------------------------------------------
ROOFLINE = RooflineCost(get_model("Llama-3.1-8B"), get_gpu("H100-80GB-SXM"))
CONVERSATIONS = "sharegpt:rate=4,n=160,seed=1,system=512,system_frac=0.8,turns=uniform(1,5),think_s=10"
CPU = TierConfig("cpu", 800, 2 << 20, 25e9)
DISK = TierConfig("disk", 8000, 2 << 20, 3e9, 1e-4)


def _config(num_blocks=600, **kw):
    base = dict(allocator="paged", block_size=16, num_blocks=num_blocks, null_block=True,
                max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=8192)
    base.update(kw)
    return EngineConfig(**base)


def _run(requests, config, cost=ROOFLINE, **kw):
    sim = Simulation(requests, config, cost, **kw)
    result = sim.run()
    for rep in sim.replicas:
        rep.allocator.check_invariants()
        if rep.offload is not None:
            rep.offload.cpu.check_invariants()
            assert not rep.sched.holding and not rep.offload._being_loaded
    return result


def test_without_tiers_the_engine_is_unchanged():
    sim = Simulation(workloads.load(CONVERSATIONS), _config(), ROOFLINE)
    res = sim.run()
    assert type(sim.replicas[0].sched) is Scheduler and "offload" not in res.summary
    assert tuple(res.timeseries.columns) == tuple(n for n, _ in SAMPLE_COLUMNS)


@pytest.mark.parametrize("tiers", [(CPU,), (TierConfig("cpu", 300, 2 << 20, 25e9), DISK)])
def test_decode_runs_give_the_same_results_as_stepping_one_by_one(tiers):
    out = []
    for batch in (True, False):
        res = _run(workloads.load(CONVERSATIONS), _config(), offload=tiers,
                   batch_decode_steps=batch, sample_interval_s=2)
        summary = dict(res.summary)
        summary.pop("wall_clock_s")
        out.append((summary, res.timeseries, res.requests))
    assert out[0][0] == out[1][0]
    assert out[0][1].equals(out[1][1]) and out[0][2].equals(out[1][2])
    assert out[0][0]["offload"]["hit_tokens"]["cpu"] > 0 and out[0][0]["num_preemptions"] > 0
    if len(tiers) == 2:
        assert out[0][0]["offload"]["hit_tokens"]["disk"] > 0


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def test_unique_prompts_gain_nothing_and_lose_nothing():
    # nothing is reused, nothing is preempted: the tier only stores; every figure but the
    # offload block equals the run without it: counts exactly, times to the nanosecond (the
    # connector's transfer completions cut decode runs, whose steps are then priced one by
    # one in whole nanoseconds), time-weighted means to 0.1 % (a cut run is integrated as two
    # trapezoids)
    spec = "sharegpt:rate=2,n=120,seed=3"
    base = _run(workloads.load(spec), _config(4000)).summary
    off = _run(workloads.load(spec), _config(4000), offload=(CPU,)).summary
    assert off["offload"]["hit_tokens"]["cpu"] == 0 and off["offload"]["stored_bytes"]["cpu"] > 0
    assert off["offload"]["flush_stall_s"] == 0
    flat0, flat1 = _flat(base), _flat({k: v for k, v in off.items() if k != "offload"})
    assert flat0.keys() == flat1.keys()
    for key, value in flat0.items():
        if key == "wall_clock_s":
            continue
        if isinstance(value, int) or not isinstance(value, float):
            assert flat1[key] == value, key
        elif key.startswith(("memory_breakdown", "mean_")):
            assert flat1[key] == pytest.approx(value, rel=1e-3, abs=1e-5), key
        else:
            assert flat1[key] == pytest.approx(value, rel=1e-9, abs=1e-8), key


def _reference_hits(reqs, block_size, num_blocks):
    """One request at a time with a CPU tier that never evicts: the GPU prefix hit, then the
    prompt chunks any earlier request stored, up to the whole prompt (vLLM's connector rule)."""
    alloc = PagedAllocator(num_blocks, block_size, enable_prefix_caching=True, null_block=True)
    stored, gpu, cpu = set(), 0, 0
    for req in reqs:
        B, P = block_size, req.prompt_tokens
        keys = req.block_keys(B)
        h = alloc.lookup(keys, P) // B
        i = h
        while i < P // B and keys[i] in stored:
            i += 1
        if i > h:
            assert alloc.allocate(req.request_id, i * B, keys, delay_cache_blocks=True)
            alloc.cache_blocks(req.request_id)
            assert alloc.append(req.request_id, P - i * B)
        else:
            assert alloc.allocate(req.request_id, P, keys)
        assert alloc.append(req.request_id, P + req.output_tokens - 1 - P)
        alloc.free(req.request_id)
        stored.update(keys[:P // B])
        gpu += h * B
        cpu += (i - h) * B
    return gpu, cpu


def test_one_request_at_a_time_the_tiers_hit_what_a_direct_model_hits():
    reqs = [replace(r, arrival_s=100.0 * i) for i, r in
            enumerate(workloads.load(CONVERSATIONS, max_requests=80))]
    tier = TierConfig("cpu", 100_000, 2 << 20, 25e9)
    res = _run(iter(reqs), _config(700, max_num_batched_tokens=8192), offload=(tier,))
    gpu, cpu = _reference_hits(reqs, 16, 700)
    assert cpu > 0 and gpu > 0
    assert res.summary["prefix_hit_tokens"] == gpu
    assert res.summary["offload"]["hit_tokens"]["cpu"] == cpu
    assert res.summary["offload"]["num_failed_offers"] == 0


def test_cpu_hits_replace_recomputation_and_cut_ttft():
    # a 4096-token document asked about again after unrelated long prompts pushed it out of a
    # small GPU pool; the CPU tier still has it
    reqs, t = [], 0.0
    for i in range(24):
        if i % 2:
            segments, shareable = ((7, 4096), (100 + i, 64)), 4160
        else:
            segments, shareable = ((1000 + i, 6000),), 0
        prompt = sum(n for _, n in segments)
        reqs.append(Request(i, t, prompt, 32, segments=segments, num_shareable_tokens=shareable))
        t += 5.0
    cfg = _config(450, max_num_batched_tokens=8192)     # the document or a long prompt
    base = _run(iter(reqs), cfg)
    off = _run(iter(reqs), cfg, offload=(TierConfig("cpu", 2000, 2 << 20, 25e9),))
    s0, s1 = base.summary, off.summary
    cpu_hits = s1["offload"]["hit_tokens"]["cpu"]
    assert cpu_hits >= 10 * 2900      # the GPU keeps the document's head, the CPU the rest
    assert s0["computed_prompt_tokens"] - s1["computed_prompt_tokens"] >= 0.9 * cpu_hits
    ask = [r for r in range(24) if r % 2 and r > 1]
    t0 = base.requests.set_index("request_id").loc[ask, "ttft_s"]
    t1 = off.requests.set_index("request_id").loc[ask, "ttft_s"]
    assert (t1 < t0).all()
    # the load is not free: at least the steps it spans, and 4096 tokens at 25 GB/s (21 ms)
    assert (t1 > 4096 * 131072 / 25e9).all()


def test_same_seed_same_output_with_tiers_and_a_step_clock():
    a = _run(workloads.load(CONVERSATIONS), _config(), FixedStepCost(0.02), offload=(CPU, DISK))
    b = _run(workloads.load(CONVERSATIONS), _config(), FixedStepCost(0.02), offload=(CPU, DISK))
    # the wall clock is the one figure that may differ
    assert a.summary_json(include_wall_clock=False) == b.summary_json(include_wall_clock=False)
    assert a.timeseries.equals(b.timeseries)


def test_tiers_need_prefix_caching():
    with pytest.raises(ValueError, match="prefix caching"):
        simulate(iter(()), _config(enable_prefix_caching=False), ROOFLINE, offload=(CPU,))


@pytest.mark.parametrize("stamp", ["sched_seq", "sampled_seq", "inflight_seq"])
def test_async_tier_never_preempts_a_request_of_the_step_in_flight(stamp):
    # vLLM's defer_block_free: a request scheduled in the step in flight (computed, sampled, or
    # finished on the decode clock in it: each leaves one of the three stamps) would have its
    # blocks freed only once that step is processed, so it is not a victim
    from kvsim.simulator.engine import make_allocator
    from kvsim.simulator.offload_scheduler import AsyncOffloadScheduler
    from kvsim.simulator.seq_state import SeqState
    config = _config(async_scheduling=True)
    sched = AsyncOffloadScheduler(config, make_allocator(config), connector=connector())
    seq = SeqState(seq_id=0, req=None, num_prompt_tokens=8, max_output_tokens=4, arrival_ns=0)
    sched.num_sched_steps, sched.batch_in_flight = 5, True
    assert sched._frees_now(seq)                 # not scheduled in step 4
    setattr(seq, stamp, 4)
    assert not sched._frees_now(seq)
    sched.batch_in_flight = False                # step 4 was processed (an empty schedule)
    assert sched._frees_now(seq)


def test_an_arrival_while_stores_drain_at_an_idle_engine_is_scheduled_at_once_under_async():
    """The engine is idle but request 0's stores are still in flight (a slow CPU tier: 21 ms a
    chunk), so it waits in empty steps; request 1 arrives then. Nothing is in flight to
    schedule ahead of it: vLLM schedules it at once, async or not (before, async left it
    unseen until the stores drained and then never woke: it did not finish)."""
    slow = (TierConfig("cpu", 100, 2 << 20, 1e8),)
    reqs = [Request(0, 0.0, 64, 2), Request(1, 0.030, 64, 2)]
    sync, asyn = (_run(iter(reqs), _config(async_scheduling=a), cost=FixedStepCost(0.01), offload=slow)
                  for a in (False, True))
    assert asyn.summary["requests_unfinished"] == 0 and asyn.summary["requests_finished"] == 2
    assert list(asyn.requests["first_sched_s"]) == list(sync.requests["first_sched_s"]) == [0.0, 0.03]
    assert asyn.summary["offload"]["stored_bytes"]["cpu"] > 0
