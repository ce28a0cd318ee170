"""bench/offload_oracle.py's worker stub: it completes vLLM's load and store jobs on the timing
rules kvsim's connector states (docs/OFFLOAD.md), so that the two sides share the transfer times
and differ only in decisions. No vLLM needed: the stub's timing is plain Python."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.offload_oracle import Worker  # noqa: E402


def job(req: str, blocks: int):
    spec = SimpleNamespace(block_ids=list(range(blocks)))
    return SimpleNamespace(req_id=req, src_spec=spec, dst_spec=spec, sync=False)


def meta(loads=None, stores=None, flush=()):
    return SimpleNamespace(load_jobs=loads or {}, store_jobs=stores or {}, jobs_to_flush=set(flush))


@pytest.mark.parametrize("k", [1, 3])
def test_loads_start_after_the_forward_and_stores_one_step_later(k):
    w = Worker(k)
    assert w.step(0, meta(stores={0: job("a", 2)}), 1) == (0, [])   # store queued
    assert w.step(1, meta(loads={1: job("b", 1)}), 1) == (0, [])    # store submitted at 2
    assert w.done == {0: 2 + 2 * k, 1: 2 + k}                        # one queue per direction
    found = {}
    for t in range(2, 2 + 2 * k + 1):
        _, got = w.step(t, meta(), 1)
        for job_id in got:
            found[job_id] = t
    assert found == {1: 2 + k, 0: 2 + 2 * k}     # polled at a step's start


def test_each_direction_is_one_queue():
    w = Worker(2)
    w.step(0, meta(loads={0: job("a", 1), 1: job("b", 3)}), 1)
    assert w.done == {0: 3, 1: 9}                # the second waits for the first


def test_a_flushed_store_is_submitted_at_once_and_the_forward_waits():
    w = Worker(4)
    w.step(0, meta(stores={0: job("a", 1)}), 1)  # deferred to the next step
    stall, found = w.step(1, meta(flush=[0]), 1)
    assert (stall, found) == (4, [0]) and w.flush_stall == 4
    assert w.step(6, meta(flush=[0]), 1) == (0, [])   # reported: nothing left to wait for


def test_nothing_to_schedule_submits_what_waits():
    w = Worker(1)
    w.step(0, meta(stores={0: job("a", 2)}), 1)
    w.step(1, meta(stores={1: job("a", 1)}, loads={2: job("b", 1)}), 0)   # an empty step
    w.submit_all(1)
    assert w.done == {0: 3, 1: 4, 2: 2} and w.next_done() == 2
