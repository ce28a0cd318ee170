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
  ``t = a_s + b_s * kv_read_tokens`` (least squares over that size's rows of equal contexts; a
  size whose rows hardly differ in KV read takes b_s between the sizes that were measured over
  contexts, ``_lines``); a
  batch of ``n`` sequences is priced at the smallest measured size >= n (the size it pads to when
  the table measured every capture size, as the default grid does; real vLLM's tables, whose grids
  skip some of vLLM's capture sizes, give each skipped size between two measured ones the line
  interpolated between them, ``_add_unmeasured_capture_sizes``).
* **the longest context's floor** (tables with ``max_context_tokens`` and a ``context buckets``
  line): the longest sequence is read by few programs, so it can outlast the bandwidth term, and
  the executor plans its split-KV launch by the longest context's bucket (a power of two, at
  least the table's minimum). The rows of one long sequence among short ones give
  ``floor_s(L) = t - a_s`` per size and bucket, and a decode step costs
  ``a_s + max(b_s * kv_read_tokens, floor_s(max_context_tokens))`` (``context_floor_s``: between
  measured sizes linear in the size; within a bucket linear in L through its rows, level above
  the last; in the minimum bucket 0 while L is at most the rows' other contexts (equal contexts:
  the line); a bucket without rows for that size borrows the nearest bucket that has them, never
  the minimum one, whose launches are not split). The engine fills ``max_context_tokens`` only for
  a model that says it uses it (``uses_max_context_tokens``).
* **other steps** (and decode batches above the largest graph) run eagerly:
  ``t = f(num_scheduled_tokens) + c_pairs * attn_token_pairs + c_kv * kv_read_tokens
  + c_seq * num_seqs [+ c_tail * max(0, max_context_tokens - attn_token_pairs / num_scheduled_tokens)]``
  (the tail term where the table has longest contexts, MIN_TAIL_ROWS rows with tails of
  MIN_TAIL_TOKENS or more: one long decode beside a chunk is a
  program per KV head over its whole context that the chunk's work does not hide; ``_tail_tokens``),
  and ``c_idle`` where the table's ``idle_before`` column marks steps that started an idle engine
  (with async scheduling such a step hides none of its CPU work): fitted with the rest, it is not
  part of a batch's price, the engine adds it to the first step after an idle wait of 10 ms or more
  (``idle_start_s``; engine.IDLE_START_MIN_WAIT_NS),
  ``f`` piecewise linear between the measured token counts (linear beyond them, never below 0)
  and non-decreasing (its unknowns are its first value and its rises from knot to knot, each
  kept >= 0: left free, the other terms absorb f on real vLLM's noisy rows, down to 0 s for a
  lone 1,024-token prompt), all fitted at once by least squares in relative error (each row weighted by 1/t, since
  errors are judged relative; a row priced ``ROBUST_REL_ERR`` or more off then weighs in proportion
  less, refitted until the weights settle: Huber's loss, so that one row whose time async
  scheduling's attribution moved to a neighbour does not bend f) with the coefficients kept >= 0, and kept only where their share of
  some measured step is at least ``TERM_REL_TOL`` (a smaller one is rounding noise: set to 0 and
  named in ``negligible_terms``; the same rule holds for the decode lines' slopes).

``load_cost_table(path)`` returns this model for a profile table and the plain ``TableCost`` for
the older ``num_scheduled_tokens,step_s[,kv_read_tokens]`` tables. Bad content raises InputError
naming file, line and column.
"""
from __future__ import annotations

import bisect
import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvsim.errors import InputError
from kvsim.simulator.cost import TERM_REL_TOL, StepBatch, TableCost
from kvsim.simulator.first_use import vllm_capture_sizes

SHAPE_COLUMNS = ("kind", "num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_scheduled_tokens",
                 "kv_read_tokens", "attn_token_pairs", "padded_num_seqs", "graph", "step_s")
KINDS = ("decode", "mixed")
EAGER_TERMS = ("c_pairs", "c_kv", "c_seq", "c_tail", "c_idle")   # the eager model's terms beside f, in fit order
# c_idle is fitted where at least this many rows started an idle engine (``idle_before``)
MIN_IDLE_ROWS = 8
# c_tail is fitted where at least MIN_TAIL_ROWS rows have a tail of MIN_TAIL_TOKENS or more: a
# grid whose tails are a few tokens (real vLLM's: a decode one token past a chunk's prompt) cannot
# tell a tail's cost per token, and one odd row then sets it (Llama-3.1-70B fp8 on the H200: 0.78 ms
# a token, a 4k-token tail priced at 3 s)
MIN_TAIL_TOKENS = 512
MIN_TAIL_ROWS = 4
# the eager fit's rows priced this far off (relative) or further weigh ROBUST_REL_ERR / |error|
# (Huber's weights, refitted at most ROBUST_MAX_ROUNDS times): real vLLM's noise is a few per
# cent, its attribution artefacts under async scheduling are 2x (StepShapeCost._fit_eager)
ROBUST_REL_ERR = 0.2
ROBUST_MAX_ROUNDS = 50


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


def _skewed(row: dict, v: dict, path: str, line: int) -> int:
    """The longest context of a decode row whose longest context is over twice the mean (the grid's
    rows of one long sequence among short ones: they give the floor, not the lines), else 0."""
    if not row.get("max_context_tokens"):
        return 0
    longest = _number(row, "max_context_tokens", path, line)
    return int(longest) if longest > 2 * v["kv_read_tokens"] / v["num_seqs"] else 0


def _min_bucket_tokens(provenance: dict[str, str], path: str) -> int | None:
    """The smallest context bucket of the table's ``context buckets`` line (None: no such line)."""
    text = provenance.get("context buckets")
    if text is None:
        return None
    first = next((w for w in text.replace(",", " ").split() if w.isdigit()), None)
    if first is None or int(first) < 1:
        raise InputError(f"'context buckets' names no positive token count: {text!r}", file=path,
                         field="context buckets")
    return int(first)


def _sum_max_lines(c0: float, c1: float, d0: float, d1: float, i0: int, i1: int) -> float:
    """sum over integers i in [i0, i1) of max(c0 + c1 * i, d0 + d1 * i)."""
    def total(a0, a1, lo, hi):
        return (hi - lo) * a0 + a1 * (lo + hi - 1) * (hi - lo) / 2 if hi > lo else 0.0
    if c1 == d1:
        return total(c0, c1, i0, i1) if c0 >= d0 else total(d0, d1, i0, i1)
    cross = (d0 - c0) / (c1 - d1)       # where the two lines meet
    m = min(max(math.ceil(cross), i0), i1)
    # below m the line that rises slower is on top, from m on the other
    lo_c = c1 < d1
    first = total(c0, c1, i0, m) if lo_c else total(d0, d1, i0, m)
    second = total(d0, d1, m, i1) if lo_c else total(c0, c1, m, i1)
    return first + second


def _tail_tokens(longest: float, pairs: float, tokens: float) -> float:
    """How far the longest context exceeds the context an average new token attends to: in an eager
    step each sequence's attention is one program per KV head over its whole context, so a long
    decode beside a chunk of short context is a tail the chunk's work does not hide (a chunk after
    a long prefix, whose programs all read that prefix, is none)."""
    return max(0.0, longest - pairs / tokens)




SLOPE_SPAN = 2.0     # a graph size's rows tell its KV slope when their KV reads span this ratio


def _kv_span(points: list[tuple[float, float]]) -> float:
    kv = [p[0] for p in points]
    return max(kv) / max(min(kv), 1.0)


def _nonneg_lstsq(a: np.ndarray, y: np.ndarray, free: int,
                  negligible: list[int] | None = None, checked_from: int | None = None) -> np.ndarray:
    """Least squares of rows weighted by 1/t (``y`` all ones, so ``a[i, j] * coef[j]`` is column
    j's share of row i's step time) with the last columns (all but the first ``free``) kept >= 0
    and kept only where they matter: columns whose coefficient comes out negative, then columns
    whose share of every row is below TERM_REL_TOL, are dropped (set to exactly 0; a negative one
    below the tolerance is rounding noise too) and the fit is redone (an active set, enough for
    the few physically non-negative terms here). The dropped negligible columns are appended to
    ``negligible``; only columns from ``checked_from`` (default ``free``) are checked for that."""
    checked_from = free if checked_from is None else checked_from
    keep = list(range(a.shape[1]))
    tol = TERM_REL_TOL * float(np.max(np.abs(y)))

    def share(j):           # column j's largest share of a row's time
        return float(np.max(np.abs(a[:, j] * coef[j]), initial=0.0))
    while True:
        coef = np.zeros(a.shape[1])
        sol, *_ = np.linalg.lstsq(a[:, keep], y, rcond=None)
        coef[keep] = sol
        neg = [j for j in keep if j >= free and coef[j] < 0]
        if neg:
            j = min(neg, key=lambda j: coef[j])
            keep.remove(j)
            if negligible is not None and j >= checked_from and share(j) < tol:
                negligible.append(j)        # rounding noise of either sign is no term
            continue
        small = [j for j in keep if j >= checked_from and share(j) < tol]
        if not small:
            return coef
        for j in small:
            keep.remove(j)
            if negligible is not None:
                negligible.append(j)


def _model_key(name: str) -> str:
    """A model's name without its hub owner, any case: Qwen/Qwen3-32B and Qwen3-32B are one."""
    return name.rsplit("/", 1)[-1].lower()


def measured_dtype(p: dict[str, str]) -> str | None:
    """The dtype a table's ``# executor`` line names (None: it names none)."""
    m = re.search(r"dtype (\w+)", p.get("executor", ""))
    return m.group(1) if m else None


def provenance_mismatches(p: dict[str, str], *, model: str | None = None, gpu: str | None = None,
                          tp: int = 1, kv_dtype: str = "auto", weights: str | None = None,
                          async_scheduling: bool | None = None) -> list[str]:
    """How a run differs from what a table measured (its ``# model``, ``# gpu`` and ``# executor``
    lines ``p``; one GPU): one phrase each, [] when it fits or the table does not say. A model
    fits by its name without the hub owner (Qwen/Qwen3-32B and Qwen3-32B). A GPU preset fits a
    table's GPU when its family (the name before the first '-') is a word of it: H200 and
    "NVIDIA H200", A100-80GB and "NVIDIA A100-SXM4-80GB". An executor dtype of fp8 is real vLLM's
    fp8 run: fp8 weights (``--quantization fp8``) and an fp8 KV cache; any other dtype measured
    the checkpoint's own weights. ``weights``: the run's weight format (``WeightFormat.method``:
    "fp8", "mxfp4", "dtype" ...) and ``async_scheduling``: None, not checked (a table measured
    with async scheduling on hides CPU work a synchronous run shows; one measured with it off
    shows the CPU work an asynchronous run hides)."""
    out = []
    if model and p.get("model") and _model_key(p["model"]) != _model_key(model):
        out.append(f"model {model} (the table's is {p['model']})")
    if gpu and p.get("gpu"):
        family = gpu.split("-")[0].lower()
        if family not in re.split(r"[\s\-_/]+", p["gpu"].lower()):
            out.append(f"GPU {gpu} (the table's is {p['gpu']})")
    if tp != 1:
        out.append(f"tensor parallel size {tp} (the table measured one GPU)")
    dtype = measured_dtype(p)
    if dtype is not None and ("fp8" in kv_dtype) != ("fp8" in dtype):
        out.append(f"KV dtype {kv_dtype} (the table's is {dtype})")
    if weights is not None and dtype is not None and (weights == "fp8") != ("fp8" in dtype):
        out.append(f"{weights if weights != 'dtype' else 'unquantized'} weights (the table's "
                   f"dtype is {dtype})")
    if async_scheduling is False and "async scheduling True" in p.get("executor", "") and "async off" not in p:
        out.append("async scheduling off (the table measured it on, and not what async scheduling hides)")
    if async_scheduling and "async scheduling False" in p.get("executor", ""):
        out.append("async scheduling on (the table measured it off: its steps show the CPU work)")
    return out


_REPO = Path(__file__).resolve().parent.parent
_FRONTEND = re.compile(r"in_s (\S+) \+ (\S+) per prompt token, out_s (\S+)")


def frontend_line(provenance: dict, path: str) -> tuple[float, float, float]:
    """A table's ``# frontend:`` line (``in_s A + B per prompt token, out_s C``, seconds): a
    request's way in (send -> schedulable) and a token's way out (step end -> client); zeros
    without the line."""
    text = provenance.get("frontend")
    if text is None:
        return 0.0, 0.0, 0.0
    m = _FRONTEND.match(text)
    try:
        values = tuple(float(v) for v in m.groups()) if m else ()
    except ValueError:
        values = ()
    if len(values) != 3 or not all(v >= 0 and math.isfinite(v) for v in values):
        raise InputError("'# frontend:' must read 'in_s A + B per prompt token, out_s C' (seconds >= 0), "
                         f"got {text!r}", file=path)
    return values


_FIRST_STEP = re.compile(r"sends (\S+) s then (\S+) s apart, cutoffs ((?:\S+-\S+ ?)+) s after the first send "
                         r".*; graphs to (\d+) tokens$")


@dataclass(frozen=True)
class FirstStep:
    """How an idle engine's first step takes a burst (the ``# first step:`` line of a table of real
    vLLM's steps): the client sends a burst's requests ``first_gap_s`` then ``gap_s`` apart, and
    the engine core, woken by the first, schedules what has reached it by a cutoff drawn from the
    measured ``cutoffs_s`` spans (one span drawn, the cutoff uniform in it); the rest join the
    next step. A step on no CUDA graph (more than ``graph_tokens`` tokens) takes tens of ms of CPU
    to launch, and under async scheduling the step before it returns its tokens only when that
    launch has: a split burst's first tokens come back with the next step's."""

    first_gap_s: float
    gap_s: float
    cutoffs_s: tuple[tuple[float, float], ...]
    graph_tokens: int

    def taken(self, k: int, rng) -> int:
        """Of ``k`` requests that reached an idle engine together, how many its first step takes
        (``rng``: a random.Random, the replica's own)."""
        lo, hi = self.cutoffs_s[rng.randrange(len(self.cutoffs_s))]
        cutoff = rng.uniform(lo, hi)
        sent = 0.0
        for i in range(1, k):
            sent += self.first_gap_s if i == 1 else self.gap_s
            if sent > cutoff:
                return i
        return k


def _first_step(provenance: dict, path: str) -> FirstStep | None:
    """A table's ``# first step:`` line (grid_table.burst_cutoffs); None without it."""
    text = provenance.get("first step")
    if text is None:
        return None
    m = _FIRST_STEP.match(text)
    try:
        spans = tuple(tuple(float(x) for x in span.split("-")) for span in m.group(3).split()) if m else ()
        first_gap, gap, graph_tokens = (float(m.group(1)), float(m.group(2)), int(m.group(4))) if m else (-1, -1, 0)
    except ValueError:
        spans, first_gap, gap, graph_tokens = (), -1.0, -1.0, 0
    if not spans or min(first_gap, gap) < 0 or any(len(x) != 2 or not 0 <= x[0] <= x[1] for x in spans) \
            or graph_tokens < 1:
        raise InputError("'# first step:' must read 'sends A s then B s apart, cutoffs LO-HI ... s after the "
                         f"first send (...); graphs to N tokens', got {text!r}", file=path)
    return FirstStep(first_gap, gap, spans, graph_tokens)


def _seconds_line(provenance: dict, key: str, path: str, example: str, positive: bool) -> float | None:
    """A table's ``# KEY: S s (...)`` line's seconds (> 0 where ``positive``, else >= 0); None
    without the line; an InputError naming the line where S is not such a number."""
    text = provenance.get(key)
    if text is None:
        return None
    m = re.match(r"\s*([0-9.eE+-]+) s\b", text)
    try:
        value = float(m.group(1)) if m else -1.0
    except ValueError:
        value = -1.0
    if not ((value > 0 if positive else value >= 0) and math.isfinite(value)):
        raise InputError(f"'# {key}:' must start with seconds {'>' if positive else '>='} 0 ('{example} s ...'), "
                         f"got {text!r}", file=path)
    return value


def _idle_wait(provenance: dict, path: str) -> float:
    """A table's ``# idle wait:`` line: the shortest idle wait after which a step pays c_idle (the
    hot plan measured lone prompts after shorter ones at their own price); 0 without the line."""
    return _seconds_line(provenance, "idle wait", path, "0.01", positive=False) or 0.0


def _eager_launch(provenance: dict, path: str) -> float | None:
    """A table's ``# eager launch:`` line: its host's launch of a step on no CUDA graph
    (grid_table.eager_launch_gaps); None without the line."""
    return _seconds_line(provenance, "eager launch", path, "0.045", positive=True)


_ASYNC_OFF = re.compile(r"\+(\S+) s per step(?: \+(\S+) s per sequence)? \((.+)\)$")


def async_off_line(provenance: dict, path: str) -> tuple[float, float, str] | None:
    """A table's ``# async off:`` line (``+S s per step [+P s per sequence] (where it was
    measured)``): what a step costs more with async scheduling off than the table (measured with it
    on) prices it, S plus P for each request in the step, and its source; None without the line."""
    text = provenance.get("async off")
    if text is None:
        return None
    m = _ASYNC_OFF.match(text.strip())
    try:
        values = (float(m.group(1)), float(m.group(2) or 0.0)) if m else (-1.0, -1.0)
    except ValueError:
        values = (-1.0, -1.0)
    if not all(v >= 0 and math.isfinite(v) for v in values):
        raise InputError("'# async off:' must read '+S s per step [+P s per sequence] (source)' (seconds >= 0), "
                         f"got {text!r}", file=path)
    return values[0], values[1], m.group(3)


def _shown(path: str) -> str:
    """A table's path as the clock line shows it: a shipped table relative to the repository (the
    same line from any checkout), any other as given."""
    try:
        return Path(path).resolve().relative_to(_REPO).as_posix()
    except ValueError:
        return path


class StepShapeCost:
    """Step times fitted to a ``kvsim profile`` table (module docstring).

    Args:
        path: the table.
        context_floor: price the longest context's floor where the table has its rows (False:
            the lines alone, as before the floor; for comparisons).
    Attributes:
        provenance: the table's ``#`` header (GPU, date, versions, model, command).
        graph_sizes: measured CUDA-graph batch sizes (real vLLM's table: with the capture sizes
            between them its grid skipped, interpolated); ``decode_lines[i]`` = (a_s, b_s) of size i.
        knots_tokens, knots_s: f of the eager model; coef: c_pairs, c_kv, c_seq; c_tail.
        idle_start_s: c_idle, what a step that starts an idle engine costs over its batch's
            price (fitted where the table's ``idle_before`` column marks such steps; else 0).
        frontend_s: (in_s, in_s per prompt token, out_s) of the ``# frontend:`` line: a
            request's way in and a token's way out, outside the steps (the engine adds them).
        idle_start_min_wait_s: the ``# idle wait:`` line: the engine adds c_idle only after an
            idle wait this long or longer (0 without the line: after any).
        first_step: the ``# first step:`` line (FirstStep: how an idle engine's first step takes a
            burst; None without it: whole).
        async_off: the ``# async off:`` line, (s per step, s per sequence, source): what every
            step costs more with async scheduling off than this table, measured with it on, prices
            it, a fixed part and one per request in the step (the engine's
            setup adds it: planner.engine_setup); None without the line (async off is then a
            mismatch).
        negligible_terms: the eager terms the fit found but set to 0, their share of every
            measured step below TERM_REL_TOL (rounding noise, not a term of the data).
        min_bucket_tokens: the smallest context bucket; floors[bucket][size] = (start, [(L, floor_s)]).
        uses_max_context_tokens: whether any floor was measured (the engine then tracks the
            longest context).
    """

    def __init__(self, path: str | Path, *, context_floor: bool = True):
        self.path = path = str(path)
        self.provenance, header, rows = read_table(path)
        for name in SHAPE_COLUMNS:
            if name not in header:
                raise InputError(f"missing column (have: {', '.join(header)})", file=path, line=len(self.provenance) + 1,
                                 field=name)
        decode: dict[int, list[tuple[float, float]]] = {}
        skewed: list[tuple[int, int, float, float, int]] = []   # (size, longest, others' context, step_s, line)
        eager = []
        for line, row in rows:
            kind = row["kind"]
            if kind not in KINDS:
                raise InputError(f"must be one of {', '.join(KINDS)}, got {kind!r}", file=path, line=line,
                                 field="kind")
            v = {name: _number(row, name, path, line, positive=name == "step_s")
                 for name in SHAPE_COLUMNS if name != "kind"}
            if row.get("max_context_tokens"):
                v["max_context_tokens"] = _number(row, "max_context_tokens", path, line)
            if row.get("idle_before"):
                v["idle_before"] = _number(row, "idle_before", path, line)
                if v["idle_before"] not in (0, 1):
                    raise InputError(f"must be 0 or 1, got {row['idle_before']!r}", file=path, line=line,
                                     field="idle_before")
            if v["num_scheduled_tokens"] == 0 or v["num_seqs"] == 0:
                raise InputError("a measured step schedules at least one token of one sequence", file=path,
                                 line=line, field="num_scheduled_tokens")
            if kind == "decode" and v["graph"]:
                longest = _skewed(row, v, path, line)
                if longest:    # one long context among short ones: the floor, not the lines
                    others = (v["kv_read_tokens"] - longest) / max(v["num_seqs"] - 1, 1)
                    skewed.append((int(v["padded_num_seqs"]), longest, others, v["step_s"], line))
                    continue
                decode.setdefault(int(v["padded_num_seqs"]), []).append((v["kv_read_tokens"], v["step_s"]))
            else:
                eager.append(v)
        self.graph_sizes = sorted(decode)
        self.decode_lines = self._lines(decode)
        self._fit_eager(eager, path)
        self._fit_floor(skewed, path, context_floor)
        self.frontend_s = frontend_line(self.provenance, path)
        self.idle_start_min_wait_s = _idle_wait(self.provenance, path)
        self.async_off = async_off_line(self.provenance, path)
        self.first_step = _first_step(self.provenance, path)
        self.eager_launch_s = _eager_launch(self.provenance, path)
        if self.first_step is not None:
            self._add_unmeasured_capture_sizes(self.first_step.graph_tokens)

    def _add_unmeasured_capture_sizes(self, graph_tokens: int) -> None:
        """Real vLLM's table (its ``# first step:`` line names the largest CUDA graph): a decode
        batch pads to vLLM's next capture size (1, 2, 4, every 8 to 248, every 16 from 256), and a
        grid that measured only some of them (the small and large grids: 1, 4, 8, 16, 24, 32, 64,
        128; 1, 8, 16, 32, 128) would price a batch that pads to one it skipped at the next size it
        measured (gpt-oss-120b's 64 sequences at 128's line: 11.8 ms, where the engine ran them in
        8.1 ms). Each skipped capture size between two measured ones gets the line interpolated in
        the size between them (the floor already is, ``_size_floor``); beyond the largest measured
        size nothing changes."""
        measured = list(self.graph_sizes)
        if len(measured) < 2:
            return
        lines = dict(zip(measured, self.decode_lines))
        for size in vllm_capture_sizes(graph_tokens):
            if measured[0] < size < measured[-1] and size not in lines:
                j = bisect.bisect_left(measured, size)
                s0, s1 = measured[j - 1], measured[j]
                w = (size - s0) / (s1 - s0)
                (a0, b0), (a1, b1) = lines[s0], lines[s1]
                lines[size] = ((1 - w) * a0 + w * a1, (1 - w) * b0 + w * b1)
        self.graph_sizes = sorted(lines)
        self.decode_lines = [lines[s] for s in self.graph_sizes]

    def _lines(self, decode: dict[int, list[tuple[float, float]]]) -> list[tuple[float, float]]:
        """Each graph size's (a_s, b_s). A size measured only at nearly one KV length (its
        longest read under SLOPE_SPAN x its shortest: real vLLM's grid runs most sizes at one
        context) cannot tell its slope: it takes b_s interpolated in the batch size between the
        sizes that can (the KV read is bandwidth, much the same per token at any size), and a_s
        fitted to its rows with that slope."""
        lines = [self._line(decode[s]) for s in self.graph_sizes]
        wide = [i for i, s in enumerate(self.graph_sizes) if _kv_span(decode[s]) >= SLOPE_SPAN]
        if not wide or len(wide) == len(lines):
            return lines
        for i, size in enumerate(self.graph_sizes):
            if i in wide:
                continue
            b = float(np.interp(size, [self.graph_sizes[j] for j in wide], [lines[j][1] for j in wide]))
            kv = np.array([p[0] for p in decode[size]])
            t = np.array([p[1] for p in decode[size]])
            # a minimizes the relative error sum(((a + b kv) / t - 1)^2) with b fixed
            a = float(np.sum((1.0 - b * kv / t) / t) / np.sum(1.0 / t ** 2))
            lines[i] = (a, b)
        return lines

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
        self.knots_tokens = self._knots(tokens, path)
        k = len(self.knots_tokens)
        # f's values at the knots are unknowns; a row weighs them as _f interpolates (where every
        # row's token count is a knot, the indicator of its knot)
        basis = np.zeros((len(rows), k))
        for row, x in enumerate(tokens):
            i, w = self._segment(self.knots_tokens, x)
            basis[row, i] += 1.0 - w
            if k > 1:
                basis[row, i + 1] += w
        extra = np.array([[r["attn_token_pairs"], r["kv_read_tokens"], r["num_seqs"],
                           _tail_tokens(r["max_context_tokens"], r["attn_token_pairs"], r["num_scheduled_tokens"])
                           if r.get("max_context_tokens") else 0.0, r.get("idle_before", 0.0)] for r in rows])
        # the optional terms where the table has them: tails (longest contexts beside chunks),
        # steps that start an idle engine (MIN_IDLE_ROWS of them or more: fewer, such as a coarse
        # grid's few prefills, and c_idle would take one row's whole residual), tails where
        # MIN_TAIL_ROWS rows have MIN_TAIL_TOKENS or more
        if extra[:, 4].sum() < MIN_IDLE_ROWS:
            extra[:, 4] = 0.0
        if np.count_nonzero(extra[:, 3] >= MIN_TAIL_TOKENS) < MIN_TAIL_ROWS:
            extra[:, 3] = 0.0
        terms = [j for j in range(len(EAGER_TERMS)) if j < 3 or extra[:, j].any()]
        extra = extra[:, terms]
        scale = np.maximum(extra.max(axis=0), 1.0)      # conditioning: columns of order 1
        design = np.hstack([basis, extra / scale])
        weight = np.ones_like(t)
        coef, dropped = self._solve_eager(design, t, weight, k)
        # rows priced ROBUST_REL_ERR or more off weigh less, in proportion (Huber, reweighted until
        # the weights settle): one artefact of async scheduling's attribution (Qwen3-30B-A3B on the
        # H100: 890 tokens over 256 sequences at 11.6 ms) pulled f down to 25 ms at 1,024 tokens,
        # where eight lone 1,024-token prompts took 45.6 ms. A table priced within it everywhere
        # keeps its least-squares fit to the last bit.
        for _ in range(ROBUST_MAX_ROUNDS):
            off = np.abs(design @ coef / t - 1.0)
            new_weight = np.minimum(1.0, ROBUST_REL_ERR / np.maximum(off, ROBUST_REL_ERR))
            if np.allclose(new_weight, weight, rtol=0.0, atol=1e-9):
                break
            weight = new_weight
            coef, dropped = self._solve_eager(design, t, weight, k)
        self.negligible_terms = [EAGER_TERMS[terms[j - k]] for j in sorted(dropped)]
        self.knots_s = coef[:k]
        fitted = dict(zip((EAGER_TERMS[j] for j in terms), coef[k:] / scale))
        self.coef = np.array([fitted[name] for name in EAGER_TERMS[:3]])   # c_pairs, c_kv, c_seq
        self.c_tail = float(fitted.get("c_tail", 0.0))
        self.idle_start_s = float(fitted.get("c_idle", 0.0))

    @staticmethod
    def _solve_eager(design: np.ndarray, t: np.ndarray, weight: np.ndarray, k: int) -> tuple[np.ndarray, list[int]]:
        """The eager model's coefficients (f at its ``k`` knots, then the extra terms) by least
        squares in relative error, each row's equation times ``weight``, and the columns set to
        0 as negligible."""
        w = (weight / t)[:, None]
        y = weight.copy()
        dropped: list[int] = []
        coef = _nonneg_lstsq(design * w, y, free=k, negligible=dropped)
        if coef[0] < 0 or np.any(np.diff(coef[:k]) < 0):
            # f must be non-decreasing and >= 0: refit with f's first value and its rises from
            # knot to knot as the unknowns, each >= 0 (f at knot i is the sum of the first i + 1)
            # (a free fit that already is keeps its figures to the last bit)
            rises, dropped = np.tril(np.ones((k, k))), []
            coef = _nonneg_lstsq(np.hstack([design[:, :k] @ rises, design[:, k:]]) * w, y, free=0,
                                 negligible=dropped, checked_from=k)
            coef[:k] = rises @ coef[:k]
        return coef, dropped

    def _knots(self, tokens: np.ndarray, path: str) -> np.ndarray:
        """f's knots: the table's ``# knots:`` line (token counts; a table of many distinct,
        noisy counts, such as real vLLM's steps, gives a few so that f is smooth), else every
        measured token count."""
        text = self.provenance.get("knots")
        if text is None:
            return np.unique(tokens)
        try:
            knots = np.unique([int(v) for v in text.split(",")])
        except ValueError:
            raise InputError(f"'# knots:' must be token counts separated by commas, got {text!r}", file=path) from None
        if len(knots) < 2 or knots[0] < 1:
            raise InputError(f"'# knots:' needs two or more counts >= 1, got {text!r}", file=path)
        return knots

    @staticmethod
    def _segment(xs: np.ndarray, tokens: float) -> tuple[int, float]:
        """The knot segment ``_f`` prices ``tokens`` on and the weight of its right end (below
        the first knot or above the last: the end segment, extrapolated)."""
        if len(xs) == 1:
            return 0, 0.0
        i = min(max(int(np.searchsorted(xs, tokens)) - 1, 0), len(xs) - 2)
        return i, float((tokens - xs[i]) / (xs[i + 1] - xs[i]))

    def _fit_floor(self, skewed: list[tuple[int, int, float, float, int]], path: str, enabled: bool) -> None:
        self.min_bucket_tokens = _min_bucket_tokens(self.provenance, path)
        self.floors: dict[int, dict[int, list[tuple[float, float]]]] = {}
        if not enabled or self.min_bucket_tokens is None:
            skewed = []
        for size, longest, others, t, line in skewed:
            i = bisect.bisect_left(self.graph_sizes, size)
            if i == len(self.graph_sizes) or self.graph_sizes[i] != size:
                raise InputError(f"a decode row of one long context at batch {size}, but no row of equal contexts "
                                 "at that size to fit its line", file=path, line=line, field="padded_num_seqs")
            bucket = self.bucket(longest)
            start, points = self.floors.setdefault(bucket, {}).setdefault(size, [0.0, []])
            points.append((float(longest), t - self.decode_lines[i][0]))
            if bucket == self.min_bucket_tokens:
                # at most as long as the others, the batch has equal contexts: its line prices it
                self.floors[bucket][size][0] = max(start, others)
        for by_size in self.floors.values():
            for size, (start, points) in by_size.items():
                # one value per context (the last row's)
                by_size[size] = (start, sorted(dict(points).items()))
        self.uses_max_context_tokens = bool(self.floors) or self.c_tail > 0

    def bucket(self, context_tokens: int) -> int:
        """The context bucket the executor plans a decode launch for: context_tokens rounded up
        to a power of two, at least min_bucket_tokens."""
        b = self.min_bucket_tokens
        if context_tokens > b:
            b <<= (int(context_tokens - 1) // b).bit_length()
        return b

    @staticmethod
    def _floor_in_bucket(rows: tuple[float, list[tuple[float, float]]], longest: int) -> tuple[float, float, float]:
        """(value, slope per token, last context of that piece) of a bucket's floor at ``longest``:
        0 up to ``start`` (the other sequences' context of the minimum bucket's rows), then linear
        between the bucket's rows (below the first, the first two rows' line), level from the last
        row on, never below 0. The piece is linear from ``longest`` to its last context."""
        start, points = rows
        if longest <= start:
            return 0.0, 0.0, start
        if len(points) == 1 or longest >= points[-1][0]:
            return max(points[-1][1], 0.0), 0.0, math.inf
        j = max(1, bisect.bisect_right(points, (longest, math.inf)))
        (x0, y0), (x1, y1) = points[j - 1], points[j]
        slope = (y1 - y0) / (x1 - x0)
        value = y0 + slope * (longest - x0)
        last = float(x1)
        if value <= 0:       # clamped at 0 until the line rises through it
            return 0.0, 0.0, (min(last, math.floor(longest - value / slope)) if slope > 0 else last)
        if slope < 0:        # falls to 0 before the next row
            last = min(last, math.floor(longest + value / -slope))
        return value, slope, last

    def _floor_sizes(self, size: int, bucket: int) -> tuple[dict, int] | None:
        """The floor rows by size of the bucket that prices ``size`` at ``bucket``: that bucket's
        if its sizes span ``size``, else the nearest other bucket's (not the minimum one)."""
        def spans(b):
            by_size = self.floors.get(b)
            return by_size is not None and min(by_size) <= size <= max(by_size)
        if spans(bucket):
            return self.floors[bucket], bucket
        if bucket == self.min_bucket_tokens:
            return None
        others = [b for b in self.floors if b != self.min_bucket_tokens and spans(b)]
        if not others:
            return None
        b = min(others, key=lambda b: (abs(b.bit_length() - bucket.bit_length()), b))
        return self.floors[b], b

    def context_floor_s(self, size: int, longest: int) -> tuple[float, float, float]:
        """The floor under a decode batch padded to ``size`` whose longest context is ``longest``
        tokens: (seconds, seconds per token of ``longest``, the last longest context up to which
        that line holds); (0, 0, inf) where the table has none."""
        if not self.floors or longest <= 0:
            return 0.0, 0.0, math.inf
        bucket = self.bucket(longest)
        found = self._floor_sizes(size, bucket)
        if found is None:
            return 0.0, 0.0, float(bucket)
        by_size, b = found
        if b != bucket:                          # a borrowed bucket, read at its top: level
            value = self._size_floor(by_size, size, b)[0]
            return value, 0.0, float(bucket)
        value, slope, last = self._size_floor(by_size, size, longest)
        return value, slope, min(last, float(bucket))

    def _size_floor(self, by_size: dict, size: int, longest: int) -> tuple[float, float, float]:
        # between two measured sizes, linear in the size
        sizes = sorted(by_size)
        j = bisect.bisect_left(sizes, size)
        if sizes[j] == size:
            return self._floor_in_bucket(by_size[size], longest)
        s0, s1 = sizes[j - 1], sizes[j]
        w = (size - s0) / (s1 - s0)
        v0, k0, l0 = self._floor_in_bucket(by_size[s0], longest)
        v1, k1, l1 = self._floor_in_bucket(by_size[s1], longest)
        return (1 - w) * v0 + w * v1, (1 - w) * k0 + w * k1, min(l0, l1)

    # ------------------------------------------------------------------ pricing
    def _f(self, tokens: float) -> float:
        xs, ys = self.knots_tokens, self.knots_s
        if len(xs) == 1:
            return float(ys[0]) * tokens / xs[0] if tokens > xs[0] else float(ys[0])
        i, _ = self._segment(xs, tokens)
        x0, x1 = xs[i], xs[i + 1]
        # below the first knot the first segment's line, down to 0 (f never falls, never < 0)
        return max(0.0, float(ys[i] + (ys[i + 1] - ys[i]) * (tokens - x0) / (x1 - x0)))

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
            floor = self.context_floor_s(self.graph_sizes[i], batch.max_context_tokens)[0] \
                if self.floors else 0.0
            return max(0.0, a + max(b * batch.kv_read_tokens, floor))
        c_pairs, c_kv, c_seq = self.coef
        tail = _tail_tokens(batch.max_context_tokens, batch.attn_token_pairs, batch.num_scheduled_tokens) \
            if self.c_tail and batch.max_context_tokens else 0.0
        return max(0.0, self._f(batch.num_scheduled_tokens) + c_pairs * batch.attn_token_pairs
                   + c_kv * batch.kv_read_tokens + c_seq * batch.num_seqs + self.c_tail * tail)

    def run_time_s(self, batch: StepBatch, num_steps: int) -> float:
        """num_steps decode steps, each sequence one token longer per step (closed form: the
        time is linear in the context, which grows by num_seqs per step)."""
        if num_steps <= 0 or batch.num_scheduled_tokens <= 0:
            return 0.0
        i = self._graph_index(batch)
        if i is not None:
            if self.floors and batch.max_context_tokens > 0:
                return self._floored_run_time_s(batch, num_steps, i)
            slope = self.decode_lines[i][1]
        else:
            slope = self.coef[0] + self.coef[1]    # decode: pairs and kv both grow by one per sequence
        grow = slope * batch.num_seqs
        return self.step_time_s(batch) * num_steps + grow * num_steps * (num_steps - 1) / 2

    def _floored_run_time_s(self, batch: StepBatch, num_steps: int, i: int) -> float:
        """A decode run under the floor, in closed form: step j reads kv + j * num_seqs tokens and
        its longest context is L + j; the floor is linear in j piece by piece (``context_floor_s``
        says where each piece ends), so the run is summed per piece, each split where the floor
        and the bandwidth line cross."""
        a, b = self.decode_lines[i]
        size = self.graph_sizes[i]
        longest = batch.max_context_tokens
        line0, line1 = b * batch.kv_read_tokens, b * batch.num_seqs
        total, j = a * num_steps, 0
        while j < num_steps:
            value, slope, last = self.context_floor_s(size, longest + j)
            end = num_steps if last == math.inf else min(num_steps, j + 1 + int(last) - (longest + j))
            end = max(end, j + 1)
            total += _sum_max_lines(line0, line1, value - slope * j, slope, j, end)
            j = end
        return total

    def mismatches(self, *, model: str | None = None, gpu: str | None = None, tp: int = 1,
                   kv_dtype: str = "auto", weights: str | None = None,
                   async_scheduling: bool | None = None) -> list[str]:
        """How a run differs from what this table measured (``provenance_mismatches``)."""
        return provenance_mismatches(self.provenance, model=model, gpu=gpu, tp=tp, kv_dtype=kv_dtype,
                                     weights=weights, async_scheduling=async_scheduling)

    def describe(self) -> str:
        """The clock's source: this table and its provenance."""
        p = self.provenance
        what = ", ".join(f"{k} {p[k]}" for k in ("gpu", "model", "date") if p.get(k))
        dropped = f"; terms at rounding noise set to 0: {', '.join(self.negligible_terms)}" if self.negligible_terms else ""
        if self.idle_start_s:
            dropped += f"; a step that starts an idle engine +{self.idle_start_s * 1e3:.2f} ms"
            if self.idle_start_min_wait_s:
                dropped += f" (after {self.idle_start_min_wait_s * 1e3:g} ms idle or more)"
        if any(self.frontend_s):
            a, b, c = self.frontend_s
            dropped += (f"; a request's way in {a * 1e3:.2f} ms + {b * 1e6:.2f} us per prompt token, "
                        f"a token's way out {c * 1e3:.2f} ms")
        if self.first_step is not None:
            dropped += (f"; an idle engine's first step takes a burst's requests sent within a cutoff drawn "
                        f"from {len(self.first_step.cutoffs_s)} measured bursts")
        if self.eager_launch_s is not None:
            dropped += f"; its host launched a step on no CUDA graph in {self.eager_launch_s * 1e3:.1f} ms"
        first_use = getattr(self, "first_use_compiles", None)     # set by planner.engine_setup
        if first_use is not None:
            dropped += f"; {first_use.describe()}"
        return f"measured table {_shown(self.path)} ({what or 'no provenance'}){dropped}"

    def __repr__(self) -> str:
        dropped = f", negligible={'+'.join(self.negligible_terms)}" if self.negligible_terms else ""
        return f"StepShapeCost({self.path!r}, gpu={self.provenance.get('gpu', '?')}{dropped})"
