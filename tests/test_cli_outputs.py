"""Every command that writes: outputs checked before the work, result printed first, no result lost.

For each writing command (replay, compare, plan, reproduce, validate, cache-curve):
  * an output path that cannot be written is refused (one line, exit 2) before any simulation;
  * a write that fails after the work (a full disk: /dev/full) does not lose the result: the
    table is printed, the other files are written, and one line names the path (exit 2);
and the same seed gives byte-identical files (plan's report.html included).
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from kvsim.cli import main

SPEC = "sharegpt:rate=4,n=30,seed=1"
POOL = ["--num-blocks", "300", "--max-model-len", "4784", "--step-s", "0.01", "--quiet"]   # 4,784: the most 299 usable blocks start with
PLAN = ["plan", SPEC, "--max-model-len", "4096", "--sweep", "block_size=16,32", "--quiet"]
FULL = Path("/dev/full")


def _no_work(*args, **kwargs):
    raise AssertionError("the work started before the outputs were checked")


# (argv with {out}: an output path, the function the work starts with)
COMMANDS = {
    "replay": (["replay", SPEC, *POOL, "--out", "{out}"], "kvsim.simulator.simulate"),
    "replay-timeseries": (["replay", SPEC, *POOL, "--timeseries", "{out}.csv"], "kvsim.simulator.simulate"),
    "compare": (["compare", SPEC, *POOL, "--allocators", "paged,max", "--json", "{out}"],
                "kvsim.simulator.simulate"),
    "plan": ([*PLAN, "--out", "{out}"], "kvsim.planner.sweep.run_sweep"),
    "reproduce": (["reproduce", "vllm-paper", "--quick", "--quiet", "--out", "{out}"],
                  "kvsim.planner.reproduce.run_reproduction"),
    "validate": (["validate", SPEC, "--at", "2", "--num-blocks", "300", "--device", "cpu",
                  "--json", "{out}"], "kvsim.simulator.simulate"),
    "cache-curve": (["cache-curve", SPEC, "--num-blocks", "300", "--csv", "{out}.csv"],
                    "kvsim.planner.cache_plan.curve_report"),
    "cache-curve-html": (["cache-curve", SPEC, "--num-blocks", "300", "--html", "{out}.html"],
                         "kvsim.planner.cache_plan.curve_report"),
    "replay-offload": (["replay", SPEC, *POOL, "--cpu-offload-gib", "2", "--out", "{out}"],
                       "kvsim.simulator.simulate"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unwritable_output_is_refused_before_the_work(command, tmp_path, monkeypatch, capsys):
    argv, work = COMMANDS[command]
    module, _, name = work.rpartition(".")
    monkeypatch.setattr(importlib.import_module(module), name, _no_work)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    # under a regular file: the directory cannot be created, as root too
    out = str(a_file / "sub" / "out.json")
    assert main([a.replace("{out}", out) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsim: error: ") and err.count("\n") == 1 and "a_file" in err


def test_a_file_inside_the_output_folder_that_cannot_be_written_is_refused_first(tmp_path, monkeypatch,
                                                                                 capsys):
    import kvsim.planner.sweep as sweep

    monkeypatch.setattr(sweep, "run_sweep", _no_work)
    out = tmp_path / "plan"
    (out / "report.html").mkdir(parents=True)   # a folder where the report goes
    assert main([*PLAN, "--out", str(out)]) == 2
    assert "report.html: is a directory" in capsys.readouterr().err


needs_dev_full = pytest.mark.skipif(not FULL.exists(), reason="/dev/full is absent")


@needs_dev_full
def test_replay_prints_its_summary_and_writes_the_rest_when_a_write_fails(tmp_path, capsys):
    ts = tmp_path / "ts.csv"
    rc = main(["replay", SPEC, *POOL, "--out", str(FULL), "--timeseries", str(ts)])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out.startswith("clock: ") and out.splitlines()[1].startswith("30 requests finished")
    assert "-> /dev/full" in out
    assert "TTFT p50 (s)" in out   # "the results were printed above": they were (issue 29 item 5)
    assert err.count("\n") == 1 and "could not write /dev/full (No space left on device)" in err
    assert ts.stat().st_size > 100   # the other output was written


@needs_dev_full
def test_compare_prints_its_table_when_its_json_cannot_be_written(capsys):
    rc = main(["compare", SPEC, *POOL, "--allocators", "paged,max", "--json", str(FULL)])
    out, err = capsys.readouterr()
    assert rc == 2 and "internal frag." in out and "could not write /dev/full" in err


@needs_dev_full
def test_plan_prints_its_table_and_writes_the_other_files_when_one_write_fails(tmp_path, capsys):
    out_dir = tmp_path / "plan"
    out_dir.mkdir()
    os.symlink(FULL, out_dir / "report.html")   # the last file written meets a full disk
    rc = main([*PLAN, "--out", str(out_dir)])
    out, err = capsys.readouterr()
    assert rc == 2
    assert "block_size" in out and "mean_running" in out   # the table
    assert err.count("\n") == 1 and f"could not write {out_dir}/report.html" in err
    for name in ("results.csv", "results.parquet", "results.json", "plan.json"):
        assert (out_dir / name).stat().st_size > 0, name


@needs_dev_full
def test_reproduce_prints_its_report_when_a_write_fails(tmp_path, monkeypatch, capsys):
    import kvsim.planner.reproduce as rp
    from test_reproduce import _results

    monkeypatch.setattr(rp, "run_reproduction", lambda config, progress: _results(vllm=12.34))
    out_dir = tmp_path / "repro"
    out_dir.mkdir()
    os.symlink(FULL, out_dir / "report.md")
    rc = main(["reproduce", "vllm-paper", "--quick", "--quiet", "--out", str(out_dir)])
    out, err = capsys.readouterr()
    assert rc == 2 and "| Orca (Max) | paper |" in out   # the report, on the terminal
    assert f"could not write {out_dir}/report.md" in err
    assert (out_dir / "results.json").stat().st_size > 0 and (out_dir / "report.html").stat().st_size > 0


@needs_dev_full
def test_cache_curve_prints_its_curve_and_writes_the_csv_when_the_figure_cannot_be_written(tmp_path,
                                                                                           capsys):
    csv, html = tmp_path / "curve.csv", tmp_path / "curve.html"
    os.symlink(FULL, html)
    rc = main(["cache-curve", SPEC, "--num-blocks", "300", "--min-sizes", "3", "--csv", str(csv),
               "--html", str(html)])
    out, err = capsys.readouterr()
    assert rc == 2 and "LRU hit rate" in out
    assert err.count("\n") == 1 and f"could not write {html} (No space left on device)" in err
    assert f"written: {csv}" in err and csv.read_text().startswith("cache_blocks,")


@needs_dev_full
def test_validate_prints_its_table_when_its_json_cannot_be_written(capsys):
    rc = main(["validate", SPEC, "--at", "2", "--num-blocks", "300", "--device", "cpu",
               "--json", str(FULL)])
    out, err = capsys.readouterr()
    assert rc == 2 and "seq_id" in out and "could not write /dev/full" in err


def test_plan_outputs_are_byte_identical_for_a_seed(tmp_path, capsys):
    """report.html included: its plotly divs carry fixed ids, and plan.json no wall clock."""
    for name in ("a", "b"):
        assert main([*PLAN, "--slo", "ttft_p99<5", "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert {"report.html", "plan.json", "results.csv", "results.json", "results.parquet"} <= set(files)
    for name in files:
        if name != "timings.csv":   # wall-clock time, by design
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    html = (tmp_path / "a" / "report.html").read_text()
    assert 'id="kvsim-plan-0"' in html and "overflow-x:auto" in html


def test_replay_without_out_prints_the_summary_table(capsys):
    assert main(["replay", SPEC, *POOL]) == 0
    out = capsys.readouterr().out
    assert out.startswith("clock: ") and out.splitlines()[1].startswith("30 requests finished")
    assert "->" not in out.splitlines()[1]
    assert "TTFT p50 (s)" in out and "token states" in out and "%" in out


def test_replay_prints_the_same_summary_with_and_without_out(tmp_path, capsys):
    """--help says the summary is printed either way; with --out it was one line (issue 29 item 5)."""
    assert main(["replay", SPEC, *POOL]) == 0
    without = capsys.readouterr().out.splitlines()
    assert main(["replay", SPEC, *POOL, "--out", str(tmp_path / "r.json")]) == 0
    with_out = capsys.readouterr().out.splitlines()
    assert len(with_out) == len(without) > 20
    assert [ln for ln in with_out if "wall" not in ln] == [ln for ln in without if "wall" not in ln]


def test_the_progress_bar_knows_the_total(capsys, monkeypatch):
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)   # the bar is for a terminal
    assert main(["replay", SPEC, "--num-blocks", "300", "--step-s", "0.01"]) == 0
    assert "/30 " in capsys.readouterr().err   # tqdm's "n/total" with the spec's n=30


def test_a_closed_pipe_is_not_a_traceback():
    import subprocess
    import sys

    proc = subprocess.run(f"{sys.executable} -m kvsim.cli capacity | head -1", shell=True,
                          capture_output=True, text=True)
    assert proc.stdout.startswith("model ") and "Traceback" not in proc.stderr


@needs_dev_full
def test_profile_prints_its_table_when_it_cannot_be_written(tmp_path):
    """kvsim profile (CPU interpreter, a one-layer model): the measured table reaches the terminal."""
    import json
    import subprocess
    import sys

    from test_profile import TINY_CONFIG

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_CONFIG))
    proc = subprocess.run([sys.executable, "-m", "kvsim.cli", "profile", "--hf-config", str(cfg), "--out",
                           str(FULL), "--device", "cpu", "--max-num-seqs", "2", "--max-num-batched-tokens", "32",
                           "--max-model-len", "128", "--repeat", "1", "--quiet"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "could not write /dev/full" in proc.stderr
    assert "# command: kvsim profile" in proc.stdout and "step_s" in proc.stdout


def test_ctrl_c_on_replay_prints_the_summary_so_far(monkeypatch, tmp_path, capsys):
    """Issue 29 item 8: Ctrl-C on replay prints the partial summary (then exit 130), and writes
    no file that could pass for the whole run's."""
    from kvsim.simulator.engine import Simulation

    arrive, seen = Simulation._arrive, []

    def interrupted(self, req, t_ns):
        if len(seen) == 20:
            raise KeyboardInterrupt
        seen.append(req)
        arrive(self, req, t_ns)

    monkeypatch.setattr(Simulation, "_arrive", interrupted)
    out = tmp_path / "r.json"
    assert main(["replay", SPEC, *POOL, "--out", str(out)]) == 130
    printed, err = capsys.readouterr()
    first = printed.splitlines()[0]
    assert first.startswith("interrupted at ") and "no file written" in first
    finished = int(first.split("(")[1].split()[0])
    assert 0 < finished < 20 and "TTFT p50 (s)" in printed
    assert err.strip().endswith("kvsim: interrupted") and not out.exists()
