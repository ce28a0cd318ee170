"""One replica's scheduler: vLLM v1's decision logic over a kvsim allocator.

Mirrors ``vllm/v1/core/sched/scheduler.py`` (0.33) ``schedule()`` + ``update_from_output()`` for
the synchronous engine loop, without speculative decoding, LoRA, multimodal or KV connectors:

* No prefill/decode phases: every step gives each request tokens so that its
  ``num_computed_tokens`` catches up with ``num_tokens`` (prompt + outputs so far). That covers
  chunked prefill, prefix hits and recomputation after preemption.
* RUNNING requests first, in admission order, within ``max_num_batched_tokens`` (token budget);
  ``long_prefill_token_threshold`` caps one request's chunk when more than one request is eligible;
  a request never goes past ``max_model_len - 1`` computed tokens.
* When a running request cannot get the blocks it needs, the LAST running request is preempted
  (recompute: its blocks are freed with ``preempted=True``, ``num_computed_tokens`` = 0, it goes to
  the FRONT of the waiting queue), repeatedly, until the allocation succeeds or the request
  preempted itself. A step that preempted admits nobody.
* Then WAITING requests in FCFS order while the budget lasts and ``len(running) < max_num_seqs``:
  prefix-cache hit (full blocks, capped at ``num_tokens - 1``), the full-prompt admission check
  (vLLM's ``scheduler_reserve_full_isl``: blocks for the whole current length, hits that are
  evictable counting as consumed), the watermark (only when something is running), then the
  first chunk. The first waiting request that does not fit stops the loop (FCFS, no skipping).
* A request samples one token in every step that completes its prefill (or decodes) and finishes
  when it has ``output_tokens`` tokens or reaches ``max_model_len``; finished requests are freed
  in the order they were scheduled, which fixes the order of vLLM's free queue.

With a contiguous allocator the loop is the same, but admission asks ``can_allocate`` for the
whole reservation (Orca-style) and growth never fails, so nothing is preempted.

Forks (``Request.n`` > 1 parallel samples, ``beam_width`` > 1 beam search) are modelled in
``Scheduler._fork_samples`` / ``_reselect_beams``; see their docstrings.

Speed: the allocator is told about decode tokens lazily (``SeqState.num_alloc_tokens`` lags
``num_computed_tokens``) and only called when a request needs a new block, when it is freed or
when the pool is observed (``sync_allocator``); decoding requests ride a decode clock (see
"decode clock" below) so that a step costs only the requests that cross a block boundary,
finish, or are off the clock; ``plan_decode_run`` / ``advance_decode_run`` apply many identical
decode steps at once. Decisions and block ids are the same as stepping every request one by one
(tested).
"""
from __future__ import annotations

import heapq
import random
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter

from kvsim.simulator.config import EngineConfig

WAITING, RUNNING, PREEMPTED, FINISHED = 0, 1, 2, 3


@dataclass(slots=True)
class SeqState:
    """One sequence the scheduler tracks (a request, or one sample/beam of a forked request)."""

    seq_id: int                      # allocator sequence id
    req: object                      # the workloads.Request
    num_prompt_tokens: int
    max_output_tokens: int           # output_tokens capped by max_model_len - prompt
    arrival_ns: int
    keys: object = None              # block keys (SegmentKeys) of prompt + output, or None
    status: int = WAITING
    num_output_tokens: int = 0       # sampled so far
    num_tokens: int = 0              # prompt + outputs so far (kept in step with num_output_tokens)
    num_computed_tokens: int = 0     # tokens whose KV is computed or scheduled this step
    num_alloc_tokens: int = 0        # tokens the allocator has been told about (<= computed)
    num_preemptions: int = 0
    eager: bool = False              # output blocks are shareable: register them as they fill
    plain: bool = True               # not eager, not forked: decodes may be told lazily
    group: object = None             # ForkGroup for n > 1 / beams, else None
    sample: int = 0                  # sample / beam index within the group
    # recorded times (ns) and steps; -1 = not yet
    first_sched_ns: int = -1
    first_token_ns: int = -1
    finish_ns: int = -1
    first_sched_step: int = -1
    first_token_step: int = -1
    finish_step: int = -1
    cached_tokens_first: int = -1
    num_cached_tokens_total: int = 0  # prefix-hit tokens over all admissions
    # decode clock (see Scheduler): while ``clocked``, num_computed_tokens is as of the scheduler's
    # clock_c == base_c and num_output_tokens / num_tokens as of clock_o == base_o; the true
    # values add how far those clocks have moved since
    order: int = 0                    # admission counter: ``running`` is sorted by it
    clocked: bool = False
    base_c: int = 0
    base_o: int = 0
    fin: int = 0                      # output clock at which it has all its tokens
    bucket: int = 0                   # crossing bucket: needs a block when clock_c % B == bucket


@dataclass(slots=True)
class ForkGroup:
    """Sequences of one request that share blocks (parallel samples or beams)."""

    request_id: int
    kind: str                         # "sample" or "beam"
    width: int
    members: list = field(default_factory=list)   # SeqState, index = sample/beam
    rng: random.Random | None = None
    recorded: bool = False            # the request's row was written (once, when all finish)


@dataclass(slots=True)
class StepOutput:
    """What one scheduling step decided (vLLM's SchedulerOutput, reduced to what we record).

    ``entries`` are the sequences the step handles one by one, in vLLM's order; the
    ``num_clocked`` decoding sequences on the decode clock each got one token without being
    listed (``scheduled`` rebuilds the full list when asked)."""

    entries: list                     # [(SeqState, num_new_tokens)]
    num_clocked: int = 0
    num_scheduled_tokens: int = 0
    num_prefill_tokens: int = 0
    num_decode_seqs: int = 0
    kv_read_tokens: int = 0
    attn_token_pairs: int = 0
    num_new: int = 0
    num_resumed: int = 0
    num_preempted: int = 0
    pc_queries: int = 0
    pc_hits: int = 0
    pc_preempted_queries: int = 0
    pc_preempted_hits: int = 0
    finished: list = field(default_factory=list)
    view: list | None = None          # clocked step: ``running`` when it was scheduled
    view_loose: frozenset = frozenset()  # ids of the unclocked sequences among ``view``
    num_view_entries: int = 0         # entries that belong to ``view`` (the rest were admitted)

    @property
    def num_seqs(self) -> int:
        """Sequences scheduled in this step."""
        return len(self.entries) + self.num_clocked

    @property
    def scheduled(self) -> list:
        """Every scheduled (SeqState, num_new_tokens) in vLLM's order (running, then admitted)."""
        if self.view is None:
            return self.entries
        listed = {id(s): n for s, n in self.entries[:self.num_view_entries]}
        full = []
        for seq in self.view:
            key = id(seq)
            if key in listed:
                full.append((seq, listed[key]))
            elif key not in self.view_loose:
                full.append((seq, 1))
        return full + self.entries[self.num_view_entries:]


_ORDER = attrgetter("order")


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


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Scheduler:
    """vLLM v1 scheduler for one replica.

    Args:
        config: the replica's EngineConfig.
        allocator: a PagedAllocator or ContiguousAllocator (TEAM.md contract).
        seed: seeds beam reselection.
    """

    def __init__(self, config: EngineConfig, allocator, seed: int = 0):
        self.config = config
        self.allocator = allocator
        self.paged = config.is_paged
        self.block_size = config.block_size
        self.prefix_caching = self.paged and config.enable_prefix_caching
        self.watermark_blocks = config.watermark_blocks if self.paged else 0
        self.seed = seed
        self.running: list[SeqState] = []
        self.waiting: deque[SeqState] = deque()
        self.next_seq_id = 0
        # counters over the whole run
        self.num_preemptions = 0
        self.num_prefix_queries = 0     # tokens looked up at first admissions (vLLM's metric)
        self.num_prefix_hits = 0
        self.num_preempted_queries = 0  # the same for re-admissions after preemption
        self.num_preempted_hits = 0
        self.num_generated_tokens = 0
        self.num_prompt_tokens_computed = 0  # prefill work actually done (after hits)
        self.num_steps = 0
        # tokens scheduled but not yet told to the allocator (sum of computed - alloc)
        self.num_pending_tokens = 0
        self._run_ctx = 0               # context tokens of the planned run's first step
        self._run_min_remaining = 0     # fewest outputs left among running, at plan time
        # decode clock: plain decoding requests advance together without being visited
        self.clock_enabled = True       # off for good once a forked request arrives
        self.clock_c = 0                # decode steps scheduled (computed tokens advance)
        self.clock_o = 0                # decode steps completed (tokens sampled)
        self.num_clocked = 0
        self.ctx_off = 0                # sum over clocked of num_computed_tokens - base_c
        # bucket r: clocked requests that need a block when clock_c % B == r
        self.buckets = [_Crossers() for _ in range(self.block_size)] if self.paged else []
        self.fin_heap: list = []        # (fin, order, SeqState) of clocked requests
        self.loose: list[SeqState] = []  # running requests off the clock, in running order
        self.next_order = 0

    # ------------------------------------------------------------------ admission of arrivals
    def add_request(self, req, arrival_ns: int) -> SeqState:
        """Queue a request (vLLM add_request): it joins the back of the waiting queue."""
        max_out = min(req.output_tokens, self.config.max_model_len - req.prompt_tokens)
        seq = SeqState(seq_id=self._new_seq_id(), req=req, num_prompt_tokens=req.prompt_tokens,
                       max_output_tokens=max_out, arrival_ns=arrival_ns,
                       num_tokens=req.prompt_tokens)
        if self.paged and req.num_shareable_tokens > req.prompt_tokens:
            seq.eager = True
            seq.plain = False
        width = max(getattr(req, "n", 1) or 1, getattr(req, "beam_width", 1) or 1)
        if width > 1:
            if self.clock_enabled:
                # forks insert sequences in the middle of ``running`` and share blocks: step
                # every sequence one by one from now on
                self._unclock_all()
                self.clock_enabled = False
            kind = "beam" if (getattr(req, "beam_width", 1) or 1) > 1 else "sample"
            seq.group = ForkGroup(req.request_id, kind, width, [seq],
                                  random.Random(self.seed * 1_000_003 + req.request_id))
            seq.plain = False
        self.waiting.append(seq)
        return seq

    def _new_seq_id(self) -> int:
        sid = self.next_seq_id
        self.next_seq_id += 1
        return sid

    def _keys(self, seq: SeqState):
        if seq.keys is None and self.prefix_caching:
            seq.keys = seq.req.block_keys(self.block_size, seq.sample)
        return seq.keys

    # ------------------------------------------------------------------ allocator helpers
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
                    self._materialize(seq)
                self._sync(seq)

    def _grow(self, seq: SeqState, num_new_tokens: int) -> bool:
        """vLLM allocate_slots for a running request: slots for computed + new tokens."""
        total = seq.num_computed_tokens + num_new_tokens
        if not self.paged:
            # reserved up front: growth never fails; tell the allocator lazily
            self.num_pending_tokens += num_new_tokens
            return True
        need = _cdiv(total, self.block_size) - _cdiv(seq.num_computed_tokens, self.block_size)
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

    def _free(self, seq: SeqState, preempted: bool) -> None:
        # the allocator must see every computed token: a block that is exactly full is cached
        # (back of the free queue), a partial one is reused first
        self._sync(seq)
        self.allocator.free(seq.seq_id, preempted=preempted)
        seq.num_alloc_tokens = 0

    # ------------------------------------------------------------------ decode clock
    # A plain request that decodes (one token per step into its own blocks) joins the decode
    # clock: its counters stop being updated one by one and are read as offsets from the
    # scheduler's clocks (``clock_c`` advances when a step is scheduled, ``clock_o`` when it
    # completes). What the clocked requests need from a step is kept in aggregates: ``ctx_off``
    # (their context tokens), ``buckets`` (which of them need a new block at which step: a
    # request whose computed tokens are a multiple of B when ``clock_c % B == bucket``) and
    # ``fin_heap`` (when each finishes). A step or a run of steps then costs the requests that
    # cross a block boundary, finish, or are off the clock (prefilling, eager), not every running
    # request. Whenever a step could bind (token budget, free blocks: preemption), every request
    # leaves the clock and the step is scheduled one request at a time, as vLLM does.

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
            finished.sort(key=_ORDER)    # freed in scheduling (= running) order

    def _retire(self, finished: list, end_ns: int, step_index: int) -> None:
        """Finish and free requests (in the given order) and drop them from running."""
        for seq in finished:
            seq.status = FINISHED
            seq.finish_ns = end_ns
            seq.finish_step = step_index
            self._free(seq, preempted=False)
        running = self.running
        if self.clock_enabled and len(finished) * 8 < len(running):
            for seq in finished:   # running is sorted by admission order
                del running[bisect_left(running, seq.order, key=_ORDER)]
        else:
            self.running = [s for s in running if s.status != FINISHED]
        if self.loose:
            self.loose = [s for s in self.loose if s.status != FINISHED]

    def num_logical_blocks(self) -> int:
        """Blocks the running requests would hold without sharing (their computed tokens)."""
        B = self.block_size
        total = 0
        for seq in self.running:
            c = seq.num_computed_tokens
            if seq.clocked:
                c += self.clock_c - seq.base_c
            total += -(-c // B)
        return total

    # ------------------------------------------------------------------ one step
    def schedule(self, now_ns: int, step_index: int) -> StepOutput:
        """Decide one step (vLLM Scheduler.schedule). Computed tokens advance immediately."""
        if self.clock_enabled:
            out = self._schedule_clocked(now_ns, step_index)
            if out is not None:
                return out
            self._unclock_all()
        out = self._schedule_each(now_ns, step_index)
        self.loose = list(self.running)
        return out

    def _lpt(self) -> int:
        # the threshold only applies when someone else could use the budget
        if len(self.running) + len(self.waiting) > 1:
            return self.config.long_prefill_token_threshold
        return 0

    def _schedule_clocked(self, now_ns: int, step_index: int) -> StepOutput | None:
        """A step in which no running request can be cut short: the running requests' tokens fit
        the budget and their new blocks are free, so every one is scheduled in full (clocked
        ones: one token each, visited only if they cross a block boundary). None otherwise."""
        cfg = self.config
        B = self.block_size
        paged = self.paged
        lpt = self._lpt()
        max_model_len = cfg.max_model_len
        demand = self.num_clocked
        # clocked requests that start a new block in this step (none in a contiguous pool)
        crossing = self.buckets[self.clock_c % B].seq_ids if paged else ()
        need = len(crossing)
        plan = []
        for seq in self.loose:
            c = seq.num_computed_tokens
            n = seq.num_tokens - c
            if 0 < lpt < n:
                n = lpt
            if n > max_model_len - c - 1:
                n = max_model_len - c - 1
            if n <= 0:
                continue
            demand += n
            if paged:
                need += _cdiv(c + n, B) - _cdiv(c, B)
            plan.append((seq.order, 1, seq, n))
        if demand > cfg.max_num_batched_tokens or (paged and need > self.allocator.num_free_blocks):
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
        self._admit_waiting(out, cfg.max_num_batched_tokens - demand, lpt, now_ns, step_index)
        self._update_after_schedule(out, entries, num_clocked, ctx)
        return out

    def _schedule_each(self, now_ns: int, step_index: int) -> StepOutput:
        """A step scheduled one request at a time (nobody on the decode clock)."""
        cfg = self.config
        out = StepOutput(entries=[])
        scheduled = out.entries
        token_budget = cfg.max_num_batched_tokens
        running = self.running
        lpt = self._lpt()
        max_model_len = cfg.max_model_len
        preempted_any = False
        block_size = self.block_size

        # 1) RUNNING requests, in admission order. A preemption pops victims off the end of
        # ``running`` while we iterate: the list iterator then simply stops earlier (vLLM's
        # ``while req_index < len(self.running)``).
        slow = []                  # scheduled outside the decode fast path, updated below
        fast_ctx = 0               # decodes inside a held block: updated inline
        lazy = self.paged          # paged decodes are told to the allocator lazily
        for seq in running:
            if token_budget <= 0:
                break
            c = seq.num_computed_tokens
            n = seq.num_tokens - c
            if n == 1 and c % block_size and lazy and seq.plain and c >= seq.num_prompt_tokens:
                # the common case: one decode token into a block it holds, no allocator call
                # (the threshold and the max_model_len cap cannot bind for one token)
                seq.num_computed_tokens = c + 1
                fast_ctx += c + 1
                scheduled.append((seq, 1))
                token_budget -= 1
                continue
            if 0 < lpt < n:
                n = lpt
            if n > token_budget:
                n = token_budget
            cap = max_model_len - c - 1
            if n > cap:
                n = cap
            if n <= 0:
                continue
            ok = True
            while not self._grow(seq, n):
                victim = running.pop()
                self._preempt(victim, now_ns)
                out.num_preempted += 1
                preempted_any = True
                if victim is seq:
                    ok = False
                    break
            if not ok:
                break
            scheduled.append((seq, n))
            slow.append((seq, n))
            token_budget -= n
        num_fast = len(scheduled) - len(slow)
        self.num_pending_tokens += num_fast

        # 2) WAITING requests, FCFS, only if nobody was preempted in this step
        if not preempted_any:
            num_before = len(scheduled)
            self._admit_waiting(out, token_budget, lpt, now_ns, step_index)
            slow.extend(scheduled[num_before:])
        self._update_after_schedule(out, slow, num_fast, fast_ctx)
        return out

    def _admit_waiting(self, out: StepOutput, token_budget: int, lpt: int, now_ns: int,
                       step_index: int) -> None:
        """vLLM's waiting loop: admit FCFS while budget and ``max_num_seqs`` allow."""
        waiting = self.waiting
        running = self.running
        max_num_seqs = self.config.max_num_seqs
        while token_budget > 0 and waiting:
            if len(running) >= max_num_seqs:
                break
            seq = waiting[0]
            if not self._admit(seq, token_budget, lpt, out, now_ns, step_index):
                break
            waiting.popleft()
            seq.order = self.next_order
            self.next_order += 1
            running.append(seq)
            self.loose.append(seq)
            token_budget -= out.entries[-1][1]

    def _update_after_schedule(self, out: StepOutput, slow: list, num_fast: int,
                               fast_ctx: int) -> None:
        """vLLM _update_after_schedule: computed tokens advance at schedule time; the step's
        totals. ``num_fast`` decodes were already advanced, with ``fast_ctx`` context tokens."""
        num_tokens_total = num_fast
        out.kv_read_tokens = out.attn_token_pairs = fast_ctx
        out.num_decode_seqs = num_fast
        for seq, n in slow:
            before = seq.num_computed_tokens
            seq.num_computed_tokens = before + n
            num_tokens_total += n
            ctx = before + n
            out.kv_read_tokens += ctx
            out.attn_token_pairs += n * ctx
            if n == 1 and before == seq.num_tokens - 1 and seq.num_output_tokens >= 1:
                out.num_decode_seqs += 1
            else:
                out.num_prefill_tokens += n
        out.num_scheduled_tokens = num_tokens_total
        self.num_prompt_tokens_computed += out.num_prefill_tokens

    def _admit(self, seq: SeqState, token_budget: int, lpt: int, out: StepOutput,
               now_ns: int, step_index: int) -> bool:
        """Try to admit the head of the waiting queue (the waiting loop body of vLLM)."""
        cfg = self.config
        alloc = self.allocator
        num_tokens = seq.num_tokens
        if self.paged:
            keys = self._keys(seq)
            hit = alloc.lookup(keys, num_tokens) if keys is not None else 0
            n = num_tokens - hit
            if 0 < lpt < n:
                n = lpt
            if n > token_budget:
                n = token_budget
            # watermark: only for admissions, only when something already runs
            wm = self.watermark_blocks if self.running else 0
            free = alloc.num_free_blocks
            if cfg.full_prompt_admission:
                full = min(num_tokens, cfg.max_model_len)
                if alloc.blocks_needed(full, keys) + wm > free:
                    return False
            first = min(hit + n, cfg.max_model_len)
            # with full-prompt admission the first chunk's need is implied (same hits, fewer
            # blocks); vLLM checks both
            if not cfg.full_prompt_admission and alloc.blocks_needed(first, keys) + wm > free:
                return False
            ok = alloc.allocate(seq.seq_id, first, block_hashes=keys)
            assert ok, "allocate failed after blocks_needed said it fits"
            got = alloc.num_cached_tokens(seq.seq_id) if keys is not None else 0
            assert got == hit, f"allocator hit {got} != lookup {hit}"
            if self.prefix_caching:
                if seq.num_preemptions > 0:
                    out.pc_preempted_queries += num_tokens
                    out.pc_preempted_hits += hit
                    self.num_preempted_queries += num_tokens
                    self.num_preempted_hits += hit
                else:
                    out.pc_queries += num_tokens
                    out.pc_hits += hit
                    self.num_prefix_queries += num_tokens
                    self.num_prefix_hits += hit
        else:
            hit = 0
            n = num_tokens
            if 0 < lpt < n:
                n = lpt
            if n > token_budget:
                n = token_budget
            final = seq.num_prompt_tokens + seq.max_output_tokens
            if not alloc.can_allocate(n, final, num_prompt_tokens=seq.num_prompt_tokens):
                return False
            ok = alloc.allocate(seq.seq_id, n, final, num_prompt_tokens=seq.num_prompt_tokens)
            assert ok, "contiguous allocate failed after can_allocate"
            first = n
        seq.num_alloc_tokens = first
        seq.num_computed_tokens = hit
        seq.num_cached_tokens_total += hit
        if seq.status == PREEMPTED:
            out.num_resumed += 1
        else:
            out.num_new += 1
            seq.first_sched_ns = now_ns
            seq.first_sched_step = step_index
            seq.cached_tokens_first = hit
        seq.status = RUNNING
        out.entries.append((seq, n))
        return True

    def _preempt(self, seq: SeqState, now_ns: int) -> None:
        """vLLM _preempt_request: free (recompute), reset, front of the waiting queue."""
        self._free(seq, preempted=True)
        seq.status = PREEMPTED
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish_step(self, out: StepOutput, end_ns: int, step_index: int) -> list[SeqState]:
        """vLLM update_from_output: sample tokens, finish and free requests, in schedule order.

        Returns:
            the sequences that finished in this step.
        """
        finished = out.finished
        reselect = []
        num_sampled = out.num_clocked
        if num_sampled:
            self.clock_o += 1
        for seq, _n in out.entries:
            if seq.num_computed_tokens < seq.num_tokens:
                continue  # a partial prefill chunk samples nothing
            seq.num_output_tokens += 1
            seq.num_tokens += 1
            num_sampled += 1
            if seq.first_token_ns < 0:
                seq.first_token_ns = end_ns
                seq.first_token_step = step_index
            if seq.num_output_tokens >= seq.max_output_tokens:
                finished.append(seq)
            elif seq.group is not None and seq.sample == 0:
                if seq.num_output_tokens == 1:
                    self._fork_samples(seq)
                elif seq.group.kind == "beam" and seq.num_computed_tokens % self.block_size == 0:
                    reselect.append(seq.group)
        # one addition per step (an integer total: forks adding theirs inside the loop is fine)
        self.num_generated_tokens += num_sampled
        for group in reselect:   # after every beam got this step's token: lockstep again
            self._reselect_beams(group)
        self._pop_finished_clocked(finished)
        if finished:
            self._retire(finished, end_ns, step_index)
        self._clock_in_decoders(out.entries)
        return finished

    # ------------------------------------------------------------------ forks
    def _fork_samples(self, parent: SeqState) -> None:
        """Parallel sampling / beam search start: after the prompt's first token, the other
        ``width - 1`` samples fork from sample 0, sharing all its blocks (the partial last block is
        copied on write by the allocator when a child appends). Children are inserted right after
        the parent in the running list (they were admitted with it) and then decode on their own;
        a preempted child recomputes its prompt + outputs like any request (vLLM v1 runs parallel
        samples as separate requests sharing the prompt through the prefix cache)."""
        group = parent.group
        idx = self.running.index(parent)
        self._sync(parent)
        for s in range(1, group.width):
            child = SeqState(seq_id=self._new_seq_id(), req=parent.req,
                             num_prompt_tokens=parent.num_prompt_tokens,
                             max_output_tokens=parent.max_output_tokens,
                             arrival_ns=parent.arrival_ns, status=RUNNING,
                             num_output_tokens=parent.num_output_tokens,
                             num_tokens=parent.num_tokens,
                             num_computed_tokens=parent.num_computed_tokens,
                             num_alloc_tokens=parent.num_alloc_tokens, eager=parent.eager,
                             plain=False,
                             group=group, sample=s, first_sched_ns=parent.first_sched_ns,
                             first_token_ns=parent.first_token_ns,
                             first_sched_step=parent.first_sched_step,
                             first_token_step=parent.first_token_step,
                             cached_tokens_first=parent.cached_tokens_first,
                             order=parent.order)
            if self.prefix_caching:
                child.keys = parent.req.block_keys(self.block_size, s)
            self.allocator.fork(parent.seq_id, child.seq_id, block_hashes=child.keys)
            group.members.append(child)
            self.running.insert(idx + s, child)
            self.loose.insert(self.loose.index(parent) + s, child)
            self.num_generated_tokens += 1   # each sample draws its own first token

    def _reselect_beams(self, group: ForkGroup) -> None:
        """Beam search model (the vLLM paper's Fig. 15 setting): each time the beams complete a
        block, the ``width`` beams are reselected: every new beam picks a parent beam uniformly at
        random (seeded per request); a beam nobody picked is dropped (its blocks freed), a beam
        picked k times continues and is forked k-1 times. Beams stay in lockstep (same length), so
        a reselection happens at a block boundary and children share every full block."""
        live = [m for m in group.members if m.status == RUNNING]
        if len(live) < 2 or any(m.num_computed_tokens != live[0].num_computed_tokens for m in live):
            return  # a beam was preempted: no reselection until they are in lockstep again
        picks = sorted(group.rng.randrange(len(live)) for _ in live)
        counts = [picks.count(i) for i in range(len(live))]
        dropped = [m for m, c in zip(live, counts) if c == 0]
        for victim in dropped:
            parent = live[next(i for i, c in enumerate(counts) if c > 1)]
            counts[live.index(parent)] -= 1
            # the dropped beam's slot is reused: free it, fork from the parent
            self._free(victim, preempted=False)
            self._sync(parent)
            self.allocator.fork(parent.seq_id, victim.seq_id, block_hashes=victim.keys)
            victim.num_computed_tokens = parent.num_computed_tokens
            victim.num_alloc_tokens = parent.num_alloc_tokens
            victim.num_output_tokens = parent.num_output_tokens
            victim.num_tokens = parent.num_tokens

    # ------------------------------------------------------------------ batched decode runs
    def plan_decode_run(self, max_steps: int) -> int:
        """How many identical pure-decode steps can run from now, without any decision other
        than "every running request decodes one token": every running request is decoding, all
        fit the token budget, no step needs more blocks than are free (no preemption), nobody
        finishes before the last step, no fork/beam event, and the waiting queue is empty or its
        head cannot be admitted (its need only grows while decodes consume blocks, so it stays
        blocked). Returns 0 when the next step must be scheduled in detail."""
        running = self.running
        n = len(running)
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
        if self.waiting and not self._head_blocked(n):
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
            free = self.allocator.num_free_blocks
            cycles, rem = divmod(free, n)
            # every request takes at most one block per B steps, so the free blocks last at
            # least cycles * B steps; only a run longer than that (or a waiting head, which
            # needs the first step's blocks) needs the step-by-step count
            if cycles * B < k or self.waiting:
                hist = self.crossing_histogram()
                r = 0
                acc = 0
                while r < B - 1 and acc + hist[r + 1] <= rem:
                    r += 1
                    acc += hist[r]
                kb = cycles * B + r
                if kb < k:
                    k = kb
                first_step_blocks = hist[1]
            if k <= 0:
                return 0
        if self.waiting and not self._head_blocked(first_step_blocks):
            return 0
        return k

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

    def _head_blocked(self, first_step_blocks: int) -> bool:
        """Whether the waiting head cannot be admitted after the first decode step's allocations."""
        cfg = self.config
        n = len(self.running)
        if n >= cfg.max_num_seqs or cfg.max_num_batched_tokens - n <= 0:
            return True
        seq = self.waiting[0]
        alloc = self.allocator
        if not self.paged:
            num_new = min(seq.num_tokens, cfg.max_num_batched_tokens - n)
            lpt = cfg.long_prefill_token_threshold
            if 0 < lpt < num_new:
                num_new = lpt
            return not alloc.can_allocate(num_new, seq.num_prompt_tokens + seq.max_output_tokens,
                                          num_prompt_tokens=seq.num_prompt_tokens)
        keys = self._keys(seq)
        free = alloc.num_free_blocks - first_step_blocks
        wm = self.watermark_blocks  # something runs
        if cfg.full_prompt_admission:
            return alloc.blocks_needed(min(seq.num_tokens, cfg.max_model_len), keys) + wm > free
        hit = alloc.lookup(keys, seq.num_tokens) if keys is not None else 0
        n_new = seq.num_tokens - hit
        lpt = cfg.long_prefill_token_threshold
        if 0 < lpt < n_new:
            n_new = lpt
        n_new = min(n_new, cfg.max_num_batched_tokens - n)
        return alloc.blocks_needed(min(hit + n_new, cfg.max_model_len), keys) + wm > free

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
        num_running = len(self.running)
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
