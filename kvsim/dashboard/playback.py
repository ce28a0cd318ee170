"""Frame selection and playback: which snapshot a page shows, and the play / pause / step machine.

Playback state lives in a mutable mapping (Streamlit's session state, or a dict in tests):
``"k_frame"`` (the scrubber's frame), ``"live_playing"`` and ``"k_speed"`` (frames per tick).
"""
from __future__ import annotations

import math
from collections.abc import MutableMapping

import numpy as np
import pandas as pd

TICK_S = 0.5  # playback timer period (seconds of wall time per tick)


def default_frame(num_frames: int) -> int:
    """The frame a page opens on: a little way in, while both pools are busy."""
    return num_frames // 10


def next_frame(frame: int, num_frames: int, frames_per_tick: int) -> tuple[int, bool]:
    """Advance playback; returns the new frame and whether playback should keep going."""
    nxt = min(frame + max(frames_per_tick, 1), num_frames - 1)
    return nxt, nxt < num_frames - 1


def clamp_frame(state: MutableMapping, num_frames: int) -> None:
    """Keep the frame inside a run that may have fewer frames than the last one."""
    if state.get("k_frame", 0) >= num_frames:
        state["k_frame"] = num_frames - 1


def toggle_play(state: MutableMapping, num_frames: int) -> None:
    """Play / pause; playing from the last frame starts again from the first."""
    if not state.get("live_playing") and state.get("k_frame", 0) >= num_frames - 1:
        state["k_frame"] = 0
    state["live_playing"] = not state.get("live_playing")


def step(state: MutableMapping, num_frames: int) -> None:
    """Pause and move one frame on."""
    state["live_playing"] = False
    state["k_frame"] = next_frame(state.get("k_frame", 0), num_frames, 1)[0]


def tick(state: MutableMapping, num_frames: int) -> bool:
    """One timer tick while playing: advance by the speed; returns True when playback ended."""
    if not state.get("live_playing"):
        return False
    state["k_frame"], more = next_frame(state.get("k_frame", 0), num_frames,
                                        state.get("k_speed", 1))
    if not more:
        state["live_playing"] = False
    return not more


def sample_at(ts: pd.DataFrame, t_s: float, time_col: str = "time_s") -> pd.Series:
    """The last timeseries sample at or before ``t_s`` (the first one before any sample)."""
    if ts.empty:
        raise ValueError("the timeseries is empty")
    i = int(np.searchsorted(ts[time_col].to_numpy(), t_s, side="right")) - 1
    return ts.iloc[max(i, 0)]


def upto(ts: pd.DataFrame, t_s: float, time_col: str = "time_s") -> pd.DataFrame:
    """Samples up to ``t_s`` (the live strip grows as playback advances)."""
    return ts[ts[time_col] <= t_s]


def fmt_duration(t_s: float) -> str:
    """Simulated time for labels: 0.0 s, 12.3 s, 4 min 05.0 s."""
    if t_s < 60:
        return f"{t_s:.1f} s"
    m = math.floor(t_s / 60)
    return f"{m} min {t_s - 60 * m:04.1f} s"
