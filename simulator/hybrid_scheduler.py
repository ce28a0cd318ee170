"""The scheduler for hybrid models: vLLM v1's decisions over KV-cache groups.

A model whose layers keep different things (sliding windows, Mamba state, full attention) gets
one block table per KV-cache group over one shared pool (allocator.GroupedPagedAllocator, vLLM's
``HybridKVCacheCoordinator``). The scheduler is ``scheduler.Scheduler``'s, with what vLLM 0.33's
``Scheduler.schedule`` does differently when the KV-cache manager has groups:

* every scheduled request calls ``allocate_slots`` (sliding-window blocks that left the window
  are freed there, as the request grows), except a decode that ``decode_changes_state`` proves
  changes nothing (no new block, no block filled, no window or Mamba state crossing a block);
  so there is no decode clock and no batched decode run (a window can free blocks at any
  step);
* admission asks the groups for the longest prefix every group can serve
  (``find_cache_hit``: a sliding window needs only the blocks inside it, Mamba only a state
  cached at a block boundary) and ``allocate_slots`` makes the full-sequence check itself;
* with Mamba groups and prefix caching (vLLM's ``mamba_cache_mode="align"``) prefill chunks are
  cut where a Mamba state must be cached (``_mamba_block_aligned_split``): a running request
  that gets 0 tokens is skipped, a waiting head that gets 0 stops admissions.

Parallel sampling and beam search with groups are not modelled (vLLM's forks are per request,
our fork model is the full-attention block table's).

``AsyncHybridScheduler`` is the async feature (async_scheduling.py) over this policy, vLLM's
default for a hybrid model on a GPU. What the groups see of the batch in flight is what vLLM's
``allocate_slots`` is told: ``request.num_in_flight_tokens`` (the tokens the request was given in
the step in flight: a sliding window and a Mamba state free only what that step has processed)
and ``request.num_tokens`` without the token that step samples (a block that token completes is
cached by a later call), and after each schedule the step in flight's output is processed as
vLLM's ``update_from_output`` does: a request still running that sampled in it caches the blocks
of the tokens it has processed. As in the synchronous policy, a decode that provably changes
nothing skips ``allocate_slots`` (``decode_changes_state``, told the tokens in flight), and an
output that makes no block full skips the cache call; the allocator admits sliding windows with
two batches in flight (``max_concurrent_batches``).
"""
from __future__ import annotations

from kvsim.allocator.grouped import CacheHit
from kvsim.errors import InputError
from kvsim.simulator.admission import ADMIT, WAIT, Admission
from kvsim.simulator.async_scheduling import AsyncScheduler
from kvsim.simulator.scheduler import Scheduler
from kvsim.simulator.seq_state import RUNNING, SeqState
from kvsim.simulator.step_output import StepOutput


class HybridScheduler(Scheduler):
    """vLLM v1 scheduler over a GroupedPagedAllocator (see the module docstring)."""

    def __init__(self, config, allocator, seed: int = 0):
        super().__init__(config, allocator, seed=seed)
        self.clock.enabled = False          # windows and Mamba states move at any step
        self.lazy_decodes = False           # ``_grow`` decides which decodes to skip
        mamba = [m for m in allocator.managers if m.spec.kind == "mamba"]
        # vLLM: need_mamba_block_aligned_split (Mamba groups in "align" mode) and the first
        # Mamba group's prefill-checkpoint rules
        self.mamba_split = bool(mamba) and self.prefix_caching
        self._mamba = mamba[0] if mamba else None
        self.mamba_checkpoint_blocks = all(m.checkpoint_alignment is not None for m in mamba)
        self._hit = None                    # the waiting head's CacheHit (``_admission``)
        self._junction: dict[int, int] = {}  # seq_id -> shared_prefix_boundary of its lookup

    def add_request(self, req, arrival_ns: int) -> SeqState:
        if max(getattr(req, "n", 1) or 1, getattr(req, "beam_width", 1) or 1) > 1:
            raise InputError(f"request {req.request_id}: parallel sampling and beams are not "
                             "modelled with KV-cache groups", field="n")
        return super().add_request(req, arrival_ns)

    def plan_decode_run(self, max_steps: int) -> int:
        """No batched decode runs: every step is scheduled in detail."""
        return 0

    def schedule(self, now_ns: int, step_index: int) -> StepOutput:
        self.allocator.new_step()           # vLLM's new_step_starts (Mamba cache deferral)
        return super().schedule(now_ns, step_index)

    # ---------------------------------------------------------------- running requests
    def _num_new_tokens(self, seq: SeqState, lpt: int, token_budget: int) -> int:
        n = super()._num_new_tokens(seq, lpt, token_budget)
        if self.mamba_split and n > 0:
            n = self._mamba_block_aligned_split(seq, n, 0)
        return n

    def _grow(self, seq: SeqState, num_new_tokens: int) -> bool:
        """vLLM allocate_slots for a running request (every group: windows free first)."""
        c = seq.num_computed_tokens
        alloc = self.allocator
        if num_new_tokens == 1 and c >= seq.num_prompt_tokens and \
                not alloc.decode_changes_state(seq.seq_id, c):
            seq.num_alloc_tokens = c + 1    # the call would succeed and change nothing
            alloc.note_slots(seq.seq_id, c + 1)
            return True
        if not alloc.allocate_slots(seq.seq_id, num_new_tokens, num_computed_tokens=c,
                                    num_tokens=seq.num_tokens,
                                    num_prompt_tokens=seq.num_prompt_tokens):
            return False
        seq.num_alloc_tokens = c + num_new_tokens
        return True

    def _free(self, seq: SeqState, preempted: bool, num_hashed_tokens: int | None = None) -> None:
        # num_hashed_tokens is the paged async scheduler's rule 34; the groups cache only what
        # allocate_slots was told was sampled (AsyncHybridScheduler._hashed_on_preemption: None)
        assert num_hashed_tokens is None, "the groups know which blocks they cached"
        self.allocator.free(seq.seq_id, preempted=preempted)
        seq.num_alloc_tokens = 0
        self._junction.pop(seq.seq_id, None)

    # ---------------------------------------------------------------- admissions
    def _admission(self, seq: SeqState, token_budget: int, lpt: int, num_blocks_taken: int = 0,
                   verdict_only: bool = False) -> Admission:
        """The waiting head's hit and first chunk; the block check is ``allocate_slots``'s
        (``_admit``). No decode runs here, so ``num_blocks_taken`` is always 0."""
        cfg = self.config
        if token_budget <= 0 or len(self.running) >= cfg.max_num_seqs:
            return WAIT
        return self._admission_at(seq, token_budget, lpt,
                                  self.allocator.find_cache_hit(self._keys(seq), seq.num_tokens))

    def _admission_at(self, seq: SeqState, token_budget: int, lpt: int, hit: CacheHit
                      ) -> Admission:
        """The admission of a head whose GPU hit ``hit`` (``find_cache_hit``) is known."""
        num_tokens = seq.num_tokens
        self._hit = hit
        n = num_tokens - hit.num_tokens
        if 0 < lpt < n:
            n = lpt
        if n > token_budget:
            n = token_budget
        if self.mamba_split:
            self._junction[seq.seq_id] = hit.shared_prefix_boundary
            n = self._mamba_block_aligned_split(seq, n, hit.num_tokens)
            if n == 0:
                return WAIT
        return Admission(ADMIT, hit.num_tokens, n)

    def _admit(self, seq: SeqState, fit: Admission, out: StepOutput, now_ns: int,
               step_index: int) -> int | None:
        cfg = self.config
        hit, n = fit.num_hit_tokens, fit.num_new_tokens
        if not self.allocator.allocate_slots(
                seq.seq_id, n, num_computed_tokens=0, num_tokens=seq.num_tokens,
                num_prompt_tokens=seq.num_prompt_tokens, block_hashes=seq.keys, hit=self._hit,
                full_sequence_must_fit=cfg.full_prompt_admission,
                watermark_blocks=self.watermark_blocks if self.running else 0):
            return None
        self._start(seq, hit, n, hit + n, out, now_ns, step_index)
        return n

    # ---------------------------------------------------------------- Mamba "align" chunks
    def _mamba_block_aligned_split(self, seq: SeqState, num_new_tokens: int,
                                   num_hit_tokens: int) -> int:
        """vLLM's ``_mamba_block_aligned_split``: cut a prefill chunk where a Mamba state must
        be cached (block boundaries; the prompt's last boundary unless the backend exports it
        from inside the chunk; a shared prefix's junction). Returns the tokens to schedule
        (0: none now)."""
        start = seq.num_computed_tokens + num_hit_tokens
        # resumed requests replay their outputs: the prefill runs to num_tokens - 1
        prefill_end = max(seq.num_prompt_tokens, seq.num_tokens - 1)
        if start >= prefill_end:
            return num_new_tokens
        size = self.block_size
        mamba = self._mamba
        last_cache_position = mamba.checkpoint_position(seq.num_tokens)
        end = start + num_new_tokens
        if self.mamba_checkpoint_blocks and end >= prefill_end and mamba.checkpoint_valid(
                start, end, mamba.checkpoint_position(prefill_end)):
            internal = True
            last_cache_position = 0         # exported from inside this chunk
        else:
            internal = False
        if end < prefill_end:
            # state is written at chunk ends: they must be block aligned, unless a block is
            # wider than any chunk can be (then it advances sub-block)
            max_prefill_tokens = self.config.max_num_batched_tokens
            threshold = self.config.long_prefill_token_threshold
            if threshold > 0:
                max_prefill_tokens = min(max_prefill_tokens, threshold)
            aligned_end = end // size * size
            if aligned_end > start or size <= max_prefill_tokens:
                end = aligned_end
        junction = self._junction.get(seq.seq_id, 0)
        stops = ((start // size + 1) * size if start % size and not internal else 0,
                 last_cache_position,
                 start + (junction - start) // size * size if start < junction < end else 0)
        end = min((s for s in stops if start < s < end), default=end)
        return max(end - start, 0)

    # ---------------------------------------------------------------- accounting
    def num_logical_blocks(self) -> int:
        """Blocks the running requests' tables hold over all groups, shared ones once per
        holder (sharing saved = this minus the used blocks)."""
        tables = self.allocator.block_tables
        return sum(sum(1 for b in table if b) for seq in self.running
                   for table in tables(seq.seq_id))


class AsyncHybridScheduler(AsyncScheduler, HybridScheduler):
    """vLLM's AsyncScheduler over KV-cache groups (the module docstring's last paragraph)."""

    def _step_in_flight(self) -> int:
        """The sequence number of the step in flight at the next schedule (-2: none; no request
        is stamped with it)."""
        return self.num_sched_steps - 1 if self.batch_in_flight else -2

    def schedule(self, now_ns: int, step_index: int) -> StepOutput:
        in_flight = self._step_in_flight()
        sampled = [s for s in self.running if s.sampled_seq == in_flight] \
            if self.batch_in_flight and self.prefix_caching else ()
        out = super().schedule(now_ns, step_index)
        if sampled:
            self._cache_processed(sampled)
        return out

    def _cache_processed(self, sampled: list) -> None:
        """vLLM's ``update_from_output`` for the step in flight, which runs after this schedule:
        a request still running that sampled in it caches the blocks of the tokens it has
        processed (its computed tokens less those of the step just scheduled)."""
        step = self._step_in_flight()
        alloc = self.allocator
        for seq in sampled:
            if seq.status == RUNNING:
                processed = seq.num_computed_tokens - \
                    (seq.sched_tokens if seq.sched_seq == step else 0)
                if alloc.caches_more(seq.seq_id, processed):
                    alloc.cache_blocks(seq.seq_id, processed)

    def _grow(self, seq: SeqState, num_new_tokens: int) -> bool:
        """vLLM allocate_slots for a running request, told what the step in flight holds (a
        decode that provably changes nothing skips the call, as the synchronous policy's)."""
        c = seq.num_computed_tokens
        step = self._step_in_flight()
        in_flight = seq.sched_tokens if seq.sched_seq == step else 0
        num_tokens = seq.num_tokens - (seq.sampled_seq == step)
        alloc = self.allocator
        if num_new_tokens == 1 and c >= seq.num_prompt_tokens and \
                not alloc.decode_changes_state(seq.seq_id, c, in_flight, num_tokens):
            seq.num_alloc_tokens = c + 1    # the call would succeed and change nothing
            alloc.note_slots(seq.seq_id, c + 1)
            return True
        if not alloc.allocate_slots(seq.seq_id, num_new_tokens, num_computed_tokens=c,
                                    num_tokens=num_tokens, num_prompt_tokens=seq.num_prompt_tokens,
                                    num_in_flight_tokens=in_flight):
            return False
        seq.num_alloc_tokens = c + num_new_tokens
        return True

    def _hashed_on_preemption(self, seq: SeqState) -> int | None:
        # the groups cached only what allocate_slots was told was sampled (``_grow``): a block
        # the token in flight completes was never cached, and is freed as such
        return None
