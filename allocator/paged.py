"""PagedAllocator: per-sequence block tables over a BlockPool, with prefix caching and fork/CoW.

A sequence of ``num_tokens`` tokens holds ``ceil(num_tokens / block_size)`` blocks anywhere in the
pool; token ``i`` lives in slot ``block_table[i // B] * B + i % B``::

    block_table = [7, 2, 9]        B = 4, num_tokens = 10
    tokens       0 1 2 3 | 4 5 6 7 | 8 9 . .
    blocks          7    |    2    |    9        slots 28..31, 8..11, 36..37 (+2 unused)

Prefix caching follows vLLM v1 (``kv_cache_manager.py``, ``single_type_kv_cache_manager.py``):

* Only full blocks are cached, under a chained key (``block_hashes[i]`` names tokens
  ``[0, (i+1)*B)``). A block is registered as soon as all its slots are allocated (vLLM caches at
  schedule time).
* A new sequence reuses the longest run of cached blocks from its start, capped at
  ``num_tokens - 1`` tokens: the last token is always recomputed (its logits are needed), so a
  full hit recomputes one whole block, and a shared prefix shorter than a block never hits.
* A hit on a cached block with ref_cnt 0 pulls it out of the free queue (``touch``), so it uses
  up a free block just like a new one: ``blocks_needed`` counts it.
* Freeing releases a sequence's blocks tail first: a partial tail goes to the front of the free
  queue (reused first), full blocks to the back (evicted least recently used first).

Private blocks: ``block_hashes`` may say (``num_shareable_blocks``) that blocks past some index
hold content nobody else has. Registering them would only cost time, so they are registered only
when the sequence is preempted (a re-admitted request then hits its own blocks, as in vLLM); on a
normal free they take the same place in the LRU as in vLLM but count as free, not cached.

``fork`` shares every block of the parent (parallel sampling, beam search); appending to a shared
partially filled block first copies it (copy-on-write).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np

from kvsim.allocator.accounting import (MEMORY_CLASSES, TOKEN_STATES, PoolSnapshot,
                                        check_breakdown, pool_cells)
from kvsim.allocator.block_pool import BlockPool, PoolQueries
from kvsim.allocator.checks import (owner_codes, require_int, require_live, require_new_seq_id,
                                    snapshot_order)
from kvsim.workloads.keys import SegmentKeys


class _Seq:
    __slots__ = ("block_table", "num_tokens", "num_cached_tokens", "block_hashes",
                 "num_hashes", "num_shareable_blocks", "num_keyed_blocks", "num_hit_blocks",
                 "forked")

    def __init__(self, block_table, num_tokens, num_cached_tokens, block_hashes, num_hashes,
                 num_shareable_blocks, num_keyed_blocks, num_hit_blocks):
        self.block_table: list[int] = block_table
        self.num_tokens = num_tokens
        self.num_cached_tokens = num_cached_tokens      # prompt tokens served by prefix hits
        self.block_hashes = block_hashes                # lazy Sequence[int] or None
        self.num_hashes = num_hashes                    # full blocks with a known key
        self.num_shareable_blocks = num_shareable_blocks  # registered eagerly below this index
        self.num_keyed_blocks = num_keyed_blocks        # leading full blocks already considered
        self.num_hit_blocks = num_hit_blocks            # leading blocks taken from the cache
        # shares blocks with a fork parent or child: any of its blocks may have been keyed by
        # the other (otherwise blocks past num_hit_blocks are its own, keyed only by itself)
        self.forked = False


class PagedAllocator(PoolQueries):
    """vLLM-style paged KV-cache allocator.

    Args:
        num_blocks: blocks in the pool (vLLM's num_gpu_blocks).
        block_size: tokens per block, a power of two.
        enable_prefix_caching: reuse cached full blocks across sequences.
        null_block: reserve block 0 as vLLM's null block (N-1 usable, usage over N-1).
    """

    def __init__(self, num_blocks: int, block_size: int = 16,
                 enable_prefix_caching: bool = True, null_block: bool = False):
        block_size = require_int("block_size", block_size, 1)
        if block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {block_size}")
        num_blocks = require_int("num_blocks", num_blocks, 1 + bool(null_block))
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.null_block = null_block
        self.num_usable_blocks = num_blocks - bool(null_block)
        self.pool = BlockPool(num_blocks, reserve_null_block=null_block)
        self._seqs: dict[int, _Seq] = {}
        self._num_filled_slots = 0      # sum over in-use blocks of slots holding tokens
        self._init_prefix_counters()
        # last prefix scan (admission asks lookup, blocks_needed and allocate in a row):
        # (block_hashes, pool.map_version, blocks scanned, hits)
        self._last_scan: tuple | None = None

    # ---- queries ---------------------------------------------------------------------------
    @property
    def seq_ids(self) -> list[Hashable]:
        return list(self._seqs)

    def ref_cnt(self, block_id: int) -> int:
        return self.pool.ref_cnt[block_id]

    def block_table(self, seq_id: Hashable) -> list[int]:
        return list(self._seq(seq_id).block_table)

    def num_tokens(self, seq_id: Hashable) -> int:
        return self._seq(seq_id).num_tokens

    def num_cached_tokens(self, seq_id: Hashable) -> int:
        """Tokens this sequence got from the prefix cache when it was allocated."""
        return self._seq(seq_id).num_cached_tokens

    def slot_mapping(self, seq_id: Hashable) -> list[int]:
        """Slot of every token: ``block_table[i // B] * B + i % B`` (per token: for kernels)."""
        seq = self._seq(seq_id)
        table, size = seq.block_table, self.block_size
        shift, mask = size.bit_length() - 1, size - 1
        return [table[i >> shift] * size + (i & mask) for i in range(seq.num_tokens)]

    def lookup(self, block_hashes: Sequence[int] | None, num_tokens: int,
               after_popping: int = 0) -> int:
        """Tokens a new sequence of ``num_tokens`` would get from the cache (no side effect);
        ``after_popping``: once that many blocks have been handed out first (the free queue's
        front: cached blocks there are evicted, and the hit ends before the first of them)."""
        if type(num_tokens) is not int or num_tokens < 0:
            num_tokens = require_int("num_tokens", num_tokens)
        hits = self._find_hits(block_hashes, num_tokens)
        if after_popping and hits:
            evicted = set(self.pool.next_popped(after_popping))
            for i, block_id in enumerate(hits):
                if block_id in evicted:
                    return i * self.block_size
        return len(hits) * self.block_size

    def blocks_needed(self, num_tokens: int, block_hashes: Sequence[int] | None = None) -> int:
        """Free blocks allocate() would consume: new blocks plus evictable hit blocks.

        A hit on a cached block nobody uses (ref_cnt 0) takes it out of the free queue, so it
        costs a free block too (vLLM's get_num_blocks_to_allocate).
        """
        if type(num_tokens) is not int or num_tokens < 0:
            num_tokens = require_int("num_tokens", num_tokens)
        hits = self._find_hits(block_hashes, num_tokens)
        if not hits:
            return -(-num_tokens // self.block_size)
        ref = self.pool.ref_cnt
        return -(-num_tokens // self.block_size) - len(hits) + sum(ref[b] == 0 for b in hits)

    # ---- operations ------------------------------------------------------------------------
    def allocate(self, seq_id: Hashable, num_tokens: int,
                 block_hashes: Sequence[int] | None = None,
                 num_reserve_tokens: int | None = None,
                 delay_cache_blocks: bool = False) -> bool:
        """Admit a new sequence with slots for ``num_tokens`` tokens.

        Args:
            seq_id: new sequence id, any hashable: an int >= 0, or a string such as vLLM's
                request ids.
            num_tokens: tokens that need slots now (prompt, or computed + first chunk).
            block_hashes: chained keys of the sequence's full blocks (lazy Sequence, e.g.
                SegmentKeys); None: unique content, nothing to share.
            num_reserve_tokens: succeed only if blocks for this many tokens would fit (vLLM's
                full-prompt admission); only ``num_tokens`` are allocated. The prefix-cache
                query counters count max(num_tokens, num_reserve_tokens), the request's length
                as vLLM counts it.
            delay_cache_blocks: register no block yet (vLLM's ``delay_cache_blocks``: the KV of
                the blocks past the hits arrives by a transfer); ``cache_blocks`` does it later.
        Returns:
            False, with nothing changed, if the free blocks do not suffice.
        """
        seq_id = require_new_seq_id(seq_id, self._seqs)
        if type(num_tokens) is not int or num_tokens < 0:
            num_tokens = require_int("num_tokens", num_tokens)
        size = self.block_size
        num_check_tokens = num_tokens
        if num_reserve_tokens is not None:
            num_reserve_tokens = require_int("num_reserve_tokens", num_reserve_tokens)
            num_check_tokens = max(num_tokens, num_reserve_tokens)
        num_check_blocks = -(-num_check_tokens // size)
        if num_check_blocks > self.num_usable_blocks:
            raise ValueError(f"sequence {seq_id} needs {num_check_blocks} blocks for "
                             f"{num_check_tokens} tokens, the pool has {self.num_usable_blocks}")
        pool = self.pool
        hits = self._find_hits(block_hashes, num_tokens)
        num_evictable = 0
        if hits:
            ref = pool.ref_cnt
            num_evictable = sum(ref[b] == 0 for b in hits)
        if num_check_blocks - len(hits) + num_evictable > pool.num_free_blocks:
            return False
        pool.touch(hits)
        table = hits + pool.pop(-(-num_tokens // size) - len(hits))
        num_hit_tokens = len(hits) * size
        self._num_filled_slots += num_evictable * size + num_tokens - num_hit_tokens
        if self.enable_prefix_caching:
            self._count_query(seq_id, num_check_tokens, num_hit_tokens)
        seq = _Seq(table, num_tokens, num_hit_tokens, block_hashes,
                   *self._count_keys(block_hashes), len(hits), len(hits))
        self._seqs[seq_id] = seq
        if not delay_cache_blocks:
            self._register_full_blocks(seq)
        return True

    def cache_blocks(self, seq_id: Hashable) -> None:
        """Register the full blocks of a sequence allocated with ``delay_cache_blocks`` (vLLM's
        ``cache_blocks`` once a KV transfer has filled them)."""
        self._register_full_blocks(self._seq(seq_id))

    def append(self, seq_id: Hashable, num_tokens: int = 1) -> bool:
        """Grow a sequence by ``num_tokens`` (may cross several blocks).

        A partially filled last block shared with another sequence (after fork) is first copied
        to a private block (copy-on-write).

        Returns:
            False, with nothing changed, if the free blocks do not suffice.
        """
        seq = self._seqs.get(seq_id)
        if seq is None or type(num_tokens) is not int or num_tokens < 0:
            seq = self._seq(seq_id)               # raises on a bad id or count
            num_tokens = require_int("num_tokens", num_tokens)
        pool, size, table = self.pool, self.block_size, seq.block_table
        old_fill = seq.num_tokens % size
        new_num_tokens = seq.num_tokens + num_tokens
        num_new_blocks = -(-new_num_tokens // size) - len(table)
        cow = bool(old_fill) and num_tokens > 0 and pool.ref_cnt[table[-1]] > 1
        if num_new_blocks or cow:                 # most appends stay inside the last block
            if num_new_blocks + cow > pool.num_free_blocks:
                return False
            if cow:
                copy_block = pool.pop(1)[0]
                pool.ref_cnt[table[-1]] -= 1      # still held by the other sequence(s)
                table[-1] = copy_block
                self._num_filled_slots += old_fill
            if num_new_blocks:
                table += pool.pop(num_new_blocks)
        self._num_filled_slots += num_tokens
        seq.num_tokens = new_num_tokens
        if seq.num_keyed_blocks < seq.num_shareable_blocks:   # private blocks wait (doc)
            self._register_full_blocks(seq)
        return True

    def append_blocks(self, seq_ids: Sequence[int]) -> None:
        """One new block from the free queue for each listed sequence, in list order.

        For a simulator stepping decodes: a sequence whose next token starts a block takes the
        block now (the free queue hands blocks out in the order vLLM allocates them) and tells
        the tokens later with ``append``, which then needs no block. Until then a table is one
        block ahead of its tokens (``check_invariants`` expects the tokens told); the block
        counts as in use, its empty slots as unfilled.

        Raises:
            ValueError: the free blocks do not suffice (nothing changed).
        """
        pool, seqs = self.pool, self._seqs
        try:
            tables = [seqs[seq_id].block_table for seq_id in seq_ids]
        except KeyError as err:
            raise ValueError(f"append_blocks: sequence {err.args[0]} is not allocated") from None
        if len(tables) > pool.num_free_blocks:
            raise ValueError(f"append_blocks: {len(tables)} blocks wanted, "
                             f"{pool.num_free_blocks} free")
        for table, block_id in zip(tables, pool.pop(len(tables))):
            table.append(block_id)

    def fork(self, parent_id: Hashable, child_id: Hashable,
             block_hashes: Sequence[int] | None = None) -> None:
        """New sequence ``child_id`` sharing every block of ``parent_id`` (ref counts + 1).

        The child starts with the parent's tokens and num_cached_tokens. vLLM v1 has no fork
        (it runs n > 1 samples as separate requests sharing the prompt through the prefix cache);
        this is the vLLM paper's block sharing for parallel sampling and beam search.

        Args:
            block_hashes: keys of the child's full blocks (equal to the parent's over the shared
                prefix); None: the child's own continuation is unique content.
        """
        parent = self._seq(parent_id)
        child_id = require_new_seq_id(child_id, self._seqs)
        ref = self.pool.ref_cnt
        for block_id in parent.block_table:
            ref[block_id] += 1
        child = _Seq(list(parent.block_table), parent.num_tokens, parent.num_cached_tokens,
                     block_hashes, *self._count_keys(block_hashes), 0, parent.num_hit_blocks)
        self._seqs[child_id] = child
        parent.forked = child.forked = True
        # blocks the parent already registered are skipped (register is a no-op on them)
        self._register_full_blocks(child)

    def free(self, seq_id: Hashable, preempted: bool = False,
             num_hashed_tokens: int | None = None) -> None:
        """Release a sequence's blocks, tail first (so its tail is evicted before its head).

        Args:
            preempted: the sequence will come back (vLLM recompute preemption): register its
                private full blocks too, so that it can hit them on re-admission.
            num_hashed_tokens: only blocks within the first this-many tokens have a hash
                (default: all its tokens). A full block past it is freed like a partial one:
                not registered, front of the free queue. vLLM's AsyncScheduler frees a request
                preempted while a decode is in flight that way: the block completed by that
                decode's input token was not hashed yet (docs/FIDELITY.md rule 34).
        """
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        pool, size, table = self.pool, self.block_size, seq.block_table
        num_full = seq.num_tokens // size
        # the table's keyed head (blocks registered eagerly or hit; see pool.free): exact
        # unless the table is shared with a fork
        num_keyed = min(seq.num_keyed_blocks, seq.num_shareable_blocks)
        num_hashed = num_full       # full blocks with a hash (vLLM: the rest go to the front)
        if num_hashed_tokens is not None and num_hashed_tokens < seq.num_tokens:
            # blocks that have a key already (prefix hits, shareable blocks registered as they
            # filled) keep it
            num_hashed = max(require_int("num_hashed_tokens", num_hashed_tokens) // size,
                             seq.num_hit_blocks,
                             min(seq.num_keyed_blocks, seq.num_shareable_blocks))
        if self.enable_prefix_caching:
            if preempted:
                self._preempted_seq_ids.add(seq_id)
                start, stop = seq.num_shareable_blocks, min(num_hashed, seq.num_hashes)
                if start < stop:
                    self._register(seq, start, stop)
                    num_keyed = stop
            else:
                # private blocks keyed by a hit after an earlier preemption: nobody else can
                # use them, so once released they count as free (same LRU place)
                ref, key = pool.ref_cnt, pool.block_key
                for i in range(seq.num_shareable_blocks, min(seq.num_hit_blocks, num_hashed)):
                    if key[table[i]] is not None and ref[table[i]] == 1:
                        pool.unregister(table[i])
            num_reuse_first = len(table) - num_hashed
        else:
            num_reuse_first = len(table)
        tail_fill = seq.num_tokens - num_full * size
        tail_released = bool(tail_fill) and pool.ref_cnt[table[-1]] == 1
        num_free_before = pool.num_free_blocks
        if seq.forked:
            pool.free(table[::-1], num_reuse_first)
        else:       # blocks past the keyed and hit head were never keyed: nobody else holds them
            pool.free(table[::-1], num_reuse_first, num_keyed, max(num_keyed, seq.num_hit_blocks))
        num_released = pool.num_free_blocks - num_free_before
        self._num_filled_slots -= num_released * size - (size - tail_fill) * tail_released

    # ---- accounting ------------------------------------------------------------------------
    def breakdown(self, waiting_num_tokens: int | None = None) -> dict[str, int]:
        """Slots per memory class (MEMORY_CLASSES), summing to num_blocks * block_size. O(1).

        Paged pools have no external fragmentation: any free block serves any request.
        """
        return dict(zip(MEMORY_CLASSES, self.breakdown_slots()))

    def breakdown_slots(self) -> list[int]:
        """``breakdown()`` values as a list in MEMORY_CLASSES order (no dict: a simulator
        integrates the breakdown at every event)."""
        size, pool = self.block_size, self.pool
        num_cached = pool.num_cached_blocks
        filled = self._num_filled_slots
        num_used = self.num_usable_blocks - pool.num_free_blocks
        return [filled, 0, (num_used + self.null_block) * size - filled, 0, num_cached * size,
                (pool.num_free_blocks - num_cached) * size]

    def snapshot(self) -> PoolSnapshot:
        """Per-block arrays of the pool now (see PoolSnapshot)."""
        n, size, pool = self.num_blocks, self.block_size, self.pool
        cell_class, owner, fill, block_key = pool_cells(pool, size)
        tables, lens = {}, {}
        ordered = snapshot_order(self._seqs)
        code_of, owner_ids = owner_codes(ordered)
        for seq_id in reversed(ordered):                  # first seq_id written last
            seq = self._seqs[seq_id]
            table = np.asarray(seq.block_table, dtype=np.int64)
            tables[seq_id], lens[seq_id] = table, seq.num_tokens
            block_fill = np.full(len(table), size, dtype=np.int32)
            if seq.num_tokens % size:
                block_fill[-1] = seq.num_tokens % size
            owner[table] = code_of[seq_id]
            fill[table] = block_fill
            cell_class[table] = TOKEN_STATES
        return PoolSnapshot("paged", size, n, cell_class, owner,
                            np.asarray(pool.ref_cnt, dtype=np.int32), fill, block_key,
                            {i: tables[i] for i in ordered}, {i: lens[i] for i in ordered},
                            owner_ids)

    def check_invariants(self) -> None:
        """Recompute everything from scratch and assert it matches the incremental state."""
        pool, size = self.pool, self.block_size
        pool.check_invariants()
        references = Counter()
        fill_of: dict[int, int] = {}
        for seq_id, seq in self._seqs.items():
            table = seq.block_table
            assert len(table) == -(-seq.num_tokens // size), \
                f"seq {seq_id}: {len(table)} blocks for {seq.num_tokens} tokens"
            assert len(set(table)) == len(table), f"seq {seq_id} holds a block twice"
            assert pool.null_block not in table, f"seq {seq_id} holds the null block"
            assert seq.num_cached_tokens % size == 0 and seq.num_cached_tokens <= seq.num_tokens
            references.update(table)
            for i, block_id in enumerate(table):
                block_fill = min(size, seq.num_tokens - i * size)
                # a shared block is full, or the last block of every holder with equal fill
                assert fill_of.setdefault(block_id, block_fill) == block_fill, \
                    f"block {block_id} shared with different fills"
            for i in range(min(seq.num_keyed_blocks, seq.num_shareable_blocks)):
                assert pool.key_of(table[i]) == seq.block_hashes[i], \
                    f"seq {seq_id} block {i} not registered under its key"
        for block_id in range(self.num_blocks):
            assert pool.ref_cnt[block_id] == references[block_id], \
                f"block {block_id}: ref_cnt {pool.ref_cnt[block_id]}, " \
                f"{references[block_id]} table references"
        for block_id, key in enumerate(pool.block_key):
            if key is not None:
                assert fill_of.get(block_id, size) == size, f"partial block {block_id} keyed"
        assert self._num_filled_slots == sum(fill_of.values()), \
            f"filled slots {self._num_filled_slots} != {sum(fill_of.values())}"
        assert self.num_used_blocks == len(references), "free + used != total"
        slots = Counter()
        for seq_id in self._seqs:
            slots.update(self.slot_mapping(seq_id))
        for slot, count in slots.items():
            assert count == 1 or pool.ref_cnt[slot // size] == count, \
                f"slot {slot} mapped by {count} sequences but not shared"
        check_breakdown(self.breakdown(), self.num_blocks * size)

    # ---- helpers ---------------------------------------------------------------------------
    def _seq(self, seq_id: Hashable) -> _Seq:
        return require_live(seq_id, self._seqs)

    def _count_keys(self, block_hashes: Sequence[int] | None) -> tuple[int, int]:
        """(full blocks with a key, leading blocks others may share) of a key sequence."""
        if block_hashes is None or not self.enable_prefix_caching:
            return 0, 0
        num_hashes = len(block_hashes)
        return num_hashes, min(num_hashes, getattr(block_hashes, "num_shareable_blocks",
                                                   num_hashes))

    def _find_hits(self, block_hashes: Sequence[int] | None, num_tokens: int) -> list[int]:
        """Longest run of cached blocks from the start, capped at num_tokens - 1 tokens."""
        if block_hashes is None or not self.enable_prefix_caching or num_tokens <= 1 \
                or not self.pool.has_keys:
            return []
        limit = min((num_tokens - 1) // self.block_size, len(block_hashes))
        last = self._last_scan
        if last is not None and last[0] is block_hashes and last[1] == self.pool.map_version:
            # same keys, unchanged hash map: the earlier scan answers if it went far enough
            # or stopped at a miss before ``limit``
            _, _, scanned, hits = last
            if limit <= len(hits):
                return hits[:limit]
            if len(hits) < scanned:
                return list(hits)
        if type(block_hashes) is SegmentKeys and not self.pool.int_keys:
            hits = self.pool.segment_hits(block_hashes.segment_runs(0, limit))
        else:
            get = self.pool.get_cached_block
            hits = []
            for i in range(limit):
                block_id = get(block_hashes[i])
                if block_id is None:
                    break    # keys chain: once one block misses, every later block misses
                hits.append(block_id)
        self._last_scan = (block_hashes, self.pool.map_version, limit, hits)
        return list(hits)

    def _register_full_blocks(self, seq: _Seq) -> None:
        """Register blocks that just became full (shareable ones only: see module doc)."""
        num_full = seq.num_tokens // self.block_size
        start = seq.num_keyed_blocks
        if num_full <= start:
            return
        stop = min(num_full, seq.num_shareable_blocks)
        if start < stop:
            self._register(seq, start, stop)
        seq.num_keyed_blocks = num_full

    def _register(self, seq: _Seq, start: int, stop: int) -> None:
        """Register ``block_table[start:stop]`` under their keys: by segment run when the keys
        are SegmentKeys (no key is computed), else one key each."""
        pool, table, block_hashes = self.pool, seq.block_table, seq.block_hashes
        if type(block_hashes) is SegmentKeys and not pool.int_keys:
            pool.register_runs(table, block_hashes.segment_runs(start, stop), self.block_size,
                               unkeyed=start >= seq.num_hit_blocks and not seq.forked)
        else:
            pool.register_many(table[start:stop], block_hashes[start:stop])
