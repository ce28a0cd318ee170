"""Workloads: the Request record, trace loaders, synthetic generators, validation.

``load(spec_or_path)`` is the one entry point: a trace file (format sniffed from its content,
``workloads.loaders``) or a synthetic spec string (``workloads.synthetic``), streamed as an
iterator of ``Request`` in arrival order. ``load_at_rate`` adds the one meaning of ``rate`` and
``rate_scale`` that every command uses (``workloads.retime``). Bad input raises ``InputError`` (a ValueError)
naming file, line and field.
"""
from __future__ import annotations

import os

from kvsim.errors import InputError
from kvsim.workloads.loaders import FORMATS, load_file, sniff_format
from kvsim.workloads.reading import check_text_file, first_data_line, iter_lines
from kvsim.workloads.request import Request
from kvsim.workloads.retime import load_at_rate
from kvsim.workloads.source import is_spec, load
from kvsim.workloads.synthetic import SOURCES, SyntheticWorkload, workload_from_spec

__all__ = ["DEFAULT_WORKLOAD", "FORMATS", "InputError", "Request", "SOURCES",
           "SyntheticWorkload", "count_requests", "load", "load_at_rate", "load_file", "sniff_format",
           "workload_from_spec", "workload_size"]

# `make run`'s workload: ShareGPT-like lengths, half the conversations behind a shared 256-token
# system prompt, 1-4 turns each, so prefix sharing shows in the pool within seconds
DEFAULT_WORKLOAD = ("sharegpt:rate=1,n=300,seed=0,system=256,system_frac=0.5,"
                    "turns=uniform(1,4),think_s=20")

def workload_size(spec_or_path: str | os.PathLike, format: str | None = None,
                  max_requests: int | None = None) -> dict:
    """What is known of a workload's size before it is generated (for memory checks).

    Returns:
        ``{"num_requests", "duration_s", "max_fanout"}``: for a spec, its n= (or rate x
        duration_s x mean turns), the span of its arrivals (duration_s, or about n / rate) and
        its samples / beam width; for a file, only ``max_requests`` (a file's size is what it
        is: it is already on disk). Unknown values are None (fan-out 1).
    """
    text = os.fspath(spec_or_path)
    out = {"num_requests": max_requests, "duration_s": None, "max_fanout": 1}
    if not is_spec(text, format):
        return out
    w = workload_from_spec(text)
    turns = 1.0 if w.turns is None else _mean_tokens(w.turns)
    rate = getattr(w.arrival, "rate", None)
    n = w.num_requests
    if w.duration_s is not None and rate is not None:
        expected = int(rate * w.duration_s * turns) + 1
        n = expected if n is None else min(n, expected)
    if max_requests is not None:
        n = max_requests if n is None else min(n, max_requests)
    duration = w.duration_s
    if duration is None and n is not None and rate is not None:
        duration = n / (rate * turns) + (turns - 1) * w.think_s
    out.update(num_requests=n, duration_s=duration, max_fanout=max(w.samples, w.beam_width))
    return out


def _mean_tokens(dist) -> float:
    """Mean of a synthetic length distribution (turns per conversation)."""
    if hasattr(dist, "tokens"):
        return float(dist.tokens)
    if hasattr(dist, "low"):
        return (dist.low + dist.high) / 2
    return float(dist.mean)


def count_requests(spec_or_path: str | os.PathLike, format: str | None = None,
                   max_requests: int | None = None) -> int | None:
    """How many requests ``load`` will yield, when that is cheap to know (for a progress bar's
    total and ETA): a spec's ``n=``, a file's data lines (a header line is not a request), at
    most ``max_requests``; None when unknown (a spec bounded by ``duration_s=``, an unreadable
    source: ``load`` reports those).
    """
    text = os.fspath(spec_or_path)
    count = None
    try:
        if is_spec(text, format):
            count = workload_from_spec(text).num_requests
        else:
            fmt = (format or sniff_format(check_text_file(text))).split(":", 1)[0]
            count = sum(1 for _, line in iter_lines(text) if line.strip())
            if not (fmt == "mooncake" or first_data_line(text)[1].lstrip().startswith("{")):
                count -= 1   # the CSV header
    except InputError:
        return max_requests
    if max_requests is not None:
        count = max_requests if count is None else min(count, max_requests)
    return count


