"""SimPy engine: arrivals -> router -> one engine loop per replica; recording; ``simulate``.

Processes (SimPy, time in integer nanoseconds so that runs of steps add up exactly):

* ``_arrivals``: pulls requests lazily from the iterator (memory follows live requests, not the
  trace), routes each at its arrival time (round-robin, least-loaded = fewest running + waiting,
  prefix-affinity = by conversation or first shared segment) and wakes an idle replica.
* ``_engine`` (one per replica): at each step boundary it records, then either schedules one step
  in detail (``Scheduler.schedule``) or, when ``Scheduler.plan_decode_run`` says the next steps
  are identical pure decodes, applies k of them at once. A run ends at the first step end at or
  after the next arrival, sample time, snapshot time or stop time, so every externally visible
  moment is a step boundary in both modes. With ``batch_decode_steps=False`` the same k steps are
  scheduled one by one (and checked to be pure decodes): results are identical, which tests check.

Event order at equal times: step ends (URGENT) before arrivals, arrivals before the next schedule
(the engine yields once when an arrival is due at the same instant) - vLLM's engine loop order.
"""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable

import numpy as np
import simpy
from simpy.core import URGENT

from kvsim.allocator import MEMORY_CLASSES, ContiguousAllocator, PagedAllocator, mix64
from kvsim.simulator.config import ROUTERS, EngineConfig
from kvsim.simulator.cost import CostModel, FixedStepCost, StepBatch
from kvsim.simulator.recorder import (NS_PER_S, SAMPLE_COLUMNS, RequestLog, StepLog,
                                TableLog, percentiles)
from kvsim.simulator.result import SUMMARY_KEYS, Result
from kvsim.simulator.scheduler import FINISHED, Scheduler

_NEVER = 1 << 62
_NUM_CLASSES = len(MEMORY_CLASSES)


def _ns(seconds: float) -> int:
    return int(round(seconds * NS_PER_S))


def _urgent_timeout(env: simpy.Environment, delay_ns: int) -> simpy.Event:
    """A timeout processed before NORMAL events at the same instant (step ends before arrivals)."""
    ev = simpy.Event(env)
    ev._ok = True
    ev._value = None
    env.schedule(ev, URGENT, delay_ns)
    return ev


def make_allocator(config: EngineConfig):
    """The allocator an EngineConfig describes."""
    if config.is_paged:
        return PagedAllocator(config.pool_blocks, config.block_size,
                              enable_prefix_caching=config.enable_prefix_caching,
                              null_block=config.null_block)
    return ContiguousAllocator(config.pool_tokens, policy=config.allocator,
                               max_model_len=config.max_model_len, placement=config.placement)


def _affinity_key(req) -> int | None:
    """What prefix-affinity routing hashes: the conversation, else the second shared prompt
    segment (the first is often a prompt every request shares, e.g. Mooncake's block 0), else
    the first; None (round-robin) for a request that shares nothing."""
    if req.conversation_id is not None:
        return req.conversation_id
    key = None
    end = 0
    for seg_id, length in req.segments[:2]:
        end += length
        if end > req.num_shareable_tokens:
            break
        key = seg_id
    return key


class _Replica:
    """One serving replica: its scheduler, allocator and recording state."""

    def __init__(self, index: int, config: EngineConfig, seed: int):
        self.index = index
        self.allocator = make_allocator(config)
        self.sched = Scheduler(config, self.allocator, seed=seed + index)
        self.wake: simpy.Event | None = None
        self.num_steps = 0
        self.last_t = 0
        self.bd_area = [0] * _NUM_CLASSES      # trapezoid areas x2 (slot-ns)
        self.usage_area = 0.0
        self.running_area = 0                  # requests x ns, running during steps
        self.waiting_area = 0
        self.cur_running = 0                   # after the last schedule
        self.cur_waiting = 0
        self.max_running = 0
        self.last_batch_tokens = 0
        self.next_sample_ns = 0
        self.next_snapshot = 0
        self.arrived_since_step = 0
        self.num_finished = 0
        self.saved_samples: list[int] = []
        self.cum = [0, 0, 0, 0]                # step rows: preemptions, pc queries, pc hits, finished


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
    """

    def __init__(self, requests: Iterable, config: EngineConfig, cost_model: CostModel, *,
                 replicas: int = 1, router: str = "round-robin",
                 sample_interval_s: float | None = None, snapshot_times_s: Iterable[float] = (),
                 seed: int = 0, progress: bool = False, record_steps: bool = False,
                 batch_decode_steps: bool = True, record_requests: bool = True):
        if not isinstance(config, EngineConfig):
            raise TypeError("config must be an EngineConfig")
        if not hasattr(cost_model, "step_time_s") or not hasattr(cost_model, "run_time_s"):
            raise TypeError("cost_model must implement step_time_s and run_time_s (CostModel)")
        if not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
        if router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {router!r}")
        self.config = config
        self.cost = cost_model
        self.step_clock = isinstance(cost_model, FixedStepCost) and cost_model.step_s == 1.0
        self.fixed_step_ns = _ns(cost_model.step_s) if isinstance(cost_model, FixedStepCost) \
            else None
        if sample_interval_s is None:
            sample_interval_s = 1.0
        if not sample_interval_s > 0:
            raise ValueError(f"sample_interval_s must be > 0, got {sample_interval_s}")
        self.sample_ns = max(1, _ns(sample_interval_s))
        self.snapshot_ns = sorted(_ns(t) for t in snapshot_times_s)
        if any(t < 0 for t in self.snapshot_ns):
            raise ValueError("snapshot_times_s must be >= 0")
        self.router = router
        self.seed = seed
        self.record_steps = record_steps
        self.batching = batch_decode_steps
        self.env = simpy.Environment()
        self.replicas = [_Replica(i, config, seed) for i in range(replicas)]
        self.requests = RequestLog(keep_rows=record_requests)
        self.samples = TableLog(SAMPLE_COLUMNS)
        self.steps = StepLog()
        self.snapshots: list = []
        self.num_arrived = 0
        self.num_rejected = 0
        self.rr_next = 0
        self.next_arrival_ns = _NEVER
        self.stop_ns = _NEVER
        self.arrivals_done = False
        self.end_ns = 0
        self.wall_s = 0.0
        self._last_run = (None, 0, 0)     # (first-step batch, k, run ns) of the last run priced
        self._finalised = False
        self._progress = None
        if progress:
            from tqdm import tqdm
            self._progress = tqdm(unit="req", desc="replay", file=sys.stderr, mininterval=0.5)
        self._iter = iter(requests)
        self.env.process(self._arrivals())
        for rep in self.replicas:
            self.env.process(self._engine(rep))

    # ------------------------------------------------------------------ public stepping API
    @property
    def now_s(self) -> float:
        return self.env.now / NS_PER_S

    @property
    def done(self) -> bool:
        """All requests arrived and finished (or were rejected)."""
        return self.arrivals_done and all(
            not r.sched.running and not r.sched.waiting for r in self.replicas)

    def run_until(self, t_s: float) -> None:
        """Advance simulated time to ``t_s`` (runs of decode steps end at the first step
        boundary at or after it, so the state seen afterwards is exact at that boundary)."""
        t_ns = _ns(t_s)
        if t_ns <= self.env.now:
            return
        started = time.perf_counter()
        self.stop_ns = t_ns
        self.env.run(until=t_ns)
        self.stop_ns = _NEVER
        self.wall_s += time.perf_counter() - started

    def snapshot(self, replica: int = 0):
        """PoolSnapshot of one replica's pool now (numpy arrays, see allocator.PoolSnapshot)."""
        rep = self.replicas[replica]
        rep.sched.sync_allocator()
        if rep.sched.paged:
            return rep.allocator.snapshot()
        return rep.allocator.snapshot(self._waiting_final_tokens(rep),
                                      waiting_num_prompt_tokens=self._waiting_prompt_tokens(rep))

    def state(self) -> dict:
        """Live figures for a dashboard: time, running, waiting, finished, usage, breakdown."""
        bd = [0] * _NUM_CLASSES
        for rep in self.replicas:
            for i, v in enumerate(self._breakdown(rep)):
                bd[i] += v
        return {"time_s": self.now_s, "running": sum(len(r.sched.running) for r in self.replicas),
                "waiting": sum(len(r.sched.waiting) for r in self.replicas),
                "finished": self.requests.num_finished,
                "rejected": self.num_rejected, "arrived": self.num_arrived,
                "kv_usage": float(np.mean([r.allocator.usage for r in self.replicas])),
                "breakdown": dict(zip(MEMORY_CLASSES, bd)), "done": self.done}

    def run(self) -> Result:
        """Run to the end and return the Result."""
        started = time.perf_counter()
        self.env.run()
        self.wall_s += time.perf_counter() - started
        return self.result()

    # ------------------------------------------------------------------ processes
    def _arrivals(self):
        env = self.env
        it = self._iter
        step_clock = self.step_clock
        last_ns = -1
        pending = next(it, None)
        count = 0
        while pending is not None:
            req = pending
            if step_clock and req.arrival_step is not None:
                t_ns = req.arrival_step * NS_PER_S
            else:
                t_ns = _ns(req.arrival_s)
            if t_ns < last_ns:
                raise ValueError(f"request {req.request_id}: arrival {t_ns / NS_PER_S} s is before "
                                 f"the previous request's {last_ns / NS_PER_S} s (sort the trace)")
            last_ns = t_ns
            self.next_arrival_ns = t_ns
            if t_ns > env.now:
                yield env.timeout(t_ns - env.now)
            self._route(req, t_ns)
            count += 1
            if self._progress is not None and count % 1000 == 0:
                self._progress.update(1000)
            pending = next(it, None)
        self.next_arrival_ns = _NEVER
        self.arrivals_done = True
        if self._progress is not None:
            self._progress.update(count % 1000)
            self._progress.close()

    def _route(self, req, t_ns: int) -> None:
        self.num_arrived += 1
        reps = self.replicas
        if len(reps) == 1:
            rep = reps[0]
        elif self.router == "least-loaded":
            rep = min(reps, key=lambda r: (len(r.sched.running) + len(r.sched.waiting), r.index))
        else:
            key = None
            if self.router == "prefix-affinity":
                key = _affinity_key(req)
            if key is None:
                rep = reps[self.rr_next % len(reps)]
                self.rr_next += 1
            else:
                rep = reps[mix64(key & 0xFFFFFFFFFFFFFFFF) % len(reps)]
        reason = self._unfit(req)
        if reason:
            self.num_rejected += 1
            self._record_rejected(rep, req, t_ns)
            return
        rep.sched.add_request(req, t_ns)
        rep.arrived_since_step += 1
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
        if cfg.is_paged:
            usable = cfg.pool_blocks - int(cfg.null_block)
            if -(-(final - 1) // cfg.block_size) > usable:
                return "needs more blocks than the pool has"
        else:
            extent = self.replicas[0].allocator.extent_tokens(
                final, num_prompt_tokens=req.prompt_tokens)
            if width * extent > cfg.pool_tokens:
                return "reservation larger than the pool"
        return ""

    def _engine(self, rep: _Replica):
        env = self.env
        sched = rep.sched
        record_steps = self.record_steps
        # ``now`` is the replica's time. It runs ahead of SimPy's across step ends that nothing
        # can observe (``_unobserved``): such a step is finished at once and the next one
        # scheduled, without a round trip through the event queue.
        now = env.now
        while True:
            if not sched.running and not sched.waiting:
                if now > env.now:
                    yield _urgent_timeout(env, now - env.now)
                self._boundary(rep, now)
                rep.wake = env.event()
                yield rep.wake
                rep.wake = None
                now = env.now
            if self.next_arrival_ns == now:
                yield env.timeout(0)   # arrivals due now land before this step is scheduled
            bd_start = self._boundary(rep, now)
            step_index = now // NS_PER_S if self.step_clock else rep.num_steps
            k = sched.plan_decode_run(_NEVER)
            if k > 0:
                if bd_start is None:
                    bd_start = self._breakdown(rep)
                usage_start = rep.allocator.usage
                n = len(sched.running)
                kv = sched.decode_run_batch()[0]
                b0 = StepBatch(n, 0, n, n, kv, kv)
                bound = min(self.next_arrival_ns, rep.next_sample_ns, self.stop_ns,
                            self.snapshot_ns[rep.next_snapshot]
                            if rep.next_snapshot < len(self.snapshot_ns) else _NEVER)
                if bound < _NEVER and now + self._run_ns(b0, k) >= bound:
                    k = min(k, self._steps_to_reach(b0, now, bound, k))
                rep.cur_running, rep.cur_waiting = n, len(sched.waiting)
                rep.max_running = max(rep.max_running, n)
                rep.last_batch_tokens = n
                if self.batching:
                    hist = sched.crossing_histogram() if record_steps else None
                    used0 = sched.allocator.num_used_blocks if record_steps and sched.paged \
                        else 0
                    sched.advance_decode_run(k)
                    end = now + self._run_ns(b0, k)
                    self._integrate(rep, bd_start, self._breakdown(rep), usage_start,
                                    rep.allocator.usage, now, end)
                    if not self._unobserved(rep, end):
                        yield _urgent_timeout(env, end - env.now)
                    last_index = step_index + k - 1 if self.step_clock else rep.num_steps + k - 1
                    finished = sched.finish_decode_run(end, last_index)
                    if record_steps:
                        self._decode_rows(rep, step_index, k, n, hist, used0, finished)
                else:
                    finished = []
                    t = now
                    for j in range(k):
                        idx = step_index + j
                        out = sched.schedule(t, idx)
                        assert out.num_decode_seqs == n and out.num_scheduled_tokens == n \
                            and not out.num_preempted and not out.num_new, \
                            "a planned decode step was not a pure decode step"
                        row_state = self._row_state(sched) if record_steps else None
                        end = now + self._run_ns(b0, j + 1)
                        if j == k - 1:
                            self._integrate(rep, bd_start, self._breakdown(rep), usage_start,
                                            rep.allocator.usage, now, end)
                        yield _urgent_timeout(env, end - env.now)
                        t = end
                        finished = sched.finish_step(out, end, idx)
                        assert not finished or j == k - 1, "a request finished inside a decode run"
                        if record_steps:
                            self._step_row(rep, idx, out, finished, row_state)
                rep.num_steps += k
                sched.num_steps += k
                for seq in finished:
                    self._on_finished(rep, seq)
                now = end
                continue

            out = sched.schedule(now, step_index)
            rep.cur_running, rep.cur_waiting = len(sched.running), len(sched.waiting)
            rep.max_running = max(rep.max_running, rep.cur_running)
            if out.num_scheduled_tokens == 0:
                # nothing ran (everyone running preempted itself away, or the head can never be
                # admitted): vLLM counts no step; the clock still moves by one empty step
                if not out.num_preempted and not sched.running and sched.waiting:
                    seq = sched.waiting.popleft()
                    self.num_rejected += 1
                    self._record_rejected(rep, seq.req, seq.arrival_ns)
                end = now + max(1, self._step_ns(StepBatch()))
                bd_step = self._breakdown(rep)
                self._integrate(rep, bd_step, bd_step, rep.allocator.usage, rep.allocator.usage,
                                now, end)
                yield _urgent_timeout(env, end - env.now)
                now = end
                continue
            batch = StepBatch(out.num_seqs, out.num_prefill_tokens, out.num_decode_seqs,
                              out.num_scheduled_tokens, out.kv_read_tokens, out.attn_token_pairs)
            rep.last_batch_tokens = out.num_scheduled_tokens
            row_state = self._row_state(sched) if record_steps else None
            end = now + max(1, self._step_ns(batch))
            bd_step = self._breakdown(rep)
            usage = rep.allocator.usage
            self._integrate(rep, bd_step, bd_step, usage, usage, now, end)
            if not self._unobserved(rep, end):
                yield _urgent_timeout(env, end - env.now)
            finished = sched.finish_step(out, end, step_index)
            rep.num_steps += 1
            sched.num_steps += 1
            if record_steps:
                self._step_row(rep, step_index, out, finished, row_state)
            for seq in finished:
                self._on_finished(rep, seq)
            now = end

    def _unobserved(self, rep: _Replica, end: int) -> bool:
        """Whether nothing can happen or be looked at from now until the replica's step end
        ``end``: no arrival (the router reads replica states, the scheduler its queue), sample,
        snapshot or stop (``run_until``) up to and including ``end``."""
        return end < self.next_arrival_ns and end < rep.next_sample_ns and end < self.stop_ns \
            and (rep.next_snapshot >= len(self.snapshot_ns) or
                 end < self.snapshot_ns[rep.next_snapshot])

    # ------------------------------------------------------------------ time helpers
    def _step_ns(self, batch: StepBatch) -> int:
        if self.fixed_step_ns is not None:
            return self.fixed_step_ns
        return _ns(self.cost.step_time_s(batch))

    def _run_ns(self, b0: StepBatch, k: int) -> int:
        if self.fixed_step_ns is not None:
            return self.fixed_step_ns * k
        cached = self._last_run
        if cached[0] is b0 and cached[1] == k:
            return cached[2]
        ns = max(k, int(round(self.cost.run_time_s(b0, k) * NS_PER_S)))
        self._last_run = (b0, k, ns)
        return ns

    def _steps_to_reach(self, b0: StepBatch, now: int, bound: int, k_max: int) -> int:
        """Smallest k >= 1 whose run ends at or after ``bound`` (capped at k_max)."""
        if bound <= now:
            return 1
        if self.fixed_step_ns is not None:
            return max(1, min(k_max, -(-(bound - now) // self.fixed_step_ns)))
        # steps only get longer in a decode run, so k = ceil(gap / first step) is enough; it is
        # usually exact
        first = max(1, self._step_ns(b0))
        guess = min(k_max, max(1, -(-(bound - now) // first)))
        if guess == 1 or now + self._run_ns(b0, guess - 1) < bound:
            if guess < k_max:
                self._run_ns(b0, guess)   # the run's end, cached for the caller
            return guess
        hi = 1
        while hi < k_max and now + self._run_ns(b0, hi) < bound:
            hi = min(k_max, hi * 2)
        if now + self._run_ns(b0, hi) < bound:
            return hi
        lo = hi // 2  # run(lo) < bound (or lo == 0)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if now + self._run_ns(b0, mid) >= bound:
                hi = mid
            else:
                lo = mid
        return max(1, hi)

    # ------------------------------------------------------------------ recording
    def _waiting_final_tokens(self, rep: _Replica):
        if not rep.sched.waiting:
            return None
        head = rep.sched.waiting[0]
        return head.num_prompt_tokens + head.max_output_tokens

    def _waiting_prompt_tokens(self, rep: _Replica):
        # the pow2 policy sizes the head's extent from its prompt, not only its final length
        return rep.sched.waiting[0].num_prompt_tokens if rep.sched.waiting else None

    def _breakdown(self, rep: _Replica) -> list[int]:
        sched = rep.sched
        if sched.paged:
            vals = rep.allocator.breakdown_slots()
        else:
            bd = rep.allocator.breakdown(self._waiting_final_tokens(rep),
                                         waiting_num_prompt_tokens=self._waiting_prompt_tokens(rep))
            vals = [bd[c] for c in MEMORY_CLASSES]
        pending = sched.num_pending_tokens
        if pending:
            # tokens scheduled but not yet told to the allocator sit in held slots
            vals[0] += pending
            vals[2 if sched.paged else 1] -= pending
        return vals

    def _boundary(self, rep: _Replica, now: int) -> list[int] | None:
        """At a step boundary (time ``now``): integrate any idle gap, then take due samples and
        snapshots. Returns the breakdown now (before this boundary's schedule), or None if it
        was not needed."""
        if now > self.end_ns:
            self.end_ns = now
        if now <= rep.last_t and rep.next_sample_ns > now and (
                rep.next_snapshot >= len(self.snapshot_ns) or
                self.snapshot_ns[rep.next_snapshot] > now):
            return None   # nothing to integrate or record here
        bd = self._close_idle_gap(rep, now)
        while rep.next_snapshot < len(self.snapshot_ns) and \
                self.snapshot_ns[rep.next_snapshot] <= now:
            t = self.snapshot_ns[rep.next_snapshot]
            self.snapshots.append((t / NS_PER_S, rep.index, self.snapshot(rep.index)))
            rep.next_snapshot += 1
        return bd

    def _integrate(self, rep: _Replica, bd_left, bd_right, usage_left: float,
                   usage_right: float, t0: int, t1: int) -> None:
        """Add one segment to the time-weighted figures: the pool goes linearly from
        ``bd_left`` to ``bd_right`` (trapezoid; equal for one step), running/waiting are the
        counts after the segment's schedule."""
        dt = t1 - t0
        area = rep.bd_area
        for i in range(_NUM_CLASSES):
            area[i] += (bd_left[i] + bd_right[i]) * dt
        rep.usage_area += (usage_left + usage_right) * dt
        rep.running_area += rep.cur_running * dt
        rep.waiting_area += rep.cur_waiting * dt
        rep.last_t = t1

    def _sample(self, rep: _Replica, now: int, bd: list[int], usage: float) -> None:
        sched = rep.sched
        saved = 0
        if sched.paged:
            logical = sched.num_logical_blocks()
            saved = max(0, logical - rep.allocator.num_used_blocks)
        rep.saved_samples.append(saved)
        row_tail = (len(sched.running), len(sched.waiting), rep.last_batch_tokens,
                    sched.num_preemptions, sched.num_prefix_queries, sched.num_prefix_hits,
                    rep.num_finished, usage, saved, *bd)
        while rep.next_sample_ns <= now:
            self.samples.add((rep.next_sample_ns / NS_PER_S, rep.index) + row_tail)
            rep.next_sample_ns += self.sample_ns

    def _decode_rows(self, rep, step0, k, n, hist, used0, finished) -> None:
        """Per-step oracle rows of a batched decode run (same values as stepping one by one)."""
        sched = rep.sched
        usable = sched.allocator.num_usable_blocks if sched.paged else 1
        B = sched.block_size
        used = used0
        waiting = len(sched.waiting)
        cum = rep.cum
        for j in range(1, k + 1):
            idx = step0 + j - 1 if self.step_clock else rep.num_steps + j - 1
            if sched.paged:
                used += hist[(j - 1) % B + 1]
            usage = round(1.0 - (usable - used) / usable, 6) if sched.paged else \
                round(sched.allocator.usage, 6)
            nfin = len(finished) if j == k else 0
            cum[3] += nfin
            end_usage = round(sched.allocator.usage, 6) if j == k else usage
            arrived = rep.arrived_since_step
            rep.arrived_since_step = 0
            self.steps.rows.append((
                idx, arrived, n, n, 0, n, 0, 0, n, waiting, usage, used, 0, cum[0], 0, 0,
                cum[1], cum[2], 0, 0, nfin, cum[3], n - nfin, waiting, end_usage, rep.index,
                idx * 1.0 if self.step_clock else math.nan))

    @staticmethod
    def _row_state(sched) -> tuple:
        """Oracle columns read right after schedule(): running, waiting, usage, used blocks."""
        return (len(sched.running), len(sched.waiting), sched.allocator.usage,
                sched.allocator.num_used_blocks if sched.paged else 0)

    def _step_row(self, rep, idx, out, finished, state) -> None:
        sched = rep.sched
        running, waiting, usage, used = state
        cum = rep.cum
        cum[0] += out.num_preempted
        cum[1] += out.pc_queries
        cum[2] += out.pc_hits
        cum[3] += len(finished)
        arrived = rep.arrived_since_step
        rep.arrived_since_step = 0
        self.steps.rows.append((
            idx, arrived, out.num_seqs, out.num_scheduled_tokens, out.num_prefill_tokens,
            # vLLM 0.33's V2 model runner reports resumed requests among the new ones
            out.num_decode_seqs, out.num_new + out.num_resumed, 0, running, waiting, round(usage, 6),
            used, out.num_preempted, cum[0], out.pc_queries, out.pc_hits, cum[1], cum[2],
            out.pc_preempted_queries, out.pc_preempted_hits, len(finished), cum[3],
            len(sched.running), len(sched.waiting), round(sched.allocator.usage, 6), rep.index,
            idx * 1.0 if self.step_clock else math.nan))

    def _on_finished(self, rep: _Replica, seq) -> None:
        group = seq.group
        if group is not None:
            if group.recorded or len(group.members) < group.width or any(
                    m.status != FINISHED for m in group.members):
                return
            group.recorded = True
            members = group.members
        else:
            members = (seq,)
        rep.num_finished += 1
        head = members[0]
        req = head.req
        arrival = head.arrival_ns
        if group is None:
            finish, first_token = seq.finish_ns, seq.first_token_ns
            num_preemptions, cached_total = seq.num_preemptions, seq.num_cached_tokens_total
            first_token_step, finish_step = seq.first_token_step, seq.finish_step
        else:
            finish = max(m.finish_ns for m in members)
            first_token = min(m.first_token_ns for m in members)
            num_preemptions = sum(m.num_preemptions for m in members)
            cached_total = sum(m.num_cached_tokens_total for m in members)
            first_token_step = min(m.first_token_step for m in members)
            finish_step = max(m.finish_step for m in members)
        num_output = head.num_output_tokens
        ttft = (first_token - arrival) / NS_PER_S
        tpot = (finish - first_token) / NS_PER_S / (num_output - 1) if num_output > 1 else math.nan
        e2e = (finish - arrival) / NS_PER_S
        if not self.requests.keep_rows:   # no per-request table: what the summary needs
            self.requests.add_finished(ttft, tpot, e2e, req.prompt_tokens, num_preemptions)
            return
        self.requests.add(
            request_id=req.request_id, replica=rep.index, arrival_s=arrival / NS_PER_S,
            first_sched_s=head.first_sched_ns / NS_PER_S, first_token_s=first_token / NS_PER_S,
            finish_s=finish / NS_PER_S, ttft_s=ttft, tpot_s=tpot,
            e2e_s=e2e, prompt_tokens=req.prompt_tokens,
            output_tokens=req.output_tokens, num_output=num_output, num_samples=len(members),
            num_preemptions=num_preemptions, cached_tokens_first=head.cached_tokens_first,
            cached_tokens_total=cached_total,
            arrival_step=req.arrival_step if req.arrival_step is not None else -1,
            first_sched_step=head.first_sched_step, first_token_step=first_token_step,
            finish_step=finish_step, rejected=0)

    def _record_rejected(self, rep: _Replica, req, t_ns: int) -> None:
        nan = math.nan
        self.requests.add(
            request_id=req.request_id, replica=rep.index, arrival_s=t_ns / NS_PER_S,
            first_sched_s=nan, first_token_s=nan, finish_s=nan, ttft_s=nan, tpot_s=nan,
            e2e_s=nan, prompt_tokens=req.prompt_tokens, output_tokens=req.output_tokens,
            num_output=0, num_samples=max(req.n, req.beam_width), num_preemptions=0,
            cached_tokens_first=-1, cached_tokens_total=0,
            arrival_step=req.arrival_step if req.arrival_step is not None else -1,
            first_sched_step=-1, first_token_step=-1, finish_step=-1, rejected=1)

    # ------------------------------------------------------------------ result
    def result(self) -> Result:
        """Summary, tables and snapshots of what has been simulated so far."""
        if not self._finalised and self.done:
            for rep in self.replicas:
                self.env_now_boundary(rep)
            self._finalised = True
        requests = self.requests.frame()
        if self.record_steps:
            timeseries = self.steps.frame()
        else:
            timeseries = self.samples.frame()
        return Result(self._summary(), timeseries, requests, list(self.snapshots))

    def env_now_boundary(self, rep: _Replica) -> None:
        """Close a replica's integrals and samples at the end of the simulation."""
        self._close_idle_gap(rep, self.end_ns)

    def _close_idle_gap(self, rep: _Replica, now: int) -> list[int]:
        """Integrate the time since the replica's last segment (nothing ran: the pool stayed as
        it is now) and take a due sample. Returns the breakdown now."""
        bd = self._breakdown(rep)
        usage = rep.allocator.usage
        if now > rep.last_t:
            rep.cur_running = 0
            rep.cur_waiting = len(rep.sched.waiting)
            self._integrate(rep, bd, bd, usage, usage, rep.last_t, now)
        if rep.next_sample_ns <= now and not self.record_steps:
            self._sample(rep, now, bd, usage)
        return bd

    def _summary(self) -> dict:
        cfg = self.config
        reps = self.replicas
        log = self.requests
        duration_ns = max(self.end_ns, 1)
        duration_s = self.end_ns / NS_PER_S
        area = [sum(r.bd_area[i] for r in reps) for i in range(_NUM_CLASSES)]
        total_area = sum(area)
        if total_area > 0:
            breakdown = {c: round(a / total_area, 9) for c, a in zip(MEMORY_CLASSES, area)}
        else:
            bd = [sum(v) for v in zip(*(self._breakdown(r) for r in reps))]
            breakdown = {c: round(v / sum(bd), 9) for c, v in zip(MEMORY_CLASSES, bd)}
        queries = sum(r.sched.num_prefix_queries for r in reps)
        hits = sum(r.sched.num_prefix_hits for r in reps)
        saved = [s for r in reps for s in r.saved_samples]
        generated = sum(r.sched.num_generated_tokens for r in reps)
        prompt = log.num_prompt_tokens
        num_done = log.num_finished
        summary = {
            "requests_arrived": self.num_arrived,
            "requests_finished": num_done,
            "requests_rejected": self.num_rejected,
            "requests_unfinished": self.num_arrived - self.num_rejected - num_done,
            "simulated_duration_s": round(duration_s, 9),
            "num_steps": sum(r.num_steps for r in reps),
            "mean_running": round(sum(r.running_area for r in reps) / duration_ns, 6),
            "max_running": max(r.max_running for r in reps),
            "mean_waiting": round(sum(r.waiting_area for r in reps) / duration_ns, 6),
            "memory_breakdown": breakdown,
            "mean_kv_usage": round(sum(r.usage_area for r in reps) / 2 / duration_ns / len(reps), 6),
            "prefix_hit_rate": round(hits / queries, 6) if queries else 0.0,
            "prefix_query_tokens": queries,
            "prefix_hit_tokens": hits,
            "preempted_prefix_query_tokens": sum(r.sched.num_preempted_queries for r in reps),
            "preempted_prefix_hit_tokens": sum(r.sched.num_preempted_hits for r in reps),
            "blocks_saved_by_sharing_mean": round(float(np.mean(saved)), 6) if saved else 0.0,
            "blocks_saved_by_sharing_max": int(max(saved)) if saved else 0,
            "num_preemptions": sum(r.sched.num_preemptions for r in reps),
            "preempted_requests": log.num_preempted_requests,
            "generated_tokens": generated,
            "prompt_tokens": prompt,
            "computed_prompt_tokens": sum(r.sched.num_prompt_tokens_computed for r in reps),
            "output_throughput_tokens_per_s": round(generated / duration_s, 6) if duration_s else 0.0,
            "total_throughput_tokens_per_s":
                round((generated + prompt) / duration_s, 6) if duration_s else 0.0,
            "request_throughput_per_s": round(num_done / duration_s, 6) if duration_s else 0.0,
            "ttft_s": percentiles(log.latencies("ttft_s")),
            "tpot_s": percentiles(log.latencies("tpot_s")),
            "e2e_s": percentiles(log.latencies("e2e_s")),
            "wall_clock_s": round(self.wall_s, 3),
            "config": {"engine": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
                       "replicas": len(reps), "router": self.router, "seed": self.seed,
                       "cost_model": type(self.cost).__name__, "step_clock": self.step_clock},
        }
        assert tuple(summary) == SUMMARY_KEYS
        return summary


def simulate(requests: Iterable, config: EngineConfig, cost_model: CostModel, *,
             replicas: int = 1, router: str = "round-robin",
             sample_interval_s: float | None = None, snapshot_times_s: Iterable[float] = (),
             seed: int = 0, progress: bool = False, record_steps: bool = False,
             batch_decode_steps: bool = True, record_requests: bool = True) -> Result:
    """Replay ``requests`` through ``replicas`` replicas of ``config``; see ``Simulation``.

    Returns:
        Result (summary with stable keys, time series, per-request table, snapshots).
    """
    sim = Simulation(requests, config, cost_model, replicas=replicas, router=router,
                     sample_interval_s=sample_interval_s, snapshot_times_s=snapshot_times_s,
                     seed=seed, progress=progress, record_steps=record_steps,
                     batch_decode_steps=batch_decode_steps, record_requests=record_requests)
    return sim.run()
