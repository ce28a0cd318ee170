"""GroupedPagedAllocator: one block table per KV-cache group over one shared block pool (vLLM
0.33's hybrid KV-cache manager: ``KVCacheManager`` + ``HybridKVCacheCoordinator``).

Models that mix layer types (gpt-oss and Gemma 3: sliding-window and full attention; Qwen3-Next,
Nemotron-H: Mamba or linear attention and full attention) split their layers into groups of
equal size (``kvsim.planner`` computes them as vLLM does). Every group allocates from the same
pool of equal-sized blocks (the page size is unified), so a request holds a block table per
group::

    pool     [ n | 7 | 2 | 9 | 5 | 4 | 8 | 3 | . | . ]     n = null block
    full     seq 0: [7, 2, 9]      seq 1: [4]
    sliding  seq 0: [n, 5, 8]      seq 1: [3]             (block 0 of seq 0 left the window)

The calls mirror vLLM's, in the scheduler's order: ``find_cache_hit`` (``get_computed_blocks``)
for a request being admitted, then ``allocate_slots`` for every scheduled chunk or decode, and
``free``. A hit is the longest prefix every group can serve (a fixed point over the groups:
full attention bounds it first, sliding-window and Mamba groups can only shorten it).
``allocate_slots`` first frees the blocks that left a sliding window (or a Mamba state that was
superseded), then checks the free blocks, then allocates and caches: the same order as vLLM, so
the same blocks move through the same free queue.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvsim.allocator.accounting import (CACHED, MEMORY_CLASSES, TOKEN_STATES,
                                        PoolSnapshot, check_breakdown, pool_cells)
from kvsim.allocator.block_pool import BlockPool, PoolQueries
from kvsim.allocator.checks import (owner_codes, require_int, require_live, require_new_seq_id,
                                    snapshot_order)
from kvsim.allocator.group_managers import (MANAGER_OF_KIND, NULL, GroupManager,
                                            KVCacheGroupSpec, RequestKeys, cdiv)

# how many keys _key_list keeps as lists, over all requests (about 6 MB)
KEY_MEMO_MAX_KEYS = 1 << 17
HIT_MEMO_MAX = 1 << 12         # find_cache_hit answers kept (one per request asked)


@dataclass(frozen=True)
class CacheHit:
    """A prefix lookup: the tokens every group can serve and each group's hit blocks."""

    num_tokens: int
    blocks: tuple[tuple[int, ...], ...]     # per group, NULL where a group keeps nothing
    shared_prefix_boundary: int = 0         # a prefix some group holds longer (vLLM: junction)

    @property
    def is_empty(self) -> bool:
        return not any(self.blocks)


class _GroupCountingPool(BlockPool):
    """The shared pool, also counting its cached free blocks by the group whose key each holds
    (``block_group[b]``: the group that last took block b), so that a per-group breakdown is
    O(1). Hooks only where a block becomes or stops being a cached free block: ``free`` (into
    the queue with a key), ``touch`` (a hit takes it back), ``_evicting`` (a pop evicts) and
    ``unregister`` (a key retired)."""

    def __init__(self, num_blocks: int, block_group: list[int], num_groups: int):
        super().__init__(num_blocks, reserve_null_block=True)
        self.block_group = block_group
        self.num_cached_by_group = [0] * num_groups

    def free(self, blocks_tail_first: list[int], num_reuse_first: int,
             num_keyed: int | None = None, num_shared_head: int | None = None) -> None:
        super().free(blocks_tail_first, num_reuse_first, num_keyed, num_shared_head)
        if self.num_keyed_blocks:
            ref, key, group = self.ref_cnt, self.block_key, self.block_group
            counts = self.num_cached_by_group
            for block_id in blocks_tail_first[num_reuse_first:]:
                if not ref[block_id] and key[block_id] is not None:
                    counts[group[block_id]] += 1

    def touch(self, blocks: Iterable[int]) -> None:
        blocks = list(blocks)
        ref, group, counts = self.ref_cnt, self.block_group, self.num_cached_by_group
        for block_id in blocks:
            if ref[block_id] == 0:
                counts[group[block_id]] -= 1
        super().touch(blocks)

    def _evicting(self, block_ids: list[int]) -> None:
        counts, group = self.num_cached_by_group, self.block_group
        for block_id in block_ids:
            counts[group[block_id]] -= 1

    def unregister(self, block_id: int) -> None:
        if self.block_key[block_id] is not None and self.ref_cnt[block_id] == 0:
            self.num_cached_by_group[self.block_group[block_id]] -= 1
        super().unregister(block_id)


class GroupedPagedAllocator(PoolQueries):
    """KV-cache groups over one pool, with vLLM's per-group rules.

    Args:
        num_blocks: blocks in the pool (vLLM's num_gpu_blocks; block 0 is the null block).
        block_size: tokens per block of every attention group (and of Mamba groups with prefix
            caching on; with it off, a Mamba group takes one ``max_model_len`` block).
        groups: the KV-cache groups, in vLLM's order.
        enable_prefix_caching: cache blocks and look up hits.
        max_model_len: longest request (caps slots; sizes "none"-mode Mamba blocks).
        max_num_batched_tokens: the scheduler's token budget; with ``max_concurrent_batches``
            it bounds how far a sliding window may lag behind (vLLM's admission cap).
        max_concurrent_batches: batches in flight (1: synchronous scheduling, 2: async).
    """

    def __init__(self, num_blocks: int, block_size: int, groups: Sequence[KVCacheGroupSpec], *,
                 enable_prefix_caching: bool = True, max_model_len: int,
                 max_num_batched_tokens: int, max_concurrent_batches: int = 1):
        block_size = require_int("block_size", block_size, 1)
        num_blocks = require_int("num_blocks", num_blocks, 2)
        max_model_len = require_int("max_model_len", max_model_len, 1)
        if not groups:
            raise ValueError("at least one KV-cache group is required")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.groups = tuple(groups)
        self.enable_prefix_caching = enable_prefix_caching
        self.max_model_len = max_model_len
        self.num_usable_blocks = num_blocks - 1
        self._block_group = [-1] * num_blocks      # group that last took each block
        self.pool = _GroupCountingPool(num_blocks, self._block_group, len(self.groups))
        in_flight = max_concurrent_batches * require_int("max_num_batched_tokens",
                                                         max_num_batched_tokens, 1)
        self.managers: tuple[GroupManager, ...] = tuple(
            self._make_manager(i, spec, in_flight) for i, spec in enumerate(self.groups))
        # lookup order: sets of equal specs, full attention first (it bounds the hit cheaply)
        sets: dict[tuple, list[int]] = {}
        for i, spec in enumerate(self.groups):
            sets.setdefault(spec.lookup_key, []).append(i)
        self._lookup_sets = sorted(sets.values(),
                                   key=lambda ids: self.groups[ids[0]].kind != "full_attention")
        self._windows = tuple(sorted({g.sliding_window for g in self.groups
                                      if g.kind == "sliding_window"}))
        self._mamba_align = enable_prefix_caching and any(g.kind == "mamba" for g in self.groups)
        self._processed: dict[Hashable, int] = {}     # tokens processed at the last call
        self._cached_upto: dict[Hashable, int] = {}   # the most tokens a cache call covered
        self._has_mamba = enable_prefix_caching and any(g.kind == "mamba" for g in self.groups)
        self._reqs: dict[Hashable, RequestKeys] = {}
        self._keys_memo: dict[int, tuple[Sequence[int], list[int], int]] = {}   # _key_list's
        self._keys_memo_size = 0
        self._hit_memo: dict[int, tuple] = {}   # find_cache_hit: keys, limit, map version, hit
        self._num_slot_tokens: dict[Hashable, int] = {}   # slots allocated (tail waste)
        self._tail_waste = [0] * len(self.groups)
        self._init_prefix_counters()

    def _make_manager(self, group_id: int, spec: KVCacheGroupSpec, in_flight: int) -> GroupManager:
        size = self.block_size
        if spec.kind == "mamba" and not self.enable_prefix_caching:
            size = self.max_model_len        # vLLM: mamba_block_size = max_model_len
        cap = None
        if spec.kind == "sliding_window":    # SlidingWindowSpec.max_admission_blocks_per_request
            cap = cdiv(min(spec.sliding_window - 1 + in_flight, self.max_model_len), size) + 1
        return MANAGER_OF_KIND[spec.kind](spec, self.pool, group_id, size,
                                          self.enable_prefix_caching, self._block_group, cap)

    # ---- queries ---------------------------------------------------------------------------
    @property
    def seq_ids(self) -> list[Hashable]:
        return list(self._reqs)

    def block_tables(self, seq_id: Hashable) -> tuple[list[int], ...]:
        """The request's table in every group (NULL = 0 where a group keeps nothing)."""
        require_live(seq_id, self._reqs)
        return tuple(list(m.req_blocks.get(seq_id, ())) for m in self.managers)

    def max_blocks_needed(self, num_tokens: int) -> int:
        """The fewest blocks a request of ``num_tokens`` computed tokens holds at once, over
        all groups (full attention: every block; a sliding window: at most its admission cap;
        a Mamba state: one). More than the usable blocks: it can never run."""
        total = 0
        for m in self.managers:
            if m.spec.kind == "mamba":
                total += 1
            else:
                need = cdiv(num_tokens, m.block_size)
                cap = m.max_admission_blocks
                total += need if cap is None else min(need, cap)
        return total

    # ---- prefix lookup ---------------------------------------------------------------------
    def find_cache_hit(self, block_hashes: Sequence[int] | None, num_tokens: int,
                       max_hit_tokens: int | None = None) -> CacheHit:
        """The longest prefix every group can serve, capped at ``num_tokens - 1`` (the last
        token is recomputed for its logits). No side effect."""
        empty = CacheHit(0, tuple(() for _ in self.groups))
        if not self.enable_prefix_caching or block_hashes is None or not self.pool.has_keys:
            return empty
        limit = num_tokens - 1 if max_hit_tokens is None else max_hit_tokens
        if limit <= 0:
            return empty
        # the answer reads only the keys and the hash map: a request the waiting loop stops
        # at is asked again every step, and the map often has not changed since
        memo = self._hit_memo.get(id(block_hashes))
        version = self.pool.map_version
        if memo is not None and memo[0] is block_hashes and memo[1] == limit \
                and memo[2] == version:
            return memo[3]
        hit = self._find_cache_hit(block_hashes, limit)
        if len(self._hit_memo) >= HIT_MEMO_MAX:
            self._hit_memo.clear()
        self._hit_memo[id(block_hashes)] = (block_hashes, limit, version, hit)
        return hit

    def _find_cache_hit(self, block_hashes: Sequence[int], limit: int) -> CacheHit:
        """``find_cache_hit``'s search: the longest prefix of at most ``limit`` tokens."""
        size, pool, groups = self.block_size, self.pool, self.groups
        if not isinstance(block_hashes, list) and len(self._lookup_sets) > 1:
            block_hashes = self._key_list(block_hashes, limit // size)
        hits: list[list[int] | None] = [None] * len(groups)
        lengths = [0] * len(groups)
        simple = len(self._lookup_sets) == 2 and groups[self._lookup_sets[0][0]].kind == \
            "full_attention"
        hit_length, longest = limit, 0
        while True:
            current = hit_length
            for ids in self._lookup_sets:
                spec = groups[ids[0]]
                if spec.kind == "full_attention" and hits[ids[0]] is not None:
                    # downward closed: the first scan answers every shorter candidate
                    current = min(current, lengths[ids[0]])
                    continue
                found, current = type(self.managers[ids[0]]).find_hit(
                    pool, [self.managers[i].salt for i in ids], spec, size, block_hashes,
                    current)
                for i, blocks in zip(ids, found):
                    hits[i], lengths[i] = blocks, current
                longest = max(longest, current)
            if current >= hit_length:
                break
            hit_length = current
            if simple:
                break
        for ids in self._lookup_sets:
            if groups[ids[0]].kind == "full_attention":
                for i in ids:
                    if hits[i] is not None:
                        del hits[i][cdiv(hit_length, size):]
        uncached = longest - hit_length
        return CacheHit(hit_length, tuple(tuple(h or ()) for h in hits),
                        hit_length + uncached if uncached else 0)

    def _key_list(self, block_hashes: Sequence[int], num_blocks: int) -> Sequence[int]:
        """The first ``num_blocks`` keys of lazy ``block_hashes`` as a list (a window's scan
        reads every key up to the limit, the full groups' scan the first ones again; a lazy
        key costs a segment walk), kept for the next calls with the same keys: the requests a
        waiting queue stops at are looked up every step, hundreds of them under overload (a
        longer list serves: find_hit reads no further than its limit). Up to KEY_MEMO_MAX_KEYS
        keys are kept, then the lists are dropped and made again. Keys only: hits are looked up
        in the pool at every call."""
        memo = self._keys_memo
        held = memo.get(id(block_hashes))
        if held is not None and held[0] is block_hashes and held[2] >= num_blocks \
                and len(held[1]) == min(num_blocks, len(block_hashes)):
            return held[1]
        keys = block_hashes[:num_blocks]     # all of them where it has fewer
        self._keys_memo_size += len(keys) - (len(held[1]) if held is not None else 0)   # replaced
        if self._keys_memo_size > KEY_MEMO_MAX_KEYS:
            memo.clear()
            self._keys_memo_size = len(keys)
        memo[id(block_hashes)] = (block_hashes, keys, num_blocks)
        return keys

    # ---- allocation ------------------------------------------------------------------------
    def allocate_slots(self, seq_id: Hashable, num_new_tokens: int, *, num_computed_tokens: int,
                       num_tokens: int, num_prompt_tokens: int,
                       block_hashes: Sequence[int] | None = None, hit: CacheHit | None = None,
                       full_sequence_must_fit: bool = False, watermark_blocks: int = 0,
                       num_in_flight_tokens: int = 0, num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False, reserved_blocks: int = 0) -> bool:
        """Slots for ``num_new_tokens`` more tokens of a request (vLLM's ``allocate_slots``).

        Args:
            seq_id: the request; new ids are admissions (``block_hashes``, ``hit`` apply).
            num_new_tokens: tokens this step computes (a chunk, or 1 for a decode).
            num_computed_tokens: tokens computed before this step (0 at admission).
            num_tokens: the request's current length (prompt + outputs so far).
            num_prompt_tokens: its prompt length.
            block_hashes: chained keys of its full blocks (required with prefix caching).
            hit: this admission's ``find_cache_hit``.
            full_sequence_must_fit: admission gate: blocks for all ``num_tokens`` must fit.
            watermark_blocks: free blocks to leave (waiting requests, something running).
            num_in_flight_tokens: scheduled tokens whose output is not back (async).
            num_external_computed_tokens: an admission's tokens after ``hit`` that a KV
                connector loads (vLLM's ``ext_comp``): each group gets blocks for those it
                keeps (a sliding window: the window; below it, NULL).
            delay_cache_blocks: cache nothing now (an async load: ``cache_blocks`` once done).
            reserved_blocks: free blocks the allocation must leave (vLLM's reservation for the
                requests still prefilling or loading, when a load is admitted).
        Returns:
            False, with nothing allocated, if the free blocks do not suffice (blocks that left
            a sliding window are freed even then, as in vLLM).
        """
        if type(num_new_tokens) is not int or num_new_tokens < 0:
            num_new_tokens = require_int("num_new_tokens", num_new_tokens)
        req = self._reqs.get(seq_id)
        admission = req is None
        if admission:
            seq_id = require_new_seq_id(seq_id, self._reqs)
            if self.enable_prefix_caching and block_hashes is None:
                raise ValueError(f"sequence {seq_id}: block_hashes are required with prefix "
                                 "caching (every full block is cached)")
            req = RequestKeys(block_hashes, num_prompt_tokens, num_tokens,
                              hit.shared_prefix_boundary if hit is not None else 0)
        else:
            req.num_tokens = num_tokens
        hit_tokens = hit.num_tokens if hit is not None and admission else 0
        ext = num_external_computed_tokens if admission else 0
        if num_new_tokens == 0 and hit_tokens == 0 and ext == 0:
            raise ValueError(f"sequence {seq_id}: num_new_tokens must be > 0 without a hit")
        hit_blocks = hit.blocks if hit is not None and admission and not hit.is_empty else None
        no_hits = tuple(() for _ in self.groups)
        local_computed = num_computed_tokens + hit_tokens
        total_computed = min(local_computed + ext, self.max_model_len)
        prefill_end = max(num_prompt_tokens, num_tokens - 1)
        managers, pool = self.managers, self.pool
        if full_sequence_must_fit:
            full = min(num_tokens, self.max_model_len)
            need = sum(m.blocks_to_allocate(seq_id, full, (hit_blocks or no_hits)[i],
                                            total_computed, full, True, prefill_end)
                       for i, m in enumerate(managers))
            if need + watermark_blocks > pool.num_free_blocks:
                return False
        main = total_computed + num_new_tokens
        need_slot = min(main, self.max_model_len)
        processed = max(0, total_computed - num_in_flight_tokens)
        for m in managers:
            m.remove_skipped(seq_id, processed)
        if not admission:
            self._processed[seq_id] = processed
        need = sum(m.blocks_to_allocate(seq_id, need_slot, (hit_blocks or no_hits)[i],
                                        local_computed + ext, main, False, prefill_end)
                   for i, m in enumerate(managers))
        if need + watermark_blocks > pool.num_free_blocks - reserved_blocks:
            return False
        if admission:
            self._reqs[seq_id] = req
            if hit_blocks is not None or ext:
                # vLLM: every group's hit blocks first, then the external blocks (a group's
                # new blocks must not evict another group's hit)
                for i, m in enumerate(managers):
                    m.add_hit_blocks(seq_id, (hit_blocks or no_hits)[i], local_computed + ext)
                if ext:
                    for m in managers:
                        m.allocate_external(seq_id, local_computed, ext)
            if self.enable_prefix_caching:
                self._count_query(seq_id, num_tokens, hit_tokens)
        for m in managers:
            m.allocate_new(seq_id, need_slot, main)
        self._set_slot_tokens(seq_id, need_slot)
        self._processed[seq_id] = processed
        if self.enable_prefix_caching and not delay_cache_blocks:
            cacheable = min(total_computed + num_new_tokens, num_tokens)
            cacheable -= cacheable % self.block_size
            for m in managers:
                m.cache_blocks(seq_id, req, cacheable)
            if cacheable > self._cached_upto.get(seq_id, 0):
                self._cached_upto[seq_id] = cacheable
        return True

    def remove_skipped(self, seq_id: Hashable, num_processed_tokens: int) -> None:
        """Free the blocks no group needs after ``num_processed_tokens`` (a sliding window's
        blocks below it; vLLM's ``remove_skipped_blocks``, which a KV connector's finish calls
        before the request's blocks are freed)."""
        require_live(seq_id, self._reqs)
        for m in self.managers:
            m.remove_skipped(seq_id, num_processed_tokens)

    def replay_boundaries(self, seq_id: Hashable) -> list[int]:
        """Token positions a later hit of a live request can end at
        (``RequestKeys.replay_boundaries``)."""
        return require_live(seq_id, self._reqs).replay_boundaries()

    def blocks_to_finish(self, seq_id: Hashable, num_tokens: int, num_computed_tokens: int,
                         num_prompt_tokens: int) -> int:
        """Free blocks a live request still needs to hold all of its ``num_tokens`` (vLLM's
        ``_request_remaining_blocks``: a sliding window capped at its admission blocks)."""
        require_live(seq_id, self._reqs)
        full = min(num_tokens, self.max_model_len)
        prefill_end = max(num_prompt_tokens, num_tokens - 1)
        return sum(m.blocks_to_allocate(seq_id, full, (), num_computed_tokens, full, True,
                                        prefill_end) for m in self.managers)

    def cache_blocks(self, seq_id: Hashable, num_tokens: int) -> None:
        """Cache the request's full blocks among its first ``num_tokens`` tokens, in every group
        (vLLM's ``KVCacheManager.cache_blocks``, which async scheduling calls when a step's
        output is processed, for the tokens that step computed)."""
        if not self.enable_prefix_caching:
            return
        req = require_live(seq_id, self._reqs)
        num_tokens -= num_tokens % self.block_size
        for m in self.managers:
            m.cache_blocks(seq_id, req, num_tokens)
        if num_tokens > self._cached_upto.get(seq_id, 0):
            self._cached_upto[seq_id] = num_tokens

    def note_slots(self, seq_id: Hashable, num_slot_tokens: int) -> None:
        """A decode whose ``allocate_slots`` call was skipped (``decode_changes_state``) still
        fills its slot: the memory breakdown counts it (token states, not the block's tail)."""
        self._set_slot_tokens(seq_id, num_slot_tokens)

    def caches_more(self, seq_id: Hashable, num_tokens: int) -> bool:
        """Whether ``cache_blocks(seq_id, num_tokens)`` could change anything: a block beyond
        those cached so far becomes full (a Mamba group keys its states at any call)."""
        return self._has_mamba or num_tokens // self.block_size > \
            self._cached_upto.get(seq_id, 0) // self.block_size

    def decode_changes_state(self, seq_id: Hashable, num_computed_tokens: int,
                             num_in_flight_tokens: int = 0, num_tokens: int | None = None) -> bool:
        """Whether a one-token decode of a running request after ``num_computed_tokens``
        computed tokens could change anything: need a block, fill one (cache it), move a
        sliding window or a Mamba state past a block. If not, ``allocate_slots`` would succeed
        and change nothing, and a simulator may skip the call (exact: measured from the last
        call the allocator saw, however many decodes were skipped since). With a batch in flight
        (async scheduling) give the call's ``num_in_flight_tokens`` and ``num_tokens``: windows
        then move with the tokens processed, and a block is cached once its last token is
        known."""
        size, c = self.block_size, num_computed_tokens
        slots = self._num_slot_tokens[seq_id]
        if -(-(c + 1) // size) != -(-slots // size) or (c + 1) // size != slots // size:
            return True
        if num_tokens is not None and self.enable_prefix_caching and \
                min(c + 1, num_tokens) // size > self._cached_upto.get(seq_id, 0) // size:
            return True
        p = self._processed[seq_id]
        q = max(0, c - num_in_flight_tokens)      # processed, after the call
        for w in self._windows:
            if max(0, q - w + 1) // size != max(0, p - w + 1) // size:
                return True
        return self._mamba_align and (q - 1) // size != (p - 1) // size

    def free(self, seq_id: Hashable, preempted: bool = False) -> None:
        """Release every group's blocks of a request, group by group, tail first.

        Args:
            preempted: the request comes back (its re-admission's hits are counted apart).
        """
        require_live(seq_id, self._reqs)
        del self._reqs[seq_id]
        self._set_slot_tokens(seq_id, 0)
        del self._num_slot_tokens[seq_id]
        del self._processed[seq_id]
        self._cached_upto.pop(seq_id, None)
        for m in self.managers:
            m.free(seq_id)
        if preempted and self.enable_prefix_caching:
            self._preempted_seq_ids.add(seq_id)

    def record_boundary_states(self) -> None:
        """Keep the Mamba states each step caches for ``take_boundary_states`` (a KV connector
        offloads them; vLLM's Mamba "align" groups always do)."""
        for m in self.managers:
            if m.spec.kind == "mamba" and self.enable_prefix_caching:
                m.boundary_states = []

    def take_boundary_states(self) -> dict[Hashable, list[tuple[int, int, int]]]:
        """The Mamba states cached since the last take, ``{request: [(group, block id, boundary
        tokens), ...]}``, groups in order (vLLM's ``take_boundary_state_offloads``, drained
        every step); a request's states not taken when its blocks were freed are dropped."""
        out: dict[Hashable, list[tuple[int, int, int]]] = {}
        for g, m in enumerate(self.managers):
            states = m.boundary_states
            if states:
                for seq_id, block_id, boundary in states:
                    out.setdefault(seq_id, []).append((g, block_id, boundary))
                m.boundary_states = []
        return out

    def new_step(self) -> None:
        """Call at the start of every scheduler step (vLLM's ``new_step_starts``)."""
        for m in self.managers:
            m.new_step()

    def _set_slot_tokens(self, seq_id, num_slot_tokens: int) -> None:
        """Track the unfilled tail of every attention group's last block (accounting)."""
        old = self._num_slot_tokens.get(seq_id, 0)
        self._num_slot_tokens[seq_id] = num_slot_tokens
        for i, m in enumerate(self.managers):
            if m.spec.kind != "mamba":
                self._tail_waste[i] += (-num_slot_tokens) % self.block_size - \
                    (-old) % self.block_size

    # ---- accounting ------------------------------------------------------------------------
    def group_breakdown(self) -> list[dict[str, int]]:
        """Slots per group: token states (a Mamba state block counts whole), internal
        fragmentation (the unfilled tail of a request's last block) and cached free blocks
        keyed by the group. With the pool's free slots and the null block they sum to the
        pool (``breakdown``). O(groups): the pool counts cached blocks by group."""
        size = self.block_size
        cached = self.pool.num_cached_by_group
        return [{"token_states": m.num_used_blocks * size - self._tail_waste[i],
                 "internal_fragmentation": self._tail_waste[i], "cached": cached[i] * size}
                for i, m in enumerate(self.managers)]

    def breakdown(self, waiting_num_tokens: int | None = None) -> dict[str, int]:
        """Slots per memory class (MEMORY_CLASSES) over the whole pool, O(1); the null block
        is internal fragmentation, as in PagedAllocator."""
        return dict(zip(MEMORY_CLASSES, self.breakdown_slots()))

    def breakdown_slots(self) -> list[int]:
        size, pool = self.block_size, self.pool
        waste = sum(self._tail_waste)
        used = sum(m.num_used_blocks for m in self.managers)
        return [used * size - waste, 0, waste + size, 0, pool.num_cached_blocks * size,
                (pool.num_free_blocks - pool.num_cached_blocks) * size]

    def snapshot(self) -> PoolSnapshot:
        """Per-block arrays of the pool now; ``block_group`` says which group holds (or, for a
        cached free block, keyed) each block, and ``group_block_tables`` every group's tables."""
        n, size, pool = self.num_blocks, self.block_size, self.pool
        cell_class, owner, fill, block_key = pool_cells(pool, size)
        group = np.full(n, -1, dtype=np.int8)
        cached = cell_class == CACHED
        group[cached] = np.asarray(self._block_group, dtype=np.int8)[cached]
        ordered = snapshot_order(self._reqs)
        code_of, owner_ids = owner_codes(ordered)
        tables, lens = {}, {}
        for seq_id in reversed(ordered):                  # first seq_id written last
            n_slot = self._num_slot_tokens.get(seq_id, 0)
            per_group = []
            for i, m in enumerate(self.managers):
                table = np.asarray(m.req_blocks.get(seq_id, ()), dtype=np.int64)
                per_group.append(table)
                real = table != NULL
                held = table[real]
                owner[held] = code_of[seq_id]
                group[held] = i
                cell_class[held] = TOKEN_STATES
                block_fill = np.full(len(table), m.block_size, dtype=np.int32)
                if m.spec.kind != "mamba" and len(table) and n_slot % size:
                    block_fill[-1] = n_slot % size
                fill[held] = block_fill[real]
            tables[seq_id] = tuple(per_group)
            lens[seq_id] = n_slot
        return PoolSnapshot("paged", size, n, cell_class, owner,
                            np.asarray(pool.ref_cnt, dtype=np.int32), fill, block_key,
                            {i: tables[i][0] for i in ordered}, {i: lens[i] for i in ordered},
                            owner_ids, block_group=group,
                            group_block_tables={i: tables[i] for i in ordered},
                            group_names=tuple(g.name or g.kind for g in self.groups))

    def check_invariants(self) -> None:
        """Recompute references, used blocks and slot accounting from scratch."""
        pool, size = self.pool, self.block_size
        pool.check_invariants()
        references = [0] * self.num_blocks
        used_by_group = [set() for _ in self.groups]
        for i, m in enumerate(self.managers):
            assert set(m.req_blocks) <= set(self._reqs), f"group {i} holds unknown requests"
            for seq_id, table in m.req_blocks.items():
                real = [b for b in table if b != NULL]
                assert len(set(real)) == len(real), f"seq {seq_id} holds a block twice"
                for block_id in real:
                    references[block_id] += 1
                    used_by_group[i].add(block_id)
                    assert self._block_group[block_id] == i, \
                        f"block {block_id} of group {i} marked {self._block_group[block_id]}"
                if m.spec.kind != "mamba":
                    n_slot = self._num_slot_tokens[seq_id]
                    assert len(table) == cdiv(n_slot, m.block_size), \
                        f"group {i} seq {seq_id}: {len(table)} blocks for {n_slot} tokens"
        for block_id in range(1, self.num_blocks):
            assert pool.ref_cnt[block_id] == references[block_id], \
                f"block {block_id}: ref_cnt {pool.ref_cnt[block_id]}, {references[block_id]} refs"
        for i, m in enumerate(self.managers):
            assert m.num_used_blocks == len(used_by_group[i]), \
                f"group {i}: {m.num_used_blocks} used, {len(used_by_group[i])} referenced"
            waste = sum((-self._num_slot_tokens[s]) % size for s in m.req_blocks) \
                if m.spec.kind != "mamba" else 0
            assert self._tail_waste[i] == waste, f"group {i}: tail waste {self._tail_waste[i]}"
        assert sum(len(u) for u in used_by_group) == self.num_used_blocks, \
            "blocks shared across groups"
        cached = [0] * len(self.groups)
        for block_id in pool.free_queue():
            if pool.block_key[block_id] is not None:
                cached[self._block_group[block_id]] += 1
        assert cached == pool.num_cached_by_group, \
            f"cached by group {pool.num_cached_by_group}, free queue says {cached}"
        check_breakdown(self.breakdown(), self.num_blocks * size)
