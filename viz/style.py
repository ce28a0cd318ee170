"""One colour scheme for every kvsim figure: memory classes, per-request palette, the two schemes.

A request keeps its colour everywhere (heatmaps, block tables, legends) because the colour is a
function of its id only: ``OWNER_PALETTE[seq_id % len(OWNER_PALETTE)]``. Colours of the memory
classes are chosen so that none of them is close to an owner colour.
"""
from __future__ import annotations

# Colours of the KV of live requests: greens and violets, the two arcs of the colour wheel that
# no memory class uses (red/wine = fragmentation, yellow = reservation, blue = token states and
# the pale cached blue, grey/black = free/shared). A test keeps every owner colour at least
# MIN_CLASS_HUE_DISTANCE degrees of hue from every class colour; lightness tells the greens
# (and the violets) apart from each other.
OWNER_PALETTE: tuple[str, ...] = (
    "#2CA02C", "#9467BD", "#66A61E", "#5E4FA2", "#1B9E77", "#D35FB7", "#7FC97F", "#B39DDB",
)
MIN_CLASS_HUE_DISTANCE = 25.0

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
# lines that are not requests (running / waiting, several runs): Plotly's first colours
SERIES_COLORS: tuple[str, ...] = ("#1F77B4", "#FF7F0E", "#2CA02C", "#9467BD", "#8C564B",
                                  "#17BECF", "#7F7F7F", "#BCBD22")
# tick labels of numeric axes: at most 4 significant digits, no float noise (0.024999999999999792
# reads 0.025), thousands separated ("966,400", never "966.4005k")
NUMBER_TICKS = ",.4~r"

# axis titles for summary and sweep columns (the raw names are for files, not for readers)
METRIC_LABELS: dict[str, str] = {
    "interactivity": "interactivity (output tokens/s per user)",
    "output_throughput_per_gpu": "output throughput per GPU (tokens/s)",
    "concurrency": "client concurrency (requests in flight)",
    "p99_ttft_ms": "p99 TTFT (ms)", "p99_tpot_ms": "p99 TPOT (ms)",
    "request_throughput": "request throughput (requests/s)",
    "mean_running": "mean running requests", "max_running": "max running requests",
    "num_preemptions": "preemptions", "preemptions": "preemptions",
    "max_concurrency": "max_model_len requests at once (vLLM)",
    "num_gpu_blocks": "KV blocks per GPU", "kv_cache_tokens": "KV cache tokens",
    "throughput": "output tokens / s", "output_throughput_tokens_per_s": "output tokens / s",
    "request_throughput_per_s": "requests / s", "mean_kv_usage": "mean KV usage",
    "prefix_hit_rate": "prefix hit rate", "cost": "cost (GPUs x price rank)",
    "block_size": "block size (tokens)", "gpu_memory_utilization": "gpu_memory_utilization",
    "rate": "arrival rate (requests / s)", "rate_scale": "traffic (x the trace's rate)",
    "max_num_seqs": "max_num_seqs", "max_model_len": "max_model_len (tokens)",
    "tp": "tensor parallel size",
}
for _m, _name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "end-to-end")):
    for _p in ("p50", "p90", "p99", "mean"):
        METRIC_LABELS[f"{_m}_s.{_p}"] = METRIC_LABELS[f"{_m}_{_p}"] = f"{_name} {_p} (s)"


def metric_label(name: str) -> str:
    """The axis title of a summary or sweep column (the name itself when none is known)."""
    return METRIC_LABELS.get(name, name.replace("_", " "))

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
