"""Kernel-validation figure: per-sequence error of paged attention against dense attention."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvsim.viz.style import CLASS_COLORS, OWNER_PALETTE, base_layout

PASS_COLOR = OWNER_PALETTE[2]
FAIL_COLOR = CLASS_COLORS["internal_fragmentation"]


def kernel_error_figure(checks: pd.DataFrame, tolerance: float, height: int = 320) -> go.Figure:
    """Max relative error of each sequence (log scale) against the dtype's tolerance.

    Args:
        checks: one row per sequence: seq_id, num_tokens, num_shared_blocks, max_abs_err,
            max_rel_err, bitwise_equal, passed.
        tolerance: the relative-error bound the check uses.
        height: pixels.
    Returns:
        the figure: a bar per sequence (green passed, red failed), the tolerance as a line.
    """
    x = [f"seq {s}" for s in checks["seq_id"]]
    # an exact result (error 0) has no place on a log axis: draw it at the axis floor
    floor = 1e-12
    err = np.maximum(checks["max_rel_err"].to_numpy(dtype=float), floor)
    colors = np.where(checks["passed"].to_numpy(dtype=bool), PASS_COLOR, FAIL_COLOR)
    custom = np.stack([checks["num_tokens"], checks["num_shared_blocks"],
                       checks["max_abs_err"], checks["max_rel_err"],
                       checks["bitwise_equal"].astype(int)], axis=1)
    fig = go.Figure(go.Bar(
        x=x, y=err, marker_color=colors, customdata=custom, name="max relative error",
        hovertemplate="%{x}: %{customdata[0]} tokens, %{customdata[1]} shared blocks<br>"
                      "max abs err %{customdata[2]:.3g}, max rel err %{customdata[3]:.3g}<br>"
                      "bitwise equal to identity table: %{customdata[4]}<extra></extra>"))
    fig.add_hline(y=tolerance, line=dict(color="#333", dash="dash", width=1),
                  annotation_text=f"tolerance {tolerance:g}", annotation_position="top right",
                  annotation_font=dict(size=11, color="#333"))
    fig.update_layout(**base_layout("Paged vs dense attention, per sequence", height),
                      showlegend=False, bargap=0.3)
    fig.update_yaxes(type="log", title="max relative error", gridcolor="#EEE", tickformat=".0e",
                     range=[np.log10(floor), np.log10(max(tolerance, float(err.max()))) + 1])
    return fig
