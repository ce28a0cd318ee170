"""The pages' thin Streamlit adapter: session state and cached wrappers around kvsim.dashboard.

Everything computed here is a function of kvsim.dashboard (tested without Streamlit); this
module only decides what Streamlit keeps: widget values across page switches, and which results
are cached (``st.cache_data`` copies a result out on every hit, ``st.cache_resource`` shares one
read-only object).
"""
from __future__ import annotations

import streamlit as st

from kvsim.dashboard import comparison, hybrid, planning, playback, scenario, sources
from kvsim.dashboard.kernel_check import check_snapshot

# widget keys whose values must survive page switches (Streamlit drops the state of widgets that a
# run does not draw; re-assigning a key makes it plain session state, see keep_widget_state)
PERSISTENT_PREFIX = "k_"


def keep_widget_state() -> None:
    """Keep every ``k_*`` widget's value across page switches."""
    for key in list(st.session_state.keys()):
        if str(key).startswith(PERSISTENT_PREFIX):
            st.session_state[key] = st.session_state[key]


def defaults(**values) -> None:
    """Seed widget values once; widgets are then drawn without a default (Streamlit warns when a
    widget gets both a default and a value through session state)."""
    for key, value in values.items():
        st.session_state.setdefault(key, value)


@st.cache_data(max_entries=8, show_spinner="Loading requests…")
def load_requests(workload: sources.Workload) -> list:
    """sources.load_requests, cached per workload."""
    return sources.load_requests(workload)


# cache_resource, not cache_data: the runs are large and read-only, and cache_data would unpickle
# a copy of every snapshot on each rerun (each playback tick)
@st.cache_resource(max_entries=4, show_spinner="Simulating…")
def run_scenario(sc: scenario.Scenario) -> tuple[scenario.Run, scenario.Run]:
    """Both sides of the scenario (scenario.simulate_scenario), cached; read-only."""
    return scenario.simulate_scenario(sc, load_requests(sc.workload))


@st.cache_resource(max_entries=4, show_spinner="Simulating…")
def run_hybrid(sc: hybrid.HybridScenario) -> hybrid.HybridRun:
    """The KV-cache groups page's run (hybrid.simulate_hybrid), cached; read-only."""
    return hybrid.simulate_hybrid(sc, load_requests(sc.workload))


@st.cache_data(max_entries=64, show_spinner=False)
def pool_figure(sc: scenario.Scenario, side: int, frame: int):
    """One side's pool heatmap at one frame (cached: scrubbing back costs nothing)."""
    return comparison.pool_figure(run_scenario(sc)[side], frame, sc.block_size)


@st.cache_resource(max_entries=4, show_spinner="Preparing playback…")
def live_payload(sc: scenario.Scenario) -> bytes:
    """Both runs' frames for the browser player (comparison.live_payload), cached; read-only."""
    return comparison.live_payload(run_scenario(sc))


def follow_player(frame_times_s, play_times_s) -> None:
    """Take the frame the player reported (its component state) as this session's moment."""
    state = st.session_state.get("live_player")
    frame = state.get("frame") if hasattr(state, "get") else getattr(state, "frame", None)
    if frame is not None:
        playback.follow_player(st.session_state, int(frame), frame_times_s, play_times_s)


def player_start_frame(sc: scenario.Scenario, num_frames: int, default: int | None = None) -> int:
    """The frame the player opens on (playback.start_frame over this session's state)."""
    return playback.start_frame(st.session_state, num_frames, default)


requests_note = st.cache_data(max_entries=32, show_spinner=False)(sources.requests_note)
store_hf_config = st.cache_data(max_entries=8, show_spinner=False)(planning.store_hf_config)
resolve_model = st.cache_data(max_entries=16, show_spinner=False)(planning.resolve_model)
capacity_sweep = st.cache_data(max_entries=32, show_spinner=False)(planning.capacity_sweep)
simulated_sweep = st.cache_data(max_entries=16, show_spinner="Simulating the sweep…")(
    planning.simulated_sweep)
cache_curve = st.cache_data(max_entries=8, show_spinner="Computing the hit-rate curves…")(
    planning.cache_curve)
bench_sweep = st.cache_data(max_entries=8, show_spinner="Simulating the concurrency sweep…")(
    planning.bench_sweep)
max_rate = st.cache_data(max_entries=8, show_spinner="Searching the highest rate…")(planning.max_rate)


@st.cache_data(max_entries=16, show_spinner="Running the Triton kernels…")
def kernel_check(sc: scenario.Scenario, side: int, frame: int, layout: str, dtype: str,
                 max_seqs: int, split_kv: bool, step: bool = False):
    """kernel_check.check_snapshot on one side's snapshot at one frame, cached."""
    return check_snapshot(run_scenario(sc)[side].snapshots[frame], layout, dtype, max_seqs,
                          split_kv, step)
