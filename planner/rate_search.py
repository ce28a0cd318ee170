"""The highest arrival rate that meets an SLO: ``kvsim plan ... --max-rate-under SLO``.

    found = max_rate_under(base, parse_slo("p99_ttft_ms<=500,p99_tpot_ms<=50"))
    found["max_rate"], found["row"], found["next_row"]

Each probe is one replay of the workload re-timed to ``rate`` requests/s (``workloads.retime``:
the one meaning of ``--rate``; a random: spec's ``rate=`` replaced), evaluated as a sweep point
(planner.sweep.evaluate_point, so its row has every summary and vllm bench serve column the
SLO can name). The search brackets the answer by doubling or halving from the base rate (or
1 request/s), bisects geometrically until the bracket is within ``rel_tol``, and then checks
``max_rate x STEP`` (5 % above): an SLO that is met again there (latency is not always
monotone in the rate) moves the search up from it. The answer is the highest probed rate that
meets the SLO with the probe ``STEP`` above it missing it; both replays are kept.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

from kvsim.errors import InputError
from kvsim.planner.slo import Constraint, meets
from kvsim.planner.sweep import PlanBase, PointTask, evaluate_point, run_tasks

STEP = 1.05              # the answer's rate x STEP must miss the SLO
REL_TOL = 0.01           # bisection stops when hi / lo <= 1 + REL_TOL
MAX_FACTOR = 2.0 ** 10   # the bracket's search stops this far from the start (a slower rate's
                         # replay spans that much more simulated time)
MAX_PROBES = 60


@dataclasses.dataclass(frozen=True)
class SearchTask:
    """One grid point's search (picklable: run_rate_search hands it to planner.sweep.run_tasks)."""

    index: int
    params: Mapping
    base: PlanBase
    constraints: tuple[Constraint, ...]
    simulate: Callable | None = None


def max_rate_under(base: PlanBase, constraints: tuple[Constraint, ...], *, params: Mapping | None = None,
                   simulate: Callable | None = None, rel_tol: float = REL_TOL, index: int = 0) -> dict:
    """Search the highest rate (requests/s) at which ``base`` (with ``params``) meets ``constraints``.

    Returns:
        ``{"max_rate", "row", "next_rate", "next_row", "probes": [(rate, meets), ...],
        "status"}``; status is "found", "never" (no rate down to the start / MAX_FACTOR meets
        it; max_rate None) or "always" (every rate up to start * MAX_FACTOR meets it; max_rate
        that rate).
    Raises:
        InputError: an impossible configuration, or an SLO metric the rows do not have.
    """
    if not constraints:
        raise InputError("--max-rate-under needs an SLO such as 'p99_ttft_ms<=500'", field="max-rate-under")
    params = dict(params or {})
    if "rate" in params or "rate_scale" in params:
        raise InputError("--max-rate-under searches the rate: do not sweep rate or rate_scale too",
                         field="max-rate-under")
    probes: list[tuple[float, bool]] = []     # (rate, meets) in the order probed
    rows: dict[float, dict] = {}

    def probe(rate: float) -> bool:
        if rate not in rows:
            if len(probes) >= MAX_PROBES:
                raise RuntimeError(f"the rate search took more than {MAX_PROBES} replays")
            row = evaluate_point(PointTask(index, {**params, "rate": rate}, base, simulate))
            if row.get("error") is not None:
                raise InputError(row["error"])
            rows[rate] = row
            probes.append((rate, meets(row, constraints)))
            return probes[-1][1]
        return next(ok for r, ok in probes if r == rate)

    start = float(base.rate) if base.rate else 1.0
    lo = hi = None
    if probe(start):
        lo, r = start, start * 2
        while hi is None:
            if r > start * MAX_FACTOR:
                return _answer("always", lo, rows, probes)
            if probe(r):
                lo, r = r, r * 2
            else:
                hi = r
    else:
        hi, r = start, start / 2
        while lo is None:
            if r < start / MAX_FACTOR:
                return _answer("never", None, rows, probes)
            if probe(r):
                lo = r
            else:
                hi, r = r, r / 2
    while True:
        while hi / lo > 1 + rel_tol:
            mid = math.sqrt(lo * hi)
            if probe(mid):
                lo = mid
            else:
                hi = mid
        above = lo * STEP
        if not probe(above):
            return _answer("found", lo, rows, probes, above)
        # met again 5 % up: search on from there
        lo, hi = above, max(hi, above * 2)
        while probe(hi):
            lo, hi = hi, hi * 2
            if hi > start * MAX_FACTOR:
                return _answer("always", lo, rows, probes)


def _answer(status: str, rate: float | None, rows: dict, probes: list, above: float | None = None) -> dict:
    return {"status": status, "max_rate": rate, "row": rows.get(rate), "next_rate": above,
            "next_row": rows.get(above), "probes": list(probes)}


def search_point(task: SearchTask) -> dict:
    """A grid point's search as a result row: the replay at the answer (its columns), with
    ``max_rate``, ``search_status``, ``probes`` and the missing rate above (``next_rate``)."""
    found = max_rate_under(task.base, task.constraints, params=task.params, simulate=task.simulate,
                           index=task.index)
    row = dict(found["row"] or {"point": task.index, **task.params, "error": None})
    row.update(point=task.index, max_rate=found["max_rate"], search_status=found["status"],
               next_rate=found["next_rate"], probes=len(found["probes"]))
    return row


def run_rate_search(points, base: PlanBase, constraints: tuple[Constraint, ...], *, jobs: int = 1,
                    backend: str = "local", address: str | None = None, progress: bool = False,
                    simulate: Callable | None = None, done: Mapping[int, dict] | None = None,
                    on_row: Callable | None = None) -> list[dict]:
    """``search_point`` of every grid point (planner.sweep.run_tasks: processes or Ray; ``done``
    and ``on_row`` as there)."""
    tasks = [SearchTask(i, dict(p), base, constraints, simulate) for i, p in enumerate(points)]
    return run_tasks(tasks, search_point, jobs=jobs, backend=backend, address=address, progress=progress,
                     done=done, on_row=on_row)
