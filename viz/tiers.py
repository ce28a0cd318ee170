"""Plotly figure of the KV tiers' occupancy: the GPU pool and the offload tiers below it.

Draws rows it is given (``kvsim.dashboard.comparison.tier_rows``); computes nothing.
"""
from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from kvsim.viz.style import CLASS_COLORS, base_layout

_TIER_COLOR = "#6A3D9A"          # offloaded chunks (no owner colour: no request holds them)


def tier_occupancy_figure(rows: Sequence[dict], height: int = 170) -> go.Figure:
    """One horizontal bar per tier, filled to its occupancy.

    Args:
        rows: ``{"tier", "held", "cached", "label"}``: fractions of the tier's capacity held by
            running requests (GPU) and holding reusable KV (cached GPU blocks, stored chunks),
            and the text shown beside the bar.
    """
    names = [r["tier"] for r in rows][::-1]
    held = [r["held"] for r in rows][::-1]
    cached = [r["cached"] for r in rows][::-1]
    fig = go.Figure()
    fig.add_trace(go.Bar(y=names, x=held, orientation="h", name="held by running requests",
                         marker_color=CLASS_COLORS["token_states"],
                         hovertemplate="%{y}: %{x:.0%} held<extra></extra>"))
    fig.add_trace(go.Bar(y=names, x=cached, orientation="h", name="reusable KV (cached)",
                         marker_color=[CLASS_COLORS["cached"] if n.startswith("GPU") else
                                       _TIER_COLOR for n in names],
                         text=[r["label"] for r in rows][::-1], textposition="outside",
                         hovertemplate="%{y}: %{x:.0%} cached<extra></extra>"))
    layout = base_layout(height=height)
    layout["margin"] = dict(l=90, r=20, t=10, b=30)     # room for the tier names
    fig.update_layout(**layout, barmode="stack", showlegend=False)
    fig.update_xaxes(range=[0, 1.6], tickformat=".0%", tickvals=[0, 0.25, 0.5, 0.75, 1.0],
                     showgrid=True, gridcolor="#EEE")
    return fig
