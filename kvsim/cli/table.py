"""The summary table ``kvsim compare`` prints (one column per run), and ``kvsim replay`` without
``--out`` (one column): the figures a user compares first, shares of the pool in %."""
from __future__ import annotations


def _pct(value) -> str | None:
    return None if value is None else f"{100 * value:.1f}%"


# (label, getter, formatter or None) rows of the table; shares of the pool and hit rates in %
ROWS = (
    ("requests finished", lambda s: s["requests_finished"], None),
    ("requests rejected", lambda s: s["requests_rejected"], None),
    ("simulated time (s)", lambda s: s["simulated_duration_s"], None),
    ("mean running", lambda s: s["mean_running"], None),
    ("max running", lambda s: s["max_running"], None),
    ("token states", lambda s: s["memory_breakdown"]["token_states"], _pct),
    ("reservation", lambda s: s["memory_breakdown"]["reservation"], _pct),
    ("internal frag.", lambda s: s["memory_breakdown"]["internal_fragmentation"], _pct),
    ("external frag.", lambda s: s["memory_breakdown"]["external_fragmentation"], _pct),
    ("cached", lambda s: s["memory_breakdown"]["cached"], _pct),
    ("free", lambda s: s["memory_breakdown"]["free"], _pct),
    ("prefix hit rate", lambda s: s["prefix_hit_rate"], _pct),
    ("computed prompt tokens", lambda s: s["computed_prompt_tokens"], None),
    ("preemptions", lambda s: s["num_preemptions"], None),
    ("output tok/s", lambda s: s["output_throughput_tokens_per_s"], None),
    ("TTFT p50 (s)", lambda s: s["ttft_s"]["p50"], None),
    ("TTFT p99 (s)", lambda s: s["ttft_s"]["p99"], None),
    ("TPOT p50 (s)", lambda s: s["tpot_s"]["p50"], None),
    ("E2E p50 (s)", lambda s: s["e2e_s"]["p50"], None),
    ("E2E p99 (s)", lambda s: s["e2e_s"]["p99"], None),
    ("wall clock (s)", lambda s: s["wall_clock_s"], None),
)
# rows added when a run had offload tiers ("-" for the runs without)
OFFLOAD_ROWS = (
    ("CPU hit tokens", lambda s: s["offload"]["hit_tokens"]["cpu"] if "offload" in s else None,
     None),
    ("GPU + CPU hit rate",
     lambda s: s["offload"]["combined_hit_rate"] if "offload" in s else None, _pct),
)


def scheduling(summary: dict) -> str:
    """The scheduling mode a run used: "v1 sync" (vLLM 0.33's Scheduler), "v1 async"
    (AsyncScheduler, two batches in flight) or "v0" (vLLM 0.2-0.5's prompt-only steps)."""
    engine = summary["config"]["engine"]
    if engine.get("scheduler") == "v0":
        return "v0"
    return "v1 async" if engine.get("async_scheduling") else "v1 sync"


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
    return str(value)


def format_table(summaries: dict[str, dict], overloaded: dict[str, bool] | None = None) -> str:
    """Plain-text table: one column per run (shares of the pool in %); a first row with the
    scheduling mode when a run is not synchronous v1; with ``overloaded``, a last row saying
    which runs are (simulator.overload)."""
    names = list(summaries)
    table_rows = ROWS + (OFFLOAD_ROWS if any("offload" in s for s in summaries.values()) else ())
    rows = [(label, [fmt(get(summaries[n])) if fmt else _fmt(get(summaries[n])) for n in names])
            for label, get, fmt in table_rows]
    rows = [(label, [v if v is not None else "-" for v in values]) for label, values in rows]
    modes = [scheduling(summaries[n]) for n in names]
    if any(m != "v1 sync" for m in modes):   # the synchronous tables keep their rows
        rows.insert(0, ("scheduling", modes))
    if overloaded is not None:
        rows.append(("overloaded", ["yes" if overloaded[n] else "no" for n in names]))
    width = max(len(label) for label, _ in rows)
    col_w = [max(len(n), *(len(values[i]) for _, values in rows)) for i, n in enumerate(names)]
    lines = [" " * width + "  " + "  ".join(n.rjust(w) for n, w in zip(names, col_w))]
    for label, values in rows:
        lines.append(label.ljust(width) + "  " + "  ".join(v.rjust(w) for v, w in zip(values, col_w)))
    return "\n".join(lines)
