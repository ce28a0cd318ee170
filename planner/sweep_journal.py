"""A sweep's finished points, kept as they finish: ``kvsim plan --out DIR`` writes each point's row to
``DIR/points.jsonl`` the moment it is done, so Ctrl-C (or a crash, or a machine taken away) after
four of sixteen points loses nothing, and ``--resume`` runs only the points not yet in it.

The first line names the plan (``fingerprint``: the shared configuration, the swept axes, the
SLO searched); a resumed plan must be the same plan, point for point. Rows are JSON (Python's
float repr round-trips exactly), so a resumed plan's outputs are byte-identical to a plan run at
one go.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path

from kvsim.errors import InputError

NAME = "points.jsonl"


def _plain(value):
    """numpy scalars as Python numbers (a row may hold a numpy float64)."""
    if hasattr(value, "item"):
        return value.item()
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def fingerprint(base, axes: Mapping, search=None) -> str:
    """What makes two plans the same plan (``PlanBase``, the axes, the searched SLO), as text."""
    return json.dumps({"base": dataclasses.asdict(base), "sweep": axes,
                       "max_rate_under": None if search is None else [str(c) for c in search]},
                      sort_keys=True, default=str)


class SweepJournal:
    """``DIR/points.jsonl``: the header, then one ``{"index", "params", "row"}`` line per finished
    point (in the order they finished)."""

    def __init__(self, directory: str | os.PathLike, plan: str):
        self.path = Path(directory) / NAME
        self.plan = plan
        self.num_points = 0    # finished points in the file

    def load(self, points: list[Mapping]) -> dict[int, dict]:
        """The rows already finished, by point index, for ``--resume``.

        Raises:
            InputError: no journal, or one of another plan (naming what differs is left to the
                user: the header holds the plan).
        """
        if not self.path.exists():
            raise InputError(f"--resume: {self.path} does not exist (no plan was started in this --out)")
        done: dict[int, dict] = {}
        with open(self.path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        if not lines or json.loads(lines[0]).get("plan") != self.plan:
            raise InputError(f"--resume: {self.path} is of another plan (workload, flags or sweep differ); "
                             "run it without --resume to start afresh")
        for number, line in enumerate(lines[1:], 2):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:   # the last line of an interrupted write
                if number == len(lines):
                    break
                raise InputError(f"--resume: {self.path}:{number}: not JSON") from None
            index = entry["index"]
            if not 0 <= index < len(points) or entry["params"] != json.loads(json.dumps(
                    dict(points[index]), default=_plain)):
                raise InputError(f"--resume: {self.path}:{number}: point {index} is not this plan's")
            done[index] = entry["row"]
        return done

    def start(self, done: Mapping[int, dict], points: list[Mapping]) -> None:
        """Write the header and the rows kept (a fresh plan: the header alone)."""
        with open(self.path, "w", encoding="utf-8") as f:
            f.write(json.dumps({"plan": self.plan}) + "\n")
            for index in sorted(done):
                f.write(self._line(index, points[index], done[index]))
        self.num_points = len(done)

    def add(self, index: int, params: Mapping, row: Mapping) -> None:
        """Append one finished point, flushed to the disk before the next one runs."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(self._line(index, params, row))
            f.flush()
            os.fsync(f.fileno())
        self.num_points += 1

    @staticmethod
    def _line(index: int, params: Mapping, row: Mapping) -> str:
        return json.dumps({"index": index, "params": dict(params), "row": dict(row)}, default=_plain) + "\n"
