"""The engine loop's batch hooks: when the requests that finished in a step are freed and recorded.

The engine loop (engine.py) calls these at fixed moments and never asks which scheduler runs:

* ``num_done`` when it plans a step or a decode run: requests that finished in the batch in flight
  and still hold their blocks and their place in ``running`` (they decode no more);
* ``step_finished`` when a step (or a decode run) ends, with the requests that finished in it;
* ``process`` when the batch in flight is processed: what finished in it is freed and recorded;
* ``arrive`` when a request reaches the replica, ``take_arrivals`` before a schedule (the
  requests the scheduler sees then) and ``step_ran`` when a step (or a decode run's last step)
  ran from ``start_ns`` to ``end_ns``.

``SyncBatches`` is vLLM's synchronous loop (``EngineCore.step``): a step's output is processed
when it ends, so its finished requests are recorded then and nothing waits in flight.
``BatchQueue`` is async scheduling (``EngineCore.step_with_batch_queue``, vLLM's default on a
GPU): step k's output is processed after step k+1 is scheduled, so its finished requests wait
for ``process`` (the AsyncScheduler's ``retire_done``, simulator/async_scheduling.py, frees them).
The transfer hooks (transfer_hooks.py) hold a connector's completions for the same moment.
On a clock (``LookaheadQueue``), vLLM schedules step k + 1 when step k starts (its batch queue
holds two steps), so a request that reaches the engine while step k runs first joins the
schedule of step k + 2, made when step k ends: kvsim, which schedules step k + 1 when step k
ends, shows that schedule only the requests that arrived before step k started and keeps the
rest in the ``inbox`` until the next (docs/FIDELITY.md rule 36). The step clock keeps the
oracle's rule (arrivals at step s join schedule s): ``BatchQueue`` takes every arrival at once.

With a measured table's ``first_step`` (simulator.cost_table.FirstStep) a burst that reaches an
idle engine is split as real vLLM splits it: the engine core wakes on the first request and
schedules what has reached it by then (a cutoff drawn from the measured bursts, the replica's own
seeded draw), and the rest join the next step. Under async scheduling the first step's tokens come
back only once the next step's launch has returned, which for a step on no CUDA graph (more tokens
than the largest graph) is tens of ms of CPU: they come back with the next step's
(``first_tokens``, called when a detailed step has sampled).
"""
from __future__ import annotations

import random
from collections import deque


class SyncBatches:
    """The synchronous loop: a step is processed when it ends."""

    held = False        # a step's output waits for the next schedule
    lookahead = False   # an arrival first changes the schedule one step end later
    inbox: tuple | deque = ()   # requests that reached the replica, not yet seen by the scheduler

    def __init__(self, sched, rec):
        self.sched = sched
        self.rec = rec

    def arrive(self, req, sent_ns: int, now_ns: int) -> None:
        """``req`` (sent at ``sent_ns``) reached the replica at ``now_ns``: queued at once."""
        self.sched.add_request(req, sent_ns)

    def take_arrivals(self, now_ns: int, at_once: bool) -> None:
        """Before a schedule at ``now_ns``: the arrivals it sees join the scheduler (all are
        there already)."""

    def step_ran(self, start_ns: int, end_ns: int) -> None:
        """A step (or a decode run's last step) ran from ``start_ns`` to ``end_ns``."""

    def first_tokens(self, out, start_ns: int, end_ns: int) -> tuple[int, int]:
        """A detailed step ``out`` that ran from ``start_ns`` to ``end_ns`` has sampled: when the
        client sees its first tokens (at ``end_ns``, set by the scheduler, unless held back).
        Returns (first tokens of the step before that come back at ``end_ns`` instead, how many of
        their sequences' second tokens this step sampled): (0, 0) but for a split burst."""
        return 0, 0

    @property
    def num_done(self) -> int:
        """Requests finished in the batch in flight, not freed yet (never, synchronously)."""
        return 0

    def step_finished(self, finished) -> None:
        """A step (or a decode run) ended with ``finished``: processed now, so recorded now."""
        on_finished = self.rec.on_finished
        for seq in finished:
            on_finished(seq)

    def process(self) -> None:
        """The batch in flight is processed (nothing is in flight)."""


class BatchQueue(SyncBatches):
    """Async scheduling: a step is processed after the next one is scheduled; the scheduler keeps
    what finished in it as ``done_in_flight`` until then."""

    held = True

    @property
    def num_done(self) -> int:
        return len(self.sched.done_in_flight)

    def step_finished(self, finished) -> None:
        """Finished in the step now in flight: recorded when it is processed."""

    def process(self) -> None:
        """Free what finished in the batch in flight (in schedule order) and record it."""
        on_finished = self.rec.on_finished
        for seq in self.sched.retire_done():
            on_finished(seq)


class LookaheadQueue(BatchQueue):
    """Async scheduling on a clock: a step is scheduled while the one before it runs (module
    doc); arrivals wait in ``inbox`` as (request, sent ns, arrived ns) until a schedule sees them."""

    lookahead = True

    def __init__(self, sched, rec, first_step=None, seed: int = 0):
        super().__init__(sched, rec)
        self.inbox: deque = deque()
        self.step_start_ns = -1   # the last step that ran: its start (when it was scheduled)
        self.step_end_ns = -1     # ... and its end
        self.first_step = first_step     # a measured table's FirstStep, or None: a burst is taken whole
        self._rng = random.Random(seed)
        # a split burst: "first" until its first step has sampled, then that step's sequences
        # with their first tokens, until the next step has
        self.split: str | list | None = None

    def arrive(self, req, sent_ns: int, now_ns: int) -> None:
        self.inbox.append((req, sent_ns, now_ns))

    def take_arrivals(self, now_ns: int, at_once: bool) -> None:
        """Before the schedule at ``now_ns``: right after a step that ran to ``now_ns``, the
        requests that arrived by that step's start (vLLM scheduled this step then); else, or
        ``at_once`` (vLLM schedules with everything that arrived: the engine was idle, or it
        waited for the batch in flight with nothing else to schedule), every one; at an idle
        engine with ``first_step``, the share of a burst its first step takes (module doc)."""
        if self.split == "first":
            if self.sched.has_unfinished():
                return      # the rest of a split burst waits for the schedule after its first step
            self.split = None   # the first share never ran (rejected): the rest come in now
        cutoff = now_ns if at_once or self.step_end_ns != now_ns else self.step_start_ns
        inbox, add = self.inbox, self.sched.add_request
        limit = len(inbox)
        if at_once and self.first_step is not None and not self.sched.has_unfinished():
            k = sum(1 for entry in inbox if entry[2] <= cutoff)
            if k > 1:
                limit = self.first_step.taken(k, self._rng)
                self.split = "first" if limit < k else None
        while limit and inbox and inbox[0][2] <= cutoff:
            req, sent_ns, _ = inbox.popleft()
            add(req, sent_ns)
            limit -= 1

    def step_ran(self, start_ns: int, end_ns: int) -> None:
        self.step_start_ns, self.step_end_ns = start_ns, end_ns

    def first_tokens(self, out, start_ns: int, end_ns: int) -> tuple[int, int]:
        """A split burst's first step: its sequences' first tokens come back with the next step's
        when that one runs on no CUDA graph (module doc), and so do their second tokens, sampled
        by that step (SyncBatches.first_tokens)."""
        split = self.split
        if split is None:
            return 0, 0
        if split == "first":
            self.split = [seq for seq, _ in out.entries if seq.first_token_ns == end_ns]
            return 0, 0
        self.split = None
        if out.num_scheduled_tokens <= self.first_step.graph_tokens:
            return 0, 0
        held = [seq for seq in split if seq.first_token_ns == start_ns]  # (the step before ended as this began)
        for seq in held:
            seq.first_token_ns = end_ns
        ids = {id(seq) for seq in held}
        return len(held), sum(1 for seq, _ in out.scheduled if id(seq) in ids)


def batch_hooks(config, sched, rec, clock: bool = True, first_step=None, seed: int = 0) -> SyncBatches:
    """The batch hooks of a replica of ``config`` (async scheduling or not) and its scheduler;
    ``clock``: timed (False: the step clock, where arrivals keep the oracle's rule);
    ``first_step``: how a burst meets an idle engine (a measured table's; async on a clock only),
    drawn with ``seed``."""
    if not config.async_scheduling:
        return SyncBatches(sched, rec)
    return LookaheadQueue(sched, rec, first_step, seed) if clock else BatchQueue(sched, rec)
