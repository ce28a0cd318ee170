"""Page 1: two KV pools side by side, played through simulated time (in the browser)."""
import streamlit as st

from kvsim.app_pages import _state as S
from kvsim.app_pages import _ui
from kvsim.app_pages._player import live_player
from kvsim.dashboard.comparison import ALLOCATOR_NOTES, tier_rows
from kvsim.dashboard.playback import FRAME_STEPS_S, busiest_frame, sample_at, with_start_frame
from kvsim.viz.tiers import tier_occupancy_figure

st.title("Live KV-cache pool")
st.caption(
    "Every cell is one KV block (paged) or one block-sized stretch of a contiguous pool. "
    "Colour = the request holding it (greens and violets); **dark** = a block shared by several "
    "requests through prefix caching; **pale blue** = a freed block still holding a reusable "
    "prefix (evictable); **yellow** = space a contiguous allocator reserved for tokens not yet "
    "generated; **red** = internal fragmentation (held, never filled); **wine** = external "
    "fragmentation (free, but too scattered for the waiting request). Press play to watch "
    "requests arrive, grow one token per step and leave; it plays in your browser, so pause "
    "stops at once.")

S.defaults(k_frame_s=0.0)
scenario = _ui.scenario_sidebar()
runs = _ui.load_runs(scenario)
if runs is None:
    st.stop()
c1, c2 = st.columns([1, 3], vertical_alignment="bottom")
c1.selectbox("Frame every (simulated s)", FRAME_STEPS_S, key="k_frame_s",
             format_func=lambda s: "auto (about 400 frames)" if not s else f"{s:g} s",
             help="The granularity of playback: one frame per this much simulated time.")
c2.caption(" · ".join(f"**{side}**: {ALLOCATOR_NOTES[r.allocator]}"
                      for side, r in zip(("left", "right"), runs)))
times = runs[0].playback.times_s
# where the player stopped (its state, sent before this run), so a rerun mounts it right there
S.follow_player(runs[0].frame_times_s, times)
start = S.player_start_frame(scenario, len(times),
                             busiest_frame([r.playback.figures["kv_usage"] for r in runs]))
live_player(with_start_frame(S.live_payload(scenario), start), key="live_player")
if any("offload" in r.summary for r in runs):   # the tiers below the pools, where play stopped
    t_s = float(times[start])
    st.caption("Offload tiers below each paged pool, at the moment the player last stopped "
               "(pause to update): GPU pool held and cached, chunks stored in each tier.")
    for col, (side, run) in zip(st.columns(2), enumerate(runs)):
        if "offload" in run.summary:
            col.plotly_chart(tier_occupancy_figure(tier_rows(run, sample_at(run.timeseries, t_s))),
                             key=f"live_tiers_{side}", config={"displayModeBar": False})
