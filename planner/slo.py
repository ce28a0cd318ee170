"""Service-level objectives over sweep results: ``--slo "ttft_p99<2,preemptions=0"``.

A term is METRIC OP NUMBER[UNIT] with OP one of < <= > >= = == != and UNIT s or ms (seconds).
Metrics are looked up in a result row by name or by alias (``ttft_p99`` finds ``ttft_p99_s``),
so the SLO language does not depend on the exact summary key spelling.
"""
from __future__ import annotations

import math
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kvsim.errors import InputError

_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
        "=": operator.eq, "==": operator.eq, "!=": operator.ne}
_TERM = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|>=|==|!=|<|>|=)\s*"
                   r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(ms|s)?\s*$")

# short name -> candidate row keys, first match wins
METRIC_ALIASES: dict[str, tuple[str, ...]] = {
    "preemptions": ("num_preemptions", "preemptions"),
    "throughput": ("throughput_tokens_per_s", "output_throughput_tokens_per_s", "throughput"),
    "mean_running": ("mean_running_requests", "mean_num_running", "mean_running"),
    "max_running": ("max_running_requests", "max_num_running", "max_running"),
    "prefix_hit_rate": ("prefix_hit_rate", "prefix_cache_hit_rate"),
    # with offload tiers: GPU + CPU hits over prompt tokens, and the connector's own hit rate
    "combined_hit_rate": ("offload.combined_hit_rate",),
    "cpu_hit_rate": ("offload.hit_rate",),
}
for _m in ("ttft", "tpot", "e2e"):
    for _p in ("p50", "p90", "p99", "mean"):
        METRIC_ALIASES[f"{_m}_{_p}"] = (f"{_m}_{_p}_s", f"{_m}_s_{_p}", f"{_m}_{_p}",
                                         f"{_m}_s.{_p}", f"{_m}.{_p}")


@dataclass(frozen=True)
class Constraint:
    """One SLO term: ``metric op value`` (value in seconds for time metrics)."""

    metric: str
    op: str
    value: float

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"

    def holds(self, row: Mapping) -> bool:
        """Whether the row meets this term (a NaN metric never does)."""
        actual = resolve_metric(row, self.metric)
        return not math.isnan(actual) and _OPS[self.op](actual, self.value)


def parse_slo(text: str) -> tuple[Constraint, ...]:
    """Parse ``"ttft_p99<2,preemptions=0"`` into constraints.

    Raises:
        InputError: empty text or a malformed term (names the term and what was expected).
    """
    if text is None or not text.strip():
        raise InputError("empty SLO; expected e.g. 'ttft_p99<2,preemptions=0'", field="slo")
    out = []
    for i, term in enumerate(text.split(","), start=1):
        m = _TERM.match(term)
        if m is None:
            raise InputError(f"term {i} {term.strip()!r}: expected METRIC OP NUMBER with OP in "
                             f"{' '.join(_OPS)}, e.g. ttft_p99<2", field="slo")
        metric, op, number, unit = m.groups()
        value = float(number) / (1000.0 if unit == "ms" else 1.0)
        out.append(Constraint(metric, op, value))
    return tuple(out)


def resolve_metric(row: Mapping, name: str) -> float:
    """The value of metric ``name`` in a result row (exact key first, then aliases).

    Raises:
        InputError: no such column (lists the numeric columns that exist).
    """
    for key in (name, *METRIC_ALIASES.get(name, ())):
        if key in row and row[key] is not None:
            return float(row[key])
    numeric = sorted(k for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    raise InputError(f"unknown metric {name!r}; result columns: {', '.join(numeric)}", field="slo")


def meets(row: Mapping, constraints: tuple[Constraint, ...]) -> bool:
    """Whether a row meets every constraint."""
    return all(c.holds(row) for c in constraints)
