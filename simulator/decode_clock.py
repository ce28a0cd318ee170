"""The decode clock: plain decoding requests advance together without being visited.

A plain request that decodes (one token per step into its own blocks: nothing shareable in its
outputs, no fork) joins its scheduler's decode clock. Its counters stop being updated one by one
and are read as offsets from two clocks: ``clock_c`` advances when a step is scheduled (computed
tokens), ``clock_o`` when it completes (sampled tokens). What the clocked requests need from a
step is kept in aggregates:

* ``ctx_off``: their context tokens (a running sum, offset by ``clock_c``);
* ``buckets``: which of them start a new block at which step. Bucket r holds the requests whose
  computed tokens are a multiple of B when ``clock_c % B == r`` (``_Crossers``, in running order);
* ``fin_heap``: when each one has all its tokens (by ``clock_o``).

A step, or a run of decode steps (decode_run.py), then visits only the requests that cross a
block boundary, finish, or are off the clock (``loose``: prefilling, eager, just admitted), not
every running request. Whenever a step could bind (the running requests' tokens over the budget,
or their new blocks over the free ones: a preemption), every request leaves the clock and the
policy schedules the step one request at a time, as vLLM does; decoders rejoin after it. Forked
requests (forks.py) switch the clock off for the rest of the run.

``DecodeClock`` is a mixin of ``scheduler.Scheduler``. It owns the clock's state (set by
``_init_decode_clock``) and reads the host's ``config``, ``allocator``, ``paged``, ``block_size``,
``running``, ``num_pending_tokens`` and ``_num_new_tokens`` (the policy's rule for a running
request's tokens) and ``_grow`` (kv_slots.py).
"""
from __future__ import annotations

import heapq
from bisect import bisect_left

from kvsim.simulator.kv_slots import cdiv
from kvsim.simulator.seq_state import ORDER, RUNNING, SeqState
from kvsim.simulator.step_output import StepOutput


class _Crossers:
    """The clocked requests of one crossing bucket in running order: parallel lists of their
    admission orders and seq ids (a step's crossers are handed out without sorting)."""

    __slots__ = ("orders", "seq_ids")

    def __init__(self):
        self.orders: list[int] = []
        self.seq_ids: list[int] = []

    def add(self, order: int, seq_id: int) -> None:
        orders = self.orders
        if not orders or order > orders[-1]:    # the usual case: clocked in admission order
            orders.append(order)
            self.seq_ids.append(seq_id)
        else:
            i = bisect_left(orders, order)
            orders.insert(i, order)
            self.seq_ids.insert(i, seq_id)

    def remove(self, order: int) -> None:
        i = bisect_left(self.orders, order)
        del self.orders[i]
        del self.seq_ids[i]

    def clear(self) -> None:
        self.orders.clear()
        self.seq_ids.clear()


class DecodeClock:
    """Decode clock of one scheduler (mixin; see the module docstring)."""

    def _init_decode_clock(self) -> None:
        self.clock_enabled = True       # off for good once a forked request arrives
        self.clock_c = 0                # decode steps scheduled (computed tokens advance)
        self.clock_o = 0                # decode steps completed (tokens sampled)
        self.num_clocked = 0
        self.ctx_off = 0                # sum over clocked of num_computed_tokens - base_c
        # bucket r: clocked requests that need a block when clock_c % B == r
        self.buckets = [_Crossers() for _ in range(self.block_size)] if self.paged else []
        self.fin_heap: list = []        # (fin, order, SeqState) of clocked requests
        self.loose: list[SeqState] = []  # running requests off the clock, in running order
        # (clock_c - computed tokens at clock-in, order, SeqState): its top is the longest
        # clocked context; None unless the cost model prices the longest context (entries of
        # requests that left the clock are dropped when they reach the top)
        self.ctx_heap: list | None = None

    def track_max_context(self) -> None:
        """Keep the longest context of the clocked requests (before any request is clocked)."""
        assert not self.num_clocked, "track_max_context before requests join the clock"
        self.ctx_heap = []

    def _clocked_max_computed(self) -> int:
        """The most computed tokens among the clocked requests (0 when none)."""
        heap = self.ctx_heap
        while heap and not heap[0][2].clocked:
            heapq.heappop(heap)
        return self.clock_c - heap[0][0] if heap else 0

    def step_max_context(self, out: StepOutput) -> int:
        """The longest context after the step just scheduled (``schedule``'s output)."""
        longest = max((seq.num_computed_tokens for seq, _n in out.entries), default=0)
        if out.num_clocked:
            longest = max(longest, self._clocked_max_computed())
        return longest

    def run_max_context(self) -> int:
        """The longest context after the first step of the decode run just planned."""
        longest = max((seq.num_computed_tokens for seq in self.loose), default=0)
        if self.num_clocked:
            longest = max(longest, self._clocked_max_computed())
        return longest + 1

    def _materialize(self, seq: SeqState) -> None:
        """Bring a clocked request's counters up to date (it stays on the clock)."""
        dc = self.clock_c - seq.base_c
        if dc:
            seq.num_computed_tokens += dc
            seq.base_c = self.clock_c
        do = self.clock_o - seq.base_o
        if do:
            seq.num_output_tokens += do
            seq.num_tokens += do
            seq.base_o = self.clock_o

    def _clockable(self, seq: SeqState) -> bool:
        out = seq.num_output_tokens
        return (seq.plain and seq.status == RUNNING and out >= 1 and out < seq.max_output_tokens
                and seq.num_computed_tokens == seq.num_tokens - 1)

    def _clock_in(self, seq: SeqState) -> None:
        """Put a decoding request (counters up to date) on the clock."""
        seq.clocked = True
        seq.base_c = self.clock_c
        seq.base_o = self.clock_o
        c = seq.num_computed_tokens
        self.ctx_off += c - self.clock_c
        seq.fin = seq.max_output_tokens - seq.num_output_tokens + self.clock_o
        heapq.heappush(self.fin_heap, (seq.fin, seq.order, seq))
        if self.ctx_heap is not None:
            heapq.heappush(self.ctx_heap, (self.clock_c - c, seq.order, seq))
        if self.paged:
            seq.bucket = (self.clock_c - c) % self.block_size
            self.buckets[seq.bucket].add(seq.order, seq.seq_id)
        self.num_clocked += 1

    def _clock_out(self, seq: SeqState) -> None:
        """Take a finishing request off the clock (the caller popped it from ``fin_heap``)."""
        self._materialize(seq)
        seq.clocked = False
        self.ctx_off -= seq.num_computed_tokens - self.clock_c
        if self.paged:
            self.buckets[seq.bucket].remove(seq.order)
        self.num_clocked -= 1

    def _unclock_all(self) -> None:
        """Every request off the clock, counters up to date (before a step that may bind)."""
        if self.num_clocked:
            for seq in self.running:
                if seq.clocked:
                    self._materialize(seq)
                    seq.clocked = False
            for bucket in self.buckets:
                bucket.clear()
            self.fin_heap.clear()
            if self.ctx_heap is not None:
                self.ctx_heap.clear()
            self.num_clocked = 0
            self.ctx_off = 0
        self.loose = list(self.running)

    def _clock_in_decoders(self, entries: list) -> None:
        """After a step: requests it handled one by one that now decode join the clock."""
        if not self.clock_enabled:
            return
        joined = False
        for seq, _n in entries:
            if not seq.clocked and self._clockable(seq):
                self._clock_in(seq)
                joined = True
        if joined:
            self.loose = [s for s in self.loose if not s.clocked]

    def _pop_finished_clocked(self, finished: list) -> None:
        """Clocked requests that have all their tokens (by ``clock_o``) join ``finished``."""
        heap = self.fin_heap
        if heap and heap[0][0] <= self.clock_o:
            while heap and heap[0][0] <= self.clock_o:
                seq = heapq.heappop(heap)[2]
                self._clock_out(seq)
                finished.append(seq)
            finished.sort(key=ORDER)    # freed in scheduling (= running) order

    def _schedule_running_clocked(self, lpt: int):
        """The running requests' part of a step in which none of them can be cut short: their
        tokens fit the budget and their new blocks are free, so every one is scheduled in full
        (clocked ones: one token each, visited only if they cross a block boundary).

        Returns:
            None when the step could bind (the policy then schedules it one request at a time),
            else (out, token_budget left, the listed entries, number of clocked decodes, their
            context tokens) for the policy's admission and ``_update_after_schedule``.
        """
        cfg = self.config
        B = self.block_size
        paged = self.paged
        max_model_len = cfg.max_model_len
        num_new_tokens = self._num_new_tokens
        demand = self.num_clocked
        # clocked requests that start a new block in this step (none in a contiguous pool)
        crossing = self.buckets[self.clock_c % B].seq_ids if paged else ()
        need = len(crossing)
        plan = []
        for seq in self.loose:
            # no budget cap per request here (max_model_len never binds): the total is checked
            # against the budget below, and a step on the clock schedules everyone in full
            n = num_new_tokens(seq, lpt, max_model_len)
            if n <= 0:
                continue
            demand += n
            if paged:
                c = seq.num_computed_tokens
                need += cdiv(c + n, B) - cdiv(c, B)
            plan.append((seq.order, 1, seq, n))
        if demand > cfg.max_num_batched_tokens or (
                paged and need + self.decode_block_reserve > self.allocator.num_free_blocks):
            return None
        out = StepOutput(entries=[], num_clocked=self.num_clocked, view=list(self.running),
                         view_loose=frozenset(map(id, self.loose)), num_view_entries=len(plan))
        entries = out.entries
        # allocator calls in running order (it fixes which block ids each request gets); a
        # clocked request only takes its block (its tokens are told when it is next synced)
        if crossing and not plan:
            self.allocator.append_blocks(crossing)
        elif crossing:
            plan.extend((order, 0, seq_id, 0) for order, seq_id in
                        zip(self.buckets[self.clock_c % B].orders, crossing))
            plan.sort()
        takers = []
        for _order, listed, seq, n in plan:
            if listed:
                if takers:
                    self.allocator.append_blocks(takers)
                    takers = []
                ok = self._grow(seq, n)
                assert ok, "growth failed although the step's blocks were counted free"
                entries.append((seq, n))
            else:
                takers.append(seq)      # a seq_id
        if takers:
            self.allocator.append_blocks(takers)
        num_clocked = self.num_clocked
        self.num_pending_tokens += num_clocked
        ctx = self.ctx_off + num_clocked * self.clock_c + num_clocked   # after this token
        self.clock_c += 1
        return out, cfg.max_num_batched_tokens - demand, entries[:], num_clocked, ctx
