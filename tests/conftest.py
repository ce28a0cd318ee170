"""Shared test fixtures. TRITON_INTERPRET must be set before any kernel module is imported."""
import os
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACES = ROOT.parent / "shared" / "traces"


def pytest_sessionstart(session):
    """The versions that results depend on and numpy's BLAS, once, first (also under -q, and only
    in the controller under xdist), so that a failure on another machine can be read."""
    if hasattr(session.config, "workerinput"):
        return
    from kvsim.environment import describe
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"kvsim test environment: {describe()}")


@pytest.fixture
def shared_traces() -> Path:
    """Path of ../shared/traces; skips the test cleanly when it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip("../shared/traces is absent")
    return SHARED_TRACES


@pytest.fixture
def step_clock_trace():
    """Build requests from (arrival step, prompt tokens, output tokens) rows, on the step clock
    (ids 0, 1, ... in row order)."""
    from kvsim.workloads import Request

    def build(*rows):
        out = []
        for i, (step, prompt, output) in enumerate(rows):
            r = Request(i, float(step), prompt, output)
            r.arrival_step = step
            out.append(r)
        return out
    return build


@pytest.fixture
def batched_equals_stepped():
    """Replay requests with decode runs applied at once and with every step scheduled in detail;
    assert the two give the same summary, time series and requests; return the batched Result."""
    import pandas as pd

    from kvsim.simulator import FixedStepCost, simulate

    def check(reqs, cfg):
        fast, slow = (simulate(iter(reqs), cfg, FixedStepCost(0.025), sample_interval_s=0.5,
                               batch_decode_steps=b) for b in (True, False))
        assert fast.summary_json(include_wall_clock=False) == \
            slow.summary_json(include_wall_clock=False)
        pd.testing.assert_frame_equal(fast.timeseries, slow.timeseries)
        pd.testing.assert_frame_equal(fast.requests, slow.requests)
        return fast
    return check
