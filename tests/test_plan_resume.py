"""An interrupted `kvsim plan` loses no finished point (issue 29 item 8): each point goes to
--out's points.jsonl as it finishes, Ctrl-C says what was kept, --resume runs only the rest and
gives byte-identical outputs; a plan that wrote nothing leaves no folder behind."""
from __future__ import annotations

import json

import pytest

import kvsim.planner.sweep as sweep
from kvsim.cli import main

ARGV = ["plan", "sharegpt:rate=8,n=60,seed=2", "--model", "Llama-3.1-8B", "--gpu", "h100",
        "--max-model-len", "4096", "--sweep", "block_size=16,32,64,128", "--sweep",
        "gpu_memory_utilization=0.3,0.9", "--quiet"]
OUTPUTS = ("results.csv", "results.json", "plan.json", "report.html")
REAL = sweep.evaluate_point


def _interrupt_after(monkeypatch, n: int) -> list:
    """evaluate_point raises KeyboardInterrupt (Ctrl-C) when asked for its (n+1)-th point."""
    calls, real = [], REAL

    def counted(task):
        if len(calls) == n:
            raise KeyboardInterrupt
        calls.append(task.index)
        return real(task)

    monkeypatch.setattr(sweep, "evaluate_point", counted)
    return calls


def test_ctrl_c_keeps_the_finished_points_and_resume_runs_the_rest(tmp_path, monkeypatch, capsys):
    whole = tmp_path / "whole"
    assert main([*ARGV, "--out", str(whole)]) == 0
    out = tmp_path / "out"
    first = _interrupt_after(monkeypatch, 3)
    assert main([*ARGV, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"kvsim: interrupted; 3 of 8 points finished are kept in {out / 'points.jsonl'}" in err
    lines = (out / "points.jsonl").read_text().splitlines()
    assert [json.loads(ln)["index"] for ln in lines[1:]] == first == [0, 1, 2]
    second = _interrupt_after(monkeypatch, 100)
    assert main([*ARGV, "--out", str(out), "--resume"]) == 0
    assert second == [3, 4, 5, 6, 7]          # only the points not finished
    assert "resumed: 3 of 8 points" in capsys.readouterr().err
    for name in OUTPUTS:
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name
    assert not (out / "points.jsonl").exists()   # every point is in the results


def test_resume_refuses_another_plans_points(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    _interrupt_after(monkeypatch, 2)
    assert main([*ARGV, "--out", str(out)]) == 130
    other = [a if a != "block_size=16,32,64,128" else "block_size=16,32" for a in ARGV]
    assert main([*other, "--out", str(out), "--resume"]) == 2
    assert "is of another plan" in capsys.readouterr().err
    assert main([*ARGV, "--resume"]) == 2
    assert "--resume needs --out" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--sweep", "max_model_len=200000"], ["--backend", "ray"]])
def test_a_plan_that_writes_nothing_leaves_no_folder(tmp_path, flags, capsys, monkeypatch):
    """Every point impossible (no pool holds a 200k-token request), or Ray missing."""
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("no ray here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    out = tmp_path / "new" / "out"
    assert main([*ARGV, *flags, "--out", str(out)]) == 2
    assert not out.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("every point is impossible" in err or "needs Ray" in err)
