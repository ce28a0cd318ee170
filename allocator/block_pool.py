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
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator


class FreeBlockQueue:
    """vLLM's free block queue as a list with a head index; O(1) per call, not per block.

    A block is removed from the middle by its position (absolute: ``_base`` + list index, so
    trimming or growing the consumed prefix of the list never moves it): its entry becomes a
    tombstone (-1) that pops skip::

        _entries  [ .  .  5  6 -1  3  1 ]    _head = 2   ->   queue: 5, 6, 3, 1
                          ^ front
    """

    trim_after = 4096                 # consumed slots kept before the head (room for prepends)

    def __init__(self, blocks: Iterable[int]):
        self._entries = list(blocks)
        self._head = 0
        self._base = 0
        self._num_stale = 0           # tombstones the head has not passed yet

    def __len__(self) -> int:
        return len(self._entries) - self._head - self._num_stale

    def __iter__(self) -> Iterator[int]:
        return (b for b in self._entries[self._head:] if b >= 0)

    def popleft(self, n: int) -> list[int]:
        """The n blocks at the front (caller checked len)."""
        if not self._num_stale:       # no tombstones to skip: the n blocks are one slice
            start = self._head
            out = self._entries[start:start + n]
            self._head = start + n
        else:
            out = self._popleft_skipping_tombstones(n)
        if self._head > 2 * self.trim_after and 2 * self._head > len(self._entries):
            cut = self._head - self.trim_after    # amortised O(1) per entry
            del self._entries[:cut]
            self._base += cut
            self._head -= cut
        return out

    def _popleft_skipping_tombstones(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            start = self._head
            chunk = self._entries[start:start + n - len(out)]
            self._head = start + len(chunk)
            if self._num_stale:       # skip tombstones of blocks removed from the middle
                live = [b for b in chunk if b >= 0]
                self._num_stale -= len(chunk) - len(live)
                chunk = live
            out += chunk
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

    def append(self, blocks: list[int]) -> None:
        """Put blocks at the back, ``blocks[-1]`` last (``blocks[i]`` at position end() + i)."""
        self._entries += blocks

    def end(self) -> int:
        """Position the next appended block will take."""
        return self._base + len(self._entries)

    def remove_at(self, position: int) -> None:
        """Take the block at ``position`` (still queued) out of the middle."""
        self._entries[position - self._base] = -1
        self._num_stale += 1

    def block_at(self, position: int) -> int:
        return self._entries[position - self._base]

    def check_invariants(self) -> None:
        """Tombstones are counted; no block is queued twice."""
        pending = self._entries[self._head:]
        assert pending.count(-1) == self._num_stale, \
            f"{pending.count(-1)} tombstones, counter {self._num_stale}"
        live = [b for b in pending if b >= 0]
        assert len(set(live)) == len(live), "a block is queued twice"


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
        self.block_key: list[int | None] = [None] * num_blocks   # key in the hash map, if any
        self._key_to_block: dict[int, int | list[int]] = {}
        self._free_queue = FreeBlockQueue(range(num_blocks))     # block 0 at the front
        self._queue_pos: dict[int, int] = {}   # cached free block -> its free-queue position
        self.num_free_blocks = num_blocks   # allocatable now, evictable cached blocks included
        self.num_cached_blocks = 0          # free blocks that have a key (evictable)
        self.num_popped_blocks = 0          # blocks handed out since start-up (allocations)
        self.map_version = 0                # bumped whenever the hash map changes
        self.null_block = None
        if reserve_null_block:        # never freed, never counted (vLLM keeps no ref_cnt on it)
            self.null_block = self._free_queue.popleft(1)[0]
            self.num_free_blocks -= 1

    # ---- hash map ------------------------------------------------------------------------
    def get_cached_block(self, key: int) -> int | None:
        """The block registered under ``key`` (the earliest inserted among duplicates)."""
        hit = self._key_to_block.get(key)
        return hit[0] if type(hit) is list else hit

    @property
    def has_keys(self) -> bool:
        """Whether any block is registered (if not, every prefix lookup misses)."""
        return bool(self._key_to_block)

    def register(self, block_id: int, key: int) -> None:
        """Enter a full, in-use block into the hash map (no-op if it already has a key)."""
        self.register_many((block_id,), (key,))

    def register_many(self, block_ids: Iterable[int], keys: Iterable[int]) -> None:
        """``register`` each block under its key, in order (a prefill fills many blocks at once:
        one call instead of one per block)."""
        block_key, key_to_block = self.block_key, self._key_to_block
        for block_id, key in zip(block_ids, keys):
            if block_key[block_id] is not None:
                continue
            block_key[block_id] = key
            present = key_to_block.get(key)
            if present is None:
                key_to_block[key] = block_id
            elif type(present) is list:
                present.append(block_id)
            else:
                key_to_block[key] = [present, block_id]
        self.map_version += 1

    def unregister(self, block_id: int) -> None:
        """Remove a block's key from the hash map (eviction, or retiring a private block)."""
        key = self.block_key[block_id]
        if key is None:
            return
        self.block_key[block_id] = None
        self.map_version += 1
        present = self._key_to_block[key]
        if type(present) is list:
            present.remove(block_id)
            if len(present) == 1:
                self._key_to_block[key] = present[0]
        else:
            del self._key_to_block[key]
        if self.ref_cnt[block_id] == 0:   # it sat in the free queue as a cached block
            self.num_cached_blocks -= 1

    # ---- free queue ----------------------------------------------------------------------
    def pop(self, n: int) -> list[int]:
        """Take ``n`` blocks from the front of the free queue (caller checked num_free_blocks).

        Cached blocks popped this way are evicted: their key leaves the hash map.
        """
        blocks = self._free_queue.popleft(n)
        ref = self.ref_cnt
        if self.num_cached_blocks:
            key = self.block_key
            for block_id in blocks:
                if key[block_id] is not None:   # a cached block: its content is gone
                    self.unregister(block_id)
                ref[block_id] = 1
        else:
            for block_id in blocks:
                ref[block_id] = 1
        self.num_free_blocks -= n
        self.num_popped_blocks += n
        return blocks

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on prefix-hit blocks; cached ones leave the free queue."""
        ref = self.ref_cnt
        for block_id in blocks:
            if ref[block_id] == 0:        # a cached block waiting in the free queue
                self._free_queue.remove_at(self._queue_pos.pop(block_id))
                self.num_cached_blocks -= 1
                self.num_free_blocks -= 1
            ref[block_id] += 1

    def free(self, blocks_tail_first: list[int], num_reuse_first: int) -> None:
        """Drop a reference on each block; blocks reaching zero join the free queue.

        Args:
            blocks_tail_first: blocks in eviction priority (a sequence's table reversed, so
                that its tail blocks are evicted before its head).
            num_reuse_first: the first this-many blocks (vLLM: blocks without a hash, i.e. a
                partially filled tail, or all blocks without prefix caching) go to the front of
                the queue; the rest go to the back, in the given order (LRU).
        """
        ref, key = self.ref_cnt, self.block_key
        # a block appears at most once in the list, so decrement everything first and then
        # keep those that reached zero (two tight loops instead of one with appends)
        for block_id in blocks_tail_first:
            ref[block_id] -= 1
        reuse_first = [b for b in blocks_tail_first[:num_reuse_first] if not ref[b]]
        reuse_last = [b for b in blocks_tail_first[num_reuse_first:] if not ref[b]]
        if self._key_to_block:        # some block has a key: note where cached ones queue
            end = self._free_queue.end()
            queue_pos = self._queue_pos
            num_cached = 0
            for i, block_id in enumerate(reuse_last):
                if key[block_id] is not None:   # cached: a prefix hit may take it back out
                    queue_pos[block_id] = end + i
                    num_cached += 1
            self.num_cached_blocks += num_cached
        self._free_queue.prepend(reuse_first)
        self._free_queue.append(reuse_last)
        self.num_free_blocks += len(reuse_first) + len(reuse_last)

    # ---- checks --------------------------------------------------------------------------
    def free_queue(self) -> list[int]:
        """The free queue, front (next allocated) first. O(free blocks)."""
        return list(self._free_queue)

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
        for block_id, is_keyed in zip(queue, keyed):
            if is_keyed:
                position = self._queue_pos[block_id]
                assert self._free_queue.block_at(position) == block_id, \
                    f"cached block {block_id} is not at its free-queue position {position}"
        in_use = self.num_blocks - len(queue) - (self.null_block is not None)
        assert in_use == sum(r > 0 for r in self.ref_cnt), "free + used != total"
        assert sum(keyed) == self.num_cached_blocks, \
            f"{sum(keyed)} cached, counter {self.num_cached_blocks}"
        num_keyed = 0
        for key, present in self._key_to_block.items():
            blocks = present if type(present) is list else [present]
            assert blocks, f"key {key} maps to no block"
            assert len(set(blocks)) == len(blocks), f"key {key} lists a block twice"
            for block_id in blocks:
                assert self.block_key[block_id] == key, f"block {block_id} not keyed {key}"
            num_keyed += len(blocks)
        assert num_keyed == sum(k is not None for k in self.block_key), "keys out of sync"


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
