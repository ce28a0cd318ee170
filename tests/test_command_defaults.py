"""One default per setting: the same model and GPU give the same engine in every command
(issue 29 item 7: capacity took vLLM's max_num_seqs 1024 for an H100, replay EngineConfig's 256, so
the two sized different pools, 10,193 against 10,269 blocks, and gave different p99 TTFTs)."""
from __future__ import annotations

import json

import pytest

from kvsim.cli import main

SPEC = "sharegpt:rate=4,n=40,seed=0"
KEYS = ("num_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len")


def _capacity(args, capsys) -> dict:
    assert main(["capacity", *args, "--json"]) == 0
    c = json.loads(capsys.readouterr().out)["capacity"]
    return {"num_blocks": c["num_gpu_blocks"], **{k: c[k] for k in KEYS[1:]}}


@pytest.mark.parametrize("args", [["--model", "Llama-3.1-8B", "--gpu", "h100"],
                                  ["--model", "Llama-3.1-8B", "--gpu", "a100-40gb", "--max-model-len", "8192"],
                                  ["--model", "Qwen2.5-7B", "--gpu", "h200", "--kv-dtype", "fp8"]])
def test_capacity_replay_and_bench_size_the_same_engine(args, tmp_path, capsys):
    want = _capacity(args, capsys)
    for command in ("replay", "bench"):
        out = tmp_path / f"{command}.json"
        flag = "--out" if command == "replay" else "--result-json"
        assert main([command, SPEC, *args, "--quiet", flag, str(out)]) == 0
        capsys.readouterr()
        data = json.loads(out.read_text())
        engine = (data["config"] if command == "replay" else data["kvsim"])["engine"]
        assert {k: engine[k] for k in KEYS} == want, command


def test_a_flag_given_wins_over_the_gpus_default(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["replay", SPEC, "--model", "Llama-3.1-8B", "--gpu", "h100", "--max-num-seqs", "256",
                 "--quiet", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["engine"]["max_num_seqs"] == 256


def test_the_roofline_efficiency_knobs_reach_every_commands_clock(tmp_path, capsys):
    """Issue 29 item 9: the roofline ran at 100 % of the datasheet with no knob to lower it."""
    knobs = ["--bandwidth-efficiency", "0.8", "--flops-efficiency", "0.6", "--step-overhead-ms", "3"]
    said = "(80% and 60% of the datasheet), 3 ms a step"
    assert main(["replay", SPEC, "--quiet", *knobs]) == 0
    assert said in capsys.readouterr().out.splitlines()[0]
    slow, fast = tmp_path / "slow.json", tmp_path / "fast.json"
    assert main(["replay", SPEC, "--quiet", *knobs, "--out", str(slow)]) == 0
    assert main(["replay", SPEC, "--quiet", "--out", str(fast)]) == 0
    e2e = [json.loads(p.read_text())["e2e_s"]["mean"] for p in (slow, fast)]
    assert e2e[0] > e2e[1]
    assert main(["plan", SPEC, "--quiet", *knobs, "--sweep", "block_size=16,32", "--out", str(tmp_path / "p")]) == 0
    capsys.readouterr()
    rows = json.loads((tmp_path / "p" / "results.json").read_text())
    assert all(said in r["config.clock"] for r in rows)
    with pytest.raises(SystemExit) as usage_error:     # argparse refuses it before any work
        main(["replay", SPEC, "--quiet", "--bandwidth-efficiency", "1.5"])
    assert usage_error.value.code == 2
    assert "--bandwidth-efficiency: must be in (0, 1], got 1.5" in capsys.readouterr().err
