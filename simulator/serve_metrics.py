"""vllm bench serve's metrics of a simulated run, under its names and by its formulas.

Every figure is computed as ``vllm bench serve`` computes it from its client's records
(``vllm/benchmarks/serve.py``, ``calculate_metrics`` and ``benchmark``), with kvsim's records in
their place:

=======================  ==========================================================================
vllm bench serve         kvsim
=======================  ==========================================================================
start_time               the request's send time (``arrival_s``: after any client-side queueing)
start_time + latency     ``finish_s`` (exact: a request sent as another finishes starts then)
ttft, latency            ``ttft_s``, ``e2e_s`` (from the send to the first / last token)
output_len, prompt_len   ``num_output``, ``prompt_tokens``
itl (per token gap)      the token rows of each step (``simulator.token_log``)
success                  not ``rejected``
client_queue_time        ``client_queue_s``
duration                 from the workload's start (0) to the last request's end
=======================  ==========================================================================

* ``request_throughput`` = completed / duration; ``output_throughput`` = total output tokens /
  duration; ``total_token_throughput`` = (input + output tokens) / duration.
* TPOT per request = (latency - ttft) / (output_len - 1), over requests with output_len > 1;
  for goodput a request of one token has TPOT 0.
* ``request_goodput`` = requests meeting every given SLO (``ttft``, ``tpot``, ``e2el`` in ms,
  each ``<=``) / duration; None without SLOs.
* ITL: every gap between two consecutive tokens of one request, over all requests.
* mean, median, std (population), and ``p{P}`` by numpy's default (linear) percentile, in ms;
  an empty list counts as [0], as vllm bench serve's ``np.mean(x or 0)`` does.
* ``max_output_tokens_per_s``: tokens per whole second from the first send, the largest;
  ``max_concurrent_requests``: the most requests in flight at once over [start, start+latency).
* With a concurrency limit, ``client_queue_time`` statistics; with a finite rate as well,
  ``e2el_including_client_queue``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

SLO_METRICS = ("ttft", "tpot", "e2el")
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILES = (90.0, 99.0)


def percentile_key(p: float) -> str:
    """``p99``, ``p99.9``: vllm bench serve's name for percentile ``p``."""
    return f"p{int(p)}" if int(p) == p else f"p{p}"


def _stats(name: str, values_s: Sequence[float], percentiles: Iterable[float]) -> dict:
    """mean / median / std / p{P} of ``values_s`` (seconds) in ms, as vllm bench serve."""
    v = np.asarray(values_s, dtype=float) if len(values_s) else np.zeros(1)
    out = {f"mean_{name}_ms": float(np.mean(v)) * 1000, f"median_{name}_ms": float(np.median(v)) * 1000,
           f"std_{name}_ms": float(np.std(v)) * 1000}
    for p in percentiles:
        out[f"{percentile_key(p)}_{name}_ms"] = float(np.percentile(v, p)) * 1000
    return out


def weighted_percentile(values: np.ndarray, weights: np.ndarray, p: float) -> float:
    """numpy's default (linear) percentile of the list holding each value ``weight`` times,
    without building it."""
    order = np.argsort(values, kind="stable")
    v, cum = values[order], np.cumsum(weights[order])
    h = (cum[-1] - 1) * p / 100.0
    lo, hi = math.floor(h), math.ceil(h)
    x_lo = v[np.searchsorted(cum, lo, side="right")]
    x_hi = v[np.searchsorted(cum, hi, side="right")]
    g = h - lo
    return float(x_lo + g * (x_hi - x_lo))


def _weighted_stats(name: str, values_s: np.ndarray, weights: np.ndarray, percentiles: Iterable[float]) -> dict:
    """``_stats`` of the list holding each value ``weight`` times."""
    keep = weights > 0
    values_s, weights = values_s[keep], weights[keep]
    if not len(values_s):
        return _stats(name, [], percentiles)
    total = weights.sum()
    mean = float((values_s * weights).sum() / total)
    std = math.sqrt(float((weights * (values_s - mean) ** 2).sum() / total))
    out = {f"mean_{name}_ms": mean * 1000, f"median_{name}_ms": weighted_percentile(values_s, weights, 50) * 1000,
           f"std_{name}_ms": std * 1000}
    for p in percentiles:
        out[f"{percentile_key(p)}_{name}_ms"] = weighted_percentile(values_s, weights, p) * 1000
    return out


def serve_metrics(requests, token_times: dict | None, *, percentiles: Iterable[float] = DEFAULT_PERCENTILES,
                  goodput: dict[str, float] | None = None, max_concurrency: int | None = None,
                  request_rate: float = math.inf) -> dict:
    """vllm bench serve's result keys for a run.

    Args:
        requests: ``Result.requests`` (the per-request table).
        token_times: ``Result.token_times`` (None: no ITL and peak-throughput figures).
        percentiles: the ``p{P}`` to report (``--metric-percentiles``).
        goodput: SLOs in ms by name (``ttft``, ``tpot``, ``e2el``), or None.
        max_concurrency: the client's limit (client-side queueing is reported with one).
        request_rate: the configured rate (inf: all at once; NaN: a trace's own times, finite).
    Returns:
        A dict under vllm bench serve's result-JSON names (module docstring).
    """
    percentiles = [float(p) for p in percentiles]
    rejected = requests["rejected"].astype(bool)
    ok = requests[~rejected]
    completed = len(ok)
    # the recorded finish, not start + latency: a request sent as another finishes starts at
    # exactly that instant, which float sums can move by an ulp
    finishes = ok["finish_s"].to_numpy(dtype=float)
    ends = list(finishes) + list(requests.loc[rejected, "arrival_s"])
    duration = max(ends, default=0.0)
    out_lens = ok["num_output"].to_numpy()
    total_input = int(ok["prompt_tokens"].sum())
    total_output = int(out_lens.sum())
    ttfts = ok["ttft_s"].to_numpy(dtype=float)
    e2els = ok["e2e_s"].to_numpy(dtype=float)
    all_tpots = np.where(out_lens > 1, (e2els - ttfts) / np.maximum(out_lens - 1, 1), 0.0)
    tpots = all_tpots[out_lens > 1]
    good = None
    if goodput:
        meets = np.ones(completed, dtype=bool)
        for name, slo_ms in goodput.items():
            got = {"ttft": ttfts, "tpot": all_tpots, "e2el": e2els}[name]
            meets &= got <= slo_ms / 1000.0
        good = int(meets.sum())

    def per_s(x):
        return x / duration if duration > 0 else math.inf if x else 0.0

    result = {
        "duration": duration, "completed": completed, "failed": len(requests) - completed,
        "total_input_tokens": total_input, "total_output_tokens": total_output,
        "request_throughput": per_s(completed),
        "request_goodput": per_s(good) if good is not None else None,
        "output_throughput": per_s(total_output),
        "total_token_throughput": per_s(total_input + total_output),
    }
    starts = ok["arrival_s"].to_numpy(dtype=float)
    result["max_concurrent_requests"] = _peak_concurrency(starts, finishes)
    result["max_output_tokens_per_s"] = _peak_tokens_per_s(token_times, starts, finishes)
    result.update(_stats("ttft", ttfts, percentiles))
    result.update(_stats("tpot", tpots, percentiles))
    if token_times is not None:
        result.update(_weighted_stats("itl", token_times["duration_ns"] / 1e9,
                                      token_times["num_gap_tokens"], percentiles))
    result.update(_stats("e2el", e2els, percentiles))
    if max_concurrency is not None:
        queue = ok["client_queue_s"].to_numpy(dtype=float)
        result.update(_stats("client_queue_time", queue, percentiles))
        if not math.isinf(request_rate):
            result.update(_stats("e2el_including_client_queue", e2els + queue, percentiles))
    result.update({"input_lens": [int(x) for x in requests["prompt_tokens"]],
                   # a failed request's are 0, as vllm bench serve's RequestFuncOutput defaults
                   "output_lens": [0 if r else int(x) for x, r in zip(requests["num_output"], rejected)],
                   "ttfts": [0.0 if r else float(x) for x, r in zip(requests["ttft_s"], rejected)],
                   "latencies": [0.0 if r else float(x) for x, r in zip(requests["e2e_s"], rejected)],
                   "start_times": [float(x) for x in requests["arrival_s"]],
                   "queue_times": [float(x) for x in requests["client_queue_s"]],
                   "errors": ["rejected: can never fit" if r else "" for r in rejected]})
    return result


def _peak_concurrency(starts: np.ndarray, ends: np.ndarray) -> int:
    """Most intervals [start, end) open at once (an end before a start at the same instant)."""
    events = sorted([(float(t), 1) for t in starts] + [(float(t), -1) for t in ends], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def _peak_tokens_per_s(token_times: dict | None, starts: np.ndarray, finishes: np.ndarray) -> float:
    """The most output tokens in one whole second counted from the first send (vllm bench
    serve's buckets: ``int(token_time - min_start)`` over ``ceil(max_end - min_start) + 1``)."""
    if token_times is None or not len(starts):
        return 0.0
    first = float(starts.min())
    num = int(math.ceil(float(finishes.max()) - first)) + 1
    bucket = np.floor(token_times["end_ns"] / 1e9 - first).astype(np.int64)
    inside = (bucket >= 0) & (bucket < num)
    counts = np.bincount(bucket[inside], weights=token_times["num_tokens"][inside], minlength=num)
    return float(counts.max()) if len(counts) else 0.0


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` (vllm bench serve's ``--goodput KEY:MS ...``) as a dict;
    ValueError with one line on a bad pair, an unknown name or a negative value."""
    out = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f"--goodput: {item!r} is not KEY:MS (KEY one of {', '.join(SLO_METRICS)})")
        if name not in SLO_METRICS:
            raise ValueError(f"--goodput: unknown metric {name!r}; expected one of {', '.join(SLO_METRICS)}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--goodput: {name}: not a number: {value!r}") from None
        if not (ms >= 0 and math.isfinite(ms)):
            raise ValueError(f"--goodput: {name}: must be a finite number of ms >= 0, got {value}")
        out[name] = ms
    return out


def parse_percentiles(text: str) -> list[float]:
    """``"50,90,99"`` (``--metric-percentiles``) as floats in (0, 100]; ValueError with one line."""
    out = []
    for part in filter(None, (x.strip() for x in text.split(","))):
        try:
            p = float(part)
        except ValueError:
            raise ValueError(f"--metric-percentiles: not a number: {part!r}") from None
        if not 0 < p <= 100:
            raise ValueError(f"--metric-percentiles: {part} is outside (0, 100]")
        out.append(p)
    if not out:
        raise ValueError("--metric-percentiles: give at least one percentile, such as 99")
    return out
