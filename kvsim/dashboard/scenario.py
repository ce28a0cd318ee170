"""One dashboard scenario: a workload simulated on two allocator configurations of one pool size.

Each side is kept as a :class:`Run` of plain data (summary, DataFrames, pool snapshots at evenly
spaced frame times), so that Streamlit can cache it and the pages only index into it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvsim.simulator.config import ENGINE_BATCH_DEFAULTS
from kvsim.dashboard.playback import (FrameRecorder, PoolFrames, frame_cost_s, frame_step_s,
                                      playback_times)
from kvsim.dashboard.sources import Workload
from kvsim.planner.engine_setup import EngineSetup, build_engine
from kvsim.simulator import simulate
from kvsim.simulator.engine import Simulation
from kvsim.simulator.footprint import BYTES_PER_SNAPSHOT_CELL, check_memory


# the sidebar's pool sizes (tokens): up to 131,072 blocks of 16 tokens
POOL_TOKENS = (2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576, 2097152)


@dataclass(frozen=True)
class Scenario:
    """One comparison: a workload run on two configurations of the same pool size.

    enable_prefix_caching: per side (left, right); a bool sets both. The two sides may be the
    same allocator with prefix caching on and off ("what does prefix caching save?").
    frame_s: simulated seconds between the live pool's frames (None: about
    playback.DEFAULT_FRAMES frames over the run).
    """
    workload: Workload
    allocators: tuple[str, str] = ("paged", "max")
    placement: str = "buddy"
    block_size: int = 16
    capacity_tokens: int = 8192
    max_model_len: int = 4096
    enable_prefix_caching: bool | tuple[bool, bool] = True
    step_s: float = 0.025
    num_frames: int = 100
    frame_s: float | None = None
    cpu_offload_gib: float = 0.0    # a CPU offload tier below the paged side(s); 0: none

    def prefix_caching(self, side: int) -> bool:
        """Prefix caching of one side (0 left, 1 right)."""
        pc = self.enable_prefix_caching
        return bool(pc[side]) if isinstance(pc, tuple) else bool(pc)


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
    prefix_caching: bool = True
    playback: PoolFrames | None = None  # the live pool's frames (playback.PoolFrames)
    playback_note: str = ""  # why the frames are coarser than the user's pick ('' if not)


def engine_setup(scenario: Scenario, allocator: str, side: int = 0) -> EngineSetup:
    """One side of the scenario through planner's one builder (build_engine).

    A teaching pool: ``capacity_tokens`` usable slots on both sides, no null block, EngineConfig's
    batch limits (256 sequences and 8192 tokens: the pool has no GPU whose vLLM defaults would
    apply) and a fixed step time.
    ``cpu_offload_gib`` puts a CPU tier (of the default model's blocks, over the default GPU's
    PCIe link) below a paged side. Raises InputError for a pool smaller than one block.
    """
    max_num_seqs, max_num_batched_tokens = ENGINE_BATCH_DEFAULTS
    return build_engine(
        allocator=allocator, placement=scenario.placement, block_size=scenario.block_size,
        kv_tokens=scenario.capacity_tokens, null_block=False, max_model_len=scenario.max_model_len,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=scenario.prefix_caching(side), step_s=scenario.step_s,
        cpu_offload_gib=(scenario.cpu_offload_gib
                         if allocator == "paged" and scenario.prefix_caching(side) else None))


def frame_times(end_s: float, num_frames: int) -> np.ndarray:
    """Evenly spaced snapshot times from 0 to ``end_s`` inclusive."""
    if num_frames < 2:
        raise ValueError(f"num_frames must be >= 2, got {num_frames}")
    return np.linspace(0.0, max(end_s, 1e-9), num_frames)


# most snapshot cells kept per scenario (both sides, all frames): a contiguous pool has one cell
# per token, so a 256k-token pool gets fewer frames than the default one (memory stays < ~150 MB)
SNAPSHOT_CELL_BUDGET = 6_000_000
MIN_FRAMES = 20


def _cells(scenario: Scenario) -> list[int]:
    """Snapshot cells of each side: blocks (paged) or tokens (contiguous)."""
    return [scenario.capacity_tokens // (scenario.block_size if a == "paged" else 1)
            for a in scenario.allocators]


def num_frames_for(scenario: Scenario) -> int:
    """Frames to snapshot: the scenario's wish, fewer when the pools are huge."""
    return max(MIN_FRAMES, min(scenario.num_frames, SNAPSHOT_CELL_BUDGET // max(sum(_cells(scenario)), 1)))


def simulate_scenario(scenario: Scenario, requests: list) -> tuple[Run, Run]:
    """Simulate both configurations on ``requests``; one Run per side.

    Both sides are snapshotted at the same times (from 0 to the later of the two ends), so the
    time scrubber moves both pools through the same moment; the live pool's frames (every
    ``scenario.frame_s``) are recorded in the same pass. Raises InputError for an impossible
    configuration or sizes the memory cannot hold (simulator.footprint).
    """
    setups = [engine_setup(scenario, a, side) for side, a in enumerate(scenario.allocators)]
    # a first pass finds when each run ends; the second takes the snapshots and frames
    ends_s = [float(simulate(requests, s.config, s.cost, record_requests=False,
                             offload=s.offload).summary["simulated_duration_s"])
              for s in setups]
    end_s = max(ends_s)
    times = frame_times(end_s, num_frames_for(scenario))
    # both pools are drawn at the paged block granularity: a contiguous tile is block_size tokens
    tiles = [scenario.capacity_tokens // scenario.block_size] * 2
    step_s, note = frame_step_s(end_s, scenario.frame_s, frame_cost_s(
        [(a == "paged", n) for a, n in zip(scenario.allocators, _cells(scenario))]))
    play_times = playback_times(end_s, step_s)
    # each frame keeps at most 5 bytes per changed tile; the coarse snapshots their cells
    check_memory({"playback frames": 5 * sum(tiles) * len(play_times),
                  "snapshots": sum(_cells(scenario)) * len(times) * BYTES_PER_SNAPSHOT_CELL},
                 f"{len(play_times):,} frames of two pools of {tiles[0]:,} tiles")
    play_set = set(play_times.tolist())
    runs = []
    for side, (allocator, setup, side_end_s) in enumerate(zip(scenario.allocators, setups, ends_s)):
        sim = Simulation(requests, setup.config, setup.cost, offload=setup.offload)
        recorder = FrameRecorder(1 if setup.config.is_paged else scenario.block_size)
        # one more snapshot at the run's end: the faster side shows its final pool from then on
        snap_set = {*times.tolist(), side_end_s}
        taken: dict[float, object] = {}
        result = None
        for t in sorted(snap_set | play_set):
            if t < side_end_s:
                sim.run_until(t)   # the state at t, before the events due at t
            elif result is None:   # from the side's end on: its final pool, every request done
                result = sim.run()
            snapshot = sim.snapshot()
            if t in snap_set:
                taken[t] = snapshot
            if t in play_set:
                recorder.add(t, snapshot, sim.state())
        result = result or sim.run()
        taken_s = np.array(sorted(taken))
        pick = np.clip(np.searchsorted(taken_s, times, side="right") - 1, 0, len(taken_s) - 1)
        runs.append(Run(allocator=allocator, summary=dict(result.summary),
                        timeseries=result.timeseries, requests=result.requests,
                        frame_times_s=times, snapshots=[taken[taken_s[i]] for i in pick],
                        end_s=side_end_s, summary_json=result.summary_json(),
                        prefix_caching=scenario.prefix_caching(side),
                        playback=recorder.frames(), playback_note=note))
    return runs[0], runs[1]
