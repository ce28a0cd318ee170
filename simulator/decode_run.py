"""Decode runs: many identical pure-decode steps applied at once.

Between two events that need a decision (an admission, a preemption, a finish, a fork, a
shareable block filling up, an arrival, a sample), every step is the same: each running request
decodes one token. ``plan_decode_run`` says how many such steps can run from now;
``advance_decode_run`` applies them, taking blocks exactly as stepping one by one would (step by
step, and within a step in running order); ``finish_decode_run`` retires who finished in the
last one. The engine prices the run with ``decode_run_batch`` (its first step) and the cost
model's ``run_time_s``. Results and block ids are the same as scheduling every step in detail
(``Simulation(batch_decode_steps=False)``, tested).

Whether the waiting head would be admitted is the policy's own question
(``_head_admissible``, which asks the policy's one admission rule ``_admission`` about the run's
first step): the head's need only grows while decodes consume blocks, so a head that does not
fit then stays blocked for the whole run.

``DecodeRuns`` is a mixin of ``scheduler.Scheduler``; it reads the host's queues, allocator,
decode clock (decode_clock.py), ``_head_admissible`` (the policy) and ``_retire``.
"""
from __future__ import annotations

from kvsim.simulator.seq_state import SeqState


class DecodeRuns:
    """Runs of identical decode steps (mixin; see the module docstring)."""

    def _init_decode_runs(self) -> None:
        self._run_ctx = 0               # context tokens of the planned run's first step
        self._run_min_remaining = 0     # fewest outputs left among running, at plan time

    def plan_decode_run(self, max_steps: int) -> int:
        """How many identical pure-decode steps can run from now, without any decision other
        than "every running request decodes one token": every running request is decoding, all
        fit the token budget, no step needs more blocks than are free (no preemption), nobody
        finishes before the last step, no fork/beam event, and the waiting queue is empty or its
        head would not be admitted (``_head_admissible``: the policy's admission rule, after the
        first step's decodes took their blocks). Returns 0 when the next step must be scheduled
        in detail."""
        running = self.running
        # async scheduling: requests done in flight (async_scheduling.py) hold their place in
        # running until the run's first step is scheduled, but decode no more
        n = len(running) - len(self.done_in_flight)
        if n == 0 or max_steps <= 0:
            return 0
        cfg = self.config
        if n > cfg.max_num_batched_tokens:
            return 0
        loose = self.loose
        # cheap exits first: the newest request is the likeliest to be prefilling, and a head
        # that fits even if every running request takes a block in step 1 will be admitted
        if loose:
            last = loose[-1]
            if last.num_computed_tokens != last.num_tokens - 1 or not last.num_output_tokens:
                return 0
        if self.waiting and self._head_admissible(n):
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
            ctx += self.ctx_off + self.num_clocked * self.clock_c
            r = self.fin_heap[0][0] - self.clock_o
            if r < min_remaining:
                min_remaining = r
        if min_remaining < k:
            k = min_remaining
        # for decode_run_batch / finish_decode_run
        self._run_ctx = ctx + n
        self._run_min_remaining = min_remaining
        first_step_blocks = 0
        if paged:
            k, first_step_blocks = self._steps_the_blocks_last(k, n)
            if k <= 0:
                return 0
        if self.waiting and self._head_admissible(first_step_blocks):
            return 0
        return k

    def _steps_the_blocks_last(self, k: int, n: int) -> tuple[int, int]:
        """``k`` bounded by the steps the free blocks last with ``n`` requests decoding, and the
        blocks the first step takes (counted only when needed: 0 otherwise)."""
        B = self.block_size
        free = self.allocator.num_free_blocks - self.decode_block_reserve
        cycles, rem = divmod(free, n)
        # every request takes at most one block per B steps, so the free blocks last at least
        # cycles * B steps; only a run longer than that (or a waiting head, which needs the
        # first step's blocks) needs the step-by-step count
        if cycles * B >= k and not self.waiting:
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
                clock = self.clock_c
                for r, bucket in enumerate(self.buckets):
                    if bucket.orders:
                        hist[(r - clock) % B + 1] += len(bucket.orders)
        return hist

    def finish_decode_run(self, end_ns: int, step_index: int) -> list[SeqState]:
        """Completions at the end of a decode run (only its last step can finish requests)."""
        if self._run_min_remaining > 0:
            return []   # the run stopped before anyone's last token
        finished = [s for s in self.loose if s.num_output_tokens >= s.max_output_tokens]
        self._pop_finished_clocked(finished)
        if finished:
            self._retire(finished, end_ns, step_index)
        return finished

    def decode_run_batch(self) -> tuple[int, int]:
        """(kv_read_tokens, attn_token_pairs) of the first step of a decode run."""
        return self._run_ctx, self._run_ctx

    def advance_decode_run(self, k: int) -> None:
        """Apply ``k`` planned decode steps at once (``plan_decode_run`` said they are identical).

        Blocks are taken as stepping one by one would take them: step by step, and within a
        step in running order. A clocked request crossing a block boundary only takes its block;
        a request off the clock that crosses one (or has shareable output blocks) is told its
        tokens; everyone else stays pending until it needs a block."""
        num_running = len(self.running) - len(self.done_in_flight)
        clock = self.clock_c
        self.clock_c += k
        self.clock_o += k
        num_told = 0            # pending tokens handed to the allocator
        if self.paged:
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
            if crossings:
                crossings.sort(key=lambda x: (x[0], x[1]))
                ids = []
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
                    assert ok, "decode run append failed: plan_decode_run miscounted blocks"
                    num_told += upto - who.num_alloc_tokens
                    who.num_alloc_tokens = upto
                if ids:
                    alloc.append_blocks(ids)
            for seq in told:
                pending = seq.num_computed_tokens - seq.num_alloc_tokens
                if pending:
                    ok = alloc.append(seq.seq_id, pending)
                    assert ok, "telling a decode run's tokens needs no new block"
                    num_told += pending
                    seq.num_alloc_tokens = seq.num_computed_tokens
        else:
            for seq in self.loose:
                seq.num_computed_tokens += k
                seq.num_output_tokens += k
                seq.num_tokens += k
        self.num_pending_tokens += k * num_running - num_told
        self.num_generated_tokens += k * num_running
        self._run_min_remaining -= k
