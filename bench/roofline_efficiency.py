"""The roofline's measured shares: FLOP/s from real vLLM's prefill steps, bandwidth from its decode steps.

    python bench/roofline_efficiency.py

Every shipped table of real vLLM 0.23.0's grid steps (tables/vllm/ENGINE_H100.csv and
ENGINE_H200.csv, bench/vllm_gpu/grid_table.py; the engines' closed-loop and trace runs are not in
them) has mixed rows: steps with prompt tokens, run eagerly, most of them compute-bound. Priced by
the roofline as kvsim's default runs it (the decode shares below) with a FLOP/s share e and a time
m a layer that a step with prompt tokens pays beyond a decode step (its attention runs outside the
CUDA graph: vLLM's piecewise graphs), a row costs ``max(bytes / bandwidth, flops / (peak * e)) +
overhead + layers * m``. For each weight class (planner.roofline.weight_class: bf16, fp8, bf16-moe,
mxfp4-moe) e is the share on a 0.01 grid and m >= 0 (to the microsecond; least squares at each e)
the pair that minimizes the mean squared relative error of the class's rows, every table weighing
the same (rows that started an idle engine left out: their time is CPU work, not FLOPs). It prints
the fit beside planner.roofline.MEASURED_FLOPS_EFFICIENCY and MEASURED_MIXED_LAYER_S, and for
every engine the rows' median |error| at the datasheet peak without m, at its class's fit, and at
the fit without that engine (where its class has another engine), which is the figure that says
how the fit carries to a model that was not measured; the same for the rows of short prompts
(memory-bound), where m shows.

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
from kvsim.planner.roofline import (MEASURED_DECODE, MEASURED_FLOPS_EFFICIENCY,  # noqa: E402
                                    MEASURED_MIXED_LAYER_S, DecodeShares, RooflineCost, measured_decode,
                                    weight_class)
from kvsim.planner.weights import serve_weights_as  # noqa: E402
from kvsim.simulator.cost import StepBatch  # noqa: E402

TABLES = ROOT / "tables" / "vllm"
GPUS = ("H100", "H200")
SHARES = np.round(np.arange(0.30, 1.0001, 0.01), 2)


def engine_rows(engine: str, gpu: str) -> tuple[str, np.ndarray] | None:
    """(weight class, rows of [memory s, compute s at the peak, overhead s, measured s, layers]) of
    an engine's table on a GPU, its mixed rows that did not start an idle engine; None without one."""
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
                         float(row["step_s"]), model.num_layers))
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


def _load(rows_of) -> dict[tuple[str, str], tuple[str, np.ndarray]]:
    """(engine, GPU) -> ``rows_of(engine, GPU)`` (weight class, rows) for every shipped grid table
    that has such rows."""
    found = {}
    for engine in ENGINES:
        for gpu in GPUS:
            got = rows_of(engine, gpu)
            if got is not None and len(got[1]):
                found[(engine, gpu)] = got
    return found


def load_decode() -> dict[tuple[str, str], tuple[str, np.ndarray]]:
    """(engine, GPU) -> (weight class, decode rows) for every shipped grid table."""
    return _load(decode_rows)


def fitted_decode(tables: dict) -> dict[str, DecodeShares]:
    """Each GPU's decode shares (its preset's name -> DecodeShares), fitted to its dense tables."""
    return {get_gpu(gpu).name: fit_decode([rows for (_, g), (cls, rows) in tables.items() if g == gpu and cls in DENSE])
            for gpu in GPUS}


def priced(rows: np.ndarray, share: float, mixed_layer_s: float = 0.0) -> np.ndarray:
    return np.maximum(rows[:, 0], rows[:, 1] / share) + rows[:, 2] + rows[:, 4] * mixed_layer_s


def rel_errors(rows: np.ndarray, share: float, mixed_layer_s: float = 0.0) -> np.ndarray:
    return priced(rows, share, mixed_layer_s) / rows[:, 3] - 1.0


def _layer_s_at(tables: list[np.ndarray], share: float) -> float:
    """The time a layer (>= 0, to the microsecond) that minimizes the tables' mean squared relative
    errors at ``share``, each table weighing the same: a least squares in one unknown."""
    num = den = 0.0
    for t in tables:
        x, r = t[:, 4] / t[:, 3], 1.0 - priced(t, share) / t[:, 3]
        num, den = num + float(np.mean(x * r)), den + float(np.mean(x * x))
    return round(max(0.0, num / den) * 1e6) / 1e6


def fit_share(tables: list[np.ndarray]) -> tuple[float, float]:
    """(share on SHARES, time a layer) minimizing the tables' mean squared relative errors, each
    table weighing the same (the smallest such share on a tie)."""
    pairs = [(float(e), _layer_s_at(tables, e)) for e in SHARES]
    loss = [sum(float(np.mean(rel_errors(t, e, m) ** 2)) for t in tables) for e, m in pairs]
    return pairs[int(np.argmin(loss))]


def load_all() -> dict[tuple[str, str], tuple[str, np.ndarray]]:
    """(engine, GPU) -> (weight class, mixed rows) for every shipped grid table."""
    return _load(engine_rows)


def fitted_shares(tables: dict) -> dict[str, tuple[float, float]]:
    """Each weight class's (share, time a layer of a step with prompt tokens), fitted to all of its
    tables."""
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
    print("weight class   fitted share, time a layer   shipped (MEASURED_FLOPS_EFFICIENCY, MEASURED_MIXED_LAYER_S)   tables")
    for cls, (share, layer_s) in shares.items():
        n = sum(1 for c, _ in tables.values() if c == cls)
        print(f"  {cls:<12} {share:12.2f}, {layer_s * 1e6:4.0f} us   {MEASURED_FLOPS_EFFICIENCY.get(cls, float('nan')):8.2f}, "
              f"{MEASURED_MIXED_LAYER_S.get(cls, float('nan')) * 1e6:4.0f} us{'':>34}{n}")
    print("\nmixed rows' median |error| (signed), all / short prompts (memory-bound): at the datasheet peak "
          "without the time a layer, at the class's fit, and at the fit without the engine")
    for (engine, gpu), (cls, rows) in tables.items():
        others = [r for (e, _), (c, r) in tables.items() if c == cls and e != engine]
        short = rows[:, 0] > rows[:, 1] / shares[cls][0]
        cells = []
        for fit in ((1.0, 0.0), shares[cls], fit_share(others) if others else None):
            if fit is None:
                cells.append(f"{'(no other engine)':>34}")
                continue
            err = rel_errors(rows, *fit)
            part = f" / {100 * np.median(np.abs(err[short])):5.1f} %" if short.any() else " /     -  "
            cells.append(f"{fit[0]:4.2f}, {fit[1] * 1e6:3.0f} us: {100 * np.median(np.abs(err)):5.1f} %{part}")
        print(f"  {engine:<14} {gpu}  {cls:<10} {len(rows):4d} rows ({int(short.sum()):3d} short)  " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
