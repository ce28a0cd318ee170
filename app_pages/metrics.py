"""Page 3: the two runs compared over time and per request; downloads."""
import json

import pandas as pd
import streamlit as st

from app_pages import _state as S
from app_pages import _ui
from viz.timeseries import breakdown_area, concurrency_chart, latency_cdf

st.title("Metrics")
st.caption("The whole run of each configuration: where the KV memory went, how many requests ran "
           "at once, and what users waited. Same workload, same pool size on both sides.")

scenario = _ui.scenario_sidebar()
runs = _ui.load_runs(scenario)
if runs is None:
    st.stop()
labels = [S.ALLOCATOR_LABELS[r.allocator] for r in runs]
st.subheader("Summary")
st.dataframe(S.summary_table(runs), use_container_width=True, key="met_summary")

st.subheader("Memory breakdown over time")
for col, run, label in zip(st.columns(2), runs, labels):
    col.plotly_chart(breakdown_area(run.timeseries, title=label, height=300),
                     key=f"met_mem_{labels.index(label)}")
st.subheader("Concurrency")
for col, run, label in zip(st.columns(2), runs, labels):
    col.plotly_chart(concurrency_chart(run.timeseries, title=label, height=280),
                     key=f"met_conc_{labels.index(label)}")

st.subheader("Latency")
st.caption("Cumulative distribution over requests; further left is better.")
per_run = {f"{i}: {label}": run.requests for i, (run, label) in enumerate(zip(runs, labels))}
for col, column in zip(st.columns(len(S.LATENCY_COLUMNS)), S.LATENCY_COLUMNS):
    col.plotly_chart(latency_cdf(per_run, column, title=S.LATENCY_COLUMNS[column], height=320),
                     key=f"met_cdf_{column}")

st.subheader("Downloads")
for col, (i, run) in zip(st.columns(2), enumerate(runs)):
    with col:
        st.markdown(f"**{labels[i]}**")
        st.download_button("Time series (CSV)", run.timeseries.to_csv(index=False),
                           f"kvsim_{run.allocator}_timeseries.csv", "text/csv",
                           key=f"dl_ts_{i}")
        st.download_button("Requests (CSV)", run.requests.to_csv(index=False),
                           f"kvsim_{run.allocator}_requests.csv", "text/csv", key=f"dl_req_{i}")
        st.download_button("Summary (JSON)", json.dumps(run.summary, indent=2, sort_keys=True),
                           f"kvsim_{run.allocator}_summary.json", "application/json",
                           key=f"dl_sum_{i}")
