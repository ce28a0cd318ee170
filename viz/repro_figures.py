"""Plotly figures of `kvsim reproduce vllm-paper`: the paper's numbers next to kvsim's.

Each builder takes the results dict of ``planner.reproduce.run_reproduction`` (plain data, no
simulator objects) and returns a ``plotly.graph_objects.Figure``.
"""
from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

# the paper's systems; "vllm" runs vLLM v0's scheduler, the paper's engine
SYSTEMS = ("orca_max", "orca_pow2", "orca_oracle", "vllm")
# vLLM with kvsim's v1 scheduler (vLLM 0.33's), shown as an extra row next to the paper's vLLM
V1_SYSTEM = "vllm_v1"
REPORT_SYSTEMS = SYSTEMS + (V1_SYSTEM,)
SYSTEM_LABELS = {"orca_max": "Orca (Max)", "orca_pow2": "Orca (Pow2)",
                 "orca_oracle": "Orca (Oracle)", "vllm": "vLLM",
                 V1_SYSTEM: "vLLM, v1 scheduler"}
FIG2_CLASSES = ("token_states", "reservation", "internal_fragmentation", "external_and_other")
FIG2_LABELS = {"token_states": "Token states", "reservation": "Reservation",
               "internal_fragmentation": "Internal frag.",
               "external_and_other": "External frag. & others"}
# the paper's Fig. 2 palette order: useful state first, then growing waste
FIG2_COLORS = {"token_states": "#2e7d32", "reservation": "#f9a825",
               "internal_fragmentation": "#c62828", "external_and_other": "#8e8e8e"}
SOURCE_COLORS = {"paper": "#90a4ae", "kvsim": "#1565c0"}
SYSTEM_COLORS = {"orca_max": "#c62828", "orca_pow2": "#f9a825", "orca_oracle": "#2e7d32",
                 "vllm": "#1565c0", V1_SYSTEM: "#6a1b9a"}


def report_systems(by_system: dict[str, Any]) -> list[str]:
    """The systems a results table has, in report order (the v1 row only where it was run)."""
    return [s for s in REPORT_SYSTEMS if s in by_system]


def fig2_breakdown(results: dict[str, Any], key: str = "fig2",
                   title: str = "Fig. 2: share of KV memory, ShareGPT") -> go.Figure:
    """Stacked horizontal bars: per system, the paper's breakdown above kvsim's.

    Args:
        results: the reproduction's results dict.
        key: "fig2" (synthetic ShareGPT) or "fig2_sharegpt_real".
        title: figure title.
    """
    paper = results["paper"]["fig2"]
    rows = []
    for s in report_systems(results[key]):
        rows.append((f"{SYSTEM_LABELS[s]} - paper", paper[s]))
        rows.append((f"{SYSTEM_LABELS[s]} - kvsim", results[key][s]))
    labels = [r[0] for r in rows][::-1]
    fig = go.Figure()
    for c in FIG2_CLASSES:
        values = [r[1].get(c) for r in rows][::-1]
        fig.add_bar(y=labels, x=[v if v is not None else 0 for v in values], orientation="h",
                    name=FIG2_LABELS[c], marker_color=FIG2_COLORS[c],
                    text=[f"{v:.1f}" if v else ("n/a" if v is None else "") for v in values],
                    textposition="inside", hovertemplate="%{y}: %{x:.1f}%<extra>" + FIG2_LABELS[c] + "</extra>")
    fig.update_layout(barmode="stack", title=title, xaxis_title="% of KV cache slots",
                      xaxis_range=[0, 100], height=460, legend_orientation="h", legend_y=-0.15,
                      margin=dict(l=160, r=20, t=60, b=40))
    return fig


def _paper_and_kvsim_bars(fig: go.Figure, col: int, x: list[str], paper: list | None,
                          ours: list, fmt: str) -> None:
    """The paper's bars (if any) and kvsim's, side by side in subplot ``col``."""
    for name, values in (("paper", paper), ("kvsim", ours)):
        if values is None:
            continue
        fig.add_bar(x=x, y=values, name=name, marker_color=SOURCE_COLORS[name], showlegend=col == 1,
                    row=1, col=col, text=[fmt.format(v) if v is not None else "" for v in values])


def fig13_concurrency(results: dict[str, Any]) -> go.Figure:
    """Grouped bars: average number of batched requests per system, paper vs kvsim, per workload."""
    workloads = [w for w in ("sharegpt", "alpaca", "sharegpt_real") if w in results["fig13"]]
    titles = {"sharegpt": "ShareGPT-like", "alpaca": "Alpaca-like",
              "sharegpt_real": "real ShareGPT lengths"}
    fig = make_subplots(rows=1, cols=len(workloads), subplot_titles=[titles[w] for w in workloads])
    for i, w in enumerate(workloads, start=1):
        systems = report_systems(results["fig13"][w])
        paper = results["paper"]["fig13"].get(w)
        _paper_and_kvsim_bars(fig, i, [SYSTEM_LABELS[s] for s in systems],
                              [paper[s] for s in systems] if paper else None,
                              [results["fig13"][w][s] for s in systems], "{:.2f}")
    fig.update_layout(barmode="group", title="Fig. 13: average number of batched requests",
                      height=420, yaxis_title="requests", margin=dict(t=80))
    return fig


def fig15_sharing(results: dict[str, Any]) -> go.Figure:
    """Grouped bars: % memory saved by sharing, paper vs kvsim, parallel sampling and beam search."""
    titles = {"parallel": "Parallel sampling", "beam": "Beam search"}
    fig = make_subplots(rows=1, cols=2, subplot_titles=[titles["parallel"], titles["beam"]])
    for i, mode in enumerate(("parallel", "beam"), start=1):
        ns = list(results["fig15"][mode])
        x = [f"{'n' if mode == 'parallel' else 'width'} = {n}" for n in ns]
        _paper_and_kvsim_bars(fig, i, x, [results["paper"]["fig15"][mode][n] for n in ns],
                              [results["fig15"][mode][n] for n in ns], "{:.1f}")
    fig.update_layout(barmode="group", title="Fig. 15: memory saved by sharing KV blocks (%)",
                      height=400, yaxis_title="% of blocks without sharing", margin=dict(t=80))
    return fig


def rate_sensitivity(results: dict[str, Any]) -> go.Figure | None:
    """Token-state share and concurrency against the ShareGPT request rate (None if not run)."""
    table = results.get("sensitivity", {}).get("sharegpt_rate")
    if not table:
        return None
    rates = sorted(table, key=float)
    fig = make_subplots(rows=1, cols=2, subplot_titles=["token states (% of pool)",
                                                        "average batched requests"])
    for s in SYSTEMS:
        for col, metric in ((1, "token_states"), (2, "mean_running")):
            fig.add_scatter(x=[float(r) for r in rates], y=[table[r][s][metric] for r in rates],
                            name=SYSTEM_LABELS[s], legendgroup=s, showlegend=col == 1,
                            mode="lines+markers", line_color=SYSTEM_COLORS[s], row=1, col=col)
    fig.update_xaxes(title_text="ShareGPT request rate (req/s)")
    fig.update_layout(title="Sensitivity: request rate", height=400, margin=dict(t=80))
    return fig


def step_time_sensitivity(results: dict[str, Any]) -> go.Figure | None:
    """Batched requests against the step-time factor, the paper's values as dotted lines."""
    table = results.get("sensitivity", {}).get("step_time_scale")
    if not table:
        return None
    scales = sorted(table, key=float)
    workloads = [w for w in ("sharegpt", "alpaca") if w in table[scales[0]]]
    fig = make_subplots(rows=1, cols=len(workloads),
                        subplot_titles=[f"{w}: batched requests" for w in workloads])
    for i, w in enumerate(workloads, start=1):
        for s in [s for s in ("orca_pow2", "orca_oracle", "vllm", V1_SYSTEM)
                  if any(s in table[k].get(w, {}) for k in scales)]:
            color = SYSTEM_COLORS[s]
            ys = [table[k].get(w, {}).get(s, {}).get("mean_running") for k in scales]
            fig.add_scatter(x=[float(k) for k in scales], y=ys, mode="lines+markers",
                            name=SYSTEM_LABELS[s], legendgroup=s, showlegend=i == 1,
                            line_color=color, row=1, col=i)
            paper = results["paper"]["fig13"].get(w, {}).get(s)
            if paper is not None:
                fig.add_scatter(x=[float(scales[0]), float(scales[-1])], y=[paper, paper],
                                mode="lines", line=dict(color=color, dash="dot"),
                                name=f"{SYSTEM_LABELS[s]} (paper)", legendgroup=s,
                                showlegend=i == 1, row=1, col=i)
    fig.update_xaxes(title_text="step time / roofline step time")
    fig.update_layout(title="Sensitivity: step time (Fig. 13)", height=420, margin=dict(t=80))
    return fig


def all_figures(results: dict[str, Any]) -> list[tuple[str, go.Figure]]:
    """(stable id, figure) for every chart of the HTML report, in report order."""
    figs = [("fig2", fig2_breakdown(results))]
    if "fig2_sharegpt_real" in results:
        figs.append(("fig2-real", fig2_breakdown(results, "fig2_sharegpt_real",
                                                 "Fig. 2 on the real ShareGPT lengths (filtered)")))
    figs += [("fig13", fig13_concurrency(results)), ("fig15", fig15_sharing(results))]
    for fig_id, builder in (("sensitivity-step", step_time_sensitivity),
                            ("sensitivity-rate", rate_sensitivity)):
        fig = builder(results)
        if fig is not None:
            figs.append((fig_id, fig))
    return figs
