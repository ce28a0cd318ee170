"""Recording: per-request rows, sampled time series, per-step rows (oracle names), integrals.

Everything is kept in compact typed columns (``array``), so memory grows with what is recorded
(about 120 bytes per finished request, one row per sample), never with the trace's tokens.
"""
from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

from kvsim.allocator import MEMORY_CLASSES

NS_PER_S = 1_000_000_000

# per-request columns: (name, array typecode)
REQUEST_COLUMNS = (
    ("request_id", "q"), ("replica", "i"), ("arrival_s", "d"), ("first_sched_s", "d"),
    ("first_token_s", "d"), ("finish_s", "d"), ("ttft_s", "d"), ("tpot_s", "d"), ("e2e_s", "d"),
    ("prompt_tokens", "q"), ("output_tokens", "q"), ("num_output", "q"), ("num_samples", "i"),
    ("num_preemptions", "i"), ("cached_tokens_first", "q"), ("cached_tokens_total", "q"),
    ("arrival_step", "q"), ("first_sched_step", "q"), ("first_token_step", "q"),
    ("finish_step", "q"), ("rejected", "b"),
)

# oracle steps.csv columns (../shared/tools/vllm_oracle/README.md), then ours
STEP_COLUMNS = (
    "step", "arrived", "sched_reqs", "sched_tokens", "prefill_tokens", "decode_reqs", "new_reqs",
    "resumed_reqs", "running", "waiting", "kv_usage", "kv_used_blocks", "preempted",
    "cum_preemptions", "pc_queries", "pc_hits", "cum_pc_queries", "cum_pc_hits",
    "pc_preempted_queries", "pc_preempted_hits", "finished", "cum_finished", "running_end",
    "waiting_end", "kv_usage_end", "replica", "time_s",
)

SAMPLE_COLUMNS = (
    ("time_s", "d"), ("replica", "i"), ("running", "q"), ("waiting", "q"),
    ("batch_tokens", "q"), ("num_preemptions", "q"), ("prefix_query_tokens", "q"),
    ("prefix_hit_tokens", "q"), ("finished", "q"), ("kv_usage", "d"),
    ("blocks_saved_by_sharing", "q"),
) + tuple((name, "q") for name in MEMORY_CLASSES)


class RequestLog:
    """One row per request, appended when it finishes (or is rejected).

    Args:
        keep_rows: keep every column (the per-request table). False keeps only what the
            summary needs: latencies (24 bytes per finished request) and running totals.
    """

    def __init__(self, keep_rows: bool = True):
        self.keep_rows = keep_rows
        names = REQUEST_COLUMNS if keep_rows else tuple(
            (n, c) for n, c in REQUEST_COLUMNS if n in ("ttft_s", "tpot_s", "e2e_s"))
        self.cols = {name: array(code) for name, code in names}
        self.num_rows = 0
        self.num_finished = 0
        self.num_prompt_tokens = 0        # of finished requests
        self.num_preempted_requests = 0   # finished requests preempted at least once

    def add(self, **row) -> None:
        """A row with every REQUEST_COLUMNS value."""
        if not self.keep_rows:
            if row["rejected"]:
                self.num_rows += 1
            else:
                self.add_finished(row["ttft_s"], row["tpot_s"], row["e2e_s"],
                                  row["prompt_tokens"], row["num_preemptions"])
            return
        self.num_rows += 1
        if not row["rejected"]:
            self._count(row["prompt_tokens"], row["num_preemptions"])
        for name, col in self.cols.items():
            col.append(row[name])

    def add_finished(self, ttft_s: float, tpot_s: float, e2e_s: float, prompt_tokens: int,
                     num_preemptions: int) -> None:
        """A finished request when rows are not kept: its latencies and the running totals."""
        self.num_rows += 1
        self._count(prompt_tokens, num_preemptions)
        cols = self.cols
        cols["ttft_s"].append(ttft_s)
        cols["tpot_s"].append(tpot_s)
        cols["e2e_s"].append(e2e_s)

    def _count(self, prompt_tokens: int, num_preemptions: int) -> None:
        self.num_finished += 1
        self.num_prompt_tokens += prompt_tokens
        self.num_preempted_requests += num_preemptions > 0

    def __len__(self) -> int:
        return self.num_rows

    def latencies(self, name: str) -> np.ndarray:
        """One latency column of the finished requests (rejected rows carry NaN)."""
        col = self.cols[name]
        return np.frombuffer(col, dtype=col.typecode) if len(col) else np.array([])

    def frame(self) -> pd.DataFrame:
        """The per-request table (empty, with the columns, when rows are not kept)."""
        if not self.keep_rows:
            return pd.DataFrame({name: np.array([], dtype=code) for name, code in REQUEST_COLUMNS})
        df = pd.DataFrame({name: np.frombuffer(col, dtype=col.typecode) if len(col) else
                           np.array([], dtype=col.typecode) for name, col in self.cols.items()})
        df["rejected"] = df["rejected"].astype(bool)
        return df.sort_values("request_id", kind="stable").reset_index(drop=True)


class TableLog:
    """Rows of fixed columns kept as typed arrays (samples) or lists (steps)."""

    def __init__(self, columns):
        self.columns = columns
        self.cols = {name: array(code) for name, code in columns}

    def add(self, values) -> None:
        for (name, _), v in zip(self.columns, values):
            self.cols[name].append(v)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({name: np.frombuffer(col, dtype=col.typecode) if len(col) else
                             np.array([], dtype=col.typecode) for name, col in self.cols.items()})


class StepLog:
    """Per-step rows with the oracle's names (step-record mode; small traces)."""

    def __init__(self):
        self.rows: list[tuple] = []
        self.extra_columns: tuple = ()     # hardware in the loop: in_the_loop.IN_THE_LOOP_COLUMNS

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=list(STEP_COLUMNS + self.extra_columns))


def percentiles(values: np.ndarray) -> dict:
    """{"mean", "p50", "p90", "p99", "max"} of the finite values (numpy linear percentiles)."""
    v = values[np.isfinite(values)]
    if v.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"mean": round(float(v.mean()), 9), "p50": round(float(p50), 9),
            "p90": round(float(p90), 9), "p99": round(float(p99), 9),
            "max": round(float(v.max()), 9)}
