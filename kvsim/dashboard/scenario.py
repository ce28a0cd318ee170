"""One dashboard scenario: a workload simulated on two allocator configurations of one pool size.

Each side is kept as a :class:`Run` of plain data (summary, DataFrames, pool snapshots at evenly
spaced frame times), so that Streamlit can cache it and the pages only index into it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvsim.cli.options import ENGINE_BATCH_DEFAULTS
from kvsim.dashboard.sources import Workload
from kvsim.planner.engine_setup import EngineSetup, build_engine
from kvsim.simulator import simulate


@dataclass(frozen=True)
class Scenario:
    """One comparison: a workload run on two allocator configurations of the same pool size."""
    workload: Workload
    allocators: tuple[str, str] = ("paged", "max")
    placement: str = "buddy"
    block_size: int = 16
    capacity_tokens: int = 8192
    max_model_len: int = 4096
    enable_prefix_caching: bool = True
    step_s: float = 0.025
    num_frames: int = 100
    cpu_offload_gib: float = 0.0    # a CPU offload tier below the paged side(s); 0: none


@dataclass
class Run:
    """One configuration's simulation, as plain data."""
    allocator: str
    summary: dict
    timeseries: pd.DataFrame
    requests: pd.DataFrame
    frame_times_s: np.ndarray
    snapshots: list = field(default_factory=list)  # one per frame time
    end_s: float = 0.0  # when its last request finished
    summary_json: str = "{}"  # the simulator's own JSON of the summary (NaN written as null)


def engine_setup(scenario: Scenario, allocator: str) -> EngineSetup:
    """One side of the scenario through planner's one builder (build_engine).

    A teaching pool: ``capacity_tokens`` usable slots on both sides, no null block, replay's batch
    limits (EngineConfig's 256 sequences and 8192 tokens, not a GPU's) and a fixed step time.
    ``cpu_offload_gib`` puts a CPU tier (of the default model's blocks, over the default GPU's
    PCIe link) below a paged side. Raises InputError for a pool smaller than one block.
    """
    max_num_seqs, max_num_batched_tokens = ENGINE_BATCH_DEFAULTS
    return build_engine(
        allocator=allocator, placement=scenario.placement, block_size=scenario.block_size,
        kv_tokens=scenario.capacity_tokens, null_block=False, max_model_len=scenario.max_model_len,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=scenario.enable_prefix_caching, step_s=scenario.step_s,
        cpu_offload_gib=scenario.cpu_offload_gib if allocator == "paged" else None)


def frame_times(end_s: float, num_frames: int) -> np.ndarray:
    """Evenly spaced snapshot times from 0 to ``end_s`` inclusive."""
    if num_frames < 2:
        raise ValueError(f"num_frames must be >= 2, got {num_frames}")
    return np.linspace(0.0, max(end_s, 1e-9), num_frames)


# most snapshot cells kept per scenario (both sides, all frames): a contiguous pool has one cell
# per token, so a 256k-token pool gets fewer frames than the default one (memory stays < ~150 MB)
SNAPSHOT_CELL_BUDGET = 6_000_000
MIN_FRAMES = 20


def num_frames_for(scenario: Scenario) -> int:
    """Frames to snapshot: the scenario's wish, fewer when the pools are huge."""
    cells = sum(scenario.capacity_tokens // (scenario.block_size if a == "paged" else 1)
                for a in scenario.allocators)
    return max(MIN_FRAMES, min(scenario.num_frames, SNAPSHOT_CELL_BUDGET // max(cells, 1)))


def simulate_scenario(scenario: Scenario, requests: list) -> tuple[Run, Run]:
    """Simulate both configurations on ``requests``; one Run per side.

    Both sides are snapshotted at the same times (from 0 to the later of the two ends), so the
    time scrubber moves both pools through the same moment. Raises InputError for an impossible
    configuration.
    """
    setups = [engine_setup(scenario, a) for a in scenario.allocators]
    # a first pass finds when each run ends; the second takes the snapshots
    ends_s = [float(simulate(requests, s.config, s.cost, record_requests=False,
                             offload=s.offload).summary["simulated_duration_s"])
              for s in setups]
    times = frame_times(max(ends_s), num_frames_for(scenario))
    runs = []
    for allocator, setup, end_s in zip(scenario.allocators, setups, ends_s):
        # one more snapshot at the run's end: the faster side shows its final pool from then on
        result = simulate(requests, setup.config, setup.cost, offload=setup.offload,
                          snapshot_times_s=tuple(sorted({*times.tolist(), end_s})))
        taken_s = np.array([t for t, _, _ in result.snapshots])
        pick = np.clip(np.searchsorted(taken_s, times, side="right") - 1, 0, len(taken_s) - 1)
        runs.append(Run(allocator=allocator, summary=dict(result.summary),
                        timeseries=result.timeseries, requests=result.requests,
                        frame_times_s=times, snapshots=[result.snapshots[i][2] for i in pick],
                        end_s=end_s, summary_json=result.summary_json()))
    return runs[0], runs[1]
