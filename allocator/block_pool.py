"""Block pool: ref counts, the free queue and the prefix-cache hash map (vLLM v1's BlockPool).

Free queue. vLLM links free blocks in one doubly linked list that holds both never-cached blocks
and cached blocks with ref_cnt 0 (eviction candidates)::

    front (allocated first)                                            back
    [ uncached blocks, most recently freed first | cached blocks, least recently used first ]

* allocation pops n blocks from the front (a cached block popped this way is evicted: its key
  leaves the hash map);
* a freed block without a hash is *prepended* (reused first: LIFO), a freed block with a hash is
  *appended* (evicted last: LRU); a sequence frees its blocks tail first, so its tail is evicted
  before its head;
* a prefix hit on a cached block with ref_cnt 0 takes it out of the middle (``touch``).

Uncached blocks only ever enter at the front and cached ones at the back, so all uncached free
blocks always precede all cached ones (a stack in front of an LRU list). FreeBlockQueue keeps
the whole queue in one Python list with a head index, so that each operation is one C-level
list operation however many blocks it moves: popping n blocks is one slice, prepending writes into
the consumed slots just before the head, appending extends the end, and a removal from the middle
only marks the entry stale (pops skip it).

The back of the queue may also hold full blocks *without* a key: kvsim registers a sequence's
private blocks (content nobody else holds) only when it is preempted, yet vLLM would have hashed
them and appended them at the back; they keep vLLM's eviction order but count as free, not cached.

Hash map: key -> block, or a list of blocks when identical content was computed twice (vLLM
does not de-duplicate, so block ids never change); a lookup returns the earliest inserted.

Segment runs. Keys that come as content segments (``workloads.keys.SegmentKeys``: a Mooncake
hash id is 512 tokens, 32 blocks of 16) are kept at that granularity: one ``_Segment`` per
segment chain holds the blocks registered under it in a list indexed by their place in the
segment (``slots[j]``), so that matching, registering and evicting a run of blocks that share
a segment is one dict look-up and one C-level slice instead of one 64-bit key (hashing, a dict
entry) per block. A block's key is still the same number (``key_of``: computed when asked, for
snapshots), and each block still has its own ref count, free-queue place and key, so the
semantics are the per-block ones above. A pool keys by segment until the first key given as a
plain number (``register_many`` / ``get_cached_block``); then it converts every segment entry
into its numbered key once (``int_keys``) and stays numbered, so keys given both ways always
match each other.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from operator import itemgetter

from kvsim.workloads.keys import segment_key


def _read(values: list, indices: list[int]) -> Sequence:
    """``[values[i] for i in indices]`` (as a tuple), the loop in C."""
    if len(indices) > 1:
        return itemgetter(*indices)(values)
    return [values[i] for i in indices]


class _Batch:
    """Blocks one ``append`` put at the back, at positions ``[start, stop)`` (``start`` moves up
    as the front consumes it), some of them cached (keyed): those at ``[keyed_from, stop)``,
    or (``keyed_from`` None) any, to be read block by block. ``num_taken`` of its entries were
    taken out since (stale)."""

    __slots__ = ("start", "stop", "keyed_from", "num_taken")

    def __init__(self, start: int, stop: int, keyed_from: int | None):
        self.start, self.stop, self.keyed_from, self.num_taken = start, stop, keyed_from, 0


class FreeBlockQueue:
    """vLLM's free block queue as a list with a head index; O(1) per call, not per block.

    Blocks put at the front (``prepend``) fill the consumed slots before the head; blocks put
    at the back (``append``) extend the list as one batch. Taking a block out of the middle
    (``take``: a prefix hit on a cached free block) only marks it: ``batch_of[b]`` names the
    batch holding a block's live entry, so an entry of batch X is live iff ``batch_of[b] is X``
    and pops skip the others. Only batches with taken entries are read entry by entry::

        _entries  [ .  .  9 | 5  6  3 | 1  4 ]    _head = 2, batches [3, 6) and [6, 8)
                          ^ front      (6 taken: batch_of[6] is None, pops skip it)

    Positions are absolute (``_base`` + list index), so trimming the consumed prefix or growing
    the front never moves a batch.
    """

    trim_after = 4096                 # consumed slots kept before the head (room for prepends)

    def __init__(self, blocks: Iterable[int], num_blocks: int):
        self._entries = list(blocks)
        self._head = 0
        self._base = 0
        self._num_stale = 0           # taken entries the head has not passed yet
        self._batches: deque[_Batch] = deque()    # unconsumed batches, front first
        self.batch_of: list[_Batch | None] = [None] * num_blocks

    def __len__(self) -> int:
        return len(self._entries) - self._head - self._num_stale

    def __iter__(self) -> Iterator[int]:
        entries, batch_of, base = self._entries, self.batch_of, self._base
        i = self._head
        for batch in list(self._batches):
            yield from entries[i:batch.start - base]          # plain entries before the batch
            i = batch.stop - base
            if not batch.num_taken:
                yield from entries[batch.start - base:i]
                continue
            keyed_from = batch.start if batch.keyed_from is None else batch.keyed_from
            for position in range(batch.start, batch.stop):
                block_id = entries[position - base]
                if position < keyed_from or batch_of[block_id] is batch:
                    yield block_id
        yield from entries[i:]

    def popleft(self, n: int, block_key: list | None = None) -> tuple[list[int], list[int]]:
        """The n blocks at the front (caller checked len), and the cached (keyed) ones among
        them when ``block_key`` is given (else an empty list): from the batches' layout, not
        block by block, unless entries were taken out or a batch is mixed."""
        keyed: list[int] = []
        if not self._num_stale:       # nothing taken out: the n blocks are one slice
            start = self._head
            out = self._entries[start:start + n]
            self._head = start + n
            if block_key is not None and self._batches:
                keyed = self._keyed_in(self._base + start, out, block_key)
        else:
            out = self._popleft_skipping_taken(n)
            if block_key is not None:
                keyed = [b for b in out if block_key[b] is not None]
        batches = self._batches
        if batches:
            position = self._base + self._head
            while batches and batches[0].stop <= position:
                batches.popleft()
            if batches and batches[0].start < position:
                batches[0].start = position
        if self._head > 2 * self.trim_after and 2 * self._head > len(self._entries):
            cut = self._head - self.trim_after    # amortised O(1) per entry
            del self._entries[:cut]
            self._base += cut
            self._head -= cut
        return out, keyed

    def _keyed_in(self, first: int, out: list[int], block_key: list) -> list[int]:
        """The keyed blocks of ``out`` (popped from position ``first`` on, nothing taken):
        only batches hold keyed blocks."""
        end = first + len(out)
        keyed: list[int] = []
        for batch in self._batches:
            if batch.start >= end:
                break
            lo, hi = max(first, batch.start), min(end, batch.stop)
            if batch.keyed_from is None:          # mixed: read block by block
                keyed += [b for b in out[lo - first:hi - first] if block_key[b] is not None]
            elif batch.keyed_from < hi:
                keyed += out[max(lo, batch.keyed_from) - first:hi - first]
        return keyed

    def _popleft_skipping_taken(self, n: int) -> list[int]:
        entries, base, batch_of = self._entries, self._base, self.batch_of
        out: list[int] = []
        for batch in list(self._batches):
            stop = batch.start - base          # the prepended stack before this batch
            if self._head < stop:
                k = min(n - len(out), stop - self._head)
                out += entries[self._head:self._head + k]
                self._head += k
            if len(out) == n:
                return out
            stop = batch.stop - base
            if not batch.num_taken:
                k = min(n - len(out), stop - self._head)
                out += entries[self._head:self._head + k]
                self._head += k
            else:
                i = self._head
                # entries before keyed_from were never cached, so never taken out
                keyed_from = batch.start if batch.keyed_from is None else batch.keyed_from
                while i < stop and len(out) < n:
                    block_id = entries[i]
                    if i + base < keyed_from or batch_of[block_id] is batch:
                        out.append(block_id)
                    else:
                        batch.num_taken -= 1
                        self._num_stale -= 1
                    i += 1
                self._head = i
            if len(out) == n:
                return out
        k = n - len(out)                       # past the last batch: the rest is plain
        out += entries[self._head:self._head + k]
        self._head += k
        return out

    def prepend(self, blocks: list[int]) -> None:
        """Put blocks at the front, ``blocks[0]`` first."""
        k = len(blocks)
        if k > self._head:            # no consumed slots left: grow the front (doubling)
            room = k + len(self._entries)
            self._entries[:0] = [-1] * room
            self._head += room
            self._base -= room
        self._head -= k
        self._entries[self._head:self._head + k] = blocks

    def append(self, blocks: list[int], keyed_from: int | None = -1) -> None:
        """Put blocks at the back, ``blocks[-1]`` last. Which are cached (keyed: a prefix hit
        may take them out of the middle, a pop evicts them): ``keyed_from`` -1 none,
        ``k`` >= 0 ``blocks[k:]`` exactly, None any (read block by block).

        ``batch_of`` notes the batch of each entry that may be taken out (a keyed one; every
        entry of a mixed batch): an entry at or past ``keyed_from`` is live iff its block's
        ``batch_of`` is its batch (``take`` clears it)."""
        if not blocks:
            return
        end = self._base + len(self._entries)
        self._entries += blocks
        if keyed_from == -1 or keyed_from == len(blocks):
            return                    # nothing cached: no batch (its entries stay plain)
        batch = _Batch(end, end + len(blocks), None if keyed_from is None else end + keyed_from)
        self._batches.append(batch)
        batch_of = self.batch_of
        for block_id in (blocks if keyed_from is None else blocks[keyed_from:]):
            batch_of[block_id] = batch


    def unkey(self, block_id: int) -> None:
        """A queued cached block lost its key: its batch is read block by block from now on
        (every entry then notes its batch)."""
        batch = self.batch_of[block_id]
        if batch is not None and batch.keyed_from is not None:
            base = self._base
            for position in range(batch.start, batch.keyed_from):
                self.batch_of[self._entries[position - base]] = batch
            batch.keyed_from = None

    def take(self, block_id: int) -> None:
        """Take a queued block out of the middle (it was appended ``takeable``)."""
        batch = self.batch_of[block_id]
        batch.num_taken += 1
        self.batch_of[block_id] = None
        self._num_stale += 1

    def check_invariants(self) -> None:
        """Taken entries are counted; no block is queued twice; batches are in order."""
        live = list(self)
        assert len(set(live)) == len(live), "a block is queued twice"
        assert len(live) == len(self), f"{len(live)} live entries, length {len(self)}"
        position = self._base + self._head
        for batch in self._batches:
            assert position <= batch.start < batch.stop, "batches out of order"
            position = batch.stop
        assert sum(b.num_taken for b in self._batches) == self._num_stale, \
            "taken entries out of sync"


class _Segment:
    """Blocks registered under one segment chain (see the module doc, "Segment runs").

    ``slots[j]``: the block holding the segment's block ``j`` (its last token at offset
    ``j * block_size + first_offset``), a list of blocks if that content was registered more
    than once (earliest first), or -1."""

    __slots__ = ("chain", "first_offset", "block_size", "slots", "num_blocks", "num_multi")

    def __init__(self, chain: int, first_offset: int, block_size: int):
        self.chain = chain
        self.first_offset = first_offset
        self.block_size = block_size
        self.slots: list = []
        self.num_blocks = 0          # blocks registered here (duplicates included)
        self.num_multi = 0           # slots holding a list

    def key(self, j: int) -> int:
        return segment_key(self.chain, j * self.block_size + self.first_offset)

    def slot_of(self, block_id: int) -> int:
        """The slot holding ``block_id`` (a C-level scan of at most a segment's blocks)."""
        try:
            return self.slots.index(block_id)
        except ValueError:               # one of several blocks with the same content
            return next(j for j, present in enumerate(self.slots)
                        if type(present) is list and block_id in present)


class BlockPool:
    """Fixed set of blocks ``0..num_blocks-1`` with ref counts, free queue and hash map.

    Args:
        num_blocks: blocks in the pool.
        reserve_null_block: pop block 0 at start-up as vLLM's null block (never freed).
    """

    def __init__(self, num_blocks: int, reserve_null_block: bool = False):
        if num_blocks < 1 + reserve_null_block:
            raise ValueError(f"num_blocks must be >= {1 + reserve_null_block}, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        # per block: None (no key), its key (an int) or the _Segment it is registered in;
        # key_of(b) gives the number either way
        self.block_key: list = [None] * num_blocks
        self._key_to_block: dict[int, int | list[int]] = {}
        self._segments: dict[int, _Segment] = {}
        self.int_keys = False               # a key came as a number: no segment entries (doc)
        self.num_keyed_blocks = 0           # blocks with a key (in use or cached)
        self._free_queue = FreeBlockQueue(range(num_blocks), num_blocks)   # block 0 at the front
        self.num_free_blocks = num_blocks   # allocatable now, evictable cached blocks included
        self.num_cached_blocks = 0          # free blocks that have a key (evictable)
        self.num_popped_blocks = 0          # blocks handed out since start-up (allocations)
        # a list: every block handed out to a request (popped or hit) is appended (vLLM's
        # new block ids of a step, which an offloading connector checks); None: not recorded
        self.handed_out: list[int] | None = None
        self.map_version = 0                # bumped whenever the hash map changes
        self.null_block = None
        if reserve_null_block:        # never freed, never counted (vLLM keeps no ref_cnt on it)
            self.null_block = self._free_queue.popleft(1)[0][0]
            self.num_free_blocks -= 1

    # ---- hash map ------------------------------------------------------------------------
    def get_cached_block(self, key: int) -> int | None:
        """The block registered under ``key`` (the earliest inserted among duplicates)."""
        if not self.int_keys:
            self._to_int_keys()
        hit = self._key_to_block.get(key)
        return hit[0] if type(hit) is list else hit

    @property
    def has_keys(self) -> bool:
        """Whether any block is registered (if not, every prefix lookup misses)."""
        return self.num_keyed_blocks > 0

    def key_of(self, block_id: int) -> int | None:
        """The key block ``block_id`` is registered under, or None."""
        key = self.block_key[block_id]
        if type(key) is _Segment:
            return key.key(key.slot_of(block_id))
        return key

    def register(self, block_id: int, key: int) -> None:
        """Enter a full, in-use block into the hash map (no-op if it already has a key)."""
        self.register_many((block_id,), (key,))

    def register_many(self, block_ids: Iterable[int], keys: Iterable[int]) -> None:
        """``register`` each block under its key, in order (a prefill fills many blocks at once:
        one call instead of one per block)."""
        if not self.int_keys:
            self._to_int_keys()
        block_key, key_to_block = self.block_key, self._key_to_block
        num_new = 0
        for block_id, key in zip(block_ids, keys):
            if block_key[block_id] is not None:
                continue
            block_key[block_id] = key
            num_new += 1
            present = key_to_block.get(key)
            if present is None:
                key_to_block[key] = block_id
            elif type(present) is list:
                present.append(block_id)
            else:
                key_to_block[key] = [present, block_id]
        self.num_keyed_blocks += num_new
        self.map_version += 1

    def segment_hits(self, runs: Sequence[tuple[int, int, int, int, int]]) -> list[int]:
        """The longest run of registered blocks from the start of ``runs``
        (``SegmentKeys.segment_runs``): per segment one look-up and one slice."""
        hits: list[int] = []
        segments = self._segments
        for chain, _first_offset, j, i, i_end in runs:
            seg = segments.get(chain)
            if seg is None:
                break
            n = i_end - i
            part = seg.slots[j:j + n]
            k = part.index(-1) if -1 in part else len(part)
            if seg.num_multi:
                part = [b if type(b) is int else b[0] for b in part[:k]]
            elif k < len(part):
                part = part[:k]
            hits += part
            if k < n:
                break
        return hits

    def register_runs(self, table: list[int], runs: Sequence[tuple[int, int, int, int, int]],
                      block_size: int, unkeyed: bool = False) -> None:
        """``register`` ``table[i:i_end]`` as the blocks ``j, j+1, ...`` of each run's segment
        (``SegmentKeys.segment_runs``): one slice per run, no key computed.

        Args:
            unkeyed: the caller knows that none of these blocks has a key (it took them from
                the free queue itself and never registered them), so that check is skipped.
        """
        block_key, segments = self.block_key, self._segments
        num_new = 0
        for chain, first_offset, j, i, i_end in runs:
            block_ids = table[i:i_end]
            seg = segments.get(chain)
            if seg is None and (unkeyed or not any(map(block_key.__getitem__, block_ids))):
                # the usual case: content nobody registered, in blocks without a key
                seg = segments[chain] = _Segment(chain, first_offset, block_size)
                seg.slots = [-1] * j + block_ids if j else block_ids
                for block_id in block_ids:
                    block_key[block_id] = seg
                seg.num_blocks = len(block_ids)
                num_new += len(block_ids)
            else:
                num_new += self._register_run(seg, chain, first_offset, block_size, j,
                                              block_ids)
        self.num_keyed_blocks += num_new
        self.map_version += 1

    def _register_run(self, seg: _Segment | None, chain: int, first_offset: int,
                      block_size: int, j: int, block_ids: list[int]) -> int:
        """One run into an existing segment (or blocks that may have keys): returns the
        blocks newly keyed."""
        if seg is None:
            seg = self._segments[chain] = _Segment(chain, first_offset, block_size)
        slots, block_key = seg.slots, self.block_key
        n = len(block_ids)
        end = j + n
        if len(slots) < end:
            slots += [-1] * (end - len(slots))
        if not any(map(block_key.__getitem__, block_ids)) and slots[j:end].count(-1) == n:
            slots[j:end] = block_ids          # new content for these slots, blocks unkeyed
            for block_id in block_ids:
                block_key[block_id] = seg
            num_new = n
        else:
            num_new = 0
            for jj, block_id in enumerate(block_ids, j):
                if block_key[block_id] is not None:
                    continue                  # registered already (a hit, a fork's parent)
                block_key[block_id] = seg
                num_new += 1
                present = slots[jj]
                if present == -1:
                    slots[jj] = block_id
                elif type(present) is list:
                    present.append(block_id)
                else:
                    slots[jj] = [present, block_id]
                    seg.num_multi += 1
        seg.num_blocks += num_new
        if not seg.num_blocks:
            del self._segments[chain]
        return num_new

    def unregister(self, block_id: int) -> None:
        """Remove a block's key from the hash map (eviction, or retiring a private block)."""
        if self.block_key[block_id] is None:
            return
        self._drop_keys([block_id])
        if self.ref_cnt[block_id] == 0:   # it sat in the free queue as a cached block
            self.num_cached_blocks -= 1
            self._free_queue.unkey(block_id)

    def _drop_keys(self, block_ids: list[int], clear: bool = True) -> None:
        """Remove keyed blocks from the hash map (no counters but the map's). Blocks of one
        segment that follow each other (a freed table's, tail first) are dropped as one run.
        ``clear`` False: the caller sets their ``block_key`` to None itself (after this)."""
        block_key = self.block_key
        if self.int_keys:
            key_to_block = self._key_to_block
            for block_id in block_ids:
                key = block_key[block_id]
                present = key_to_block[key]
                if type(present) is list:
                    present.remove(block_id)
                    if len(present) == 1:
                        key_to_block[key] = present[0]
                else:
                    del key_to_block[key]
        else:
            segments = self._segments
            i, n = 0, len(block_ids)
            while i < n:
                block_id = block_ids[i]
                seg = block_key[block_id]
                slots = seg.slots
                if seg.num_multi:             # one of several blocks with the same content
                    j = seg.slot_of(block_id)
                    present = slots[j]
                    if type(present) is list:
                        present.remove(block_id)
                        if len(present) == 1:
                            slots[j] = present[0]
                            seg.num_multi -= 1
                    else:
                        slots[j] = -1
                    run = 1
                elif block_ids[i:i + seg.num_blocks] == slots[seg.num_blocks - 1::-1]:
                    # the usual case: the segment's blocks, all of them (slots m-1 .. 0, tail
                    # first, as a freed table's): the whole entry goes
                    run = seg.num_blocks
                else:
                    # part of a segment, tail first: slots j, j-1, ... of it
                    j = slots.index(block_id)
                    got = block_ids[i:i + j + 1]
                    run = len(got)
                    want = slots[j - run + 1:j + 1]
                    want.reverse()
                    if got != want:
                        run = 1
                        while got[run] == want[run]:
                            run += 1
                    slots[j - run + 1:j + 1] = [-1] * run
                seg.num_blocks -= run
                if not seg.num_blocks:
                    del segments[seg.chain]
                i += run
        if clear:
            for block_id in block_ids:
                block_key[block_id] = None
        self.num_keyed_blocks -= len(block_ids)
        self.map_version += 1

    def _to_int_keys(self) -> None:
        """Key every block by its number from now on (see the module doc)."""
        self.int_keys = True
        if not self._segments:
            return
        block_key, key_to_block = self.block_key, self._key_to_block
        for seg in self._segments.values():
            for j, present in enumerate(seg.slots):
                if present == -1:
                    continue
                key = seg.key(j)
                key_to_block[key] = present    # lists stay earliest-first (no int keys yet)
                for block_id in (present if type(present) is list else (present,)):
                    block_key[block_id] = key
        self._segments.clear()
        self.map_version += 1

    # ---- free queue ----------------------------------------------------------------------
    def pop(self, n: int) -> list[int]:
        """Take ``n`` blocks from the front of the free queue (caller checked num_free_blocks).

        Cached blocks popped this way are evicted: their key leaves the hash map.
        """
        # cached blocks popped: their content is gone (evicted)
        blocks, evicted = self._free_queue.popleft(
            n, self.block_key if self.num_cached_blocks else None)
        ref = self.ref_cnt
        if evicted:
            self._evicting(evicted)
            # one loop for refs and keys: the other popped blocks have no key already
            block_key = self.block_key
            self._drop_keys(evicted, clear=False)
            for block_id in blocks:
                ref[block_id] = 1
                block_key[block_id] = None
            self.num_cached_blocks -= len(evicted)
        else:
            for block_id in blocks:
                ref[block_id] = 1
        self.num_free_blocks -= n
        self.num_popped_blocks += n
        if self.handed_out is not None:
            self.handed_out += blocks
        return blocks

    def _evicting(self, block_ids: list[int]) -> None:
        """Hook: ``pop`` is about to evict these cached free blocks (their keys still set).
        Eviction goes by run, not through ``unregister``; a subclass counting cached blocks
        by some property of theirs overrides this."""

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on prefix-hit blocks; cached ones leave the free queue."""
        ref = self.ref_cnt
        if self.handed_out is not None:
            blocks = list(blocks)         # read twice
            self.handed_out += blocks
        for block_id in blocks:
            if ref[block_id] == 0:        # a cached block waiting in the free queue
                self._free_queue.take(block_id)
                self.num_cached_blocks -= 1
                self.num_free_blocks -= 1
            ref[block_id] += 1

    def free(self, blocks_tail_first: list[int], num_reuse_first: int,
             num_keyed: int | None = None, num_shared_head: int | None = None) -> None:
        """Drop a reference on each block; blocks reaching zero join the free queue.

        Args:
            blocks_tail_first: blocks in eviction priority (a sequence's table reversed, so
                that its tail blocks are evicted before its head).
            num_reuse_first: the first this-many blocks (vLLM: blocks without a hash, i.e. a
                partially filled tail, or all blocks without prefix caching) go to the front of
                the queue; the rest go to the back, in the given order (LRU). They must have
                no key.
            num_keyed: when the caller knows it: the last this-many blocks have a key and the
                others none (a table's keyed head); used when the released blocks are the
                first ones of the list, else the keys are read block by block
                (check_invariants verifies the queue against the keys).
            num_shared_head: when the caller knows it: only the last this-many blocks can be
                held by anyone else (a table's keyed or hit head); the others are the caller's
                own (ref 1), so their counts are not read.
        """
        ref = self.ref_cnt
        num_first = num_reuse_first
        num_own = 0 if num_shared_head is None else len(blocks_tail_first) - num_shared_head
        counts = _read(ref, blocks_tail_first[num_own:] if num_own else blocks_tail_first)
        num_released = counts.count(1)
        tail_released = counts[:num_released].count(1) == num_released
        num_released += num_own
        if tail_released:
            # the usual case: the blocks released are the first ones (a table's tail; the
            # rest, its head, is shared: a prompt others hit), so release them with one
            # store each and count down only the shared ones
            released = blocks_tail_first[:num_released]
            for block_id in released:
                ref[block_id] = 0
            for block_id in blocks_tail_first[num_released:]:
                ref[block_id] -= 1
            reuse_first = released[:num_first]
            reuse_last = released[num_first:]
            if num_keyed is not None:     # keyed: the table's head, i.e. the list's end
                num_keyed = max(0, num_keyed - (len(blocks_tail_first) - num_released))
        else:
            # a block appears at most once in the list, so decrement everything first and
            # then keep those that reached zero (two tight loops instead of one with appends)
            for block_id in blocks_tail_first:
                ref[block_id] -= 1
            reuse_first = [b for b in blocks_tail_first[:num_first] if not ref[b]]
            reuse_last = [b for b in blocks_tail_first[num_first:] if not ref[b]]
            num_keyed = None
        queue = self._free_queue
        if self.num_keyed_blocks and reuse_first and any(map(self.block_key.__getitem__,
                                                             reuse_first)):
            raise ValueError("free: a block with a key cannot go to the front of the queue")
        queue.prepend(reuse_first)
        if not self.num_keyed_blocks or not reuse_last:
            queue.append(reuse_last)
        elif num_keyed is not None and num_keyed <= len(reuse_last):
            self.num_cached_blocks += num_keyed
            queue.append(reuse_last, len(reuse_last) - num_keyed)
        else:                         # which are cached: read the keys
            key = self.block_key
            flags = [key[b] is not None for b in reuse_last]
            k = flags.count(True)
            self.num_cached_blocks += k
            if flags[len(flags) - k:].count(True) == k:     # a keyed tail (the table's head)
                queue.append(reuse_last, len(reuse_last) - k)
            else:
                queue.append(reuse_last, None)
        self.num_free_blocks += len(reuse_first) + len(reuse_last)

    # ---- checks --------------------------------------------------------------------------
    def free_queue(self) -> list[int]:
        """The free queue, front (next allocated) first. O(free blocks)."""
        return list(self._free_queue)

    def next_popped(self, n: int) -> list[int]:
        """The ``n`` blocks the next ``pop`` calls hand out (the free queue's front). O(n)."""
        return list(islice(self._free_queue, n))

    def _check_queue_layout(self) -> None:
        """Cached (keyed) free blocks are exactly where the queue's batches say."""
        q, key = self._free_queue, self.block_key
        entries, base = q._entries, q._base
        in_batch = set()
        for batch in q._batches:
            keyed_from = batch.start if batch.keyed_from is None else batch.keyed_from
            for position in range(batch.start, batch.stop):
                block_id = entries[position - base]
                if position >= keyed_from and q.batch_of[block_id] is not batch:
                    assert batch.num_taken, f"entry {position} stale, nothing taken"
                    continue                          # taken out: stale
                in_batch.add(block_id)
                if key[block_id] is not None:
                    assert q.batch_of[block_id] is batch, f"cached {block_id}: wrong batch"
                if batch.keyed_from is not None:
                    assert (key[block_id] is not None) == (position >= batch.keyed_from), \
                        f"block {block_id} at {position}: keyed != layout {batch.keyed_from}"
        for block_id in q:
            assert block_id in in_batch or key[block_id] is None, \
                f"cached block {block_id} outside the queue's batches"

    def check_invariants(self) -> None:
        """Recompute the free queue and hash-map bookkeeping from scratch and assert it."""
        self._free_queue.check_invariants()
        queue = self.free_queue()
        assert len(set(queue)) == len(queue), "a block is in the free queue twice"
        assert len(queue) == self.num_free_blocks, \
            f"{len(queue)} blocks in the free queue, counter {self.num_free_blocks}"
        assert self.null_block not in queue, "the null block is in the free queue"
        for block_id in queue:
            assert self.ref_cnt[block_id] == 0, f"free block {block_id} has ref_cnt > 0"
        keyed = [self.block_key[b] is not None for b in queue]
        self._check_queue_layout()
        in_use = self.num_blocks - len(queue) - (self.null_block is not None)
        assert in_use == sum(r > 0 for r in self.ref_cnt), "free + used != total"
        assert sum(keyed) == self.num_cached_blocks, \
            f"{sum(keyed)} cached, counter {self.num_cached_blocks}"
        num_keyed = 0
        assert not (self.int_keys and self._segments), "segment entries in a numbered pool"
        for key, present in self._key_to_block.items():
            blocks = present if type(present) is list else [present]
            assert blocks, f"key {key} maps to no block"
            assert len(set(blocks)) == len(blocks), f"key {key} lists a block twice"
            for block_id in blocks:
                assert self.block_key[block_id] == key, f"block {block_id} not keyed {key}"
            num_keyed += len(blocks)
        for chain, seg in self._segments.items():
            assert seg.chain == chain and seg.num_blocks > 0, f"segment {chain} is stale"
            num_blocks = num_multi = 0
            for j, present in enumerate(seg.slots):
                if present == -1:
                    continue
                blocks = present if type(present) is list else [present]
                num_multi += type(present) is list
                assert len(blocks) == len(set(blocks)) and (type(present) is int or
                                                             len(blocks) > 1)
                for block_id in blocks:
                    assert self.block_key[block_id] is seg and seg.slot_of(block_id) == j, \
                        f"block {block_id} not in slot {j} of segment {chain}"
                num_blocks += len(blocks)
            assert (num_blocks, num_multi) == (seg.num_blocks, seg.num_multi), \
                f"segment {chain} counts out of sync"
            num_keyed += num_blocks
        assert num_keyed == sum(k is not None for k in self.block_key) == self.num_keyed_blocks, \
            "keys out of sync"


class PoolQueries:
    """Pool-level queries and vLLM's prefix-cache counters, alike for every allocator over a
    BlockPool (uses ``self.pool`` and ``self.num_usable_blocks``)."""

    def _init_prefix_counters(self) -> None:
        # vLLM's prefix_cache_queries / _hits: tokens of admitted sequences and their hits;
        # re-admissions after a preemption are counted apart, as vLLM does
        self.num_queried_tokens = self.num_hit_tokens = 0
        self.num_preempted_queried_tokens = self.num_preempted_hit_tokens = 0
        self._preempted_seq_ids: set = set()

    def _count_query(self, seq_id, num_tokens: int, num_hit_tokens: int) -> None:
        """Record an admission (prefix caching on)."""
        if seq_id in self._preempted_seq_ids:
            self._preempted_seq_ids.discard(seq_id)
            self.num_preempted_queried_tokens += num_tokens
            self.num_preempted_hit_tokens += num_hit_tokens
        else:
            self.num_queried_tokens += num_tokens
            self.num_hit_tokens += num_hit_tokens

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation could use now, evictable cached blocks included."""
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        """vLLM's kv_cache_usage: 1 - free / usable (cached blocks count as free)."""
        return 1.0 - self.pool.num_free_blocks / self.num_usable_blocks
