"""Pool-heatmap render cost: time to build the figure and its serialised size.

    python bench/render.py [--sizes 10000 100000] [--repeats 5]

For each pool size and each scheme (paged: scattered blocks with shared prefixes and cached
blocks; contiguous: extents with reservations and holes) it builds ``viz.pool.pool_heatmap`` on
a synthetic snapshot, serialises it the way Streamlit does (``plotly.io.to_json``,
validate=False) and prints the median build time, median build+serialise time and JSON bytes.
"""
from __future__ import annotations

import argparse
import statistics
import time

import plotly.io as pio

from kvsim.viz.pool import DEFAULT_MAX_CELLS, pool_grid, pool_heatmap
from kvsim.viz.synthetic import synthetic_snapshot


def measure(num_cells: int, kind: str, repeats: int, max_cells: int) -> dict:
    """Median timings and JSON size of one pool size."""
    snap = synthetic_snapshot(num_cells, kind=kind, seed=0)
    pool_heatmap(snap, max_cells=max_cells)  # warm-up (imports, plotly validators)
    build, total = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fig = pool_heatmap(snap, max_cells=max_cells)
        t1 = time.perf_counter()
        spec = pio.to_json(fig, validate=False)
        t2 = time.perf_counter()
        build.append(t1 - t0)
        total.append(t2 - t0)
    grid = pool_grid(snap, max_cells=max_cells)
    return dict(num_cells=num_cells, kind=kind, cells_per_tile=grid.cells_per_tile,
                grid=f"{grid.num_rows}x{grid.num_cols}", build_ms=1e3 * statistics.median(build),
                build_json_ms=1e3 * statistics.median(total), json_bytes=len(spec))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-cells", type=int, default=DEFAULT_MAX_CELLS)
    args = parser.parse_args()
    print(f"{'cells':>8} {'kind':>10} {'per tile':>8} {'grid':>9} {'build ms':>9} "
          f"{'+json ms':>9} {'json KB':>8}")
    for n in args.sizes:
        for kind in ("paged", "contiguous"):
            r = measure(n, kind, args.repeats, args.max_cells)
            print(f"{r['num_cells']:>8} {r['kind']:>10} {r['cells_per_tile']:>8} {r['grid']:>9} "
                  f"{r['build_ms']:>9.1f} {r['build_json_ms']:>9.1f} {r['json_bytes'] / 1024:>8.0f}")


if __name__ == "__main__":
    main()
