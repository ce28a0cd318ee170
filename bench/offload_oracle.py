"""The vLLM oracle with CPU offloading: vLLM 0.33's OffloadingConnector and a worker stub.

vLLM's real Scheduler and KVCacheManager (as ../shared/tools/vllm_oracle/oracle.py drives them)
and vLLM's native CPU offloading: ``kv_offloading_size`` of ``--cpu-chunks`` pages (the oracle's
blocks are a page or less, so a chunk is one page), which VllmConfig turns into the
``OffloadingConnector`` (role ``kv_both``). The connector's scheduler side is vLLM's own, unchanged: lookups after the GPU
hit, async loads into ``WAITING_FOR_REMOTE_KVS``, store jobs of every step's new prompt chunks,
flushes, the CPU tier's LRU (``CPUOffloadingManager``).

What vLLM's GPU worker would do is a stub (``Worker``): it takes each step's load and store jobs
from the connector's metadata and reports them done (``KVConnectorOutput``: the job ids, and the
loading requests in ``finished_recving``) by the timing rules kvsim's connector states
(docs/OFFLOAD.md "How transfers overlap the steps"): one queue per direction, each transfer
after the previous one in its queue, ``--transfer-steps-per-chunk`` steps per chunk; a step's
loads start when its forward ends; stores are submitted in the next step and start when its
forward ends; flushed jobs are submitted at once and the forward waits for them; completions
are polled at a step's start and reported in its output. So the transfer times are an input
shared by both sides; every decision taken with them is vLLM's.

The engine loop is vLLM's ``EngineCore.step`` with a connector, on a clock where a forward
takes one step: it steps while ``scheduler.has_requests()`` (unfinished requests, finished ones
not yet signalled to the connector, or transfers pending). A step that schedules nothing takes
no time (vLLM's ``kv_connector_no_forward``): when its poll found a completion, the engine
schedules again at once; else it sleeps until the next transfer completes or the next request
arrives, then reports the completions before anything else (an empty step's poll) and schedules
again.

With ``--async-scheduling`` (vLLM's AsyncScheduler, two batches in flight), the loop is
oracle.py's: a step is scheduled before the output of the step in flight is processed, so a
completion that step's poll found reaches the scheduler one step later; an empty schedule while
a batch is in flight polls, then that batch is processed and the engine schedules again. vLLM
itself then defers freeing a preempted request's blocks until the step in flight is processed
(``defer_block_free``: the OffloadingConnector is a KV consumer).

Same trace format, arguments and outputs as oracle.py (steps.csv, requests.csv, summary.json),
plus ``--cpu-chunks N`` and ``--transfer-steps-per-chunk K``; summary.json adds the connector's
``offload`` counters (the tier's totals and vLLM's connector counters). kvsim's equivalent
flags: ``bench/fidelity_diff.offload_argv`` (N chunks of one Llama-3.1-8B block, a link moving
one chunk per K steps).

    ../oracle-venv/bin/python bench/offload_oracle.py --cpu-chunks 64 --trace t.csv \\
        --out-dir out --num-gpu-blocks 200
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import heapq
import json
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.hybrid_oracle import hybrid_build_scheduler, load_oracle, parse_groups  # noqa: E402

if sys.path and Path(sys.path[0]).resolve() == ROOT:
    sys.path.pop(0)   # keep the repo (whose bench/ holds a kernels.py) off vLLM's import path

PAGE_BYTES = 4096     # the CPU tier aligns a chunk to this (the oracle's blocks are smaller)


class _FinishOrder(set):
    """The scheduler's ``finished_req_ids`` iterated in the order the requests finished. vLLM's
    is a plain set of request-id strings, so the connector signals (``on_request_finished``,
    which commits each request's CPU-tier recency) and offers finished requests in an order
    that follows the process's string-hash seed (random per process unless PYTHONHASHSEED is
    set): any order is vLLM's. The oracle takes the finish order, kvsim's."""

    def __init__(self):
        super().__init__()
        self._order: list = []

    def add(self, item) -> None:
        if item not in self:
            self._order.append(item)
        super().add(item)

    def __iter__(self):
        return iter([item for item in self._order if item in self])


def _finish_in_order(sched) -> None:
    """Every ``finished_req_ids`` of ``sched`` a _FinishOrder (it makes a new one after each
    schedule)."""
    schedule = sched.schedule

    def ordered_schedule(*args, **kwargs):
        out = schedule(*args, **kwargs)
        sched.finished_req_ids = _FinishOrder()
        return out

    sched.finished_req_ids = _FinishOrder()
    sched.schedule = ordered_schedule


class Worker:
    """The GPU worker's transfers, as kvsim's connector times them (module doc). Times are in
    steps (one forward = 1); a job's duration is its chunks x ``steps_per_chunk``."""

    def __init__(self, steps_per_chunk: int):
        self.steps_per_chunk = steps_per_chunk
        self.free = {"load": 0, "store": 0}     # when each direction's queue is free
        self.kind: dict[int, str] = {}          # job id -> load | store (until reported)
        self.request: dict[int, str] = {}       # load job id -> its request
        self.size: dict[int, int] = {}          # job id -> chunks
        self.done: dict[int, int] = {}          # submitted job id -> completion time
        self.inflight: list[tuple[int, int]] = []
        self.new_loads: list[int] = []          # this step's: start when its forward ends
        self.deferred: list[int] = []           # last step's stores: submitted in this one
        self.new_stores: list[int] = []
        self.loaded_chunks = self.stored_chunks = 0
        self.flush_stall = 0

    def take(self, meta) -> list[int]:
        """A step's connector metadata: register its jobs; returns the jobs to flush."""
        for job_id, job in meta.load_jobs.items():
            self._add(job_id, "load", job)
            self.request[job_id] = job.req_id
            self.new_loads.append(job_id)
        for job_id, job in meta.store_jobs.items():
            self._add(job_id, "store", job)
            self.new_stores.append(job_id)
        return sorted(meta.jobs_to_flush or ())

    def _add(self, job_id: int, kind: str, job) -> None:
        assert not job.sync, "sync loads are not modelled"
        self.kind[job_id] = kind
        self.size[job_id] = len(job.dst_spec.block_ids if kind == "store" else
                                job.src_spec.block_ids)

    def step(self, t: int, meta, forward: int) -> tuple[int, list[int]]:
        """A step at ``t`` whose forward takes ``forward``: flush, poll, submit (kvsim's
        ``OffloadConnector.step``). Returns (the flush stall, the jobs its poll found)."""
        stall = 0
        for job_id in self.take(meta):
            if job_id not in self.kind:
                continue                        # reported already
            self._submit(job_id, t)
            stall = max(stall, self.done[job_id] - t)
        self.flush_stall += stall
        found = self.poll(t + stall)
        for job_id in self.new_loads + self.deferred:
            self._submit(job_id, t + stall + forward)
        self.new_loads, self.deferred, self.new_stores = [], self.new_stores, []
        return stall, found

    def submit_all(self, t: int) -> None:
        """Nothing to schedule: what waits is submitted now (kvsim's ``idle_until``)."""
        for job_id in self.new_loads + self.deferred + self.new_stores:
            self._submit(job_id, t)
        self.new_loads, self.deferred, self.new_stores = [], [], []

    def next_done(self) -> int | None:
        return self.inflight[0][0] if self.inflight else None

    def _submit(self, job_id: int, ready: int) -> None:
        if job_id in self.done or job_id not in self.kind:
            return                              # submitted early by a flush (or reported)
        kind = self.kind[job_id]
        start = max(ready, self.free[kind])
        self.free[kind] = self.done[job_id] = start + self.size[job_id] * self.steps_per_chunk
        heapq.heappush(self.inflight, (self.done[job_id], job_id))

    def poll(self, t: int) -> list[int]:
        """The submitted jobs done by ``t`` (taken off the in-flight heap)."""
        found = []
        while self.inflight and self.inflight[0][0] <= t:
            found.append(heapq.heappop(self.inflight)[1])
        return found

    def output(self, found: list[int]):
        """The KVConnectorOutput reporting ``found`` (None when empty)."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata)
        from vllm.v1.outputs import KVConnectorOutput

        if not found:
            return None
        meta = OffloadingWorkerMetadata()
        recving = set()
        for job_id in found:
            meta.mark_completed(job_id)
            kind = self.kind.pop(job_id)
            del self.done[job_id]
            if kind == "load":
                recving.add(self.request.pop(job_id))
                self.loaded_chunks += self.size.pop(job_id)
            else:
                self.stored_chunks += self.size.pop(job_id)
        return KVConnectorOutput(finished_recving=recving or None, kv_connector_worker_meta=meta)


def run(oracle, a, build) -> dict:
    """The engine loop (module doc); writes oracle.py's files."""
    t_start = time.perf_counter()
    trace = oracle.read_trace(a.trace)
    sched, block_hasher, vllm_config = build(a)
    _finish_in_order(sched)
    is_async = bool(vllm_config.scheduler_config.async_scheduling)
    depth = vllm_config.max_concurrent_batches    # batches in flight (2 with async scheduling)
    t_built = time.perf_counter()
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    worker = Worker(a.transfer_steps_per_chunk)
    lo, hi = 100, a.vocab_size
    by_id = {r.req_id: r for r in trace}
    fab = dict.fromkeys(by_id, 0)
    order = sorted(trace, key=lambda r: (r.arrival_step, r.idx))
    p, n = 0, len(order)
    t = order[0].arrival_step if order else 0
    rows, tap, pool = [], oracle._PrefixStatsTap(sched.kv_cache_manager), \
        sched.kv_cache_manager.block_pool
    empty = ModelRunnerOutput(req_ids=[], req_id_to_index={})
    max_running = 0
    queue: deque = deque()    # batches in flight: (step, scheduler output, its output, row)
    # vLLM's own counters over every step, empty ones included (SchedulerStats): the GPU prefix
    # cache's, and the connector's (queries: num_tokens - GPU hit; hits: tokens loaded)
    totals = dict.fromkeys(["queries", "hits", "preempted_queries", "preempted_hits"], 0)
    connector_totals = dict(totals)

    def process(step, so, mro, row):
        for eco in sched.update_from_output(so, mro).values():
            st = eco.scheduler_stats
            if st is not None:
                for mine, stats in ((totals, st.prefix_cache_stats),
                                    (connector_totals, st.connector_prefix_cache_stats)):
                    for key in mine if stats is not None else ():
                        mine[key] += getattr(stats, key)
            if st is not None and row is not None:
                row.update(running_end=st.num_running_reqs,
                           waiting_end=st.num_waiting_reqs + st.num_skipped_waiting_reqs,
                           kv_usage_end=round(st.kv_cache_usage, 6))
            for o in eco.outputs:
                tr = by_id[o.request_id]
                if o.new_token_ids:
                    if tr.first_token_step < 0:
                        tr.first_token_step = step
                    tr.num_output += len(o.new_token_ids)
                if o.finish_reason is not None:
                    tr.finish_step, tr.finish_reason = step, str(o.finish_reason)
                    if row is not None:
                        row["finished"] += 1

    def report(found):
        """An empty step's output carrying the completions ``found``."""
        out = worker.output(found)
        return empty if out is None else dataclasses.replace(empty, kv_connector_output=out)

    while True:
        arrived = 0
        while p < n and order[p].arrival_step <= t:
            r = order[p]
            p += 1
            r.request = Request(request_id=r.req_id,
                                prompt_token_ids=oracle.build_prompt(r, a.seed, lo, hi),
                                sampling_params=SamplingParams(max_tokens=r.output_tokens,
                                                               ignore_eos=True),
                                pooling_params=None, arrival_time=float(r.arrival_step),
                                block_hasher=block_hasher)
            sched.add_request(r.request)
            arrived += 1
        if not sched.has_requests() and not queue:
            if p >= n:
                break
            t = order[p].arrival_step
            continue
        if not sched.has_requests():
            process(*queue.pop())      # async: the last batch in flight
            continue
        so = sched.schedule()
        if so.total_num_scheduled_tokens == 0:
            # no forward: the worker polls, then what waits is submitted; the engine's empty
            # steps poll until a transfer completes or a request arrives
            _, found = worker.step(t, so.kv_connector_metadata, 0)
            process(-1, so, report(found), None)
            if queue:
                process(*queue.pop())  # async: the batch in flight, then schedule again
                continue
            if found:
                continue       # what completed may be scheduled: the engine steps again at once
            worker.submit_all(t)
            wake = [x for x in (worker.next_done(),
                                order[p].arrival_step if p < n else None) if x is not None]
            if not wake:
                if so.preempted_req_ids:
                    # a preemption emptied the batch (vLLM admits nothing in a step that
                    # preempts): not a stall; the engine steps again, a step later (as oracle.py
                    # counts an empty schedule with nothing in flight)
                    t += 1
                    continue
                if sched.get_num_unfinished_requests():
                    sys.exit(f"stalled at step {t}: nothing schedulable, nothing in flight")
                continue
            if min(wake) > t:
                t = min(wake)
                found = worker.poll(t)
                if found:      # an empty step's schedule, then its output reports them
                    process(-1, sched.schedule(), report(found), None)
            continue
        step = t
        stall, found = worker.step(t, so.kv_connector_metadata, 1)
        t += 1 + stall
        running, waiting = sched.get_request_counts()
        max_running = max(max_running, running)
        dq, dh, dpq, dph = tap.delta()
        for nr in so.scheduled_new_reqs:
            tr = by_id[nr.req_id]
            if tr.first_sched_step < 0:
                tr.first_sched_step, tr.cached_tokens_first = step, nr.num_computed_tokens
        req_ids = list(so.num_scheduled_tokens)
        sampled, prefill_tokens, decode_reqs = [], 0, 0
        for rid in req_ids:
            req, k = sched.requests[rid], so.num_scheduled_tokens[rid]
            samples = not req.is_prefill_chunk
            # tokens known before this step (async: the output placeholders included)
            ph = req.num_output_placeholders - (1 if is_async and samples else 0)
            if k == 1 and req.num_computed_tokens - k == req.num_tokens + ph - 1 \
                    and req.num_output_tokens + ph >= 1:
                decode_reqs += 1
            else:
                prefill_tokens += k
            if samples:
                sampled.append([oracle.sampled_token(by_id[rid], fab[rid], lo, hi)])
                fab[rid] += 1
            else:
                sampled.append([])
        kv_out = worker.output(found)
        mro = ModelRunnerOutput(req_ids=req_ids,
                                req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
                                sampled_token_ids=sampled, kv_connector_output=kv_out)
        row = {"step": step, "arrived": arrived, "sched_reqs": len(req_ids),
               "sched_tokens": so.total_num_scheduled_tokens, "prefill_tokens": prefill_tokens,
               "decode_reqs": decode_reqs, "new_reqs": len(so.scheduled_new_reqs),
               "resumed_reqs": len(so.scheduled_cached_reqs.resumed_req_ids),
               "running": running, "waiting": waiting,
               "kv_usage": round(sched.kv_cache_manager.usage, 6),
               "kv_used_blocks": (pool.num_gpu_blocks - 1) - pool.get_num_free_blocks(),
               "preempted": len(so.preempted_req_ids or ()), "pc_queries": dq, "pc_hits": dh,
               "pc_preempted_queries": dpq, "pc_preempted_hits": dph, "finished": 0,
               "running_end": "", "waiting_end": "", "kv_usage_end": ""}
        rows.append(row)
        queue.appendleft((step, so, mro, row))
        if len(queue) >= depth:
            process(*queue.pop())      # sync: at once; async: the batch before this one
    t_end = time.perf_counter()
    return write_outputs(oracle, a, trace, rows, sched, vllm_config, worker, max_running,
                         (t_built - t_start, t_end - t_built), totals, connector_totals)


def write_outputs(oracle, a, trace, rows, sched, vllm_config, worker, max_running,
                  times, totals: dict, connector_totals: dict) -> dict:
    """steps.csv, requests.csv and summary.json, as oracle.py writes them; the summary's prefix
    counters are vLLM's own over every step (a lookup in an empty step is in no step row)."""
    cum = dict.fromkeys(["preempted", "pc_queries", "pc_hits", "finished",
                         "pc_preempted_queries", "pc_preempted_hits"], 0)
    for row in rows:
        for key in cum:
            cum[key] += row[key]
            if f"cum_{key}" in oracle.STEP_COLS or key == "preempted":
                row[f"cum_{'preemptions' if key == 'preempted' else key}"] = cum[key]
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "steps.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=oracle.STEP_COLS)
        w.writeheader()
        w.writerows(rows)
    with open(out / "requests.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(oracle.REQ_COLS)
        for r in trace:
            w.writerow([r.req_id, r.arrival_step, r.prompt_tokens, r.output_tokens,
                        r.prefix_group or "", r.prefix_len if r.prefix_group else "",
                        r.first_sched_step, r.cached_tokens_first, r.first_token_step,
                        r.finish_step, r.num_output,
                        r.request.num_preemptions if r.request is not None else "",
                        r.finish_reason])
    import vllm

    manager = sched.connector.connector_scheduler.manager
    summary = {
        "vllm_version": vllm.__version__, "scheduler_class": type(sched).__name__,
        "connector": type(sched.connector).__name__, "requests": len(trace),
        "unfinished": sum(1 for r in trace if r.finish_step < 0),
        "total_steps": rows[-1]["step"] + 1 if rows else 0, "busy_steps": len(rows),
        "total_preemptions": cum["preempted"],
        "preempted_requests": sum(1 for r in trace
                                  if r.request is not None and r.request.num_preemptions),
        "prefix_queries": totals["queries"], "prefix_hits": totals["hits"],
        "prefix_hit_rate": totals["hits"] / totals["queries"] if totals["queries"] else 0.0,
        "preempted_prefix_queries": totals["preempted_queries"],
        "preempted_prefix_hits": totals["preempted_hits"],
        "max_running": max_running, "setup_s": round(times[0], 2), "loop_s": round(times[1], 2),
        "offload": {"cpu_chunks": a.cpu_chunks,
                    "transfer_steps_per_chunk": a.transfer_steps_per_chunk,
                    "loaded_chunks": worker.loaded_chunks, "stored_chunks": worker.stored_chunks,
                    "flush_stall_steps": worker.flush_stall,
                    **{f"connector_{k}": v for k, v in connector_totals.items()},
                    "manager": type(manager).__name__},
    }
    scfg, ccfg = vllm_config.scheduler_config, vllm_config.cache_config
    effective = {"scheduler_class": type(sched).__name__, "max_num_seqs": scfg.max_num_seqs,
                 "max_num_batched_tokens": scfg.max_num_batched_tokens,
                 "max_model_len": vllm_config.model_config.max_model_len,
                 "long_prefill_token_threshold": scfg.long_prefill_token_threshold,
                 "async_scheduling": scfg.async_scheduling, "block_size": ccfg.block_size,
                 "num_gpu_blocks": ccfg.num_gpu_blocks,
                 "enable_prefix_caching": ccfg.enable_prefix_caching,
                 "kv_offloading_size": ccfg.kv_offloading_size,
                 "kv_connector": vllm_config.kv_transfer_config.kv_connector}
    with open(out / "summary.json", "w") as f:
        json.dump({"summary": summary, "effective_config": effective, "args": vars(a)}, f,
                  indent=2)
    print(f"steps={summary['total_steps']} busy_steps={len(rows)} "
          f"preemptions={cum['preempted']} loaded_chunks={worker.loaded_chunks} "
          f"stored_chunks={worker.stored_chunks} unfinished={summary['unfinished']}")
    return summary


def run_offload(oracle, argv: list[str], cpu_chunks: int, steps_per_chunk: int,
                kv_groups: str | None = None) -> dict:
    """One run: ``argv`` are oracle.py's arguments (parsed by oracle.py itself)."""
    if cpu_chunks < 1 or steps_per_chunk < 0:
        raise SystemExit("--cpu-chunks must be >= 1 and --transfer-steps-per-chunk >= 0")
    captured = {}
    plain_run = oracle.run
    oracle.run = lambda a: captured.update(a=a)
    try:
        oracle.main(argv)
    finally:
        oracle.run = plain_run
    a = captured["a"]
    a.cpu_chunks, a.transfer_steps_per_chunk, a.kv_groups = cpu_chunks, steps_per_chunk, kv_groups
    build = hybrid_build_scheduler(oracle, parse_groups(kv_groups or "full"),
                                   kv_offloading_size=cpu_chunks * PAGE_BYTES / 2**30)
    return run(oracle, a, build)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--cpu-chunks", type=int, required=True)
    parser.add_argument("--transfer-steps-per-chunk", type=int, default=1)
    parser.add_argument("--kv-groups", default=None)
    ours, rest = parser.parse_known_args(argv)
    run_offload(load_oracle(), rest, ours.cpu_chunks, ours.transfer_steps_per_chunk,
                ours.kv_groups)
    return 0


if __name__ == "__main__":
    sys.exit(main())
