"""Hardware in the loop: a cost model whose steps are executed, not priced.

The engine hands each scheduled step to ``InTheLoopCost.timed_step_s`` as plain arrays
(``ScheduledStep``: what vLLM's model runner receives from its scheduler) and takes the seconds
it returns as the step's duration. What executes the step is the caller's business (the CLI
passes the kernels' step executor; the simulator never imports it). The cost model the run would
otherwise use (``predictor``) prices the same StepBatch, and both times go to the step's row of
the time series (``measured_step_s``, ``predicted_step_s``).

A run in the loop schedules every step in detail (no runs of decode steps, no decode clock), one
replica, paged allocator, single-sample requests: each step's block tables must be the
allocator's, step by step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvsim.simulator.cost import CostModel, StepBatch, uses_max_context_tokens

# what a step's row of the time series carries in the loop, after the usual step columns
IN_THE_LOOP_COLUMNS = ("kv_read_tokens", "attn_token_pairs", "measured_step_s", "predicted_step_s",
                       "step_start_s", "max_context_tokens")


@dataclass(slots=True)
class ScheduledStep:
    """One scheduled step as plain data (sequences in vLLM's order: running, then admitted).

    num_computed_tokens: per sequence, the tokens whose KV was cached before the step (prefix
    hits included); num_new_tokens: the tokens it computes in the step; block_tables: its blocks
    (enough for num_computed_tokens + num_new_tokens).
    """
    step_index: int
    request_ids: list
    num_computed_tokens: list[int]
    num_new_tokens: list[int]
    block_tables: list[list[int]]
    block_size: int


def scheduled_step(out, allocator, step_index: int, block_size: int) -> ScheduledStep:
    """The ScheduledStep of a scheduler output (``StepOutput.scheduled``: (SeqState, new tokens),
    counters already advanced by the schedule) over ``allocator``'s block tables."""
    ids, computed, new, tables = [], [], [], []
    for seq, n in out.scheduled:
        after = seq.num_computed_tokens
        table = allocator.block_table(seq.seq_id)
        if len(table) * block_size < after:
            raise AssertionError(f"sequence {seq.seq_id}: {after} tokens scheduled but its block table "
                                 f"holds {len(table)} blocks of {block_size}")
        ids.append(seq.req.request_id)
        computed.append(after - n)
        new.append(n)
        tables.append(table)
    return ScheduledStep(step_index, ids, computed, new, tables, block_size)


class InTheLoopCost:
    """A cost model whose steps run on hardware (module docstring).

    Args:
        execute: ScheduledStep -> seconds the step took.
        predictor: the cost model whose prediction is recorded beside each measurement (None:
            none recorded).
    """

    in_the_loop = True

    def __init__(self, execute: Callable[[ScheduledStep], float], predictor: CostModel | None = None):
        self.execute = execute
        self.predictor = predictor
        # the engine then fills the StepBatch's longest context for the prediction
        self.uses_max_context_tokens = uses_max_context_tokens(predictor)
        self.last = (0.0, float("nan"))     # (measured, predicted) of the last step executed

    def describe(self) -> str:
        from kvsim.simulator.cost import clock_source

        beside = f"; predicted beside by {clock_source(self.predictor)}" if self.predictor is not None else ""
        return f"hardware in the loop: every step executed and timed{beside}"

    def timed_step_s(self, batch: StepBatch, step: ScheduledStep) -> float:
        """Execute the step; its measured seconds (the prediction is kept in ``last``)."""
        measured = float(self.execute(step))
        predicted = self.predictor.step_time_s(batch) if self.predictor is not None else float("nan")
        self.last = (measured, predicted)
        return measured

    def step_time_s(self, batch: StepBatch) -> float:
        """A step without arrays (an empty step) takes no time; a real one must be executed."""
        if batch.num_scheduled_tokens:
            raise TypeError("a step run in the loop is executed (timed_step_s), not priced")
        return 0.0

    def run_time_s(self, batch: StepBatch, num_steps: int) -> float:
        raise TypeError("runs of decode steps are not batched in the loop: every step is executed")

    def __repr__(self) -> str:
        return f"InTheLoopCost(predictor={self.predictor!r})"
