"""The engine loop's transfer hooks: what a replica's KV connector does at each moment of a step.

The engine loop (engine.py) calls these at fixed moments and never asks whether a connector
runs or whether its completions wait for the batch in flight:

* ``forward_stall_ns`` when a step's forward is priced (stores flushed first, poll, submit);
* ``step_end`` when a step ends (apply what its poll found; async: hold it for the processing);
* ``batch_processed`` when the batch in flight is processed (async: apply what it held);
* ``poll_run`` when a run of decode steps is planned (its first step polls now);
* ``poll_empty`` / ``wait_until`` / ``poll`` while nothing runs but transfers are in flight
  (vLLM keeps taking empty steps that poll);
* ``signal_finished`` when the engine goes idle with finished requests the connector has not
  been told of (vLLM's one more empty step).

``NO_TRANSFERS`` is the replica without a connector: nothing moves, nothing is busy.
``ConnectorHooks`` drives an OffloadConnector (simulator/offload.py) and the scheduler that owns
it (an OffloadScheduler): synchronous, or ``held`` under async scheduling, where a step's
completions are applied once it is processed, after the next schedule (vLLM's
``update_from_output`` of the batch in flight).
"""
from __future__ import annotations


class NoTransfers:
    """A replica without a KV connector: every hook does nothing."""

    active = False     # a connector polls at a run's first step
    held = False       # completions wait for the batch in flight to be processed
    busy = False       # transfers queued or in flight
    idles_as_vllm = False

    def forward_stall_ns(self, start_ns: int, forward_ns: int) -> int:
        return 0

    def step_end(self, end_ns: int) -> None:
        pass

    def batch_processed(self, now_ns: int) -> None:
        pass

    @property
    def batch_in_flight(self) -> bool:
        """A step whose completions are held is in flight (async scheduling)."""
        return False

    def poll_run(self, now_ns: int, first_step_ns: int) -> tuple[bool, int | None]:
        return False, None

    def poll_empty(self, now_ns: int) -> bool:
        return False

    def wait_until(self, now_ns: int) -> int | None:
        return None

    def poll(self, now_ns: int) -> None:
        pass

    def empty_step(self) -> None:
        pass

    def signal_finished(self) -> None:
        pass


NO_TRANSFERS = NoTransfers()


class ConnectorHooks(NoTransfers):
    """An OffloadConnector's moments in the engine loop, with the OffloadScheduler that owns it.

    ``held``: async scheduling (a step's output is processed after the next schedule, as the
    batch hooks say).
    ``idles_as_vllm``: the scheduler idles as vLLM does (KV-cache groups): an arrival at the
    idle instant is scheduled first, and finished requests are signalled by an empty step.
    """

    active = True

    def __init__(self, connector, sched, held: bool):
        self.conn = connector
        self.sched = sched
        self.held = held
        self.idles_as_vllm = bool(sched.idles_as_vllm)

    @property
    def busy(self) -> bool:
        return self.conn.busy

    def forward_stall_ns(self, start_ns: int, forward_ns: int) -> int:
        """A step scheduled at ``start_ns`` with a forward of ``forward_ns``: flush, poll,
        submit. Returns how much later the forward starts (flushed stores)."""
        return self.conn.step(start_ns, forward_ns)

    def step_end(self, end_ns: int) -> None:
        if self.held:
            self.conn.hold()         # applied when this step is processed (after the next one)
        else:
            self.conn.apply(end_ns)  # the completions this step's poll found

    def batch_processed(self, now_ns: int) -> None:
        if self.held:
            self.conn.apply_held(now_ns)

    @property
    def batch_in_flight(self) -> bool:
        return self.held and self.sched.batch_in_flight

    def poll_run(self, now_ns: int, first_step_ns: int) -> tuple[bool, int | None]:
        """A decode run's first step polls and submits now: (whether it found completions,
        when the next transfer completes or None)."""
        conn = self.conn
        conn.step(now_ns, first_step_ns)
        return conn.has_found, conn.next_event_ns

    def poll_empty(self, now_ns: int) -> bool:
        """An empty step at ``now_ns`` polls; what it found is applied. Returns whether it found
        anything."""
        conn = self.conn
        conn.step(now_ns, 0)
        if not conn.has_found:
            return False
        conn.apply(now_ns)
        return True

    def wait_until(self, now_ns: int) -> int | None:
        """Nothing to schedule: pending transfers are submitted; when the next completes (None:
        none in flight)."""
        return self.conn.idle_until(now_ns)

    def poll(self, now_ns: int) -> None:
        """An empty step at ``now_ns`` (after a wait): find and apply what completed."""
        self.conn.poll(now_ns)

    def empty_step(self) -> None:
        """vLLM takes a step that schedules nothing (its connector hears of it)."""
        self.sched.empty_step()

    def signal_finished(self) -> None:
        """Going idle: an empty step tells the connector of requests finished since its last."""
        if self.sched.has_finished_to_signal:
            self.sched.empty_step()


def transfer_hooks(connector, sched, held: bool):
    """The hooks of a replica with ``connector`` (None: no connector) and its scheduler; ``held``:
    a step's output is processed after the next schedule (batch_hooks.py, async scheduling)."""
    return NO_TRANSFERS if connector is None else ConnectorHooks(connector, sched, held)
