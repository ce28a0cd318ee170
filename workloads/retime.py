"""One meaning of "rate" for every command: re-time a workload to a rate, or scale its own rate.

    load_at_rate("sharegpt:rate=2,n=1000", rate=8)        # 8 requests/s
    load_at_rate("trace.csv", rate_scale=2)               # twice the trace's traffic, same pattern

``rate`` (requests per second) gives the workload that mean rate, whatever the source:

* a synthetic spec: its ``rate=`` is replaced (conversations per second with ``turns=``, as
  ``rate=`` means there);
* a trace without timestamps (ShareGPT length files, a generic CSV without an arrival column):
  Poisson arrivals at ``rate``, seeded by ``seed`` (the first request at 0);
* a trace with timestamps: its arrival times are scaled about the first arrival so that the
  mean rate, requests over the span from the first arrival to the last, is ``rate``. Bursts and
  lulls keep their shape; only the time scale changes.

``rate_scale`` (a factor) multiplies the rate the workload has, its own or ``rate``: a spec's
``rate=`` times the factor; a trace's arrival times divided by it (so a trace keeps its own
arrival pattern; ``rate_scale=2`` is "what if traffic doubles?"). A trace without timestamps has
no rate of its own to scale: it needs ``rate`` too.

The cut by ``max_requests`` comes first (the rate is that of the requests replayed), then the
re-timing, then ``time_window_s`` (a window of the re-timed workload). Everything streams: a
trace re-timed to ``rate`` is read twice (once for its span), never held in memory.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

from kvsim.errors import InputError
from kvsim.workloads.request import Request
from kvsim.workloads.source import cut, is_spec, load
from kvsim.workloads.spec import parse_spec, plain, split_top, to_float


def _check_positive(value: float | None, field: str) -> None:
    if value is not None and not value > 0:
        raise InputError(f"must be > 0, got {value}", field=field)


def has_timestamps(source: str, format: str | None = None) -> bool:
    """Whether a trace file carries its own arrival times (False: it needs a rate).

    Raises:
        InputError: the file cannot be read (missing, empty, unknown format, a bad first line).
    """
    try:
        next(iter(load(source, format=format, max_requests=1)), None)
    except InputError as err:
        if err.field == "rate":  # "this trace has no timestamps: pass a rate"
            return False
        raise
    return True


def spec_with_rate(spec: str, rate: float | None, rate_scale: float | None) -> str:
    """The spec with its ``rate=`` replaced by ``rate`` (or its own) times ``rate_scale``.

    Raises:
        InputError: ``rate_scale`` on a spec without a rate of its own or ``rate``.
    """
    parsed = parse_spec(spec)
    if rate is None and "rate" in parsed.params:
        rate = to_float(parsed, "rate", plain(parsed, "rate"), 0, strict=True)
    if rate_scale is not None:
        if rate is None:  # arrival=replay(PATH): scaled as a trace (load_at_rate)
            return spec
        rate *= rate_scale
    if rate is None:
        return spec
    kind, _, params = spec.partition(":")
    # commas inside parentheses belong to a call: keep every other parameter as written
    kept = [p for p in split_top(params, spec) if p.strip() and p.split("=", 1)[0].strip() != "rate"]
    return f"{kind}:" + ",".join([f"rate={float(rate)!r}", *kept])


def scale_arrivals(requests: Iterator[Request], factor: float, origin_s: float = 0.0
                   ) -> Iterator[Request]:
    """Arrival times divided by ``factor`` about ``origin_s`` (the rate times ``factor``).

    A re-timed request loses its ``arrival_step`` (the step clock then uses the new time).
    """
    if factor == 1.0:
        yield from requests
        return
    for req in requests:
        yield dataclasses.replace(req, arrival_s=origin_s + (req.arrival_s - origin_s) / factor,
                                  arrival_step=None)


def load_at_rate(source: str | os.PathLike, *, rate: float | None = None,
                 rate_scale: float | None = None, format: str | None = None,
                 max_requests: int | None = None, time_window_s: float | None = None,
                 seed: int = 0) -> Iterator[Request]:
    """``workloads.load`` with the one meaning of ``rate`` and ``rate_scale`` (module docstring).

    Args:
        source: a trace file or a synthetic spec.
        rate: requests per second the workload is given (None: its own).
        rate_scale: factor on the rate (None or 1: unchanged).
        format, max_requests, time_window_s, seed: as ``workloads.load``.
    Returns:
        An iterator of Request in arrival order.
    Raises:
        InputError: a rate or factor that is not > 0, ``rate_scale`` alone on a trace without
            timestamps, and every error of ``workloads.load``.
    """
    _check_positive(rate, "rate")
    _check_positive(rate_scale, "rate_scale")
    text = os.fspath(source)
    if rate is None and rate_scale is None:
        return load(text, format=format, max_requests=max_requests, time_window_s=time_window_s,
                    seed=seed)
    if is_spec(text, format):
        spec = spec_with_rate(text, rate, rate_scale)
        requests = load(spec, max_requests=max_requests, seed=seed)
        if spec == text and rate_scale is not None:   # a replayed trace's times: scale them
            requests = scale_arrivals(requests, rate_scale)
        return cut(requests, None, time_window_s)
    if not has_timestamps(text, format):
        if rate is None:
            raise InputError("this trace has no timestamps, so no rate of its own to scale: "
                             "give --rate (requests/s) too", file=text, field="rate_scale")
        requests = load(text, format=format, max_requests=max_requests,
                        rate=rate * (rate_scale or 1.0), seed=seed)
        return cut(requests, None, time_window_s)
    factor = rate_scale or 1.0
    origin_s = 0.0
    if rate is not None:
        num, first_s, last_s = 0, 0.0, 0.0
        for req in load(text, format=format, max_requests=max_requests, seed=seed):
            if num == 0:
                first_s = req.arrival_s
            last_s = req.arrival_s
            num += 1
        if num > 1 and last_s > first_s:
            factor *= rate / (num / (last_s - first_s))
            origin_s = first_s
    requests = load(text, format=format, max_requests=max_requests, seed=seed)
    return cut(scale_arrivals(requests, factor, origin_s), None, time_window_s)
