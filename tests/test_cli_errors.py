"""The CLI's error contract, command by command.

A user's mistake (an InputError, raised where the value is checked, or a file that is missing) is
one line on stderr and exit code 2. Any other exception, ValueError included, escapes the router
with its traceback (exit 1 from the interpreter): an internal bug never looks like a user mistake.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.cli import COMMANDS, main
from kvsim.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
SPEC = "sharegpt:rate=2,n=5,seed=0"
POOL = ["--num-blocks", "200", "--step-s", "0.01", "--quiet"]


def user_mistakes(tmp: Path) -> dict[str, list[list[str]]]:
    a_file = tmp / "a_file"
    a_file.write_text("x")
    missing = str(tmp / "missing.csv")
    return {
        "replay": [["replay", SPEC, *POOL, "--watermark", "2", "--out", str(tmp / "r.json")],
                   ["replay", SPEC, *POOL, "--block-size", "7", "--out", str(tmp / "r.json")],
                   ["replay", missing, *POOL, "--out", str(tmp / "r.json")],
                   ["replay", SPEC, "--num-blocks", "200", "--cost-table", missing, "--out",
                    str(tmp / "r.json")],
                   ["replay", SPEC, *POOL, "--snapshot-times-s", "-1", "--out", str(tmp / "r.json")],
                   ["replay", SPEC, "--model", "gpt-5", "--out", str(tmp / "r.json")],
                   # offload tiers: bad sizes and bandwidths, a disk without its CPU tier
                   ["replay", SPEC, *POOL, "--cpu-offload-gib", "-4", "--out", str(tmp / "r.json")],
                   ["replay", SPEC, *POOL, "--cpu-offload-gib", "4", "--offload-bandwidth-gbps",
                    "0", "--out", str(tmp / "r.json")],
                   ["replay", SPEC, *POOL, "--disk-offload-gib", "100", "--out",
                    str(tmp / "r.json")],
                   ["replay", SPEC, *POOL, "--cpu-offload-gib", "1e9", "--out",
                    str(tmp / "r.json")],
                   ["replay", SPEC, *POOL, "--allocator", "max", "--cpu-offload-gib", "4",
                    "--out", str(tmp / "r.json")]],
        "compare": [["compare", SPEC, *POOL, "--allocators", "paged,slab"],
                    ["compare", SPEC, "--block-size", "48"]],
        "bench": [["bench", SPEC, *POOL, "--goodput", "itl:5"], ["bench", SPEC, *POOL, "--compare", missing],
                  ["bench", "random:n=10,concurrency=2", *POOL, "--max-concurrency", "3"]],
        "workload": [["workload", "sharegpt:rate=1,colour=red"], ["workload", missing]],
        "capacity": [["capacity", "--model", "gpt-5"], ["capacity", "--hf-config", missing],
                     ["capacity", "--gpu-memory-gib", "40"],
                     ["capacity", "--model", "Llama-3.1-8B", "--eager-launch-ms", "20"]],   # nothing to time
        "plan": [["plan", SPEC, "--sweep", "colour=red"], ["plan", SPEC, "--slo", "ttft<"],
                 ["plan", SPEC, "--address", "10.0.0.1:6379"],     # ignored without Ray
                 ["plan", SPEC, "--out", str(a_file), "--quiet"]],
        "cache-curve": [["cache-curve", SPEC, "--target-hit-rate", "1.5"],
                        ["cache-curve", SPEC, "--cpu-offload-gib", "0.0001"],
                        ["cache-curve", SPEC, "--csv", str(tmp / "c.txt")],
                        ["cache-curve", missing],
                        # its requests are held in a list: a spec too large is refused first
                        ["cache-curve", "sharegpt:rate=2,n=100000000000,seed=0"]],
        "reproduce": [["reproduce", "vllm-paper", "--out", str(a_file), "--quiet"]],
        "profile": [["profile", "--model", "OPT-13B", "--out", str(tmp / "t.csv"), "--device", "cpu"],
                    ["profile", "--hf-config", missing, "--out", str(tmp / "t.csv"), "--device", "cpu"],
                    ["profile", "--out", str(a_file / "t.csv"), "--device", "cpu"]],
        "validate": [["validate", "--snapshot", str(tmp / "missing.npz"), "--device", "cpu"],
                     ["validate", SPEC, "--at", "1"]],
    }


def test_every_command_but_the_dashboard_has_a_case(tmp_path):
    assert set(user_mistakes(tmp_path)) == set(COMMANDS) - {"dashboard"}


@pytest.mark.parametrize("command", ["replay", "compare", "workload", "capacity", "plan",
                                     "reproduce", "validate", "cache-curve"])
def test_a_user_mistake_is_one_line_and_exit_2(command, tmp_path, capsys):
    for argv in user_mistakes(tmp_path)[command]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("kvsim: error: ") and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "r.json").exists()  # nothing is written by a run that fails its checks


def test_a_missing_file_names_the_path(tmp_path, capsys):
    missing = tmp_path / "nope.csv"
    assert main(["replay", SPEC, "--num-blocks", "100", "--cost-table", str(missing),
                 "--out", str(tmp_path / "r.json")]) == 2
    assert str(missing) in capsys.readouterr().err
    assert main(["capacity", "--hf-config", str(missing)]) == 2
    assert f"{missing}: cannot read" in capsys.readouterr().err


def _internal_bug(*args, **kwargs):
    raise ValueError("an internal bug, not the user's fault")


# (command line, module attribute the command calls) for an injected internal ValueError
INTERNAL = {
    "replay": (["replay", SPEC, *POOL, "--out", "{tmp}/r.json"], "kvsim.planner.service.build_engine"),
    "compare": (["compare", SPEC, *POOL], "kvsim.planner.engine_setup.build_engine"),
    "workload": (["workload", SPEC], "kvsim.workloads.stats.workload_stats"),
    "capacity": (["capacity"], "kvsim.planner.engine_setup.build_engine"),
    # inside a sweep point: an internal error must stop the sweep, not become an "error" row
    "plan": (["plan", SPEC, "--quiet"], "kvsim.planner.sweep.build_engine"),
    "reproduce": (["reproduce", "vllm-paper", "--out", "{tmp}/repro", "--quiet"],
                  "kvsim.planner.reproduce.run_reproduction"),
    "validate": (["validate", SPEC, "--at", "1", "--num-blocks", "200", "--device", "cpu"],
                 "kvsim.planner.service.build_engine"),
    "cache-curve": (["cache-curve", SPEC], "kvsim.planner.cache_plan.curve_report"),
}


@pytest.mark.parametrize("command", sorted(INTERNAL))
def test_an_internal_value_error_escapes_with_its_traceback(command, tmp_path, monkeypatch):
    import importlib

    argv, target = INTERNAL[command]
    module, _, name = target.rpartition(".")
    monkeypatch.setattr(importlib.import_module(module), name, _internal_bug)
    with pytest.raises(ValueError, match="an internal bug") as err:
        main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert not isinstance(err.value, InputError)


def test_the_process_prints_the_traceback_and_exits_1(tmp_path):
    code = ("import sys\n"
            "import kvsim.planner.engine_setup as setup\n"
            "def bug(**kwargs):\n"
            "    raise ValueError('an internal bug')\n"
            "setup.build_engine = bug\n"
            "from kvsim.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    out = subprocess.run([sys.executable, "-c", code, "capacity"], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 1
    assert "Traceback (most recent call last)" in out.stderr
    assert "ValueError: an internal bug" in out.stderr and "kvsim: error" not in out.stderr


def test_argparse_checks_numbers_before_any_work(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["replay", SPEC, "--num-blocks", "0", "--out", "x.json"])
    assert exc.value.code == 2
    assert "--num-blocks: must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("command", [*COMMANDS, None])
def test_a_flag_error_is_two_lines_not_the_usage_block(command, capsys):
    """argparse prints every flag's usage before the error (about 30 lines for replay); kvsim
    prints a usage line with the positionals and the error, naming --help (issue 29 item 10)."""
    argv = ([command] if command else []) + ["--no-such-flag-anywhere"]
    if command in ("replay", "compare", "bench", "plan", "workload", "cache-curve"):
        argv.insert(1, SPEC)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.splitlines()
    prog = f"kvsim {command}" if command else "kvsim"
    assert len(err) == 2, err
    assert err[0].startswith(f"usage: {prog} [flags]")
    assert err[1].startswith(f"{prog}: error: ") and err[1].endswith(f"(`{prog} --help` lists the flags)")


def test_validate_refuses_a_negative_time_before_any_work(capsys):
    # it was a ValueError traceback from the simulator's snapshot times
    with pytest.raises(SystemExit) as exit_:
        main(["validate", SPEC, "--at", "-1", "--num-blocks", "200", "--device", "cpu"])
    assert exit_.value.code == 2
    assert "argument --at: must be >= 0, got -1" in capsys.readouterr().err


def test_capacity_refuses_step_time_flags_without_a_workload_and_takes_them_with_one(capsys):
    """kvsim capacity replays only a WORKLOAD: a step-time flag without one is a one-line error that
    names it (it would be silently ignored); with a workload the replay takes it."""
    assert main(["capacity", "--model", "Llama-3.1-8B", "--step-s", "0.02", "--first-use-compiles"]) == 2
    err = capsys.readouterr().err
    assert "--step-s, --first-use-compiles price a replay's steps" in err and err.count("\n") == 1
    assert main(["capacity", "--model", "Llama-3.1-8B"]) == 0
    capsys.readouterr()
    assert main(["capacity", "--model", "Llama-3.1-8B", "random:n=4,isl=64,osl=4,concurrency=2,seed=1",
                 "--step-s", "0.02", "--json"]) == 0
