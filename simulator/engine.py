"""SimPy engine: arrivals -> router -> one engine loop per replica; ``Simulation`` and ``simulate``.

Processes (SimPy, time in integer nanoseconds so that runs of steps add up exactly):

* ``_arrivals``: pulls requests lazily from the iterator (memory follows live requests, not the
  trace), hands each to the router (router.py) at its arrival time, rejects the ones that can
  never be served, and wakes an idle replica. With a measured table's frontend (``frontend_s``:
  a request's way in and a token's way out, outside the steps) a request is sent at its arrival
  time and reaches the router the way in later, in the order sent (in an open loop the client
  carries it itself; under a concurrency limit ``_deliver``, one courier for all), and the client
  sees each token, and a freed concurrency slot, the way out after its step.
* ``_engine`` (one per replica), the step loop: at each step boundary it records, then either
  applies a run of identical decode steps at once (``Scheduler.plan_decode_run`` /
  ``advance_decode_run``) or schedules steps in detail (``Scheduler.schedule`` /
  ``finish_step``): one step, or, with ``batch_decode_steps=False``, the planned run's k steps
  one by one (checked to be pure decodes, priced and integrated as the run they form: results are
  identical, which tests check). A run ends at the first step end at or after the next arrival,
  sample time, snapshot time or stop time, so every externally visible moment is a step
  boundary in both modes.

Event order at equal times: step ends (URGENT) before arrivals, arrivals before the next schedule
(the engine yields once when an arrival is due at the same instant) - vLLM's engine loop order.

What is recorded and how it is integrated lives in recorder.py, the summary in summary.py, step
durations in cost.py (``StepTimer``); the engine only calls them.
"""
from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import simpy
from simpy.core import URGENT

from kvsim.allocator import MEMORY_CLASSES, ContiguousAllocator, GroupedPagedAllocator, PagedAllocator
from kvsim.errors import InputError
from kvsim.simulator.batch_hooks import batch_hooks
from kvsim.simulator.config import EngineConfig
from kvsim.simulator.cost import (NS_PER_S, CostModel, FixedStepCost, StepBatch, StepTimer, clock_source,
                                  to_ns, uses_max_context_tokens)
from kvsim.simulator.footprint import check_simulation
from kvsim.simulator.in_the_loop import IN_THE_LOOP_COLUMNS, scheduled_step
from kvsim.simulator.modes import check_mode
from kvsim.simulator.hybrid_offload import AsyncHybridOffloadScheduler, HybridOffloadScheduler
from kvsim.simulator.offload import TierConfig
from kvsim.simulator.offload_grouped import make_connector
from kvsim.simulator.offload_scheduler import AsyncOffloadScheduler, OffloadScheduler
from kvsim.simulator.transfer_hooks import transfer_hooks
from kvsim.simulator.recorder import DECODE_RUN, NUM_CLASSES, Recorder, scheduled_arrival_ns
from kvsim.simulator.result import Result
from kvsim.simulator.async_scheduling import AsyncScheduler
from kvsim.simulator.router import ROUTERS, Router
from kvsim.simulator.hybrid_scheduler import AsyncHybridScheduler, HybridScheduler
from kvsim.simulator.scheduler import Scheduler
from kvsim.simulator.scheduler_v0 import V0Scheduler
from kvsim.simulator.summary import summarize
from kvsim.simulator.token_log import TokenLog

__all__ = ["ROUTERS", "Simulation", "make_allocator", "simulate"]

_NEVER = 1 << 62
# the schedulers simulator/modes.py's table names
SCHEDULERS = {cls.__name__: cls for cls in (Scheduler, AsyncScheduler, HybridScheduler,
                                            AsyncHybridScheduler, V0Scheduler, OffloadScheduler,
                                            AsyncOffloadScheduler, HybridOffloadScheduler,
                                            AsyncHybridOffloadScheduler)}


class _UrgentTimeout(simpy.Timeout):
    """A timeout processed before NORMAL events at the same instant (step ends before arrivals):
    SimPy's Timeout, scheduled URGENT. SimPy has no public priority argument; its own Timeout and
    Initialize set their state in their ``__init__`` as this one does."""

    def __init__(self, env: simpy.Environment, delay_ns: int):
        self.env, self.callbacks = env, []
        self._value, self._delay, self._ok = None, delay_ns, True
        env.schedule(self, URGENT, delay_ns)


def make_allocator(config: EngineConfig):
    """The allocator an EngineConfig describes."""
    if config.is_grouped:
        # the batches in flight (two with async scheduling) bound how far a window may lag
        return GroupedPagedAllocator(config.pool_blocks, config.block_size, config.kv_cache_groups,
                                     enable_prefix_caching=config.enable_prefix_caching,
                                     max_model_len=config.max_model_len,
                                     max_num_batched_tokens=config.max_num_batched_tokens,
                                     max_concurrent_batches=2 if config.async_scheduling else 1)
    if config.is_paged:
        return PagedAllocator(config.pool_blocks, config.block_size,
                              enable_prefix_caching=config.enable_prefix_caching,
                              null_block=config.null_block)
    return ContiguousAllocator(config.pool_tokens, policy=config.allocator,
                               max_model_len=config.max_model_len, placement=config.placement)


@dataclass(slots=True)
class _Run:
    """A run of ``k`` identical pure-decode steps (``Simulation._plan_run``): its first step's
    batch ``b0``, the ``n`` requests that decode of ``num_running``, the pool's breakdown and
    usage at its start (moved by the frees of the batch in flight), and whether the connector
    polled for its first step already."""

    b0: StepBatch
    k: int
    n: int
    num_running: int
    bd_start: list
    usage_start: float
    polled: bool


class _Replica:
    """One serving replica: its allocator, its scheduler and its recorder."""

    def __init__(self, index: int, config: EngineConfig, seed: int, recorder: Recorder,
                 step_clock: bool, offload: Sequence[TierConfig] = (), first_step=None):
        self.index = index
        self.allocator = make_allocator(config)
        self.offload = make_connector(config, offload, self.allocator) if offload else None
        # the scheduler the declared table names for this combination (simulator/modes.py)
        name = check_mode(config, offload=self.offload is not None)
        extra = {} if self.offload is None else {"connector": self.offload}
        self.sched = SCHEDULERS[name](config, self.allocator, seed=seed + index, **extra)
        self.rec = recorder.replica(index, self.sched, self.allocator, step_clock)
        # when a step's finished requests are freed (async: after the next schedule) and when
        # the scheduler sees an arrival (async on a clock: at the schedule after the next)
        # (and how a burst meets it idle: a measured table's first step, the replica's own draw)
        self.batch = batch_hooks(config, self.sched, self.rec, clock=not step_clock, first_step=first_step,
                                 seed=seed + index)
        # what the connector does at each moment of the loop (nothing without one)
        self.io = transfer_hooks(self.offload, self.sched, held=self.batch.held)
        self.wake: simpy.Event | None = None
        self.num_steps = 0
        self.token_row = -1       # the token log row of its last detailed step (simulator.token_log)
        self.compiled = None      # the keys its first-use compiles have run (simulator.first_use)
        self.compile_tally = {}   # each kernel's [compiles, seconds] priced
        self.idle_start = True    # the next priced step starts the replica from idle


def _check_arguments(config, cost_model, replicas, max_concurrency) -> None:
    """Simulation's arguments that are not sizes (footprint.py checks those)."""
    if not isinstance(config, EngineConfig):
        raise TypeError("config must be an EngineConfig")
    if not hasattr(cost_model, "step_time_s") or not hasattr(cost_model, "run_time_s"):
        raise TypeError("cost_model must implement step_time_s and run_time_s (CostModel)")
    if not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
    if max_concurrency is not None and (isinstance(max_concurrency, bool) or
                                        not isinstance(max_concurrency, int) or max_concurrency < 1):
        raise ValueError(f"max_concurrency must be an integer >= 1 or None, got {max_concurrency!r}")


class Simulation:
    """A simulation you can run to the end (``run``) or step through (``run_until``).

    Args:
        requests: iterable of workloads.Request in arrival order (consumed lazily).
        config: EngineConfig of every replica.
        cost_model: a CostModel (FixedStepCost(1.0) = vLLM step clock).
        replicas: number of independent replicas.
        router: "round-robin", "least-loaded" or "prefix-affinity".
        sample_interval_s: time-series sampling period (default 1 s; 1 step on the step clock).
        snapshot_times_s: times at which to record PoolSnapshots of every replica.
        seed: seeds beam reselection (the only randomness in the engine).
        progress: tqdm progress bar on stderr.
        record_steps: one time-series row per engine step with the vLLM oracle's column names
            (instead of time samples). Meant for small traces.
        batch_decode_steps: apply runs of identical decode steps at once (False: one by one;
            identical results, much slower).
        record_requests: keep the per-request table (False: only the latencies the summary's
            percentiles need, 24 bytes per request; ``Result.requests`` is then empty).
        offload: KV offload tiers below every replica's GPU pool (simulator.offload.TierConfig:
            CPU, then optionally disk); () for none. Needs the paged allocator with prefix
            caching.
        max_concurrency: a client's limit on requests in flight (vllm bench serve's
            ``--max-concurrency``): a request is sent when it has arrived and fewer than this
            many are in the engine, else when the next one leaves it (finished or rejected), at
            that step end. Its TTFT and E2E count from when it was sent; the wait is its
            ``client_queue_s``. None: open loop, every request sent when it arrives.
        record_token_times: keep when every step's tokens came out (simulator.token_log;
            ``Result.token_times``), for a benchmark client's inter-token latencies.
    """

    def __init__(self, requests: Iterable, config: EngineConfig, cost_model: CostModel, *,
                 replicas: int = 1, router: str = "round-robin",
                 sample_interval_s: float | None = None, snapshot_times_s: Iterable[float] = (),
                 seed: int = 0, progress: bool = False, record_steps: bool = False,
                 batch_decode_steps: bool = True, record_requests: bool = True,
                 offload: Sequence[TierConfig] = (), max_concurrency: int | None = None,
                 record_token_times: bool = False):
        _check_arguments(config, cost_model, replicas, max_concurrency)
        self.max_concurrency = max_concurrency
        self.token_log = TokenLog() if record_token_times else None
        self.in_flight = 0            # requests sent and not yet finished or rejected
        self.slot_freed_ns = -1       # when a request last left the engine under the limit
        self.slot_free = None         # the event a request waiting for a slot waits on
        self.router = Router(router)
        self.config = config
        self.cost = cost_model
        self.timer = StepTimer(cost_model)
        self._outside_steps(cost_model)
        # hardware in the loop (simulator.in_the_loop): every step is executed and timed
        self.in_the_loop = getattr(cost_model, "in_the_loop", False)
        if self.in_the_loop:
            if replicas != 1 or config.allocator != "paged":
                raise ValueError("hardware in the loop runs one replica with the paged allocator, got "
                                 f"{replicas} replicas of {config.allocator}")
            record_steps = True
        self.step_clock = isinstance(cost_model, FixedStepCost) and cost_model.step_s == 1.0
        sample_interval_s = 1.0 if sample_interval_s is None else sample_interval_s
        if not sample_interval_s > 0:
            raise ValueError(f"sample_interval_s must be > 0, got {sample_interval_s}")
        snapshot_ns = sorted(to_ns(t) for t in snapshot_times_s)
        if any(t < 0 for t in snapshot_ns):
            raise ValueError("snapshot_times_s must be >= 0")
        self.seed = seed
        self.record_steps = record_steps
        self.batching = batch_decode_steps
        offload = tuple(offload)
        # the sizes the user gave, against the memory there is, before anything is allocated
        check_simulation(config, replicas=replicas, num_snapshots=len(snapshot_ns),
                         sample_interval_s=sample_interval_s, record_requests=record_requests,
                         offload=offload)
        self.env = simpy.Environment()
        self.recorder = Recorder(sample_ns=max(1, to_ns(sample_interval_s)),
                                 snapshot_ns=snapshot_ns, record_steps=record_steps,
                                 record_requests=record_requests,
                                 offload_tiers=tuple(t.name for t in offload))
        self.offload = offload
        self.replicas = [_Replica(i, config, seed, self.recorder, self.step_clock, self.offload,
                                  getattr(cost_model, "first_step", None))
                         for i in range(replicas)]
        for rep in self.replicas:
            rep.rec.way_out_ns = self.way_out_ns
            rep.compiled = self.first_use.at_start(config.max_num_batched_tokens) if self.first_use else None
        if max_concurrency is not None:
            self.recorder.on_request_done = self._request_done
        # the longest context of each step, for a cost model that prices it (kept by the decode
        # clock as a heap: nothing to pay when the model does not ask)
        self.track_max_context = uses_max_context_tokens(cost_model)
        if self.track_max_context:
            for rep in self.replicas:
                rep.sched.clock.track_max_context()
        if self.in_the_loop:
            for rep in self.replicas:
                rep.sched.clock.enabled = False   # every running request visited every step
            self.recorder.steps.extra_columns = IN_THE_LOOP_COLUMNS
        self.num_arrived = 0
        self.num_rejected = 0
        self.next_arrival_ns = _NEVER
        self.stop_ns = _NEVER
        self.arrivals_done = False
        self.wall_s = 0.0
        self._finalised = False
        self._progress = None
        if progress:
            from tqdm import tqdm
            self._progress = tqdm(unit="req", desc="replay", file=sys.stderr, mininterval=0.5)
        self._iter = iter(requests)
        self.env.process(self._arrivals())
        for rep in self.replicas:
            self.env.process(self._engine(rep))

    def _outside_steps(self, cost_model) -> None:
        """What a measured table prices outside its steps' batches: a step that starts an idle
        engine (``idle_start_s``, c_idle: with async scheduling nothing in flight hides its CPU
        work; after an idle wait of ``idle_start_min_wait_s`` or more), a request's way in
        (send -> schedulable: a + b per prompt token) and a token's way out (its step's end ->
        the client) (``frontend_s``); none for other clocks."""
        self.idle_start_ns = to_ns(getattr(cost_model, "idle_start_s", 0.0))
        # a fresh engine's first-use compiles (simulator.first_use), each replica's own
        self.first_use = getattr(cost_model, "first_use_compiles", None)
        self.idle_start_min_wait_ns = to_ns(getattr(cost_model, "idle_start_min_wait_s", 0.0))
        self.way_in_s, self.way_in_per_token_s, way_out_s = getattr(cost_model, "frontend_s", (0.0, 0.0, 0.0))
        self.way_out_ns = to_ns(way_out_s)
        self._client_due_ns = _NEVER
        self.deliveries: deque[int] = deque()   # requests on their way in: when each arrives
        self._on_the_way: deque = deque()       # ... and (request, sent ns) of each, in that order
        self._courier_wake: simpy.Event | None = None    # the courier waits for a request to carry
        self._courier = None
        self._last_delivery_ns = -1             # when the last request sent reached the scheduler
        self.sending_done = False

    # ------------------------------------------------------------------ public stepping API
    @property
    def now_s(self) -> float:
        return self.env.now / NS_PER_S

    @property
    def done(self) -> bool:
        """All requests arrived and finished (or were rejected)."""
        return self.arrivals_done and all(
            not r.sched.has_unfinished() and not r.batch.inbox for r in self.replicas)

    def run_until(self, t_s: float) -> None:
        """Advance simulated time to ``t_s`` (runs of decode steps end at the first step
        boundary at or after it, so the state seen afterwards is exact at that boundary)."""
        t_ns = to_ns(t_s)
        if t_ns <= self.env.now:
            return
        started = time.perf_counter()
        self.stop_ns = t_ns
        self.env.run(until=t_ns)
        self.stop_ns = _NEVER
        self.wall_s += time.perf_counter() - started

    def snapshot(self, replica: int = 0):
        """PoolSnapshot of one replica's pool now (numpy arrays, see allocator.PoolSnapshot)."""
        return self.replicas[replica].rec.pool_snapshot()

    def state(self) -> dict:
        """Live figures for a dashboard: time, running, waiting, finished, preemptions, usage,
        breakdown."""
        bd = [0] * NUM_CLASSES
        for rep in self.replicas:
            for i, v in enumerate(rep.rec.breakdown()):
                bd[i] += v
        return {"time_s": self.now_s, "running": sum(len(r.sched.running) for r in self.replicas),
                "waiting": sum(r.sched.num_waiting for r in self.replicas),
                "finished": self.recorder.requests.num_finished,
                "rejected": self.num_rejected, "arrived": self.num_arrived,
                "preemptions": sum(r.sched.num_preemptions for r in self.replicas),
                "kv_usage": float(np.mean([r.allocator.usage for r in self.replicas])),
                "breakdown": dict(zip(MEMORY_CLASSES, bd)), "done": self.done}

    def run(self) -> Result:
        """Run to the end and return the Result."""
        started = time.perf_counter()
        self.env.run()
        self.wall_s += time.perf_counter() - started
        return self.result()

    def result(self) -> Result:
        """Summary, tables and snapshots of what has been simulated so far."""
        recorder = self.recorder
        if not self._finalised and self.done:
            end_ns = recorder.end_ns
            for rep in self.replicas:   # close every replica's integrals at the end
                rep.rec.close_idle_gap(end_ns)
                rep.rec.final_sample(end_ns)
            self._finalised = True
        cfg = self.config
        # the clock's own error against real vLLM where it was measured (planner.held_out)
        held_out = getattr(self.cost, "held_out", None)
        summary = summarize(
            recorder, self.replicas, num_arrived=self.num_arrived,
            num_rejected=self.num_rejected, wall_s=self.wall_s,
            config={"engine": cfg.as_dict(),
                    "replicas": len(self.replicas), "router": self.router.policy,
                    "seed": self.seed, "cost_model": type(self.cost).__name__,
                    "clock": clock_source(self.cost),
                    **({"clock_held_out": held_out} if held_out else {}),
                    "step_clock": self.step_clock})
        return Result(summary, recorder.timeseries(), recorder.requests.frame(),
                      list(recorder.snapshots),
                      self.token_log.arrays() if self.token_log is not None else None)

    # ------------------------------------------------------------------ arrivals
    def _arrivals(self):
        """The client: sends each request at its arrival time (under a concurrency limit, once
        a slot frees: the way out after the request that held it finished); it reaches the
        scheduler the way in later (``_deliver``; at once without a frontend)."""
        env = self.env
        it = self._iter
        step_clock = self.step_clock
        frontend = bool(self.way_in_s or self.way_in_per_token_s or self.way_out_ns)
        last_ns = -1
        pending = next(it, None)
        count = 0
        limit = self.max_concurrency
        while pending is not None:
            req = pending
            t_ns = scheduled_arrival_ns(req, step_clock)
            if t_ns < last_ns:
                raise InputError(f"request {req.request_id}: arrival {t_ns / NS_PER_S} s is before "
                                 f"the previous request's {last_ns / NS_PER_S} s (sort the trace)",
                                 field="arrival")
            last_ns = t_ns
            # an open loop with a frontend: nothing waits on the client, which carries the
            # request in itself, waking once at its arrival at the scheduler (below)
            carry = frontend and limit is None and not self.deliveries
            self._due(t_ns + self._way_in_ns(req))
            if t_ns > env.now and not carry:
                yield env.timeout(t_ns - env.now)
            if limit is not None:
                while self.in_flight >= limit:
                    # closed loop: sent when a request leaves the engine (_request_done), at
                    # that step end; until then no arrival is due
                    self._due(_NEVER)
                    self.slot_free = env.event()
                    yield self.slot_free
                    self.slot_free = None
                # with a frontend, a freed slot is seen at the client the way out after it frees
                t_ns = max(env.now, self.slot_freed_ns + self.way_out_ns) \
                    if frontend and self.slot_freed_ns >= 0 else env.now
            if carry:     # (one event a request, as without a frontend)
                engine_ns = max(t_ns + self._way_in_ns(req), self._last_delivery_ns)
                self._last_delivery_ns = engine_ns
                self._due(engine_ns)
                if engine_ns > env.now:
                    yield env.timeout(engine_ns - env.now)
                self._arrive(req, t_ns)
            elif frontend:
                self.in_flight += 1       # sent: its slot is taken
                engine_ns = max(t_ns + self._way_in_ns(req), self.deliveries[-1] if self.deliveries else -1,
                                self._last_delivery_ns)
                self._last_delivery_ns = engine_ns
                self.deliveries.append(engine_ns)
                self._on_the_way.append((req, t_ns))
                self._due(_NEVER)
                if self._courier is None:
                    self._courier = env.process(self._deliver())
                elif self._courier_wake is not None and not self._courier_wake.triggered:
                    self._courier_wake.succeed()
            else:
                self._arrive(req, t_ns)
            count += 1
            if self._progress is not None and count % 1000 == 0:
                self._progress.update(1000)
            pending = next(it, None)
        self._due(_NEVER)
        self.sending_done = True
        self.arrivals_done = not self.deliveries
        if self._courier_wake is not None and not self._courier_wake.triggered:
            self._courier_wake.succeed()      # nothing more to carry: the courier ends
        if self._progress is not None:
            self._progress.update(count % 1000)
            self._progress.close()

    def _way_in_ns(self, req) -> int:
        if not (self.way_in_s or self.way_in_per_token_s):
            return 0
        return to_ns(self.way_in_s + self.way_in_per_token_s * req.prompt_tokens)

    def _due(self, client_ns: int) -> None:
        """The next arrival at the scheduler: the first request on its way in, or ``client_ns``
        (the client's next one, reached the way in after it is sent; _NEVER: none due)."""
        self._client_due_ns = client_ns
        self.next_arrival_ns = min(self.deliveries[0], client_ns) if self.deliveries else client_ns

    def _deliver(self):
        """The requests on their way in reach the scheduler, in the order they were sent (their
        times never decrease): one process for all of them, one timeout each, that waits for the
        client's next send when none is on the way."""
        env, times, items = self.env, self.deliveries, self._on_the_way
        while True:
            if not times:
                if self.sending_done:
                    return
                self._courier_wake = env.event()
                yield self._courier_wake
                self._courier_wake = None
                continue
            if times[0] > env.now:
                yield env.timeout(times[0] - env.now)
            times.popleft()
            req, sent_ns = items.popleft()
            self._arrive(req, sent_ns, sent=True)
            self._due(self._client_due_ns)
            if self.sending_done and not times:
                self.arrivals_done = True

    def _request_done(self) -> None:
        """A request left the engine (finished or rejected) under a concurrency limit: its slot
        frees, and a request waiting for one is sent now, before the next step is scheduled
        (the engine loop yields to arrivals due at its time)."""
        self.in_flight -= 1
        self.slot_freed_ns = self.env.now
        if self.slot_free is not None and not self.slot_free.triggered:
            self.slot_free.succeed()
            self.next_arrival_ns = self.env.now

    def _arrive(self, req, t_ns: int, sent: bool = False) -> None:
        """A request arrives: the router picks its replica, which queues it (or it is rejected).
        ``t_ns``: when it was sent; ``sent``: its slot was taken then (a frontend's way in)."""
        self.num_arrived += 1
        if not sent:
            self.in_flight += 1
        rep = self.router.pick(req, self.replicas)
        if self._unfit(req):
            self.num_rejected += 1
            self.recorder.record_rejected(rep.index, req, t_ns)
            return
        rep.batch.arrive(req, t_ns, self.env.now)
        rep.rec.arrived_since_step += 1
        if rep.wake is not None and not rep.wake.triggered:
            rep.wake.succeed()

    def _unfit(self, req) -> str:
        """Why a request can never be served ('' if it can). vLLM rejects prompts that leave no
        room for one output token; a request whose KV can never fit in the whole pool would
        stall (or livelock preempting itself) in vLLM, so it is rejected and counted."""
        cfg = self.config
        if req.prompt_tokens + 1 > cfg.max_model_len:
            return "prompt longer than max_model_len - 1"
        width = max(req.n, req.beam_width)
        final = req.prompt_tokens + min(req.output_tokens, cfg.max_model_len - req.prompt_tokens)
        if cfg.is_grouped:
            if self.replicas[0].allocator.max_blocks_needed(final - 1) > cfg.pool_blocks - 1:
                return "needs more blocks than the pool has"
        elif cfg.is_paged:
            usable = cfg.pool_blocks - int(cfg.null_block)
            if -(-(final - 1) // cfg.block_size) > usable:
                return "needs more blocks than the pool has"
            if cfg.scheduler == "v0" and \
                    -(-req.prompt_tokens // cfg.block_size) > usable - cfg.watermark_blocks:
                # vLLM v0 can_allocate NEVER: the prompt would leave less than the watermark
                return "prompt needs more blocks than vLLM v0 admits (watermark)"
        else:
            extent = self.replicas[0].allocator.extent_tokens(
                final, num_prompt_tokens=req.prompt_tokens)
            if width * extent > cfg.pool_tokens:
                return "reservation larger than the pool"
        return ""

    # ------------------------------------------------------------------ the step loop
    def _engine(self, rep: _Replica):
        """One replica's step loop (a SimPy process): wait for work, then either a run of
        identical decode steps applied at once (``_plan_run`` / ``_advance_run`` /
        ``_close_run``) or steps scheduled in detail (``_detailed_steps``)."""
        env, sched, rec = self.env, rep.sched, rep.rec
        # ``now`` is the replica's time. It runs ahead of SimPy's across step ends that nothing
        # can observe (``_unobserved``): such a step is finished at once and the next one
        # scheduled, without a round trip through the event queue.
        now = env.now
        while True:
            if rep.batch.inbox:
                rep.batch.take_arrivals(now, at_once=not sched.has_unfinished())
            if not sched.has_unfinished():
                idle_from = now
                now = yield from self._idle(rep, now)
                # (before its first step the engine has idled since it started)
                rep.idle_start = not rep.num_steps or now - idle_from >= self.idle_start_min_wait_ns
            if self.next_arrival_ns == now:
                yield env.timeout(0)   # arrivals due now land before this step is scheduled
            if rep.batch.inbox:
                rep.batch.take_arrivals(now, at_once=not sched.has_unfinished())
            bd_start = rec.boundary(now)
            step_index = now // NS_PER_S if self.step_clock else rep.num_steps
            # async scheduling, requests that finished in the batch in flight: a run may start
            # with the step that frees them, but step rows list them as running in it
            k = 0 if self.in_the_loop or (self.record_steps and rep.batch.num_done) else \
                sched.plan_decode_run(_NEVER)
            if rep.batch.inbox and k > 1:
                k = 1    # arrivals wait for this step's end: the next schedule sees them
            if k > 0 and rep.compiled is not None and \
                    self.first_use.compiles(rep.compiled, len(sched.running) - rep.batch.num_done):
                k = 0    # a decode step that compiles on first use (simulator.first_use): in detail
            run = None     # a decode run stepped one by one
            if k > 0:
                run = self._plan_run(rep, now, k, bd_start)
                if self.batching:
                    end, mark = self._advance_run(rep, run, now)
                    if not self._unobserved(rec, end):
                        yield _UrgentTimeout(env, end - env.now)
                    self._close_run(rep, run, now, end, step_index, mark)
                    now = end
                    continue
            now = yield from self._detailed_steps(rep, now, step_index, run)

    def _idle(self, rep: _Replica, now: int):
        """Nothing to run: close the step boundary and wait for an arrival (vLLM keeps taking
        empty steps while transfers are pending: they complete, and are polled, on time, or an
        arrival comes first; no step boundary). Returns the replica's time then."""
        env, sched, io = self.env, rep.sched, rep.io
        if now > env.now:
            yield _UrgentTimeout(env, now - env.now)
        io.batch_processed(now)     # the last step in flight is processed
        rep.rec.boundary(now)
        # (an idle engine schedules what arrives at once: nothing is in flight)
        if io.idles_as_vllm:
            if self.next_arrival_ns == now:
                yield env.timeout(0)   # a request arriving now is scheduled, no empty step
                rep.batch.take_arrivals(now, at_once=True)
                if sched.has_unfinished():
                    return now
            io.signal_finished()       # vLLM steps once more to tell the connector
        while io.busy and not sched.has_unfinished():
            io.empty_step()
            done_ns = io.wait_until(now)
            rep.wake = env.event()
            yield rep.wake if done_ns is None else \
                rep.wake | env.timeout(max(0, done_ns - env.now))
            rep.wake = None
            now = env.now
            io.poll(now)
            rep.batch.take_arrivals(now, at_once=True)
        if not sched.has_unfinished():
            rep.wake = env.event()
            yield rep.wake
            rep.wake = None
            now = env.now
        return now

    def _plan_run(self, rep: _Replica, now: int, k: int, bd_start) -> _Run:
        """A run of ``k`` identical pure-decode steps, ending at the first step end at or after
        the next moment anything can observe the replica (the connector's next transfer
        included: the run's first step polls and submits what waits, and a completion found
        now lands after step 1); under async scheduling on a clock an arrival first changes the
        schedule one step end later."""
        sched, rec, io, timer = rep.sched, rep.rec, rep.io, self.timer
        if bd_start is None:
            bd_start = rec.breakdown()
        usage_start = rep.allocator.usage
        num_running = len(sched.running)
        n = num_running - rep.batch.num_done    # the requests that decode
        kv = sched.clock.run_batch()[0]
        b0 = StepBatch(n, 0, n, n, kv, kv, sched.clock.run_max_context() if self.track_max_context else 0)
        arrival = self.next_arrival_ns
        lookahead = rep.batch.lookahead
        bound = min(rec.next_record_ns, self.stop_ns) if lookahead else \
            min(arrival, rec.next_record_ns, self.stop_ns)
        polled = io.active
        if polled:
            found, next_event_ns = io.poll_run(now, timer.run_ns(b0, 1))
            if found:
                k = 1
            if next_event_ns is not None:
                bound = min(bound, next_event_ns)
        if bound < _NEVER and now + timer.run_ns(b0, k) >= bound:
            k = min(k, timer.steps_to_reach(b0, now, bound, k))
        if lookahead and arrival < _NEVER and now + timer.run_ns(b0, k) >= arrival:
            # async: the step that ends at or after an arrival was scheduled before it; the
            # schedule after that step's end is the first that sees it (batch_hooks.py)
            k = min(k, timer.steps_to_reach(b0, now, arrival, k) + 1)
        return _Run(b0, k, n, num_running, bd_start, usage_start, polled)

    def _advance_run(self, rep: _Replica, run: _Run, now: int) -> tuple[int, tuple]:
        """Apply a planned run at once (async: once its first step is scheduled, the batch in
        flight is processed and what finished in it is freed) and integrate the pool over it.
        Returns its end and what ``_close_run`` needs of its start."""
        sched, rec, k = rep.sched, rep.rec, run.k
        tokens0 = sched.num_generated_tokens
        rec.scheduled(run.num_running, sched.num_waiting, run.n)
        hist = sched.clock.crossing_histogram() if self.record_steps else None
        used0 = sched.allocator.num_used_blocks if self.record_steps and sched.paged else 0
        if rep.batch.num_done:
            sched.advance_decode_run(1)
            run.bd_start, run.usage_start = self._retire_in_flight(rep, run.bd_start,
                                                                   run.usage_start)
            if k > 1:
                sched.advance_decode_run(k - 1)
        else:
            sched.advance_decode_run(k)
        end = now + self.timer.run_ns(run.b0, k)
        rec.integrate(run.bd_start, rec.breakdown(), run.usage_start, rep.allocator.usage, now, end)
        return end, (tokens0, hist, used0)

    def _close_run(self, rep: _Replica, run: _Run, now: int, end: int, step_index: int,
                   mark: tuple) -> None:
        """A run's end: its tokens and finishes, the connector's completions, its step rows."""
        sched, rec, k = rep.sched, rep.rec, run.k
        tokens0, hist, used0 = mark
        finished = sched.finish_decode_run(end, step_index + k - 1)
        if rep.batch.lookahead:     # (the last step's start: priced only where it is used)
            rep.batch.step_ran(now + self.timer.run_ns(run.b0, k - 1), end)
        if self.token_log is not None:
            self.token_log.run(now, [now + self.timer.run_ns(run.b0, j) for j in range(1, k + 1)],
                               (sched.num_generated_tokens - tokens0) // k)
        rep.io.step_end(end)
        rec.last_step = DECODE_RUN
        if self.record_steps:
            rec.decode_rows(step_index, k, run.n, hist, used0, finished)
        rep.num_steps += k
        sched.num_steps += k
        rep.batch.step_finished(finished)

    def _detailed_steps(self, rep: _Replica, now: int, step_index: int, run: _Run | None):
        """Steps scheduled in detail: the next one, or a planned run's k steps one by one
        (checked to be pure decodes, priced and integrated as the run they form). Returns the
        replica's time after them."""
        env, sched, rec = self.env, rep.sched, rep.rec
        t = now
        for j in range(run.k if run is not None else 1):
            idx = step_index + j
            if j and rep.batch.inbox:     # a run's later steps see arrivals as the loop would
                rep.batch.take_arrivals(t, at_once=False)
            in_flight = rep.io.batch_in_flight
            out = sched.schedule(t, idx)
            if not out.num_scheduled_tokens and (rep.batch.num_done or in_flight):
                # async scheduling: nothing to schedule while a batch is in flight. vLLM
                # waits for it, processes it and schedules again, at the same step
                if in_flight:     # the empty step polls; its output is processed first
                    rep.io.poll_empty(t)
                rep.batch.process()
                if in_flight:
                    rep.io.batch_processed(t)
                if rep.batch.inbox:   # vLLM waited for the batch in flight: all arrivals count
                    rep.batch.take_arrivals(t, at_once=True)
                out = sched.schedule(t, idx)
                if not out.num_scheduled_tokens and not sched.has_unfinished():
                    break   # everything finished: idle
            if run is not None:
                assert out.num_decode_seqs == run.n and out.num_scheduled_tokens == run.n \
                    and not out.num_preempted and not out.num_new, \
                    "a planned decode step was not a pure decode step"
            rec.scheduled(len(sched.running), sched.num_waiting, out.num_scheduled_tokens)
            ran = out.num_scheduled_tokens > 0
            if not ran and rep.io.busy and not sched.running:
                t = yield from self._wait_for_transfers(rep, t)
                break
            if not ran and not out.num_preempted and not sched.running and sched.waiting:
                # the head can never be admitted (nothing runs that could make room)
                seq = sched.waiting.popleft()
                self.num_rejected += 1
                self.recorder.record_rejected(rep.index, seq.req, seq.arrival_ns)
            row_state = rec.row_state() if self.record_steps else None
            if rep.batch.num_done or rep.io.held:
                # async scheduling: the batch in flight is processed now that this step is
                # scheduled; what finished in it is freed
                if run is not None and j == 0:
                    run.bd_start, run.usage_start = self._retire_in_flight(rep, run.bd_start,
                                                                           run.usage_start)
                else:
                    self._retire_in_flight(rep, None, 0.0)
                rep.io.batch_processed(t)     # then the completions its poll found
            end, step = self._price_step(rep, out, t, idx, now, j, run)
            if not ran:
                # nothing ran (everyone running preempted itself away, or the head was
                # rejected): vLLM counts no step; the clock still moves by one empty step
                yield _UrgentTimeout(env, end - env.now)
                t = end
                break
            if not self._unobserved(rec, end):
                yield _UrgentTimeout(env, end - env.now)
            self._finish_detailed_step(rep, out, t, end, idx, step, row_state,
                                       run is None or j == run.k - 1)
            t = end
        return t

    def _wait_for_transfers(self, rep: _Replica, t: int):
        """Nothing to run until a transfer completes (loads, deferred lookups): vLLM's empty
        steps poll until then; an arrival may come first. Not an idle gap: requests wait (for
        their loads) while nothing runs. Returns the time it ends."""
        env, rec, io = self.env, rep.rec, rep.io
        if io.poll_empty(t):    # the empty step's poll found completions: schedule again now
            return t
        if t > env.now:
            yield _UrgentTimeout(env, t - env.now)
        bd_wait, usage_wait = rec.breakdown(), rep.allocator.usage
        rep.wake = env.event()
        done_ns = io.wait_until(t)
        yield rep.wake if done_ns is None else \
            rep.wake | env.timeout(max(0, done_ns - env.now))
        rep.wake = None
        rec.last_batch_tokens = 0
        rec.integrate(bd_wait, bd_wait, usage_wait, usage_wait, t, env.now)
        t = env.now
        io.poll(t)
        return t

    def _price_step(self, rep: _Replica, out, t: int, idx: int, now: int, j: int,
                    run: _Run | None) -> tuple[int, object]:
        """A detailed step's end (its batch priced, hardware in the loop executed, stores
        flushed before the forward) with the pool integrated over it; a run's step is priced
        and integrated as the run (trapezoid), exactly as when batched. Returns (end, the
        executed step or None)."""
        sched, rec, io = rep.sched, rep.rec, rep.io
        step = None
        idle_start, rep.idle_start = rep.idle_start, False
        if run is None:
            batch = StepBatch(out.num_seqs, out.num_prefill_tokens, out.num_decode_seqs,
                              out.num_scheduled_tokens, out.kv_read_tokens, out.attn_token_pairs,
                              sched.clock.step_max_context(out) if self.track_max_context else 0)
            if self.in_the_loop:
                step = scheduled_step(out, rep.allocator, idx, self.config.block_size)
                end = t + max(1, to_ns(self.cost.timed_step_s(batch, step)))
            else:
                end = t + max(1, self.timer.step_ns(batch))
            if idle_start:
                end += self.idle_start_ns
            if rep.compiled is not None:
                end += to_ns(self.first_use.stall_s(rep.compiled, batch.num_scheduled_tokens, rep.compile_tally))
            end += io.forward_stall_ns(t, end - t)   # flushed stores delay the forward
            bd_step = rec.breakdown()
            usage = rep.allocator.usage
            rec.integrate(bd_step, bd_step, usage, usage, t, end)
            return end, step
        end = now + self.timer.run_ns(run.b0, j + 1)
        if not (j == 0 and run.polled):
            io.forward_stall_ns(t, end - t)
        if j == run.k - 1:
            rec.integrate(run.bd_start, rec.breakdown(), run.usage_start, rep.allocator.usage,
                          now, end)
        return end, step

    def _finish_detailed_step(self, rep: _Replica, out, t: int, end: int, idx: int, step,
                              row_state, last: bool) -> None:
        """A detailed step's end: its tokens and finishes, the connector's completions, its
        step row. ``last``: a run's last step (or a single step), where requests may finish."""
        sched, rec = rep.sched, rep.rec
        tokens0, first0 = sched.num_generated_tokens, sched.num_first_tokens
        finished = sched.finish_step(out, end, idx)
        held, seconds = rep.batch.first_tokens(out, t, end)
        rep.batch.step_ran(t, end)
        if self.token_log is not None:
            tokens = sched.num_generated_tokens - tokens0
            row = self.token_log.step(end, end - t, tokens, tokens - (sched.num_first_tokens - first0))
            if held:
                self.token_log.hold_first_tokens(rep.token_row, held, end, row, seconds)
            rep.token_row = row
        rep.io.step_end(end)
        rec.last_step = out
        assert not finished or last, "a request finished inside a decode run"
        rep.num_steps += 1
        sched.num_steps += 1
        if self.record_steps:
            extra = ()
            if self.in_the_loop:
                longest = max(map(sum, zip(step.num_computed_tokens, step.num_new_tokens)))
                extra = (out.kv_read_tokens, out.attn_token_pairs, *self.cost.last,
                         t / NS_PER_S, longest)
            rec.step_row(idx, out, finished, row_state, extra)
        rep.batch.step_finished(finished)

    def _retire_in_flight(self, rep: _Replica, bd_start, usage_start: float):
        """Async scheduling: the batch in flight is processed after this step's schedule; the
        requests that finished in it are freed and recorded. The step (or the run it starts)
        then holds the pool without them from its start: ``bd_start`` / ``usage_start`` (a
        run's starting point, or None) are returned moved by what the frees changed."""
        rec = rep.rec
        if bd_start is not None:
            bd_before, usage_before = rec.breakdown(), rep.allocator.usage
        rep.batch.process()
        rec.running_now(len(rep.sched.running))
        if bd_start is None:
            return None, usage_start
        bd_after = rec.breakdown()
        return ([s + a - b for s, a, b in zip(bd_start, bd_after, bd_before)],
                usage_start + rep.allocator.usage - usage_before)

    def _unobserved(self, rec, end: int) -> bool:
        """Whether nothing can happen or be looked at from now until the replica's step end
        ``end``: no arrival (the router reads replica states, the scheduler its queue), sample,
        snapshot or stop (``run_until``) up to and including ``end``. A request waiting for a
        concurrency slot observes every step end: a request that finishes there sends it."""
        return end < self.next_arrival_ns and end < rec.next_record_ns and end < self.stop_ns \
            and self.slot_free is None


def simulate(requests: Iterable, config: EngineConfig, cost_model: CostModel, *,
             replicas: int = 1, router: str = "round-robin",
             sample_interval_s: float | None = None, snapshot_times_s: Iterable[float] = (),
             seed: int = 0, progress: bool = False, record_steps: bool = False,
             batch_decode_steps: bool = True, record_requests: bool = True,
             offload: Sequence[TierConfig] = (), max_concurrency: int | None = None,
             record_token_times: bool = False) -> Result:
    """Replay ``requests`` through ``replicas`` replicas of ``config``; see ``Simulation``.

    Returns:
        Result (summary with stable keys, time series, per-request table, snapshots).
    """
    sim = Simulation(requests, config, cost_model, replicas=replicas, router=router,
                     sample_interval_s=sample_interval_s, snapshot_times_s=snapshot_times_s,
                     seed=seed, progress=progress, record_steps=record_steps,
                     batch_decode_steps=batch_decode_steps, record_requests=record_requests,
                     offload=offload, max_concurrency=max_concurrency,
                     record_token_times=record_token_times)
    try:
        return sim.run()
    except KeyboardInterrupt as stop:   # Ctrl-C: what was simulated so far rides on the exception
        stop.partial_result = sim.result()
        raise
