"""Recording: what a simulation keeps of each replica, and the tables it keeps it in.

``Recorder`` (one per simulation) holds the tables: the per-request rows (``RequestLog``), the
time series sampled every ``sample_ns`` (``TableLog``) or one row per engine step with the vLLM
oracle's column names (``StepLog``), and pool snapshots. ``ReplicaRecorder`` (one per replica) is
what the engine loop calls at step boundaries: it integrates the time-weighted figures (memory
breakdown, usage, running, waiting) between boundaries, takes due samples and snapshots, writes
step rows and finished requests.

Everything is kept in compact typed columns (``array``), so memory grows with what is recorded
(about 120 bytes per finished request, one row per sample), never with the trace's tokens.
"""
from __future__ import annotations

import math
from array import array
from dataclasses import replace

import numpy as np
import pandas as pd

from kvsim.allocator import MEMORY_CLASSES
from kvsim.simulator.cost import NS_PER_S, to_ns
from kvsim.simulator.seq_state import FINISHED

_NEVER = 1 << 62
DECODE_RUN = object()   # ReplicaRecorder.last_step after a batched run of pure decode steps
NUM_CLASSES = len(MEMORY_CLASSES)


def scheduled_arrival_ns(req, step_clock: bool) -> int:
    """When the workload sends ``req`` (its arrival time; on the step clock, its arrival step).
    Under a client's concurrency limit it reaches the engine later, when a slot frees
    (``client_queue_s``, vllm bench serve's client-side queueing)."""
    if step_clock and req.arrival_step is not None:
        return req.arrival_step * NS_PER_S
    return to_ns(req.arrival_s)


# per-request columns: (name, array typecode); arrival_s is when the request reached the engine
# (vllm bench serve's start_time: after any client-side queueing, client_queue_s)
REQUEST_COLUMNS = (
    ("request_id", "q"), ("replica", "i"), ("arrival_s", "d"), ("first_sched_s", "d"),
    ("first_token_s", "d"), ("finish_s", "d"), ("ttft_s", "d"), ("tpot_s", "d"), ("e2e_s", "d"),
    ("prompt_tokens", "q"), ("output_tokens", "q"), ("num_output", "q"), ("num_samples", "i"),
    ("num_preemptions", "i"), ("cached_tokens_first", "q"), ("cached_tokens_total", "q"),
    ("arrival_step", "q"), ("first_sched_step", "q"), ("first_token_step", "q"),
    ("finish_step", "q"), ("rejected", "b"), ("client_queue_s", "d"),
)

# oracle steps.csv columns (../shared/tools/vllm_oracle/README.md), then ours
STEP_COLUMNS = (
    "step", "arrived", "sched_reqs", "sched_tokens", "prefill_tokens", "decode_reqs", "new_reqs",
    "resumed_reqs", "running", "waiting", "kv_usage", "kv_used_blocks", "preempted",
    "cum_preemptions", "pc_queries", "pc_hits", "cum_pc_queries", "cum_pc_hits",
    "pc_preempted_queries", "pc_preempted_hits", "finished", "cum_finished", "running_end",
    "waiting_end", "kv_usage_end", "replica", "time_s",
)

SAMPLE_COLUMNS = (
    ("time_s", "d"), ("replica", "i"), ("running", "q"), ("waiting", "q"),
    ("batch_tokens", "q"), ("num_preemptions", "q"), ("prefix_query_tokens", "q"),
    ("prefix_hit_tokens", "q"), ("finished", "q"), ("kv_usage", "d"),
    ("blocks_saved_by_sharing", "q"),
) + tuple((name, "q") for name in MEMORY_CLASSES)


def offload_columns(tiers: tuple[str, ...]) -> tuple:
    """Sample columns of offload tiers (only with tiers): per tier the chunks used, tokens loaded
    from it, bytes loaded from it and bytes stored into it (running totals), then the requests
    waiting for a load."""
    if not tiers:
        return ()
    cols = tuple((f"{t}_{what}", "q") for t in tiers
                 for what in ("used_chunks", "hit_tokens", "loaded_bytes", "stored_bytes"))
    return cols + (("loading_requests", "q"),)


class RequestLog:
    """One row per request, appended when it finishes (or is rejected).

    Args:
        keep_rows: keep every column (the per-request table). False keeps only what the
            summary needs: latencies (24 bytes per finished request) and running totals.
    """

    def __init__(self, keep_rows: bool = True):
        self.keep_rows = keep_rows
        names = REQUEST_COLUMNS if keep_rows else tuple(
            (n, c) for n, c in REQUEST_COLUMNS if n in ("ttft_s", "tpot_s", "e2e_s"))
        self.cols = {name: array(code) for name, code in names}
        self.num_rows = 0
        self.num_finished = 0
        self.num_prompt_tokens = 0        # of finished requests
        self.num_preempted_requests = 0   # finished requests preempted at least once

    def add(self, **row) -> None:
        """A row with every REQUEST_COLUMNS value."""
        if not self.keep_rows:
            if row["rejected"]:
                self.num_rows += 1
            else:
                self.add_finished(row["ttft_s"], row["tpot_s"], row["e2e_s"],
                                  row["prompt_tokens"], row["num_preemptions"])
            return
        self.num_rows += 1
        if not row["rejected"]:
            self._count(row["prompt_tokens"], row["num_preemptions"])
        for name, col in self.cols.items():
            col.append(row[name])

    def add_finished(self, ttft_s: float, tpot_s: float, e2e_s: float, prompt_tokens: int,
                     num_preemptions: int) -> None:
        """A finished request when rows are not kept: its latencies and the running totals."""
        self.num_rows += 1
        self._count(prompt_tokens, num_preemptions)
        cols = self.cols
        cols["ttft_s"].append(ttft_s)
        cols["tpot_s"].append(tpot_s)
        cols["e2e_s"].append(e2e_s)

    def _count(self, prompt_tokens: int, num_preemptions: int) -> None:
        self.num_finished += 1
        self.num_prompt_tokens += prompt_tokens
        self.num_preempted_requests += num_preemptions > 0

    def __len__(self) -> int:
        return self.num_rows

    def latencies(self, name: str) -> np.ndarray:
        """One latency column of the finished requests (rejected rows carry NaN)."""
        col = self.cols[name]
        return np.frombuffer(col, dtype=col.typecode) if len(col) else np.array([])

    def frame(self) -> pd.DataFrame:
        """The per-request table (empty, with the columns, when rows are not kept)."""
        if not self.keep_rows:
            return pd.DataFrame({name: np.array([], dtype=code) for name, code in REQUEST_COLUMNS})
        df = pd.DataFrame({name: np.frombuffer(col, dtype=col.typecode) if len(col) else
                           np.array([], dtype=col.typecode) for name, col in self.cols.items()})
        df["rejected"] = df["rejected"].astype(bool)
        return df.sort_values("request_id", kind="stable").reset_index(drop=True)


class TableLog:
    """Rows of fixed columns kept as typed arrays (samples) or lists (steps)."""

    def __init__(self, columns):
        self.columns = columns
        self.cols = {name: array(code) for name, code in columns}

    def add(self, values) -> None:
        for (name, _), v in zip(self.columns, values):
            self.cols[name].append(v)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({name: np.frombuffer(col, dtype=col.typecode) if len(col) else
                             np.array([], dtype=col.typecode) for name, col in self.cols.items()})


class StepLog:
    """Per-step rows with the oracle's names (step-record mode; small traces)."""

    def __init__(self):
        self.rows: list[tuple] = []
        self.extra_columns: tuple = ()     # hardware in the loop: in_the_loop.IN_THE_LOOP_COLUMNS

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=list(STEP_COLUMNS + self.extra_columns))


class Recorder:
    """The tables of one simulation, shared by its replicas' ``ReplicaRecorder``s.

    Args:
        sample_ns: time-series sampling period (ns).
        snapshot_ns: sorted times (ns) at which to snapshot every replica's pool.
        record_steps: one row per engine step (oracle column names) instead of samples.
        record_requests: keep the per-request table (else only the summary's latencies).
    """

    def __init__(self, *, sample_ns: int, snapshot_ns: list[int], record_steps: bool,
                 record_requests: bool, offload_tiers: tuple[str, ...] = ()):
        self.sample_ns = sample_ns
        self.snapshot_ns = snapshot_ns
        self.record_steps = record_steps
        self.requests = RequestLog(keep_rows=record_requests)
        self.offload_tiers = offload_tiers
        self.samples = TableLog(SAMPLE_COLUMNS + offload_columns(offload_tiers))
        self.steps = StepLog()
        self.snapshots: list = []          # (time_s, replica, PoolSnapshot)
        self.replicas: list[ReplicaRecorder] = []
        # called once per request that leaves the engine, finished or rejected (a client's
        # concurrency slot frees: Simulation's max_concurrency)
        self.on_request_done = None

    def replica(self, index: int, sched, allocator, step_clock: bool) -> "ReplicaRecorder":
        """A recorder for replica ``index`` (its scheduler and allocator)."""
        rec = ReplicaRecorder(self, index, sched, allocator, step_clock)
        self.replicas.append(rec)
        return rec

    @property
    def end_ns(self) -> int:
        """The latest step boundary any replica reached."""
        return max((r.end_ns for r in self.replicas), default=0)

    def timeseries(self) -> pd.DataFrame:
        """Step rows in step-record mode, else the samples."""
        return self.steps.frame() if self.record_steps else self.samples.frame()

    def record_rejected(self, replica: int, req, t_ns: int) -> None:
        """A row for a request that can never be served (``rejected`` = 1)."""
        nan = math.nan
        self.requests.add(
            request_id=req.request_id, replica=replica, arrival_s=t_ns / NS_PER_S,
            first_sched_s=nan, first_token_s=nan, finish_s=nan, ttft_s=nan, tpot_s=nan,
            e2e_s=nan, prompt_tokens=req.prompt_tokens, output_tokens=req.output_tokens,
            num_output=0, num_samples=max(req.n, req.beam_width), num_preemptions=0,
            cached_tokens_first=-1, cached_tokens_total=0,
            arrival_step=req.arrival_step if req.arrival_step is not None else -1,
            first_sched_step=-1, first_token_step=-1, finish_step=-1, rejected=1,
            client_queue_s=(t_ns - scheduled_arrival_ns(req, self.replicas[replica].step_clock)) / NS_PER_S)
        if self.on_request_done is not None:
            self.on_request_done()


class ReplicaRecorder:
    """What one replica records, called by its engine loop (see the module docstring).

    Time-weighted figures integrate between step boundaries: a single step holds the pool as it
    was right after its schedule; a run of decode steps goes linearly from the state at its
    start to the state after its last schedule (trapezoid); idle gaps hold the pool as it is.
    """

    def __init__(self, tables: Recorder, index: int, sched, allocator, step_clock: bool):
        self.tables = tables
        self.index = index
        self.sched = sched
        self.allocator = allocator
        self.step_clock = step_clock
        self.way_out_ns = 0                    # a step's end -> its token at the client (the engine sets it)
        self.end_ns = 0                        # the latest boundary seen
        self.last_t = 0                        # end of the last integrated segment
        self.bd_area = [0] * NUM_CLASSES       # trapezoid areas x2 (slot-ns)
        self.usage_area = 0.0
        self.running_area = 0                  # requests x ns, running during steps
        self.waiting_area = 0
        self.cur_running = 0                   # after the last schedule
        self.cur_waiting = 0
        self.max_running = 0
        self.last_batch_tokens = 0
        self.next_sample_ns = 0
        self.next_snapshot = 0                 # index into tables.snapshot_ns
        self.next_record_ns = 0                # min(next sample, next snapshot): the engine's bound
        self.last_step = None                  # the step that ended last: StepOutput, DECODE_RUN
        self._update_next_record()
        self.arrived_since_step = 0
        self.num_finished = 0
        # KV-cache groups (GroupedPagedAllocator): per group, slots by class summed over
        # samples (token_states, internal_fragmentation, cached), the samples, most blocks held
        self.grouped = hasattr(allocator, "group_breakdown")
        if self.grouped:
            self.group_sums = [[0, 0, 0] for _ in allocator.groups]
            self.group_max_blocks = [0] * len(allocator.groups)
            self.group_samples = 0
        self.saved_samples: list[int] = []
        self.cum = [0, 0, 0, 0]                # step rows: preemptions, pc queries, pc hits, finished

    # ---------------------------------------------------------------- the pool now
    def _waiting_final_tokens(self):
        if not self.sched.waiting:
            return None
        head = self.sched.waiting[0]
        return head.num_prompt_tokens + head.max_output_tokens

    def _waiting_prompt_tokens(self):
        # the pow2 policy sizes the head's extent from its prompt, not only its final length
        return self.sched.waiting[0].num_prompt_tokens if self.sched.waiting else None

    def breakdown(self) -> list[int]:
        """Slots per MEMORY_CLASSES now (tokens scheduled but not yet told count as states)."""
        sched = self.sched
        if sched.paged:
            vals = self.allocator.breakdown_slots()
        else:
            bd = self.allocator.breakdown(self._waiting_final_tokens(),
                                          waiting_num_prompt_tokens=self._waiting_prompt_tokens())
            vals = [bd[c] for c in MEMORY_CLASSES]
        pending = sched.num_pending_tokens
        if pending:
            # tokens scheduled but not yet told to the allocator sit in held slots
            vals[0] += pending
            vals[2 if sched.paged else 1] -= pending
        return vals

    def pool_snapshot(self):
        """PoolSnapshot of the replica's pool now (allocator.PoolSnapshot), with the batch of the
        step that ended last (``step_seq_ids``, ``step_num_new_tokens``: the sequences still in
        the pool, in batch order), which ``kvsim validate --step`` runs through the kernels."""
        self.sched.sync_allocator()
        if self.sched.paged:
            snap = self.allocator.snapshot()
        else:
            snap = self.allocator.snapshot(self._waiting_final_tokens(),
                                           waiting_num_prompt_tokens=self._waiting_prompt_tokens())
        if self.last_step is None:
            return snap
        if self.last_step is DECODE_RUN:   # a run of pure decode steps: everyone running, 1 each
            batch = [(seq.seq_id, 1) for seq in self.sched.running]
        else:
            batch = [(seq.seq_id, n) for seq, n in self.last_step.scheduled]
        batch = [(s, n) for s, n in batch if s in snap.block_tables]   # finished, preempted: gone
        return replace(snap, step_seq_ids=np.array([s for s, _ in batch], dtype=np.int64),
                       step_num_new_tokens=np.array([n for _, n in batch], dtype=np.int64))

    # ---------------------------------------------------------------- time-weighted figures
    def _update_next_record(self) -> None:
        snaps = self.tables.snapshot_ns
        nxt = snaps[self.next_snapshot] if self.next_snapshot < len(snaps) else _NEVER
        self.next_record_ns = min(self.next_sample_ns, nxt)

    def boundary(self, now: int) -> list[int] | None:
        """At a step boundary (time ``now``): integrate any idle gap, then take due samples and
        snapshots. Returns the breakdown now (before this boundary's schedule), or None if it
        was not needed."""
        if now > self.end_ns:
            self.end_ns = now
        if now <= self.last_t and self.next_record_ns > now:
            return None   # nothing to integrate or record here
        bd = self.close_idle_gap(now)
        tables = self.tables
        snaps = tables.snapshot_ns
        if self.next_snapshot < len(snaps) and snaps[self.next_snapshot] <= now:
            while self.next_snapshot < len(snaps) and snaps[self.next_snapshot] <= now:
                t = snaps[self.next_snapshot]
                tables.snapshots.append((t / NS_PER_S, self.index, self.pool_snapshot()))
                self.next_snapshot += 1
            self._update_next_record()
        return bd

    def close_idle_gap(self, now: int) -> list[int]:
        """Integrate the time since the last segment and take the samples due. Returns the
        breakdown now.

        Time since the last segment is an idle gap: a replica idles only when nothing runs and
        nothing waits, and the arrivals that end the gap land at ``now``, before this call. So the
        gap holds the pool as it is now, with nothing running, nothing waiting and no batch; the
        samples inside it say so (sampling them with the state now, after the arrivals, would
        show a queue and the last batch over an idle pool for the whole gap).
        """
        bd = self.breakdown()
        usage = self.allocator.usage
        gap = now > self.last_t
        if gap:
            self.cur_running = 0
            self.cur_waiting = 0
            self.last_batch_tokens = 0   # no step ran in the gap
            self.integrate(bd, bd, usage, usage, self.last_t, now)
        if self.next_sample_ns <= now and not self.tables.record_steps:
            self._sample(now, bd, usage, idle_before_ns=now if gap else None)
        return bd

    def final_sample(self, end_ns: int) -> None:
        """The last row of the time series: the state at the run's end ``end_ns`` (after the
        last finish: nothing runs or waits, the pool holds only cached blocks), when the periodic
        samples stopped before it. It is not a periodic sample: the summary's sample means leave
        it out."""
        if self.tables.record_steps or self.next_sample_ns - self.tables.sample_ns >= end_ns:
            return
        sched = self.sched
        self.tables.samples.add((end_ns / NS_PER_S, self.index, len(sched.running),
                                 sched.num_waiting, 0, *self._counters(), self.allocator.usage,
                                 self._saved_blocks(), *self.breakdown(),
                                 *(self._offload_row() if self.tables.offload_tiers else ())))

    def scheduled(self, num_running: int, num_waiting: int, num_tokens: int) -> None:
        """After a schedule (or at the start of a decode run): the counts its segment holds."""
        self.cur_running = num_running
        self.cur_waiting = num_waiting
        if num_running > self.max_running:
            self.max_running = num_running
        if num_tokens:
            self.last_batch_tokens = num_tokens

    def running_now(self, num_running: int) -> None:
        """Async scheduling freed the requests that finished in the batch in flight, right
        after this step's schedule: the step's time-weighted running count is without them
        (``max_running`` keeps vLLM's count after the schedule)."""
        self.cur_running = num_running

    def integrate(self, bd_left, bd_right, usage_left: float, usage_right: float, t0: int,
                  t1: int) -> None:
        """Add one segment to the time-weighted figures: the pool goes linearly from
        ``bd_left`` to ``bd_right`` (trapezoid; equal for one step), running/waiting are the
        counts after the segment's schedule."""
        dt = t1 - t0
        area = self.bd_area
        for i in range(NUM_CLASSES):
            area[i] += (bd_left[i] + bd_right[i]) * dt
        self.usage_area += (usage_left + usage_right) * dt
        self.running_area += self.cur_running * dt
        self.waiting_area += self.cur_waiting * dt
        self.last_t = t1

    def _saved_blocks(self) -> int:
        """Blocks prefix sharing saves now: logical blocks of the sequences minus blocks held."""
        if not self.sched.paged:
            return 0
        return max(0, self.sched.num_logical_blocks() - self.allocator.num_used_blocks)

    def _offload_row(self) -> tuple:
        """The offload tiers' sample columns (recorder.offload_columns)."""
        return self.sched.offload.sample_row() + (len(self.sched.holding),)

    def _counters(self) -> tuple:
        sched = self.sched
        return (sched.num_preemptions, sched.num_prefix_queries, sched.num_prefix_hits,
                self.num_finished)

    def _sample(self, now: int, bd: list[int], usage: float,
                idle_before_ns: int | None = None) -> None:
        """The samples due at or before ``now``; those before ``idle_before_ns`` (an idle gap that
        ends at ``now``) with nothing running or waiting."""
        sched = self.sched
        saved = self._saved_blocks()
        self.saved_samples.append(saved)
        counters = self._counters()
        row_tail = (len(sched.running), sched.num_waiting, self.last_batch_tokens, *counters,
                    usage, saved, *bd)
        idle_tail = (0, 0, 0, *counters, usage, saved, *bd)
        if self.tables.offload_tiers:
            tiers = self._offload_row()
            row_tail += tiers
            idle_tail += tiers
        samples = self.tables.samples
        sample_ns = self.tables.sample_ns
        num_rows = 0
        while self.next_sample_ns <= now:
            idle = idle_before_ns is not None and self.next_sample_ns < idle_before_ns
            samples.add((self.next_sample_ns / NS_PER_S, self.index) + (idle_tail if idle else row_tail))
            self.next_sample_ns += sample_ns
            num_rows += 1
        if self.grouped:
            self._sample_groups(num_rows)
        self._update_next_record()

    def _sample_groups(self, weight: int) -> None:
        """Add the pool's per-group split now, ``weight`` samples' worth."""
        alloc = self.allocator
        for i, (g, m) in enumerate(zip(alloc.group_breakdown(), alloc.managers)):
            sums = self.group_sums[i]
            sums[0] += g["token_states"] * weight
            sums[1] += g["internal_fragmentation"] * weight
            sums[2] += g["cached"] * weight
            if m.num_used_blocks > self.group_max_blocks[i]:
                self.group_max_blocks[i] = m.num_used_blocks
        self.group_samples += weight

    # ---------------------------------------------------------------- step rows (oracle names)
    def row_state(self) -> tuple:
        """Oracle columns read right after schedule(): running, waiting, usage, used blocks."""
        sched = self.sched
        return (len(sched.running), sched.num_waiting, self.allocator.usage,
                self.allocator.num_used_blocks if sched.paged else 0)

    def step_row(self, idx: int, out, finished: list, state: tuple, extra: tuple = ()) -> None:
        """The row of one step scheduled in detail (``state`` from ``row_state``; ``extra``: the
        values of ``StepLog.extra_columns``)."""
        sched = self.sched
        running, waiting, usage, used = state
        cum = self.cum
        cum[0] += out.num_preempted
        cum[1] += out.pc_queries
        cum[2] += out.pc_hits
        cum[3] += len(finished)
        arrived = self.arrived_since_step
        self.arrived_since_step = 0
        if self.grouped:
            self._sample_groups(1)
        self.tables.steps.rows.append((
            idx, arrived, out.num_seqs, out.num_scheduled_tokens, out.num_prefill_tokens,
            # vLLM 0.33's V2 model runner reports resumed requests among the new ones
            out.num_decode_seqs, out.num_new + out.num_resumed, 0, running, waiting, round(usage, 6),
            used, out.num_preempted, cum[0], out.pc_queries, out.pc_hits, cum[1], cum[2],
            out.pc_preempted_queries, out.pc_preempted_hits, len(finished), cum[3],
            len(sched.running) - len(sched.done_in_flight), sched.num_waiting,
            round(self.allocator.usage, 6), self.index,
            idx * 1.0 if self.step_clock else math.nan) + extra)

    def decode_rows(self, step0: int, k: int, n: int, hist: list[int], used0: int,
                    finished: list) -> None:
        """Per-step rows of a batched decode run of ``k`` steps from step ``step0`` (the same
        values as stepping one by one): ``hist`` is the run's crossing histogram, ``used0`` the
        used blocks before it."""
        sched = self.sched
        alloc = self.allocator
        usable = alloc.num_usable_blocks if sched.paged else 1
        B = sched.block_size
        used = used0
        waiting = sched.num_waiting
        cum = self.cum
        rows = self.tables.steps.rows
        for j in range(1, k + 1):
            idx = step0 + j - 1
            if sched.paged:
                used += hist[(j - 1) % B + 1]
            usage = round(1.0 - (usable - used) / usable, 6) if sched.paged else \
                round(alloc.usage, 6)
            nfin = len(finished) if j == k else 0
            cum[3] += nfin
            end_usage = round(alloc.usage, 6) if j == k else usage
            arrived = self.arrived_since_step
            self.arrived_since_step = 0
            rows.append((
                idx, arrived, n, n, 0, n, 0, 0, n, waiting, usage, used, 0, cum[0], 0, 0,
                cum[1], cum[2], 0, 0, nfin, cum[3], n - nfin, waiting, end_usage, self.index,
                idx * 1.0 if self.step_clock else math.nan))

    # ---------------------------------------------------------------- per-request rows
    def on_finished(self, seq) -> None:
        """A sequence finished: the request's row (a forked request's once all its members
        finished)."""
        group = seq.group
        if group is not None:
            if group.recorded or len(group.members) < group.width or any(
                    m.status != FINISHED for m in group.members):
                return
            group.recorded = True
            members = group.members
        else:
            members = (seq,)
        self.num_finished += 1
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
        first_token += self.way_out_ns         # as the client sees them
        finish += self.way_out_ns
        if self.tables.on_request_done is not None:
            self.tables.on_request_done()
        ttft = (first_token - arrival) / NS_PER_S
        tpot = (finish - first_token) / NS_PER_S / (num_output - 1) if num_output > 1 else math.nan
        e2e = (finish - arrival) / NS_PER_S
        log = self.tables.requests
        if not log.keep_rows:   # no per-request table: what the summary needs
            log.add_finished(ttft, tpot, e2e, req.prompt_tokens, num_preemptions)
            return
        log.add(
            request_id=req.request_id, replica=self.index, arrival_s=arrival / NS_PER_S,
            first_sched_s=head.first_sched_ns / NS_PER_S, first_token_s=first_token / NS_PER_S,
            finish_s=finish / NS_PER_S, ttft_s=ttft, tpot_s=tpot,
            e2e_s=e2e, prompt_tokens=req.prompt_tokens,
            output_tokens=req.output_tokens, num_output=num_output, num_samples=len(members),
            num_preemptions=num_preemptions, cached_tokens_first=head.cached_tokens_first,
            cached_tokens_total=cached_total,
            arrival_step=req.arrival_step if req.arrival_step is not None else -1,
            first_sched_step=head.first_sched_step, first_token_step=first_token_step,
            finish_step=finish_step, rejected=0,
            client_queue_s=(arrival - scheduled_arrival_ns(req, self.step_clock)) / NS_PER_S)
