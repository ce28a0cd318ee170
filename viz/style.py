"""One colour scheme for every kvsim figure: memory classes, per-request palette, the two schemes.

A request keeps its colour everywhere (heatmaps, block tables, legends) because the colour is a
function of its id only: ``OWNER_PALETTE[seq_id % len(OWNER_PALETTE)]``. Colours of the memory
classes are chosen so that none of them is close to an owner colour.
"""
from __future__ import annotations

# Strong, mutually distinct hues for the KV of live requests. No red (fragmentation), no pale
# blue (cached), no grey (free), no yellow (reservation), no black (shared).
OWNER_PALETTE: tuple[str, ...] = (
    "#1F77B4", "#FF7F0E", "#2CA02C", "#9467BD", "#8C564B", "#E377C2", "#17BECF", "#BCBD22",
)

# memory class -> colour. Keys are allocator.MEMORY_CLASSES plus "shared" (token states held by
# more than one sequence), which the pool heatmap draws apart from single-owner KV.
CLASS_COLORS: dict[str, str] = {
    "token_states": "#4C72B0",
    "shared": "#1B1B2F",
    "reservation": "#F4D27A",
    "internal_fragmentation": "#D62728",
    "external_fragmentation": "#6B0F2A",
    "cached": "#A6CEE3",
    "free": "#E9EDF2",
}

CLASS_LABELS: dict[str, str] = {
    "token_states": "token states (KV held)",
    "shared": "shared block (ref_cnt > 1)",
    "reservation": "reservation (future tokens)",
    "internal_fragmentation": "internal fragmentation",
    "external_fragmentation": "external fragmentation",
    "cached": "cached, evictable prefix",
    "free": "free",
}

# The left and right configurations of the dashboard (they may use the same allocator).
SIDE_COLORS: tuple[str, str] = ("#1F77B4", "#FF7F0E")

FONT_FAMILY = "Inter, -apple-system, Segoe UI, Helvetica, Arial, sans-serif"


def owner_color(seq_id: int) -> str:
    """Stable colour of request ``seq_id`` (the same in every figure and every frame)."""
    return OWNER_PALETTE[int(seq_id) % len(OWNER_PALETTE)]


def base_layout(title: str | None = None, height: int | None = None) -> dict:
    """Layout keywords shared by every kvsim figure (font, margins, white background)."""
    layout: dict = dict(
        font=dict(family=FONT_FAMILY, size=12),
        margin=dict(l=50, r=20, t=60 if title else 20, b=40),
        plot_bgcolor="white",
        paper_bgcolor="white",
        hoverlabel=dict(font=dict(family=FONT_FAMILY)),
    )
    if title:
        layout["title"] = dict(text=title, x=0.0, xanchor="left", font=dict(size=15))
    if height:
        layout["height"] = height
    return layout


ALLOCATOR_COLORS: dict[str, str] = {"paged": "#1F77B4", "max": "#FF7F0E", "pow2": "#2CA02C",
                                    "oracle": "#9467BD"}


def color_allocator_traces(fig):
    """Give every trace named after an allocator ("paged", "max", ...) that allocator's colour,
    so the same scheme has the same colour in every figure (plotly express picks by order)."""
    for trace in fig.data:
        color = ALLOCATOR_COLORS.get(trace.name)
        if color is not None:
            trace.update(line_color=color, marker_color=color)
    return fig
