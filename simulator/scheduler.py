"""One replica's scheduler: vLLM v1's decisions over a kvsim allocator.

This module is the lesson: it reads top to bottom as vLLM 0.33's ``vllm/v1/core/sched/
scheduler.py`` for the synchronous engine loop (``Scheduler``, not ``AsyncScheduler``), without
speculative decoding, LoRA, multimodal inputs or KV connectors. The comments name the vLLM
function each rule comes from.

1. ``add_request`` (vLLM ``add_request``): a request joins the back of the WAITING queue.
2. ``schedule`` (vLLM ``schedule``). There are no prefill and decode phases: each step gives
   every request tokens so that its ``num_computed_tokens`` catches up with its ``num_tokens``
   (prompt + outputs so far). That one rule covers chunked prefill, prefix hits and recomputation
   after preemption.

   a. RUNNING requests first, in admission order, within ``max_num_batched_tokens`` (the token
      budget). ``long_prefill_token_threshold`` caps one request's chunk when more than one
      request is eligible; a request never goes past ``max_model_len - 1`` computed tokens.
   b. When a running request cannot get the blocks it needs (``allocate_slots`` returns None),
      the LAST running request is preempted (``_preempt_request``: recompute, its blocks freed,
      ``num_computed_tokens`` = 0, FRONT of the waiting queue), again and again, until the
      allocation succeeds or the request has preempted itself.
   c. Then, unless this step preempted, WAITING requests in FCFS order while the budget lasts
      and ``len(running) < max_num_seqs``. ``_admission`` is the one admission rule:
      the prefix-cache hit (full blocks, capped at ``num_tokens - 1``), the first chunk, and the
      block check (vLLM's ``scheduler_reserve_full_isl``: blocks for the whole current length,
      evictable hits counting as consumed) plus the watermark (only when something runs). The
      first waiting request that does not fit stops the loop (FCFS, no skipping).
   d. ``_update_after_schedule``: computed tokens advance at schedule time.
3. ``finish_step`` (vLLM ``update_from_output``): a request samples one token in every step that
   completes its prefill (or decodes) and finishes when it has ``output_tokens`` tokens or
   reaches ``max_model_len`` (``check_stop``); finished requests are freed in the order they were
   scheduled, which fixes the order of vLLM's free queue.

With a contiguous allocator the loop is the same, but admission asks ``can_allocate`` for the
whole reservation (Orca-style) and growth never fails, so nothing is preempted.

What makes it fast lives in its own modules; none of them decides anything vLLM would decide
differently (tests/test_sim_scheduler.py compares them with stepping every request one by one,
block ids included):

* kv_slots.py: ``allocate_slots`` / ``free`` for running requests, with decode tokens told to
  the allocator lazily (only at a new block, a free, or when the pool is observed).
* decode_clock.py, one object the scheduler owns (``clock``): plain decoding requests ride a
  clock, so that a step costs only the requests that cross a block boundary, finish, or are off
  the clock (``_schedule_running_clocked`` is step 2a for a step that cannot bind); and decode
  runs, ``plan_decode_run`` / ``advance_decode_run``, apply many identical decode steps at once
  (the run stops before a step in which ``_admission`` would admit the waiting head).
* forks.py: parallel samples and beams (the vLLM paper's block sharing and copy-on-write).

Policy and mechanics. The v1 policy is ``schedule`` and what it calls to decide: ``_lpt``,
``_num_new_tokens`` (a running request's tokens), ``_schedule_running``, ``_admit_waiting``,
``_admission`` (the one admission rule) and ``_head_admissible`` (how the policy's step would
meet the waiting head; decode runs end there). The rest is mechanics every policy shares:
``add_request``, ``_preempt``, ``_admit`` (allocate and count an admission),
``_update_after_schedule``, ``finish_step``, ``_retire``, plus the request state (seq_state.py),
the step output (step_output.py) and the speed-ups above. Another policy (vLLM v0's prompt-first
scheduler; vLLM's AsyncScheduler, which overrides ``_update_after_schedule`` and the output
processing) is a subclass next to this one that replaces only what it decides differently.
"""
from __future__ import annotations

from bisect import bisect_left
from collections import deque

from kvsim.simulator.admission import ADMIT, ADMITTED, WAIT, Admission
from kvsim.simulator.config import EngineConfig
from kvsim.simulator.decode_clock import DecodeClock
from kvsim.simulator.forks import Forks
from kvsim.simulator.kv_slots import KVSlots
from kvsim.simulator.seq_state import FINISHED, ORDER, PREEMPTED, RUNNING, SeqState
from kvsim.simulator.step_output import StepOutput



class Scheduler(Forks, KVSlots):
    """vLLM v1 scheduler for one replica.

    Args:
        config: the replica's EngineConfig.
        allocator: a PagedAllocator or ContiguousAllocator (allocator/ package contract).
        seed: seeds beam reselection.
    """

    # vLLM's AsyncScheduler (async_scheduling.py) keeps what finished in a step until the next
    # step is scheduled (the engine's batch hooks, batch_hooks.py); this one keeps nothing
    done_in_flight: tuple | list = ()
    # free blocks a decode step must leave (decode clock and runs): vLLM v1 preempts only when a
    # request's new block is missing; vLLM v0 (scheduler_v0.py) keeps one free for each turn
    decode_block_reserve = 0

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
        self.next_order = 0             # admission counter (``running`` is sorted by it)
        # counters over the whole run
        self.num_preemptions = 0
        self.num_prefix_queries = 0     # tokens looked up at first admissions (vLLM's metric)
        self.num_prefix_hits = 0
        self.num_preempted_queries = 0  # the same for re-admissions after preemption
        self.num_preempted_hits = 0
        self.num_generated_tokens = 0
        self.num_first_tokens = 0       # of num_generated_tokens: a sequence's first (not a gap)
        self.num_prompt_tokens_computed = 0  # prefill work actually done (after hits)
        self.num_steps = 0
        # a decode into a block it holds skips the allocator (a policy whose allocator must
        # see every token, KV-cache groups, turns it off)
        self.lazy_decodes = self.paged
        self._init_kv_slots()
        # decode_clock.py: the clock and runs, given this policy's rules
        self.clock = DecodeClock(config, allocator, self._num_new_tokens, self._grow,
                                 self._head_admissible, self.decode_block_reserve)

    # ------------------------------------------------------------------ 1. arrivals
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
            self._start_fork_group(seq, width)      # forks.py
        self.waiting.append(seq)
        return seq

    def has_unfinished(self) -> bool:
        """Requests queued or running (the engine idles when there are none)."""
        return bool(self.running or self.waiting)

    @property
    def num_waiting(self) -> int:
        """Requests waiting (vLLM's ``get_request_counts``: every queue but the running one)."""
        return len(self.waiting)

    def _new_seq_id(self) -> int:
        sid = self.next_seq_id
        self.next_seq_id += 1
        return sid

    # ------------------------------------------------------------------ 2. one step
    def schedule(self, now_ns: int, step_index: int) -> StepOutput:
        """Decide one step (vLLM Scheduler.schedule). Computed tokens advance immediately."""
        lpt = self._lpt()
        # a) RUNNING requests: on the decode clock when no request can be cut short, else one
        # by one with preemption
        clock = self.clock
        first_pass = self._schedule_running_clocked(lpt) if clock.enabled else None
        if first_pass is None:
            if clock.enabled:
                self._unclock_all()
            first_pass = self._schedule_running(lpt, now_ns)
            clock.loose = list(self.running)
        out, token_budget, slow, num_fast, fast_ctx = first_pass
        # c) WAITING requests, FCFS, only if nobody was preempted in this step
        if not out.num_preempted:
            self._admit_waiting(out, slow, token_budget, lpt, now_ns, step_index)
        # d) computed tokens advance at schedule time
        self._update_after_schedule(out, slow, num_fast, fast_ctx)
        return out

    def _lpt(self) -> int:
        # vLLM schedule(): the threshold only applies when someone else could use the budget
        # (get_request_counts: the requests that hold blocks while loading count as waiting)
        if len(self.running) + self.num_waiting > 1:
            return self.config.long_prefill_token_threshold
        return 0

    def _num_new_tokens(self, seq: SeqState, lpt: int, token_budget: int) -> int:
        """Tokens a running request gets in this step (vLLM schedule()'s running loop): what it
        lacks, capped by the long-prefill threshold, the budget left and max_model_len."""
        c = seq.num_computed_tokens
        n = seq.num_tokens - c
        if 0 < lpt < n:
            n = lpt
        if n > token_budget:
            n = token_budget
        # vLLM: max_model_len - num_computed_tokens - num_sampled_tokens_per_step
        cap = self.config.max_model_len - c - 1
        if n > cap:
            n = cap
        return n

    def _schedule_running(self, lpt: int, now_ns: int):
        """2a + 2b, one request at a time (nobody on the decode clock).

        Returns:
            (out, token_budget left, the entries ``_update_after_schedule`` advances, number
            of decodes already advanced inline, their context tokens).
        """
        out = StepOutput(entries=[])
        scheduled = out.entries
        token_budget = self.config.max_num_batched_tokens
        running = self.running
        block_size = self.block_size
        num_new_tokens = self._num_new_tokens
        # A preemption pops victims off the end of ``running`` while we iterate: the list
        # iterator then simply stops earlier (vLLM's ``while req_index < len(self.running)``).
        slow = []                  # scheduled outside the decode fast path, updated later
        fast_ctx = 0               # decodes inside a held block: updated inline
        lazy = self.lazy_decodes   # paged decodes are told to the allocator lazily
        for seq in running:
            if token_budget <= 0:
                break
            c = seq.num_computed_tokens
            if seq.num_tokens - c == 1 and c % block_size and lazy and seq.plain and \
                    c >= seq.num_prompt_tokens:
                # the common case: one decode token into a block it holds, no allocator call
                # (the threshold and the max_model_len cap cannot bind for one token)
                seq.num_computed_tokens = c + 1
                fast_ctx += c + 1
                scheduled.append((seq, 1))
                token_budget -= 1
                continue
            n = num_new_tokens(seq, lpt, token_budget)
            if n <= 0:
                continue
            # vLLM: ``while True: new_blocks = allocate_slots(...)``; on None preempt
            # ``running[-1]`` and retry, until it fits or the request preempted itself
            ok = True
            while not self._grow(seq, n):
                if not self._frees_now(running[-1]):
                    ok = False           # vLLM: a deferred free will not help now
                    break
                victim = running.pop()
                self._preempt(victim, now_ns)
                out.num_preempted += 1
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
        return out, token_budget, slow, num_fast, fast_ctx

    def _preempt(self, seq: SeqState, now_ns: int) -> None:
        """2b. vLLM _preempt_request: free (recompute), reset, front of the waiting queue."""
        self._free(seq, preempted=True, num_hashed_tokens=self._hashed_on_preemption(seq))
        seq.status = PREEMPTED
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _frees_now(self, seq: SeqState) -> bool:
        """Would preempting this request free its blocks at once (vLLM
        ``_request_blocks_can_be_freed``; only with a KV connector and two batches in flight
        can it not)?"""
        return True

    def _hashed_on_preemption(self, seq: SeqState) -> int | None:
        """Tokens of a preempted request whose blocks have a hash (None: all; the synchronous
        engine hashes every block a request has computed)."""
        return None

    def _admit_waiting(self, out: StepOutput, slow: list, token_budget: int, lpt: int,
                       now_ns: int, step_index: int) -> None:
        """2c. vLLM schedule()'s waiting loop: admit the head FCFS while ``_admission`` lets it
        in; the first one that does not fit stops the loop."""
        waiting = self.waiting
        running = self.running
        while waiting:
            seq = waiting[0]
            fit = self._admission(seq, token_budget, lpt)
            if not fit.admitted:
                break
            n = self._admit(seq, fit, out, now_ns, step_index)
            if n is None:      # the allocator's own check refused it (KV-cache groups)
                break
            waiting.popleft()
            self._enter_running(seq, n, slow, running)
            token_budget -= n

    def _enter_running(self, seq: SeqState, n: int, slow: list, running: list) -> None:
        """An admitted request joins the step (``n`` tokens) and the running queue, in
        admission order, off the decode clock until the step ends."""
        slow.append((seq, n))
        seq.order = self.next_order
        self.next_order += 1
        running.append(seq)
        self.clock.loose.append(seq)

    def _admission(self, seq: SeqState, token_budget: int, lpt: int, num_blocks_taken: int = 0,
                   verdict_only: bool = False) -> Admission:
        """The admission rule: may the waiting head ``seq`` start now, and with how many tokens?

        The one place it is written: the waiting loop (``_admit_waiting``) and the decode-run
        planner (``plan_decode_run``, asking about a run's first step) both call it.

        Args:
            seq: the head of the waiting queue.
            token_budget: tokens left in this step's budget.
            lpt: the step's long-prefill threshold (``_lpt``).
            num_blocks_taken: free blocks the step will have taken before this admission but
                has not yet taken from the allocator (decode-run planning; 0 when scheduling).
            verdict_only: only the verdict is wanted, and nothing may change (decode-run
                planning): the prefix-cache lookup is skipped when the verdict does not depend
                on it.
        Returns:
            An Admission (simulator/admission.py): ADMIT with the hit and the first chunk
            (``ADMITTED`` when ``verdict_only`` skipped the counts), or ``WAIT``.
        """
        cfg = self.config
        # vLLM schedule(): ``while token_budget > 0``, and ``max_num_active_reqs`` (max_num_seqs)
        if token_budget <= 0 or len(self.running) >= cfg.max_num_seqs:
            return WAIT
        alloc = self.allocator
        num_tokens = seq.num_tokens
        paged = self.paged
        hit = 0
        if paged:
            keys = self._keys(seq)
            free = alloc.num_free_blocks - num_blocks_taken
            # KVCacheManager.allocate_slots: the watermark applies to admissions only, and only
            # when something already runs (has_scheduled_reqs)
            wm = self.watermark_blocks if self.running else 0
            # allocate_slots(full_sequence_must_fit=scheduler_reserve_full_isl): blocks for the
            # whole current length, evictable hits counting as consumed
            # (get_num_blocks_to_allocate); checked first, as it needs no hit count
            if cfg.full_prompt_admission:
                full = min(num_tokens, cfg.max_model_len)
                if alloc.blocks_needed(full, keys) + wm > free:
                    return WAIT
                if verdict_only:
                    return ADMITTED     # nothing below can refuse it (see the first chunk)
            # _get_local_prefix_cache_hit -> KVCacheManager.get_computed_blocks: full cached
            # blocks, at most num_tokens - 1 tokens (the last one is recomputed for its logits)
            if keys is not None:
                hit = alloc.lookup(keys, num_tokens)
        # ``num_new_tokens = request.num_tokens - num_computed_tokens`` (a resumed request
        # recomputes its outputs too), then the threshold and the budget
        n = num_tokens - hit
        if 0 < lpt < n:
            n = lpt
        if n > token_budget:
            n = token_budget
        if paged:
            # with full-prompt admission the first chunk's need is implied (same hits, fewer
            # blocks); without it, the first chunk must fit
            if not cfg.full_prompt_admission and \
                    alloc.blocks_needed(min(hit + n, cfg.max_model_len), keys) + wm > free:
                return WAIT
        # Orca-style contiguous pool: the whole reservation must fit now (growth never fails)
        elif not alloc.can_allocate(n, seq.num_prompt_tokens + seq.max_output_tokens,
                                    num_prompt_tokens=seq.num_prompt_tokens):
            return WAIT
        return Admission(ADMIT, hit, n)

    def _head_admissible(self, num_blocks_taken: int) -> bool:
        """Whether this policy would admit the waiting head in the next step if it were a
        pure decode of everyone running (decode runs ask, to end a run there): running
        requests go first (one token each, ``num_blocks_taken`` new blocks), then the head
        meets ``_admission`` with the budget they left."""
        return self._admission(self.waiting[0],
                               self.config.max_num_batched_tokens - len(self.running),
                               self._lpt(), num_blocks_taken, verdict_only=True).admitted

    def _admit(self, seq: SeqState, fit: Admission, out: StepOutput, now_ns: int,
               step_index: int) -> int | None:
        """Start the head that ``_admission`` let in: allocate its hit blocks and first chunk
        (vLLM allocate_slots), count the prefix-cache query, mark it RUNNING. Returns its first
        chunk (a policy whose allocator may still refuse returns None, with nothing changed)."""
        hit, n = fit.num_hit_tokens, fit.num_new_tokens
        alloc = self.allocator
        if self.paged:
            keys = seq.keys
            first = min(hit + n, self.config.max_model_len)
            ok = alloc.allocate(seq.seq_id, first, block_hashes=keys)
            assert ok, "allocate failed after blocks_needed said it fits"
            got = alloc.num_cached_tokens(seq.seq_id) if keys is not None else 0
            assert got == hit, f"allocator hit {got} != lookup {hit}"
        else:
            final = seq.num_prompt_tokens + seq.max_output_tokens
            ok = alloc.allocate(seq.seq_id, n, final, num_prompt_tokens=seq.num_prompt_tokens)
            assert ok, "contiguous allocate failed after can_allocate"
            first = n
        return self._start(seq, hit, n, first, out, now_ns, step_index)

    def _start(self, seq: SeqState, hit: int, n: int, num_alloc_tokens: int, out: StepOutput,
               now_ns: int, step_index: int) -> int:
        """An admission's bookkeeping once its slots are allocated: the prefix-cache query
        (vLLM's prefix_cache_stats), the counters, RUNNING, the step's entry. Returns ``n``."""
        if self.prefix_caching:
            self._count_prefix_query(seq, hit, out)
        seq.num_alloc_tokens = num_alloc_tokens
        seq.num_computed_tokens = hit
        return self._start_running(seq, hit, n, out, now_ns, step_index)

    def _count_prefix_query(self, seq: SeqState, hit: int, out: StepOutput) -> None:
        """vLLM's prefix_cache_stats for one admission: its tokens queried, ``hit`` found;
        re-admissions after preemption are counted apart."""
        num_tokens = seq.num_tokens
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

    @staticmethod
    def _start_running(seq: SeqState, hit: int, n: int, out: StepOutput, now_ns: int,
                       step_index: int) -> int:
        """Mark an admitted request RUNNING with ``hit`` cached tokens and a first chunk of
        ``n``: new or resumed, its first schedule, the step's entry. Returns ``n``."""
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
        return n

    def _update_after_schedule(self, out: StepOutput, slow: list, num_fast: int,
                               fast_ctx: int) -> None:
        """2d. vLLM _update_after_schedule: computed tokens advance at schedule time; the step's
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

    # ------------------------------------------------------------------ 3. the step's output
    def finish_step(self, out: StepOutput, end_ns: int, step_index: int) -> list[SeqState]:
        """vLLM update_from_output: sample tokens, finish and free requests, in schedule order.

        Returns:
            the sequences that finished in this step.
        """
        finished = out.finished
        reselect = []
        num_sampled = out.num_clocked
        if num_sampled:
            self.clock.o += 1
        for seq, _n in out.entries:
            if seq.num_computed_tokens < seq.num_tokens:
                continue  # a partial prefill chunk samples nothing
            seq.num_output_tokens += 1
            seq.num_tokens += 1
            num_sampled += 1
            if seq.first_token_ns < 0:
                seq.first_token_ns = end_ns
                seq.first_token_step = step_index
                self.num_first_tokens += 1
            # check_stop: max_tokens (output_tokens), or max_model_len via max_output_tokens
            if seq.num_output_tokens >= seq.max_output_tokens:
                finished.append(seq)
            elif seq.group is not None and seq.sample == 0:
                # forks.py: the first token forks the other samples; beams reselect at blocks
                if seq.num_output_tokens == 1:
                    self._fork_samples(seq)
                elif seq.group.kind == "beam" and seq.num_computed_tokens % self.block_size == 0:
                    reselect.append(seq.group)
        # one addition per step (an integer total: forks adding theirs inside the loop is fine)
        self.num_generated_tokens += num_sampled
        for group in reselect:   # after every beam got this step's token: lockstep again
            self._reselect_beams(group)
        self.clock.pop_finished(finished)
        if finished:
            self._retire(finished, end_ns, step_index)
        self.clock.clock_in_decoders(out.entries)
        return finished

    def _retire(self, finished: list, end_ns: int, step_index: int) -> None:
        """vLLM _free_request: finish and free requests (in the given order), drop them from
        running."""
        for seq in finished:
            seq.status = FINISHED
            seq.finish_ns = end_ns
            seq.finish_step = step_index
            self._free(seq, preempted=False)
        running = self.running
        if self.clock.enabled and len(finished) * 8 < len(running):
            for seq in finished:   # running is sorted by admission order
                del running[bisect_left(running, seq.order, key=ORDER)]
        else:
            self.running = [s for s in running if s.status != FINISHED]
        self.clock.drop_finished()

    # ------------------------------------------------------------------ the decode clock and runs
    def _schedule_running_clocked(self, lpt: int):
        """2a for a step in which no running request can be cut short (the decode clock's
        ``schedule_running``, with this policy's tokens and growth); None: the step could bind."""
        first_pass = self.clock.schedule_running(lpt, self.running)
        if first_pass is not None:
            self.num_pending_tokens += first_pass[3]     # clocked decodes: told lazily
        return first_pass

    def _unclock_all(self) -> None:
        """Every running request off the decode clock (before a step that may bind)."""
        self.clock.unclock_all(self.running)

    def plan_decode_run(self, max_steps: int) -> int:
        """How many identical pure-decode steps can run from now (decode_clock.py ``plan_run``;
        the waiting head meets ``_head_admissible``). 0: schedule the next step in detail."""
        # async scheduling: requests done in flight (async_scheduling.py) hold their place in
        # running until the run's first step is scheduled, but decode no more
        return self.clock.plan_run(len(self.running) - len(self.done_in_flight), max_steps,
                                   bool(self.waiting))

    def advance_decode_run(self, k: int) -> None:
        """Apply ``k`` planned decode steps at once (decode_clock.py ``advance_run``)."""
        num_running = len(self.running) - len(self.done_in_flight)
        num_told = self.clock.advance_run(k)
        self.num_pending_tokens += k * num_running - num_told
        self.num_generated_tokens += k * num_running

    def finish_decode_run(self, end_ns: int, step_index: int) -> list[SeqState]:
        """Completions at the end of a decode run (only its last step can finish requests)."""
        finished = self.clock.finish_run()
        if finished:
            self._retire(finished, end_ns, step_index)
        return finished
