"""Page 3: the two runs compared over time and per request; downloads."""
import streamlit as st

from kvsim.app_pages import _ui
from kvsim.dashboard.comparison import (HEADLINE, LATENCY_COLUMNS, flat_summaries, prefix_frame,
                                        run_label, side_label, summary_table)
from kvsim.viz.style import SIDE_COLORS
from kvsim.viz.timeseries import (breakdown_area, compare_bars, concurrency_chart,
                                  concurrency_limits, latency_cdf, line_chart)

st.title("Metrics")
st.caption("The whole run of each configuration: where the KV memory went, how many requests ran "
           "at once, and what users waited. Same workload, same pool size on both sides.")

scenario = _ui.scenario_sidebar()
runs = _ui.load_runs(scenario)
if runs is None:
    st.stop()
labels = [side_label(r) for r in runs]
end_s = max(r.end_s for r in runs)
colors = {run_label(i, r): c for i, (r, c) in enumerate(zip(runs, SIDE_COLORS))}
st.subheader("Headline")
st.plotly_chart(compare_bars(flat_summaries(runs), HEADLINE, colors=colors, height=280),
                key="met_headline")
with st.expander("Every summary figure"):
    st.dataframe(summary_table(runs), width="stretch", key="met_summary",
                 column_config={"_index": st.column_config.Column("metric", width="large")})

st.subheader("Memory breakdown over time")
for side, (col, run, label) in enumerate(zip(st.columns(2), runs, labels)):
    col.plotly_chart(breakdown_area(run.timeseries, title=label, height=330,
                                    x_range=(0, end_s)), key=f"met_mem_{side}")
st.subheader("Concurrency")
same_scale = concurrency_limits([r.timeseries for r in runs])  # side by side, one y scale
for side, (col, run, label) in enumerate(zip(st.columns(2), runs, labels)):
    col.plotly_chart(concurrency_chart(run.timeseries, title=label, height=280,
                                       x_range=(0, end_s), **same_scale), key=f"met_conc_{side}")

st.subheader("Prefix caching")
st.caption("Share of prompt tokens served from cached blocks so far (only the paged allocator "
           "caches prefixes; a preempted request's re-admission counts too).")
hits = prefix_frame(runs)
st.plotly_chart(line_chart(hits, "time_s", {c: c for c in hits.columns if c != "time_s"},
                           title="Prefix hit rate (cumulative)", x_title="simulated time (s)",
                           y_title="hit rate", height=280, y_tickformat=".0%"), key="met_prefix")

st.subheader("Latency")
st.caption("Cumulative distribution over requests; further left is better.")
per_run = {run_label(i, run): run.requests for i, run in enumerate(runs)}
for col, column in zip(st.columns(len(LATENCY_COLUMNS)), LATENCY_COLUMNS):
    col.plotly_chart(latency_cdf(per_run, column, title=LATENCY_COLUMNS[column], height=340,
                                 colors=colors), key=f"met_cdf_{column}")

st.subheader("Downloads")
for col, (i, run) in zip(st.columns(2), enumerate(runs)):
    with col:
        st.markdown(f"**{labels[i]}**")
        st.download_button("Time series (CSV)", run.timeseries.to_csv(index=False),
                           f"kvsim_{run.allocator}_timeseries.csv", "text/csv",
                           key=f"dl_ts_{i}")
        st.download_button("Requests (CSV)", run.requests.to_csv(index=False),
                           f"kvsim_{run.allocator}_requests.csv", "text/csv", key=f"dl_req_{i}")
        st.download_button("Summary (JSON)", run.summary_json,
                           f"kvsim_{run.allocator}_summary.json", "application/json",
                           key=f"dl_sum_{i}")
