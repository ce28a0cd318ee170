"""Is a run overloaded? Two symptoms, read from a Result's summary and time series.

An overloaded server (requests arrive faster than it can serve them, or its pool is too small to
admit them) queues without bound: latencies then measure the queue, which grows with the length
of the trace, not the server, and a comparison of two overloaded runs says little. The symptoms:

* the waiting queue grows through the run: up to its peak, each quarter of the time series waits
  on average at least as many requests as the quarter before, and the last quarter
  ``QUEUE_GROWTH`` times the first and at least ``MIN_QUEUE`` requests;
* the median time to first token is more than ``TTFT_STEPS`` mean step times (a request that
  finds the server free gets its first token within a step or two of prefill). The mean step
  time is the simulated time over the steps, idle time included, so an idle server only makes
  this threshold harder to reach.
"""
from __future__ import annotations

import numpy as np

TTFT_STEPS = 50
QUEUE_GROWTH = 4.0
MIN_QUEUE = 10


def overload_reasons(summary: dict, timeseries=None) -> list[str]:
    """Why the run looks overloaded (empty when it does not).

    Args:
        summary: Result.summary.
        timeseries: Result.timeseries (time samples or step rows; columns ``time_s`` and
            ``waiting``), or None to judge by the summary alone.
    Returns:
        One short sentence per symptom, with its numbers.
    """
    reasons = []
    steps, duration_s = summary.get("num_steps"), summary.get("simulated_duration_s")
    ttft_p50 = (summary.get("ttft_s") or {}).get("p50")
    if steps and duration_s and ttft_p50 is not None:
        step_s = duration_s / steps
        if ttft_p50 > TTFT_STEPS * step_s:
            reasons.append(f"p50 TTFT {ttft_p50:.3g} s = {ttft_p50 / step_s:,.0f} mean steps of "
                           f"{step_s:.3g} s")
    growth = _queue_growth(timeseries)
    if growth is not None:
        reasons.append(f"the waiting queue grows through the run ({growth[0]:.3g} -> {growth[1]:.3g} "
                       "requests, first to last quarter before its peak)")
    return reasons


def _queue_growth(timeseries) -> tuple[float, float] | None:
    if timeseries is None or len(timeseries) < 8 or "waiting" not in timeseries:
        return None
    times = timeseries["time_s"].to_numpy()
    if np.isnan(times).any():   # step rows without times: the step index orders them
        waiting = timeseries["waiting"].to_numpy(dtype=float)
    else:                       # every replica's queue at each time
        waiting = timeseries.groupby("time_s", sort=True)["waiting"].sum().to_numpy(dtype=float)
    peak = int(np.argmax(waiting)) + 1
    if peak < 8:
        return None
    quarters = [float(q.mean()) for q in np.array_split(waiting[:peak], 4)]
    rising = all(a <= b for a, b in zip(quarters, quarters[1:]))
    if rising and quarters[-1] >= max(MIN_QUEUE, QUEUE_GROWTH * quarters[0]):
        return quarters[0], quarters[-1]
    return None


def overload_warning(summary: dict, timeseries=None, label: str = "") -> str | None:
    """The CLI's one-line warning, or None."""
    reasons = overload_reasons(summary, timeseries)
    if not reasons:
        return None
    return (f"{label + ': ' if label else ''}overloaded: {'; '.join(reasons)}. Latencies then "
            "measure the queue, not the server, and comparing overloaded runs says little: lower the "
            "rate (--rate / --rate-scale) or give it more memory or replicas")
