"""Prefix caching by segment run (SegmentKeys) decides exactly as caching one numbered key per
block: same tables, free-queue order, hits, counters and snapshot keys, for any operations."""
from hypothesis import given, settings, strategies as st

from kvsim.allocator import PagedAllocator, SegmentKeys
from kvsim.allocator.block_pool import BlockPool
from kvsim.workloads.keys import segment_key
from test_allocator_properties import prefix_segments

B = 4


class NumberedKeys(list):
    """The same keys as a SegmentKeys, as plain numbers (the per-block path), with the same
    shareable prefix."""

    def __init__(self, keys: SegmentKeys):
        super().__init__(keys)
        self.num_shareable_blocks = keys.num_shareable_blocks


def _state(alloc):
    snap = alloc.snapshot()
    pool = alloc.pool
    return (snap.cell_class.tolist(), snap.ref_cnt.tolist(), snap.block_key.tolist(),
            snap.fill.tolist(), {k: v.tolist() for k, v in snap.block_tables.items()},
            pool.free_queue(), alloc.breakdown(), pool.num_cached_blocks, pool.num_free_blocks,
            alloc.num_queried_tokens, alloc.num_hit_tokens, alloc.num_preempted_queried_tokens,
            alloc.num_preempted_hit_tokens)


def _segments(data, step, num_tokens):
    """Content of a request: one of a few shared prefixes (several segments, some shorter
    than a block) and then its own text."""
    segments = []
    for depth in range(data.draw(st.integers(0, 3))):
        segments.append((100 * depth + data.draw(st.integers(0, 1)),
                         data.draw(st.integers(1, 2 * B + 1))))
    segments.append((10_000 + step, 40))
    return prefix_segments(segments, num_tokens)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), num_blocks=st.integers(4, 30), null_block=st.booleans(),
       mix_at=st.integers(0, 60))
def test_segment_runs_decide_as_numbered_keys(data, num_blocks, null_block, mix_at):
    """One allocator gets SegmentKeys, the other the same keys as numbers; after ``mix_at``
    steps the first also gets a numbered sequence (its pool then keys by number: the two
    kinds must keep matching each other)."""
    seg = PagedAllocator(num_blocks=num_blocks, block_size=B, null_block=null_block)
    num = PagedAllocator(num_blocks=num_blocks, block_size=B, null_block=null_block)
    live, preempted = {}, {}          # seq_id -> (segment keys, numbered keys)
    for step in range(data.draw(st.integers(1, 60))):
        ops = ["new", "lookup"] + ["append", "free", "preempt", "fork"] * bool(live) + \
            ["resume"] * bool(preempted)
        op = data.draw(st.sampled_from(ops))
        if op in ("new", "lookup"):
            total = data.draw(st.integers(2, 48))
            keys = SegmentKeys(_segments(data, step, total), B,
                               num_shareable_tokens=data.draw(st.integers(0, total)))
            pair = (keys, NumberedKeys(keys))
            if step >= mix_at:            # the segment side now also sees numbers
                pair = (pair[1], pair[1])
            prompt = data.draw(st.integers(1, total))
            if op == "lookup":
                assert seg.lookup(pair[0], prompt) == num.lookup(pair[1], prompt)
                assert seg.blocks_needed(prompt, pair[0]) == num.blocks_needed(prompt, pair[1])
                continue
            if -(-prompt // B) > num_blocks - null_block:
                continue
            ok = seg.allocate(step, prompt, pair[0])
            assert num.allocate(step, prompt, pair[1]) == ok
            if ok:
                live[step] = pair
        elif op == "resume":
            seq_id = data.draw(st.sampled_from(sorted(preempted)))
            pair, n = preempted.pop(seq_id)
            ok = seg.allocate(seq_id, n, pair[0])
            assert num.allocate(seq_id, n, pair[1]) == ok
            (live if ok else preempted)[seq_id] = pair if ok else (pair, n)
        else:
            seq_id = data.draw(st.sampled_from(sorted(live)))
            if op == "append":
                room = len(live[seq_id][1]) * B + B - 1 - seg.num_tokens(seq_id)
                if room > 0:
                    n = data.draw(st.integers(1, room))
                    assert seg.append(seq_id, n) == num.append(seq_id, n)
            elif op == "fork":
                seg.fork(seq_id, step, live[seq_id][0])
                num.fork(seq_id, step, live[seq_id][1])
                live[step] = live[seq_id]
            else:
                preempt = op == "preempt"
                if preempt:
                    preempted[seq_id] = (live[seq_id], seg.num_tokens(seq_id))
                seg.free(seq_id, preempted=preempt)
                num.free(seq_id, preempted=preempt)
                del live[seq_id]
        assert _state(seg) == _state(num)
        seg.check_invariants()
        num.check_invariants()


def test_a_run_of_a_segment_is_one_entry_and_keys_come_back_on_demand():
    """A 512-token segment (Mooncake's hash id) at block size 16 is 32 blocks under one
    entry; each block still has its own key (key_of), ref count and free-queue place."""
    keys = SegmentKeys([(7, 512), (8, 100)], 16)
    a = PagedAllocator(num_blocks=64, block_size=16)
    assert a.allocate(0, 612, keys)
    pool = a.pool
    assert not pool.int_keys and len(pool._segments) == 2 and pool.num_keyed_blocks == 38
    table = a.block_table(0)
    assert [pool.key_of(b) for b in table[:38]] == list(keys)
    assert pool.key_of(table[38]) is None                   # the partial tail
    # a second sequence with the first segment hits its 32 blocks, and only those
    other = SegmentKeys([(7, 512), (9, 100)], 16)
    assert a.lookup(other, 612) == 512
    a.free(0)
    # freed tail first: the partial tail at the front, then the segment runs at the back
    queue = pool.free_queue()
    assert queue[:1] == [table[38]] and queue[-38:] == table[37::-1]
    assert pool.num_cached_blocks == 38
    # evicting part of a run leaves the rest matchable, by the leading run only
    pool.pop(len(queue) - 38 + 6)          # the 6 blocks of segment 8 go first (tail first)
    assert a.lookup(other, 612) == 512 and pool.num_cached_blocks == 32
    pool.pop(1)                            # block 31 of segment 7
    assert a.lookup(other, 612) == 31 * 16
    pool.check_invariants()                # (the popped blocks belong to no sequence)


def test_numbered_keys_convert_segment_entries_once():
    """The first numbered key converts every segment entry: the pool then answers numbered
    and segment look-ups alike."""
    keys = SegmentKeys([(1, 8), (2, 9)], B)
    a = PagedAllocator(num_blocks=16, block_size=B)
    assert a.allocate(0, 17, keys)
    assert a.pool.get_cached_block(keys[3]) == a.block_table(0)[3]     # converts
    assert a.pool.int_keys and not a.pool._segments
    assert a.lookup(keys, 17) == 16 and a.lookup(list(keys), 17) == 16
    a.check_invariants()


def test_pool_segment_duplicates_return_the_earliest():
    """The same content registered twice keeps both blocks; a hit returns the earliest, and
    dropping it leaves the other."""
    pool = BlockPool(8)
    first, second = pool.pop(2)
    pool.register_runs([first], [(5, 3, 0, 0, 1)], B)
    pool.register_runs([second], [(5, 3, 0, 0, 1)], B)
    runs = [(5, 3, 0, 0, 1)]
    assert pool.segment_hits(runs) == [first]
    pool.free([first], 0)
    pool.pop(pool.num_free_blocks)        # evicts ``first``
    assert pool.segment_hits(runs) == [second]
    assert pool.key_of(second) == segment_key(5, 3) and pool.key_of(first) is None
    pool.check_invariants()
