"""Real vLLM's measured step tables shipped in ``tables/vllm/``, and the one for a setup.

``--cost-table vllm`` (``EngineSettings.cost_table = VLLM``) asks for the clock of real vLLM's own
steps measured for the run's model, GPU, weight format and KV dtype (bench/vllm_gpu/: vLLM 0.23.0
serving dummy weights, one GPU, async scheduling on; each table's ``#`` lines say what it
measured). Of the tables that fit, the one with the most measured steps is taken (a ``fine`` grid
over a coarse one). None fits: one line naming the setup and what was measured. How close each
table comes to real vLLM on runs it was not fitted to: docs/ACCURACY.md.
"""
from __future__ import annotations

import re
from pathlib import Path

from kvsim.errors import InputError

TABLES_DIR = Path(__file__).resolve().parent.parent / "tables" / "vllm"
VLLM = "vllm"      # the --cost-table value that picks a table here


def measured_tables() -> list[tuple[Path, dict[str, str], int]]:
    """Every shipped table: (path, its provenance, its number of measured rows), by name."""
    from kvsim.simulator.cost_table import read_table   # numpy: not for `--help`

    out = []
    for path in sorted(TABLES_DIR.glob("*.csv")):
        provenance, _, rows = read_table(path)
        out.append((path, provenance, len(rows)))
    return out


def _measured_setup(provenance: dict[str, str]) -> str:
    dtype = re.search(r"dtype (\w+)", provenance.get("executor", ""))
    return f"{provenance.get('model', '?')} {dtype.group(1) if dtype else '?'} on {provenance.get('gpu', '?')}"


def vllm_table_for(*, model: str, gpu: str, tp: int, kv_dtype: str, weights: str | None,
                   async_scheduling: bool) -> Path:
    """The shipped table of real vLLM's steps for this setup (module doc).

    Raises:
        InputError: no table fits; the message names the setup and every measured one.
    """
    from kvsim.simulator.cost_table import provenance_mismatches

    fits = []
    tables = measured_tables()
    for path, provenance, num_rows in tables:
        wrong = provenance_mismatches(provenance, model=model, gpu=gpu, tp=tp, kv_dtype=kv_dtype,
                                      weights=weights)
        measured = re.search(r"dtype (\w+)", provenance.get("executor", ""))
        if kv_dtype != "fp8" and measured and "fp8" in measured.group(1):
            wrong.append("KV dtype")            # vLLM's fp8 runs cached KV in fp8 as well
        if not async_scheduling and "async scheduling True" in provenance.get("executor", ""):
            wrong.append("async scheduling")    # its steps hide the CPU work that sync shows
        if not wrong:
            fits.append((num_rows, path))
    if fits:
        return max(fits, key=lambda f: (f[0], f[1].name))[1]
    what = "fp8" if weights == "fp8" else "unquantized" if weights == "dtype" else weights or "?"
    measured_ones = "; ".join(sorted({_measured_setup(p) for _, p, _ in tables}))
    raise InputError(f"no table of real vLLM's steps for {model} ({what} weights, KV {kv_dtype}, TP {tp}"
                     f"{', async scheduling off' if not async_scheduling else ''}) on {gpu}; measured: "
                     f"{measured_ones} (one GPU, async scheduling on; docs/ACCURACY.md)", field="cost_table")
