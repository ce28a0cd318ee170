"""bench/replay_speed.py --against: old and new alternate in every mode asked for (--modes), each
case and mode a row of its own."""
from __future__ import annotations

import sys

from bench.replay_speed import compare_against


def test_against_runs_each_case_in_every_mode(capsys):
    assert compare_against(sys.executable, ["sharegpt-10k"], 1, ("sync", "async")) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| sharegpt")]
    assert [r[1] for r in rows] == ["sync", "async"]
    assert all(r[-1].rstrip(" |") == "yes" for r in rows)     # the same code on both sides: equal summaries
