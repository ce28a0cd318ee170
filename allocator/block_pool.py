"""Block pool: ref counts, the free queue and the prefix-cache hash map (vLLM v1's BlockPool).

vLLM keeps one free queue, a doubly linked list that holds both never-cached free blocks and
cached blocks with ref_cnt 0 (eviction candidates)::

    front (popped first)                                              back
    [ uncached free blocks, most recently freed first | cached blocks, least recently used first ]

Freed blocks without a hash are *prepended* (reused first, LIFO), freed blocks with a hash are
*appended* (evicted last, LRU), allocation pops from the front and a prefix hit removes a cached
block from the middle. Because uncached blocks only ever enter at the front and cached ones only
at the back, every uncached free block always precedes every cached one. So the one queue is
exactly two structures back to back, each with only O(1) operations:

* ``_free_stack``: a Python list whose END is the front of the queue (append = prepend, slicing
  the end = popping many blocks at once);
* ``_lru``: an OrderedDict in eviction order (append at the end, pop the first, delete a touched
  block from the middle).

Popping n blocks takes the stack first, then evicts from the LRU end: the same blocks, in the same
order, as vLLM's ``popleft_n``.

The LRU part may also hold full blocks *without* a key: kvsim registers a sequence's private
blocks (content nobody else holds) only when it is preempted, yet vLLM would have hashed them and
appended them at the back; they keep vLLM's eviction order but count as free, not cached.

Hash map: key -> block, or a list of blocks when identical content was computed twice (vLLM
does not de-duplicate, so block ids never change); a lookup returns the earliest inserted.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


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
        self._free_stack = list(range(num_blocks - 1, -1, -1))   # block 0 at the front
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.num_cached_blocks = 0    # blocks in the LRU part that have a key
        self.null_block = self._free_stack.pop() if reserve_null_block else None

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now (evictable cached blocks included)."""
        return len(self._free_stack) + len(self._lru)

    # ---- hash map ------------------------------------------------------------------------
    def get_cached_block(self, key: int) -> int | None:
        """The block registered under ``key`` (the earliest inserted among duplicates)."""
        hit = self._key_to_block.get(key)
        return hit[0] if type(hit) is list else hit

    def register(self, block_id: int, key: int) -> None:
        """Enter a full, in-use block into the hash map (no-op if it already has a key)."""
        if self.block_key[block_id] is not None:
            return
        self.block_key[block_id] = key
        present = self._key_to_block.get(key)
        if present is None:
            self._key_to_block[key] = block_id
        elif type(present) is list:
            present.append(block_id)
        else:
            self._key_to_block[key] = [present, block_id]

    def unregister(self, block_id: int) -> None:
        """Remove a block's key from the hash map (eviction, or retiring a private block)."""
        key = self.block_key[block_id]
        if key is None:
            return
        self.block_key[block_id] = None
        present = self._key_to_block[key]
        if type(present) is list:
            present.remove(block_id)
            if len(present) == 1:
                self._key_to_block[key] = present[0]
        else:
            del self._key_to_block[key]
        if self.ref_cnt[block_id] == 0:   # it sat in the LRU as a cached block
            self.num_cached_blocks -= 1

    # ---- free queue ----------------------------------------------------------------------
    def pop(self, n: int) -> list[int]:
        """Take ``n`` blocks from the front of the free queue (caller checked num_free_blocks).

        Cached blocks popped this way are evicted: their key leaves the hash map.
        """
        stack = self._free_stack
        k = min(n, len(stack))
        blocks = stack[len(stack) - k:]
        del stack[len(stack) - k:]
        blocks.reverse()              # the end of the stack is the front of the queue
        lru = self._lru
        for _ in range(n - k):
            block_id = lru.popitem(last=False)[0]
            if self.block_key[block_id] is not None:
                self.unregister(block_id)
            blocks.append(block_id)
        ref = self.ref_cnt
        for block_id in blocks:
            ref[block_id] = 1
        return blocks

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on prefix-hit blocks; cached ones leave the free queue."""
        ref = self.ref_cnt
        for block_id in blocks:
            if ref[block_id] == 0:
                del self._lru[block_id]
                self.num_cached_blocks -= 1
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
        ref = self.ref_cnt
        reuse_first = []
        for block_id in blocks_tail_first[:num_reuse_first]:
            ref[block_id] -= 1
            if not ref[block_id]:
                reuse_first.append(block_id)
        # prepending [a, b] puts a at the very front: the stack's end is the front
        reuse_first.reverse()
        self._free_stack.extend(reuse_first)
        lru, key = self._lru, self.block_key
        for block_id in blocks_tail_first[num_reuse_first:]:
            ref[block_id] -= 1
            if not ref[block_id]:
                lru[block_id] = None
                if key[block_id] is not None:
                    self.num_cached_blocks += 1

    # ---- checks --------------------------------------------------------------------------
    def free_queue(self) -> list[int]:
        """The free queue as vLLM would hold it, front (next popped) first. O(free blocks)."""
        return self._free_stack[::-1] + list(self._lru)

    def check_invariants(self) -> None:
        """Recompute the free queue and hash-map bookkeeping from scratch and assert it."""
        queue = self.free_queue()
        assert len(set(queue)) == len(queue), "a block is in the free queue twice"
        assert self.null_block not in queue, "the null block is in the free queue"
        for block_id in queue:
            assert self.ref_cnt[block_id] == 0, f"free block {block_id} has ref_cnt > 0"
        for block_id in self._free_stack:
            assert self.block_key[block_id] is None, f"reuse-first block {block_id} has a key"
        in_use = self.num_blocks - len(queue) - (self.null_block is not None)
        assert in_use == sum(r > 0 for r in self.ref_cnt), "free + used != total"
        cached = sum(self.block_key[b] is not None for b in self._lru)
        assert cached == self.num_cached_blocks, f"{cached} cached, counter {self.num_cached_blocks}"
        num_keyed = 0
        for key, present in self._key_to_block.items():
            blocks = present if type(present) is list else [present]
            assert blocks, f"key {key} maps to no block"
            assert len(set(blocks)) == len(blocks), f"key {key} lists a block twice"
            for block_id in blocks:
                assert self.block_key[block_id] == key, f"block {block_id} not keyed {key}"
            num_keyed += len(blocks)
        assert num_keyed == sum(k is not None for k in self.block_key), "keys out of sync"
