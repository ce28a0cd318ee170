"""viz/ figure builders against synthetic PoolSnapshot-shaped arrays."""
import json

import numpy as np
import pandas as pd
import plotly.io as pio
import pytest

from kvsim.allocator import ContiguousAllocator, PoolSnapshot
from kvsim.viz.block_table import (block_holders, block_table_figure, block_table_frame,
                             contiguous_extent, requests_frame, slot_mapping, slot_mapping_runs)
from kvsim.viz.classes import MEMORY_CLASSES
from kvsim.viz.pool import (CODE_CACHED, CODE_FREE, CODE_INTERNAL, CODE_OWNER0, CODE_RESERVATION,
                      CODE_SHARED, NUM_CODES, cell_codes, code_colors, pool_grid, pool_heatmap)
from kvsim.viz.style import OWNER_PALETTE, owner_color
from kvsim.viz.synthetic import synthetic_snapshot
from kvsim.viz.timeseries import breakdown_area, compare_bars, concurrency_chart, ecdf, latency_cdf

C = {n: i for i, n in enumerate(MEMORY_CLASSES)}


def tiny_paged():
    """6 blocks of 4 tokens: seq 3 holds [0, 2], seq 5 holds [0, 4] (block 0 shared), 1 cached."""
    cls = np.array([C["token_states"], C["cached"], C["token_states"], C["free"],
                    C["token_states"], C["free"]], dtype=np.int8)
    return PoolSnapshot(
        kind="paged", block_size=4, num_cells=6, cell_class=cls,
        owner=np.array([3, -1, 3, -1, 5, -1]), ref_cnt=np.array([2, 0, 1, 0, 1, 0], np.int32),
        fill=np.array([4, 4, 2, 0, 3, 0], np.int32),
        block_key=np.array([11, 22, 0, 0, 0, 0], np.uint64),
        block_tables={3: np.array([0, 2]), 5: np.array([0, 4])}, seq_lens={3: 6, 5: 7})


def test_cell_codes_separate_classes_shared_and_owners():
    s = tiny_paged()
    codes = cell_codes(s.cell_class, s.owner, s.ref_cnt)
    assert codes.tolist() == [CODE_SHARED, CODE_CACHED, CODE_OWNER0 + 3, CODE_FREE,
                              CODE_OWNER0 + 5, CODE_FREE]
    # a request's colour depends on its id only
    assert code_colors()[CODE_OWNER0 + 5] == owner_color(5) == OWNER_PALETTE[5]
    assert owner_color(5 + len(OWNER_PALETTE)) == owner_color(5)


def test_contiguous_reservation_and_fragmentation_codes():
    s = synthetic_snapshot(400, kind="contiguous", seed=1)
    codes = cell_codes(s.cell_class, s.owner, s.ref_cnt)
    assert np.all(codes[s.cell_class == C["reservation"]] == CODE_RESERVATION)
    assert np.all(codes[s.cell_class == C["internal_fragmentation"]] == CODE_INTERNAL)
    assert (codes == CODE_RESERVATION).any() and (codes == CODE_INTERNAL).any()


def test_exact_grid_keeps_every_cell_and_hover_fields():
    s = tiny_paged()
    g = pool_grid(s, max_cells=100)
    assert g.cells_per_tile == 1 and g.num_rows * g.num_cols >= 6
    flat = g.customdata.reshape(-1, 5)
    assert flat[:6, 0].tolist() == list(range(6))  # block ids
    assert flat[0, 1] == 3 and np.isnan(flat[1, 1])  # owner, none -> NaN
    assert flat[:6, 2].tolist() == [2, 0, 1, 0, 1, 0]  # ref_cnt
    assert np.isnan(g.z.reshape(-1)[6:]).all()  # padding is a gap, not a free block


@pytest.mark.parametrize("n", [10_000, 100_000])
def test_large_pools_aggregate_into_bounded_tiles(n):
    s = synthetic_snapshot(n, seed=2)
    g = pool_grid(s, max_cells=4096)
    assert g.num_rows * g.num_cols <= 4096 + g.num_cols
    flat = g.customdata.reshape(-1, 6)
    tiles = int(np.ceil(n / g.cells_per_tile))
    assert flat[:tiles, 1].sum() == n  # every cell lies in exactly one tile
    held = np.isin(s.cell_class, [C["token_states"], C["reservation"], C["internal_fragmentation"]])
    assert flat[:tiles, 2].sum() == held.sum()
    # a tile's code is the most common code of its cells
    codes = cell_codes(s.cell_class, s.owner, s.ref_cnt)
    k = g.cells_per_tile
    assert g.z.reshape(-1)[0] == np.bincount(codes[:k], minlength=NUM_CODES).argmax()


def test_contiguous_pool_drawn_at_block_granularity_from_a_real_allocator():
    c = ContiguousAllocator(capacity_tokens=256, policy="oracle", max_model_len=128,
                            placement="first-fit")
    assert c.allocate(0, 20, 40) and c.allocate(7, 10, 30)
    snap = c.snapshot()
    g = pool_grid(snap, min_cells_per_tile=16)
    flat = g.customdata.reshape(-1, 6)
    assert g.cells_per_tile == 16 and flat[:16, 1].sum() == 256
    owners = [int(o) if not np.isnan(o) else -1 for o in flat[:16, 5]]
    ext0, ext7 = snap.block_tables[0], snap.block_tables[7]
    assert owners[ext0[0] // 16] == 0 and owners[ext7[-1] // 16] == 7
    assert owners[-1] == -1  # the pool's end is free
    fig = pool_heatmap(snap, tile_tokens=16)
    assert "mostly request" in fig.data[0].hovertemplate


def test_heatmap_is_one_trace_with_binary_arrays_and_small_json():
    fig = pool_heatmap(synthetic_snapshot(100_000, seed=3))
    heatmaps = [t for t in fig.data if t.type == "heatmap"]
    assert len(heatmaps) == 1
    spec = json.loads(pio.to_json(fig, validate=False))
    assert "bdata" in spec["data"][0]["z"] and "bdata" in spec["data"][0]["customdata"]
    assert len(pio.to_json(fig, validate=False)) < 1_000_000


def test_heatmap_is_deterministic():
    a = pio.to_json(pool_heatmap(synthetic_snapshot(2000, seed=4)), validate=False)
    b = pio.to_json(pool_heatmap(synthetic_snapshot(2000, seed=4)), validate=False)
    assert a == b


def test_block_table_and_sharing():
    s = tiny_paged()
    assert block_holders(s) == {0: [3, 5]}
    bt = block_table_frame(s, 5)
    assert bt["physical"].tolist() == [0, 4]
    assert bt["shared_with"].tolist() == ["3", ""]
    assert bt["content_key"].iloc[0] == f"{11:016x}"
    req = requests_frame(s)
    assert req.set_index("seq_id")["num_shared_blocks"].to_dict() == {3: 1, 5: 1}
    with pytest.raises(ValueError, match="request 9 is not in this snapshot"):
        block_table_frame(s, 9)


def test_slot_mapping_follows_the_block_table():
    s = tiny_paged()
    assert slot_mapping(s, 3).tolist() == [0, 1, 2, 3, 8, 9]
    runs = slot_mapping_runs(s, 5)
    assert runs[["first_slot", "last_slot", "num_tokens"]].values.tolist() == [[0, 3, 4], [16, 18, 3]]
    assert runs["num_tokens"].sum() == s.seq_lens[5]


def test_contiguous_extent_and_holes():
    cls = np.array([C["free"], C["token_states"], C["token_states"], C["reservation"],
                    C["internal_fragmentation"], C["external_fragmentation"],
                    C["external_fragmentation"], C["token_states"]], dtype=np.int8)
    s = PoolSnapshot(kind="contiguous", block_size=1, num_cells=8, cell_class=cls,
                        owner=np.array([-1, 1, 1, 1, 1, -1, -1, 2]), ref_cnt=np.ones(8, np.int32),
                        fill=np.zeros(8, np.int32), block_key=np.zeros(8, np.uint64),
                        block_tables={1: np.arange(1, 5), 2: np.array([7])}, seq_lens={1: 2, 2: 1})
    ext = contiguous_extent(s, 1)
    assert (ext["first_cell"], ext["last_cell"], ext["num_cells"]) == (1, 4, 4)
    assert (ext["hole_before_cells"], ext["hole_after_cells"]) == (1, 2)
    assert (ext["token_states_cells"], ext["reservation_cells"],
            ext["internal_fragmentation_cells"]) == (2, 1, 1)
    assert contiguous_extent(s, 2)["hole_after_cells"] == 0
    assert requests_frame(s).set_index("seq_id")["num_cells"].to_dict() == {1: 4, 2: 1}


def test_block_table_figure_links_every_logical_block():
    s = synthetic_snapshot(5000, seed=5)
    seq = max(s.block_tables, key=lambda k: len(s.block_tables[k]))
    fig = block_table_figure(s, seq, max_blocks=8)
    lines = fig.data[0]
    assert sum(v is None for v in lines.x) == min(8, len(s.block_tables[seq]))
    assert len(fig.data[2].z[0]) <= 2000  # the pool strip is binned


def _ts():
    t = np.arange(5.0)
    cap = 100
    df = pd.DataFrame({"time_s": t, "token_states": [0, 10, 40, 60, 20],
                       "reservation": [0, 20, 30, 20, 0], "internal_fragmentation": [0, 5, 5, 5, 0],
                       "external_fragmentation": [0, 0, 10, 10, 0], "cached": [0, 0, 0, 0, 30],
                       "running": [0, 1, 3, 4, 1], "waiting": [0, 0, 2, 1, 0],
                       "num_preemptions": [0, 0, 0, 1, 1]})
    df["free"] = cap - df[list(MEMORY_CLASSES[:-1])].sum(axis=1)
    return df


def test_breakdown_area_stacks_to_100_percent():
    fig = breakdown_area(_ts(), now_s=2.0)
    total = np.sum([np.asarray(t.y) for t in fig.data], axis=0)
    assert np.allclose(total, 100.0)
    assert [t.customdata[2] for t in fig.data][:2] == [40, 30]  # slots in the hover
    with pytest.raises(ValueError, match="missing column"):
        breakdown_area(_ts().drop(columns=["cached"]))


def test_concurrency_and_cdf_and_bars():
    fig = concurrency_chart(_ts())
    assert list(fig.data[0].y) == [0, 1, 3, 4, 1]
    x, y = ecdf([3.0, 1.0, np.nan, 2.0])
    assert x.tolist() == [1.0, 2.0, 3.0] and y.tolist() == pytest.approx([1 / 3, 2 / 3, 1.0])
    cdf = latency_cdf({"paged": pd.DataFrame({"ttft_s": [0.1, 0.2]}),
                       "max": pd.DataFrame({"ttft_s": [0.5, 0.9]})}, "ttft_s")
    assert len(cdf.data) == 2 and "p50" in cdf.data[0].name
    bars = compare_bars({"paged": {"x": 1.0}, "max": {"x": 2.0}}, {"x": "X"})
    assert [b.y[0] for b in bars.data] == [1.0, 2.0]
    with pytest.raises(ValueError, match="has no 'y'"):
        compare_bars({"paged": {"x": 1.0}}, {"y": "Y"})


def test_gpu_memory_segments_sum_to_the_gpu():
    from kvsim.viz.capacity import gpu_memory_figure, gpu_memory_segments
    from kvsim.planner.capacity import compute_capacity
    from kvsim.planner.presets import get_gpu, get_model
    rep = compute_capacity(get_model("Llama-3.1-8B"), get_gpu("A100-80GB"),
                           max_model_len=8192).to_dict()
    seg = gpu_memory_segments(rep)
    assert sum(seg.values()) == rep["total_memory_bytes"]
    assert seg["available_kv_bytes"] == rep["available_kv_bytes"] > 0
    fig = gpu_memory_figure(rep)
    assert [t.name for t in fig.data][0] == "weights" and len(fig.data) == 5  # no "given" segment


def test_allocator_traces_get_their_scheme_colour():
    import plotly.graph_objects as go
    from kvsim.viz.style import ALLOCATOR_COLORS, color_allocator_traces
    fig = go.Figure([go.Scatter(name="max", y=[1]), go.Scatter(name="paged", y=[2]),
                     go.Scatter(name="other", y=[3])])
    color_allocator_traces(fig)
    assert fig.data[0].line.color == ALLOCATOR_COLORS["max"]
    assert fig.data[1].marker.color == ALLOCATOR_COLORS["paged"]
    assert fig.data[2].line.color is None


def test_kernel_error_figure_marks_failures_and_tolerance():
    from kvsim.viz.kernel_checks import FAIL_COLOR, PASS_COLOR, kernel_error_figure
    checks = pd.DataFrame({"seq_id": [1, 2, 3], "num_tokens": [10, 20, 30],
                           "num_shared_blocks": [0, 2, 0], "max_abs_err": [0.0, 1e-7, 1e-2],
                           "max_rel_err": [0.0, 2e-7, 5e-2], "bitwise_equal": [True, True, False],
                           "passed": [True, True, False]})
    fig = kernel_error_figure(checks, 1e-5)
    bar = fig.data[0]
    assert list(bar.marker.color) == [PASS_COLOR, PASS_COLOR, FAIL_COLOR]
    assert bar.y[0] > 0  # an exact result still shows on the log axis
    assert fig.layout.shapes[0].y0 == 1e-5


def test_extent_figure_shows_the_extent_and_its_neighbours():
    from kvsim.viz.block_table import extent_figure
    c = ContiguousAllocator(capacity_tokens=512, policy="oracle", max_model_len=256,
                            placement="first-fit")
    assert c.allocate(0, 10, 40) and c.allocate(1, 20, 100) and c.allocate(2, 5, 50)
    c.free(0)  # a hole before request 1
    snap = c.snapshot()
    fig = extent_figure(snap, 1)
    z = np.asarray(fig.data[0].z)[0]
    x = np.asarray(fig.data[0].x)
    ext = snap.block_tables[1]
    inside = (x >= ext[0]) & (x <= ext[-1])
    assert (z[inside] == CODE_OWNER0 + 1).sum() == 20  # its 20 tokens, one column per cell
    assert (z[inside] == CODE_RESERVATION).sum() == 80
    assert (z[x > ext[-1]] == NUM_CODES).any()  # request 2 right after it, grey
    assert (z[x < ext[0]] == CODE_FREE).all()   # the freed hole before it


def _hls(color: str) -> tuple[float, float, float]:
    import colorsys

    r, g, b = (int(color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    h, lightness, s = colorsys.rgb_to_hls(r, g, b)
    return 360 * h, lightness, s


def test_request_colours_never_reuse_a_class_hue():
    from kvsim.viz.style import CLASS_COLORS, MIN_CLASS_HUE_DISTANCE

    for color in OWNER_PALETTE:
        hue, light, _ = _hls(color)
        for name, class_color in CLASS_COLORS.items():
            c_hue, c_light, c_sat = _hls(class_color)
            chroma = c_sat * (1 - abs(2 * c_light - 1))
            if chroma > 0.15:   # a coloured class: keep away from its hue
                gap = min(abs(hue - c_hue), 360 - abs(hue - c_hue))
                assert gap >= MIN_CLASS_HUE_DISTANCE, (color, name, gap)
            else:               # grey / near-black classes: keep away in lightness
                assert abs(light - c_light) >= 0.15, (color, name)
    assert len(set(OWNER_PALETTE)) == len(OWNER_PALETTE)


def test_axes_have_readable_ticks_titles_and_shared_scales():
    import pandas as pd

    from kvsim.viz.plan_figures import sweep_metric_figure
    from kvsim.viz.style import NUMBER_TICKS, metric_label
    from kvsim.viz.timeseries import concurrency_chart, concurrency_limits, latency_cdf

    flat = pd.DataFrame({"tpot_s": [0.024999999999999792] * 5})
    fig = latency_cdf({"a": flat}, "tpot_s", title="Time per output token")
    assert fig.layout.xaxis.tickformat == NUMBER_TICKS and fig.layout.xaxis.title.text == "Time per output token (s)"
    sweep = pd.DataFrame({"block_size": [8, 16, 32] * 2, "mean_running": [966400.5] * 6,
                          "allocator": ["paged"] * 3 + ["max"] * 3, "error": [None] * 6})
    fig = sweep_metric_figure(sweep, "block_size", "mean_running", group_by=["allocator"])
    assert fig.layout.yaxis.tickformat == NUMBER_TICKS and fig.layout.yaxis.rangemode == "tozero"
    assert fig.layout.yaxis.title.text == "mean running requests" == metric_label("mean_running")
    assert fig.layout.xaxis.title.text == "block size (tokens)"
    # equal lines stay visible: each group its own dash
    assert len({t.line.dash for t in fig.data}) == 2
    assert metric_label("ttft_s.p99") == "TTFT p99 (s)" and metric_label("foo_bar") == "foo bar"
    a = pd.DataFrame({"time_s": [0, 1], "running": [1, 2], "waiting": [0, 9], "num_preemptions": [0, 1]})
    b = pd.DataFrame({"time_s": [0, 1], "running": [1, 40], "waiting": [0, 1], "num_preemptions": [0, 5]})
    limits = concurrency_limits([a, b])
    assert limits == {"y_max": 40.0, "preemptions_max": 5.0}
    ranges = [concurrency_chart(f, **limits).layout.yaxis.range for f in (a, b)]
    assert ranges[0] == ranges[1]   # side by side, one scale
