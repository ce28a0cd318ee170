"""Page 2: one request's block table, slot_mapping and sharing at the current moment."""
import streamlit as st

from kvsim.app_pages import _state as S
from kvsim.app_pages import _ui
from kvsim.dashboard.comparison import side_label
from kvsim.dashboard.playback import busiest_frame, clamp_frame, fmt_duration, kv_usage_at
from kvsim.viz.block_table import (block_table_figure, block_table_frame, contiguous_extent,
                                   extent_figure, requests_frame, slot_mapping_runs)

st.title("Block table inspector")
st.caption(
    "PagedAttention keeps, per request, a **block table**: logical block i (tokens i·B to "
    "i·B+B-1) lives in physical block table[i], anywhere in the pool. The kernel finds token t's "
    "KV at **slot_mapping[t] = table[t // B]·B + t % B**. Blocks with ref_cnt > 1 are shared "
    "(same prefix, stored once). A contiguous allocator instead gives each request one extent.")

scenario = _ui.scenario_sidebar()
runs = _ui.load_runs(scenario)
if runs is None:
    st.stop()
num_frames = len(runs[0].snapshots)
c1, c2 = st.columns([1, 3])
side = c1.radio("Pool", [0, 1], key="k_insp_side",
                format_func=lambda i: side_label(runs[i]))
S.defaults(k_frame=busiest_frame([kv_usage_at(r.timeseries, r.frame_times_s) for r in runs]))
clamp_frame(st.session_state, num_frames)
# the same key as the live page's scrubber: the inspector opens on the moment paused there
frame = c2.slider("Simulated time (frame)", 0, num_frames - 1, key="k_frame")
run = runs[side]
snap = run.snapshots[frame]
st.markdown(f"**{side_label(run)}** at t = "
            f"{fmt_duration(float(run.frame_times_s[frame]))}")
live = requests_frame(snap)
if live.empty:
    st.info("No request holds memory at this moment; move the time slider.")
    st.stop()
st.caption("Click a request to inspect it.")
picked = st.dataframe(live, key="k_insp_table", on_select="rerun", selection_mode="single-row",
                      hide_index=True, width="stretch", height=220)
rows = picked.selection.rows if picked is not None else []
# until a row is clicked: the request sharing most blocks (the most instructive one)
seq_id = int(live.iloc[rows[0]]["seq_id"] if rows else
             live.sort_values(["num_shared_blocks", "seq_id"], ascending=[False, True])
             .iloc[0]["seq_id"])

if snap.kind == "contiguous":
    ext = contiguous_extent(snap, seq_id)
    st.plotly_chart(extent_figure(snap, seq_id), key="insp_extent")
    m = st.columns(6)
    m[0].metric("extent (cells)", f"{ext['first_cell']}–{ext['last_cell']}")
    m[1].metric("holding tokens", ext["token_states_cells"])
    m[2].metric("reserved ahead", ext["reservation_cells"])
    m[3].metric("never filled", ext["internal_fragmentation_cells"] +
                ext["external_fragmentation_cells"])
    m[4].metric("free before", ext["hole_before_cells"])
    m[5].metric("free after", ext["hole_after_cells"])
    st.subheader("slot_mapping")
    st.caption("One extent, so one run: token i lives in slot first_cell + i.")
    st.dataframe(slot_mapping_runs(snap, seq_id), hide_index=True, width="stretch",
                 key="insp_slots")
else:
    st.plotly_chart(block_table_figure(snap, seq_id), key="insp_fig")
    left, right = st.columns([3, 2])
    with left:
        st.subheader(f"Block table of request {seq_id}")
        st.dataframe(block_table_frame(snap, seq_id), hide_index=True, width="stretch",
                     height=300, key="insp_bt")
    with right:
        st.subheader("slot_mapping")
        st.caption("Token ranges and the physical slots they map to (one row per contiguous "
                   "run).")
        st.dataframe(slot_mapping_runs(snap, seq_id), hide_index=True, width="stretch",
                     height=300, key="insp_slots")
