"""The summary of a simulation: the stable keys of ``result.SUMMARY_KEYS`` (docs/SIMULATOR.md).

Built from what the replicas' schedulers counted and their recorders integrated; nothing here
runs the simulation.
"""
from __future__ import annotations

import numpy as np

from kvsim.allocator import MEMORY_CLASSES
from kvsim.simulator.cost import NS_PER_S
from kvsim.simulator.first_use import compiles_summary
from kvsim.simulator.offload import summarize_offload
from kvsim.simulator.recorder import NUM_CLASSES, Recorder
from kvsim.simulator.result import GROUP_SUMMARY_KEY, SUMMARY_KEYS


def percentiles(values: np.ndarray) -> dict:
    """{"mean", "p50", "p90", "p99", "max"} of the finite values (numpy linear percentiles)."""
    v = values[np.isfinite(values)]
    if v.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"mean": round(float(v.mean()), 9), "p50": round(float(p50), 9),
            "p90": round(float(p90), 9), "p99": round(float(p99), 9),
            "max": round(float(v.max()), 9)}


def summarize(recorder: Recorder, replicas: list, *, num_arrived: int, num_rejected: int,
              wall_s: float, config: dict) -> dict:
    """The summary dict, keys in ``SUMMARY_KEYS`` order.

    Args:
        recorder: the simulation's Recorder (request log, per-replica integrals).
        replicas: the replicas, each with ``.sched`` (its Scheduler's counters), ``.rec`` (its
            ReplicaRecorder) and ``.num_steps``.
        num_arrived, num_rejected: requests read from the workload / rejected at arrival.
        wall_s: wall-clock seconds the simulation ran.
        config: the summary's ``config`` value (engine, replicas, router, seed, cost model...).
    """
    scheds = [r.sched for r in replicas]
    recs = [r.rec for r in replicas]
    log = recorder.requests
    end_ns = recorder.end_ns
    duration_ns = max(end_ns, 1)
    duration_s = end_ns / NS_PER_S
    area = [sum(r.bd_area[i] for r in recs) for i in range(NUM_CLASSES)]
    total_area = sum(area)
    if total_area > 0:
        breakdown = {c: round(a / total_area, 9) for c, a in zip(MEMORY_CLASSES, area)}
    else:
        bd = [sum(v) for v in zip(*(r.breakdown() for r in recs))]
        breakdown = {c: round(v / sum(bd), 9) for c, v in zip(MEMORY_CLASSES, bd)}
    queries = sum(s.num_prefix_queries for s in scheds)
    hits = sum(s.num_prefix_hits for s in scheds)
    saved = [s for r in recs for s in r.saved_samples]
    generated = sum(s.num_generated_tokens for s in scheds)
    prompt = log.num_prompt_tokens
    num_done = log.num_finished
    summary = {
        "requests_arrived": num_arrived,
        "requests_finished": num_done,
        "requests_rejected": num_rejected,
        "requests_unfinished": num_arrived - num_rejected - num_done,
        "simulated_duration_s": round(duration_s, 9),
        "num_steps": sum(r.num_steps for r in replicas),
        "mean_running": round(sum(r.running_area for r in recs) / duration_ns, 6),
        "max_running": max(r.max_running for r in recs),
        "mean_waiting": round(sum(r.waiting_area for r in recs) / duration_ns, 6),
        "memory_breakdown": breakdown,
        "mean_kv_usage": round(sum(r.usage_area for r in recs) / 2 / duration_ns / len(recs), 6),
        "prefix_hit_rate": round(hits / queries, 6) if queries else 0.0,
        "prefix_query_tokens": queries,
        "prefix_hit_tokens": hits,
        "preempted_prefix_query_tokens": sum(s.num_preempted_queries for s in scheds),
        "preempted_prefix_hit_tokens": sum(s.num_preempted_hits for s in scheds),
        "blocks_saved_by_sharing_mean": round(float(np.mean(saved)), 6) if saved else 0.0,
        "blocks_saved_by_sharing_max": int(max(saved)) if saved else 0,
        "num_preemptions": sum(s.num_preemptions for s in scheds),
        "preempted_requests": log.num_preempted_requests,
        "generated_tokens": generated,
        "prompt_tokens": prompt,
        "computed_prompt_tokens": sum(s.num_prompt_tokens_computed for s in scheds),
        "output_throughput_tokens_per_s": round(generated / duration_s, 6) if duration_s else 0.0,
        "total_throughput_tokens_per_s":
            round((generated + prompt) / duration_s, 6) if duration_s else 0.0,
        "request_throughput_per_s": round(num_done / duration_s, 6) if duration_s else 0.0,
        "ttft_s": percentiles(log.latencies("ttft_s")),
        "tpot_s": percentiles(log.latencies("tpot_s")),
        "e2e_s": percentiles(log.latencies("e2e_s")),
        "wall_clock_s": round(wall_s, 3),
        "config": config,
    }
    assert tuple(summary) == SUMMARY_KEYS
    if recs and recs[0].grouped:
        summary = _with_groups(summary, recs)
    if any(getattr(r, "compiled", None) is not None for r in replicas):   # only with first-use compiles priced
        summary["first_use_compiles"] = compiles_summary([r.compile_tally for r in replicas])
    connectors = [r.offload for r in replicas if getattr(r, "offload", None) is not None]
    if connectors:   # only with offload tiers: the summary is otherwise unchanged
        summary["offload"] = summarize_offload(connectors, prefix_query_tokens=queries,
                                               prefix_hit_tokens=hits)
    return summary


def group_breakdown_summary(recs: list) -> list[dict]:
    """Each KV-cache group's time-averaged share of the pools by memory class, and the most
    blocks it held (one replica's); with the free slots and the null block the shares of all
    groups sum to memory_breakdown's."""
    alloc = recs[0].allocator
    pool_slots = sum(r.allocator.num_blocks * r.allocator.block_size for r in recs)
    samples = max(1, recs[0].group_samples)
    out = []
    for i, spec in enumerate(alloc.groups):
        token, frag, cached = (sum(r.group_sums[i][k] for r in recs) for k in range(3))
        out.append({"group": i, "name": spec.name or spec.kind, "kind": spec.kind,
                    "sliding_window": spec.sliding_window, "num_layers": spec.num_layers,
                    "token_states": round(token / samples / pool_slots, 9),
                    "internal_fragmentation": round(frag / samples / pool_slots, 9),
                    "cached": round(cached / samples / pool_slots, 9),
                    "max_blocks": max(r.group_max_blocks[i] for r in recs)})
    return out


def _with_groups(summary: dict, recs: list) -> dict:
    out = {}
    for key, value in summary.items():
        out[key] = value
        if key == "memory_breakdown":
            out[GROUP_SUMMARY_KEY] = group_breakdown_summary(recs)
    return out
