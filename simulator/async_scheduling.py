"""vLLM's AsyncScheduler with two batches in flight (vLLM's default for generation on a GPU).

vLLM 0.33's ``EngineCore.step_with_batch_queue`` schedules step k+1 before it processes step k's
output (``vllm/v1/core/sched/async_scheduler.py`` adds an output placeholder per request whose
step samples). docs/FIDELITY.md section 1.6 gives the rules with vLLM's line numbers. Seen from
the synchronous scheduler, only three things change, and this subclass changes only them:

1. **What finished in step k is freed after step k+1 is scheduled** (rules 29-30). The sampled
   tokens of step k only feed decisions through the request's length, and a decode schedules one
   token with or without the placeholder, so the tokens are appended when step k completes, as in
   the synchronous loop. A request that got its last token is then *done in flight*: it keeps its
   blocks, its place in ``running`` (``max_num_seqs``, the long-prefill eligibility count, the
   ``running`` column) and is not scheduled (its last token is hidden from ``num_tokens``
   until the free, so the policy sees nothing left to compute, as vLLM's skip at
   ``scheduler.py`` 799-814 does). ``retire_done`` frees those requests right after the next
   ``schedule``; the engine's batch hooks call it (``BatchQueue.process``, batch_hooks.py).
2. **A done-in-flight request can be preempted** (``running[-1]``, rule 32): its blocks are freed
   then, the preemption counts, and it finishes while waiting (``retire_done`` drops it from the
   waiting queue).
3. **A request preempted while a decode is in flight frees one block unhashed** (rule 34): the
   block completed by that decode's input token (which was itself still in flight when the
   decode was scheduled) has no hash yet, so it goes to the front of the free queue and cannot be
   hit. To know which requests entered their last step with the input in flight, steps carry
   sequence numbers and requests three stamps (``SeqState.sched_seq``, ``sampled_seq``,
   ``inflight_seq``), written only for requests visited anyway; decode-clock requests are
   stamped when they leave the clock (they decode every step while on it).

The engine handles the fourth difference, a ``schedule`` that schedules nothing while a batch is
in flight (rule 31): it calls ``retire_done`` and schedules again, at the same step.
"""
from __future__ import annotations

from kvsim.simulator.scheduler import Scheduler
from kvsim.simulator.seq_state import FINISHED, PREEMPTED, RUNNING, SeqState
from kvsim.simulator.step_output import StepOutput


class AsyncScheduler(Scheduler):
    """vLLM AsyncScheduler + EngineCore.step_with_batch_queue for one replica (see the module
    docstring); same arguments as ``Scheduler``."""

    def __init__(self, config, allocator, seed: int = 0, **features):
        super().__init__(config, allocator, seed, **features)   # features: a feature's class
        self.done_in_flight: list[SeqState] = []
        self.num_sched_steps = 0   # steps scheduled so far: the next one gets this number
        # the last schedule() scheduled tokens: its step is in flight at the next schedule (an
        # empty schedule() makes vLLM process the batch in flight, rule 31)
        self.batch_in_flight = False

    # ------------------------------------------------------------------ schedule
    def _update_after_schedule(self, out: StepOutput, slow: list, num_fast: int,
                               fast_ctx: int) -> None:
        super()._update_after_schedule(out, slow, num_fast, fast_ctx)
        if self.done_in_flight:
            out.view_done = self.done_in_flight     # running, not scheduled
        self.batch_in_flight = bool(out.num_scheduled_tokens)
        if not out.num_scheduled_tokens:
            return     # not a step (rule 31)
        q = self.num_sched_steps
        self.num_sched_steps = q + 1
        for seq, n in out.entries:
            seq.sched_seq = q
            seq.sched_tokens = n
            # it sampled in the step before (vLLM: it has an output placeholder): this step's
            # input token is that sample, still in flight
            if seq.sampled_seq == q - 1:
                seq.inflight_seq = q
            if seq.num_computed_tokens >= seq.num_tokens:   # this step samples for it
                seq.sampled_seq = q

    def _unclock_all(self) -> None:
        # a request still on the clock decoded in the last step, from a token sampled in the
        # step before it (it joined the clock after sampling); stamp what the clock kept implicit
        last = self.num_sched_steps - 1
        for seq in self.running:
            if seq.clocked:
                seq.sampled_seq = last
                if seq.sched_seq != last:
                    seq.inflight_seq = last
        super()._unclock_all()

    def _hashed_on_preemption(self, seq: SeqState) -> int | None:
        # rule 34: its last step decoded a token that was in flight when it was scheduled, so
        # the block that token completes has no hash yet
        if self.prefix_caching and seq.plain and seq.inflight_seq == self.num_sched_steps - 1:
            return seq.num_computed_tokens - 1
        return None

    # ------------------------------------------------------------------ the step's output
    def advance_decode_run(self, k: int) -> None:
        q0 = self.num_sched_steps
        super().advance_decode_run(k)
        self.num_sched_steps += k
        last = q0 + k - 1
        for seq in self.clock.loose:   # every one decoded in each step of the run
            if k > 1 or seq.sampled_seq == q0 - 1:
                seq.inflight_seq = last
            seq.sched_seq = seq.sampled_seq = last

    def _retire(self, finished: list, end_ns: int, step_index: int) -> None:
        """Done in flight: finished now, freed by ``retire_done`` after the next schedule."""
        assert not self.done_in_flight, "a step finished before the previous one was freed"
        q = self.num_sched_steps - 1
        listed = False
        for seq in finished:
            seq.finish_ns = end_ns
            seq.finish_step = step_index
            if seq.sched_seq == q:       # visited in its last step: it is among ``loose``
                listed = True
            else:                        # it decoded on the clock in its last step
                seq.inflight_seq = q
            seq.num_tokens -= 1          # nothing left to compute (vLLM: the skip, rule 29)
        if listed:
            # still running but decoding no more: not among the requests a step or a decode
            # run visits (the clock's finishers left the clock already)
            self.clock.loose = [s for s in self.clock.loose if s.finish_ns < 0]
        self.done_in_flight = list(finished)

    def _head_admissible(self, num_blocks_taken: int) -> bool:
        # with requests done in flight, the frees after the next step's schedule may let the
        # waiting head in: that step is scheduled in detail
        return bool(self.done_in_flight) or super()._head_admissible(num_blocks_taken)

    def retire_done(self) -> list[SeqState]:
        """vLLM processes the in-flight step after this schedule: free what finished in it (in
        schedule order); a preempted one leaves the waiting queue. Returns them."""
        done = self.done_in_flight
        if not done:
            return done
        self.done_in_flight = []
        live = []
        for seq in done:
            seq.num_tokens += 1
            if seq.status == RUNNING:
                live.append(seq)
            elif seq.status == PREEMPTED:   # preempted after its last token (rule 32)
                self.waiting.remove(seq)
                seq.status = FINISHED
        if live:
            super()._retire(live, live[0].finish_ns, live[0].finish_step)
        return done
