"""Block-table views: one request's logical -> physical map, slot_mapping, sharing, extents.

Everything here is computed from a PoolSnapshot's plain arrays (never from allocator objects),
so the inspector shows exactly what the snapshot recorded.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvsim.viz.classes import MEMORY_CLASSES
from kvsim.viz.style import CLASS_COLORS, base_layout, owner_color

_FREE_LIKE = {MEMORY_CLASSES.index(c) for c in ("free", "external_fragmentation", "cached")}


def _table(snapshot, seq_id: int) -> np.ndarray:
    if seq_id not in snapshot.block_tables:
        raise ValueError(f"request {seq_id} is not in this snapshot "
                         f"({len(snapshot.block_tables)} live requests)")
    return np.asarray(snapshot.block_tables[seq_id], dtype=np.int64)


def block_holders(snapshot) -> dict[int, list[int]]:
    """Physical block -> the seq_ids whose tables hold it, for blocks held by two or more."""
    holders: dict[int, list[int]] = {}
    for seq_id in sorted(snapshot.block_tables):
        for block in np.asarray(snapshot.block_tables[seq_id]).tolist():
            holders.setdefault(block, []).append(seq_id)
    return {b: s for b, s in holders.items() if len(s) > 1}


def requests_frame(snapshot) -> pd.DataFrame:
    """One row per live request: seq_id, tokens, cells held, cells shared with others.

    Returns:
        DataFrame with columns seq_id, num_tokens, num_blocks (contiguous: num_cells, token
        slots), num_shared_blocks (sorted by id).
    """
    shared = block_holders(snapshot) if snapshot.kind == "paged" else {}
    held = "num_blocks" if snapshot.kind == "paged" else "num_cells"
    rows = []
    for seq_id in sorted(snapshot.block_tables):
        table = np.asarray(snapshot.block_tables[seq_id])
        rows.append({"seq_id": int(seq_id), "num_tokens": int(snapshot.seq_lens.get(seq_id, 0)),
                     held: int(len(table)),
                     "num_shared_blocks": int(sum(int(b) in shared for b in table))})
    return pd.DataFrame(rows, columns=["seq_id", "num_tokens", held, "num_shared_blocks"])


def block_table_frame(snapshot, seq_id: int) -> pd.DataFrame:
    """The request's block table, one row per logical block.

    Args:
        snapshot: PoolSnapshot.
        seq_id: a live request of the snapshot.
    Returns:
        DataFrame: logical, physical, class, ref_cnt, fill (tokens), content_key (hex, "" none),
        shared_with (other seq_ids holding the same physical block).
    """
    table = _table(snapshot, seq_id)
    holders = block_holders(snapshot) if snapshot.kind == "paged" else {}
    keys = np.asarray(snapshot.block_key)[table]
    return pd.DataFrame({
        "logical": np.arange(len(table)),
        "physical": table,
        "class": [MEMORY_CLASSES[c] for c in np.asarray(snapshot.cell_class)[table]],
        "ref_cnt": np.asarray(snapshot.ref_cnt)[table],
        "fill": np.asarray(snapshot.fill)[table],
        "content_key": [f"{int(k):016x}" if k else "" for k in keys],
        "shared_with": [", ".join(str(s) for s in holders.get(int(b), []) if s != seq_id)
                        for b in table],
    })


def slot_mapping(snapshot, seq_id: int) -> np.ndarray:
    """vLLM's slot_mapping of a request: token i -> block_table[i // B] * B + i % B."""
    table = _table(snapshot, seq_id)
    b = int(snapshot.block_size)
    tokens = np.arange(int(snapshot.seq_lens[seq_id]))
    return table[tokens // b] * b + tokens % b


def slot_mapping_runs(snapshot, seq_id: int) -> pd.DataFrame:
    """slot_mapping compressed into runs of consecutive slots (one row per physical run).

    Returns:
        DataFrame: first_token, last_token, first_slot, last_slot, num_tokens.
    """
    slots = slot_mapping(snapshot, seq_id)
    if len(slots) == 0:
        return pd.DataFrame(columns=["first_token", "last_token", "first_slot", "last_slot",
                                     "num_tokens"])
    breaks = np.flatnonzero(np.diff(slots) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(slots)]]) - 1
    return pd.DataFrame({"first_token": starts, "last_token": ends, "first_slot": slots[starts],
                         "last_slot": slots[ends], "num_tokens": ends - starts + 1})


def _run_around(cls: np.ndarray, start: int, step: int) -> tuple[int, int]:
    """Length and end of the run of free-like cells from ``start`` going in direction ``step``."""
    i = start
    while 0 <= i < len(cls) and int(cls[i]) in _FREE_LIKE:
        i += step
    return abs(i - start), i - step


def contiguous_extent(snapshot, seq_id: int) -> dict:
    """A contiguous request's extent and the holes on either side of it.

    Returns:
        dict: first_cell, last_cell, num_cells, cells per memory class inside the extent,
        hole_before_cells / hole_after_cells (free-like cells adjacent to the extent).
    """
    table = _table(snapshot, seq_id)
    cls = np.asarray(snapshot.cell_class)
    first, last = int(table.min()), int(table.max())
    inside = np.bincount(cls[first:last + 1], minlength=len(MEMORY_CLASSES))
    before, _ = _run_around(cls, first - 1, -1)
    after, _ = _run_around(cls, last + 1, +1)
    out = dict(first_cell=first, last_cell=last, num_cells=last - first + 1,
               hole_before_cells=before, hole_after_cells=after)
    out.update({f"{name}_cells": int(inside[i]) for i, name in enumerate(MEMORY_CLASSES)})
    return out


def block_table_figure(snapshot, seq_id: int, max_blocks: int = 64) -> go.Figure:
    """Logical blocks (top row) linked to their physical blocks in the pool (bottom strip).

    The bottom strip is the whole pool scaled to the figure width; each logical block of the
    request draws a line to where its physical block lies, so scattered (paged) and contiguous
    placements look as different as they are. Shared blocks are dark and list their holders.

    Args:
        snapshot: PoolSnapshot.
        seq_id: the request.
        max_blocks: logical blocks drawn (longer tables show their first ``max_blocks``).
    Returns:
        the figure.
    """
    frame = block_table_frame(snapshot, seq_id)
    shown = frame.iloc[:max_blocks]
    n = max(len(shown), 1)
    scale = n / max(int(snapshot.num_cells), 1)
    color = owner_color(seq_id)
    shared = shown["ref_cnt"].to_numpy() > 1
    colors = np.where(shared, CLASS_COLORS["shared"], color)
    fig = go.Figure()
    xs, ys = [], []
    for logical, physical in zip(shown["logical"], shown["physical"]):
        xs += [logical + 0.5, (physical + 0.5) * scale, None]
        ys += [0.92, 0.05, None]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#9AA5B1", width=1),
                             hoverinfo="skip", showlegend=False))
    fig.add_trace(go.Bar(x=np.arange(n) + 0.5, y=[0.16] * len(shown), base=0.92, width=0.9,
                         marker=dict(color=colors), name="logical blocks", showlegend=False,
                         customdata=np.stack([shown["logical"], shown["physical"],
                                              shown["ref_cnt"], shown["fill"]], axis=1),
                         text=shown["shared_with"],
                         hovertemplate="logical %{customdata[0]} -> physical %{customdata[1]}"
                                       "<br>ref_cnt %{customdata[2]} · fill %{customdata[3]}"
                                       "<br>shared with: %{text}<extra></extra>"))
    # the pool strip: the whole pool in at most 2000 bins, bins holding this request highlighted
    num_cells = max(int(snapshot.num_cells), 1)
    num_bins = min(num_cells, 2000)
    held = np.zeros(num_bins)
    held[np.asarray(shown["physical"]) * num_bins // num_cells] = 1.0
    first_cell = np.arange(num_bins) * num_cells // num_bins
    fig.add_trace(go.Heatmap(z=held[None, :], x=(np.arange(num_bins) + 0.5) * n / num_bins,
                             y=[-0.05], customdata=first_cell[None, :],
                             colorscale=[[0, CLASS_COLORS["free"]], [1, color]], showscale=False,
                             zmin=0, zmax=1, hovertemplate="pool from cell %{customdata}"
                                                           "<extra></extra>"))
    more = f" (first {max_blocks} of {len(frame)})" if len(frame) > max_blocks else ""
    fig.update_layout(**base_layout(f"Request {seq_id}: logical blocks{more} -> physical pool",
                                    height=260), bargap=0.05)
    fig.update_yaxes(visible=False, range=[-0.15, 1.12])
    fig.update_xaxes(showgrid=False, zeroline=False, range=[0, n], title="logical block (top); "
                     "physical position in the pool, scaled (bottom)")
    return fig


OTHER_REQUESTS_COLOR = "#B8BEC6"


def extent_figure(snapshot, seq_id: int, max_bins: int = 1000) -> go.Figure:
    """A contiguous request's extent in its neighbourhood of the pool, cell classes coloured.

    The window spans the extent and as much again on either side (at least 64 cells), so the
    holes around it and the neighbouring extents are visible; other requests are grey.

    Args:
        snapshot: a contiguous PoolSnapshot.
        seq_id: the request.
        max_bins: most columns drawn (cells are grouped beyond that, most common class wins).
    Returns:
        the figure.
    """
    from kvsim.viz.pool import NUM_CODES, cell_codes, code_colors, discrete_colorscale

    ext = contiguous_extent(snapshot, seq_id)
    pad = max(64, ext["num_cells"] // 2)
    lo = max(0, ext["first_cell"] - pad)
    hi = min(int(snapshot.num_cells), ext["last_cell"] + 1 + pad)
    owner = np.asarray(snapshot.owner)[lo:hi]
    codes = cell_codes(np.asarray(snapshot.cell_class)[lo:hi], owner,
                       np.asarray(snapshot.ref_cnt)[lo:hi]).astype(np.int64)
    other = NUM_CODES  # one extra code: cells of other requests
    codes = np.where((owner >= 0) & (owner != seq_id), other, codes)
    k = max(1, -(-(hi - lo) // max_bins))
    num_bins = -(-(hi - lo) // k)
    counts = np.bincount(np.arange(hi - lo) // k * (other + 1) + codes,
                         minlength=num_bins * (other + 1)).reshape(num_bins, other + 1)
    z = counts.argmax(axis=1)
    first = lo + np.arange(num_bins) * k
    colors = code_colors() + [OTHER_REQUESTS_COLOR]
    fig = go.Figure(go.Heatmap(
        z=z[None, :], x=first, y=[0], customdata=np.stack([first, counts.max(axis=1)], 1)[None],
        zmin=-0.5, zmax=other + 0.5, colorscale=discrete_colorscale(colors), showscale=False,
        hovertemplate=f"cells from %{{customdata[0]}} ({k} per column)<extra></extra>"))
    for x, label in ((ext["first_cell"], "extent start"), (ext["last_cell"] + 1, "extent end")):
        fig.add_vline(x=x - 0.5 * k, line=dict(color="#333", width=1.5, dash="dot"),
                      annotation_text=label, annotation_position="top")
    fig.update_layout(**base_layout(f"Request {seq_id}: extent of {ext['num_cells']} cells and "
                                    f"its neighbourhood (grey: other requests)", height=200))
    fig.update_yaxes(visible=False)
    fig.update_xaxes(title="cell (token slot) in the pool", showgrid=False)
    return fig
