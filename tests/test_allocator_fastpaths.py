"""Fast paths of the allocator give exactly the answers and state of the plain paths."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvsim.allocator import PagedAllocator, SegmentKeys

B = 4


def _state(alloc):
    snap = alloc.snapshot()
    return (snap.cell_class.tolist(), snap.ref_cnt.tolist(), snap.block_key.tolist(),
            snap.fill.tolist(), {k: v.tolist() for k, v in snap.block_tables.items()},
            alloc.pool.free_queue(), alloc.breakdown())


@settings(max_examples=150, deadline=None)
@given(data=st.data(), num_blocks=st.integers(4, 40), caching=st.booleans())
def test_append_blocks_equals_appends_one_by_one(data, num_blocks, caching):
    """A decode step's boundary crossings take their blocks with one ``append_blocks`` and tell
    their tokens later: the same blocks and state as appending one token each, in order."""
    one = PagedAllocator(num_blocks=num_blocks, block_size=B, enable_prefix_caching=caching)
    many = PagedAllocator(num_blocks=num_blocks, block_size=B, enable_prefix_caching=caching)
    live = []
    for step in range(data.draw(st.integers(1, 30))):
        op = data.draw(st.sampled_from(["new", "fork"] * bool(live) + ["new", "grow", "free"]))
        if op == "new":
            total = data.draw(st.integers(1, 24))
            shared = data.draw(st.integers(0, total + 20))
            keys = SegmentKeys([(1000 + data.draw(st.integers(0, 1)), total),
                                (10_000 + step, 20)], B, num_shareable_tokens=shared)
            n = data.draw(st.integers(1, min(total, num_blocks * B)))
            ok = one.allocate(step, n, keys)
            assert many.allocate(step, n, keys) == ok
            if ok:
                live.append(step)
        elif op == "fork":
            parent = data.draw(st.sampled_from(live))
            one.fork(parent, step)
            many.fork(parent, step)
            live.append(step)
        elif op == "free" and live:
            seq_id = data.draw(st.sampled_from(live))
            preempted = data.draw(st.booleans())
            one.free(seq_id, preempted)
            many.free(seq_id, preempted)
            live.remove(seq_id)
        elif op == "grow" and live:
            chosen = data.draw(st.lists(st.sampled_from(live), max_size=len(live), unique=True))
            # sequences at a block boundary cross it with their next token
            crossing = [s for s in chosen if one.num_tokens(s) % B == 0]
            tokens = {s: data.draw(st.integers(1, B)) for s in crossing}
            before = _state(one)
            if len(crossing) > many.num_free_blocks:
                with pytest.raises(ValueError, match="blocks wanted"):
                    many.append_blocks(crossing)
                assert _state(many) == before     # nothing changed
                continue
            many.append_blocks(crossing)
            for seq_id in crossing:
                assert one.append(seq_id, 1)
            for seq_id in crossing:
                assert many.append(seq_id, tokens[seq_id])
                assert one.append(seq_id, tokens[seq_id] - 1)
        many.check_invariants()
        assert _state(many) == _state(one)
        assert [many.block_table(s) for s in live] == [one.block_table(s) for s in live]


def test_append_blocks_hands_out_the_queue_front_in_order():
    alloc = PagedAllocator(num_blocks=5, block_size=B, enable_prefix_caching=False)
    assert alloc.allocate(0, 4) and alloc.allocate(1, 8)
    with pytest.raises(ValueError, match="sequence 7 is not allocated"):
        alloc.append_blocks([0, 7])
    with pytest.raises(ValueError, match="3 blocks wanted, 2 free"):
        alloc.append_blocks([1, 0, 1])
    assert alloc.block_table(0) == [0] and alloc.num_free_blocks == 2
    alloc.append_blocks([1, 0])
    assert alloc.block_table(1) == [1, 2, 3] and alloc.block_table(0) == [0, 4]
    # the blocks count as in use, their slots empty until the tokens are told
    assert alloc.breakdown_slots()[:3] == [12, 0, 8]
    assert alloc.append(0, 1) and alloc.append(1, 3)   # no new block needed
    alloc.check_invariants()
    assert alloc.num_free_blocks == 0 and int(np.sum(alloc.snapshot().fill)) == 16


def test_repeated_lookups_see_hash_map_changes():
    """Admission asks lookup / blocks_needed / allocate with the same keys in a row (the scan
    is reused); any change to the hash map in between must show."""
    alloc = PagedAllocator(num_blocks=8, block_size=B, enable_prefix_caching=True)
    assert alloc.allocate(1, 4)                        # block 0, unique content
    keys = SegmentKeys([(7, 12), (8, 4)], B)
    assert alloc.allocate(0, 12, keys)                 # blocks 1-3, registered
    other = SegmentKeys([(7, 12), (9, 4)], B)
    assert alloc.lookup(other, 16) == 12 and alloc.lookup(other, 9) == 8
    assert alloc.blocks_needed(16, other) == 1
    alloc.free(0)                                      # cached, evictable
    assert alloc.blocks_needed(16, other) == 4         # hits now cost free blocks
    # growing seq 1 to 6 blocks takes the 4 never used, then evicts seq 0's tail block (LRU)
    assert alloc.append(1, 20)
    assert alloc.lookup(other, 16) == 8
    assert alloc.blocks_needed(16, other) == 4 - 2 + 2


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8),
       block_size=st.sampled_from([1, 2, 4, 16]), data=st.data())
def test_segment_key_slices_equal_keys_one_by_one(lengths, block_size, data):
    keys = SegmentKeys([(100 + i, n) for i, n in enumerate(lengths)], block_size)
    start = data.draw(st.integers(-len(keys) - 2, len(keys) + 2))
    stop = data.draw(st.integers(-len(keys) - 2, len(keys) + 2))
    expected = [keys[i] for i in range(len(keys))][start:stop]
    assert keys[start:stop] == expected
    assert keys[:] == [keys[i] for i in range(len(keys))]
