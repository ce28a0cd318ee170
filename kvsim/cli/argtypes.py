"""argparse types for counts and sizes (a bad value is a usage error, exit 2, before any work)
and the flag groups that need nothing else (``--rate``/``--rate-scale``).

Kept apart from ``options`` (which imports the planner's presets for its help texts; it
re-exports these) so that a command needing only these, such as ``kvsim workload``, starts
without the planner.
"""
from __future__ import annotations

import argparse
import math


def _number(kind, lo, *, strict: bool):
    """An argparse type: a ``kind`` >= lo (> lo when strict); argparse reports a bad value as a
    usage error (exit 2) before any work starts."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not {'an integer' if kind is int else 'a number'}: {text!r}") from None
        if not math.isfinite(value) or value < lo or (strict and value == lo):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {lo}, got {text}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


positive_int = _number(int, 1, strict=False)
nonneg_int = _number(int, 0, strict=False)
positive_float = _number(float, 0, strict=True)


def add_rate_args(p: argparse.ArgumentParser) -> None:
    """``--rate`` and ``--rate-scale``: one meaning in every command (workloads.retime)."""
    g = p.add_argument_group("arrival rate (the same in every command)")
    g.add_argument("--rate", type=positive_float, metavar="PER_S",
                   help="give the workload this many requests/s: a spec's rate= is replaced, a "
                        "trace without timestamps gets Poisson arrivals, a timestamped trace is "
                        "re-timed to this mean rate")
    g.add_argument("--rate-scale", type=positive_float, metavar="X",
                   help="X times the workload's own rate (or --rate's): a trace keeps its own "
                        "arrival pattern, its times divided by X ('what if traffic doubles?': 2)")
