"""Widgets shared by several pages (scenario picker in the sidebar). Layout only."""
from __future__ import annotations

import streamlit as st

from kvsim.app_pages import _state as S


def scenario_sidebar() -> S.Scenario | None:
    """Draw the workload and allocator pickers; returns the scenario, or None after st.error."""
    workloads = S.backend("workloads", "load", "DEFAULT_WORKLOAD")
    S.defaults(k_max_requests=120, k_rate=2.0, k_max_model_len=4096, k_alloc_a="paged",
               k_alloc_b="max", k_capacity=8192,
               k_block_size=16, k_prefix=True)
    if workloads is not None:
        S.defaults(k_spec=workloads.DEFAULT_WORKLOAD)
    sb = st.sidebar
    sb.header("Scenario")
    sources = ["built-in synthetic"]
    shared = S.shared_trace_files()
    if shared:
        sources.append("shared trace")
    sources.append("upload a trace")
    source = sb.radio("Workload", sources, key="k_source",
                      help="A synthetic workload, a public trace from ../shared/traces, or your own "
                           "CSV/JSONL trace (parsed only, never executed).")
    max_requests = sb.slider("Requests", 20, 1000, step=20, key="k_max_requests")
    rate = sb.number_input("Arrival rate (req/s) for traces without timestamps", 0.1, 100.0,
                           step=0.5, key="k_rate")
    workload: S.Workload | None = None
    if source == "built-in synthetic":
        if workloads is None:
            st.info("The workloads package is not available yet (branch work).")
            return None
        spec = sb.text_input("Synthetic spec", key="k_spec")
        workload = S.Workload("builtin", spec, max_requests, rate)
    elif source == "shared trace":
        name = sb.selectbox("Trace file", shared, key="k_shared_trace")
        workload = S.Workload("shared", name, max_requests, rate)
    else:
        # not a k_* key: an uploader's value cannot be re-assigned, so the stored upload is
        # kept in session state instead (it survives page switches that way)
        up = sb.file_uploader("Trace file (CSV / JSONL)",
                              key="upload_trace", max_upload_size=S.MAX_UPLOAD_MB)
        if up is not None:
            stored = S.store_upload(up.name, up.getvalue(), max_requests, rate)
            if isinstance(stored, str):
                st.session_state.pop("upload_workload", None)
                st.error(stored)
                return None
            st.session_state["upload_workload"] = stored
        workload = st.session_state.get("upload_workload")
        if workload is None:
            st.info("Upload a trace in the sidebar (mooncake / azure / sharegpt / generic CSV or "
                    "JSONL / vllm-oracle).")
            return None
        workload = S.Workload("upload", workload.ref, max_requests, rate)
        sb.caption(f"Using {S.Path(workload.ref).name}")

    sb.header("Allocators")
    a = sb.selectbox("Left", S.ALLOCATORS, key="k_alloc_a",
                     format_func=S.ALLOCATOR_LABELS.get)
    b = sb.selectbox("Right", S.ALLOCATORS, key="k_alloc_b",
                     format_func=S.ALLOCATOR_LABELS.get)
    placement = sb.radio("Contiguous placement", ["buddy", "first-fit"], horizontal=True,
                         key="k_placement")
    capacity = sb.select_slider("KV pool (tokens)",
                                [2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144],
                                key="k_capacity")
    block_size = sb.select_slider("Block size (tokens)", [8, 16, 32, 64],
                                  key="k_block_size")
    max_model_len = sb.select_slider("max_model_len (tokens)", [1024, 2048, 4096, 8192, 16384,
                                                                 32768, 131072],
                                     key="k_max_model_len",
                                     help="Longest request; the 'max' policy reserves this much.")
    prefix = sb.toggle("Prefix caching (paged)", key="k_prefix")
    return S.Scenario(workload=workload, allocators=(a, b), placement=placement,
                      block_size=block_size, capacity_tokens=capacity,
                      max_model_len=max_model_len,
                      enable_prefix_caching=prefix)


def load_runs(scenario: S.Scenario | None):
    """The scenario's two runs, or None after showing why not (bad trace, missing backend)."""
    if scenario is None:
        return None
    try:
        S.load_requests(scenario.workload)  # a bad trace is reported before anything else
        if S.backend("simulator", "simulate", "EngineConfig") is None:
            st.info("The simulator (branch sim) is not available yet; this page fills in when "
                    "it lands.")
            return None
        runs = S.run_scenario(scenario)
    except ValueError as err:  # kvsim.errors.InputError and impossible configurations
        st.error(S.user_message(err, scenario.workload))
        return None
    for i, run in enumerate(runs):
        if run.summary["requests_rejected"]:
            st.warning(f"{S.run_label(i, run)}: {run.summary['requests_rejected']} of "
                       f"{run.summary['requests_arrived']} requests rejected (prompt longer than "
                       f"max_model_len = {scenario.max_model_len}, or more KV than the whole "
                       "pool); raise them in the sidebar.")
    return runs
