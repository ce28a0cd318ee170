"""Widgets shared by several pages (scenario picker in the sidebar). Layout only."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from kvsim.errors import InputError
from kvsim.app_pages import _state as S
from kvsim.dashboard.comparison import ALLOCATOR_LABELS, overload_warning, rejected_warning
from kvsim.dashboard.scenario import POOL_TOKENS, Scenario
from kvsim.dashboard.sources import (MAX_DASHBOARD_REQUESTS, MAX_UPLOAD_MB, Workload,
                                     shared_trace_files, store_upload, user_message)
from kvsim.simulator.config import ALLOCATORS, PLACEMENTS
from kvsim.workloads import DEFAULT_WORKLOAD


MAX_MODEL_LENS = (1024, 2048, 4096, 8192, 16384, 32768, 131072)


def scenario_sidebar() -> Scenario | None:
    """Draw the workload and allocator pickers; returns the scenario, or None after st.error."""
    # the demo opens unloaded: 65,536 tokens hold the built-in workload's requests on both sides
    # (8,192 held two of them on the max side, whose queue then grew: p50 TTFT 228 s)
    S.defaults(k_max_requests=120, k_all_requests=False, k_rate=2.0, k_max_model_len=4096,
               k_alloc_a="paged", k_alloc_b="max", k_capacity=65536, k_block_size=16,
               k_prefix=True, k_prefix_b=True, k_spec=DEFAULT_WORKLOAD, k_cpu_offload=0.0)
    sb = st.sidebar
    sb.header("Scenario")
    sources = ["built-in synthetic"]
    shared = shared_trace_files()
    if shared:
        sources.append("shared trace")
    sources.append("upload a trace")
    source = sb.radio("Workload", sources, key="k_source",
                      help="A synthetic workload, a public trace from ../shared/traces, or your own "
                           "CSV/JSONL trace, plain or .gz (parsed only, never executed).")
    whole = sb.toggle("All requests", key="k_all_requests",
                      help="Replay the whole trace (or every request of the spec).")
    max_requests = None if whole else int(sb.number_input(
        "Requests (at most)", 1, MAX_DASHBOARD_REQUESTS, step=20, key="k_max_requests"))
    rate = sb.number_input("Arrival rate (req/s) for traces without timestamps", 0.1, 100.0,
                           step=0.5, key="k_rate")
    workload: Workload | None = None
    if source == "built-in synthetic":
        spec = sb.text_input("Synthetic spec", key="k_spec")
        workload = Workload("builtin", spec, max_requests, rate)
    elif source == "shared trace":
        name = sb.selectbox("Trace file", shared, key="k_shared_trace")
        workload = Workload("shared", name, max_requests, rate)
    else:
        # not a k_* key: an uploader's value cannot be re-assigned, so the stored upload is
        # kept in session state instead (it survives page switches that way)
        up = sb.file_uploader("Trace file (CSV / JSONL, or .gz)", key="upload_trace",
                              max_upload_size=MAX_UPLOAD_MB,
                              help=f"At most {MAX_UPLOAD_MB} MB: compress a larger trace with "
                                   "gzip, or replay it with `kvsim replay FILE`.")
        sb.caption(f"Uploads: at most {MAX_UPLOAD_MB} MB (gzip a larger trace: .csv.gz, "
                   ".jsonl.gz), or `kvsim replay FILE` for any size.")
        if up is not None:
            try:
                st.session_state["upload_workload"] = store_upload(up.name, up.getvalue(),
                                                                   max_requests, rate)
            except InputError as err:  # type, size, empty
                st.session_state.pop("upload_workload", None)
                st.error(str(err))
                return None
        workload = st.session_state.get("upload_workload")
        if workload is None:
            st.info("Upload a trace in the sidebar (mooncake / azure / sharegpt / generic CSV or "
                    "JSONL / vllm-oracle, plain or .gz).")
            return None
        workload = Workload("upload", workload.ref, max_requests, rate)
        sb.caption(f"Using {Path(workload.ref).name}")
        _fit_max_model_len(workload)
    note = S.requests_note(workload)
    if note:
        sb.caption(note)

    sb.header("Allocators")
    a = sb.selectbox("Left", ALLOCATORS, key="k_alloc_a", format_func=ALLOCATOR_LABELS.get)
    b = sb.selectbox("Right", ALLOCATORS, key="k_alloc_b", format_func=ALLOCATOR_LABELS.get)
    placement = sb.radio("Contiguous placement", PLACEMENTS, horizontal=True,
                         key="k_placement")
    capacity = sb.select_slider("KV pool (tokens)", POOL_TOKENS, key="k_capacity")
    block_size = sb.select_slider("Block size (tokens)", [8, 16, 32, 64],
                                  key="k_block_size")
    max_model_len = sb.select_slider("max_model_len (tokens)", MAX_MODEL_LENS, key="k_max_model_len",
                                     help="Longest request; the 'max' policy reserves this much.")
    if source == "upload a trace" and st.session_state.get("upload_fit_note"):
        sb.caption(st.session_state["upload_fit_note"])
    help_pc = ("Paged allocator only. The same allocator on both sides with prefix caching on and "
               "off shows what prefix caching saves.")
    # a contiguous side has no prefix caching: shown off and disabled, its paged setting kept
    prefix = sb.toggle("Prefix caching, left (paged)", key="k_prefix", help=help_pc) if a == "paged" else \
        sb.toggle("Prefix caching, left (contiguous: none)", value=False, disabled=True, key="k_prefix_off")
    prefix_b = sb.toggle("Prefix caching, right (paged)", key="k_prefix_b", help=help_pc) if b == "paged" else \
        sb.toggle("Prefix caching, right (contiguous: none)", value=False, disabled=True, key="k_prefix_b_off")
    cpu_gib = sb.select_slider("CPU offload tier (GiB, paged side)", [0.0, 0.25, 0.5, 1.0, 2.0, 4.0],
                               key="k_cpu_offload",
                               help="vLLM's native CPU offloading below a paged pool with prefix "
                                    "caching: prompts are written through to CPU DRAM and "
                                    "loaded back on a hit (Llama-3.1-8B blocks, PCIe 5.0).")
    return Scenario(workload=workload, allocators=(a, b), placement=placement,
                    block_size=block_size, capacity_tokens=capacity,
                    max_model_len=max_model_len, enable_prefix_caching=(prefix, prefix_b),
                    frame_s=st.session_state.get("k_frame_s") or None, cpu_offload_gib=cpu_gib)


def _fit_max_model_len(workload: Workload) -> None:
    """On a new upload, set max_model_len to the smallest choice that holds the trace's longest
    request (the default 4,096 rejected 1,241 of a trace's 8,819 requests), and say so."""
    if st.session_state.get("upload_fitted") == workload.ref:
        return
    try:
        longest = max((r.prompt_tokens + r.output_tokens for r in S.load_requests(workload)), default=0)
    except InputError:   # a bad trace: load_runs reports it
        return
    fits = [n for n in MAX_MODEL_LENS if n >= longest]
    st.session_state["k_max_model_len"] = fits[0] if fits else MAX_MODEL_LENS[-1]
    st.session_state["upload_fitted"] = workload.ref
    st.session_state["upload_fit_note"] = (
        f"max_model_len set to {st.session_state['k_max_model_len']:,}: the trace's longest request "
        f"is {longest:,} tokens" + ("" if fits else " (longer than any choice: it is rejected)"))


def load_runs(scenario: Scenario | None):
    """The scenario's two runs, or None after showing why not (bad trace, impossible pool)."""
    if scenario is None:
        return None
    try:
        S.load_requests(scenario.workload)  # a bad trace is reported before anything else
        runs = S.run_scenario(scenario)
    except InputError as err:  # a bad trace, an impossible configuration
        st.error(user_message(err, scenario.workload))
        return None
    for i, run in enumerate(runs):
        warning = rejected_warning(i, run, scenario.max_model_len)
        if warning:
            st.warning(warning)
    overloaded = overload_warning(runs)
    if overloaded:
        st.warning(overloaded)
    return runs
