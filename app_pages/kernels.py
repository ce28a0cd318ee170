"""Page 5: run the Triton paged-attention kernels on the current snapshot's block tables."""
import streamlit as st

from kvsim.errors import InputError
from kvsim.app_pages import _state as S
from kvsim.app_pages import _ui
from kvsim.dashboard.comparison import side_label
from kvsim.dashboard.kernel_check import KERNEL_DTYPES, SPLIT_KV_PARTITION_TOKENS, kernel_device
from kvsim.dashboard.playback import busiest_frame, clamp_frame, kv_usage_at
from kvsim.viz.kernel_checks import kernel_error_figure

st.title("Kernel validation")
st.caption(
    "The simulated block tables are real: this page fills a KV pool tensor block by block (each "
    "block's K/V derived from its content key, so shared prefix blocks hold identical data), "
    "writes it with the Triton **reshape_and_cache** kernel, runs Triton **paged attention** over "
    "the snapshot's block tables and compares every sequence with float64 dense attention. It also "
    "runs the same kernel on an identity block table: paging must change where KV lives, never "
    "what attention computes, so the two outputs must be bitwise equal.")
scenario = _ui.scenario_sidebar()
runs = _ui.load_runs(scenario)
if runs is None:
    st.stop()
num_frames = len(runs[0].snapshots)
S.defaults(k_frame=busiest_frame([kv_usage_at(r.timeseries, r.frame_times_s) for r in runs]),
           k_kern_layout="flat", k_kern_dtype="float32",
           k_kern_max_seqs=4, k_kern_split=False, k_kern_step=False)
clamp_frame(st.session_state, num_frames)
device = kernel_device()
st.caption("Device: **CUDA**" if device == "cuda" else
           "Device: **CPU**, through the Triton interpreter (no GPU here); head sizes are scaled "
           "down so that it stays quick.")
c = st.columns([1, 2])
side = c[0].radio("Pool", [0, 1], key="k_kern_side",
                  format_func=lambda i: side_label(runs[i]))
frame = c[1].slider("Simulated time (frame)", 0, num_frames - 1, key="k_frame")
c = st.columns([1, 1, 2, 1, 1], vertical_alignment="bottom")
layout = c[0].selectbox("Layout", ["flat", "vllm"], key="k_kern_layout",
                        help="flat: [blocks, block_size, heads, head_size] (vLLM's Triton "
                             "backend); vllm: the CUDA PagedAttention layout (K split in 16-byte "
                             "vectors).")
dtype = c[1].selectbox("dtype", KERNEL_DTYPES, key="k_kern_dtype")
max_seqs = c[2].slider("Sequences (at most)", 1, 32, key="k_kern_max_seqs",
                       help="Chosen so that shared prefix blocks are read by two checked "
                            "sequences (sharing is only tested when both are in the launch).")
split_kv = c[3].toggle("Split-KV (v2)", key="k_kern_split",
                       help="Force the split-KV kernel with "
                            f"{SPLIT_KV_PARTITION_TOKENS}-token partitions.")
step = c[4].toggle("Whole engine step", key="k_kern_step",
                   help="Run the engine step that produced this frame as vLLM v1 does: its "
                        "prefills, chunks after prefix-cache hits and decodes in one unified "
                        "attention launch (the sequence slider does not apply).")
if not runs[side].snapshots[frame].block_tables:
    st.info("No request holds memory at this moment; move the time slider.")
    st.stop()
try:
    checks, info = S.kernel_check(scenario, side, frame, layout, dtype, max_seqs, split_kv, step)
except InputError as err:  # a frame without a step batch: say so, keep running
    st.error(str(err))
    st.stop()
if step and (checks["num_new_tokens"] == 1).all():
    st.info("This frame ended a decode-only step. `kvsim validate WORKLOAD --at S --step` picks "
            "the first step after S that admits an arrival, so its prefill runs beside the decodes.")
m = st.columns(5)
m[0].metric("Sequences checked", len(checks),
            help=(f"{int((checks['num_new_tokens'] > 1).sum())} prefill or chunk rows, "
                  f"{int((checks['num_new_tokens'] == 1).sum())} decodes, "
                  f"{int(checks['num_new_tokens'].sum())} new tokens in one launch")
            if step else None)
m[1].metric("Within tolerance", f"{int(checks['passed'].sum())} / {len(checks)}")
m[2].metric("Worst relative error", f"{checks['max_rel_err'].max():.2e}")
m[3].metric("Bitwise equal to identity table", "all" if checks["bitwise_equal"].all() else
            f"{int(checks['bitwise_equal'].sum())} / {len(checks)}")
m[4].metric("Shared blocks exercised", f"{info['num_shared_blocks_checked']} / {info['num_shared_blocks']}",
            help="Blocks that two or more sequences read, and of those the ones two checked "
                 "sequences read in the same launch.")
st.caption(f"{len(checks)} of {info['num_sequences']} sequences with tokens checked; "
           f"{info['num_shared_blocks_checked']} of the {info['num_shared_blocks']} shared blocks read "
           "by two of them.")
if info["passed"]:
    st.success(f"Paged attention over these block tables matches dense attention "
               f"(tolerance {info['tolerance']:g} for {info['dtype']}) and is bitwise equal to "
               "the identity-table run.")
else:
    st.error("Some sequences failed: see the table below.")
st.plotly_chart(kernel_error_figure(checks, info["tolerance"]), key="kern_fig")
st.dataframe(checks, hide_index=True, width="stretch", key="kern_table")
st.caption(f"{info['num_heads']} query heads, {info['num_kv_heads']} KV heads, head size "
           f"{info['head_size']}, layout {info['layout']}, device {info['device']}"
           + (f"; {info['num_skipped_empty']} empty sequences skipped"
              if info["num_skipped_empty"] else ""))
