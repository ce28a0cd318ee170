"""Page: a hybrid model's KV-cache groups over one pool, side by side, through time."""
import streamlit as st

from kvsim.errors import InputError
from kvsim.app_pages import _state as S
from kvsim.dashboard.hybrid import (SHAPES, HybridScenario, groups_frame,
                                    most_released_request)
from kvsim.dashboard.playback import clamp_frame, default_frame, fmt_duration
from kvsim.dashboard.sources import Workload, user_message
from kvsim.viz.kv_groups import group_pool_figure, request_tables_figure
from kvsim.workloads import DEFAULT_WORKLOAD

st.title("KV-cache groups (hybrid models)")
st.caption(
    "Models that mix layer types (gpt-oss, Gemma 3: sliding-window and full attention; "
    "Nemotron-H, Qwen3-Next: Mamba or linear attention and full attention) get one block table "
    "per **KV-cache group**, all drawing from one pool of equal-sized blocks (vLLM's hybrid "
    "KV-cache manager). Each panel is the whole pool as one group sees it: its blocks by "
    "request, the other groups' blocks grey. A sliding window frees the blocks behind it while "
    "the request still runs (grey positions in its table); a Mamba group holds one state block "
    "per request.")

S.defaults(k_hyb_shape=next(iter(SHAPES)), k_hyb_blocks=600, k_hyb_requests=80,
           k_hyb_spec=DEFAULT_WORKLOAD, k_hyb_prefix=True)
sb = st.sidebar
sb.header("Hybrid model")
shape = sb.selectbox("Group shape", list(SHAPES), key="k_hyb_shape")
groups = sb.text_input("Groups (vLLM's order)", SHAPES[shape], key=f"k_hyb_groups_{shape}",
                       help="full | sliding:W | mamba | mamba_ckpt[:A], comma-separated "
                            "(kvsim replay --kv-groups)")
num_blocks = sb.select_slider("Pool (blocks)", [200, 300, 400, 600, 800, 1200, 2000],
                              key="k_hyb_blocks")
spec = sb.text_input("Synthetic workload", key="k_hyb_spec")
max_requests = sb.slider("Requests", 20, 400, step=20, key="k_hyb_requests")
prefix = sb.toggle("Prefix caching", key="k_hyb_prefix")
scenario = HybridScenario(Workload("builtin", spec, max_requests), groups=groups,
                          num_gpu_blocks=num_blocks, enable_prefix_caching=prefix)
try:
    run = S.run_hybrid(scenario)
except InputError as err:     # bad groups, spec or pool
    st.error(user_message(err, scenario.workload))
    st.stop()

num_frames = len(run.snapshots)
S.defaults(k_hyb_frame=default_frame(num_frames))
clamp_frame(st.session_state, num_frames, key="k_hyb_frame")
frame = st.slider("Simulated time (frame)", 0, num_frames - 1, key="k_hyb_frame")
snap = run.snapshots[frame]
st.markdown(f"t = {fmt_duration(float(run.frame_times_s[frame]))} · "
            f"{len(snap.group_block_tables)} requests hold memory")
st.plotly_chart(group_pool_figure(snap), key="hyb_pool")
st.dataframe(groups_frame(snap, run.summary), hide_index=True, width="stretch",
             key="hyb_groups")
seq_id = most_released_request(snap)
if seq_id is None:
    st.info("No request holds memory at this moment; move the time slider.")
else:
    st.subheader("One request's tables")
    st.caption("The live request whose window left the most blocks behind: grey positions "
               "are blocks freed while it runs (vLLM's remove_skipped_blocks).")
    st.plotly_chart(request_tables_figure(snap, seq_id), key="hyb_tables")
