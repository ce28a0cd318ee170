"""vLLM's scheduler over KV-cache groups with the OffloadingConnector (issue 27: groups x a CPU
tier): ``HybridScheduler``'s decisions (hybrid_scheduler.py) with ``OffloadScheduler``'s hooks
(offload_scheduler.py), where vLLM 0.33 does with groups what it does with one group, except:

* every block check is ``allocate_slots``'s over the groups: a load's admission asks it for
  the GPU + CPU hit (``num_external_computed_tokens``, not cached yet: ``delay_cache_blocks``,
  with what requests still prefilling or loading need to finish reserved: vLLM's
  ``_request_remaining_blocks``, a sliding window capped at its admission blocks), a loaded
  request's first chunk asks it for the rest; a refusal stops the waiting loop;
* the connector (offload_grouped.GroupedOffloadConnector) is told each step's block ids per
  group, and offered every scheduled request's prompt chunks (vLLM builds store jobs for every
  scheduled request); a finished request's last offer comes in the next step, before its
  recency is committed.

* Mamba groups ("align" mode) are stored from the states the GPU caches (vLLM's boundary-state
  hand-offs, taken every step), one job per state before the step's other stores, never from
  the block table.

No batched decode runs (as HybridScheduler).
"""
from __future__ import annotations

from kvsim.simulator.admission import ADMIT, PROMOTE, SKIP, WAIT, Admission
from kvsim.simulator.hybrid_scheduler import AsyncHybridScheduler, HybridScheduler
from kvsim.simulator.offload import WOULD_PROMOTE
from kvsim.simulator.offload_scheduler import AsyncOffloadScheduler, OffloadScheduler
from kvsim.simulator.seq_state import SeqState
from kvsim.simulator.step_output import StepOutput


class HybridOffloadScheduler(OffloadScheduler, HybridScheduler):
    """vLLM v1 scheduler over a GroupedPagedAllocator with the offloading connector (module
    doc). Args as ``OffloadScheduler`` (``connector``: a GroupedOffloadConnector)."""

    def schedule(self, now_ns: int, step_index: int) -> StepOutput:
        conn = self.offload
        out = HybridScheduler.schedule(self, now_ns, step_index)
        if self._inflight:   # _update_after_schedule: no longer prefilling, no longer in flight
            self._inflight = {i: s for i, s in self._inflight.items()
                              if s.num_computed_tokens < s.num_tokens or i in self._load_hit}
        # build_connector_meta: block ids, flushes, then the stores of what this step computes
        tables, admitted = self.allocator.block_tables, self._admitted
        conn.update_tables([(seq.seq_id, tables(seq.seq_id), seq.seq_id in admitted)
                            for seq, _ in out.scheduled])
        conn.flush_reused()
        states = self.allocator.take_boundary_states()
        if states:
            conn.store_states(states, self._live_seq)
        boundaries = self.allocator.replay_boundaries
        for seq, _ in out.scheduled:
            conn.store(seq.seq_id, seq.keys, seq.num_prompt_tokens, seq.num_tokens,
                       seq.num_computed_tokens, boundaries(seq.seq_id))
        admitted.clear()
        self._commit_finished()
        return out

    idles_as_vllm = True

    def _live_seq(self, seq_id) -> SeqState:
        """A running or loading request by id (one whose Mamba states were cached)."""
        return next(s for s in (*self.running, *self.holding) if s.seq_id == seq_id)

    def _commit_finished(self) -> None:
        """The finished requests' last stores, then their recency (vLLM's
        on_request_finished, after every store of the step)."""
        conn = self.offload
        for seq, boundaries in self._just_finished:
            conn.store(seq.seq_id, seq.keys, seq.num_prompt_tokens, seq.num_tokens,
                       max(seq.num_prompt_tokens, seq.num_tokens - 1), boundaries)
        for seq, _ in self._just_finished:
            conn.request_finished(seq.seq_id)
        self._just_finished = []
        conn.end_step()

    def _retire(self, finished: list, end_ns: int, step_index: int) -> None:
        for seq in finished:
            self.offload.fence_finished(seq.seq_id)
        self._just_finished += [(seq, self.allocator.replay_boundaries(seq.seq_id))
                                for seq in finished]
        HybridScheduler._retire(self, finished, end_ns, step_index)
        for seq in finished:
            self._inflight.pop(seq.seq_id, None)

    def plan_decode_run(self, max_steps: int) -> int:
        return 0

    def _free(self, seq: SeqState, preempted: bool, num_hashed_tokens: int | None = None) -> None:
        """A finished request first frees the window blocks it no longer needs, on the tokens
        processed (vLLM's ``_connector_finished``, before it hands the table to the connector),
        then all of its blocks; block ids then come back to the pool in vLLM's order."""
        if not preempted:
            self.allocator.remove_skipped(seq.seq_id, seq.num_computed_tokens)
        super()._free(seq, preempted, num_hashed_tokens)

    # ------------------------------------------------------------------ admissions
    def _admission(self, seq: SeqState, token_budget: int, lpt: int, num_blocks_taken: int = 0,
                   verdict_only: bool = False) -> Admission:
        """WAIT, SKIP (the connector cannot answer yet), or ADMIT: a loaded request's next
        chunk, a load of the CPU hit, or (nothing to load) HybridScheduler's admission."""
        if token_budget <= 0 or len(self.running) >= self.config.max_num_seqs:
            return WAIT
        c = seq.num_computed_tokens
        if c:                                   # loaded: its hit blocks are held
            n = seq.num_tokens - c
            if 0 < lpt < n:
                n = lpt
            n = min(n, token_budget)
            if self.mamba_split:                # a chunk ends where a Mamba state is cached
                n = self._mamba_block_aligned_split(seq, n, 0)
                if n == 0:
                    return WAIT
            return Admission(ADMIT, c, n)
        keys = self._keys(seq)
        hit = self.allocator.find_cache_hit(keys, seq.num_tokens)
        ext = self.offload.lookup(seq.seq_id, keys, seq.num_tokens, hit.num_tokens,
                                  peek=verdict_only)
        if ext is None:
            return SKIP
        if ext is WOULD_PROMOTE:                # asked without side effects: a disk hit
            return PROMOTE
        if not ext:     # nothing to load: HybridScheduler's admission at the same GPU hit
            return self._admission_at(seq, token_budget, lpt, hit)
        self._hit = hit
        if self.mamba_split:                    # the lookup's junction, for the loaded chunks
            self._junction[seq.seq_id] = hit.shared_prefix_boundary
        return Admission(ADMIT, hit.num_tokens, 0, ext)

    def _reserved_blocks(self) -> int:
        """vLLM ``_inflight_prefill_reserved_blocks`` over the groups (a loading request counts
        its hit as computed)."""
        alloc, loads = self.allocator, self._load_hit
        return sum(alloc.blocks_to_finish(s.seq_id, s.num_tokens,
                                          loads.get(s.seq_id, s.num_computed_tokens),
                                          s.num_prompt_tokens)
                   for s in self._inflight.values())

    def _start_load(self, seq: SeqState, hit: int, ext: int, out: StepOutput) -> bool:
        """allocate_slots for the GPU + CPU hit (False: it does not fit) and
        update_state_after_alloc: the load queued."""
        alloc, cfg = self.allocator, self.config
        keys = self._keys(seq)
        if not alloc.allocate_slots(
                seq.seq_id, 0, num_computed_tokens=0, num_tokens=seq.num_tokens,
                num_prompt_tokens=seq.num_prompt_tokens, block_hashes=keys, hit=self._hit,
                full_sequence_must_fit=cfg.full_prompt_admission,
                watermark_blocks=self.watermark_blocks if self.running else 0,
                num_external_computed_tokens=ext, delay_cache_blocks=True,
                reserved_blocks=self._reserved_blocks()):
            return False
        seq.num_alloc_tokens = hit + ext
        tables = alloc.block_tables(seq.seq_id)
        self.offload.start_group_load(seq.seq_id, keys, hit, ext, seq.num_tokens, tables,
                                      preempted=seq.num_preemptions > 0)
        self.offload.note_allocated(tables)
        self._count_prefix_query(seq, hit, out)
        self._load_hit[seq.seq_id] = hit + ext
        return True

    def _loaded(self, seq: SeqState) -> None:
        """_update_waiting_for_remote_kv: every group caches the loaded blocks."""
        hit = self._load_hit.pop(seq.seq_id)
        self.allocator.cache_blocks(seq.seq_id, hit)
        seq.num_computed_tokens = min(hit, seq.num_tokens - 1)

    def _admit_loaded(self, seq: SeqState, n: int, out: StepOutput, now_ns: int,
                      step_index: int) -> int | None:
        """A loaded request's first chunk: allocate_slots over the groups (None: it does not
        fit), RUNNING."""
        alloc, cfg = self.allocator, self.config
        c = seq.num_computed_tokens
        if not alloc.allocate_slots(
                seq.seq_id, n, num_computed_tokens=c, num_tokens=seq.num_tokens,
                num_prompt_tokens=seq.num_prompt_tokens,
                full_sequence_must_fit=cfg.full_prompt_admission,
                watermark_blocks=self.watermark_blocks if self.running else 0):
            return None
        seq.num_alloc_tokens = c + n
        self.offload.note_allocated(alloc.block_tables(seq.seq_id))
        return self._start_running(seq, c, n, out, now_ns, step_index)


class AsyncHybridOffloadScheduler(AsyncHybridScheduler, HybridOffloadScheduler):
    """vLLM's AsyncScheduler over KV-cache groups with the offloading connector (vLLM's default
    on a GPU for a hybrid model with ``--kv-offloading-size``): AsyncHybridScheduler's rules
    with this module's hooks, and AsyncOffloadScheduler's: a request scheduled in the step in
    flight is not preempted (vLLM defers freeing its blocks, ``defer_block_free``)."""

    _frees_now = AsyncOffloadScheduler._frees_now
