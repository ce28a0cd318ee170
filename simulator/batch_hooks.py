"""The engine loop's batch hooks: when the requests that finished in a step are freed and recorded.

The engine loop (engine.py) calls these at fixed moments and never asks which scheduler runs:

* ``num_done`` when it plans a step or a decode run: requests that finished in the batch in flight
  and still hold their blocks and their place in ``running`` (they decode no more);
* ``step_finished`` when a step (or a decode run) ends, with the requests that finished in it;
* ``process`` when the batch in flight is processed: what finished in it is freed and recorded.

``SyncBatches`` is vLLM's synchronous loop (``EngineCore.step``): a step's output is processed
when it ends, so its finished requests are recorded then and nothing waits in flight.
``BatchQueue`` is async scheduling (``EngineCore.step_with_batch_queue``, vLLM's default on a
GPU): step k's output is processed after step k+1 is scheduled, so its finished requests wait
for ``process`` (the AsyncScheduler's ``retire_done``, simulator/async_scheduling.py, frees them).
The transfer hooks (transfer_hooks.py) hold a connector's completions for the same moment.
"""
from __future__ import annotations


class SyncBatches:
    """The synchronous loop: a step is processed when it ends."""

    held = False     # a step's output waits for the next schedule

    def __init__(self, sched, rec):
        self.sched = sched
        self.rec = rec

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


def batch_hooks(config, sched, rec) -> SyncBatches:
    """The batch hooks of a replica of ``config`` (async scheduling or not) and its scheduler."""
    return (BatchQueue if config.async_scheduling else SyncBatches)(sched, rec)
