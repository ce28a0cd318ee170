"""vLLM v0's scheduler (vLLM 0.2-0.5, chunked prefill off): prompt-only steps, then decode steps.

The engine of the vLLM paper. docs/SIMULATOR.md ("The v0 scheduler") gives each rule with the
vLLM source lines it follows (``vllm/core/scheduler.py`` and ``vllm/core/block_manager_v1.py``
of vLLM 0.4.3, with 0.2.7 where it differs). In short:

1. A step is either prompts only or decodes only (``_schedule_default``): waiting requests are
   admitted first, FCFS, head of line; if any was admitted the step runs only their whole prompts
   (a preempted request recomputes prompt + outputs as one prompt).
2. The head is admitted while its blocks leave the watermark free
   (``num_free - cdiv(len, B) >= int(0.01 * num_blocks)``, also into an empty engine), the
   step's prompt tokens stay within ``max_num_batched_tokens`` and the running requests stay
   within ``max_num_seqs``.
3. Otherwise every running request decodes, the earliest arrival first. At its turn a request
   needs one free block, whether or not its token starts a new block (``can_append_slots``);
   while none is free the latest arrival still waiting for its turn is preempted by recompute
   (front of the waiting queue), the request itself when nobody is left behind it.

Everything else (allocation, preemption mechanics, output processing, finishing) is the v1
scheduler's. ``running`` is kept in arrival order (``SeqState.order`` = arrival rank), so the
decode clock and decode runs (decode_clock.py) serve v0's decode steps too; they
keep one free block per step (``decode_block_reserve``), v0's condition for a step without
preemption.
"""
from __future__ import annotations

from bisect import insort

from kvsim.errors import InputError
from kvsim.simulator.admission import ADMIT, Admission
from kvsim.simulator.kv_slots import cdiv
from kvsim.simulator.scheduler import Scheduler
from kvsim.simulator.seq_state import ORDER, SeqState
from kvsim.simulator.step_output import StepOutput


class V0Scheduler(Scheduler):
    """vLLM v0's policy over the v1 scheduler's mechanics (see the module docstring); same
    arguments as ``Scheduler``."""

    decode_block_reserve = 1

    def add_request(self, req, arrival_ns: int) -> SeqState:
        if max(req.n, req.beam_width) > 1:
            raise InputError(f"request {req.request_id}: scheduler v0 does not model parallel "
                             "sampling or beam search (vLLM v0 swaps such groups out to CPU "
                             "memory when preempted)")
        return super().add_request(req, arrival_ns)

    def schedule(self, now_ns: int, step_index: int) -> StepOutput:
        """One step: the waiting prompts that fit, or else a decode step for everyone running."""
        out = StepOutput(entries=[])
        slow = self._admit_prompts(out, now_ns, step_index)
        if not slow:
            first_pass = self._schedule_running_clocked(0) if self.clock.enabled else None
            if first_pass is None:
                if self.clock.enabled:
                    self._unclock_all()
                first_pass = self._schedule_decodes(now_ns)
                self.clock.loose = list(self.running)
            out, _budget, slow, num_fast, fast_ctx = first_pass
            self._update_after_schedule(out, slow, num_fast, fast_ctx)
            return out
        self._update_after_schedule(out, slow, 0, 0)
        return out

    def _prompt_fits(self, seq: SeqState, num_tokens_taken: int, num_free_blocks: int) -> bool:
        """vLLM v0 _schedule_prefills for the head: can_allocate (the watermark) and the budget."""
        cfg = self.config
        n = seq.num_tokens
        return (num_free_blocks - cdiv(n, self.block_size) >= self.watermark_blocks
                and num_tokens_taken + n <= cfg.max_num_batched_tokens
                and len(self.running) < cfg.max_num_seqs)

    def _admit_prompts(self, out: StepOutput, now_ns: int, step_index: int) -> list:
        """Admit waiting requests FCFS while they fit; returns the admitted (seq, tokens)."""
        waiting = self.waiting
        slow = []
        taken = 0
        while waiting and self._prompt_fits(waiting[0], taken, self.allocator.num_free_blocks):
            seq = waiting.popleft()
            n = self._admit(seq, Admission(ADMIT, 0, seq.num_tokens), out, now_ns, step_index)
            slow.append((seq, n))
            taken += n
            seq.order = seq.seq_id      # running stays in arrival order (FCFS priority)
            insort(self.running, seq, key=ORDER)
            insort(self.clock.loose, seq, key=ORDER)
        return slow

    def _head_admissible(self, num_blocks_taken: int) -> bool:
        # v0 admits before the step's decodes take any block: the run's first step decides
        return self._prompt_fits(self.waiting[0], 0, self.allocator.num_free_blocks)

    def _schedule_decodes(self, now_ns: int):
        """A decode step one request at a time (vLLM v0 _schedule_running), same result tuple
        as ``Scheduler._schedule_running``."""
        out = StepOutput(entries=[])
        scheduled = out.entries
        running = self.running
        alloc = self.allocator
        for seq in running:
            # can_append_slots: one free block for the sequence, needed or not
            while alloc.num_free_blocks < 1:
                victim = running.pop()          # the latest arrival not yet served
                self._preempt(victim, now_ns)
                out.num_preempted += 1
                if victim is seq:
                    break
            else:
                ok = self._grow(seq, 1)
                assert ok, "a decode failed with a free block"
                scheduled.append((seq, 1))
                continue
            break
        return out, 0, list(scheduled), 0, 0
