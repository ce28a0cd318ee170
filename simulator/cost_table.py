"""Measured cost tables: step times of a real GPU, with provenance, and the model fitted to them.

``kvsim profile`` writes a table (CSV; ``#`` lines first carry the provenance: GPU, date,
versions, model, executor settings, command)::

    # gpu: NVIDIA H200
    # ...
    kind,num_seqs,num_prefill_seqs,num_prefill_tokens,num_decode_tokens,num_scheduled_tokens,
    kv_read_tokens,attn_token_pairs,padded_num_seqs,graph,step_s,step_s_min,step_s_max,repeats

(the StepBatch fields of each measured step, under the simulator's names). ``StepShapeCost``
fits it the way the executor spends time:

* **decode-only steps** replay a CUDA graph captured at a padded batch size, so the time is a
  step function of the batch plus the KV read: per measured graph size ``s``,
  ``t = a_s + b_s * kv_read_tokens`` (least squares over that size's rows, leaving out the rows of
  one long context among short ones, whose longest context a StepBatch does not carry); a batch of ``n``
  sequences is priced at the smallest measured size >= n (the size it pads to when the table
  measured every capture size, as the default grid does).
* **other steps** (and decode batches above the largest graph) run eagerly:
  ``t = f(num_scheduled_tokens) + c_pairs * attn_token_pairs + c_kv * kv_read_tokens
  + c_seq * num_seqs``, ``f`` piecewise linear between the measured token counts (linear beyond
  them), all fitted at once by least squares in relative error (each row weighted by 1/t, since
  errors are judged relative) with the coefficients kept >= 0.

``load_cost_table(path)`` returns this model for a profile table and the plain ``TableCost`` for
the older ``num_scheduled_tokens,step_s[,kv_read_tokens]`` tables. Bad content raises InputError
naming file, line and column.
"""
from __future__ import annotations

import bisect
import csv
import math
from pathlib import Path

import numpy as np

from kvsim.errors import InputError
from kvsim.simulator.cost import StepBatch, TableCost

SHAPE_COLUMNS = ("kind", "num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_scheduled_tokens",
                 "kv_read_tokens", "attn_token_pairs", "padded_num_seqs", "graph", "step_s")
KINDS = ("decode", "mixed")


def read_table(path: str | Path) -> tuple[dict[str, str], list[str], list[tuple[int, dict[str, str]]]]:
    """The provenance (``# key: value`` lines before the header), the header and the data rows
    with their line numbers. Raises InputError on an unreadable file or a missing header."""
    path = str(path)
    provenance: dict[str, str] = {}
    try:
        with open(path, newline="") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError as err:
        raise InputError(f"not UTF-8 text ({err.reason})", file=path) from None
    except OSError as err:
        raise InputError(f"cannot read the cost table: {err.strerror}", file=path) from None
    first = 0
    while first < len(lines) and lines[first].startswith("#"):
        key, _, value = lines[first][1:].partition(":")
        if key.strip():
            provenance[key.strip()] = value.strip()
        first += 1
    if first >= len(lines) or not lines[first].strip():
        raise InputError("no header line", file=path, line=first + 1)
    reader = csv.reader(lines[first:])
    header = [h.strip() for h in next(reader)]
    rows = []
    for offset, values in enumerate(reader, start=1):
        if not values or not any(v.strip() for v in values):
            continue
        line = first + 1 + offset
        if len(values) != len(header):
            raise InputError(f"{len(values)} values for {len(header)} columns", file=path, line=line)
        rows.append((line, dict(zip(header, (v.strip() for v in values)))))
    if not rows:
        raise InputError("no data rows", file=path, line=first + 2)
    return provenance, header, rows


def load_cost_table(path: str | Path):
    """The cost model of a measured table: ``StepShapeCost`` for a ``kvsim profile`` table
    (it has the ``kind`` column), else ``TableCost``."""
    _, header, _ = read_table(path)
    return StepShapeCost(path) if "kind" in header else TableCost(str(path))


def _number(row: dict, name: str, path: str, line: int, *, positive=False) -> float:
    raw = row.get(name, "")
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"not a number: {raw!r}", file=path, line=line, field=name) from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise InputError(f"must be {'positive' if positive else '>= 0'} and finite, got {raw}", file=path,
                         line=line, field=name)
    return value


def _skewed(row: dict, v: dict, path: str, line: int) -> bool:
    """A decode row whose longest context is over twice the mean (the grid's skewed batches):
    the StepBatch has no longest context, so the decode lines are fitted without such rows."""
    if not row.get("max_context_tokens"):
        return False
    longest = _number(row, "max_context_tokens", path, line)
    return longest > 2 * v["kv_read_tokens"] / v["num_seqs"]


def _nonneg_lstsq(a: np.ndarray, y: np.ndarray, free: int) -> np.ndarray:
    """Least squares with the last columns (all but the first ``free``) kept >= 0: columns whose
    coefficient comes out negative are dropped and the fit is redone (an active set, enough for the
    few physically non-negative terms here)."""
    keep = list(range(a.shape[1]))
    while True:
        coef = np.zeros(a.shape[1])
        sol, *_ = np.linalg.lstsq(a[:, keep], y, rcond=None)
        coef[keep] = sol
        neg = [j for j in keep if j >= free and coef[j] < 0]
        if not neg:
            return coef
        keep.remove(min(neg, key=lambda j: coef[j]))


class StepShapeCost:
    """Step times fitted to a ``kvsim profile`` table (module docstring).

    Attributes:
        provenance: the table's ``#`` header (GPU, date, versions, model, command).
        graph_sizes: measured CUDA-graph batch sizes; ``decode_lines[i]`` = (a_s, b_s) of size i.
        knots_tokens, knots_s: f of the eager model; coef: c_pairs, c_kv, c_seq.
    """

    def __init__(self, path: str | Path):
        self.path = path = str(path)
        self.provenance, header, rows = read_table(path)
        for name in SHAPE_COLUMNS:
            if name not in header:
                raise InputError(f"missing column (have: {', '.join(header)})", file=path, line=len(self.provenance) + 1,
                                 field=name)
        decode: dict[int, list[tuple[float, float]]] = {}
        eager = []
        for line, row in rows:
            kind = row["kind"]
            if kind not in KINDS:
                raise InputError(f"must be one of {', '.join(KINDS)}, got {kind!r}", file=path, line=line,
                                 field="kind")
            v = {name: _number(row, name, path, line, positive=name == "step_s")
                 for name in SHAPE_COLUMNS if name != "kind"}
            if v["num_scheduled_tokens"] == 0 or v["num_seqs"] == 0:
                raise InputError("a measured step schedules at least one token of one sequence", file=path,
                                 line=line, field="num_scheduled_tokens")
            if kind == "decode" and v["graph"]:
                if _skewed(row, v, path, line):
                    continue   # one long context among short ones: not what a (size, kv) line prices
                decode.setdefault(int(v["padded_num_seqs"]), []).append((v["kv_read_tokens"], v["step_s"]))
            else:
                eager.append(v)
        self.graph_sizes = sorted(decode)
        self.decode_lines = [self._line(decode[s]) for s in self.graph_sizes]
        self._fit_eager(eager, path)

    @staticmethod
    def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
        """(a, b) of t = a + b * kv by least squares in relative error, b >= 0."""
        kv = np.array([p[0] for p in points])
        t = np.array([p[1] for p in points])
        if len(points) == 1 or np.ptp(kv) == 0:
            return float(t.mean()), 0.0
        w = 1.0 / t
        a, b = _nonneg_lstsq(np.stack([w, kv * w], axis=1), np.ones_like(t), free=1)
        return float(a), float(b)

    def _fit_eager(self, rows: list[dict], path: str) -> None:
        if not rows:
            raise InputError("no mixed (eager) rows: the table cannot price prefill steps", file=path)
        tokens = np.array([r["num_scheduled_tokens"] for r in rows])
        t = np.array([r["step_s"] for r in rows])
        self.knots_tokens = np.unique(tokens)
        k = len(self.knots_tokens)
        # f's values at the knots are unknowns; every row's token count is a knot, so the hat basis
        # of linear interpolation is the indicator of its knot
        basis = (tokens[:, None] == self.knots_tokens[None, :]).astype(float)
        extra = np.array([[r["attn_token_pairs"], r["kv_read_tokens"], r["num_seqs"]] for r in rows])
        scale = np.maximum(extra.max(axis=0), 1.0)      # conditioning: columns of order 1
        w = (1.0 / t)[:, None]
        coef = _nonneg_lstsq(np.hstack([basis, extra / scale]) * w, np.ones_like(t), free=k)
        self.knots_s = coef[:k]
        self.coef = coef[k:] / scale                     # c_pairs, c_kv, c_seq

    # ------------------------------------------------------------------ pricing
    def _f(self, tokens: float) -> float:
        xs, ys = self.knots_tokens, self.knots_s
        if len(xs) == 1:
            return float(ys[0]) * tokens / xs[0] if tokens > xs[0] else float(ys[0])
        i = min(max(int(np.searchsorted(xs, tokens)) - 1, 0), len(xs) - 2)
        x0, x1 = xs[i], xs[i + 1]
        return float(ys[i] + (ys[i + 1] - ys[i]) * (tokens - x0) / (x1 - x0))

    def _graph_index(self, batch: StepBatch) -> int | None:
        # one token per sequence is a uniform decode batch for the executor (a prompt's last
        # token alone counts as prefill in the StepBatch but runs in the graph all the same)
        if batch.num_scheduled_tokens != batch.num_seqs:
            return None
        i = bisect.bisect_left(self.graph_sizes, batch.num_seqs)
        return i if i < len(self.graph_sizes) else None

    def step_time_s(self, batch: StepBatch) -> float:
        """Seconds of one step (0 for a step that schedules nothing)."""
        if batch.num_scheduled_tokens <= 0:
            return 0.0
        i = self._graph_index(batch)
        if i is not None:
            a, b = self.decode_lines[i]
            return max(0.0, a + b * batch.kv_read_tokens)
        c_pairs, c_kv, c_seq = self.coef
        return max(0.0, self._f(batch.num_scheduled_tokens) + c_pairs * batch.attn_token_pairs
                   + c_kv * batch.kv_read_tokens + c_seq * batch.num_seqs)

    def run_time_s(self, batch: StepBatch, num_steps: int) -> float:
        """num_steps decode steps, each sequence one token longer per step (closed form: the
        time is linear in the context, which grows by num_seqs per step)."""
        if num_steps <= 0 or batch.num_scheduled_tokens <= 0:
            return 0.0
        i = self._graph_index(batch)
        if i is not None:
            slope = self.decode_lines[i][1]
        else:
            slope = self.coef[0] + self.coef[1]    # decode: pairs and kv both grow by one per sequence
        grow = slope * batch.num_seqs
        return self.step_time_s(batch) * num_steps + grow * num_steps * (num_steps - 1) / 2

    def __repr__(self) -> str:
        return f"StepShapeCost({self.path!r}, gpu={self.provenance.get('gpu', '?')})"
