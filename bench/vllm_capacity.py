"""kvsim's KV-cache sizing against real vLLM's own: every engine served on the GPU (bench/results/).

    python bench/vllm_capacity.py [--gpu H100|H200] [--csv out.csv]

For each engine real vLLM 0.23.0 served (bench/vllm_gpu/, its start-up log in meta.json), kvsim
sizes the same setup (the model's config.json, weight and KV dtype, gpu_memory_utilization,
max_model_len, max_num_seqs, max_num_batched_tokens as vLLM resolved them) with
planner.capacity.compute_capacity, as ``kvsim capacity`` does, and the two are set side by side:
the weights as loaded, what else the profile keeps off the KV cache (vLLM: the budget less
weights and KV cache memory, its CUDA-graph estimate included where it made one; kvsim: the
activation estimate and the non-PyTorch allowance), the KV cache memory and num_gpu_blocks.
Nothing is fitted here. Prints a Markdown table (docs/PLANNER.md).
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from vllm_compare import CONFIGS, ENGINES, GPUS  # noqa: E402

GIB = 2**30
COLUMNS = ("engine", "gpu", "weights_gib_kvsim", "weights_gib_vllm", "other_gib_kvsim", "other_gib_vllm",
           "cudagraph_estimate_gib_vllm", "kv_gib_kvsim", "kv_gib_vllm", "num_gpu_blocks_kvsim",
           "num_gpu_blocks_vllm", "num_gpu_blocks_err")


def cudagraph_estimate_gib(folder: Path) -> float | None:
    """vLLM's 'Estimated CUDA graph memory' (kept off the KV cache since vLLM 0.21), None where its
    log has no such line (no estimate made)."""
    log = folder / "vllm.log.gz"
    if not log.is_file():
        return None
    with gzip.open(log, "rt", errors="replace") as f:
        m = re.search(r"Estimated CUDA graph memory: ([\d.]+) GiB", f.read())
    return float(m.group(1)) if m else None


def row(engine: str, gpu: str) -> dict | None:
    """One engine's figures, both sides; None where the run logged no start-up figures."""
    from kvsim.planner.capacity import compute_capacity
    from kvsim.planner.engine_setup import build_engine
    from kvsim.planner.presets import load_hf_config

    folder = GPUS[gpu][0] / engine
    meta = json.loads((folder / "meta.json").read_text())
    start, core, args = meta.get("startup", {}), meta.get("engine_core", {}), meta["engine_args"]
    if not start.get("available_kv_cache_gib") or not core.get("num_gpu_blocks"):
        return None
    config, weight_dtype, kv_dtype = ENGINES[engine]
    util = args.get("gpu_memory_utilization", 0.9)
    # the model as build_engine serves it (its weights at weight_dtype), sized as `kvsim capacity` does
    setup = build_engine(model=load_hf_config(str(CONFIGS / config / "config.json"), name=config),
                         gpu=GPUS[gpu][1], weight_dtype=weight_dtype, kv_cache_dtype=kv_dtype,
                         gpu_memory_utilization=util, max_model_len=args["max_model_len"],
                         max_num_seqs=core["max_num_seqs"], max_num_batched_tokens=core["max_num_batched_tokens"],
                         cost_table="roofline")
    r = compute_capacity(setup.model, setup.gpu, kv_dtype=kv_dtype, gpu_memory_utilization=util,
                         max_model_len=args["max_model_len"], max_num_seqs=core["max_num_seqs"],
                         max_num_batched_tokens=core["max_num_batched_tokens"], block_size=core.get("block_size"))
    budget = r.budget_bytes / GIB
    graph = cudagraph_estimate_gib(folder)
    return {"engine": engine, "gpu": gpu,
            "weights_gib_kvsim": r.weight_bytes / GIB, "weights_gib_vllm": start["model_loading_gib"],
            "other_gib_kvsim": (r.activation_bytes + r.non_torch_bytes) / GIB,
            "other_gib_vllm": budget - start["model_loading_gib"] - start["available_kv_cache_gib"],
            "cudagraph_estimate_gib_vllm": graph,
            "kv_gib_kvsim": r.available_kv_bytes / GIB, "kv_gib_vllm": start["available_kv_cache_gib"],
            "num_gpu_blocks_kvsim": r.num_gpu_blocks, "num_gpu_blocks_vllm": core["num_gpu_blocks"],
            "num_gpu_blocks_err": r.num_gpu_blocks / core["num_gpu_blocks"] - 1}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", choices=sorted(GPUS), action="append", help="whose runs (default both)")
    ap.add_argument("--csv", type=Path, help="write the rows here")
    a = ap.parse_args(argv)
    rows = [r for gpu in (a.gpu or sorted(GPUS)) for engine in ENGINES
            if (GPUS[gpu][0] / engine / "meta.json").is_file() and (r := row(engine, gpu)) is not None]
    print("| engine | GPU | weights GiB kvsim / vLLM | other non-KV GiB kvsim / vLLM (its CUDA-graph estimate) "
          "| KV cache GiB kvsim / vLLM | num_gpu_blocks kvsim / vLLM | error |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        graph = "" if r["cudagraph_estimate_gib_vllm"] is None else f" ({r['cudagraph_estimate_gib_vllm']:.2f})"
        print(f"| {r['engine']} | {r['gpu']} | {r['weights_gib_kvsim']:.2f} / {r['weights_gib_vllm']:.2f} | "
              f"{r['other_gib_kvsim']:.2f} / {r['other_gib_vllm']:.2f}{graph} | {r['kv_gib_kvsim']:.2f} / "
              f"{r['kv_gib_vllm']:.2f} | {r['num_gpu_blocks_kvsim']:,} / {r['num_gpu_blocks_vllm']:,} | "
              f"{100 * r['num_gpu_blocks_err']:+.1f} % |")
    if a.csv:
        import csv

        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
