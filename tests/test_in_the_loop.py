"""simulator.in_the_loop: the arrays handed to the executor, and the cost model that times them."""
import math
from types import SimpleNamespace

import pytest

from kvsim.simulator.cost import FixedStepCost, StepBatch
from kvsim.simulator.in_the_loop import InTheLoopCost, ScheduledStep, scheduled_step


class Tables:
    def __init__(self, tables):
        self.tables = tables

    def block_table(self, seq_id):
        return list(self.tables[seq_id])


def seq(seq_id, request_id, computed):
    return SimpleNamespace(seq_id=seq_id, req=SimpleNamespace(request_id=request_id), num_computed_tokens=computed)


def test_scheduled_step_reads_counters_after_the_schedule():
    out = SimpleNamespace(scheduled=[(seq(3, "a", 33), 1), (seq(7, "b", 20), 20)])
    step = scheduled_step(out, Tables({3: [5, 9, 2], 7: [4, 1]}), step_index=12, block_size=16)
    assert step == ScheduledStep(12, ["a", "b"], [32, 0], [1, 20], [[5, 9, 2], [4, 1]], 16)
    with pytest.raises(AssertionError, match="block table"):
        scheduled_step(out, Tables({3: [5, 9], 7: [4, 1]}), 12, 16)   # 33 tokens need 3 blocks


def test_in_the_loop_cost_executes_and_keeps_the_prediction():
    seen = []
    cost = InTheLoopCost(lambda step: seen.append(step) or 0.025, FixedStepCost(0.02))
    step = ScheduledStep(0, [1], [0], [8], [[1]], 16)
    assert cost.timed_step_s(StepBatch(1, 8, 0, 8, 8, 64), step) == 0.025
    assert seen == [step] and cost.last == (0.025, 0.02)
    assert cost.step_time_s(StepBatch()) == 0.0
    with pytest.raises(TypeError):
        cost.step_time_s(StepBatch(1, 8, 0, 8, 8, 64))
    with pytest.raises(TypeError):
        cost.run_time_s(StepBatch(1, 0, 1, 1, 8, 8), 3)
    alone = InTheLoopCost(lambda step: 0.01)
    alone.timed_step_s(StepBatch(1, 8, 0, 8, 8, 64), step)
    assert alone.last[0] == 0.01 and math.isnan(alone.last[1])


class Linear:
    """A cost model whose step time the executed steps' arrays reproduce exactly."""

    def step_time_s(self, b):
        return 0.004 + 2e-5 * b.num_scheduled_tokens + 1e-7 * b.kv_read_tokens

    def run_time_s(self, b, k):
        from kvsim.simulator.cost import summed_run_time_s
        return summed_run_time_s(self, b, k)


def linear_execute(step):
    kv = sum(c + n for c, n in zip(step.num_computed_tokens, step.num_new_tokens))
    return 0.004 + 2e-5 * sum(step.num_new_tokens) + 1e-7 * kv


def test_in_the_loop_schedules_exactly_as_the_simulation():
    # the same durations through the executor's arrays and through the cost model: every step
    # executed one by one (no decode runs, no decode clock) must make the same decisions at the
    # same times, preemptions and prefix hits included
    from kvsim import workloads
    from kvsim.simulator import simulate
    from kvsim.simulator.config import EngineConfig
    cfg = EngineConfig(allocator="paged", block_size=16, num_blocks=60, null_block=True, max_num_seqs=16,
                       max_num_batched_tokens=256, max_model_len=1024, enable_prefix_caching=True,
                       long_prefill_token_threshold=0, full_prompt_admission=True, watermark=0.0)
    spec = "synthetic:prompt=uniform(20,300),output=uniform(5,200),rate=30,n=80,seed=3,system=64"
    plain = simulate(workloads.load(spec), cfg, Linear(), record_steps=True)
    looped = simulate(workloads.load(spec), cfg, InTheLoopCost(linear_execute, Linear()), record_steps=True)
    assert plain.summary["num_preemptions"] > 10 and plain.summary["prefix_hit_rate"] > 0
    assert looped.summary["num_steps"] == plain.summary["num_steps"]
    cols = ["request_id", "first_token_step", "finish_step", "num_preemptions", "cached_tokens_total", "e2e_s"]
    assert looped.requests[cols].equals(plain.requests[cols])
    steps = looped.timeseries
    assert (steps["measured_step_s"] == steps["predicted_step_s"]).all()
    assert steps["step_start_s"].is_monotonic_increasing and len(steps) == plain.summary["num_steps"]


class LongestLinear(Linear):
    """Linear plus a term in the step's longest context (the engine must then track it)."""
    uses_max_context_tokens = True

    def step_time_s(self, b):
        assert b.max_context_tokens > 0 or not b.num_scheduled_tokens, "the engine did not fill the longest context"
        return super().step_time_s(b) + 2e-5 * b.max_context_tokens


def longest_execute(step):
    return linear_execute(step) + 2e-5 * max(c + n for c, n in zip(step.num_computed_tokens, step.num_new_tokens))


def test_the_engine_tracks_the_longest_context_through_decode_runs():
    # the decode clock's longest context (runs of decode steps, preemptions, prefix hits) against
    # the executed arrays' of the same schedule, step by step: equal durations, equal decisions
    from kvsim import workloads
    from kvsim.simulator import simulate
    from kvsim.simulator.config import EngineConfig
    cfg = EngineConfig(allocator="paged", block_size=16, num_blocks=60, null_block=True, max_num_seqs=16,
                       max_num_batched_tokens=256, max_model_len=1024, enable_prefix_caching=True,
                       long_prefill_token_threshold=0, full_prompt_admission=True, watermark=0.0)
    spec = "synthetic:prompt=uniform(20,300),output=uniform(5,200),rate=30,n=80,seed=3,system=64"
    plain = simulate(workloads.load(spec), cfg, LongestLinear())
    looped = simulate(workloads.load(spec), cfg, InTheLoopCost(longest_execute, LongestLinear()), record_steps=True)
    assert plain.summary["num_preemptions"] > 10 and plain.summary["num_steps"] == looped.summary["num_steps"]
    cols = ["request_id", "first_token_step", "finish_step", "num_preemptions", "e2e_s", "ttft_s"]
    assert looped.requests[cols].equals(plain.requests[cols])
    steps = looped.timeseries
    assert (steps["measured_step_s"] == steps["predicted_step_s"]).all()
    # the term matters: without it the run ends elsewhere
    assert simulate(workloads.load(spec), cfg, Linear()).summary["simulated_duration_s"] != \
        plain.summary["simulated_duration_s"]


def test_replay_execute_on_the_cpu_writes_measured_steps(tmp_path):
    import json

    import pandas as pd

    from kvsim.cli import main
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 32, "intermediate_size": 48,
                               "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                               "vocab_size": 64}))
    ts, req = tmp_path / "steps.csv", tmp_path / "req.csv"
    argv = ["replay", "synthetic:prompt=uniform(20,60),output=uniform(2,6),rate=50,n=4,seed=0,system=32",
            "--hf-config", str(cfg), "--num-blocks", "40", "--max-num-seqs", "4", "--max-num-batched-tokens", "64",
            "--max-model-len", "256", "--execute", "cpu", "--quiet", "--out", str(tmp_path / "r.json"),
            "--timeseries", str(ts), "--requests", str(req)]
    assert main(argv) == 0
    steps = pd.read_csv(ts)
    assert len(steps) == json.loads((tmp_path / "r.json").read_text())["num_steps"] > 4
    assert (steps["measured_step_s"] > 0).all() and (steps["predicted_step_s"] > 0).all()
    assert (steps["kv_read_tokens"] >= steps["sched_tokens"]).all()
    # the executor's times are the clock: the run's duration is their sum
    assert abs(steps["measured_step_s"].sum() - pd.read_csv(req)["finish_s"].max()) < 1e-6 + steps["step_start_s"].min()


def test_replay_execute_rejects_what_it_cannot_run(tmp_path, capsys):
    from kvsim.cli import main
    base = ["replay", "sharegpt:rate=2,n=3,seed=0", "--num-blocks", "40", "--execute", "cpu", "--quiet",
            "--out", str(tmp_path / "r.json")]
    for extra, where in [(["--allocator", "max"], "--allocator max"), (["--replicas", "2"], "one replica"),
                         (["--model", "OPT-13B"], "OPT-13B is not one")]:
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and where in err[0]
    assert main(["replay", "sharegpt:rate=2,n=3,seed=0,samples=2", "--num-blocks", "400", "--execute", "cpu",
                 "--quiet", "--hf-config", str(_tiny(tmp_path)), "--max-model-len", "4096",
                 "--out", str(tmp_path / "r.json")]) == 2
    assert "single-sample" in capsys.readouterr().err


def _tiny(tmp_path):
    import json
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 48,
                                "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                                "vocab_size": 64}))
    return path
