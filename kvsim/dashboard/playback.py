"""Playback: the frames the live pool plays, and the frame other pages open on.

The live pool plays in the browser (``app_pages/player.js``): the server hands it, once, every
frame of both pools as colour codes per tile (``viz.pool``'s codes: the first frame whole, then
only the tiles that change), with the figures shown beside each pool, so that playing,
pausing and stepping never wait for the server. A frame is every ``frame_s`` simulated seconds,
as the user picks; the number of frames is bounded by ``FRAME_CELL_BUDGET`` (cells recorded over
all frames and both pools), and a coarser step is used, and said, when the pick would exceed it.

Session-state keys: ``"k_frame"``, the frame of the inspector and kernel pages (the coarse
snapshots of ``scenario.Run.snapshots``), which the player sets when it pauses.
"""
from __future__ import annotations

import json
import math
import struct
from collections.abc import MutableMapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvsim.viz.classes import MEMORY_CLASSES
from kvsim.viz.pool import cell_codes, grid_shape, tile_codes

# the steps a user can pick between frames (simulated seconds); 0: auto, about DEFAULT_FRAMES
FRAME_STEPS_S = (0.0, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
DEFAULT_FRAMES = 400
MAX_FRAMES = 4000
# recording a frame costs a snapshot of each pool and its tile codes: about 230 ns per paged
# block (a Python pass over the blocks) and 12 ns per contiguous token (numpy), measured on the
# development machine; frames are limited so that recording takes about FRAME_TIME_BUDGET_S (a
# 131k-block paged pool beside a 2M-token contiguous one: about 140 frames; the default
# scenario: 400)
NS_PER_PAGED_BLOCK = 230
NS_PER_CONTIGUOUS_TOKEN = 12
FRAME_TIME_BUDGET_S = 8.0
FIGURES = ("running", "waiting", "kv_usage", "preemptions", "finished")


def default_frame(num_frames: int) -> int:
    """The frame a page opens on: a little way in, while both pools are busy."""
    return num_frames // 10


def busiest_frame(usages) -> int:
    """The frame a scenario's pages open on: the earliest where the pools together hold the most
    (each run's KV usage per frame, summed), so that a trace whose requests come late, or a run
    that drains early, does not open on an empty pool."""
    total = np.sum(np.asarray(usages, dtype=float), axis=0)
    return int(np.argmax(total)) if total.size else 0


def kv_usage_at(ts: pd.DataFrame, times_s: np.ndarray) -> np.ndarray:
    """KV usage at each of ``times_s`` from a run's time series (``sample_at``'s rule, 0 before
    the first sample)."""
    at = np.searchsorted(ts["time_s"].to_numpy(), times_s, side="right") - 1
    return np.where(at >= 0, ts["kv_usage"].to_numpy()[np.maximum(at, 0)], 0.0)


def start_frame(state: MutableMapping, num_frames: int, default: int | None = None) -> int:
    """The frame the player opens on: where it was paused (``"live_frame"``), else ``default``
    (else ``default_frame``)."""
    frame = state.get("live_frame")
    if frame is None:
        return default_frame(num_frames) if default is None else min(default, num_frames - 1)
    return min(int(frame), num_frames - 1)


def follow_player(state: MutableMapping, frame: int, frame_times_s: np.ndarray,
                  play_times_s: np.ndarray) -> None:
    """The player stopped on playback frame ``frame``: it opens there again (``"live_frame"``),
    and the inspector and kernel pages on the coarse frame of that moment (``"k_frame"``)."""
    frame = min(max(frame, 0), len(play_times_s) - 1)
    if state.get("live_frame") != frame:
        state["live_frame"] = frame
        state["k_frame"] = frame_at(frame_times_s, float(play_times_s[frame]))


def clamp_frame(state: MutableMapping, num_frames: int, key: str = "k_frame") -> None:
    """Keep the frame (widget ``key``) inside a run that may have fewer frames than the last."""
    if state.get(key, 0) >= num_frames:
        state[key] = num_frames - 1


def frame_at(frame_times_s: np.ndarray, t_s: float) -> int:
    """The last frame at or before ``t_s`` (the first one before any)."""
    return max(int(np.searchsorted(frame_times_s, t_s + 1e-9, side="right")) - 1, 0)


def frame_cost_s(cells: list[tuple[bool, int]]) -> float:
    """Seconds to record one frame of pools given as (paged, cells) pairs (the model above)."""
    return sum(n * (NS_PER_PAGED_BLOCK if paged else NS_PER_CONTIGUOUS_TOKEN) for paged, n in cells) * 1e-9


def frame_step_s(end_s: float, pick_s: float | None, cost_per_frame_s: float) -> tuple[float, str]:
    """The step between frames for a run ending at ``end_s``: the user's pick, or a coarser one
    when the pick would make more than MAX_FRAMES frames or take longer than FRAME_TIME_BUDGET_S
    to record. Returns (step, note): the note says why the step differs from the pick ('' if not).
    """
    end_s = max(end_s, 1e-9)
    pick_s = pick_s or None   # 0: auto
    most = int(max(2, min(MAX_FRAMES, FRAME_TIME_BUDGET_S / max(cost_per_frame_s, 1e-12))))
    wanted = end_s / DEFAULT_FRAMES if pick_s is None else pick_s
    step = max(wanted, end_s / (most - 1))
    if pick_s is None or step <= pick_s * (1 + 1e-9):
        return step, ""
    return step, (f"frames every {step:.3g} s, not {pick_s:g} s: at most {most:,} frames for "
                  "pools this large")


def playback_times(end_s: float, step_s: float) -> np.ndarray:
    """Frame times 0, step, 2 step, ... and a last frame at ``end_s`` (the final pool)."""
    if not step_s > 0:
        raise ValueError(f"step_s must be > 0, got {step_s}")
    n = int(math.floor(end_s / step_s + 1e-9))
    times = np.arange(n + 1, dtype=float) * step_s
    if times[-1] >= end_s - 1e-9 * max(end_s, 1.0):
        # exactly end_s: n x step can round to just below it (1037 x 0.1 = 103.69999999999999),
        # and a frame before the end showed a request still running on the last frame
        times[-1] = end_s
        return times
    return np.append(times, end_s)


@dataclass
class PoolFrames:
    """One side's pool over the playback frames: tile codes of frame 0, then each frame's changes.

    times_s: frame times. cells_per_tile: cells drawn as one tile (a contiguous pool's tokens at
    the paged block size). first: uint8 code per tile at frame 0. change_start: frame i's
    changes are ``change_tile[change_start[i]:change_start[i + 1]]`` (new codes in
    ``change_code``). figures: per frame, running / waiting / kv_usage / preemptions / finished
    and the share of the pool of each memory class (``MEMORY_CLASSES``).
    """

    times_s: np.ndarray
    cells_per_tile: int
    num_tiles: int
    first: np.ndarray
    change_start: np.ndarray
    change_tile: np.ndarray
    change_code: np.ndarray
    figures: dict[str, np.ndarray] = field(default_factory=dict)

    def codes_at(self, frame: int) -> np.ndarray:
        """Every tile's code at ``frame`` (the first frame's codes with the changes applied)."""
        codes = self.first.copy()
        end = self.change_start[frame + 1]
        # later changes of a tile overwrite earlier ones: assignment keeps the last
        codes[self.change_tile[:end]] = self.change_code[:end]
        return codes


class FrameRecorder:
    """Collects PoolFrames from a simulation stepped frame by frame."""

    def __init__(self, cells_per_tile: int):
        self.cells_per_tile = cells_per_tile
        self.times: list[float] = []
        self.prev: np.ndarray | None = None
        self.first: np.ndarray | None = None
        self.starts = [0, 0]
        self.tiles: list[np.ndarray] = []
        self.codes: list[np.ndarray] = []
        self.figures: dict[str, list[float]] = {name: [] for name in (*FIGURES, *MEMORY_CLASSES)}

    def add(self, t_s: float, snapshot, state: dict) -> None:
        """Record the frame at ``t_s`` from a PoolSnapshot and ``Simulation.state()``."""
        codes = tile_codes(cell_codes(snapshot.cell_class, snapshot.owner, snapshot.ref_cnt),
                           self.cells_per_tile)
        if self.prev is None:
            self.first = codes
        else:
            changed = np.flatnonzero(codes != self.prev).astype(np.uint32)
            self.tiles.append(changed)
            self.codes.append(codes[changed])
            self.starts.append(self.starts[-1] + len(changed))
        self.prev = codes
        self.times.append(t_s)
        for name in FIGURES:
            self.figures[name].append(float(state[name]))
        total = sum(state["breakdown"].values()) or 1
        for name in MEMORY_CLASSES:
            self.figures[name].append(state["breakdown"][name] / total)

    def frames(self) -> PoolFrames:
        empty = np.zeros(0, dtype=np.uint32)
        return PoolFrames(
            times_s=np.asarray(self.times), cells_per_tile=self.cells_per_tile,
            num_tiles=len(self.first), first=self.first,
            change_start=np.asarray(self.starts[:len(self.times) + 1], dtype=np.int64),
            change_tile=np.concatenate(self.tiles) if self.tiles else empty,
            change_code=np.concatenate(self.codes) if self.codes else empty.astype(np.uint8),
            figures={k: np.asarray(v) for k, v in self.figures.items()})


def player_payload(sides: list[tuple[str, PoolFrames, float]], *, colors: list[str],
                   class_colors: dict[str, str], note: str = "") -> bytes:
    """What the browser player receives (without the start frame: ``with_start_frame``).

    Args:
        sides: (title, frames, end of that side's run in seconds) per pool.
        colors: colour of each tile code (viz.pool.code_colors).
        class_colors: colour of each memory class (the strips).
        note: shown under the controls (playback_note).
    Returns:
        uint32 length of a UTF-8 JSON header, the header, then the arrays it names at their
        offsets (8-byte aligned, little-endian): the frame times (float64) once, and per side
        ``first`` (uint8), ``change_start`` and ``change_tile`` (uint32), ``change_code``
        (uint8) and one float32 array per figure.
    """
    blobs: list[bytes] = []
    offset = 0

    def add(array: np.ndarray) -> dict:
        nonlocal offset
        data = np.ascontiguousarray(array).tobytes()
        entry = {"offset": offset, "length": int(array.size), "dtype": str(array.dtype)}
        pad = (-len(data)) % 8
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
        return entry

    times = sides[0][1].times_s
    header = {"num_frames": int(len(times)), "note": note, "times": add(times.astype(np.float64)),
              "colors": list(colors), "class_colors": dict(class_colors), "sides": []}
    for title, frames, end_s in sides:
        if len(frames.times_s) != len(times):
            raise ValueError("both sides must have the same frames")
        rows, cols = grid_shape(frames.num_tiles)
        header["sides"].append({
            "title": title, "end_s": float(end_s), "num_tiles": frames.num_tiles, "rows": rows,
            "cols": cols, "cells_per_tile": frames.cells_per_tile,
            "first": add(frames.first.astype(np.uint8)),
            "change_start": add(frames.change_start.astype(np.uint32)),
            "change_tile": add(frames.change_tile.astype(np.uint32)),
            "change_code": add(frames.change_code.astype(np.uint8)),
            "figures": {k: add(v.astype(np.float32)) for k, v in frames.figures.items()}})
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * ((-(8 + len(head))) % 8)
    return struct.pack("<I", len(head)) + head + b"".join(blobs)


def with_start_frame(payload: bytes, frame: int) -> bytes:
    """The payload the player mounts with: the frame to open on, then ``player_payload``'s bytes."""
    return struct.pack("<I", max(int(frame), 0)) + payload


def decode_player(data: bytes) -> dict:
    """The player's message read back as the browser reads it (``with_start_frame`` bytes):
    the header with every array named in it as a numpy array, and ``start_frame``."""
    start, head_len = struct.unpack_from("<II", data, 0)
    header = json.loads(data[8:8 + head_len])
    body = memoryview(data)[8 + head_len:]

    def arr(entry):
        dtype = np.dtype(entry["dtype"])
        return np.frombuffer(body, dtype=dtype, count=entry["length"], offset=entry["offset"])

    header["start_frame"] = min(start, header["num_frames"] - 1)
    header["times"] = arr(header["times"])
    for side in header["sides"]:
        for key in ("first", "change_start", "change_tile", "change_code"):
            side[key] = arr(side[key])
        side["figures"] = {k: arr(v) for k, v in side["figures"].items()}
    return header


def sample_at(ts: pd.DataFrame, t_s: float, time_col: str = "time_s") -> pd.Series:
    """The last timeseries sample at or before ``t_s`` (the first one before any sample)."""
    if ts.empty:
        raise ValueError("the timeseries is empty")
    i = int(np.searchsorted(ts[time_col].to_numpy(), t_s, side="right")) - 1
    return ts.iloc[max(i, 0)]


def upto(ts: pd.DataFrame, t_s: float, time_col: str = "time_s") -> pd.DataFrame:
    """Samples up to ``t_s``."""
    return ts[ts[time_col] <= t_s]


def fmt_duration(t_s: float) -> str:
    """Simulated time for labels: 0.0 s, 12.3 s, 4 min 05.0 s."""
    if t_s < 60:
        return f"{t_s:.1f} s"
    m = math.floor(t_s / 60)
    return f"{m} min {t_s - 60 * m:04.1f} s"
