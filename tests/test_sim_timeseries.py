"""The time series says what happened: a final sample after the last finish, idle gaps sampled idle.

Two bugs of one class (sampling order against event order): samples due inside an idle gap were
taken at the next step boundary, after the arrival that ends the gap, so a whole gap showed a
queue and the last batch over an empty pool (and mean_waiting counted the gap); and the series
stopped at the last periodic sample, before the last finish.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvsim import workloads
from kvsim.planner.engine_setup import build_engine
from kvsim.simulator import simulate

GAP_TRACE = ("arrival_s,prompt_tokens,output_tokens\n"
             "0,300,20\n0.5,200,10\n28.5,400,30\n29,100,5\n")   # a 28-s gap between arrivals


def _replay(source, *, allocator="paged", replicas=1, record_steps=False, step_s=0.05, **kw):
    setup = build_engine(allocator=allocator, num_gpu_blocks=200, step_s=step_s, max_model_len=2048)
    return simulate(workloads.load(str(source), **kw), setup.config, setup.cost, replicas=replicas,
                    record_steps=record_steps)


@pytest.fixture
def gap_trace(tmp_path):
    path = tmp_path / "gap.csv"
    path.write_text(GAP_TRACE)
    return path


def test_an_idle_gap_is_sampled_idle_and_counts_no_waiting(gap_trace):
    result = _replay(gap_trace)
    ts = result.timeseries
    gap = ts[(ts["time_s"] > 2) & (ts["time_s"] < 28.5)]
    assert len(gap) == 26
    assert (gap["waiting"] == 0).all() and (gap["running"] == 0).all()
    assert (gap["batch_tokens"] == 0).all()          # no batch over an empty pool
    assert (gap["token_states"] == 0).all() and (gap["kv_usage"] == 0).all()
    assert result.summary["mean_waiting"] == 0.0     # before: 0.92 (the gap counted as waiting)
    # no idle step: every step of the step record scheduled tokens, and the summary counts those
    steps = _replay(gap_trace, record_steps=True, step_s=1.0).timeseries
    assert (steps["sched_tokens"] > 0).all()
    assert len(steps) == _replay(gap_trace, record_steps=True, step_s=1.0).summary["num_steps"]


@pytest.mark.parametrize("allocator,replicas", [("paged", 1), ("max", 1), ("paged", 3)])
def test_the_series_ends_after_the_last_finish(allocator, replicas):
    result = _replay("sharegpt:rate=3,n=60,seed=4,system=64", allocator=allocator, replicas=replicas,
                     step_s=0.0137)
    ts, end_s = result.timeseries, result.summary["simulated_duration_s"]
    assert ts["time_s"].max() == pytest.approx(end_s)   # not a multiple of the 1-s interval
    last = ts[ts["time_s"] == ts["time_s"].max()]
    assert len(last) == replicas
    assert (last["running"] == 0).all() and (last["waiting"] == 0).all()
    assert (last["batch_tokens"] == 0).all() and (last["kv_usage"] == 0).all()
    for held in ("token_states", "reservation"):
        assert (last[held] == 0).all(), held        # only cached (evictable) blocks stay
    null_block_slots = 16 if allocator == "paged" else 0   # vLLM's null block is never freed
    assert (last["internal_fragmentation"] == null_block_slots).all()
    assert last["finished"].sum() == result.summary["requests_finished"] == 60
    if allocator == "paged" and replicas == 1:
        assert int(last["cached"].iloc[0]) > 0      # the shared system prompt stays cached
    # the periodic samples are still every second, and the final row is the only other one
    periodic = ts[ts["time_s"] < end_s]
    assert np.allclose(np.diff(periodic.drop_duplicates("time_s")["time_s"]), 1.0)


def test_a_run_ending_on_a_sample_time_gets_no_second_row(gap_trace):
    ts = _replay(gap_trace).timeseries   # ends at 30.000 s exactly (steps of 0.05 s)
    assert ts["time_s"].max() == 30.0 and (ts["time_s"] == 30.0).sum() == 1


def test_the_azure_traces_gaps_are_idle(shared_traces):
    """The conversation trace's longest gap is 4.3 s, after its first request."""
    trace = shared_traces / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    arrivals = np.array([r.arrival_s for r in workloads.load(trace, max_requests=400)])
    result = _replay(trace, max_requests=400, step_s=0.02)
    ts = result.timeseries
    busy_until = result.requests["finish_s"].to_numpy()
    for t, row in ts.set_index("time_s").iterrows():
        # nothing arrived yet that has not finished: the replica is idle at t
        idle = not ((arrivals <= t) & (busy_until > t)).any()
        if idle and t not in arrivals:
            assert row["waiting"] == 0 and row["running"] == 0 and row["batch_tokens"] == 0, t
