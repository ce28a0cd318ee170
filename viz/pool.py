"""Block-pool heatmap: one cell per block (paged) or per cell of tokens (contiguous).

The whole pool is ONE ``go.Heatmap`` whose z holds small integer colour codes and whose
customdata holds the hover numbers, both as numpy arrays (plotly serialises them as base64 typed
arrays, a few bytes per cell instead of a JSON number each). Pools larger than ``max_cells`` are
shown as tiles of ``k`` consecutive blocks coloured by their most common code, with tile counts in
the hover, so a 100k-block pool costs the browser no more than a 16k-block one.

Colour codes (``code_names()`` lists them)::

    0 free | 1 cached | 2 external frag. | 3 internal frag. | 4 reservation | 5 shared
    6.. 6+P-1  token states of request seq_id, colour OWNER_PALETTE[seq_id % P]
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from kvsim.viz.classes import MEMORY_CLASSES
from kvsim.viz.style import CLASS_COLORS, CLASS_LABELS, OWNER_PALETTE, base_layout

CODE_FREE, CODE_CACHED, CODE_EXTERNAL, CODE_INTERNAL, CODE_RESERVATION, CODE_SHARED = range(6)
CODE_OWNER0 = 6
NUM_CODES = CODE_OWNER0 + len(OWNER_PALETTE)
DEFAULT_MAX_CELLS = 12_000  # a 10k-block pool is drawn block by block

_CLASS_TO_CODE = {
    "free": CODE_FREE, "cached": CODE_CACHED, "external_fragmentation": CODE_EXTERNAL,
    "internal_fragmentation": CODE_INTERNAL, "reservation": CODE_RESERVATION,
    "token_states": CODE_OWNER0,
}
_TOKEN_STATES = MEMORY_CLASSES.index("token_states")
_CODE_LUT = np.array([_CLASS_TO_CODE[c] for c in MEMORY_CLASSES], dtype=np.int8)


def code_names() -> list[str]:
    """Colour-code index -> class name ("token_states" for every owner colour)."""
    names = ["free", "cached", "external_fragmentation", "internal_fragmentation",
             "reservation", "shared"]
    return names + ["token_states"] * len(OWNER_PALETTE)


def code_colors() -> list[str]:
    """Colour-code index -> colour."""
    return [CLASS_COLORS[n] for n in code_names()[:CODE_OWNER0]] + list(OWNER_PALETTE)


def cell_codes(cell_class: np.ndarray, owner: np.ndarray, ref_cnt: np.ndarray) -> np.ndarray:
    """Colour code of every cell (int8), from a snapshot's per-cell arrays.

    Args:
        cell_class: int index into MEMORY_CLASSES per cell.
        owner: owning seq_id per cell (-1 none; shared: lowest seq_id).
        ref_cnt: sequences holding each cell.
    Returns:
        int8 codes in [0, NUM_CODES).
    """
    cell_class = np.asarray(cell_class)
    codes = _CODE_LUT[cell_class]
    # only the held cells need their owner's colour (the live player calls this every frame)
    held = np.flatnonzero(cell_class == _TOKEN_STATES)
    if len(held):
        owner = np.asarray(owner)[held]
        own = (np.maximum(owner, 0) % len(OWNER_PALETTE)).astype(np.int8) + CODE_OWNER0
        codes[held] = np.where(np.asarray(ref_cnt)[held] > 1, np.int8(CODE_SHARED), own)
    return codes


def tile_codes(codes: np.ndarray, cells_per_tile: int) -> np.ndarray:
    """The colour code of each tile of ``cells_per_tile`` consecutive cells: its most common
    code (ties: the lowest code). One tile per cell when ``cells_per_tile`` is 1.

    Returns:
        uint8 codes, one per tile (``ceil(len(codes) / cells_per_tile)``).
    """
    codes = np.asarray(codes).astype(np.uint8)
    if cells_per_tile == 1:
        return codes
    n, k = len(codes), cells_per_tile
    num_tiles = math.ceil(n / k)
    if n % k:   # the last tile is short: pad it with its own first code (no new majority)
        codes = np.append(codes, np.full(num_tiles * k - n, codes[(num_tiles - 1) * k]))
    rows = codes.reshape(num_tiles, k)
    out = rows[:, 0].copy()
    # most tiles hold one code (a contiguous extent is a run): count only the mixed ones
    mixed = np.flatnonzero((rows != rows[:, :1]).any(axis=1))
    if len(mixed):
        sub = rows[mixed].astype(np.int64)
        if n % k and mixed[-1] == num_tiles - 1:   # count the short tile's real cells only
            sub[-1, n - (num_tiles - 1) * k:] = NUM_CODES
        ids = np.repeat(np.arange(len(mixed)), k) * (NUM_CODES + 1) + sub.ravel()
        counts = np.bincount(ids, minlength=len(mixed) * (NUM_CODES + 1)).reshape(-1, NUM_CODES + 1)
        out[mixed] = counts[:, :NUM_CODES].argmax(axis=1)
    return out


def grid_shape(num_tiles: int, aspect: float = 1.0) -> tuple[int, int]:
    """(rows, columns) of the grid that lays ``num_tiles`` tiles out row by row."""
    num_cols = max(1, math.ceil(math.sqrt(max(num_tiles, 1) * aspect)))
    return max(1, math.ceil(num_tiles / num_cols)), num_cols


@dataclass(frozen=True)
class PoolGrid:
    """The heatmap's arrays: a ``num_rows x num_cols`` grid of tiles of ``cells_per_tile`` cells.

    z: float32 colour codes, NaN past the last cell.
    customdata: float32. Exact grids (cells_per_tile == 1, ``[rows, cols, 5]``) hold (block,
    owner or NaN, ref_cnt, fill, top 24 bits of the key) per cell; aggregated grids
    (``[rows, cols, 6]``) hold (first cell, cells in tile, cells held, cells shared, distinct
    owners, the owner holding most cells or NaN). float32 with NaN rather than int32 with -1:
    the 0xFF bytes of -1 become '/' in base64, which plotly's JSON escapes to six characters.
    row_start: the first cell index of each row (the y axis).
    """

    z: np.ndarray
    customdata: np.ndarray
    row_start: np.ndarray
    cells_per_tile: int
    num_cells: int

    @property
    def num_rows(self) -> int:
        return self.z.shape[0]

    @property
    def num_cols(self) -> int:
        return self.z.shape[1]


def pool_grid(snapshot, max_cells: int = DEFAULT_MAX_CELLS, aspect: float = 1.0,
              min_cells_per_tile: int = 1) -> PoolGrid:
    """Lay a snapshot's cells out on a grid, aggregating into tiles beyond ``max_cells``.

    Args:
        snapshot: a PoolSnapshot (or any object with its per-cell arrays).
        max_cells: most grid cells drawn; more cells are grouped ``k`` per tile.
        aspect: columns / rows of the grid.
        min_cells_per_tile: group at least this many cells per tile (a contiguous pool, one cell
            per token, drawn at a paged pool's block granularity).
    Returns:
        the PoolGrid.
    """
    n = int(snapshot.num_cells)
    if max_cells < 1:
        raise ValueError(f"max_cells must be >= 1, got {max_cells}")
    codes = cell_codes(snapshot.cell_class, snapshot.owner, snapshot.ref_cnt)
    k = max(1, min_cells_per_tile, math.ceil(n / max_cells))
    num_tiles = math.ceil(n / k) if n else 0
    num_rows, num_cols = grid_shape(num_tiles, aspect)
    size = num_rows * num_cols
    z = np.full(size, np.nan, dtype=np.float32)
    custom = np.zeros((size, 5 if k == 1 else 6), dtype=np.float32)
    if k == 1:
        z[:n] = codes
        custom[:n, 0] = np.arange(n, dtype=np.int32)
        owner = np.asarray(snapshot.owner)
        custom[:n, 1] = np.where(owner >= 0, owner, np.nan)
        custom[:n, 2] = snapshot.ref_cnt
        custom[:n, 3] = snapshot.fill
        custom[:n, 4] = (np.asarray(snapshot.block_key, dtype=np.uint64) >> np.uint64(40))
    elif n:
        tile = np.arange(n) // k
        z[:num_tiles] = tile_codes(codes, k)
        starts = np.arange(0, n, k)
        cls = np.asarray(snapshot.cell_class)
        held = np.isin(cls, [MEMORY_CLASSES.index(c) for c in
                             ("token_states", "reservation", "internal_fragmentation")])
        owner = np.asarray(snapshot.owner, dtype=np.int64)
        custom[:num_tiles, 0] = starts
        custom[:num_tiles, 1] = np.diff(np.append(starts, n))
        custom[:num_tiles, 2] = np.add.reduceat(held.astype(np.int32), starts)
        custom[:num_tiles, 3] = np.add.reduceat((np.asarray(snapshot.ref_cnt) > 1).astype(np.int32),
                                                starts)
        has = owner >= 0
        span = int(owner.max(initial=0)) + 1
        pairs, pair_cells = np.unique(tile[has] * span + owner[has], return_counts=True)
        pair_tile = pairs // span
        custom[:num_tiles, 4] = np.bincount(pair_tile, minlength=num_tiles)
        # the owner with most cells per tile: sort pairs by (tile, cells), keep each tile's last
        order = np.lexsort((pair_cells, pair_tile))
        last = np.flatnonzero(np.diff(np.append(pair_tile[order], -1)) != 0)
        custom[:num_tiles, 5] = np.nan
        custom[pair_tile[order][last], 5] = (pairs[order][last] % span)
    return PoolGrid(z=z.reshape(num_rows, num_cols),
                    customdata=custom.reshape(num_rows, num_cols, -1),
                    row_start=np.arange(num_rows, dtype=np.int64) * num_cols * k,
                    cells_per_tile=k, num_cells=n)


def discrete_colorscale(colors: list[str]) -> list[list]:
    """A plotly colorscale giving integer z = i exactly ``colors[i]`` (zmin -0.5, zmax n - 0.5)."""
    n = len(colors)
    scale = []
    for i, c in enumerate(colors):
        scale.append([i / n, c])
        scale.append([(i + 1) / n, c])
    return scale


def pool_heatmap(snapshot, title: str | None = None, max_cells: int = DEFAULT_MAX_CELLS,
                 height: int = 420, show_legend: bool = True,
                 tile_tokens: int | None = None) -> go.Figure:
    """The block pool as one heatmap, coloured by owning request and memory class.

    Args:
        snapshot: PoolSnapshot.
        title: figure title.
        max_cells: most grid cells drawn (larger pools are aggregated into tiles).
        height: figure height in pixels.
        show_legend: draw the class legend (off for small multiples).
        tile_tokens: draw at least this many tokens per tile (side by side with a paged pool:
            its block size), so both pools show the same granularity.
    Returns:
        the figure.
    """
    b = int(snapshot.block_size)
    grid = pool_grid(snapshot, max_cells=max_cells,
                     min_cells_per_tile=max(1, (tile_tokens or b) // b))
    cell = "block" if snapshot.kind == "paged" else "slot"
    if grid.cells_per_tile == 1:
        hover = (f"{cell} %{{customdata[0]}}<br>request %{{customdata[1]}}"
                 f"<br>ref_cnt %{{customdata[2]}}<br>fill %{{customdata[3]}}/{b} tokens"
                 "<br>content key %{customdata[4]:06x}…<extra></extra>")
    else:
        hover = (f"%{{customdata[1]}} {cell}s from {cell} %{{customdata[0]}}<br>mostly request "
                 "%{customdata[5]}<br>held %{customdata[2]} · shared %{customdata[3]}"
                 "<br>requests here %{customdata[4]}<extra></extra>")
    small = grid.num_cols <= 48
    fig = go.Figure(go.Heatmap(
        z=grid.z, customdata=grid.customdata, y=grid.row_start,
        x=np.arange(grid.num_cols) * grid.cells_per_tile,
        zmin=-0.5, zmax=NUM_CODES - 0.5, colorscale=discrete_colorscale(code_colors()),
        showscale=False, hovertemplate=hover, xgap=1 if small else 0, ygap=1 if small else 0,
        hoverongaps=False, name="pool"))
    if show_legend:
        for name in ("token_states", "shared", "reservation", "internal_fragmentation",
                     "external_fragmentation", "cached", "free"):
            color = OWNER_PALETTE[0] if name == "token_states" else CLASS_COLORS[name]
            label = ("request KV (colour = request)" if name == "token_states"
                     else CLASS_LABELS[name])
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=label,
                                     marker=dict(symbol="square", size=11, color=color,
                                                 line=dict(width=1, color="#999")),
                                     hoverinfo="skip"))
    layout = base_layout(title, height)
    layout["margin"]["b"] = 10
    fig.update_layout(**layout, showlegend=show_legend,
                      legend=dict(orientation="h", yanchor="top", y=-0.02, x=0, font=dict(size=11)))
    tile = "" if grid.cells_per_tile == 1 else f", {grid.cells_per_tile} per tile"
    fig.update_xaxes(showgrid=False, zeroline=False, title=None, showticklabels=False)
    fig.update_yaxes(showgrid=False, zeroline=False, autorange="reversed",
                     title=dict(text=f"first {cell} of the row{tile}", font=dict(size=11)))
    return fig
