"""Scenario tests of PagedAllocator, in the style of vLLM's tests/v1/core/test_prefix_caching.py."""
import numpy as np
import pytest

from kvsim.allocator import MEMORY_CLASSES, PagedAllocator, SegmentKeys, hash_token_blocks

B = 4  # tokens per block in these scenarios


def keys(*token_runs):
    """Chained keys of the concatenation of token runs, e.g. keys(range(8), [99] * 5)."""
    return hash_token_blocks([t for run in token_runs for t in run], B)


def make(num_blocks=16, **kw):
    return PagedAllocator(num_blocks=num_blocks, block_size=B, **kw)


def test_shared_prompt_hits_full_blocks_and_shares_them():
    a = make()
    prompt = list(range(14))                      # 3 full blocks + 2 tokens
    assert a.allocate(0, 14, keys(prompt))
    assert a.allocate(1, 14, keys(prompt))
    assert a.num_cached_tokens(1) == 12           # the three full blocks
    assert a.block_table(1)[:3] == a.block_table(0)[:3]
    assert a.block_table(1)[3] != a.block_table(0)[3]   # the partial block is never shared
    assert [a.ref_cnt(b) for b in a.block_table(0)] == [2, 2, 2, 1]
    assert (a.num_queried_tokens, a.num_hit_tokens) == (28, 12)
    a.check_invariants()


def test_partial_block_match_misses():
    a = make()
    assert a.allocate(0, 8, keys(range(8)))
    # same first 6 tokens, then different: block 0 matches, block 1 does not
    assert a.lookup(keys(range(6), [99, 98]), 8 + 1) == 4
    assert a.allocate(1, 9, keys(range(6), [99, 98, 97]))
    assert a.num_cached_tokens(1) == 4
    a.check_invariants()


def test_shared_prompt_shorter_than_a_block_never_hits():
    a = PagedAllocator(num_blocks=8, block_size=16)
    system = list(range(10))                       # 10 shared tokens < 16
    assert a.allocate(0, 40, hash_token_blocks(system + [1] * 30, 16))
    assert a.lookup(hash_token_blocks(system + [2] * 30, 16), 40) == 0


def test_hit_is_capped_so_the_last_token_is_recomputed():
    a = make()
    prompt = list(range(12))                       # exactly 3 full blocks
    assert a.allocate(0, 12, keys(prompt))
    assert a.lookup(keys(prompt), 12) == 8         # block 2 recomputed for the last token
    assert a.lookup(keys(prompt), 13) == 12        # one more token: every full block hits
    assert a.allocate(1, 12, keys(prompt))
    assert a.num_cached_tokens(1) == 8
    # the recomputed block is a duplicate of seq 0's block 2: both sit in the hash map
    k2 = keys(prompt)[2]
    dup0, dup1 = a.block_table(0)[2], a.block_table(1)[2]
    assert dup0 != dup1 and a.pool.block_key[dup0] == a.pool.block_key[dup1] == k2
    a.check_invariants()


def test_duplicates_lookup_returns_the_earliest_inserted():
    a = make(num_blocks=8)
    prompt = list(range(12))
    a.allocate(0, 12, keys(prompt))
    a.allocate(1, 12, keys(prompt))
    k2 = keys(prompt)[2]
    first, second = a.block_table(0)[2], a.block_table(1)[2]
    assert a.pool.get_cached_block(k2) == first
    a.free(0)
    a.free(1)
    # never-used blocks first, then in release order: seq 0's tail, seq 1's tail first
    assert a.pool.free_queue() == [4, 5, 6, 7, first, second, 1, 0]
    assert a.pool.get_cached_block(k2) == first
    a.allocate(2, 20)                               # 5 blocks: 4 never-used, then evicts `first`
    assert a.pool.get_cached_block(k2) == second
    a.check_invariants()


def test_lru_eviction_order_least_recently_freed_first():
    a = make(num_blocks=6)
    a.allocate(0, 8, keys(range(8)))               # blocks 0, 1
    a.allocate(1, 8, keys(range(100, 108)))        # blocks 2, 3
    a.free(1)
    a.free(0)
    assert a.pool.free_queue() == [4, 5, 3, 2, 1, 0]
    assert a.breakdown()["cached"] == 4 * B
    a.allocate(2, 12)                              # 4, 5, then evicts seq 1's tail block 3
    assert a.block_table(2) == [4, 5, 3]
    assert a.lookup(keys(range(100, 108)), 9) == 4      # block 2 still cached
    assert a.lookup(keys(range(8)), 9) == 8             # seq 0 fully cached
    a.check_invariants()


def test_blocks_are_freed_tail_first():
    a = make(num_blocks=4)
    a.allocate(0, 16, keys(range(16)))             # blocks 0..3, all full and cached
    a.free(0)
    assert a.pool.free_queue() == [3, 2, 1, 0]     # tail evicted first
    a.allocate(1, 4)
    assert a.lookup(keys(range(16)), 17) == 12     # the head survives the eviction
    a.check_invariants()


def test_uncached_blocks_are_reused_first_lifo():
    a = make(num_blocks=8)
    a.allocate(0, 8, keys(range(8)))               # blocks 0, 1 (cached)
    a.allocate(1, 6, keys(range(50, 56)))          # blocks 2, 3 (3 is partial: uncached)
    a.free(0)
    a.free(1)
    # partial block 3 prepended: reused before the never-used blocks 4..7
    assert a.pool.free_queue() == [3, 4, 5, 6, 7, 1, 0, 2]
    a.allocate(2, 1)
    assert a.block_table(2) == [3]


def test_prefix_caching_disabled_reuses_everything_lifo_and_never_hits():
    a = make(num_blocks=6, enable_prefix_caching=False)
    a.allocate(0, 8, keys(range(8)))
    a.free(0)
    assert a.pool.free_queue() == [1, 0, 2, 3, 4, 5]
    assert a.lookup(keys(range(8)), 9) == 0
    assert a.allocate(1, 8, keys(range(8))) and a.num_cached_tokens(1) == 0
    assert a.num_queried_tokens == 0
    assert a.breakdown()["cached"] == 0
    a.check_invariants()


def test_evictable_hits_count_in_blocks_needed():
    a = make(num_blocks=4)
    a.allocate(0, 12, keys(range(12)))             # 3 cached blocks
    a.free(0)
    hashes = keys(range(12), [7] * 4)
    # 16 tokens: 3 hits (all evictable: they leave the free queue) + 1 new block
    assert a.blocks_needed(16, hashes) == 4
    a.allocate(9, 4)                                # takes the one never-used block
    assert a.num_free_blocks == 3
    assert a.blocks_needed(16, hashes) == 4 > a.num_free_blocks
    assert not a.allocate(1, 16, hashes)            # nothing changed
    assert a.pool.free_queue() == [2, 1, 0] and a.num_hit_tokens == 0
    a.free(9)
    assert a.allocate(1, 16, hashes) and a.num_cached_tokens(1) == 12
    a.check_invariants()


def test_non_evictable_hits_cost_no_free_block():
    a = make(num_blocks=5)
    a.allocate(0, 12, keys(range(12)))
    assert a.blocks_needed(16, keys(range(12), [7] * 4)) == 1
    assert a.allocate(1, 16, keys(range(12), [7] * 4))
    assert a.num_free_blocks == 1


def test_num_reserve_tokens_admits_only_if_the_whole_prompt_fits():
    a = make(num_blocks=4)
    a.allocate(9, 1)
    assert not a.allocate(0, 4, num_reserve_tokens=16)   # 4 blocks > 3 free
    assert a.num_free_blocks == 3
    assert a.allocate(0, 4, num_reserve_tokens=12)
    assert a.block_table(0) == [1]                       # only the first chunk is allocated
    assert a.num_queried_tokens == 1 + 12                 # vLLM counts the whole request
    with pytest.raises(ValueError, match="needs 5 blocks for 20 tokens"):
        a.allocate(1, 4, num_reserve_tokens=20)          # could never fit, even in an empty pool


def test_fork_shares_blocks_and_copies_a_shared_partial_block_on_write():
    a = make()
    a.allocate(0, 10, keys(range(10)))             # blocks 0, 1 full, block 2 partial
    a.fork(0, 1)
    assert a.block_table(1) == a.block_table(0) == [0, 1, 2]
    assert [a.ref_cnt(b) for b in range(3)] == [2, 2, 2]
    a.check_invariants()
    assert a.append(1, 1)                           # writes into the shared partial block: CoW
    assert a.block_table(1)[:2] == [0, 1] and a.block_table(1)[2] not in (0, 1, 2)
    assert a.block_table(0) == [0, 1, 2] and a.ref_cnt(2) == 1
    assert a.breakdown()["token_states"] == 8 + 2 + 3   # shared full blocks counted once
    a.check_invariants()
    assert a.append(0, 2)                           # block 2 is private now: no copy
    assert a.block_table(0) == [0, 1, 2]
    a.check_invariants()
    a.free(0)
    a.free(1)
    a.check_invariants()


def test_fork_copy_on_write_fails_cleanly_without_a_free_block():
    a = make(num_blocks=3)
    a.allocate(0, 10)
    a.fork(0, 1)
    assert not a.append(1, 1)
    assert a.block_table(1) == [0, 1, 2] and a.ref_cnt(2) == 2
    a.check_invariants()


def test_append_crosses_several_blocks_and_registers_full_ones():
    a = make()
    hashes = keys(range(30))
    a.allocate(0, 3, hashes)
    assert a.append(0, 14)                          # 17 tokens: 5 blocks, 4 full
    assert len(a.block_table(0)) == 5
    assert a.lookup(hashes, 30) == 16
    assert a.slot_mapping(0)[:6] == [a.block_table(0)[0] * B + i for i in range(4)] + \
        [a.block_table(0)[1] * B + i for i in range(2)]
    a.check_invariants()


def test_private_blocks_are_registered_only_on_preemption():
    a = make(num_blocks=12)
    shared = SegmentKeys([(1, 8), (2, 16)], B, num_shareable_tokens=8)   # 2 shareable blocks
    a.allocate(0, 20, shared)
    assert a.lookup(shared, 24) == 8                # private blocks 2..4 are not in the cache
    a.free(0, preempted=True)
    assert a.breakdown()["cached"] == 5 * B
    assert a.lookup(shared, 21) == 20               # the preempted request hits its own blocks
    assert a.allocate(0, 21, shared) and a.num_cached_tokens(0) == 20
    a.check_invariants()
    a.free(0)                                       # finished: private blocks count as free
    assert a.breakdown()["cached"] == 2 * B
    # the partial tail block 5 is reused first; the full ones keep vLLM's LRU place
    assert a.pool.free_queue()[0] == 5 and a.pool.free_queue()[-5:] == [4, 3, 2, 1, 0]
    a.check_invariants()


def test_preempted_free_with_an_unhashed_last_block():
    """vLLM's AsyncScheduler preempts a request whose last full block was completed by a decode
    still in flight: that block has no hash yet, so it is freed like a partial block (front of
    the free queue, not cached) and the re-admission cannot hit it."""
    a = make(num_blocks=12)
    own = SegmentKeys([(7, 16)], B, num_shareable_tokens=0)     # 4 private blocks
    a.allocate(0, 16, own)
    table = a.block_table(0)
    a.free(0, preempted=True, num_hashed_tokens=15)
    queue = a.pool.free_queue()
    assert queue[0] == table[3]                          # unhashed: reused first
    assert queue[-3:] == [table[2], table[1], table[0]]  # hashed: LRU tail, tail first
    assert a.breakdown()["cached"] == 3 * B
    assert a.lookup(own, 17) == 12                       # hits 3 blocks, not 4
    a.check_invariants()
    # without the argument every full block is hashed (the synchronous engine)
    b = make(num_blocks=12)
    b.allocate(0, 16, own)
    b.free(0, preempted=True)
    assert b.lookup(own, 17) == 16 and b.breakdown()["cached"] == 4 * B
    # a prefix hit keeps its key whatever num_hashed_tokens says
    c = make(num_blocks=12)
    shared = SegmentKeys([(1, 8), (2, 16)], B, num_shareable_tokens=8)
    c.allocate(0, 8, shared)
    c.allocate(1, 13, shared)
    assert c.num_cached_tokens(1) == 8
    tail = c.block_table(1)[2:]
    c.free(1, preempted=True, num_hashed_tokens=4)
    assert c.lookup(shared, 13) == 8                     # the 2 hit blocks, not the third
    assert c.pool.free_queue()[:2] == tail[::-1]         # partial tail, then the unhashed one
    c.check_invariants()
    with pytest.raises(ValueError, match="num_hashed_tokens"):
        c.free(0, num_hashed_tokens=-1)


def test_null_block_is_never_handed_out_and_usage_excludes_it():
    a = make(num_blocks=5, null_block=True)
    assert a.num_free_blocks == 4 and a.usage == 0.0
    a.allocate(0, 16)
    assert 0 not in a.block_table(0)
    assert a.usage == 1.0
    assert a.breakdown()["internal_fragmentation"] == B   # the null block's slots
    assert not a.allocate(1, 1)
    a.free(0)
    assert a.usage == 0.0
    a.check_invariants()


def test_breakdown_and_snapshot_classify_every_slot():
    a = make(num_blocks=8)
    a.allocate(0, 6, keys(range(6)))               # 1 full + 1 partial (2 of 4 slots)
    a.allocate(1, 8, keys(range(100, 108)))
    a.free(1)
    bd = a.breakdown()
    assert bd == {"token_states": 6, "reservation": 0, "internal_fragmentation": 2,
                  "external_fragmentation": 0, "cached": 8, "free": 16}
    snap = a.snapshot()
    assert snap.kind == "paged" and snap.num_cells == 8
    assert list(snap.cell_class[:4]) == [MEMORY_CLASSES.index(c) for c in
                                         ("token_states", "token_states", "cached", "cached")]
    assert list(snap.owner[:4]) == [0, 0, -1, -1] and list(snap.fill[:4]) == [4, 2, 4, 4]
    assert snap.block_key[2] == keys(range(100, 108))[0] and snap.block_key[1] == 0
    assert list(snap.block_tables[0]) == [0, 1] and snap.seq_lens == {0: 6}
    assert snap.ref_cnt.dtype == np.int32 and snap.cell_class.dtype == np.int8


def test_bad_arguments_raise_with_the_numbers():
    with pytest.raises(ValueError, match="power of two, got 12"):
        PagedAllocator(num_blocks=8, block_size=12)
    a = make()
    a.allocate(0, 4)
    with pytest.raises(ValueError, match="seq_id 0 is already allocated"):
        a.allocate(0, 4)
    with pytest.raises(ValueError, match="unknown seq_id 7"):
        a.append(7)
    with pytest.raises(ValueError, match="got -3"):
        a.append(0, -3)
    with pytest.raises(ValueError, match="got -1"):
        a.allocate(-1, 4)
    with pytest.raises(ValueError, match="needs 17 blocks for 65 tokens, the pool has 16"):
        a.allocate(1, 65)
    a.allocate(1, 4)
    with pytest.raises(ValueError, match="seq_id 1 is already allocated"):
        a.fork(0, 1)
    with pytest.raises(ValueError, match="unknown seq_id 3"):
        a.free(3)


def test_numpy_integers_are_accepted_as_sizes_and_ids():
    a = PagedAllocator(num_blocks=np.int64(8), block_size=np.int64(4))
    assert a.allocate(np.int64(3), np.int32(6)) and a.block_table(3) == [0, 1]
    assert a.append(3, np.int64(3)) and a.num_tokens(3) == 9
    with pytest.raises(ValueError, match="num_tokens must be an integer >= 0, got 2.5"):
        a.append(3, 2.5)
    a.check_invariants()


def test_any_hashable_seq_id_as_in_vllm_request_ids():
    a = make()
    prompt = list(range(10))
    assert a.allocate("req-1", 10, keys(prompt))
    assert a.allocate(("beam", 0), 10, keys(prompt))       # a tuple, hits req-1's full blocks
    assert a.allocate(5, 3)                                  # int ids mix with the others
    assert a.num_cached_tokens(("beam", 0)) == 8
    assert a.append("req-1", 3) and a.num_tokens("req-1") == 13
    a.fork("req-1", "req-1/sample-1")
    assert a.block_table("req-1/sample-1") == a.block_table("req-1")
    assert a.seq_ids == ["req-1", ("beam", 0), 5, "req-1/sample-1"]
    snap = a.snapshot()
    # int ids first, then the others in allocation order; owner holds an index into owner_ids
    assert list(snap.block_tables) == [5, "req-1", ("beam", 0), "req-1/sample-1"]
    assert snap.owner_ids == (5, "req-1", ("beam", 0), "req-1/sample-1")
    for seq_id, table in snap.block_tables.items():
        owners = {snap.owner_id(int(c)) for c in snap.owner[table]}
        # shared blocks show their first owner in snapshot order
        assert owners <= {seq_id, "req-1"}, (seq_id, owners)
    assert snap.owner_id(int(snap.owner[a.block_table(5)[0]])) == 5
    assert snap.owner_id(-1) is None
    a.free("req-1")
    a.free("req-1/sample-1")
    a.free(("beam", 0))
    assert a.seq_ids == [5] and a.snapshot().owner_ids is None   # only ints: codes are ids
    a.check_invariants()


@pytest.mark.parametrize("bad", [None, 1.5, True, [1, 2], {"a": 1}])
def test_seq_ids_that_are_unhashable_or_ambiguous_are_refused(bad):
    a = make()
    with pytest.raises(ValueError, match="seq_id must be"):
        a.allocate(bad, 4)
    assert a.seq_ids == []
