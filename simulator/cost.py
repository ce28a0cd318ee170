"""Step-cost models: how long one engine step (one forward pass) takes.

The simulator defines the interface and two simple models; planner/roofline.py implements the
same protocol from a model and a GPU (the simulator never imports it).

* ``FixedStepCost(step_s)``: every step takes ``step_s``. ``FixedStepCost(1.0)`` is the step
  clock: simulated time is vLLM's step index (used to diff against the vLLM oracle).
* ``TableCost(csv_path)``: measured step times, interpolated (see its docstring).
* ``ScaledCost(inner, scale)``: another model's step times times ``scale`` (sensitivity checks).
* ``CarriedCost(inner, source, target, note)``: a model measured on one GPU carried to another:
  each step's time times ``target / source`` of two models of the same step on the two GPUs (the
  planner's rooflines): an extrapolation, which its ``describe()`` says.

``StepTimer`` turns a cost model's seconds into the engine's integer nanoseconds (so that runs of
steps add up exactly) and finds how many decode steps reach a given time.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kvsim.errors import InputError

NS_PER_S = 1_000_000_000


def to_ns(seconds: float) -> int:
    """Seconds to the engine's integer nanoseconds."""
    return int(round(seconds * NS_PER_S))


@dataclass(slots=True)
class StepBatch:
    """What one step computes. For a run of identical decode steps, this is the FIRST step.

    num_seqs: requests scheduled in the step.
    num_prefill_tokens: tokens of prompts (and recomputation) processed.
    num_decode_tokens: tokens generated from one previous token each (one per decoding request).
    num_scheduled_tokens: num_prefill_tokens + num_decode_tokens.
    kv_read_tokens: sum over scheduled requests of the context attended (tokens already in the KV
        cache plus the new ones): the KV bytes read scale with it.
    attn_token_pairs: sum over scheduled requests of new_tokens * context, for attention FLOPs.
    max_context_tokens: the longest context among them (after the step), or 0 when the engine
        does not track it: it does only for a cost model whose ``uses_max_context_tokens`` is
        true (a decode batch's longest sequence can set a floor under its time).

    Treated as immutable once built: the engine prices one run several times with the same
    batch, and a cost model may keep what it derived from the last batch it saw (by identity).
    """

    num_seqs: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_scheduled_tokens: int = 0
    kv_read_tokens: int = 0
    attn_token_pairs: int = 0
    max_context_tokens: int = 0


def decode_step_batch(batch: StepBatch, i: int) -> StepBatch:
    """The i-th (0-based) step of a run of decode steps that starts with ``batch``: every sequence
    has ``i`` more tokens of context."""
    grow = i * batch.num_seqs
    return StepBatch(batch.num_seqs, batch.num_prefill_tokens, batch.num_decode_tokens,
                     batch.num_scheduled_tokens, batch.kv_read_tokens + grow,
                     batch.attn_token_pairs + grow, batch.max_context_tokens + i if batch.max_context_tokens else 0)


# A fitted term whose contribution is below this fraction of every step time it was fitted to is
# not a term: the least-squares solution puts 1e-20-sized coefficients where the data have none,
# and their last digits depend on the BLAS kernels and numpy's version. Such a term is set to
# exactly 0 and the fit redone without it (``cost_table._nonneg_lstsq``; ``TableCost``'s KV slope
# alike), so that what a model uses (the longest context, say) is decided by the data, not by the
# sign of rounding noise. A measured step's own noise is 1e-3 relative or more, so 1e-6 keeps every
# term the data can show.
TERM_REL_TOL = 1e-6


def clock_source(model) -> str:
    """One line saying where a run's step times come from (its cost model's ``describe()``):
    printed first by ``kvsim replay`` and ``kvsim bench`` and kept in result.json (``config.clock``),
    ending with how close that clock came to real vLLM where it was measured (``held_out_note``)."""
    describe = getattr(model, "describe", None)
    line = describe() if describe is not None else type(model).__name__
    note = getattr(model, "held_out_note", None)   # set by planner.engine_setup (planner.held_out)
    return f"{line}; {note}" if note else line


def uses_max_context_tokens(model) -> bool:
    """Whether ``model`` prices a step by its longest context (the engine then tracks it)."""
    return bool(getattr(model, "uses_max_context_tokens", False))


def summed_run_time_s(model: "CostModel", batch: StepBatch, num_steps: int) -> float:
    """Default ``run_time_s``: the sum of ``step_time_s`` over the steps of the run."""
    return math.fsum(model.step_time_s(decode_step_batch(batch, i)) for i in range(num_steps))


@runtime_checkable
class CostModel(Protocol):
    """Duration of engine steps, in seconds."""

    def step_time_s(self, batch: StepBatch) -> float:
        """Seconds one step with this batch takes."""
        ...

    def run_time_s(self, batch: StepBatch, num_steps: int) -> float:
        """Seconds ``num_steps`` identical decode steps take, the first being ``batch`` and each
        following one attending one more token per sequence (``summed_run_time_s`` is a valid
        implementation; closed forms are faster)."""
        ...


@dataclass(frozen=True)
class FixedStepCost:
    """Every step takes ``step_s`` seconds, whatever it computes. FixedStepCost(1.0) = step clock."""

    step_s: float = 1.0

    def __post_init__(self):
        if not (self.step_s > 0 and math.isfinite(self.step_s)):
            raise InputError(f"step_s must be a positive finite number, got {self.step_s}")

    def step_time_s(self, batch: StepBatch) -> float:
        return self.step_s

    def describe(self) -> str:
        return "step clock (every step 1 time unit: vLLM's step index)" if self.step_s == 1.0 else \
            f"fixed step time {self.step_s:g} s (whatever a step computes)"

    def run_time_s(self, batch: StepBatch, num_steps: int) -> float:
        return self.step_s * num_steps


class TableCost:
    """Step time interpolated from measurements (a CSV), so a real GPU can calibrate the simulator.

    CSV columns (header required, others ignored): ``num_scheduled_tokens`` and ``step_s``
    (seconds), optionally ``kv_read_tokens``. The model is

        step_s = f(num_scheduled_tokens) + c * kv_read_tokens

    where ``f`` interpolates linearly between the measured batch sizes (rows with the same
    ``num_scheduled_tokens`` are averaged; outside the measured range it extends the nearest
    segment's slope, never below 0), and ``c`` (seconds per context token read) is the least-squares
    slope of the residuals against ``kv_read_tokens`` (0 when that column is absent). A table with
    one batch size is a constant plus the KV term.

    Args:
        path: the CSV file. Bad content raises InputError naming file, line and field.
    """

    def __init__(self, path: str):
        self.path = str(path)
        rows: list[tuple[float, float, float]] = []
        try:
            f = open(path, newline="")
        except OSError as err:  # the user named this file: say which, in one line
            raise InputError(f"cannot read the cost table: {err.strerror}", file=self.path) from None
        with f:
            reader = csv.DictReader(f)
            fields = reader.fieldnames or []
            for need in ("num_scheduled_tokens", "step_s"):
                if need not in fields:
                    raise InputError(f"missing column (have: {', '.join(fields) or 'none'})",
                                     file=self.path, line=1, field=need)
            has_kv = "kv_read_tokens" in fields
            for line_no, row in enumerate(reader, start=2):
                vals = []
                for name in ("num_scheduled_tokens", "step_s", "kv_read_tokens"):
                    if name == "kv_read_tokens" and not has_kv:
                        vals.append(0.0)
                        continue
                    raw = (row.get(name) or "").strip()
                    try:
                        v = float(raw)
                    except ValueError:
                        raise InputError(f"not a number: {raw!r}", file=self.path, line=line_no,
                                         field=name) from None
                    if not math.isfinite(v) or v < 0 or (name == "step_s" and v == 0):
                        raise InputError(f"must be {'positive' if name == 'step_s' else '>= 0'}"
                                         f" and finite, got {raw}", file=self.path,
                                         line=line_no, field=name)
                    vals.append(v)
                rows.append((vals[0], vals[1], vals[2]))
        if not rows:
            raise InputError("no data rows", file=self.path, line=1)
        # c: least-squares slope of step_s against kv_read within equal batch sizes (so the batch-size
        # effect does not leak into it), pooled over batch sizes
        by_tokens: dict[float, list[tuple[float, float]]] = {}
        for tok, step, kv in rows:
            by_tokens.setdefault(tok, []).append((kv, step))
        sxy = sxx = 0.0
        for pts in by_tokens.values():
            mk = sum(p[0] for p in pts) / len(pts)
            ms = sum(p[1] for p in pts) / len(pts)
            sxy += sum((k - mk) * (s - ms) for k, s in pts)
            sxx += sum((k - mk) ** 2 for k, _ in pts)
        self.kv_coeff_s = max(0.0, sxy / sxx) if sxx > 0 else 0.0
        if all(self.kv_coeff_s * kv < TERM_REL_TOL * step for _, step, kv in rows):
            self.kv_coeff_s = 0.0       # rounding noise, not a term (TERM_REL_TOL)
        self._xs = sorted(by_tokens)
        self._ys = [sum(s - self.kv_coeff_s * k for k, s in by_tokens[x]) / len(by_tokens[x])
                    for x in self._xs]

    def _f(self, tokens: float) -> float:
        xs, ys = self._xs, self._ys
        if len(xs) == 1:
            return ys[0]
        if tokens <= xs[0]:
            i = 0
        elif tokens >= xs[-1]:
            i = len(xs) - 2
        else:
            lo, hi = 0, len(xs) - 1
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if xs[mid] <= tokens:
                    lo = mid
                else:
                    hi = mid
            i = lo
        x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)

    def describe(self) -> str:
        return f"measured table {self.path} (num_scheduled_tokens + kv_read_tokens fit)"

    def step_time_s(self, batch: StepBatch) -> float:
        return max(0.0, self._f(batch.num_scheduled_tokens) + self.kv_coeff_s * batch.kv_read_tokens)

    def run_time_s(self, batch: StepBatch, num_steps: int) -> float:
        # closed form: f is constant over the run, the KV term grows arithmetically
        base = max(0.0, self._f(batch.num_scheduled_tokens) + self.kv_coeff_s * batch.kv_read_tokens)
        grow = self.kv_coeff_s * batch.num_seqs * (num_steps * (num_steps - 1) / 2)
        return base * num_steps + grow


class WrappedCost:
    """A cost model over another (``inner``) that keeps what the engine asks of it beside its step
    times: whether it prices a step's longest context, the step that starts an idle engine
    (``idle_start_s`` after ``idle_start_min_wait_s`` idle), a request's way in and out
    (``frontend_s``: CPU and IPC, not steps), how a burst meets an idle engine (``first_step``)
    and a fresh engine's compiles (``first_use_compiles``). Its step times are ``inner``'s; a
    subclass changes them."""

    def __init__(self, inner: CostModel):
        self.inner = inner
        self.uses_max_context_tokens = uses_max_context_tokens(inner)
        self.idle_start_s = getattr(inner, "idle_start_s", 0.0)
        self.idle_start_min_wait_s = getattr(inner, "idle_start_min_wait_s", 0.0)
        self.frontend_s = getattr(inner, "frontend_s", (0.0, 0.0, 0.0))
        self.first_step = getattr(inner, "first_step", None)
        self.first_use_compiles = getattr(inner, "first_use_compiles", None)

    def step_time_s(self, batch: StepBatch) -> float:
        return self.inner.step_time_s(batch)

    def run_time_s(self, batch: StepBatch, num_steps: int) -> float:
        return self.inner.run_time_s(batch, num_steps)

    def describe(self) -> str:
        return clock_source(self.inner)


class ScaledCost(WrappedCost):
    """Step times of another cost model multiplied by ``scale`` (sensitivity checks); the idle
    start is a step's and scales, a wait and the way in and out do not."""

    def __init__(self, inner: CostModel, scale: float):
        if not (scale > 0 and math.isfinite(scale)):
            raise InputError(f"step_time_scale must be a positive finite number, got {scale}")
        super().__init__(inner)
        self.scale = float(scale)
        self.idle_start_s = self.scale * self.idle_start_s

    def step_time_s(self, batch: StepBatch) -> float:
        return self.scale * self.inner.step_time_s(batch)

    def describe(self) -> str:
        return f"{clock_source(self.inner)}, times {self.scale:g}"

    def run_time_s(self, batch: StepBatch, num_steps: int) -> float:
        return self.scale * self.inner.run_time_s(batch, num_steps)


class SyncCost(WrappedCost):
    """A table measured with async scheduling on, run with it off (vLLM's synchronous
    ``EngineCore.step``): every step also pays ``cpu_s`` plus ``cpu_per_seq_s`` for each request
    in it, the CPU work (input preparation, the output's processing and its hand-off to the
    frontend) that async scheduling overlaps with the GPU and the table's steps therefore hide.
    ``source`` says where they were measured."""

    def __init__(self, inner: CostModel, cpu_s: float, cpu_per_seq_s: float, source: str):
        super().__init__(inner)
        self.cpu_s, self.cpu_per_seq_s, self.source = float(cpu_s), float(cpu_per_seq_s), source

    def _cpu(self, batch: StepBatch) -> float:
        return self.cpu_s + self.cpu_per_seq_s * batch.num_seqs

    def step_time_s(self, batch: StepBatch) -> float:
        return self.inner.step_time_s(batch) + self._cpu(batch)

    def run_time_s(self, batch: StepBatch, num_steps: int) -> float:
        # a decode run keeps its requests: the same CPU work every step
        return self.inner.run_time_s(batch, num_steps) + num_steps * self._cpu(batch)

    def describe(self) -> str:
        return (f"{clock_source(self.inner)}; async scheduling off: +{self.cpu_s * 1e3:.2f} ms a step "
                f"+{self.cpu_per_seq_s * 1e6:.1f} us a request in it, the CPU work async scheduling hides "
                f"({self.source})")


class CarriedCost(WrappedCost):
    """``inner`` (measured on one GPU) carried to another: a step costs ``inner``'s time times
    ``target``'s over ``source``'s for the same batch (two models of the step on the two GPUs,
    e.g. rooflines: memory-bound steps move with the bandwidths, compute-bound ones with the peaks,
    a fixed part of neither). A run of decode steps is carried at its first step's ratio (the
    ratio moves little over a run, a token of context a step; one ratio keeps a run O(1) and its
    prefixes consistent). ``note`` ends the clock line (what was carried, from where to where)."""

    def __init__(self, inner: CostModel, source: CostModel, target: CostModel, note: str):
        super().__init__(inner)
        self.source, self.target, self.note = source, target, note

    def _ratio(self, batch: StepBatch) -> float:
        src = self.source.step_time_s(batch)
        return self.target.step_time_s(batch) / src if src > 0 else 1.0

    def step_time_s(self, batch: StepBatch) -> float:
        return self.inner.step_time_s(batch) * self._ratio(batch)

    def run_time_s(self, batch: StepBatch, num_steps: int) -> float:
        return self.inner.run_time_s(batch, num_steps) * self._ratio(batch)

    def describe(self) -> str:
        return f"{clock_source(self.inner)}, {self.note}"


class EagerLaunchCost(WrappedCost):
    """``inner`` on a host whose launch of a step on no CUDA graph (more than ``graph_tokens``
    tokens: vLLM launches such a step layer by layer from Python) takes ``launch_s``: such a step
    takes at least that long (a launch-bound step is its launch; a step of more GPU work than
    that, its GPU time). Under async scheduling vLLM launches the next step as soon as this one
    is launched, so two eager steps back to back take at least two launches. ``source`` says where
    the launch time comes from; None: the table's own '# eager launch:' line, which ``inner``'s
    description gives already."""

    def __init__(self, inner: CostModel, launch_s: float, graph_tokens: int, source: str | None):
        super().__init__(inner)
        self.launch_s, self.graph_tokens, self.source = float(launch_s), int(graph_tokens), source

    def step_time_s(self, batch: StepBatch) -> float:
        t = self.inner.step_time_s(batch)
        return max(t, self.launch_s) if batch.num_scheduled_tokens > self.graph_tokens else t

    def run_time_s(self, batch: StepBatch, num_steps: int) -> float:
        t = self.inner.run_time_s(batch, num_steps)
        # a run's steps are alike: all on a graph or all eager (a decode run of more sequences
        # than the largest graph); each eager one lasts at least the launch
        return max(t, num_steps * self.launch_s) if batch.num_scheduled_tokens > self.graph_tokens else t

    def describe(self) -> str:
        if self.source is None:
            return (f"{clock_source(self.inner)}; a step on no CUDA graph (over {self.graph_tokens} tokens) takes at "
                    "least the table's host's launch")
        return (f"{clock_source(self.inner)}; a step on no CUDA graph (over {self.graph_tokens} tokens) takes at "
                f"least its launch, {self.launch_s * 1e3:.1f} ms ({self.source})")


class StepTimer:
    """Durations in integer nanoseconds for the engine's clock, from a cost model.

    A step lasts ``step_time_s`` rounded to ns; a run of k decode steps lasts ``run_time_s``
    rounded once (at least 1 ns per step), so a run and the same steps one by one end at the same
    nanosecond. The last run priced is kept: the engine prices one run several times (its bound,
    then its end) with the same first-step batch.
    """

    def __init__(self, cost_model: CostModel):
        self.cost = cost_model
        self.fixed_step_ns = to_ns(cost_model.step_s) if isinstance(cost_model, FixedStepCost) \
            else None
        self._last_run = (None, 0, 0)     # (first-step batch, k, run ns) of the last run priced

    def step_ns(self, batch: StepBatch) -> int:
        """One step (before the engine's 1 ns floor)."""
        if self.fixed_step_ns is not None:
            return self.fixed_step_ns
        return to_ns(self.cost.step_time_s(batch))

    def run_ns(self, b0: StepBatch, k: int) -> int:
        """A run of ``k`` decode steps whose first step is ``b0``."""
        if self.fixed_step_ns is not None:
            return self.fixed_step_ns * k
        cached = self._last_run
        if cached[0] is b0 and cached[1] == k:
            return cached[2]
        ns = max(k, int(round(self.cost.run_time_s(b0, k) * NS_PER_S)))
        self._last_run = (b0, k, ns)
        return ns

    def steps_to_reach(self, b0: StepBatch, now: int, bound: int, k_max: int) -> int:
        """Smallest k >= 1 whose run ends at or after ``bound`` (capped at k_max)."""
        if bound <= now:
            return 1
        if self.fixed_step_ns is not None:
            return max(1, min(k_max, -(-(bound - now) // self.fixed_step_ns)))
        # steps only get longer in a decode run, so k = ceil(gap / first step) is enough; it is
        # usually exact
        first = max(1, self.step_ns(b0))
        guess = min(k_max, max(1, -(-(bound - now) // first)))
        if guess == 1 or now + self.run_ns(b0, guess - 1) < bound:
            if guess < k_max:
                self.run_ns(b0, guess)   # the run's end, cached for the caller
            return guess
        hi = 1
        while hi < k_max and now + self.run_ns(b0, hi) < bound:
            hi = min(k_max, hi * 2)
        if now + self.run_ns(b0, hi) < bound:
            return hi
        lo = hi // 2  # run(lo) < bound (or lo == 0)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if now + self.run_ns(b0, mid) >= bound:
                hi = mid
            else:
                lo = mid
        return max(1, hi)
