"""argparse types for counts and sizes: a bad value is a usage error (exit 2) before any work.

Kept apart from ``options`` (which imports the planner's presets for its help texts) so that a
command needing only these, such as ``kvsim workload``, starts without the planner.
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
