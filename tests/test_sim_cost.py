"""StepTimer: cost-model seconds to the engine's integer nanoseconds."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvsim.simulator.cost import FixedStepCost, StepBatch, StepTimer, summed_run_time_s


class _Growing:
    """A cost model whose decode steps get longer with context (as the roofline's do)."""

    def step_time_s(self, batch: StepBatch) -> float:
        return 0.01 + 3e-7 * batch.kv_read_tokens

    def run_time_s(self, batch: StepBatch, num_steps: int) -> float:
        return summed_run_time_s(self, batch, num_steps)


@pytest.mark.parametrize("cost", [FixedStepCost(0.03), _Growing()])
def test_steps_to_reach_is_the_smallest_run_ending_at_or_after_the_bound(cost):
    b0 = StepBatch(40, 0, 40, 40, 40_000, 40_000)
    k_max = 400
    for now in (0, 123_456):
        for gap_ns in (0, 1, 5_000_000, 29_999_999, 30_000_000, 1_000_000_000, 10**12):
            timer = StepTimer(cost)
            k = timer.steps_to_reach(b0, now, now + gap_ns, k_max)
            ends = [now + StepTimer(cost).run_ns(b0, j) for j in range(1, k_max + 1)]
            reach = [j for j, end in enumerate(ends, 1) if end >= now + gap_ns]
            assert k == (reach[0] if reach else k_max)


def test_run_and_step_durations_in_ns():
    timer = StepTimer(FixedStepCost(0.03))
    assert timer.step_ns(StepBatch()) == 30_000_000 and timer.run_ns(StepBatch(), 7) == 210_000_000
    grow = StepTimer(_Growing())
    b0 = StepBatch(10, 0, 10, 10, 1000, 1000)
    assert grow.run_ns(b0, 1) == grow.step_ns(b0)
    assert grow.run_ns(b0, 3) == round(summed_run_time_s(_Growing(), b0, 3) * 1e9)
    zero = SimpleNamespace(step_time_s=lambda b: 0.0, run_time_s=lambda b, k: 0.0)
    assert StepTimer(zero).run_ns(b0, 5) == 5        # at least 1 ns per step


def test_every_run_says_which_clock_ran(tmp_path, capsys):
    """replay prints the clock's source first and keeps it in result.json (config.clock)."""
    import json
    from pathlib import Path

    from kvsim.cli import main

    table = Path(__file__).resolve().parent.parent / "tables" / "Llama-3.1-8B_H200.csv"
    cases = [([], "measured table tables/vllm/llama8b-bf16-fine_H100.csv (gpu NVIDIA H100 80GB HBM3"),
             (["--cost-table", "roofline"], "roofline of Llama-3.1-8B on H100-80GB-SXM"),
             (["--bandwidth-efficiency", "0.9"], "roofline of Llama-3.1-8B on H100-80GB-SXM"),
             (["--step-s", "0.02"], "fixed step time 0.02 s"),
             (["--step-clock"], "step clock"), (["--cost-table", str(table)], "gpu NVIDIA H200, model Llama-3.1-8B")]
    for extra, want in cases:
        out = tmp_path / "r.json"
        assert main(["replay", "random:isl=64,osl=8,n=10", "--num-blocks", "500", "--quiet",
                     "--out", str(out), *extra]) == 0
        first = capsys.readouterr().out.splitlines()[0]
        assert first.startswith("clock: ") and want in first, first
        assert json.loads(out.read_text())["config"]["clock"] == first[len("clock: "):]


def test_a_carried_clock_scales_each_step_by_the_two_gpus_ratio():
    """CarriedCost: a step costs the measured time times target / source of the same batch; a run
    of decode steps is carried at its first step's ratio; the clock line ends with the note."""
    from kvsim.simulator.cost import CarriedCost, FixedStepCost, StepBatch

    class Linear:       # a stand-in for a roofline: time grows with the KV read
        def __init__(self, per_kv):
            self.per_kv = per_kv

        def step_time_s(self, b):
            return 0.002 + self.per_kv * b.kv_read_tokens

    inner = FixedStepCost(0.01)
    carried = CarriedCost(inner, Linear(1e-6), Linear(5e-7), "carried from A to B")
    b = StepBatch(4, 0, 4, 4, 8000, 8000, 0)
    ratio = (0.002 + 5e-7 * 8000) / (0.002 + 1e-6 * 8000)
    assert carried.step_time_s(b) == 0.01 * ratio
    assert carried.run_time_s(b, 50) == inner.run_time_s(b, 50) * ratio
    assert carried.describe() == f"{inner.describe()}, carried from A to B"
    assert carried.idle_start_s == 0.0 and not carried.uses_max_context_tokens
