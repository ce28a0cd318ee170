"""Plotly figures for ``kvsim plan`` sweeps (HTML report) and the dashboard's capacity planner page.

Every builder takes the sweep's results table (a pandas DataFrame, one row per grid point) and
returns a ``plotly.graph_objects.Figure``; none computes anything the table does not hold.
"""
from __future__ import annotations

import html
from collections.abc import Sequence

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from kvsim.viz.style import NUMBER_TICKS, SERIES_COLORS, metric_label


def _label(df: pd.DataFrame, keys: Sequence[str]) -> pd.Series:
    if not keys:
        return pd.Series(["all"] * len(df), index=df.index)
    return df[list(keys)].astype(str).agg(", ".join, axis=1)


def sweep_metric_figure(df: pd.DataFrame, x: str, metric: str, group_by: Sequence[str] = (),
                        title: str | None = None) -> go.Figure:
    """``metric`` against sweep axis ``x``, one line per combination of the ``group_by`` axes.

    Rows with an error (impossible configurations) are left out. Lines that coincide stay
    visible (each group its own dash and marker); axes carry readable titles
    (viz.style.metric_label) and ticks without float noise, and start at 0.
    """
    ok = df[df["error"].isna()] if "error" in df else df
    ok = ok.sort_values(x)
    fig = px.line(ok.assign(group=_label(ok, group_by)), x=x, y=metric, color="group", markers=True,
                  line_dash="group", symbol="group",
                  title=title or f"{metric_label(metric)} vs {metric_label(x)}",
                  labels={x: metric_label(x), metric: metric_label(metric)},
                  color_discrete_sequence=SERIES_COLORS)
    fig.update_layout(legend_title_text=", ".join(group_by) or None, template="plotly_white",
                      showlegend=bool(group_by))
    fig.update_yaxes(rangemode="tozero", tickformat=NUMBER_TICKS)
    if pd.api.types.is_numeric_dtype(ok[x]) and ok[x].nunique() > 2 and (ok[x] > 0).all() and \
            ok[x].max() / max(ok[x].min(), 1e-12) >= 8:
        # block sizes, rates: powers of two read best on a log axis, ticked at the swept values
        values = sorted(ok[x].unique())
        fig.update_xaxes(type="log", tickvals=values, ticktext=[f"{v:g}" for v in values])
    return fig


def slo_scatter_figure(df: pd.DataFrame, x: str, y: str, cheapest_point: int | None = None) -> go.Figure:
    """Each point's ``y`` against ``x`` (e.g. cost vs p99 TTFT), coloured by whether it meets the
    SLO; the cheapest qualifying point is ringed."""
    ok = df[df["error"].isna()] if "error" in df else df
    status = ok["meets_slo"].map({True: "meets SLO", False: "misses SLO"}) if "meets_slo" in ok else "n/a"
    fig = px.scatter(ok.assign(status=status), x=x, y=y, color="status", hover_data=["point"],
                     color_discrete_map={"meets SLO": "#2ca02c", "misses SLO": "#d62728"},
                     title=f"{metric_label(y)} vs {metric_label(x)}",
                     labels={x: metric_label(x), y: metric_label(y)})
    if cheapest_point is not None and (ok["point"] == cheapest_point).any():
        best = ok[ok["point"] == cheapest_point]
        fig.add_trace(go.Scatter(x=best[x], y=best[y], mode="markers", name="cheapest",
                                 marker=dict(size=18, symbol="circle-open", line=dict(width=3, color="black"))))
    fig.update_layout(template="plotly_white")
    return fig


def pareto_figure(df: pd.DataFrame, x: str = "interactivity", y: str = "output_throughput_per_gpu",
                  along: str = "concurrency", group_by: Sequence[str] = ()) -> go.Figure:
    """InferenceMAX's picture: ``y`` (throughput per GPU) against ``x`` (interactivity), one curve
    per configuration (``group_by``) through its ``along`` points (the concurrencies), the points
    on the Pareto front (the table's ``pareto`` column) ringed and joined."""
    ok = df[df["error"].isna()] if "error" in df else df
    ok = ok.dropna(subset=[x, y]).sort_values([*group_by, along] if along in ok else list(group_by))
    fig = px.line(ok.assign(group=_label(ok, group_by)), x=x, y=y, color="group", markers=True,
                  symbol="group", hover_data=[c for c in ("point", along) if c in ok],
                  title=f"{metric_label(y)} vs {metric_label(x)}",
                  labels={x: metric_label(x), y: metric_label(y)}, color_discrete_sequence=SERIES_COLORS)
    if "pareto" in ok and ok["pareto"].any():
        front = ok[ok["pareto"].astype(bool)].sort_values(x)
        fig.add_trace(go.Scatter(x=front[x], y=front[y], mode="lines+markers", name="Pareto front",
                                 line=dict(color="black", dash="dot", width=1),
                                 marker=dict(size=14, symbol="circle-open", line=dict(width=2, color="black"))))
    fig.update_layout(legend_title_text=", ".join(group_by) or None, template="plotly_white")
    fig.update_xaxes(rangemode="tozero", tickformat=NUMBER_TICKS)
    fig.update_yaxes(rangemode="tozero", tickformat=NUMBER_TICKS)
    return fig


def report_html(title: str, figures: Sequence[go.Figure], table: pd.DataFrame, notes: Sequence[str] = ()) -> str:
    """One self-contained HTML page: notes, figures (plotly.js inlined once), the results table.

    The page is as wide as the window: figures resize with it, and the table (one column per
    result field) scrolls inside its own box. Div ids are fixed (``kvsim-plan-<i>``), so the
    same results give the same bytes (plotly's default ids are random).
    """
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             "<style>body{font-family:sans-serif;margin:2em;max-width:1400px}"
             ".table-box{overflow-x:auto;max-width:100%;border:1px solid #ddd}"
             "table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}"
             "th{position:sticky;top:0;background:#f3f3f3}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>"]
    parts += [f"<p>{html.escape(n)}</p>" for n in notes]
    for i, fig in enumerate(figures):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=f"kvsim-plan-{i}",
                                 default_width="100%", config={"displaylogo": False, "responsive": True}))
    parts.append("<h2>Results</h2><div class='table-box'>")
    parts.append(table.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.4g}"))
    parts.append("</div></body></html>")
    return "\n".join(parts)
