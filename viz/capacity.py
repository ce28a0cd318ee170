"""Capacity-planner figure: where one GPU's memory goes (sweeps: viz.plan_figures)."""
from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from kvsim.viz.style import CLASS_COLORS, base_layout

GIB = 2**30

# segment -> (label, colour); KV cache in the token-states colour: it is what holds tokens
_SEGMENTS = {
    "weight_bytes": ("weights", "#7F8C9A"),
    "activation_bytes": ("activations (estimated peak)", "#B9C3CE"),
    "non_torch_bytes": ("outside PyTorch (CUDA context, workspaces)", "#D7DEE6"),
    "non_kv_given_bytes": ("non-KV (given)", "#9AA5B1"),
    "available_kv_bytes": ("KV cache", CLASS_COLORS["token_states"]),
    "unused_bytes": ("left unused (1 − utilisation)", CLASS_COLORS["free"]),
}


def gpu_memory_segments(report: Mapping) -> dict[str, int]:
    """One GPU's memory split into the segments of vLLM's formula (bytes, summing to total).

    Args:
        report: a planner CapacityReport as a dict (``report.to_dict()``).
    Returns:
        segment name -> bytes.
    """
    seg = {"weight_bytes": 0, "activation_bytes": 0, "non_torch_bytes": 0,
           "non_kv_given_bytes": 0}
    if report["non_kv_given"]:
        seg["non_kv_given_bytes"] = report["non_kv_bytes"]
    else:
        seg.update(weight_bytes=report["weight_bytes"],
                   activation_bytes=report["activation_bytes"],
                   non_torch_bytes=report["non_torch_bytes"])
    seg["available_kv_bytes"] = report["available_kv_bytes"]
    seg["unused_bytes"] = report["total_memory_bytes"] - report["budget_bytes"]
    return seg


def gpu_memory_figure(report: Mapping, height: int = 200) -> go.Figure:
    """A horizontal stacked bar of one GPU's memory (GiB), KV cache highlighted."""
    fig = go.Figure()
    for key, num_bytes in gpu_memory_segments(report).items():
        if num_bytes <= 0:
            continue
        label, color = _SEGMENTS[key]
        fig.add_trace(go.Bar(y=["GPU memory"], x=[num_bytes / GIB], orientation="h", name=label,
                             marker_color=color, text=f"{num_bytes / GIB:.1f} GiB",
                             textposition="inside", insidetextanchor="middle",
                             hovertemplate=f"{label}: %{{x:.2f}} GiB<extra></extra>"))
    fig.update_layout(**base_layout(f"{report['gpu']} · {report['model']} · tp={report['tp']} "
                                    "(per GPU)", height), barmode="stack",
                      legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0,
                                  font=dict(size=10)))
    fig.update_xaxes(ticksuffix=" GiB", gridcolor="#EEE")
    fig.update_yaxes(visible=False)
    return fig
