"""The scheduler's side of the KV cache: slots for running requests, frees, and lazy telling.

vLLM's scheduler calls ``KVCacheManager.allocate_slots`` for every scheduled request and
``free`` when one finishes or is preempted. kvsim does the same with one saving: a decode token
that lands in a block the request already holds changes nothing the allocator decides, so the
allocator is told about it lazily. ``SeqState.num_alloc_tokens`` lags ``num_computed_tokens``
and ``num_pending_tokens`` counts the difference over all requests; the allocator is called
when a request needs a new block, when it is freed, or when the pool is observed
(``sync_allocator``, before breakdowns and snapshots). Block ids and free-queue order are the
same as telling every token at once (tests/test_sim_scheduler.py checks it).

``KVSlots`` is a mixin of ``scheduler.Scheduler``; it owns ``num_pending_tokens`` and reads the
host's ``allocator``, ``paged``, ``block_size``, ``prefix_caching``, ``running`` and the decode
clock (``clock``: a clocked request's true counters).
"""
from __future__ import annotations

from kvsim.simulator.seq_state import SeqState


def cdiv(a: int, b: int) -> int:
    """Ceiling division (blocks for ``a`` tokens of ``b`` per block)."""
    return -(-a // b)


class KVSlots:
    """Slots, frees and lazy allocator sync for the scheduler (mixin; see the module docstring)."""

    def _init_kv_slots(self) -> None:
        # tokens scheduled but not yet told to the allocator (sum of computed - alloc)
        self.num_pending_tokens = 0

    def _keys(self, seq: SeqState):
        """The sequence's block keys (vLLM's request.block_hashes), built on first use."""
        if seq.keys is None and self.prefix_caching:
            seq.keys = seq.req.block_keys(self.block_size, seq.sample)
        return seq.keys

    def _sync(self, seq: SeqState) -> None:
        """Tell the allocator about tokens it has not seen (they fit in blocks already held)."""
        pending = seq.num_computed_tokens - seq.num_alloc_tokens
        if pending:
            ok = self.allocator.append(seq.seq_id, pending)
            assert ok, "a pending append needs no new block"
            seq.num_alloc_tokens = seq.num_computed_tokens
            self.num_pending_tokens -= pending

    def sync_allocator(self) -> None:
        """Make the allocator's view exact (before breakdowns and snapshots)."""
        if self.num_pending_tokens:
            for seq in self.running:
                if seq.clocked:
                    self.clock.materialize(seq)
                self._sync(seq)

    def _grow(self, seq: SeqState, num_new_tokens: int) -> bool:
        """vLLM allocate_slots for a running request: slots for computed + new tokens.

        Returns False, with nothing changed, when the free blocks do not suffice (the caller
        preempts)."""
        total = seq.num_computed_tokens + num_new_tokens
        if not self.paged:
            # reserved up front: growth never fails; tell the allocator lazily
            self.num_pending_tokens += num_new_tokens
            return True
        need = cdiv(total, self.block_size) - cdiv(seq.num_computed_tokens, self.block_size)
        if seq.group is not None:
            # forked sequences: appending into a shared partial block copies it first (CoW)
            need += self._num_cow_blocks(seq)
        if need > 0 or seq.eager or seq.group is not None or \
                seq.num_computed_tokens < seq.num_prompt_tokens:
            # a new block, shareable output blocks, or a prefill chunk (whose full blocks
            # vLLM caches as soon as they are scheduled): the allocator must act now
            if need > self.allocator.num_free_blocks:
                return False
            pending = seq.num_computed_tokens - seq.num_alloc_tokens
            ok = self.allocator.append(seq.seq_id, pending + num_new_tokens)
            assert ok, f"append of {pending + num_new_tokens} tokens failed with free blocks"
            seq.num_alloc_tokens = total
            self.num_pending_tokens -= pending
        else:
            self.num_pending_tokens += num_new_tokens
        return True

    def _num_cow_blocks(self, seq: SeqState) -> int:
        """1 if the sequence's last block is partially filled and shared (append copies it)."""
        if seq.num_alloc_tokens % self.block_size == 0 or not seq.num_alloc_tokens:
            return 0
        last = self.allocator.block_table(seq.seq_id)[-1]
        return int(self.allocator.ref_cnt(last) > 1)

    def _free(self, seq: SeqState, preempted: bool, num_hashed_tokens: int | None = None) -> None:
        """vLLM kv_cache_manager.free: the sequence's blocks go back to the free queue
        (``num_hashed_tokens``: see ``PagedAllocator.free``)."""
        # the allocator must see every computed token: a block that is exactly full is cached
        # (back of the free queue), a partial one is reused first
        self._sync(seq)
        if num_hashed_tokens is None:
            self.allocator.free(seq.seq_id, preempted=preempted)
        else:
            self.allocator.free(seq.seq_id, preempted=preempted,
                                num_hashed_tokens=num_hashed_tokens)
        seq.num_alloc_tokens = 0

    def num_logical_blocks(self) -> int:
        """Blocks the running requests would hold without sharing (their computed tokens)."""
        B = self.block_size
        total = 0
        counters = self.clock.counters
        for seq in self.running:
            total += -(-counters(seq)[0] // B)
        return total
