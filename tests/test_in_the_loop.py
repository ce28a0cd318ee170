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
