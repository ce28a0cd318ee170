"""KV-cache groups (hybrid models): each group's view of the one shared pool, side by side, and a
request's tables across groups, where a sliding window's freed blocks trail behind it.

From a GroupedPagedAllocator snapshot (``block_group``, ``group_block_tables``,
``group_names``): plain arrays only, as every kvsim figure.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvsim.viz.classes import MEMORY_CLASSES
from kvsim.viz.pool import (CODE_EXTERNAL, NUM_CODES, code_colors, discrete_colorscale,
                            pool_grid)
from kvsim.viz.style import CLASS_COLORS, base_layout, owner_color

OTHER_GROUP_COLOR = "#7F7F7F"          # a block another group holds
LEFT_WINDOW_COLOR = "#D9D9D9"          # a table position whose block was freed (NULL)
_EXTERNAL = MEMORY_CLASSES.index("external_fragmentation")
_CACHED = MEMORY_CLASSES.index("cached")


def group_view(snapshot, group_id: int):
    """The pool as one group sees it: its own blocks as they are, blocks held (or, when cached,
    keyed) by another group marked ``external_fragmentation`` (drawn grey as "another group").

    Returns:
        a PoolSnapshot look-alike with the same cells.
    """
    from types import SimpleNamespace
    if snapshot.block_group is None:
        raise ValueError("the snapshot has no KV-cache groups (not a GroupedPagedAllocator)")
    group = np.asarray(snapshot.block_group)
    other = (group >= 0) & (group != group_id)
    cell_class = np.where(other, _EXTERNAL, np.asarray(snapshot.cell_class)).astype(np.int8)
    owner = np.where(other, -1, np.asarray(snapshot.owner))
    return SimpleNamespace(kind="paged", block_size=snapshot.block_size,
                           num_cells=snapshot.num_cells, cell_class=cell_class, owner=owner,
                           ref_cnt=snapshot.ref_cnt, fill=snapshot.fill,
                           block_key=snapshot.block_key)


def group_counts(snapshot) -> list[dict]:
    """Per group: blocks it holds, cached blocks keyed by it, and the requests' table positions
    it no longer keeps (NULL: left a sliding window, or superseded Mamba states)."""
    group = np.asarray(snapshot.block_group)
    cached = np.asarray(snapshot.cell_class) == _CACHED
    out = []
    for g, name in enumerate(snapshot.group_names):
        tables = [t[g] for t in snapshot.group_block_tables.values()]
        out.append({"group": name, "held_blocks": int(((group == g) & ~cached).sum()),
                    "cached_blocks": int(((group == g) & cached).sum()),
                    "released_positions": int(sum(int((np.asarray(t) == 0).sum())
                                                  for t in tables))})
    return out


def group_pool_figure(snapshot, max_cells: int = 4000, height: int = 380) -> go.Figure:
    """One heatmap per group, side by side: the whole pool, the group's blocks coloured by
    request (cached: light blue), the other groups' blocks grey, free blocks pale."""
    names = list(snapshot.group_names)
    counts = group_counts(snapshot)
    titles = [f"{n}: {c['held_blocks']} held, {c['cached_blocks']} cached"
              for n, c in zip(names, counts)]
    # one block axis for all panels: its labels on the first only (they would run into the
    # panel to their left)
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=titles, shared_yaxes=True,
                        horizontal_spacing=0.03)
    colors = list(code_colors())
    colors[CODE_EXTERNAL] = OTHER_GROUP_COLOR
    for g in range(len(names)):
        grid = pool_grid(group_view(snapshot, g), max_cells=max_cells)
        fig.add_trace(go.Heatmap(
            z=grid.z, y=grid.row_start, x=np.arange(grid.num_cols) * grid.cells_per_tile,
            zmin=-0.5, zmax=NUM_CODES - 0.5, colorscale=discrete_colorscale(colors),
            showscale=False, hoverongaps=False, name=names[g],
            hovertemplate=f"{names[g]}<br>block from %{{y}}<extra></extra>"), row=1, col=g + 1)
    for label, color in (("request KV (colour = request)", owner_color(0)),
                         ("cached, evictable", CLASS_COLORS["cached"]),
                         ("held by another group", OTHER_GROUP_COLOR),
                         ("free", CLASS_COLORS["free"])):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=label,
                                 marker=dict(symbol="square", size=11, color=color),
                                 hoverinfo="skip"))
    fig.update_layout(**base_layout("The pool of each KV-cache group", height),
                      legend=dict(orientation="h", y=-0.05, x=0))
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    fig.update_yaxes(showgrid=False, zeroline=False, autorange="reversed")
    return fig


def request_tables_figure(snapshot, seq_id, max_blocks: int = 128,
                          height: int | None = None) -> go.Figure:
    """A request's block table in every group, one row per group, one column per logical
    block: held blocks in the request's colour, released positions (NULL) grey: a sliding
    window's grey run grows behind it as the request decodes."""
    if seq_id not in snapshot.group_block_tables:
        raise ValueError(f"request {seq_id} is not in this snapshot "
                         f"({len(snapshot.group_block_tables)} live requests)")
    tables = snapshot.group_block_tables[seq_id]
    width = min(max(len(t) for t in tables), max_blocks)
    z = np.full((len(tables), width), np.nan)
    text = np.full((len(tables), width), "", dtype=object)
    for g, table in enumerate(tables):
        table = np.asarray(table)[-width:] if len(table) > width else np.asarray(table)
        z[g, :len(table)] = np.where(table == 0, 0, 1)
        text[g, :len(table)] = [("released" if b == 0 else f"block {b}") for b in table]
    fig = go.Figure(go.Heatmap(
        z=z, text=text, x=np.arange(width), y=list(snapshot.group_names), zmin=0, zmax=1,
        colorscale=[[0, LEFT_WINDOW_COLOR], [0.5, LEFT_WINDOW_COLOR],
                    [0.5, owner_color(seq_id)], [1, owner_color(seq_id)]],
        showscale=False, xgap=1, ygap=2, hoverongaps=False,
        hovertemplate="%{y}, logical block %{x}: %{text}<extra></extra>"))
    tokens = snapshot.seq_lens.get(seq_id, 0)
    fig.update_layout(**base_layout(f"Request {seq_id}: {tokens} tokens, its table per group",
                                    height or 120 + 40 * len(tables)))
    fig.update_xaxes(title="logical block", showgrid=False, zeroline=False)
    fig.update_yaxes(showgrid=False, zeroline=False, autorange="reversed")
    return fig
