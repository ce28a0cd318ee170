"""The KV-cache groups page's logic: a hybrid model's groups over one pool, through time.

A :class:`HybridScenario` is a workload replayed on a teaching pool with a hybrid model's
KV-cache groups (the shapes of gpt-oss, Gemma 3, Nemotron-H, Qwen3-Next, with windows small
enough to see them move, or any ``--kv-groups`` spelling); a :class:`HybridRun` keeps its pool
snapshots at evenly spaced times, so the page only indexes into it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvsim.simulator.config import ENGINE_BATCH_DEFAULTS
from kvsim.dashboard.scenario import frame_times
from kvsim.dashboard.sources import Workload
from kvsim.planner.engine_setup import EngineSetup, build_engine
from kvsim.simulator import simulate
from kvsim.viz.kv_groups import group_counts

# label -> groups (``parse_kv_groups`` spelling, vLLM's order); the models' group kinds, with
# windows cut down so that a few hundred tokens already slide (gpt-oss: 128, as shipped)
SHAPES = {
    "gpt-oss: window 128 + full": "sliding:128,full",
    "Gemma 3: five windows + full (window 256 here, 1024 shipped)":
        ",".join(["sliding:256"] * 5 + ["full"]),
    "Nemotron-H: Mamba2 (prompt checkpoints) + full": "mamba_ckpt,mamba_ckpt,full",
    "Qwen3-Next: Gated DeltaNet (checkpoints on the block grid) + full": "mamba_ckpt:16,full",
    "sliding window only (window 64)": "sliding:64",
}


@dataclass(frozen=True)
class HybridScenario:
    """A workload on a pool shared by KV-cache groups (a teaching pool of ``num_gpu_blocks``
    blocks, vLLM's null block included)."""
    workload: Workload
    groups: str = "sliding:128,full"
    num_gpu_blocks: int = 600
    block_size: int = 16
    max_model_len: int = 4096
    enable_prefix_caching: bool = True
    step_s: float = 0.025
    num_frames: int = 60


@dataclass
class HybridRun:
    """The scenario's simulation, as plain data."""
    summary: dict
    frame_times_s: np.ndarray
    snapshots: list = field(default_factory=list)   # one GroupedPagedAllocator snapshot a frame


def hybrid_setup(sc: HybridScenario) -> EngineSetup:
    """The scenario through the one builder; raises InputError for bad groups or pools."""
    max_num_seqs, max_num_batched_tokens = ENGINE_BATCH_DEFAULTS
    return build_engine(num_gpu_blocks=sc.num_gpu_blocks, block_size=sc.block_size,
                        kv_cache_groups=sc.groups, max_model_len=sc.max_model_len,
                        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                        enable_prefix_caching=sc.enable_prefix_caching, step_s=sc.step_s)


def simulate_hybrid(sc: HybridScenario, requests: list) -> HybridRun:
    """Replay ``requests`` and snapshot the pool at ``num_frames`` evenly spaced times."""
    setup = hybrid_setup(sc)
    end_s = float(simulate(requests, setup.config, setup.cost, record_requests=False)
                  .summary["simulated_duration_s"])
    times = frame_times(end_s, sc.num_frames)
    result = simulate(requests, setup.config, setup.cost, snapshot_times_s=tuple(times))
    return HybridRun(summary=dict(result.summary), frame_times_s=times,
                     snapshots=[s for _, _, s in result.snapshots])


def groups_frame(snapshot, summary: dict) -> pd.DataFrame:
    """One row per group: now (blocks held, cached, released table positions) and over the run
    (time-averaged share of the pool holding tokens, most blocks held)."""
    rows = []
    for now, run in zip(group_counts(snapshot), summary.get("kv_cache_groups", ())):
        rows.append({"group": now["group"], "blocks held": now["held_blocks"],
                     "cached blocks": now["cached_blocks"],
                     "released positions": now["released_positions"],
                     "mean share holding tokens": f"{100 * run['token_states']:.1f} %",
                     "most blocks held": run["max_blocks"]})
    return pd.DataFrame(rows)


def most_released_request(snapshot) -> int | None:
    """The live request with the most released table positions (the longest run of blocks a
    window left behind), else the longest one; None when no request holds memory."""
    tables = snapshot.group_block_tables or {}
    if not tables:
        return None
    return max(tables, key=lambda sid: (sum(int((np.asarray(t) == 0).sum())
                                            for t in tables[sid]),
                                        snapshot.seq_lens.get(sid, 0), -sid))
