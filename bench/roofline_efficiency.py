"""The roofline's measured shares: FLOP/s from real vLLM's prefill steps, bandwidth from its decode steps.

    python bench/roofline_efficiency.py

Every shipped table of real vLLM 0.23.0's grid steps (tables/vllm/ENGINE_H100.csv and
ENGINE_H200.csv, bench/vllm_gpu/grid_table.py; the engines' closed-loop and trace runs are not in
them) has mixed rows: steps with prompt tokens, run eagerly, most of them compute-bound. Priced by
the roofline as kvsim's default runs it (the datasheet's bandwidth, DEFAULT_STEP_OVERHEAD_S) with a
FLOP/s share e, a row costs ``max(bytes / bandwidth, flops / (peak * e)) + overhead``. For each
weight class (planner.roofline.weight_class: bf16, fp8, bf16-moe, mxfp4-moe) e is the share on a
0.01 grid that minimizes the mean squared relative error of the class's rows, every table weighing
the same (rows that started an idle engine left out: their time is CPU work, not FLOPs). It prints
the fit beside planner.roofline.MEASURED_FLOPS_EFFICIENCY, and for every engine the rows' median
|error| at the datasheet peak, at its class's share, and at the share fitted without that engine
(where its class has another engine), which is the figure that says how the share carries to a
model that was not measured.

The decode side (planner.roofline.MEASURED_DECODE), fitted first, per GPU: the decode rows of the
dense engines' tables (CUDA-graph steps; the MoE engines' routing under dummy weights is not a
real router's), as ``weights / (bandwidth x w) + KV / (bandwidth x k) + layers x layer_s`` (an
untied input embedding not streamed), w, k and layer_s the least squares of the relative error,
every table weighing the same; printed with each engine's median |error| at the datasheet with
kvsim's old 2 ms a step, at the fit, and at the fit without that engine. The mixed rows above are
priced with those decode shares (the weights' and KV's bandwidth, the per-layer time).
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.vllm_compare import CONFIGS, ENGINES  # noqa: E402
from kvsim.planner.presets import get_gpu, load_hf_config  # noqa: E402
from kvsim.planner.roofline import (MEASURED_DECODE, MEASURED_FLOPS_EFFICIENCY, DecodeShares,  # noqa: E402
                                    RooflineCost, measured_decode, weight_class)
from kvsim.planner.weights import serve_weights_as  # noqa: E402
from kvsim.simulator.cost import StepBatch  # noqa: E402

TABLES = ROOT / "tables" / "vllm"
GPUS = ("H100", "H200")
SHARES = np.round(np.arange(0.30, 1.0001, 0.01), 2)


def engine_rows(engine: str, gpu: str) -> tuple[str, np.ndarray] | None:
    """(weight class, rows of [memory s, compute s at the peak, overhead s, measured s]) of an
    engine's table on a GPU, its mixed rows that did not start an idle engine; None without one."""
    path = TABLES / f"{engine}_{gpu}.csv"
    if not path.exists():
        return None
    config, weight_dtype, kv_dtype = ENGINES[engine]
    model = serve_weights_as(load_hf_config(str(CONFIGS / config / "config.json"), name=config), weight_dtype)
    roof = RooflineCost(model, get_gpu(gpu), kv_dtype=kv_dtype, decode=measured_decode(get_gpu(gpu)))
    rows = []
    with path.open() as f:
        for row in csv.DictReader(line for line in f if not line.startswith("#")):
            if row["kind"] != "mixed" or row.get("idle_before") == "1":
                continue
            batch = StepBatch(*(int(row[k]) for k in ("num_seqs", "num_prefill_tokens", "num_decode_tokens",
                                                      "num_scheduled_tokens", "kv_read_tokens", "attn_token_pairs")))
            mem_s, _, comp_s, _ = roof._lines(batch)
            rows.append((mem_s, comp_s, roof.step_overhead_s + roof.allreduce_s(batch.num_scheduled_tokens),
                         float(row["step_s"])))
    return weight_class(model), np.array(rows)


DENSE = ("bf16", "fp8")


def decode_rows(engine: str, gpu: str) -> tuple[str, np.ndarray] | None:
    """(weight class, rows of [weights s, KV s at the datasheet bandwidth, layers, measured s, old
    roofline s]) of an engine's decode rows on a GPU that did not start an idle engine; None
    without a table."""
    path = TABLES / f"{engine}_{gpu}.csv"
    if not path.exists():
        return None
    config, weight_dtype, kv_dtype = ENGINES[engine]
    model = serve_weights_as(load_hf_config(str(CONFIGS / config / "config.json"), name=config), weight_dtype)
    spec = get_gpu(gpu)
    unit = RooflineCost(model, spec, kv_dtype=kv_dtype, decode=DecodeShares(1.0, 1.0, 0.0, ""))
    old = RooflineCost(model, spec, kv_dtype=kv_dtype)
    bandwidth = spec.memory_bandwidth_bytes_per_s
    rows = []
    with path.open() as f:
        for row in csv.DictReader(line for line in f if not line.startswith("#")):
            if row["kind"] != "decode" or row.get("idle_before") == "1":
                continue
            batch = StepBatch(*(int(row[k]) for k in ("num_seqs", "num_prefill_tokens", "num_decode_tokens",
                                                      "num_scheduled_tokens", "kv_read_tokens", "attn_token_pairs")))
            n = batch.num_scheduled_tokens
            rows.append(((unit.weights_read_bytes(n) - unit.embedding_bytes) / bandwidth,
                         (batch.kv_read_tokens + n) * unit.kv_bytes_per_token / bandwidth,
                         model.num_layers, float(row["step_s"]), old.step_time_s(batch)))
    return weight_class(model), np.array(rows)


def decode_priced(rows: np.ndarray, shares: DecodeShares) -> np.ndarray:
    return rows[:, 0] / shares.weights + rows[:, 1] / shares.kv + rows[:, 2] * shares.layer_s


def fit_decode(tables: list[np.ndarray]) -> DecodeShares:
    """The decode shares (2 decimals; the per-layer time to the microsecond) minimizing the mean
    squared relative error, each table weighing the same: a linear least squares in 1 / w, 1 / k
    and layer_s."""
    a, y = [], []
    for rows in tables:
        weight = 1.0 / np.sqrt(len(rows))
        a.append(np.c_[rows[:, 0], rows[:, 1], rows[:, 2]] / rows[:, 3:4] * weight)
        y.append(np.full(len(rows), weight))
    inv_w, inv_k, layer_s = np.linalg.lstsq(np.vstack(a), np.concatenate(y), rcond=None)[0]
    return DecodeShares(round(1.0 / inv_w, 2), round(1.0 / inv_k, 2), round(layer_s * 1e6) / 1e6, "")


def load_decode() -> dict[tuple[str, str], tuple[str, np.ndarray]]:
    """(engine, GPU) -> (weight class, decode rows) for every shipped grid table."""
    found = {}
    for engine in ENGINES:
        for gpu in GPUS:
            got = decode_rows(engine, gpu)
            if got is not None and len(got[1]):
                found[(engine, gpu)] = got
    return found


def fitted_decode(tables: dict) -> dict[str, DecodeShares]:
    """Each GPU's decode shares (its preset's name -> DecodeShares), fitted to its dense tables."""
    return {get_gpu(gpu).name: fit_decode([rows for (_, g), (cls, rows) in tables.items() if g == gpu and cls in DENSE])
            for gpu in GPUS}


def priced(rows: np.ndarray, share: float) -> np.ndarray:
    return np.maximum(rows[:, 0], rows[:, 1] / share) + rows[:, 2]


def rel_errors(rows: np.ndarray, share: float) -> np.ndarray:
    return priced(rows, share) / rows[:, 3] - 1.0


def fit_share(tables: list[np.ndarray]) -> float:
    """The share on SHARES that minimizes the tables' mean squared relative errors, each table
    weighing the same (the smallest such share on a tie)."""
    loss = [sum(float(np.mean(rel_errors(t, e) ** 2)) for t in tables) for e in SHARES]
    return float(SHARES[int(np.argmin(loss))])


def load_all() -> dict[tuple[str, str], tuple[str, np.ndarray]]:
    """(engine, GPU) -> (weight class, rows) for every shipped grid table."""
    found = {}
    for engine in ENGINES:
        for gpu in GPUS:
            got = engine_rows(engine, gpu)
            if got is not None and len(got[1]):
                found[(engine, gpu)] = got
    return found


def fitted_shares(tables: dict) -> dict[str, float]:
    """Each weight class's share, fitted to all of its tables."""
    classes = sorted({cls for cls, _ in tables.values()})
    return {cls: fit_share([rows for c, rows in tables.values() if c == cls]) for cls in classes}


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    decode = load_decode()
    fitted = fitted_decode(decode)
    print("GPU             fitted decode shares: weights, KV, per layer   shipped (planner.roofline.MEASURED_DECODE)")
    for name, got in fitted.items():
        ship = MEASURED_DECODE.get(name)
        print(f"  {name:<14} {got.weights:.2f}, {got.kv:.2f}, {got.layer_s * 1e6:.0f} us"
              f"{'':>24}{ship.weights:.2f}, {ship.kv:.2f}, {ship.layer_s * 1e6:.0f} us")
    print("\ndecode rows' median |error| (signed): the old roofline (datasheet, 2 ms a step), at the GPU's fit, "
          "and at the fit without the engine (dense engines; MoE ones are not in the fit)")
    for (engine, gpu), (cls, rows) in decode.items():
        dense = [r for (e, g), (c, r) in decode.items() if g == gpu and c in DENSE and e != engine]
        cells = [rows[:, 4] / rows[:, 3] - 1, decode_priced(rows, fitted[get_gpu(gpu).name]) / rows[:, 3] - 1,
                 decode_priced(rows, fit_decode(dense)) / rows[:, 3] - 1]
        print(f"  {engine:<14} {gpu}  {cls:<10} {len(rows):4d} rows  " + "   ".join(
            f"{100 * np.median(np.abs(err)):5.1f} % ({100 * np.median(err):+6.1f})" for err in cells))
    print()
    tables = load_all()
    shares = fitted_shares(tables)
    print("weight class   fitted share   shipped (planner.roofline.MEASURED_FLOPS_EFFICIENCY)   tables")
    for cls, share in shares.items():
        n = sum(1 for c, _ in tables.values() if c == cls)
        print(f"  {cls:<12} {share:12.2f}   {MEASURED_FLOPS_EFFICIENCY.get(cls, float('nan')):8.2f}"
              f"{'':>44}{n}")
    print("\nmixed rows' median |error| (signed): at the datasheet peak, at the class's share, and at the share "
          "fitted without the engine")
    for (engine, gpu), (cls, rows) in tables.items():
        others = [r for (e, _), (c, r) in tables.items() if c == cls and e != engine]
        cells = []
        for share in (1.0, shares[cls], fit_share(others) if others else None):
            if share is None:
                cells.append(f"{'(no other engine)':>24}")
                continue
            err = rel_errors(rows, share)
            cells.append(f"{share:4.2f}: {100 * np.median(np.abs(err)):5.1f} % ({100 * np.median(err):+6.1f})")
        print(f"  {engine:<14} {gpu}  {cls:<10} {len(rows):4d} rows  " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
