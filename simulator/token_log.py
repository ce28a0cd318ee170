"""When tokens come out: one row per engine step that sampled any, for the metrics a benchmark
client computes from its token stream (``simulator.serve_metrics``: vllm bench serve's ITL and
its peak output tokens per second).

A row is the step's end (ns), its duration (ns), the tokens it sampled and how many of them
followed the same sequence's token of the step before (an inter-token gap of the step's
duration; a sequence's first token is its TTFT, not a gap). A run of k identical decode steps
becomes k rows, each step's end from the cost model's run pricing. Kept only when asked
(``Simulation(record_token_times=True)``): 32 bytes a step.

A split burst's first tokens (a burst at an idle engine whose first step took part of it, the
next step on no CUDA graph) come out with the next step's, and so do their second tokens, which
that step sampled: a row of duration 0 at its end.

One approximation, stated: a request resumed after a preemption gets its next token at the end
of its re-prefill step, and that gap is counted as the step's duration, not as the time since
its token before the preemption (the request's own TPOT and E2E do count the whole wait).
"""
from __future__ import annotations

from array import array

import numpy as np


class TokenLog:
    """Per-step token rows: ``end_ns``, ``duration_ns``, ``num_tokens``, ``num_gap_tokens``."""

    def __init__(self):
        self.end_ns = array("q")
        self.duration_ns = array("q")
        self.num_tokens = array("q")
        self.num_gap_tokens = array("q")

    def step(self, end_ns: int, duration_ns: int, num_tokens: int, num_gap_tokens: int) -> int:
        """One step's row; returns its index (-1: the step sampled nothing, no row)."""
        if num_tokens <= 0:
            return -1
        self.end_ns.append(end_ns)
        self.duration_ns.append(duration_ns)
        self.num_tokens.append(num_tokens)
        self.num_gap_tokens.append(num_gap_tokens)
        return len(self.end_ns) - 1

    def hold_first_tokens(self, row: int, num_first: int, end_ns: int, last_row: int, num_second: int) -> None:
        """``num_first`` first tokens of row ``row`` (a split burst's first step) come out at
        ``end_ns`` instead, with ``num_second`` second tokens of the same sequences, sampled in
        row ``last_row``'s step (ending at ``end_ns``): those gaps are 0, not that step's
        duration (simulator.batch_hooks.LookaheadQueue.first_tokens)."""
        self.num_tokens[row] -= num_first
        self.num_tokens[last_row] -= num_second
        self.num_gap_tokens[last_row] -= num_second
        self.step(end_ns, 0, num_first + num_second, num_second)

    def run(self, start_ns: int, ends_ns: list[int], tokens_per_step: int) -> None:
        """A run of decode steps from ``start_ns`` ending at ``ends_ns``: every sequence in it
        samples one token per step, each a gap of that step's duration."""
        prev = start_ns
        for end in ends_ns:
            self.step(end, end - prev, tokens_per_step, tokens_per_step)
            prev = end

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: np.frombuffer(col, dtype=np.int64) if len(col) else np.zeros(0, dtype=np.int64)
                for name, col in (("end_ns", self.end_ns), ("duration_ns", self.duration_ns),
                                  ("num_tokens", self.num_tokens), ("num_gap_tokens", self.num_gap_tokens))}
