"""How close a run's clock came to real vLLM on runs it was not fitted to, for its clock line.

kvsim's default clock is real vLLM's own steps (planner.vllm_tables) or the roofline
(planner.roofline). bench/vllm_compare.py replays every real-vLLM engine's held-out closed loops
(bench/results/vllm_h100/, _h200/: vLLM 0.23.0 serving dummy weights, ``vllm bench serve
--max-concurrency`` style) under each clock and writes its figures, per engine and clock, into
``tables/vllm/held_out.json`` (``python bench/vllm_compare.py --gpu H100 --clocks
default,roofline,carried-h200 --traces --held-out-json tables/vllm/held_out.json``, and ``--gpu
H200`` with ``carried-h100``), with the Azure trace excerpt's signed errors where it was served;
the same command with ``--stall-free`` in place of ``--traces`` adds, where they differ, the figures
over the requests that no first-use compile stall delayed (gpt-oss: a fresh engine compiles Triton
kernels inside the measured loops, which kvsim's default clock, a warmed server's, does not price),
and ``--compile-free`` adds the figures over the loops of engines that had compiled every kernel
before them (a keys warm-up, or an earlier engine's Triton disk cache: bench/vllm_compare.py's
COMPILE_FREE_KINDS), where the model has such engines.

A run whose clock is one of those measured (the same table, or the roofline, of the same model,
weights, KV dtype, TP and scheduling mode on the same GPU) says its figures at the end of its clock
line; a clock no run measured says so, with the range of the same kind of clock over the engines
that were. `--first-use-compiles` (a fresh engine's compiles priced) is a clock of its own, its
figures from ``vllm_compare --first-use-compiles --seeds 5``. A clock changed by the user (a
step-time scale, an eager launch, a table forced onto another setup) gets no figures: they are not
of that clock.

The figures are vllm bench serve's, as docs/ACCURACY.md gives them: the median over the loops of
|error| of the median TPOT, the mean of |error| of the mean TTFT and of the mean E2E; on the trace
excerpt the signed error of its mean TTFT, median TPOT and mean E2E.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

HELD_OUT_PATH = Path(__file__).resolve().parent.parent / "tables" / "vllm" / "held_out.json"
# the fields that name a clock (clock_key's), in the file's rows beside its figures (FIGURES)
KEY_FIELDS = ("clock", "table", "measured_on", "gpu", "model", "moe", "weights", "kv_dtype", "tp",
              "async_scheduling", "first_use_compiles")
FIGURES = ("tpot_pct", "ttft_pct", "e2e_pct", "e2e_signed_pct")


def clock_key(*, table: str | None, measured_on: str | None, gpu: str, model: str, moe: bool,
              weights: str | None, kv_dtype: str, tp: int, async_scheduling: bool,
              first_use_compiles: bool = False) -> dict:
    """What names a clock for its held-out figures: ``table`` (a shipped table's file name; None:
    the roofline), the GPU preset it was measured on (``measured_on``: another than ``gpu`` when
    it is carried), the run's GPU preset, model (and whether it has routed experts), weight method
    (planner.engine_setup's ``_weight_method``), KV dtype, TP, scheduling mode, and whether it
    prices a fresh engine's first-use compiles (``kvsim --first-use-compiles``)."""
    return {"clock": "table" if table is not None else "roofline", "table": table,
            "measured_on": measured_on if table is not None else None, "gpu": gpu, "model": model,
            "moe": bool(moe), "weights": weights, "kv_dtype": kv_dtype, "tp": int(tp),
            "async_scheduling": bool(async_scheduling), "first_use_compiles": bool(first_use_compiles)}


@functools.lru_cache(maxsize=4)
def held_out_rows(path: Path = HELD_OUT_PATH) -> tuple[dict, ...]:
    """The file's rows (read once); () where it is not there (installed without the tables)."""
    if not path.is_file():
        return ()
    return tuple(json.loads(path.read_text())["rows"])


def _carried(key: dict) -> bool:
    """Whether the clock is a table measured on another GPU than the run's."""
    return key["clock"] == "table" and key["measured_on"] != key["gpu"]


def _figures(row: dict) -> str:
    return f"TPOT {row['tpot_pct']:.1f} %, TTFT {row['ttft_pct']:.1f} %, E2E {row['e2e_pct']:.1f} %"


def _range(rows: list[dict], field: str) -> str:
    lo, hi = min(r[field] for r in rows), max(r[field] for r in rows)
    return f"{lo:.1f}-{hi:.1f} %" if hi > lo else f"{lo:.1f} %"


def held_out_figures(key: dict, rows: tuple[dict, ...] | None = None) -> dict | None:
    """The clock ``key``'s own held-out figures (FIGURES and the number of loops, the Azure
    excerpt's and the stall-free ones where there are, the runs and their GPU), None where no
    engine measured it: result.json's ``config.clock_held_out``."""
    rows = held_out_rows() if rows is None else rows
    own = next((r for r in rows if all(r[k] == key[k] for k in KEY_FIELDS)), None)
    return None if own is None else {k: v for k, v in own.items() if k not in KEY_FIELDS}


def held_out_note(key: dict, rows: tuple[dict, ...] | None = None) -> str | None:
    """The clock line's last part for the clock ``key`` (clock_key): its own held-out figures
    where an engine measured it; else that it was not measured, with the range over the engines of
    models of its kind (dense or MoE) that measured a clock of its kind (the roofline; a table
    carried to another GPU). None where nothing of its kind was measured (no file)."""
    rows = held_out_rows() if rows is None else rows
    r = held_out_figures(key, rows)
    if r is not None:
        loops = f"{r['points']} closed loop{'s' if r['points'] != 1 else ''}"
        trace = r.get("azure_conv")
        trace = (f"; on the Azure conversation trace's first 40 s at its arrival times mean TTFT "
                 f"{trace['ttft_pct']:+.1f} %, median TPOT {trace['tpot_pct']:+.1f} %, mean E2E "
                 f"{trace['e2e_pct']:+.1f} %") if trace else ""
        calm = r.get("stall_free")
        calm = (f"; over the requests no first-use compile delayed (a fresh engine compiles kernels inside "
                f"these loops): {_figures(calm)}") if calm else ""
        warm = r.get("compile_free")
        warm = (f"; on engines that had compiled every kernel before the loops, a warmed server as this clock "
                f"assumes ({warm['points']} loops): {_figures(warm)}") if warm else ""
        fresh = (", served by a freshly started engine (each loop replayed from the kernels it had compiled)"
                 if key["first_use_compiles"] else "")
        return (f"held out against real vLLM 0.23.0 on {loops} of {key['model']} on the {r['vllm_gpu']}{fresh}: "
                f"{_figures(r)} (median |error| of the median TPOT, mean |error| of the mean TTFT and E2E)"
                f"{calm}{warm}{trace} (docs/ACCURACY.md)")
    carried = _carried(key)
    kind = [r for r in rows if r["clock"] == key["clock"] and _carried(r) == carried and r["moe"] == key["moe"]
            and r["first_use_compiles"] == key["first_use_compiles"]]
    if not kind:
        return None
    what = "this table carried to this GPU" if carried else "this clock"
    models = "MoE" if key["moe"] else "dense"
    return (f"{what} not measured against real vLLM for this setup; over the {len(kind)} {models} real-vLLM "
            f"engines {'whose table was carried between the H100 and the H200' if carried else 'measured with it'}: "
            f"TPOT {_range(kind, 'tpot_pct')}, TTFT {_range(kind, 'ttft_pct')}, E2E {_range(kind, 'e2e_pct')} "
            f"(docs/ACCURACY.md)")
