"""Real vLLM's measured step tables shipped in ``tables/vllm/``, and the one for a setup.

kvsim's default clock is such a table wherever one fits the run (``fitting_table``); where one
fits all but the GPU, that table carried to the run's GPU by the two GPUs' rooflines
(simulator.cost.CarriedCost; the clock line says it is extrapolated); else the roofline
(``--cost-table roofline`` keeps it in either case). ``--cost-table vllm`` (``EngineSettings.cost_table
= VLLM``) insists on one: the clock of real vLLM's own
steps measured for the run's model, GPU, weight format and KV dtype (bench/vllm_gpu/: vLLM 0.23.0
serving dummy weights, one GPU, async scheduling on; each table's ``#`` lines say what it
measured). Of the tables that fit, the one with the most measured steps is taken (a ``fine`` grid
over a coarse one). None fits: one line naming the setup and what was measured. How close each
table comes to real vLLM on runs it was not fitted to: docs/ACCURACY.md.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from kvsim.errors import InputError

if TYPE_CHECKING:
    from kvsim.planner.specs import GpuSpec

TABLES_DIR = Path(__file__).resolve().parent.parent / "tables" / "vllm"
VLLM = "vllm"      # the --cost-table value that picks a table here
ROOFLINE = "roofline"   # the --cost-table value that keeps the roofline where a table would fit


@functools.lru_cache(maxsize=1)
def measured_tables() -> tuple[tuple[Path, dict[str, str], int], ...]:
    """Every shipped table: (path, its provenance, its number of measured rows), by name (read
    once: a sweep builds many engines)."""
    from kvsim.simulator.cost_table import read_table   # numpy: not for `--help`

    out = []
    for path in sorted(TABLES_DIR.glob("*.csv")):
        provenance, _, rows = read_table(path)
        out.append((path, provenance, len(rows)))
    return tuple(out)


def shipped_header(name: str) -> dict[str, str] | None:
    """The ``#`` header of the shipped table ``name`` (its file name), read once with the rest
    (measured_tables: no fit); None where it is not there (installed without the tables)."""
    path = (TABLES_DIR / name).resolve()
    return next((provenance for t, provenance, _ in measured_tables() if t.resolve() == path), None)


def shipped_cost(path):
    """The cost model of a table (simulator.cost_table.load_cost_table); a shipped one is read and
    fitted once per process (the default clock of a sweep's every point)."""
    from kvsim.simulator.cost_table import load_cost_table

    resolved = Path(path).resolve()
    return _shipped(resolved) if resolved.parent == TABLES_DIR else load_cost_table(path)


@functools.lru_cache(maxsize=None)
def _shipped(path: Path):
    from kvsim.simulator.cost_table import load_cost_table

    return load_cost_table(path)


def table_gpu(path) -> GpuSpec | None:
    """The GPU preset a shipped table was measured on: the one whose family (its name before the
    first '-') is a word of the table's ``# gpu`` line (H100-80GB-SXM for "NVIDIA H100 80GB HBM3");
    None when no preset is (the table cannot be carried)."""
    import re

    from kvsim.planner.presets import GPU_PRESETS

    resolved = Path(path).resolve()
    provenance = next(p for t, p, _ in measured_tables() if t == resolved)
    words = re.split(r"[\s\-_/]+", provenance.get("gpu", "").lower())
    return next((g for g in GPU_PRESETS.values() if g.name.split("-")[0].lower() in words), None)


def fitting_table(*, model: str, gpu: str | None, tp: int, kv_dtype: str, weights: str | None,
                  async_scheduling: bool) -> Path | None:
    """The shipped table of real vLLM's steps for this setup (module doc), or None. ``gpu``
    None: measured on any GPU (the default clock carries it to the run's)."""
    from kvsim.simulator.cost_table import provenance_mismatches

    fits = [(num_rows, path) for path, provenance, num_rows in measured_tables()
            if not provenance_mismatches(provenance, model=model, gpu=gpu, tp=tp, kv_dtype=kv_dtype,
                                         weights=weights, async_scheduling=async_scheduling)]
    return max(fits, key=lambda f: (f[0], f[1].name))[1] if fits else None


def vllm_table_for(*, model: str, gpu: str, tp: int, kv_dtype: str, weights: str | None,
                   async_scheduling: bool) -> Path:
    """The shipped table of real vLLM's steps for this setup (module doc).

    Raises:
        InputError: no table fits; the message names the setup and every measured one.
    """
    from kvsim.simulator.cost_table import measured_dtype

    found = fitting_table(model=model, gpu=gpu, tp=tp, kv_dtype=kv_dtype, weights=weights,
                          async_scheduling=async_scheduling)
    if found is not None:
        return found
    tables = measured_tables()
    what = "fp8" if weights == "fp8" else "unquantized" if weights == "dtype" else weights or "?"
    measured_ones = "; ".join(sorted({f"{p.get('model', '?')} {measured_dtype(p) or '?'} on {p.get('gpu', '?')}"
                                      for _, p, _ in tables}))
    raise InputError(f"no table of real vLLM's steps for {model} ({what} weights, KV {kv_dtype}, TP {tp}"
                     f"{', async scheduling off' if not async_scheduling else ''}) on {gpu}; measured: "
                     f"{measured_ones} (one GPU, async scheduling on; docs/ACCURACY.md)", field="cost_table")
