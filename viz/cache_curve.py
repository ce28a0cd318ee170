"""Plotly figure of a prefix-cache hit-rate curve (``kvsim cache-curve``, the capacity planner).

The builder draws a table it is given (one row per cache size: the LRU hit rate, and MIN's where
it was computed) and marks named sizes (the GPU pool for a model on a GPU, GPU + CPU tiers); it
computes nothing.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go

from kvsim.viz.style import SIDE_COLORS, base_layout

_MARK_COLORS = ("#2CA02C", "#9467BD", "#8C564B", "#17BECF")


def cache_curve_figure(table: pd.DataFrame, x: str = "cache_gib",
                       marks: Mapping[str, float] | None = None,
                       title: str | None = None) -> go.Figure:
    """Hit rate against cache size, LRU as a line and MIN (the best any policy can do) as points.

    Args:
        table: columns ``x`` (the size: ``cache_blocks``, ``cache_tokens`` or ``cache_gib``),
            ``lru_hit_rate`` and optionally ``min_hit_rate`` (NaN where not computed) and
            ``cpu_tier_hit_rate`` (the hit rate of a CPU tier of that size below the GPU pool:
            drawn as its own curve).
        x: which size column is the x axis (log scale).
        marks: label -> size (in ``x``'s unit) drawn as vertical lines, e.g. the GPU pool.
        title: figure title.
    """
    rows = table[table[x] > 0].sort_values(x)
    unit = {"cache_gib": "GiB", "cache_blocks": "blocks", "cache_tokens": "tokens"}.get(x, x)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=rows[x], y=rows["lru_hit_rate"], mode="lines", name="LRU",
                             line=dict(color=SIDE_COLORS[0], width=2),
                             hovertemplate=f"%{{x:.4g}} {unit}<br>LRU %{{y:.2%}}<extra></extra>"))
    if "min_hit_rate" in rows and rows["min_hit_rate"].notna().any():
        opt = rows[rows["min_hit_rate"].notna()]
        fig.add_trace(go.Scatter(x=opt[x], y=opt["min_hit_rate"], mode="lines+markers",
                                 name="MIN (offline optimum)",
                                 line=dict(color=SIDE_COLORS[1], width=1, dash="dot"),
                                 marker=dict(size=5),
                                 hovertemplate=f"%{{x:.4g}} {unit}<br>MIN %{{y:.2%}}<extra></extra>"))
    if "cpu_tier_hit_rate" in rows and rows["cpu_tier_hit_rate"].notna().any():
        fig.add_trace(go.Scatter(x=rows[x], y=rows["cpu_tier_hit_rate"], mode="lines",
                                 name="CPU tier of this size (prompt blocks the GPU missed)",
                                 line=dict(color=_MARK_COLORS[1], width=2, dash="dash"),
                                 hovertemplate=f"%{{x:.4g}} {unit}<br>CPU tier %{{y:.2%}}<extra></extra>"))
    for i, (label, size) in enumerate((marks or {}).items()):
        if size and size > 0:
            color = _MARK_COLORS[i % len(_MARK_COLORS)]
            fig.add_vline(x=size, line=dict(color=color, dash="dash", width=1.5))
            # on a log axis an annotation's x is log10 of the value (a shape's is the value):
            # given the value, plotly put the label at 10**value and stretched the axis to 1e60
            fig.add_annotation(x=math.log10(size), y=1.0, yref="paper", text=label, showarrow=False,
                               xanchor="left", yanchor="top", font=dict(color=color),
                               textangle=-90 if len(label) > 12 else 0)
    fig.update_layout(**base_layout(title or "Prefix-cache hit rate by cache size", height=420),
                      legend=dict(orientation="h", y=-0.2))
    fig.update_xaxes(type="log", title_text=f"cache size ({unit})", showgrid=True,
                     gridcolor="#EEE")
    fig.update_yaxes(title_text="prefix-cache hit rate (tokens)", tickformat=".0%",
                     rangemode="tozero", showgrid=True, gridcolor="#EEE")
    return fig
