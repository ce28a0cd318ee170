"""The decode clock and decode runs: plain decoding requests advance together without being
visited, and runs of identical decode steps are applied at once.

One object, ``DecodeClock``, owns all of it (a scheduler holds one as ``clock``).

**The clock.** A plain request that decodes (one token per step into its own blocks: nothing
shareable in its outputs, no fork) joins the clock. Its counters stop being updated one by one
and are read as offsets from two clocks: ``c`` advances when a step is scheduled (computed
tokens), ``o`` when it completes (sampled tokens); ``counters(seq)`` gives a request's true
values at any time. What the clocked requests need from a step is kept in aggregates:

* ``ctx_off``: their context tokens (a running sum, offset by ``c``);
* ``buckets``: which of them start a new block at which step. Bucket r holds the requests whose
  computed tokens are a multiple of B when ``c % B == r`` (``_Crossers``, in running order);
* ``fin_heap``: when each one has all its tokens (by ``o``).

A step (``schedule_running``) then visits only the requests that cross a block boundary,
finish, or are off the clock (``loose``: prefilling, eager, just admitted), not every running
request. Whenever a step could bind (the running requests' tokens over the budget, or their new
blocks over the free ones: a preemption), ``schedule_running`` says so and the policy schedules
the step one request at a time, as vLLM does, with every request off the clock
(``unclock_all``); decoders rejoin after it (``clock_in_decoders``). Forked requests (forks.py)
and schedulers that must visit every request (KV-cache groups, an executor in the loop) switch
the clock off (``enabled``).

**Decode runs.** Between two events that need a decision (an admission, a preemption, a
finish, a fork, a shareable block filling up, an arrival, a sample), every step is the same:
each running request decodes one token. ``plan_run`` says how many such steps can run from
now; ``advance_run`` applies them, taking blocks exactly as stepping one by one would (step by
step, and within a step in running order); ``finish_run`` says who finished in the last one.
The engine prices the run with ``run_batch`` (its first step) and the cost model's
``run_time_s``. Results and block ids are the same as scheduling every step in detail
(``Simulation(batch_decode_steps=False)``, tested). Whether the waiting head would be admitted
is the policy's own question (the ``head_admissible`` it passes to ``plan_run``, which asks the
policy's one admission rule about the run's first step): the head's need only grows while
decodes consume blocks, so a head that does not fit then stays blocked for the whole run.

The object reads only what it is given and the allocator (``append`` / ``append_blocks`` for
the clocked requests' blocks, ``num_free_blocks``): the policy's rules as callables
(``num_new_tokens``, ``grow``, ``head_admissible``) and, at each call, the running requests;
the scheduler keeps the queues, the retiring of finished requests and its token counters.
"""
from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable

from kvsim.simulator.kv_slots import cdiv
from kvsim.simulator.seq_state import FINISHED, ORDER, RUNNING, SeqState
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
    """The decode clock and decode runs of one scheduler (module doc).

    Args:
        config: the replica's EngineConfig (block size, token budget, max_model_len).
        allocator: the replica's allocator (clocked requests take blocks through it).
        num_new_tokens: the policy's tokens for a running request ``(seq, lpt, budget)``.
        grow: the policy's ``allocate_slots`` for a running request ``(seq, n) -> bool``.
        head_admissible: the policy's verdict on the waiting head after a decode step that
            takes ``n`` new blocks (decode runs end before a step that admits it).
        block_reserve: free blocks a decode step must leave.
    """

    def __init__(self, config, allocator, num_new_tokens: Callable[[SeqState, int, int], int],
                 grow: Callable[[SeqState, int], bool], head_admissible: Callable[[int], bool],
                 block_reserve: int = 0):
        self.config = config
        self.allocator = allocator
        self.num_new_tokens = num_new_tokens
        self.grow = grow
        self.head_admissible = head_admissible
        self.block_reserve = block_reserve
        self.block_size = config.block_size
        self.paged = config.is_paged
        self.enabled = True             # off for good once switched off
        self.c = 0                      # decode steps scheduled (computed tokens advance)
        self.o = 0                      # decode steps completed (tokens sampled)
        self.num_clocked = 0
        self.ctx_off = 0                # sum over clocked of num_computed_tokens - base_c
        # bucket r: clocked requests that need a block when c % B == r
        self.buckets = [_Crossers() for _ in range(self.block_size)] if self.paged else []
        self.fin_heap: list = []        # (fin, order, SeqState) of clocked requests
        self.loose: list[SeqState] = []  # running requests off the clock, in running order
        # (c - computed tokens at clock-in, order, SeqState): its top is the longest clocked
        # context; None unless the cost model prices the longest context (entries of requests
        # that left the clock are dropped when they reach the top)
        self.ctx_heap: list | None = None
        # the planned decode run: context tokens of its first step, fewest outputs left
        self.run_ctx = 0
        self.run_min_remaining = 0

    # ---- a request's counters --------------------------------------------------------------
    def counters(self, seq: SeqState) -> tuple[int, int, int]:
        """A request's true (num_computed_tokens, num_output_tokens, num_tokens), on the clock
        or not (a clocked request's fields are as of its clock-in)."""
        if not seq.clocked:
            return seq.num_computed_tokens, seq.num_output_tokens, seq.num_tokens
        do = self.o - seq.base_o
        return (seq.num_computed_tokens + self.c - seq.base_c, seq.num_output_tokens + do,
                seq.num_tokens + do)

    def materialize(self, seq: SeqState) -> None:
        """Bring a clocked request's counters up to date (it stays on the clock)."""
        dc = self.c - seq.base_c
        if dc:
            seq.num_computed_tokens += dc
            seq.base_c = self.c
        do = self.o - seq.base_o
        if do:
            seq.num_output_tokens += do
            seq.num_tokens += do
            seq.base_o = self.o

    # ---- the longest context ---------------------------------------------------------------
    def track_max_context(self) -> None:
        """Keep the longest context of the clocked requests (before any request is clocked)."""
        assert not self.num_clocked, "track_max_context before requests join the clock"
        self.ctx_heap = []

    def _clocked_max_computed(self) -> int:
        """The most computed tokens among the clocked requests (0 when none)."""
        heap = self.ctx_heap
        while heap and not heap[0][2].clocked:
            heapq.heappop(heap)
        return self.c - heap[0][0] if heap else 0

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

    # ---- joining and leaving ---------------------------------------------------------------
    @staticmethod
    def _clockable(seq: SeqState) -> bool:
        out = seq.num_output_tokens
        return (seq.plain and seq.status == RUNNING and out >= 1 and out < seq.max_output_tokens
                and seq.num_computed_tokens == seq.num_tokens - 1)

    def _clock_in(self, seq: SeqState) -> None:
        """Put a decoding request (counters up to date) on the clock."""
        seq.clocked = True
        seq.base_c = self.c
        seq.base_o = self.o
        c = seq.num_computed_tokens
        self.ctx_off += c - self.c
        seq.fin = seq.max_output_tokens - seq.num_output_tokens + self.o
        heapq.heappush(self.fin_heap, (seq.fin, seq.order, seq))
        if self.ctx_heap is not None:
            heapq.heappush(self.ctx_heap, (self.c - c, seq.order, seq))
        if self.paged:
            seq.bucket = (self.c - c) % self.block_size
            self.buckets[seq.bucket].add(seq.order, seq.seq_id)
        self.num_clocked += 1

    def _clock_out(self, seq: SeqState) -> None:
        """Take a finishing request off the clock (the caller popped it from ``fin_heap``)."""
        self.materialize(seq)
        seq.clocked = False
        self.ctx_off -= seq.num_computed_tokens - self.c
        if self.paged:
            self.buckets[seq.bucket].remove(seq.order)
        self.num_clocked -= 1

    def unclock_all(self, running: list[SeqState]) -> None:
        """Every request off the clock, counters up to date (before a step that may bind);
        ``running`` (the scheduler's, in running order) all loose."""
        if self.num_clocked:
            for seq in running:
                if seq.clocked:
                    self.materialize(seq)
                    seq.clocked = False
            for bucket in self.buckets:
                bucket.clear()
            self.fin_heap.clear()
            if self.ctx_heap is not None:
                self.ctx_heap.clear()
            self.num_clocked = 0
            self.ctx_off = 0
        self.loose = list(running)

    def clock_in_decoders(self, entries: list) -> None:
        """After a step: requests it handled one by one that now decode join the clock."""
        if not self.enabled:
            return
        joined = False
        for seq, _n in entries:
            if not seq.clocked and self._clockable(seq):
                self._clock_in(seq)
                joined = True
        if joined:
            self.loose = [s for s in self.loose if not s.clocked]

    def pop_finished(self, finished: list) -> None:
        """Clocked requests that have all their tokens (by ``o``) join ``finished``."""
        heap = self.fin_heap
        if heap and heap[0][0] <= self.o:
            while heap and heap[0][0] <= self.o:
                seq = heapq.heappop(heap)[2]
                self._clock_out(seq)
                finished.append(seq)
            finished.sort(key=ORDER)    # freed in scheduling (= running) order

    def drop_finished(self) -> None:
        """Finished requests leave ``loose`` (they left the clock when they finished)."""
        if self.loose:
            self.loose = [s for s in self.loose if s.status != FINISHED]

    # ---- one step --------------------------------------------------------------------------
    def schedule_running(self, lpt: int, running: list[SeqState]):
        """The running requests' part of a step in which none of them can be cut short: their
        tokens fit the budget and their new blocks (beyond ``block_reserve`` kept free) are
        free, so every one is scheduled in full (clocked ones: one token each, visited only if
        they cross a block boundary; loose ones through the policy's ``num_new_tokens`` and
        ``grow``).

        Returns:
            None when the step could bind (the policy then schedules it one request at a time),
            else (out, token_budget left, the listed entries, number of clocked decodes, their
            context tokens) for the policy's admission and ``_update_after_schedule``.
        """
        cfg = self.config
        B = self.block_size
        paged = self.paged
        max_model_len = cfg.max_model_len
        num_new_tokens, grow = self.num_new_tokens, self.grow
        demand = self.num_clocked
        # clocked requests that start a new block in this step (none in a contiguous pool)
        crossing = self.buckets[self.c % B].seq_ids if paged else ()
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
                paged and need + self.block_reserve > self.allocator.num_free_blocks):
            return None
        out = StepOutput(entries=[], num_clocked=self.num_clocked, view=list(running),
                         view_loose=frozenset(map(id, self.loose)), num_view_entries=len(plan))
        entries = out.entries
        # allocator calls in running order (it fixes which block ids each request gets); a
        # clocked request only takes its block (its tokens are told when it is next synced)
        if crossing and not plan:
            self.allocator.append_blocks(crossing)
        elif crossing:
            plan.extend((order, 0, seq_id, 0) for order, seq_id in
                        zip(self.buckets[self.c % B].orders, crossing))
            plan.sort()
        takers = []
        for _order, listed, seq, n in plan:
            if listed:
                if takers:
                    self.allocator.append_blocks(takers)
                    takers = []
                ok = grow(seq, n)
                assert ok, "growth failed although the step's blocks were counted free"
                entries.append((seq, n))
            else:
                takers.append(seq)      # a seq_id
        if takers:
            self.allocator.append_blocks(takers)
        num_clocked = self.num_clocked
        ctx = self.ctx_off + num_clocked * self.c + num_clocked   # after this token
        self.c += 1
        return out, cfg.max_num_batched_tokens - demand, entries[:], num_clocked, ctx

    # ---- decode runs -----------------------------------------------------------------------
    def plan_run(self, num_decoding: int, max_steps: int, waiting: bool) -> int:
        """How many identical pure-decode steps can run from now, without any decision other
        than "every running request decodes one token": all ``num_decoding`` running requests
        are decoding, all fit the token budget, no step needs more blocks than are free beyond
        ``block_reserve`` (no preemption), nobody finishes before the last step, no fork/beam
        event, and no request is ``waiting`` or the head would not be admitted
        (``head_admissible(blocks the run's first step takes)``: the policy's admission rule).
        Returns 0 when the next step must be scheduled in detail."""
        n = num_decoding
        if n == 0 or max_steps <= 0:
            return 0
        if n > self.config.max_num_batched_tokens:
            return 0
        loose = self.loose
        # cheap exits first: the newest request is the likeliest to be prefilling, and a head
        # that fits even if every running request takes a block in step 1 will be admitted
        if loose:
            last = loose[-1]
            if last.num_computed_tokens != last.num_tokens - 1 or not last.num_output_tokens:
                return 0
        if waiting and self.head_admissible(n):
            return 0
        k = max_steps
        B = self.block_size
        paged = self.paged
        ctx = 0
        min_remaining = max_steps
        for seq in loose:
            c = seq.num_computed_tokens
            ctx += c
            # decoding = one token behind with an output already (a prompt's last token is a
            # prefill step that samples the first token)
            out_tokens = seq.num_output_tokens
            if c != seq.num_tokens - 1 or not out_tokens or seq.group is not None:
                return 0
            r = seq.max_output_tokens - out_tokens
            if r < min_remaining:
                min_remaining = r
            if paged and seq.eager:
                # end the run when a shareable block fills: later admissions may hit it
                full_end = (c // B + 1) * B
                if full_end <= seq.req.num_shareable_tokens and full_end - c < k:
                    k = full_end - c
        if self.num_clocked:
            ctx += self.ctx_off + self.num_clocked * self.c
            r = self.fin_heap[0][0] - self.o
            if r < min_remaining:
                min_remaining = r
        if min_remaining < k:
            k = min_remaining
        # for run_batch / finish_run
        self.run_ctx = ctx + n
        self.run_min_remaining = min_remaining
        first_step_blocks = 0
        if paged:
            k, first_step_blocks = self._steps_the_blocks_last(k, n, waiting)
            if k <= 0:
                return 0
        if waiting and self.head_admissible(first_step_blocks):
            return 0
        return k

    def _steps_the_blocks_last(self, k: int, n: int, waiting: bool) -> tuple[int, int]:
        """``k`` bounded by the steps the free blocks last with ``n`` requests decoding, and the
        blocks the first step takes (counted only when needed: 0 otherwise)."""
        B = self.block_size
        free = self.allocator.num_free_blocks - self.block_reserve
        cycles, rem = divmod(free, n)
        # every request takes at most one block per B steps, so the free blocks last at least
        # cycles * B steps; only a run longer than that (or a waiting head, which needs the
        # first step's blocks) needs the step-by-step count
        if cycles * B >= k and not waiting:
            return k, 0
        hist = self.crossing_histogram()
        r = 0
        acc = 0
        while r < B - 1 and acc + hist[r + 1] <= rem:
            r += 1
            acc += hist[r]
        return min(k, cycles * B + r), hist[1]

    def crossing_histogram(self) -> list[int]:
        """``hist[j]`` (j = 1..B): running requests that need a new block in decode step j from
        now (decoding requests; all zero for a contiguous pool)."""
        B = self.block_size
        hist = [0] * (B + 1)
        if self.paged:
            for seq in self.loose:
                hist[-seq.num_computed_tokens % B + 1] += 1
            if self.num_clocked:
                clock = self.c
                for r, bucket in enumerate(self.buckets):
                    if bucket.orders:
                        hist[(r - clock) % B + 1] += len(bucket.orders)
        return hist

    def run_batch(self) -> tuple[int, int]:
        """(kv_read_tokens, attn_token_pairs) of the first step of the planned decode run."""
        return self.run_ctx, self.run_ctx

    def finish_run(self) -> list[SeqState]:
        """Who finished in the last step of a decode run (only its last step can finish
        requests), in running order, off the clock; the scheduler retires them."""
        if self.run_min_remaining > 0:
            return []   # the run stopped before anyone's last token
        finished = [s for s in self.loose if s.num_output_tokens >= s.max_output_tokens]
        self.pop_finished(finished)
        return finished

    def advance_run(self, k: int) -> int:
        """Apply ``k`` planned decode steps at once (``plan_run`` said they are identical).

        Blocks are taken as stepping one by one would take them: step by step, and within a
        step in running order. A clocked request crossing a block boundary only takes its block;
        a request off the clock that crosses one (or has shareable output blocks) is told its
        tokens; everyone else stays pending until it needs a block. Returns the pending tokens
        handed to the allocator."""
        clock = self.c
        self.c += k
        self.o += k
        self.run_min_remaining -= k
        if not self.paged:
            for seq in self.loose:
                seq.num_computed_tokens += k
                seq.num_output_tokens += k
                seq.num_tokens += k
            return 0
        B = self.block_size
        crossings = []      # (step in the run, order, seq_id or SeqState)
        told = []           # requests off the clock told their tokens at the end
        for seq in self.loose:
            c = seq.num_computed_tokens
            seq.num_computed_tokens = c + k
            seq.num_output_tokens += k
            seq.num_tokens += k
            # its token c + j starts a block in step j = -c % B (+ B, ...)
            j = -c % B
            if j < k:
                crossings.extend((step, seq.order, seq) for step in range(j, k, B))
                told.append(seq)
            elif seq.eager:   # registers its output blocks as they fill
                told.append(seq)
        alloc = self.allocator
        if self.num_clocked:
            buckets = self.buckets
            if crossings:
                for r, bucket in enumerate(buckets):
                    if bucket.orders:
                        for order, seq_id in zip(bucket.orders, bucket.seq_ids):
                            crossings.extend(
                                (step, order, seq_id) for step in range((r - clock) % B, k, B))
            else:
                # the usual run: only clocked requests cross; step j takes bucket
                # (clock + j) % B in running order, round after round when k > B
                ids = []
                for j in range(k):
                    ids += buckets[(clock + j) % B].seq_ids
                if ids:
                    alloc.append_blocks(ids)
        num_told = self._take_crossings(crossings, k) if crossings else 0
        for seq in told:
            pending = seq.num_computed_tokens - seq.num_alloc_tokens
            if pending:
                ok = alloc.append(seq.seq_id, pending)
                assert ok, "telling a decode run's tokens needs no new block"
                num_told += pending
                seq.num_alloc_tokens = seq.num_computed_tokens
        return num_told

    def _take_crossings(self, crossings: list, k: int) -> int:
        """The run's new blocks in (step, running order): a clocked request (a seq_id) takes
        its block, one off the clock is told its tokens up to the one that starts it. Returns
        the pending tokens told."""
        alloc = self.allocator
        crossings.sort(key=lambda x: (x[0], x[1]))
        ids = []
        num_told = 0
        for step, _order, who in crossings:
            if type(who) is int:
                ids.append(who)
                continue
            if ids:
                alloc.append_blocks(ids)
                ids = []
            # tokens up to the one that starts the new block
            upto = who.num_computed_tokens - k + step + 1
            ok = alloc.append(who.seq_id, upto - who.num_alloc_tokens)
            assert ok, "decode run append failed: plan_run miscounted blocks"
            num_told += upto - who.num_alloc_tokens
            who.num_alloc_tokens = upto
        if ids:
            alloc.append_blocks(ids)
        return num_told
