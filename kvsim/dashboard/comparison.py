"""What the pages show about the two runs of a scenario: names, notes, summaries, tables, the
pool figure at a frame, and the warning for requests that can never fit."""
from __future__ import annotations

import pandas as pd

from kvsim.allocator import MEMORY_CLASSES
from kvsim.dashboard.playback import fmt_duration, player_payload
from kvsim.dashboard.scenario import Run
from kvsim.planner.sweep import flatten
from kvsim.simulator.overload import overload_reasons
from kvsim.viz.pool import code_colors, pool_heatmap
from kvsim.viz.style import CLASS_COLORS

# keyed by kvsim.simulator.config.ALLOCATORS (a test checks that every allocator is explained)
ALLOCATOR_LABELS = {"paged": "paged (vLLM blocks)", "max": "contiguous, reserve max_model_len",
                    "pow2": "contiguous, reserve next power of two",
                    "oracle": "contiguous, reserve true length (oracle)"}
# one line per allocator for newcomers (shown under each pool)
ALLOCATOR_NOTES = {
    "paged": "Blocks of block_size tokens are taken one at a time as a request grows, anywhere "
             "in the pool; full prompt blocks with the same content are shared.",
    "max": "Each admitted request gets one contiguous extent of max_model_len tokens up front, "
           "however short it turns out to be.",
    "pow2": "Each admitted request gets one contiguous extent of its final length rounded up "
            "to a power of two.",
    "oracle": "Each admitted request gets one contiguous extent of exactly its final length "
              "(an oracle that knows the output length: the best a contiguous scheme can do).",
}

# per-request latency columns of Result.requests shown as CDFs (column -> title)
LATENCY_COLUMNS = {"ttft_s": "Time to first token", "tpot_s": "Time per output token",
                   "e2e_s": "End-to-end latency"}

# headline summary metrics compared as bars (dotted summary key -> title)
HEADLINE = {"request_throughput_per_s": "requests / s", "mean_running": "mean running",
            "ttft_s.p90": "TTFT p90 (s)", "mean_kv_usage": "mean KV usage",
            "num_preemptions": "preemptions"}


def side_label(run: Run) -> str:
    """A run's allocator, and its prefix caching when that is off on a paged pool."""
    off = run.allocator == "paged" and not run.prefix_caching
    return ALLOCATOR_LABELS[run.allocator] + (", prefix caching off" if off else "")


def run_label(i: int, run: Run) -> str:
    """How a run is named in tables and legends: its side and allocator."""
    return f"{'left' if i == 0 else 'right'}: {side_label(run)}"


def live_payload(runs) -> bytes:
    """Both runs' playback frames for the browser player (playback.player_payload)."""
    return player_payload([(side_label(r), r.playback, r.end_s) for r in runs],
                          colors=code_colors(), class_colors=CLASS_COLORS,
                          note=runs[0].playback_note)


def overload_warning(runs) -> str | None:
    """One warning naming the overloaded runs and why (simulator.overload), or None."""
    parts = [f"{run_label(i, r)} ({'; '.join(reasons)})" for i, r in enumerate(runs)
             if (reasons := overload_reasons(r.summary, r.timeseries))]
    if not parts:
        return None
    return ("Overloaded: " + " · ".join(parts) + ". Latencies then measure the queue, not the "
            "allocator, and comparing overloaded runs says little: lower the arrival rate or the "
            "number of requests, or enlarge the KV pool.")


def flat_summaries(runs) -> dict[str, dict]:
    """run label -> summary flattened to dotted keys (``ttft_s.p90``)."""
    return {run_label(i, r): flatten(r.summary) for i, r in enumerate(runs)}


def summary_table(runs) -> pd.DataFrame:
    """The runs' summaries side by side: one row per (dotted) metric, one text column per run."""
    def text(v) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    return pd.DataFrame({label: {k: text(v) for k, v in flat.items()}
                         for label, flat in flat_summaries(runs).items()})


def prefix_frame(runs) -> pd.DataFrame:
    """Cumulative prefix-cache hit rate of each run over time (one column per run label).

    The timeseries counters are cumulative tokens, so hit rate so far = hits / queried.
    """
    frames = []
    for i, run in enumerate(runs):
        ts = run.timeseries
        rate = ts["prefix_hit_tokens"] / ts["prefix_query_tokens"].where(
            ts["prefix_query_tokens"] > 0)
        frames.append(pd.DataFrame({"time_s": ts["time_s"], run_label(i, run): rate})
                      .set_index("time_s"))
    return pd.concat(frames, axis=1).sort_index().reset_index()


def pool_figure(run: Run, frame: int, block_size: int):
    """The pool heatmap of one run at one frame, titled with its allocator and the time.

    Both pools are drawn at the paged block granularity (a contiguous snapshot has one cell per
    token); past the run's end the figure says so (the faster side shows its final pool).
    """
    frame = min(frame, len(run.snapshots) - 1)
    t_s = float(run.frame_times_s[frame])
    done = " (all requests done)" if t_s > run.end_s else ""
    title = f"{side_label(run)} · t = {fmt_duration(t_s)}{done}"
    return pool_heatmap(run.snapshots[frame], title=title, height=430, tile_tokens=block_size)


def rejected_warning(i: int, run: Run, max_model_len: int) -> str | None:
    """The warning for a run that rejected requests (None when it rejected none), with each
    reason and the setting that fixes it: prompts longer than max_model_len (raise it), or
    requests whose KV the whole pool cannot hold (a larger pool, not max_model_len)."""
    rejected = run.summary["requests_rejected"]
    if not rejected:
        return None
    reqs = run.requests
    parts = []
    if len(reqs) and "rejected" in reqs:
        rej = reqs[reqs["rejected"]]
        too_long = int((rej["prompt_tokens"] + 1 > max_model_len).sum())
        too_big = len(rej) - too_long
        if too_long:
            parts.append(f"{too_long} have a prompt longer than max_model_len = {max_model_len} "
                         "(raise max_model_len in the sidebar)")
        if too_big and run.allocator == "max":
            parts.append(f"{too_big} cannot get the max_model_len = {max_model_len} tokens the max "
                         "policy reserves for each, more than the pool holds (enlarge the KV pool "
                         "or lower max_model_len; raising it makes this worse)")
        elif too_big:
            parts.append(f"{too_big} need more KV than the whole pool holds (enlarge the KV pool; "
                         "raising max_model_len does not help)")
    else:
        parts.append(f"prompt longer than max_model_len = {max_model_len}, or more KV than the "
                     "whole pool")
    return (f"{run_label(i, run)}: {rejected} of {run.summary['requests_arrived']} requests "
            f"rejected: {'; '.join(parts)}.")


def tier_rows(run: Run, now: pd.Series) -> list[dict]:
    """What ``viz.tiers.tier_occupancy_figure`` draws at a sample ``now`` of ``run``: the GPU
    pool (held by running requests, cached blocks) and each offload tier (stored chunks, hits so
    far); just the GPU pool without tiers."""
    total = sum(float(now[c]) for c in MEMORY_CLASSES)
    cached = float(now["cached"]) / total if total else 0.0
    rows = [{"tier": "GPU pool", "held": float(now["kv_usage"]), "cached": cached,
             "label": f"{float(now['kv_usage']):.0%} held, {cached:.0%} cached"}]
    for tier in run.summary.get("offload", {}).get("tiers", []):
        name = tier["name"]
        used = int(now[f"{name}_used_chunks"])
        rows.append({"tier": f"{name.upper()} tier", "held": 0.0,
                     "cached": used / tier["num_chunks"],
                     "label": f"{used:,} / {tier['num_chunks']:,} chunks, "
                              f"{int(now[f'{name}_hit_tokens']):,} hit tokens"})
    return rows
