"""Where the dashboard's requests come from: a built-in spec, a file under ../shared/traces, or
an upload (kept on disk under its digest so that cached loaders can reopen it).

Uploads are parsed by the trace loaders only: never executed or unpickled.
"""
from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvsim import workloads
from kvsim.errors import InputError
from kvsim.simulator.footprint import WorkloadSize, check_requests_in_memory

# the checkout's ../shared/traces (absent in CI and beside an installed wheel: the source is hidden)
SHARED_TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
TRACE_SUFFIXES = (".csv", ".jsonl", ".json", ".txt")  # each also gzip-compressed (.csv.gz, ...)
MAX_UPLOAD_MB = 20  # also Streamlit's server.maxUploadSize (launch.STREAMLIT_OPTIONS)
MAX_DASHBOARD_REQUESTS = 1_000_000  # the sidebar's field; memory is checked (simulator.footprint)
UPLOADS = Path(tempfile.gettempdir()) / "kvsim-uploads"


def shared_trace_files(root: Path | None = None) -> list[str]:
    """Trace files under ``root`` (default SHARED_TRACES; relative names, sorted), empty when
    the folder is absent."""
    root = SHARED_TRACES if root is None else root
    if not root.is_dir():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and trace_suffix(p.name) in TRACE_SUFFIXES)


def trace_suffix(name: str) -> str:
    """A trace's own suffix, under a .gz (``trace.csv.gz`` -> ``.csv``)."""
    path = Path(name.lower())
    return path.with_suffix("").suffix if path.suffix == ".gz" else path.suffix


@dataclass(frozen=True)
class Workload:
    """Where requests come from: ``kind`` "builtin" (spec string), "shared" (file under
    ../shared/traces) or "upload" (path of a stored upload, see store_upload)."""
    kind: str
    ref: str
    max_requests: int | None = 200  # None: every request
    rate: float = 2.0  # arrivals/s for traces without timestamps (ShareGPT lengths, plain CSV)


def workload_source(workload: Workload) -> str:
    """What workloads.load (and the planner's sweeps) read for this workload."""
    return str(SHARED_TRACES / workload.ref) if workload.kind == "shared" else workload.ref


def store_upload(name: str, data: bytes, max_requests: int | None = 200, rate: float = 2.0,
                 store: Path = UPLOADS) -> Workload:
    """Keep an uploaded trace on disk under its digest; the Workload that reads it.

    Raises:
        InputError naming the file: unsupported suffix, over MAX_UPLOAD_MB, empty.
    """
    suffix = trace_suffix(name)
    if suffix not in TRACE_SUFFIXES:
        raise InputError(f"unsupported file type {''.join(Path(name).suffixes) or '(none)'}; use "
                         f"{', '.join(TRACE_SUFFIXES)}, each plain or .gz", file=name)
    if len(data) > MAX_UPLOAD_MB * 2**20:
        raise InputError(f"{len(data) / 2**20:.1f} MB is over the {MAX_UPLOAD_MB} MB upload "
                         "limit", file=name)
    if not data.strip():
        raise InputError("the file is empty", file=name)
    digest = hashlib.sha256(data).hexdigest()[:16]
    # keep the user's file name (loaders name it in their errors) inside a per-digest folder
    path = store / digest / Path(name).name
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_bytes(data)
    return Workload("upload", str(path), max_requests, rate)


def user_message(err: Exception, workload: Workload) -> str:
    """The error for the user: an upload is named by its file name, not its storage path."""
    text = str(err)
    if workload.kind == "upload":
        text = text.replace(str(Path(workload.ref).parent) + "/", "")
    return text


def needs_rate(workload: Workload) -> bool:
    """Whether the trace has no timestamps, so arrivals are generated at ``workload.rate``."""
    try:
        next(iter(workloads.load(workload_source(workload), max_requests=1)), None)
    except InputError as err:
        if err.field == "rate":
            return True
        raise
    return False


def num_requests(workload: Workload) -> int | None:
    """How many requests the workload gives (None when a spec is bounded by time only)."""
    return workloads.count_requests(workload_source(workload), max_requests=workload.max_requests)


def requests_note(workload: Workload) -> str | None:
    """A note when the workload has fewer requests than the sidebar asks (a spec's n=, a short
    trace), so that the number replayed is never a surprise; None otherwise."""
    try:
        n = num_requests(workload)
    except InputError:
        return None   # load_requests reports a bad source
    if n is None:
        return None
    if workload.max_requests is None:
        return f"{n:,} requests (all of them)"
    if n < workload.max_requests:
        what = "the spec's n=" if workload.kind == "builtin" else "the trace has only "
        return f"{n:,} requests: {what}{n:,} caps the {workload.max_requests:,} asked"
    return None


def load_requests(workload: Workload) -> list:
    """The workload's requests (at most ``max_requests``); raises the loader's InputError, or
    InputError when so many requests would not fit in memory (simulator.footprint)."""
    check_requests_in_memory(WorkloadSize(num_requests=num_requests(workload)))
    rate = workload.rate if needs_rate(workload) else None
    return list(workloads.load(workload_source(workload), max_requests=workload.max_requests,
                               rate=rate))
