"""vLLM's scheduler with the OffloadingConnector: the connector's hooks in ``schedule()``.

``OffloadScheduler`` is ``scheduler.Scheduler`` plus what vLLM 0.33's ``Scheduler`` does when a
KV connector is configured (``vllm/v1/core/sched/scheduler.py``; docs/OFFLOAD.md lists each
rule's source). The connector itself (lookups, stores, transfers) is ``offload.OffloadConnector``.

* The waiting loop. After the GPU prefix hit, the connector is asked for more
  (``get_num_new_matched_tokens``). It may answer "not yet" (a chunk is still being written,
  promoted from disk, or loaded by another request): the request is skipped for this step and
  the loop goes on with the next one (``skip_request``), where a request that does not fit
  stops it as before. A CPU hit is loaded asynchronously: the request gets GPU blocks for its
  GPU + CPU hit (not cached yet: ``delay_cache_blocks``), computes nothing this step, and waits
  in the queue of requests that hold blocks (``kv_holding_waiting``). That queue is drained
  first; a request whose load is done is then scheduled with ``num_computed_tokens`` = its hit
  (``num_tokens - 1`` when the whole prompt was loaded), its loaded blocks now cached.
* An async load must leave free the blocks that requests still prefilling (or loading) need
  to finish (``reserved_blocks``).
* After scheduling, each request's newly computed prompt chunks are offered to the CPU tier
  (``build_connector_meta``); a preemption flushes the victim's pending stores; a finished
  request's recency is committed in the next step.

Decode runs (decode_clock.py) stay exact: the engine ends a run at the next transfer completion,
and ``_head_admissible`` asks the connector the question the waiting loop would ask.
"""
from __future__ import annotations

from collections import deque

from kvsim.errors import InputError
from kvsim.simulator.async_scheduling import AsyncScheduler
from kvsim.simulator.admission import ADMIT, PROMOTE, SKIP, WAIT, Admission
from kvsim.simulator.kv_slots import cdiv
from kvsim.simulator.modes import check_mode
from kvsim.simulator.offload import WOULD_PROMOTE, OffloadConnector
from kvsim.simulator.scheduler import Scheduler
from kvsim.simulator.seq_state import SeqState
from kvsim.simulator.step_output import StepOutput

_HEAD_WALK = 16          # run planning looks past at most this many skipped requests


def check_offload_config(config) -> None:
    """What the tiers need of the engine (an InputError naming the flag otherwise): a
    combination the declared table runs with tiers (simulator/modes.py) and the paged allocator
    with prefix caching (a tier stores cached blocks)."""
    check_mode(config, offload=True)
    if not config.enable_prefix_caching:
        raise InputError("offload tiers need the paged allocator with prefix caching",
                         field="--cpu-offload-gib")


class OffloadScheduler(Scheduler):
    """vLLM v1 scheduler with the offloading connector (module doc).

    Args:
        config, allocator, seed: as ``Scheduler``.
        connector: the replica's OffloadConnector.
    """

    def __init__(self, config, allocator, seed: int = 0, *, connector: OffloadConnector):
        check_offload_config(config)
        super().__init__(config, allocator, seed=seed)
        self.offload = connector
        self.holding: deque[SeqState] = deque()   # vLLM kv_holding_waiting: loading or loaded
        # finished last step: their last offer (the table of an unstored prompt, else None),
        # then their recency, in this step's build_connector_meta
        self._just_finished: list[tuple[SeqState, list | None]] = []
        self._load_hit: dict[int, int] = {}       # loading request -> its GPU + CPU hit tokens
        # vLLM _inflight_prefills: requests loading, or admitted and still prefilling after
        # their chunk (until the step that completes their prompt)
        self._inflight: dict[int, SeqState] = {}
        self._admitted: set[int] = set()          # admitted in this schedule

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting or self.holding)

    @property
    def num_waiting(self) -> int:
        """The waiting queue and the requests that hold blocks (loading or loaded)."""
        return len(self.waiting) + len(self.holding)

    # ------------------------------------------------------------------ the step
    def schedule(self, now_ns: int, step_index: int) -> StepOutput:
        conn = self.offload
        pool = self.allocator.pool
        # the step's new block ids, while a finished request's store may read a reused block
        pool.handed_out = [] if conn.busy or self._just_finished else None
        out = super().schedule(now_ns, step_index)
        if self._inflight:   # _update_after_schedule: no longer prefilling, no longer in flight
            self._inflight = {i: s for i, s in self._inflight.items()
                              if s.num_computed_tokens < s.num_tokens or i in self._load_hit}
        # build_connector_meta: offers of what this step computes, then the finished requests
        retry, admitted = conn.retry, self._admitted
        # decodes on the clock are not entries: after a failed offer, every scheduled request
        for seq, n in (out.scheduled if retry else out.entries):
            # a prompt chunk ran, an earlier offer failed (vLLM offers in every step), or the
            # request was admitted (its lookup restarted its offers at chunk 0)
            if seq.num_computed_tokens - n < seq.num_prompt_tokens or seq.seq_id in retry \
                    or seq.seq_id in admitted:
                conn.offer(seq.seq_id, seq.keys, seq.num_prompt_tokens, seq.num_computed_tokens,
                           self.allocator.block_table(seq.seq_id))
        self._admitted.clear()
        self._commit_finished()
        if pool.handed_out is not None:
            conn.check_reused_blocks(pool.handed_out)
            pool.handed_out = None
        return out

    # Whether the engine goes idle as vLLM's does: a request arriving at that instant is
    # scheduled before any empty step, and an empty step tells the connector which requests
    # finished (vLLM's ``has_requests`` counts them until then). One group: kvsim signals
    # them at the next schedule and takes empty steps only for transfers (its fidelity cases
    # agree with vLLM's; the grouped connector's do not without it).
    idles_as_vllm = False

    @property
    def has_finished_to_signal(self) -> bool:
        return bool(self._just_finished)

    def empty_step(self) -> None:
        """What vLLM's schedule() does when it schedules nothing (the engine keeps stepping
        while transfers are pending): the connector still learns who finished."""
        self._commit_finished()

    def _commit_finished(self) -> None:
        """vLLM's _build_store_jobs over finished_req_ids (the prompt chunks an earlier offer
        could not store, from the blocks the request held), then on_request_finished."""
        conn = self.offload
        for seq, table in self._just_finished:
            if table is not None:
                conn.offer(seq.seq_id, seq.keys, seq.num_prompt_tokens, seq.num_prompt_tokens,
                           table)
            conn.request_finished(seq.seq_id)
        self._just_finished = []

    def _preempt(self, seq: SeqState, now_ns: int) -> None:
        super()._preempt(seq, now_ns)
        self._inflight.pop(seq.seq_id, None)
        self.offload.preempted(seq.seq_id)

    def _retire(self, finished: list, end_ns: int, step_index: int) -> None:
        conn = self.offload
        self._just_finished += [
            (seq, list(self.allocator.block_table(seq.seq_id))
             if conn.has_unoffered(seq.seq_id, seq.num_prompt_tokens) else None)
            for seq in finished]
        super()._retire(finished, end_ns, step_index)
        for seq in finished:
            self._inflight.pop(seq.seq_id, None)

    # ------------------------------------------------------------------ the waiting loop
    def _admit_waiting(self, out: StepOutput, slow: list, token_budget: int, lpt: int,
                       now_ns: int, step_index: int) -> None:
        """vLLM schedule()'s waiting loop with a connector: requests that hold blocks first,
        skipped requests set aside (and put back at the front, in order)."""
        running, conn = self.running, self.offload
        skipped_holding: list[SeqState] = []
        skipped_waiting: list[SeqState] = []
        max_num_seqs = self.config.max_num_seqs
        while True:
            queue = self.holding if self.holding else self.waiting
            # vLLM checks the budget and the running requests before it looks at the head: a
            # finished load is taken (its blocks cached) only when the head could run
            if not queue or token_budget <= 0 or len(running) >= max_num_seqs:
                break
            seq = queue[0]
            if queue is self.holding and conn.is_loading(seq.seq_id):
                if not conn.load_done(seq.seq_id):
                    skipped_holding.append(queue.popleft())   # still loading
                    continue
                self._loaded(seq)
            fit = self._admission(seq, token_budget, lpt)
            if fit is SKIP:
                skipped_waiting.append(queue.popleft())
                continue
            if not fit.admitted:
                break
            hit, n, ext = fit.num_hit_tokens, fit.num_new_tokens, fit.num_external_tokens
            if ext:
                if not self._start_load(seq, hit, ext, out):
                    break                   # the allocator's own check (KV-cache groups)
                queue.popleft()
                self._inflight[seq.seq_id] = seq
                skipped_holding.append(seq)
                continue
            if seq.num_computed_tokens:
                hit = seq.num_computed_tokens
                n = self._admit_loaded(seq, n, out, now_ns, step_index)
            else:
                n = self._admit(seq, fit, out, now_ns, step_index)
                if n is not None:
                    conn.count_query(seq.num_tokens, hit, preempted=seq.num_preemptions > 0)
            if n is None:
                break                       # the allocator's own check (KV-cache groups)
            queue.popleft()
            if hit + n < seq.num_tokens:
                self._inflight[seq.seq_id] = seq
            else:
                self._inflight.pop(seq.seq_id, None)
            self._admitted.add(seq.seq_id)
            self._enter_running(seq, n, slow, running)
            token_budget -= n
        self.holding.extendleft(reversed(skipped_holding))
        self.waiting.extendleft(reversed(skipped_waiting))

    def _admission(self, seq: SeqState, token_budget: int, lpt: int, num_blocks_taken: int = 0,
                   verdict_only: bool = False) -> Admission:
        """The admission rule with a connector: WAIT (stops the loop), SKIP (the connector cannot
        answer yet), PROMOTE (``verdict_only``: the connector would promote a disk hit), or
        ADMIT with the GPU hit, the first chunk and the tokens loaded asynchronously; a request
        that loaded its hit (``num_computed_tokens`` > 0) asks only for blocks for the rest.
        ``verdict_only`` asks the connector without side effects."""
        cfg = self.config
        if token_budget <= 0 or len(self.running) >= cfg.max_num_seqs:
            return WAIT
        if seq.num_computed_tokens:                 # loaded: its hit blocks are held
            return self._loaded_admission(seq, token_budget, lpt, num_blocks_taken)
        alloc = self.allocator
        keys = self._keys(seq)
        num_tokens = seq.num_tokens
        # decode-run planning: the blocks the step's decodes take first may evict hit blocks,
        # which the connector may then have (a smaller GPU hit, a larger load)
        hit = alloc.lookup(keys, num_tokens, num_blocks_taken)
        ext = self.offload.lookup(seq.seq_id, keys, num_tokens, hit, peek=verdict_only)
        if ext is None:
            return SKIP
        if ext is WOULD_PROMOTE:
            return PROMOTE
        if not ext:
            return super()._admission(seq, token_budget, lpt, num_blocks_taken)
        # an async load (vLLM allocate_slots): with full-prompt admission the whole prompt must
        # fit the free blocks; the GPU + CPU hit, allocated now, must fit beyond what requests
        # still prefilling or loading need to finish (reserved_blocks)
        free = alloc.num_free_blocks - num_blocks_taken
        wm = self.watermark_blocks if self.running else 0
        if cfg.full_prompt_admission and \
                alloc.blocks_needed(min(num_tokens, cfg.max_model_len), keys) + wm > free:
            return WAIT
        if alloc.blocks_needed(hit + ext, keys) + wm > free - self._reserved_blocks():
            return WAIT
        return Admission(ADMIT, hit, 0, ext)

    def _loaded_admission(self, seq: SeqState, token_budget: int, lpt: int,
                          num_blocks_taken: int) -> Admission:
        cfg = self.config
        n = seq.num_tokens - seq.num_computed_tokens
        if 0 < lpt < n:
            n = lpt
        n = min(n, token_budget)
        held = cdiv(seq.num_alloc_tokens, self.block_size)
        full = min(seq.num_tokens, cfg.max_model_len) if cfg.full_prompt_admission \
            else seq.num_computed_tokens + n
        wm = self.watermark_blocks if self.running else 0
        if cdiv(full, self.block_size) - held + wm > \
                self.allocator.num_free_blocks - num_blocks_taken:
            return WAIT
        return Admission(ADMIT, seq.num_computed_tokens, n)

    def _reserved_blocks(self) -> int:
        """vLLM ``_inflight_prefill_reserved_blocks``: blocks that requests still prefilling or
        loading need to hold their whole sequence."""
        B, mml = self.block_size, self.config.max_model_len
        return sum(max(0, cdiv(min(seq.num_tokens, mml), B) - cdiv(seq.num_alloc_tokens, B))
                   for seq in self._inflight.values())

    def _start_load(self, seq: SeqState, hit: int, ext: int, out: StepOutput) -> bool:
        """allocate_slots(..., num_external_computed_tokens=ext, delay_cache_blocks=True) and
        update_state_after_alloc: blocks for the hit, the load queued (True: ``_admission``
        checked that they fit)."""
        keys = seq.keys
        ok = self.allocator.allocate(seq.seq_id, hit + ext, block_hashes=keys,
                                     delay_cache_blocks=True)
        assert ok, "allocate failed after blocks_needed said it fits"
        assert self.allocator.num_cached_tokens(seq.seq_id) == hit
        seq.num_alloc_tokens = hit + ext
        self.offload.start_load(seq.seq_id, keys, hit, ext, seq.num_tokens,
                                preempted=seq.num_preemptions > 0)
        # vLLM records the prefix-cache query (GPU hits) at this admission
        self._count_prefix_query(seq, hit, out)
        self._load_hit[seq.seq_id] = hit + ext
        return True

    def _loaded(self, seq: SeqState) -> None:
        """_update_waiting_for_remote_kv: the loaded blocks are cached; the request has its hit
        computed (all but the last token when the whole prompt was loaded)."""
        self.allocator.cache_blocks(seq.seq_id)
        seq.num_computed_tokens = min(self._load_hit.pop(seq.seq_id), seq.num_tokens - 1)

    def _admit_loaded(self, seq: SeqState, n: int, out: StepOutput, now_ns: int,
                      step_index: int) -> int | None:
        """Start a request whose hit was loaded: blocks for its first chunk, RUNNING."""
        c = seq.num_computed_tokens
        if self.allocator.pool.handed_out is not None:   # vLLM sends a new request's table
            self.allocator.pool.handed_out += self.allocator.block_table(seq.seq_id)
        grow = c + n - seq.num_alloc_tokens
        if grow > 0:
            ok = self.allocator.append(seq.seq_id, grow)
            assert ok, "append failed after the admission check"
            seq.num_alloc_tokens = c + n
        return self._start_running(seq, c, n, out, now_ns, step_index)

    # ------------------------------------------------------------------ decode runs
    def plan_decode_run(self, max_steps: int) -> int:
        """No run while a loaded request waits to be scheduled (the base asks only about the
        waiting queue); otherwise the base's plan."""
        conn = self.offload
        if conn.has_unflushed_finished_stores or conn.retry \
                or any(table is not None for _, table in self._just_finished) \
                or any(self._ready(s) for s in self.holding):
            return 0   # a decode step could flush or offer a store, or a loaded request runs
        k = super().plan_decode_run(max_steps)
        if k:
            self._commit_finished()     # what the run's first step's schedule() would do
        return k

    def _ready(self, seq: SeqState) -> bool:
        """A request holding blocks that the waiting loop would try to schedule (its load is
        done), not skip (still loading)."""
        conn = self.offload
        return not conn.is_loading(seq.seq_id) or conn.load_reported(seq.seq_id)

    def _head_admissible(self, num_blocks_taken: int) -> bool:
        """Would the next step's waiting loop do anything? A loaded request, or the first
        request it would not skip, meeting the admission rule (the connector asked without side
        effects; a disk hit it would promote counts as something to do)."""
        budget = self.config.max_num_batched_tokens - len(self.running)
        lpt = self._lpt()
        if any(self._ready(seq) for seq in self.holding):
            return True
        for i, seq in enumerate(self.waiting):
            if i == _HEAD_WALK:
                return True
            fit = self._admission(seq, budget, lpt, num_blocks_taken, verdict_only=True)
            if fit is not SKIP:
                return fit is not WAIT     # admitted, a load started, or a disk promotion
        return False


class AsyncOffloadScheduler(AsyncScheduler, OffloadScheduler):
    """vLLM's AsyncScheduler with the offloading connector (vLLM's default on a GPU with
    ``--kv-offloading-size``): the two compose (async_scheduling.py's three rules, this
    module's hooks), plus what vLLM does differently with both:

    * The connector's completions that a step's poll found reach the scheduler when that step
      is processed, after the next step is scheduled (the engine holds them,
      ``OffloadConnector.hold`` / ``apply_held``).
    * A request scheduled in the step in flight is not preempted: vLLM would defer freeing its
      blocks until that step is processed (``defer_block_free``: the OffloadingConnector is a
      KV consumer, and a load could land in blocks still being written), and "a deferred free
      will not help with immediate allocation", so the request that needs blocks is not
      scheduled and the running loop stops.
    """

    def __init__(self, config, allocator, seed: int = 0, *, connector: OffloadConnector):
        super().__init__(config, allocator, seed, connector=connector)

    def _frees_now(self, seq: SeqState) -> bool:
        # scheduled in the step in flight: computed, sampled or (a request that finished on
        # the decode clock) decoded in it
        last = self.num_sched_steps - 1
        return not (self.batch_in_flight and last in (seq.sched_seq, seq.sampled_seq,
                                                      seq.inflight_seq))

    def advance_decode_run(self, k: int) -> None:
        super().advance_decode_run(k)
        self.batch_in_flight = True          # the run's last step is in flight

    def plan_decode_run(self, max_steps: int) -> int:
        # the step in flight's completions are applied after the next step's schedule
        if self.offload.has_held:
            return 0
        return super().plan_decode_run(max_steps)
