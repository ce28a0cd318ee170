"""Figures over simulated time and over requests: memory breakdown, concurrency, latency CDFs.

Inputs are pandas DataFrames (a simulation's timeseries / requests tables) and the column names
to read, so the same builders draw one run, two runs side by side, or a sweep.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvsim.viz.classes import MEMORY_CLASSES
from kvsim.viz.style import CLASS_COLORS, CLASS_LABELS, NUMBER_TICKS, SERIES_COLORS, base_layout

# Stack order, bottom to top: useful KV first, waste next, then what is not held.
STACK_ORDER = ("token_states", "reservation", "internal_fragmentation", "external_fragmentation",
               "cached", "free")
assert set(STACK_ORDER) == set(MEMORY_CLASSES)
# several runs on one chart: a line that equals another stays visible (dashes differ)
_DASHES = ("solid", "dash", "dot", "dashdot")


def _require(frame: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what}: missing column(s) {missing}; have {list(frame.columns)}")


def breakdown_area(ts: pd.DataFrame, time_col: str = "time_s", title: str | None = None,
                   now_s: float | None = None, height: int = 300,
                   class_columns: Mapping[str, str] | None = None,
                   x_range: tuple[float, float] | None = None,
                   show_legend: bool = True) -> go.Figure:
    """Stacked area of the six memory classes as a share of the pool over time.

    Args:
        ts: one row per sample; one column per memory class (slots).
        time_col: the time column (seconds).
        title: figure title.
        now_s: draw a vertical "now" line here (live view).
        height: pixels.
        class_columns: class -> column name when they differ from the class names.
        x_range: fixed time axis (live view: the axis does not jump as samples arrive).
        show_legend: off where a pool heatmap's legend already names the same colours.
    Returns:
        the figure (y in percent of capacity; hover shows slots and percent).
    """
    cols = {c: (class_columns or {}).get(c, c) for c in STACK_ORDER}
    _require(ts, [time_col, *cols.values()], "memory breakdown")
    slots = ts[list(cols.values())].to_numpy(dtype=float)
    capacity = slots.sum(axis=1)
    pct = np.divide(100.0 * slots, capacity[:, None], out=np.zeros_like(slots),
                    where=capacity[:, None] > 0)
    fig = go.Figure()
    for j, name in enumerate(STACK_ORDER):
        fig.add_trace(go.Scatter(
            x=ts[time_col], y=pct[:, j], name=CLASS_LABELS[name], stackgroup="mem",
            mode="lines", line=dict(width=0.5, color=CLASS_COLORS[name]),
            fillcolor=CLASS_COLORS[name], customdata=slots[:, j],
            hovertemplate=f"{CLASS_LABELS[name]}: %{{y:.1f}}% (%{{customdata:,.0f}} slots)"
                          "<extra></extra>"))
    if now_s is not None:
        fig.add_vline(x=now_s, line=dict(color="#333", width=1, dash="dot"))
    fig.update_layout(**base_layout(title, height), hovermode="x unified",
                      showlegend=show_legend, legend=dict(orientation="h", y=-0.18,
                                                          yanchor="top", x=0, font=dict(size=10)))
    if show_legend:
        fig.update_layout(margin=dict(b=110))
    fig.update_yaxes(range=[0, 100], title="% of KV pool", ticksuffix="%", gridcolor="#EEE")
    fig.update_xaxes(ticksuffix=" s", gridcolor="#EEE", range=x_range)
    return fig


def concurrency_chart(ts: pd.DataFrame, time_col: str = "time_s", running: str = "running",
                      waiting: str = "waiting", preemptions: str = "num_preemptions",
                      title: str | None = None, now_s: float | None = None,
                      height: int = 260, x_range: tuple[float, float] | None = None,
                      y_max: float | None = None, preemptions_max: float | None = None) -> go.Figure:
    """Running and waiting requests over time, with cumulative preemptions on a second axis.

    Args:
        ts: samples with the named columns (preemptions cumulative).
        time_col, running, waiting, preemptions: column names.
        title: figure title.
        now_s: vertical "now" line.
        height: pixels.
        x_range: fixed time axis.
        y_max, preemptions_max: fixed tops of the two y axes (charts side by side share them:
            ``concurrency_limits``), else each chart's own.
    Returns:
        the figure.
    """
    _require(ts, [time_col, running, waiting, preemptions], "concurrency")
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=ts[time_col], y=ts[running], name="running", mode="lines",
                             line=dict(color=SERIES_COLORS[0], width=2, shape="hv")))
    fig.add_trace(go.Scatter(x=ts[time_col], y=ts[waiting], name="waiting", mode="lines",
                             line=dict(color=SERIES_COLORS[1], width=2, shape="hv")))
    fig.add_trace(go.Scatter(x=ts[time_col], y=ts[preemptions], name="preemptions (cumulative)",
                             mode="lines", line=dict(color=CLASS_COLORS["internal_fragmentation"],
                                                     width=1.5, dash="dash", shape="hv")),
                  secondary_y=True)
    if now_s is not None:
        fig.add_vline(x=now_s, line=dict(color="#333", width=1, dash="dot"))
    # legend on top, right of the title, so it never covers the time axis
    fig.update_layout(**base_layout(title, height), hovermode="x unified",
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right",
                                  font=dict(size=10)))
    fig.update_yaxes(title="requests", gridcolor="#EEE", rangemode="tozero", secondary_y=False,
                     tickformat=NUMBER_TICKS, range=None if y_max is None else [0, max(y_max, 1) * 1.05])
    top = max(1, int(ts[preemptions].max()) if len(ts) else 1) if preemptions_max is None else \
        max(1, int(preemptions_max))
    fig.update_yaxes(title="preemptions", showgrid=False, range=[0, top * 1.05], tick0=0,
                     dtick=max(1, math.ceil(top / 4)), secondary_y=True)
    fig.update_xaxes(ticksuffix=" s", gridcolor="#EEE", range=x_range)
    return fig


def concurrency_limits(frames: Sequence[pd.DataFrame], running: str = "running",
                       waiting: str = "waiting", preemptions: str = "num_preemptions") -> dict:
    """``y_max`` and ``preemptions_max`` for concurrency charts drawn side by side (one scale)."""
    y = max((float(f[[running, waiting]].to_numpy().max()) for f in frames if len(f)), default=1.0)
    p = max((float(f[preemptions].max()) for f in frames if len(f)), default=1.0)
    return {"y_max": y, "preemptions_max": p}


def ecdf(values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF: sorted finite values and the fraction of values <= each."""
    v = np.sort(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    return v, np.arange(1, len(v) + 1) / max(len(v), 1)


def latency_cdf(runs: Mapping[str, pd.DataFrame], column: str, title: str | None = None,
                unit: str = "s", colors: Mapping[str, str] | None = None,
                height: int = 300) -> go.Figure:
    """One CDF line per run of a per-request latency column (TTFT, TPOT, end-to-end...).

    Args:
        runs: label -> requests DataFrame.
        column: the latency column.
        title: figure title.
        unit: axis unit.
        colors: label -> colour.
        height: pixels.
    Returns:
        the figure; p50/p99 of each run in the legend.
    """
    fig = go.Figure()
    for i, (label, frame) in enumerate(runs.items()):
        _require(frame, [column], f"latency CDF of {label!r}")
        x, y = ecdf(frame[column])
        p50, p99 = (np.percentile(x, [50, 99]) if len(x) else (np.nan, np.nan))
        color = (colors or {}).get(label, SERIES_COLORS[i % len(SERIES_COLORS)])
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line=dict(color=color, width=2, shape="hv",
                                                                    dash=_DASHES[i % len(_DASHES)]),
                                 name=f"{label}  (p50 {p50:.3g} {unit}, p99 {p99:.3g} {unit})",
                                 hovertemplate=f"%{{x:.4g}} {unit}: %{{y:.1%}}<extra>{label}"
                                               "</extra>"))
    fig.update_layout(**base_layout(title, height),
                      legend=dict(orientation="h", y=-0.3, x=0, font=dict(size=10)))
    fig.update_yaxes(title="fraction of requests", range=[0, 1.02], tickformat=".0%",
                     gridcolor="#EEE")
    fig.update_xaxes(title=f"{title or column} ({unit})", gridcolor="#EEE", tickformat=NUMBER_TICKS)
    return fig


def compare_bars(summaries: Mapping[str, Mapping[str, float]], metrics: Mapping[str, str],
                 title: str | None = None, colors: Mapping[str, str] | None = None,
                 height: int = 300) -> go.Figure:
    """Side-by-side bars of summary metrics, one small panel per metric.

    Args:
        summaries: run label -> summary dict.
        metrics: summary key -> axis label.
        title: figure title.
        colors: run label -> colour.
        height: pixels.
    Returns:
        the figure.
    """
    keys = list(metrics)
    fig = make_subplots(rows=1, cols=max(len(keys), 1), subplot_titles=[metrics[k] for k in keys])
    for j, key in enumerate(keys, start=1):
        for i, (label, summary) in enumerate(summaries.items()):
            if key not in summary:
                raise ValueError(f"summary of {label!r} has no {key!r}; have {sorted(summary)}")
            color = (colors or {}).get(label, SERIES_COLORS[i % len(SERIES_COLORS)])
            fig.add_trace(go.Bar(x=[label], y=[summary[key]], marker_color=color, name=label,
                                 showlegend=j == 1, hovertemplate=f"{label}: %{{y:.4g}}"
                                                                   "<extra></extra>"),
                          row=1, col=j)
    fig.update_layout(**base_layout(title, height), bargap=0.3,
                      legend=dict(orientation="h", y=-0.05, yanchor="top", x=0))
    fig.update_yaxes(gridcolor="#EEE", rangemode="tozero", tickformat=NUMBER_TICKS)
    fig.update_xaxes(showticklabels=False)
    return fig


def line_chart(frame: pd.DataFrame, x: str, ys: Mapping[str, str], title: str | None = None,
               x_title: str | None = None, y_title: str | None = None, height: int = 300,
               log_x: bool = False, y_tickformat: str | None = None) -> go.Figure:
    """Lines of several columns against one (sweeps, hit rate over time).

    Args:
        frame: data.
        x: x column.
        ys: column -> legend label.
        title, x_title, y_title: text.
        height: pixels.
        log_x: logarithmic x axis.
        y_tickformat: d3 format of the y ticks (".0%" for rates).
    Returns:
        the figure.
    """
    _require(frame, [x, *ys], "line chart")
    fig = go.Figure()
    for i, (col, label) in enumerate(ys.items()):
        fig.add_trace(go.Scatter(x=frame[x], y=frame[col], name=label, mode="lines",
                                 connectgaps=True,
                                 line=dict(color=SERIES_COLORS[i % len(SERIES_COLORS)], width=2,
                                           dash=_DASHES[i % len(_DASHES)])))
    fig.update_layout(**base_layout(title, height),
                      legend=dict(orientation="h", y=-0.3, x=0, font=dict(size=10)))
    fig.update_xaxes(title=x_title or x, gridcolor="#EEE", type="log" if log_x else "linear")
    fig.update_yaxes(title=y_title, gridcolor="#EEE", rangemode="tozero",
                     tickformat=y_tickformat or NUMBER_TICKS)
    return fig
