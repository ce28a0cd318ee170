"""The offloading connector alone: lookups, loads, stores, disk promotion, timing, flushes."""
import pytest

from kvsim.allocator.offload import HIT, MISS, PENDING
from kvsim.simulator.offload import NS_PER_S, OffloadConnector, TierConfig

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
    ref_cnt = [0] * 10
    conn.check_reused_blocks(ref_cnt)
    assert run_step(conn, 0)[0] == 0           # blocks 6, 7 free: no flush
    ref_cnt[7] = 1                             # block 7 handed out again
    conn.check_reused_blocks(ref_cnt)
    stall, _ = run_step(conn, 10)              # submitted at once, and the forward waits
    assert stall == 2 * MS and conn.stats.stored_bytes["cpu"] == 2 * CHUNK
    assert not conn.busy


def test_a_refused_offer_is_offered_again():
    conn = connector(cpu_chunks=2)
    conn.offer("a", [1, 2], 8, 8, [1, 2])      # pending: not evictable
    conn.offer("b", [3], 4, 4, [3])
    assert conn.stats.num_failed_offers == 1 and conn.cpu.lookup(3) == MISS
    for t in (0, 10, 20, 30):
        run_step(conn, t)
    conn.offer("b", [3], 4, 4, [3])            # the same chunk again: now 1 or 2 can go
    assert conn.cpu.lookup(3) == PENDING


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
