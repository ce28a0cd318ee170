"""Property tests: random operation sequences on both allocators, invariants after every step.

The paged allocator is also replayed against a deliberately naive transcription of vLLM v1's
semantics (one Python list as the free queue, every full block hashed at once): block tables,
free-queue order, hits and "does not fit" answers must agree at every step.
"""
import numpy as np
from hypothesis import given, settings, strategies as st

from kvsim.allocator import MEMORY_CLASSES, ContiguousAllocator, PagedAllocator, SegmentKeys
from kvsim.allocator.block_pool import FreeBlockQueue

B = 4


class VllmReference:
    """vLLM v1 block pool + full-attention manager, naively (O(n) lists, eager hashing)."""

    def __init__(self, num_blocks, caching, null_block):
        self.queue = list(range(num_blocks))          # front = index 0
        if null_block:
            self.queue.pop(0)
        self.caching = caching
        self.ref = [0] * num_blocks
        self.key = [None] * num_blocks
        self.cache = {}                                # key -> blocks, insertion order
        self.tables, self.keys, self.ntok, self.ncached, self.hit_tokens = {}, {}, {}, {}, {}
        self.queries = self.hits = self.preempted_queries = self.preempted_hits = 0
        self.preempted = set()

    def hit_blocks(self, keys, num_tokens):
        out = []
        if not self.caching or num_tokens < 1:
            return out
        for i in range(min((num_tokens - 1) // B, len(keys))):
            blocks = self.cache.get(keys[i])
            if not blocks:
                break
            out.append(blocks[0])
        return out

    def blocks_needed(self, keys, num_tokens):
        hits = self.hit_blocks(keys, num_tokens)
        return -(-num_tokens // B) - len(hits) + sum(self.ref[b] == 0 for b in hits)

    def _pop(self):
        b = self.queue.pop(0)
        if self.key[b] is not None:                    # evict the cached block
            self.cache[self.key[b]].remove(b)
            if not self.cache[self.key[b]]:
                del self.cache[self.key[b]]
            self.key[b] = None
        self.ref[b] = 1
        return b

    def _cache_full_blocks(self, seq):
        if not self.caching:
            return
        table, keys = self.tables[seq], self.keys[seq]
        num_full = self.ntok[seq] // B
        for i in range(self.ncached[seq], min(num_full, len(keys))):
            if self.key[table[i]] is None:
                self.key[table[i]] = keys[i]
                self.cache.setdefault(keys[i], []).append(table[i])
        self.ncached[seq] = max(self.ncached[seq], num_full)

    def allocate(self, seq, num_tokens, keys, reserve):
        hits = self.hit_blocks(keys, num_tokens)
        need = -(-max(num_tokens, reserve or 0) // B) - len(hits) + sum(
            self.ref[b] == 0 for b in hits)
        if need > len(self.queue):
            return False
        for b in hits:
            if self.ref[b] == 0:
                self.queue.remove(b)
            self.ref[b] += 1
        self.tables[seq] = hits + [self._pop() for _ in range(-(-num_tokens // B) - len(hits))]
        self.keys[seq], self.ntok[seq], self.ncached[seq] = keys, num_tokens, len(hits)
        self.hit_tokens[seq] = len(hits) * B
        if self.caching and seq in self.preempted:       # vLLM: request.num_preemptions > 0
            self.preempted.discard(seq)
            self.preempted_queries += max(num_tokens, reserve or 0)
            self.preempted_hits += len(hits) * B
        elif self.caching:
            self.queries += max(num_tokens, reserve or 0)
            self.hits += len(hits) * B
        self._cache_full_blocks(seq)
        return True

    def append(self, seq, n):
        new = self.ntok[seq] + n
        need = -(-new // B) - len(self.tables[seq])
        if need > len(self.queue):
            return False
        self.tables[seq] += [self._pop() for _ in range(need)]
        self.ntok[seq] = new
        self._cache_full_blocks(seq)
        return True

    def free(self, seq, preempted=False):
        if preempted:
            self.preempted.add(seq)
        front, back = [], []
        for b in reversed(self.tables.pop(seq)):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (front if self.key[b] is None or not self.caching else back).append(b)
        self.queue = front + self.queue + back
        del self.keys[seq], self.ntok[seq], self.ncached[seq], self.hit_tokens[seq]


def request_keys(request_no, group, shared_tokens, total_tokens):
    """Keys of a request: a prefix shared with its group, then content of its own."""
    segments = [(1000 + group, shared_tokens)] if shared_tokens else []
    segments.append((10_000 + request_no, total_tokens - shared_tokens))
    return SegmentKeys(segments, B, num_shareable_tokens=shared_tokens)


def prefix_segments(segments, num_tokens):
    """The first num_tokens tokens of a segment list."""
    out = []
    for seg_id, length in segments:
        if num_tokens <= 0:
            break
        out.append((seg_id, min(length, num_tokens)))
        num_tokens -= length
    return out


def assert_breakdown_matches_snapshot(alloc):
    """breakdown() (incremental counters) equals a slot count rebuilt from the snapshot."""
    snap = alloc.snapshot()
    bd = alloc.breakdown()
    size = snap.block_size
    if snap.kind == "paged":
        used = snap.ref_cnt > 0
        assert bd["token_states"] == int(snap.fill[used].sum())
        assert bd["cached"] == size * int((snap.cell_class == MEMORY_CLASSES.index("cached")).sum())
    else:
        counts = snap.class_counts()
        assert bd == counts, (bd, counts)


@settings(max_examples=120, deadline=None)
@given(data=st.data(), num_blocks=st.integers(4, 24), caching=st.booleans(),
       null_block=st.booleans())
def test_paged_allocator_matches_vllm_reference(data, num_blocks, caching, null_block):
    alloc = PagedAllocator(num_blocks=num_blocks, block_size=B, enable_prefix_caching=caching,
                           null_block=null_block)
    ref = VllmReference(num_blocks, caching, null_block)
    live, preempted = {}, {}          # seq_id -> keys (live); seq_id -> (keys, num_tokens)
    usable = num_blocks - null_block
    for step in range(data.draw(st.integers(1, 40))):
        ops = ["new", "lookup"] + ["append", "free", "preempt"] * bool(live) + \
            ["resume"] * bool(preempted)
        op = data.draw(st.sampled_from(ops))
        if op in ("new", "lookup"):
            total = data.draw(st.integers(2, 40))
            shared = data.draw(st.integers(0, total - 1))
            keys = request_keys(step, data.draw(st.integers(0, 2)), shared, total)
            prompt = data.draw(st.integers(1, total - 1))
            if op == "lookup":
                assert alloc.lookup(keys, prompt) == len(ref.hit_blocks(keys, prompt)) * B
                assert alloc.blocks_needed(prompt, keys) == ref.blocks_needed(keys, prompt)
                continue
            num_tokens, reserve = prompt, None
        elif op == "resume":
            seq_id = data.draw(st.sampled_from(sorted(preempted)))
            keys, num_tokens = preempted.pop(seq_id)
            reserve = None
        else:
            seq_id = data.draw(st.sampled_from(sorted(live)))
        if op in ("new", "resume"):
            if op == "new":
                seq_id = step
                if data.draw(st.booleans()):     # chunked admission: the whole prompt must fit
                    reserve, num_tokens = num_tokens, data.draw(st.integers(1, num_tokens))
            if -(-max(num_tokens, reserve or 0) // B) > usable:
                continue                          # could never fit: covered by a ValueError test
            ok = alloc.allocate(seq_id, num_tokens, keys, num_reserve_tokens=reserve)
            assert ok == ref.allocate(seq_id, num_tokens, keys, reserve)
            if ok:
                live[seq_id] = keys
                assert alloc.num_cached_tokens(seq_id) == ref.hit_tokens[seq_id]
            elif op == "resume":
                preempted[seq_id] = (keys, num_tokens)
        elif op == "append":
            room = live[seq_id].num_tokens - alloc.num_tokens(seq_id)
            if room > 0:
                n = data.draw(st.integers(1, room))
                assert alloc.append(seq_id, n) == ref.append(seq_id, n)
        else:
            preempted_now = op == "preempt"
            if preempted_now:
                preempted[seq_id] = (live[seq_id], alloc.num_tokens(seq_id))
            alloc.free(seq_id, preempted=preempted_now)
            ref.free(seq_id, preempted_now)
            del live[seq_id]
        assert {s: alloc.block_table(s) for s in live} == ref.tables
        assert alloc.pool.free_queue() == ref.queue
        assert (alloc.num_queried_tokens, alloc.num_hit_tokens) == (ref.queries, ref.hits)
        assert (alloc.num_preempted_queried_tokens, alloc.num_preempted_hit_tokens) == \
            (ref.preempted_queries, ref.preempted_hits)
        alloc.check_invariants()
        assert_breakdown_matches_snapshot(alloc)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), num_blocks=st.integers(2, 20), caching=st.booleans())
def test_paged_allocator_invariants_with_fork_and_copy_on_write(data, num_blocks, caching):
    alloc = PagedAllocator(num_blocks=num_blocks, block_size=B, enable_prefix_caching=caching)
    live = {}
    for step in range(data.draw(st.integers(1, 40))):
        op = data.draw(st.sampled_from(["new"] + ["append", "fork", "free"] * bool(live)))
        if op == "new":
            total = data.draw(st.integers(1, 30))
            shared = data.draw(st.integers(0, total))
            group = data.draw(st.integers(0, 1))
            segments = ([(1000 + group, shared)] if shared else []) + \
                [(10_000 + step, total + 30 - shared)]
            keys = SegmentKeys(segments, B, num_shareable_tokens=shared)
            n = data.draw(st.integers(0, min(total, num_blocks * B)))
            before = alloc.snapshot()
            if alloc.allocate(step, n, keys):
                live[step] = segments
            else:   # "does not fit" changes nothing
                after = alloc.snapshot()
                assert np.array_equal(before.ref_cnt, after.ref_cnt)
                assert np.array_equal(before.block_key, after.block_key)
            continue
        seq_id = data.draw(st.sampled_from(sorted(live)))
        if op == "append":
            table = alloc.block_table(seq_id)
            if not alloc.append(seq_id, data.draw(st.integers(0, 9))):
                assert alloc.block_table(seq_id) == table
        elif op == "fork":
            # the child's content is the parent's up to the fork, then its own
            segments = prefix_segments(live[seq_id], alloc.num_tokens(seq_id)) + \
                [(20_000 + step, 30)]
            shared = data.draw(st.integers(0, alloc.num_tokens(seq_id)))
            child_keys = SegmentKeys(segments, B, num_shareable_tokens=shared)
            alloc.fork(seq_id, step, child_keys if data.draw(st.booleans()) else None)
            live[step] = segments
        else:
            alloc.free(seq_id, preempted=data.draw(st.booleans()))
            del live[seq_id]
        alloc.check_invariants()
        assert_breakdown_matches_snapshot(alloc)


@settings(max_examples=120, deadline=None)
@given(data=st.data(), capacity=st.integers(64, 3000),
       policy=st.sampled_from(["max", "pow2", "oracle"]),
       placement=st.sampled_from(["buddy", "first-fit"]))
def test_contiguous_allocator_invariants(data, capacity, policy, placement):
    max_model_len = data.draw(st.integers(16, 512))
    alloc = ContiguousAllocator(capacity, policy, max_model_len, placement)
    live = set()
    for step in range(data.draw(st.integers(1, 40))):
        op = data.draw(st.sampled_from(["new"] + ["append", "free"] * bool(live)))
        if op == "new":
            final = data.draw(st.integers(1, max_model_len))
            prompt = data.draw(st.integers(1, final))
            first = data.draw(st.integers(0, final))   # a first chunk, or a recomputed sequence
            if alloc.extent_tokens(final, num_prompt_tokens=prompt) > capacity:
                continue
            fits = alloc.can_allocate(first, final, num_prompt_tokens=prompt)
            assert alloc.allocate(step, first, final, num_prompt_tokens=prompt) == fits
            if fits:
                live.add(step)
        else:
            seq_id = data.draw(st.sampled_from(sorted(live)))
            if op == "append":
                n = data.draw(st.integers(0, 64))
                before = alloc.num_tokens(seq_id)
                if not alloc.append(seq_id, n):
                    assert alloc.num_tokens(seq_id) == before
            else:
                alloc.free(seq_id)
                live.remove(seq_id)
        alloc.check_invariants()
        assert_breakdown_matches_snapshot(alloc)
        waiting = data.draw(st.integers(1, max_model_len))
        waiting_prompt = data.draw(st.integers(1, waiting))
        bd = alloc.breakdown(waiting, waiting_num_prompt_tokens=waiting_prompt)
        assert sum(bd.values()) == capacity
        snap = alloc.snapshot(waiting, waiting_num_prompt_tokens=waiting_prompt)
        assert bd == snap.class_counts()
    for seq_id in sorted(live):
        alloc.free(seq_id)
    alloc.check_invariants()
    assert alloc.arena.holes() == alloc.__class__(capacity, policy, max_model_len,
                                                  placement).arena.holes()  # fully coalesced


@settings(max_examples=80, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["prepend", "append", "popleft", "remove"]),
                              st.integers(0, 11)), max_size=120))
def test_free_block_queue_matches_a_plain_list(ops):
    queue, model = FreeBlockQueue(range(6), 12), list(range(6))
    queue.trim_after = 2                       # exercise trimming and front growth on small runs
    takeable = set()                           # blocks appended takeable, still queued there
    for op, arg in ops:
        if op in ("prepend", "append"):
            new = [b for b in range(arg, 12) if b not in model][:3]
            if op == "prepend":
                queue.prepend(new)
                model[:0] = new
            else:
                queue.append(new, 0 if arg % 2 == 0 else -1)   # cached (takeable) or not
                model += new
                if arg % 2 == 0:
                    takeable.update(new)
        elif op == "popleft":
            n = min(arg, len(model))
            assert queue.popleft(n)[0] == model[:n]
            takeable.difference_update(model[:n])
            del model[:n]
        elif arg in takeable:
            queue.take(arg)
            model.remove(arg)
            takeable.discard(arg)
        assert list(queue) == model and len(queue) == len(model)
        queue.check_invariants()
