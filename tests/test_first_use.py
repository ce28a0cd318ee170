"""simulator.first_use: a fresh gpt-oss engine's first-use compiles of the MoE routing, by the rule
the harness's timed compiles show (an eager step's tokens rounded up to 32, and divisible by 16 or
not), checked against every routing compile of two measured engines, and as the engine adds them."""
from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import pytest

from kvsim.simulator import simulate
from kvsim.simulator.config import EngineConfig
from kvsim.simulator.cost import FixedStepCost
from kvsim.simulator.first_use import RoutingCompiles, routing_key
from kvsim.workloads import Request

RUNS = Path(__file__).resolve().parent.parent / "bench" / "results" / "vllm_h100"


def test_the_key_is_the_tokens_rounded_up_to_32_and_their_divisibility_by_16():
    assert routing_key(7168) == (7168, True) and routing_key(7169) == (7200, False)
    assert routing_key(1030) == (1056, False) and routing_key(1088) == (1088, True)
    compiles = RoutingCompiles(graph_tokens=1024, compile_s=0.7)
    seen = compiles.at_start(8192)
    assert compiles.stall_s(seen, 8192) == 0.0                    # vLLM's profile run compiled it
    assert compiles.stall_s(seen, 1024) == 0.0                    # on a CUDA graph
    assert compiles.stall_s(seen, 2049) == 0.7 and compiles.stall_s(seen, 2050) == 0.0   # same key
    assert compiles.stall_s(seen, 2048) == 0.7                    # 2,048 divides by 16: another key
    later = compiles.having_run([2049, 500, 3000])
    assert later.at_start(8192) == {(8192, True), (2080, False), (3008, False)}


@pytest.mark.parametrize("engine", ["gpt-oss-20b-jit", "gpt-oss-20b-cached"])
def test_the_rule_predicts_every_routing_compile_of_the_measured_engines(engine):
    """Every workload's eager steps (their token counts, steps.csv) against the routing compiles the
    probe timed (jit.csv's _topk_forward: the key's bitmatrix stride and the token count's
    specialisation), in the engine's order, from vLLM's profile run's key."""
    root = RUNS / engine
    if not (root / "meta.json").exists():
        pytest.skip("no measured runs here")
    meta = json.loads((root / "meta.json").read_text())
    compiles = RoutingCompiles(graph_tokens=1024)
    seen = compiles.at_start(meta["engine_core"]["max_num_batched_tokens"])
    total = 0
    for name, _ in sorted(meta["workloads"].items(), key=lambda kv: kv[1]["t0_monotonic"]):
        predicted = []
        with open(root / name / "steps.csv") as f:
            for row in csv.DictReader(f):
                m = int(row["num_scheduled_tokens"])
                if compiles.stall_s(seen, m):
                    predicted.append(routing_key(m))
        measured = []
        with open(root / name / "jit.csv") as f:
            for row in csv.DictReader(f):
                if row["kernel"] == "_topk_forward":
                    spec = dict(zip(row["arg_names"].split(","), ast.literal_eval(row["key"][:row["key"].index("]") + 1])))
                    measured.append((spec["stride_rn"][1], spec["n_rows"][1] == "D"))
        assert sorted(predicted) == sorted(measured), name
        total += len(measured)
    assert total >= 14


class _Compiling:
    """10 ms steps, an engine that compiles its routing on first use (1 s a key, graphs to 64 tokens)."""

    def __init__(self):
        self.fixed = FixedStepCost(0.01)
        self.first_use_compiles = RoutingCompiles(graph_tokens=64, compile_s=1.0)

    def step_time_s(self, batch):
        return self.fixed.step_time_s(batch)

    def run_time_s(self, batch, num_steps):
        return self.fixed.run_time_s(batch, num_steps)

    def describe(self):
        return "10 ms steps, first-use compiles"


def test_the_engine_adds_a_compile_to_the_first_step_of_each_new_key_per_replica():
    """Three prompts of 100 tokens, one after another (each step eager: over 64 tokens): the first
    pays the compile, the others (the same key) do not; with two replicas each compiles its own."""
    cfg = EngineConfig(num_blocks=64, block_size=16, null_block=True, max_num_seqs=4, max_num_batched_tokens=256,
                       max_model_len=1024)
    reqs = [Request(request_id=i, arrival_s=5.0 * i, prompt_tokens=100, output_tokens=2) for i in range(4)]
    ttft = simulate(iter(reqs), cfg, _Compiling()).requests.set_index("request_id")["ttft_s"]
    plain = simulate(iter(reqs), cfg, FixedStepCost(0.01)).requests.set_index("request_id")["ttft_s"]
    assert ttft[0] == pytest.approx(plain[0] + 1.0)
    assert all(ttft[i] == pytest.approx(plain[i]) for i in (1, 2, 3))
    two = simulate(iter(reqs), cfg, _Compiling(), replicas=2).requests.set_index("request_id")["ttft_s"]
    assert sorted(round(t - p, 6) for t, p in zip(two, plain)) == [0.0, 0.0, 1.0, 1.0]


def test_the_flag_prices_a_fresh_gpt_oss_engine_and_refuses_another_clock(capsys):
    """kvsim replay --first-use-compiles: gpt-oss-20b on its H100 table says so on the clock line and
    its eager steps pay; another model's table, or the roofline, is a one-line error."""
    from kvsim.cli import main

    spec = "random:isl=1024,osl=16,n=32,concurrency=16,seed=1"
    argv = ["replay", "--model", "gpt-oss-20b", "--gpu", "h100", spec, "--quiet"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main([*argv, "--first-use-compiles"]) == 0
    fresh = capsys.readouterr().out
    assert "first-use compiles of the MoE routing" in fresh and "first-use" not in plain

    def ttft_p50(text):
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("TTFT p50")))
    assert ttft_p50(fresh) > ttft_p50(plain) + 0.5
    for other in (["--model", "Llama-3.1-8B", "--gpu", "h100"], ["--model", "gpt-oss-20b", "--cost-table", "roofline"]):
        assert main(["replay", *other, spec, "--quiet", "--first-use-compiles"]) == 2
        err = capsys.readouterr().err
        assert "first_use_compiles" in err and len(err.strip().splitlines()) == 1
