"""``kvsim profile --engine vllm`` (issue 24): real vLLM's own steps into a cost table. The table
from runs already served is the shipped one; a profile starts the engines of the shipped tables'
method (grid, idle, hot; waves with async off on request) through the harness in vLLM's own
Python, lays their runs out as bench/results/ holds them, keeps finished runs across a second
try, and says in one line what is wrong with its input. No GPU: a stand-in for vLLM's Python
serves the committed runs."""
from __future__ import annotations

import gzip
import json
import shutil
import stat
import sys
from pathlib import Path

import pytest

from kvsim.cli import main
from kvsim.errors import InputError
from kvsim.cli import profile_vllm

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "bench" / "results" / "vllm_h100"
SHIPPED = ROOT / "tables" / "vllm" / "qwen3-30b-a3b-fine_H100.csv"
H100_NAME = "bench/results/vllm_h100/qwen3-30b-a3b"

# a stand-in for a Python with vLLM: answers the probe, and for a harness call copies the
# committed run of the same plan (requests.jsonl unpacked, as the harness writes it) into --out,
# after logging its command line and PYTHONPATH
FAKE = '''#!{python}
import gzip, json, os, shutil, sys
from pathlib import Path
if sys.argv[1] == "-c":
    print({said!r})
    sys.exit(0)
args = dict(zip(sys.argv[2::2], sys.argv[3::2]))
with open({calls!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "pythonpath": os.environ["PYTHONPATH"]}}) + "\\n")
name, out = args["--name"], Path(args["--out"])
suffix = name.split("qwen3-30b-a3b", 1)[1]
if {fail!r} and suffix == {fail!r}:
    print("CUDA out of memory")
    sys.exit(1)
src = Path({h100!r}) / ("qwen3-30b-a3b" + (suffix or "-fine"))
items = list(src.iterdir())
if suffix == "-noasync-wave":     # the closed loop the profile serves beside the waves
    items.append(Path({h100!r}) / "qwen3-30b-a3b-noasync" / "cl-1024-128-c64")
for item in items:
    if item.is_dir():
        shutil.copytree(item, out / item.name)
        for packed in (out / item.name).glob("requests.jsonl.gz"):
            (out / item.name / "requests.jsonl").write_bytes(gzip.decompress(packed.read_bytes()))
            packed.unlink()
    elif item.name != "vllm.log.gz":
        shutil.copy(item, out / item.name)
'''


def fake_vllm(tmp_path: Path, fail: str = "", said: str = "vllm 0.23.0, torch 2.11.0, NVIDIA H100 80GB HBM3") -> Path:
    py = tmp_path / "vllm-python"
    py.write_text(FAKE.format(python=sys.executable, said=said, calls=str(tmp_path / "calls.jsonl"),
                              fail=fail, h100=str(H100)))
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return py


def calls(tmp_path: Path) -> list[dict]:
    log = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def shipped() -> str:
    """The shipped table, its async-off line naming one folder, as a profile's does (the profile
    serves the closed loop that line is also fitted on in the same engine as the waves)."""
    return SHIPPED.read_text().replace(f" and {H100_NAME}-noasync/cl-1024-128-c64", "")


def as_shipped(table: Path, runs: Path) -> str:
    """A table made of ``runs`` as if its runs were the shipped ones (its lines name their folders)."""
    return table.read_text().replace(f"{runs.resolve().as_posix()}/qwen3-30b-a3b/grid", f"{H100_NAME}-fine/grid") \
        .replace(f"{runs.resolve().as_posix()}/qwen3-30b-a3b", H100_NAME)


def test_the_table_from_runs_already_served_is_the_shipped_one(tmp_path):
    out = tmp_path / "t.csv"
    assert main(["profile", "--engine", "vllm", "--from-runs", str(H100 / "qwen3-30b-a3b-fine"),
                 "--out", str(out)]) == 0
    assert out.read_bytes() == SHIPPED.read_bytes()


def test_a_profile_serves_grid_idle_and_hot_in_vllms_python_and_writes_their_table(tmp_path, capsys):
    py = fake_vllm(tmp_path)
    out, runs = tmp_path / "qwen_H100.csv", tmp_path / "runs"
    argv = ["profile", "--engine", "vllm", "--model", "Qwen3-30B-A3B", "--out", str(out), "--runs", str(runs),
            "--vllm-python", str(py), "--max-num-seqs", "1024", "--measure-async-off"]
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "Qwen3-30B-A3B on vllm 0.23.0, torch 2.11.0, NVIDIA H100 80GB HBM3" in said
    made = calls(tmp_path)
    names = [c["argv"][c["argv"].index("--name") + 1] for c in made]
    assert names == ["qwen3-30b-a3b", "qwen3-30b-a3b-idle", "qwen3-30b-a3b-hot", "qwen3-30b-a3b-noasync-wave"]
    for c, plan in zip(made, ("grid", "idle", "hot", "wave")):
        argv_ = c["argv"]
        assert argv_[0] == str(profile_vllm.VLLM_GPU / "harness.py")
        assert argv_[argv_.index("--plan") + 1] == str(runs / "plans" / f"{plan}.json")
        assert argv_[argv_.index("--max-num-seqs") + 1] == "1024"
        assert argv_[argv_.index("--gpu-memory-utilization") + 1] == "0.9"
        assert ("--no-async" in argv_) == (plan == "wave")
        assert str(profile_vllm.VLLM_GPU / "plugin") in c["pythonpath"].split(":")   # the probe plugin
        model_dir = Path(argv_[argv_.index("--model-dir") + 1])
        assert json.loads((model_dir / "config.json").read_text())["model_type"] == "qwen3_moe"
    # the plans: the fine grid alone; the idle and hot plans served twice
    grid = json.loads((runs / "plans" / "grid.json").read_text())
    assert [e["kind"] for e in grid] == ["grid"] and [1, 256, 24] in grid[0]["decode"]
    idle = [e["name"] for e in json.loads((runs / "plans" / "idle.json").read_text())]
    assert idle == ["idle-prefill", "idle-prefill-again"]
    hot = [e["name"] for e in json.loads((runs / "plans" / "hot.json").read_text())]
    assert "hot-64" in hot and "hot-64-again" in hot
    wave = [e["name"] for e in json.loads((runs / "plans" / "wave.json").read_text())]
    assert "wave-768-x4-o2" in wave and "cl-1024-128-c64" in wave     # the async-off line's fit set
    # laid out as bench/results/ holds runs: requests packed, the table as grid_table makes it
    assert (runs / "qwen3-30b-a3b-idle" / "idle-prefill" / "requests.jsonl.gz").is_file()
    assert not list(runs.glob("*/*/requests.jsonl"))
    assert f"# source: {runs.resolve().as_posix()}/qwen3-30b-a3b/grid" in out.read_text()
    assert as_shipped(out, runs) == shipped()


def test_a_second_try_keeps_the_finished_runs_and_serves_the_rest(tmp_path, capsys):
    out, runs = tmp_path / "t.csv", tmp_path / "runs"
    argv = ["profile", "--engine", "vllm", "--model", "Qwen3-30B-A3B", "--out", str(out), "--runs", str(runs),
            "--measure-async-off"]
    assert main([*argv, "--vllm-python", str(fake_vllm(tmp_path, fail="-hot"))]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "qwen3-30b-a3b-hot: the vLLM engine stopped (exit 1)" in err
    assert str(runs / "qwen3-30b-a3b-hot" / "vllm.log") in err and not out.exists()
    assert "CUDA out of memory" in (runs / "qwen3-30b-a3b-hot" / "vllm.log").read_text()
    assert len(calls(tmp_path)) == 3
    assert main([*argv, "--vllm-python", str(fake_vllm(tmp_path))]) == 0
    assert [c["argv"][c["argv"].index("--name") + 1] for c in calls(tmp_path)][3:] == \
        ["qwen3-30b-a3b-hot", "qwen3-30b-a3b-noasync-wave"]
    assert "qwen3-30b-a3b-idle: served already, kept" in capsys.readouterr().out
    assert as_shipped(out, runs) == shipped()
    assert main([*argv, "--vllm-python", str(fake_vllm(tmp_path)), "--quiet"]) == 0     # all kept, silent
    assert capsys.readouterr().out == "" and len(calls(tmp_path)) == 5


def test_ctrl_c_keeps_the_finished_runs(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "runs"
    served = []

    def serve(py, engine, runs_, model_dir, args, say):
        if served:
            raise KeyboardInterrupt
        served.append(engine.name)
        shutil.copytree(H100 / "qwen3-30b-a3b-fine", runs_ / engine.name)

    monkeypatch.setattr(profile_vllm, "serve", serve)
    assert main(["profile", "--engine", "vllm", "--model", "Qwen3-30B-A3B", "--out", str(tmp_path / "t.csv"),
                 "--runs", str(runs), "--vllm-python", str(fake_vllm(tmp_path))]) == 130
    assert "the finished runs stay under" in capsys.readouterr().err
    assert profile_vllm.finished(runs / "qwen3-30b-a3b") and served == ["qwen3-30b-a3b"]


@pytest.mark.parametrize("extra, message", [
    (["--repeat", "3"], "field 'repeat': --repeat is an option of kvsim's own executor"),
    (["--block-size", "32"], "--block-size is an option of kvsim's own executor"),
    (["--vllm-python", "/nonexistent/python"], "field 'vllm_python': /nonexistent/python does not run"),
    (["--model", "Qwen2.5-7B"], "Qwen2.5-7B: no config.json bundled for vLLM's dummy weights; give the model's own "
                                "with --hf-config"),
    (["--hf-config", "/nonexistent/config.json"], "/nonexistent/config.json: no such file"),
])
def test_bad_input_is_one_line_before_any_engine_starts(tmp_path, capsys, extra, message):
    py = fake_vllm(tmp_path)
    argv = ["profile", "--engine", "vllm", "--out", str(tmp_path / "t.csv")]
    if "--vllm-python" not in extra:
        argv += ["--vllm-python", str(py)]
    assert main(argv + extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not calls(tmp_path) and not (tmp_path / "t.runs").exists()


def test_a_python_without_vllm_or_a_gpu_is_refused(tmp_path, capsys, monkeypatch):
    argv = ["profile", "--engine", "vllm", "--out", str(tmp_path / "t.csv")]
    assert main([*argv, "--vllm-python", sys.executable]) == 2      # kvsim's own: torch, no vLLM
    assert "cannot import vLLM and torch (ModuleNotFoundError: No module named 'vllm')" in capsys.readouterr().err
    assert main([*argv, "--vllm-python", str(fake_vllm(tmp_path, said="vllm 0.23.0, torch 2.11.0, NO-GPU"))]) == 2
    assert "sees no CUDA GPU" in capsys.readouterr().err
    monkeypatch.delenv("KVSIM_VLLM_PYTHON", raising=False)
    assert main(argv) == 2
    assert "give --vllm-python PY (or set KVSIM_VLLM_PYTHON)" in capsys.readouterr().err
    assert main(["profile", "--out", str(tmp_path / "t.csv"), "--from-runs", str(H100)]) == 2
    assert "--from-runs is an option of --engine vllm" in capsys.readouterr().err
    assert main(["profile", "--engine", "vllm", "--out", str(tmp_path / "t.csv"), "--from-runs", str(H100)]) == 2
    assert "no grid run here" in capsys.readouterr().err


def test_a_large_model_takes_the_idle_plans_longer_gaps(tmp_path):
    from kvsim.planner.presets import get_model

    assert profile_vllm.is_large(get_model("Qwen3-32B")) and profile_vllm.is_large(get_model("Llama-3.1-70B"))
    assert not profile_vllm.is_large(get_model("Qwen3-30B-A3B")) and not profile_vllm.is_large(get_model("Llama-3.1-8B"))
    profile_vllm.write_plans(tmp_path, "fine", True, 10240)
    times = [r[0] for r in json.loads((tmp_path / "idle.json").read_text())[0]["requests"]]
    assert min(b - a for a, b in zip(times, times[1:])) == pytest.approx(profile_vllm.LARGE_IDLE_GAPS_S[0])


def test_each_option_belongs_to_its_engines_and_the_other_refuses_it():
    """One table (kvsim.cli.profile_options.ENGINE_OPTIONS) says which engine takes each option: every option
    of `kvsim profile` but the common ones is in it, and one engine's option given to the other is
    refused by name."""
    import argparse

    from kvsim.cli import profile, profile_options

    p = argparse.ArgumentParser()
    profile.add_arguments(p)
    dests = {a.dest for a in p._actions if a.dest != "help"}
    assert dests - set(profile_options.ENGINE_OPTIONS) == {"engine", "model", "hf_config", "out", "quiet"}
    for opt, engines in profile_options.ENGINE_OPTIONS.items():
        for engine in {"kvsim", "vllm"} - set(engines):
            args = p.parse_args(["--out", "t.csv"])
            setattr(args, opt, "x")
            with pytest.raises(InputError, match=f"--{opt.replace('_', '-')} is an option of"):
                profile_options.settle_options(args, engine)
    args = p.parse_args(["--out", "t.csv", "--engine", "vllm"])
    profile_options.settle_options(args, "vllm")
    assert (args.grid, args.max_model_len, args.repeat) == ("fine", 10240, None)


def test_a_run_stopped_in_its_warm_up_is_not_finished(tmp_path):
    """The harness finishes a run stopped in its warm-up too (meta.json with its warm-up's steps):
    it served none of its plan, so it is not a finished run (kvsim profile serves it again)."""
    from kvsim.cli.profile_vllm import finished

    run = tmp_path / "engine"
    run.mkdir()
    assert not finished(run)
    (run / "meta.json").write_text(json.dumps({"workloads": {}, "warmup_steps": [600, 4201]}))
    assert not finished(run)
    (run / "meta.json").write_text(json.dumps({"workloads": {"grid": {"num_steps": 3}}}))
    assert finished(run)
