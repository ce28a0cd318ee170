"""GroupedPagedAllocator: KV-cache groups over one pool (sliding window, Mamba state, full)."""
import pytest

from kvsim.allocator.accounting import MEMORY_CLASSES
from kvsim.allocator.group_managers import NULL, KVCacheGroupSpec
from kvsim.allocator.grouped import GroupedPagedAllocator
from kvsim.workloads.keys import hash_token_blocks

FULL = KVCacheGroupSpec("full_attention", name="full")
SLIDING = KVCacheGroupSpec("sliding_window", sliding_window=8, name="sliding")
MAMBA = KVCacheGroupSpec("mamba", name="mamba")


def make(groups, num_blocks=64, block_size=4, caching=True, max_model_len=256, budget=64):
    return GroupedPagedAllocator(num_blocks, block_size, groups, enable_prefix_caching=caching,
                                 max_model_len=max_model_len, max_num_batched_tokens=budget)


def decode(alloc, seq_id, num_computed, keys, prompt):
    """One decode step of a request whose every token is computed (num_computed == length)."""
    assert alloc.allocate_slots(seq_id, 1, num_computed_tokens=num_computed,
                                num_tokens=num_computed + 1, num_prompt_tokens=prompt,
                                block_hashes=keys)
    return num_computed + 1


def test_sliding_window_frees_blocks_behind_the_window_as_the_request_grows():
    alloc = make([FULL, SLIDING])
    tokens = list(range(200))
    keys = hash_token_blocks(tokens, 4)
    assert alloc.allocate_slots(0, 20, num_computed_tokens=0, num_tokens=20, num_prompt_tokens=20,
                                block_hashes=keys)
    full, sliding = alloc.block_tables(0)
    assert len(full) == len(sliding) == 5 and NULL not in sliding
    n = 20
    for _ in range(20):
        n = decode(alloc, 0, n, keys, 20)
        alloc.check_invariants()
    full, sliding = alloc.block_tables(0)
    assert len(full) == len(sliding) == 10 and NULL not in full
    # the last step computed token 39, whose window is tokens 32..39: blocks 0..7 are freed
    assert sliding[:8] == [NULL] * 8 and NULL not in sliding[8:]
    per_group = alloc.group_breakdown()
    assert alloc.managers[1].num_used_blocks == 2 < alloc.managers[0].num_used_blocks == 10
    assert per_group[1]["token_states"] < per_group[0]["token_states"]


def test_sliding_hit_needs_only_the_window_and_full_attention_bounds_it():
    alloc = make([FULL, SLIDING])
    prompt = list(range(40))
    keys = hash_token_blocks(prompt + [999], 4)
    assert alloc.allocate_slots(0, 40, num_computed_tokens=0, num_tokens=40, num_prompt_tokens=40,
                                block_hashes=keys)
    alloc.free(0)
    hit = alloc.find_cache_hit(keys, 41)
    # full attention caches all 10 blocks; the sliding group only cdiv(8 - 1, 4) = 2 blocks
    # just below the prompt's replay boundary (token 39): blocks 7 and 8
    assert hit.num_tokens == 36
    assert len(hit.blocks[0]) == 9 and NULL not in hit.blocks[0]
    assert hit.blocks[1][:7] == (NULL,) * 7 and NULL not in hit.blocks[1][7:]
    # full attention alone would serve 40 tokens: vLLM's "junction" the request then caches
    assert hit.shared_prefix_boundary == 40


def test_mamba_keeps_one_state_and_caches_only_the_replay_boundary():
    alloc = make([MAMBA, FULL])
    prompt = list(range(30))
    keys = hash_token_blocks(prompt + list(range(100, 110)), 4)
    assert alloc.allocate_slots(0, 28, num_computed_tokens=0, num_tokens=30, num_prompt_tokens=30,
                                block_hashes=keys)
    assert alloc.allocate_slots(0, 2, num_computed_tokens=28, num_tokens=30, num_prompt_tokens=30,
                                block_hashes=keys)
    mamba, full = alloc.block_tables(0)
    assert len(mamba) == len(full) == 8
    assert sum(b != NULL for b in mamba) == 2       # state at 28 (being read) and at 30
    n = 30
    for _ in range(4):
        n = decode(alloc, 0, n, keys, 30)
    assert sum(b != NULL for b in alloc.block_tables(0)[0]) <= 2
    alloc.free(0)
    hit = alloc.find_cache_hit(keys, 34)
    # the state after 28 tokens (prompt - 1, block aligned) was cached: a hit of 28 tokens
    assert hit.num_tokens == 28 and hit.blocks[0][-1] != NULL
    alloc.check_invariants()


def test_mamba_without_prefix_caching_takes_one_block_per_request():
    alloc = make([MAMBA, FULL], caching=False)
    assert alloc.allocate_slots(0, 37, num_computed_tokens=0, num_tokens=37, num_prompt_tokens=37)
    mamba, full = alloc.block_tables(0)
    assert len(mamba) == 1 and len(full) == 10
    for n in range(37, 60):
        assert alloc.allocate_slots(0, 1, num_computed_tokens=n, num_tokens=n + 1,
                                    num_prompt_tokens=37)
    assert len(alloc.block_tables(0)[0]) == 1
    alloc.check_invariants()


def test_failed_allocation_changes_nothing_but_frees_blocks_behind_the_window():
    alloc = make([FULL, SLIDING], num_blocks=16)
    keys = hash_token_blocks(list(range(200)), 4)
    assert alloc.allocate_slots(0, 24, num_computed_tokens=0, num_tokens=24, num_prompt_tokens=24,
                                block_hashes=keys)
    free_before = alloc.num_free_blocks
    # a 40-token chunk needs 10 full + 3 sliding blocks: does not fit, but blocks 0..3 of the
    # sliding table are out of the window of token 24 and are freed anyway (as vLLM does)
    assert not alloc.allocate_slots(0, 40, num_computed_tokens=24, num_tokens=64,
                                    num_prompt_tokens=64, block_hashes=keys)
    assert alloc.num_free_blocks == free_before + 4
    assert alloc.block_tables(0)[1][:4] == [NULL] * 4
    alloc.check_invariants()


def test_breakdown_sums_to_the_pool_and_snapshot_names_groups():
    alloc = make([FULL, SLIDING, MAMBA])
    keys = hash_token_blocks(list(range(100)), 4)
    assert alloc.allocate_slots(7, 30, num_computed_tokens=0, num_tokens=30, num_prompt_tokens=30,
                                block_hashes=keys)
    breakdown = alloc.breakdown()
    assert tuple(breakdown) == MEMORY_CLASSES and sum(breakdown.values()) == 64 * 4
    groups = alloc.group_breakdown()
    assert sum(g["token_states"] for g in groups) == breakdown["token_states"]
    snap = alloc.snapshot()
    assert snap.group_names == ("full", "sliding", "mamba")
    tables = snap.group_block_tables[7]
    for group_id, table in enumerate(tables):
        held = table[table != NULL]
        assert (snap.block_group[held] == group_id).all()
        assert (snap.owner[held] == 7).all()
    alloc.free(7)
    assert alloc.num_used_blocks == 0
    snap = alloc.snapshot()
    cached = snap.cell_class == MEMORY_CLASSES.index("cached")
    assert cached.any() and (snap.block_group[cached] >= 0).all()
    assert sum(g["cached"] for g in alloc.group_breakdown()) == alloc.breakdown()["cached"]


def test_bad_calls_raise():
    with pytest.raises(ValueError, match="sliding_window is required"):
        KVCacheGroupSpec("sliding_window")
    with pytest.raises(ValueError, match="kind must be one of"):
        KVCacheGroupSpec("linear")
    alloc = make([FULL, SLIDING])
    with pytest.raises(ValueError, match="block_hashes are required"):
        alloc.allocate_slots(0, 4, num_computed_tokens=0, num_tokens=4, num_prompt_tokens=4)
    with pytest.raises(ValueError, match="num_new_tokens must be > 0"):
        alloc.allocate_slots(0, 0, num_computed_tokens=0, num_tokens=4, num_prompt_tokens=4,
                             block_hashes=[])
    with pytest.raises(ValueError, match="unknown seq_id"):
        alloc.free(3)


def test_a_connector_load_gets_blocks_only_inside_each_groups_window_and_caches_later():
    # vLLM allocate_slots(num_external_computed_tokens=36, delay_cache_blocks=True): full
    # attention gets a block for each of the 9 loaded blocks; the window (8 tokens, blocks of 4)
    # of token 36 reaches back to token 29: 7 blocks skipped (NULL), 2 allocated
    alloc = make([FULL, SLIDING], num_blocks=40)
    prompt = list(range(40))
    keys = hash_token_blocks(prompt, 4)
    empty = alloc.find_cache_hit(keys, 40)
    free = alloc.num_free_blocks
    assert alloc.allocate_slots(0, 0, num_computed_tokens=0, num_tokens=40, num_prompt_tokens=40,
                                block_hashes=keys, hit=empty, num_external_computed_tokens=36,
                                delay_cache_blocks=True)
    full, sliding = alloc.block_tables(0)
    assert len(full) == 9 and NULL not in full
    assert sliding[:7] == [NULL] * 7 and len(sliding) == 9 and NULL not in sliding[7:]
    assert alloc.num_free_blocks == free - 11
    assert alloc.find_cache_hit(keys, 40).num_tokens == 0          # nothing cached yet
    # the load is done: cache what it wrote; a second request with the prompt hits 36 tokens
    alloc.cache_blocks(0, 36)
    hit = alloc.find_cache_hit(keys, 40)
    assert hit.num_tokens == 36 and hit.blocks[1][7:] == tuple(sliding[7:])
    # the request runs its last prompt block: one more block in each group
    assert alloc.allocate_slots(0, 4, num_computed_tokens=36, num_tokens=40,
                                num_prompt_tokens=40, full_sequence_must_fit=True)
    full, sliding = alloc.block_tables(0)
    assert len(full) == len(sliding) == 10 and sliding.count(NULL) == 7
    alloc.check_invariants()


def test_mamba_states_cached_are_handed_over_once_with_their_block_and_boundary():
    # vLLM's take_boundary_state_offloads: each state a Mamba group caches, with its exact
    # block; nothing is recorded without a connector asking for it
    alloc = make([FULL, MAMBA])
    prompt = list(range(30))
    keys = hash_token_blocks(prompt, 4)
    assert alloc.allocate_slots(0, 28, num_computed_tokens=0, num_tokens=30, num_prompt_tokens=30,
                                block_hashes=keys)
    assert alloc.take_boundary_states() == {}
    alloc.record_boundary_states()
    other = [p + 1000 for p in prompt]
    other_keys = hash_token_blocks(other, 4)
    assert alloc.allocate_slots(1, 28, num_computed_tokens=0, num_tokens=30, num_prompt_tokens=30,
                                block_hashes=other_keys)
    # the replay boundary of a 30-token prompt: the state after 28 tokens (table index 6)
    states = alloc.take_boundary_states()
    assert states == {1: [(1, alloc.block_tables(1)[1][6], 28)]}
    assert alloc.take_boundary_states() == {}                      # drained
    alloc.check_invariants()


def test_a_freed_requests_states_not_taken_yet_are_dropped():
    alloc = make([MAMBA, FULL])
    alloc.record_boundary_states()
    keys = hash_token_blocks(list(range(30)), 4)
    assert alloc.allocate_slots(0, 28, num_computed_tokens=0, num_tokens=30, num_prompt_tokens=30,
                                block_hashes=keys)
    alloc.free(0, preempted=True)
    assert alloc.take_boundary_states() == {}


def test_a_connector_load_with_a_mamba_group_gets_one_state_block():
    # vLLM: allocate_slots(num_external_computed_tokens=28): the Mamba group skips every block
    # but the state at the hit's end (NULL below it), full attention gets all 7
    alloc = make([MAMBA, FULL], num_blocks=40)
    keys = hash_token_blocks(list(range(30)), 4)
    empty = alloc.find_cache_hit(keys, 30)
    free = alloc.num_free_blocks
    assert alloc.allocate_slots(0, 0, num_computed_tokens=0, num_tokens=30, num_prompt_tokens=30,
                                block_hashes=keys, hit=empty, num_external_computed_tokens=28,
                                delay_cache_blocks=True)
    mamba, full = alloc.block_tables(0)
    assert mamba == [NULL] * 6 + [mamba[6]] and mamba[6] != NULL
    assert len(full) == 7 and NULL not in full
    assert alloc.num_free_blocks == free - 8
    alloc.cache_blocks(0, 28)
    assert alloc.find_cache_hit(keys, 30).num_tokens == 28
    alloc.check_invariants()


def test_a_load_after_a_gpu_hit_and_the_blocks_it_must_leave_free():
    alloc = make([FULL, SLIDING], num_blocks=40)
    prompt = list(range(40))
    keys = hash_token_blocks(prompt, 4)
    assert alloc.allocate_slots(0, 16, num_computed_tokens=0, num_tokens=16,
                                num_prompt_tokens=16, block_hashes=keys[:4])
    alloc.free(0)
    hit = alloc.find_cache_hit(keys, 40)
    assert hit.num_tokens == 12        # the window was cached only below token 15
    free = alloc.num_free_blocks
    # 12 GPU-hit tokens, 24 loaded: full attention takes its 3 cached hit blocks out of the
    # free queue and 6 new ones, the window 2 (blocks 7 and 8; below them NULL, its hit blocks
    # included): 11 free blocks, which fit only if 11 + reserved <= free
    args = dict(num_computed_tokens=0, num_tokens=40, num_prompt_tokens=40, block_hashes=keys,
                hit=hit, num_external_computed_tokens=24, delay_cache_blocks=True)
    assert not alloc.allocate_slots(1, 0, reserved_blocks=free - 10, **args)
    assert alloc.num_free_blocks == free and 1 not in alloc.seq_ids
    assert alloc.allocate_slots(1, 0, reserved_blocks=free - 11, **args)
    assert alloc.num_free_blocks == free - 11
    full, sliding = alloc.block_tables(1)
    assert full[:3] == list(hit.blocks[0]) and len(full) == 9
    assert sliding[:7] == [NULL] * 7 and len(sliding) == 9 and NULL not in sliding[7:]
    # what it still needs to hold its whole sequence (vLLM's reservation for it)
    assert alloc.blocks_to_finish(1, 40, 36, 40) == 2
    alloc.check_invariants()


def test_lazy_keys_are_listed_once_and_hits_read_the_pool_at_every_lookup(monkeypatch):
    """A waiting request is looked up every step: its lazy keys are made into a list once and
    kept (allocator.grouped._key_list), never its hit: blocks cached or evicted between two
    lookups change the answer as they do for a plain list of the same keys."""
    from kvsim.allocator import grouped
    from kvsim.workloads.keys import SegmentKeys

    def lazy():
        return SegmentKeys([(1, 24), (2, 13), (3, 7)], 4)        # 44 tokens, 11 full blocks
    waiting, listed = lazy(), list(lazy())
    alloc = make([FULL, SLIDING])

    def same(keys, num_tokens):
        got, want = alloc.find_cache_hit(keys, num_tokens), alloc.find_cache_hit(listed, num_tokens)
        assert got == want
        return got
    assert same(waiting, 44).num_tokens == 0                     # an empty pool: no lookup
    # another request with the same first 37 tokens caches its blocks: the next lookup sees them
    other = SegmentKeys([(1, 24), (2, 13)], 4)
    assert alloc.allocate_slots(1, 37, num_computed_tokens=0, num_tokens=37, num_prompt_tokens=37,
                                block_hashes=other)
    alloc.free(1)
    assert same(waiting, 20).num_tokens < 20 and len(alloc._keys_memo) == 1
    assert same(waiting, 44).num_tokens == 36                    # a longer limit: listed again
    assert same(waiting, 20).num_tokens < 20                     # a shorter one: the kept list
    assert same(waiting, 1000).num_tokens == 36                  # past its keys: all of them
    # the blocks evicted: no hit again; and with the memo cleared at every call, the same
    monkeypatch.setattr(grouped, "KEY_MEMO_MAX_KEYS", 1)
    assert alloc.allocate_slots(2, 4 * 30, num_computed_tokens=0, num_tokens=120,
                                num_prompt_tokens=120, block_hashes=SegmentKeys([(9, 120)], 4))
    assert same(lazy(), 44).num_tokens == 0 and same(waiting, 44).num_tokens == 0


def test_the_key_lists_kept_count_each_request_once():
    """A request listed again for a longer limit replaces its list: the kept count is the sum of
    the lists kept, so the memo is dropped only past KEY_MEMO_MAX_KEYS keys."""
    from kvsim.workloads.keys import SegmentKeys
    alloc = make([FULL, SLIDING])
    first = SegmentKeys([(1, 40)], 4)
    assert alloc.allocate_slots(0, 40, num_computed_tokens=0, num_tokens=40, num_prompt_tokens=40,
                                block_hashes=first)
    waiting = [SegmentKeys([(1, 40), (i + 2, 20)], 4) for i in range(3)]     # 14 blocks below 59 tokens
    for keys in waiting:
        alloc.find_cache_hit(keys, 30)
        alloc.find_cache_hit(keys, 60)
    kept = alloc._keys_memo
    assert len(kept) == 3 and alloc._keys_memo_size == sum(len(v[1]) for v in kept.values()) == 3 * (59 // 4)
