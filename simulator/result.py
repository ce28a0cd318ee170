"""Result of a simulation: summary (stable keys), time series, per-request table, pool snapshots."""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvsim.errors import InputError

if TYPE_CHECKING:  # pandas is heavy: this module is imported by `kvsim --help`'s path
    import pandas as pd

# Summary keys, in output order. Documented in docs/SIMULATOR.md; stable (add, never rename).
SUMMARY_KEYS = (
    "requests_arrived", "requests_finished", "requests_rejected", "requests_unfinished",
    "simulated_duration_s", "num_steps", "mean_running", "max_running", "mean_waiting",
    "memory_breakdown", "mean_kv_usage", "prefix_hit_rate", "prefix_query_tokens",
    "prefix_hit_tokens", "preempted_prefix_query_tokens", "preempted_prefix_hit_tokens",
    "blocks_saved_by_sharing_mean", "blocks_saved_by_sharing_max", "num_preemptions",
    "preempted_requests", "generated_tokens", "prompt_tokens", "computed_prompt_tokens",
    "output_throughput_tokens_per_s", "total_throughput_tokens_per_s", "request_throughput_per_s",
    "ttft_s", "tpot_s", "e2e_s", "wall_clock_s", "config",
)
# a hybrid model's replay (KV-cache groups) adds, after "memory_breakdown", each group's share
# of the pool by memory class (time-averaged over samples); full-attention summaries lack it
GROUP_SUMMARY_KEY = "kv_cache_groups"


def _json_default(obj):
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def _clean(value):
    """NaN/inf are not JSON: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def json_text(value) -> str:
    """JSON text as kvsim writes summaries: indented, NaN/inf as null, numpy scalars as numbers."""
    return json.dumps(_clean(value), indent=2, default=_json_default) + "\n"


@dataclass
class Result:
    """What ``simulate`` returns.

    summary: dict with the keys of SUMMARY_KEYS (JSON-able; wall_clock_s is the only value that
        changes between identical runs).
    timeseries: one row per sample time and replica (columns in docs/SIMULATOR.md), or in
        step-record mode one row per engine step with the vLLM oracle's column names.
    requests: one row per request (arrival, first token, finish, TTFT, TPOT, E2E, preemptions,
        cached prompt tokens, and the oracle's names for the same quantities).
    snapshots: [(time_s, replica, PoolSnapshot)] at the requested times.
    token_times: the token rows of every step (simulator.token_log.TokenLog.arrays) when the
        simulation recorded them (``record_token_times``), else None.
    """

    summary: dict
    timeseries: pd.DataFrame
    requests: pd.DataFrame
    snapshots: list = field(default_factory=list)
    token_times: dict | None = None

    def summary_json(self, *, include_wall_clock: bool = True) -> str:
        """The summary as JSON text (keys in SUMMARY_KEYS order)."""
        summary = dict(self.summary)
        if not include_wall_clock:
            summary.pop("wall_clock_s", None)
        return json_text(summary)

    def write_json(self, path: str | os.PathLike, *, include_wall_clock: bool = True) -> None:
        with open(path, "w") as f:
            f.write(self.summary_json(include_wall_clock=include_wall_clock))

    def write_timeseries(self, path: str | os.PathLike) -> None:
        """Parquet if the name ends in .parquet, else CSV."""
        _write_table(self.timeseries, path)

    def write_requests(self, path: str | os.PathLike) -> None:
        _write_table(self.requests, path)


def prepare_output(path, suffixes: tuple[str, ...] = ()) -> str:
    """Check an output path before a long run, so that no result is lost at the end.

    Creates missing parent directories; raises InputError (one line, exit 2 from the CLI) if
    the path is a directory, has a suffix outside ``suffixes`` (when given), or cannot be
    written.

    Args:
        path: the file the run will write.
        suffixes: accepted endings, e.g. (".csv", ".parquet"); empty = any.
    Returns:
        ``path`` unchanged.
    """
    if suffixes and not str(path).endswith(suffixes):
        raise InputError(f"{path}: unknown file type (use {' or '.join(suffixes)})")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected a file name")
    _writable_directory(os.path.dirname(os.path.abspath(path)), str(path))
    if os.path.exists(path):
        # opened for appending (which writes nothing): a read-only file fails here, not at the end
        try:
            open(path, "ab").close()
        except OSError as err:
            raise InputError(f"{path}: cannot be written ({err.strerror})") from None
    return path


def prepare_output_dir(path, flag: str = "--out", names: tuple[str, ...] = ()) -> str:
    """Check (and create) an output directory before a long run, as ``prepare_output`` does for
    a file; raises InputError naming ``flag`` if the path is a file or cannot be written, or if
    one of the files ``names`` it will hold cannot be (a directory of that name, a read-only
    file).

    Returns:
        ``path`` unchanged.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"{flag} {path}: exists and is not a directory")
    _writable_directory(os.fspath(path), f"{flag} {path}")
    for name in names:
        prepare_output(os.path.join(path, name))
    return path


def _writable_directory(directory: str, what: str) -> None:
    """Create ``directory`` if missing; InputError about ``what`` if that fails or it is read-only."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:
        raise InputError(f"{what}: cannot create directory {directory} ({err.strerror})") from None
    if not os.access(directory, os.W_OK):
        raise InputError(f"{what}: directory {directory} is not writable")
    # os.access answers yes to root on a read-only file system: create and remove a file
    try:
        fd, probe = tempfile.mkstemp(prefix=".kvsim-write-check-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise InputError(f"{what}: cannot write in directory {directory} ({err.strerror})") from None


def _write_table(df: pd.DataFrame, path) -> None:
    path = os.fspath(path)
    if path.endswith(".parquet"):
        df.to_parquet(path, index=False)
    elif path.endswith(".csv"):
        df.to_csv(path, index=False)
    else:
        raise InputError(f"{path}: unknown table format (use .csv or .parquet)")
