"""Page 1: two KV pools side by side, played through simulated time."""
import streamlit as st

from kvsim.app_pages import _state as S
from kvsim.app_pages import _ui
from kvsim.dashboard.comparison import ALLOCATOR_NOTES, tier_rows
from kvsim.dashboard.playback import (TICK_S, clamp_frame, default_frame, fmt_duration,
                                      sample_at, step, tick, toggle_play, upto)
from kvsim.viz.tiers import tier_occupancy_figure
from kvsim.viz.timeseries import breakdown_area, concurrency_chart

st.title("Live KV-cache pool")
st.caption(
    "Every cell is one KV block (paged) or one block-sized stretch of a contiguous pool. "
    "Colour = the request holding it; **dark** = a block shared by several requests through "
    "prefix caching; **pale blue** = a freed block still holding a reusable prefix (evictable); "
    "**yellow** = space a contiguous allocator reserved for tokens not yet generated; "
    "**red** = internal fragmentation (held, never filled); **wine** = external fragmentation "
    "(free, but too scattered for the waiting request). Press play to watch requests arrive, "
    "grow one token per step and leave.")

scenario = _ui.scenario_sidebar()
runs = _ui.load_runs(scenario)
if runs is None:
    st.stop()
num_frames = len(runs[0].snapshots)
end_s = float(runs[0].frame_times_s[-1])
S.defaults(live_playing=False, k_speed=1, k_frame=default_frame(num_frames))
clamp_frame(st.session_state, num_frames)
playing = st.session_state["live_playing"]
c1, c2, c3, _ = st.columns([1, 1, 3, 5], vertical_alignment="bottom")
c1.button(":material/pause: Pause" if playing else ":material/play_arrow: Play", key="play",
          on_click=toggle_play, args=(st.session_state, num_frames), type="primary",
          width="stretch")
c2.button(":material/skip_next: Step", key="step", on_click=step,
          args=(st.session_state, num_frames), width="stretch")
c3.select_slider("Speed (frames per tick)", [1, 2, 4, 8], key="k_speed")


@st.fragment(run_every=TICK_S if playing else None)
def live_view():
    if tick(st.session_state, num_frames):
        st.rerun(scope="app")  # stop the timer: run_every is fixed when the fragment is drawn
    frame = st.slider("Simulated time (frame)", 0, num_frames - 1, key="k_frame")
    t_s = float(runs[0].frame_times_s[frame])
    st.markdown(f"**t = {fmt_duration(t_s)}** of {fmt_duration(end_s)}")
    for col, (side, run) in zip(st.columns(2), enumerate(runs)):
        with col:
            st.caption(ALLOCATOR_NOTES[run.allocator])
            now = sample_at(run.timeseries, t_s)
            m = st.columns(4)
            m[0].metric("KV usage", f"{100 * float(now['kv_usage']):.0f}%")
            m[1].metric("running", int(now["running"]))
            m[2].metric("waiting", int(now["waiting"]))
            m[3].metric("preemptions", int(now["num_preemptions"]))
            st.plotly_chart(S.pool_figure(scenario, side, frame), key=f"live_pool_{side}",
                            config={"displayModeBar": False})
            if "offload" in run.summary:   # the tiers below this pool, at the same moment
                st.plotly_chart(tier_occupancy_figure(tier_rows(run, now)),
                                key=f"live_tiers_{side}", config={"displayModeBar": False})
            past = upto(run.timeseries, t_s)
            st.plotly_chart(breakdown_area(past, title="Memory breakdown (colours as above)",
                                           now_s=t_s, height=230, x_range=(0, end_s),
                                           show_legend=False), key=f"live_mem_{side}")
            st.plotly_chart(concurrency_chart(past, title="Running / waiting / preemptions",
                                              now_s=t_s, height=230, x_range=(0, end_s)),
                            key=f"live_conc_{side}")


live_view()
