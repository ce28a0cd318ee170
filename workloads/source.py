"""``load``: a trace file or a synthetic spec, streamed as Requests (the one entry point)."""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from itertools import islice

from kvsim.errors import InputError
from kvsim.workloads.loaders import load_file
from kvsim.workloads.request import Request
from kvsim.workloads.synthetic import workload_from_spec

_SPEC_LIKE = re.compile(r"\s*[A-Za-z_][A-Za-z0-9_-]*\s*(:|\Z)")


def is_spec(source: str, format: str | None = None) -> bool:
    """Whether ``source`` is a synthetic spec: no format given, not an existing file, and
    spec-shaped (``name:key=value,...``)."""
    return format is None and not os.path.exists(source) and bool(_SPEC_LIKE.match(source))


def spec_concurrency(source: str | os.PathLike, format: str | None = None) -> int | None:
    """The client's limit on requests in flight that a ``random:`` spec carries
    (``concurrency=``), else None (other sources have none)."""
    from kvsim.workloads.spec import parse_spec

    text = os.fspath(source)
    if not is_spec(text, format) or parse_spec(text).name != "random":
        return None
    return workload_from_spec(text).max_concurrency


def load(spec_or_path: str | os.PathLike, format: str | None = None,
         max_requests: int | None = None, time_window_s: float | None = None,
         rate: float | None = None, seed: int = 0) -> Iterator[Request]:
    """Requests of a trace file or a synthetic spec, in arrival order.

    Args:
        spec_or_path: an existing file (any format of ``workloads.loaders``) or a spec such as
            ``sharegpt:rate=2,n=1000,seed=0`` (grammar in ``workloads.synthetic``).
        format: the file's format (``mooncake``, ``azure``, ``sharegpt``, ``vllm-oracle``,
            ``generic[:mapping]``); None sniffs it. Given, ``spec_or_path`` is a file.
        max_requests: stop after this many requests.
        time_window_s: keep requests arriving in ``[0, time_window_s)``.
        rate: arrivals per second where the source has none (a spec without ``rate=``, a
            ShareGPT length file); an error for a trace with timestamps.
        seed: seed for generated arrivals/lengths (a spec's ``seed=`` wins).
    Returns:
        An iterator of Request. Spec and file-level errors raise here; a bad line raises
        InputError when the iteration reaches it.
    """
    if max_requests is not None and (isinstance(max_requests, bool) or
                                     not isinstance(max_requests, int) or max_requests < 1):
        raise InputError(f"max_requests must be an integer >= 1, got {max_requests!r}",
                         field="max_requests")
    if time_window_s is not None and not time_window_s > 0:
        raise InputError(f"time_window_s must be > 0, got {time_window_s!r}",
                         field="time_window_s")
    text = os.fspath(spec_or_path)
    if not text.strip():
        raise InputError("empty workload: give a trace file or a synthetic spec such as "
                         "'sharegpt:rate=2,n=1000,seed=0'", field="workload")
    if not is_spec(text, format):
        requests: Iterator[Request] = load_file(text, format, rate=rate, seed=seed)
    else:
        requests = iter(workload_from_spec(text, rate=rate, seed=seed))
    return cut(requests, max_requests, time_window_s)


def cut(requests: Iterator[Request], max_requests: int | None,
         time_window_s: float | None) -> Iterator[Request]:
    # islice stops before pulling request max_requests+1, so lines past the cut are not read
    for req in islice(requests, max_requests):
        if time_window_s is not None and req.arrival_s >= time_window_s:
            return  # arrivals are sorted: nothing later is inside the window
        yield req
