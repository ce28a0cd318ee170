"""The capacity planner page: vLLM's KV capacity for a model on a GPU, a one-parameter capacity
sweep, a simulated what-if (planner.sweep) over the sidebar's workload, and the workload's
hit rate for every cache size with the GPU pool marked (planner.cache_plan)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.planner.presets import hf_config_source
from kvsim.dashboard.sources import (MAX_UPLOAD_MB, UPLOADS, Workload, load_requests, needs_rate,
                                     workload_source)
from kvsim.errors import InputError
from kvsim.planner.cache_plan import CurveReport, curve_report
from kvsim.planner.capacity import compute_capacity
from kvsim.planner.engine_setup import build_engine
from kvsim.planner.presets import get_gpu, get_model, load_hf_config
from kvsim.planner.specs import ModelSpec
from kvsim.planner.sweep import PlanBase, expand_grid, run_sweep

SWEEPS = {  # parameter -> (label, values)
    "tp": ("tensor parallel size", (1, 2, 4, 8)),
    "gpu_memory_utilization": ("gpu_memory_utilization", (0.5, 0.6, 0.7, 0.8, 0.9, 0.92, 0.95)),
    "block_size": ("block size (tokens)", (8, 16, 32, 64, 128)),
    "kv_dtype": ("KV dtype", ("auto", "fp8")),
    "max_model_len": ("max_model_len (tokens)", (2048, 4096, 8192, 16384, 32768, 65536, 131072)),
}
SWEEP_COLUMNS = {"num_gpu_blocks": "KV blocks per GPU", "kv_cache_tokens": "KV tokens per GPU",
                 "max_concurrency": "max_model_len requests at once"}

# simulated what-if: parameter -> (label, values); every point replays the workload on the GPU's
# real pool (vLLM's num_gpu_blocks) with the planner's roofline step cost
SIM_SWEEPS = {
    "rate": ("arrival rate (requests/s)", (1.0, 2.0, 4.0, 8.0, 16.0)),
    "rate_scale": ("traffic (x the workload's own rate)", (0.5, 1.0, 2.0, 4.0)),
    "gpu_memory_utilization": ("gpu_memory_utilization", (0.5, 0.7, 0.92)),
    "block_size": ("block size (tokens)", (8, 16, 32, 64)),
    "max_num_seqs": ("max_num_seqs", (8, 32, 128, 256)),
}
SIM_SWEEP_METRICS = {"request_throughput_per_s": "requests / s", "ttft_s.p99": "TTFT p99 (s)",
                     "num_preemptions": "preemptions", "mean_running": "mean running"}


def resolve_model(model: str) -> ModelSpec:
    """A preset name, or the path of a Hugging Face config.json (an upload, store_hf_config),
    named as the CLI names it (its _name_or_path or architectures)."""
    if os.path.isfile(model):
        config, name = hf_config_source(model)
        return load_hf_config(config, name=name)
    return get_model(model)


def store_hf_config(name: str, data: bytes, store: Path = UPLOADS) -> str:
    """Keep an uploaded config.json on disk under its digest; the path the planner reads.

    Raises:
        InputError naming the file: over MAX_UPLOAD_MB, empty, or not a model config (the
        parser's one-line message, with the user's file name).
    """
    if len(data) > MAX_UPLOAD_MB * 2**20:
        raise InputError(f"{len(data) / 2**20:.1f} MB is over the {MAX_UPLOAD_MB} MB upload limit",
                         file=name)
    if not data.strip():
        raise InputError("the file is empty", file=name)
    path = store / ("hf-" + hashlib.sha256(data).hexdigest()[:16]) / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_bytes(data)
    try:
        resolve_model(str(path))
    except InputError as err:
        raise InputError(str(err).replace(str(path), name)) from None
    return str(path)


def capacity(model_name: str, gpu_name: str, **kwargs) -> dict:
    """planner's CapacityReport as a dict; raises ValueError for impossible configurations."""
    return compute_capacity(resolve_model(model_name), get_gpu(gpu_name), **kwargs).to_dict()


def capacity_sweep(model_name: str, gpu_name: str, param: str, base: tuple) -> pd.DataFrame:
    """Capacity over the values of one parameter, others fixed (``base``: sorted kwargs items).

    Returns:
        one row per value: the value, num_gpu_blocks, kv_cache_tokens, max_concurrency (NaN
        where the configuration is impossible) and the error message there (None elsewhere),
        the table viz.plan_figures.sweep_metric_figure draws.
    """
    rows = []
    for value in SWEEPS[param][1]:
        kwargs = dict(base)
        kwargs[param] = value
        try:
            rep = capacity(model_name, gpu_name, **kwargs)
            rows.append({param: value, **{c: rep[c] for c in SWEEP_COLUMNS}, "error": None})
        except InputError as err:
            rows.append({param: value, **{c: np.nan for c in SWEEP_COLUMNS}, "error": str(err)})
    return pd.DataFrame(rows)


def simulated_sweep(workload: Workload, allocators: tuple[str, ...], param: str,
                    base: tuple) -> pd.DataFrame:
    """Replay the workload at every value of ``param`` for each allocator (planner.sweep).

    Args:
        workload: the requests.
        allocators: EngineConfig allocators compared.
        param: a key of SIM_SWEEPS.
        base: sorted PlanBase keyword items (model, gpu, tp, kv_dtype, ...).
    Returns:
        one row per (allocator, value): the sweep's row (capacity figures, flattened summary,
        ``error`` None or the reason the point is impossible).
    """
    kwargs = dict(base)
    kwargs.update(_plan_model(kwargs.pop("model")))
    plan = PlanBase(workload=workload_source(workload), max_requests=workload.max_requests,
                    rate=workload.rate if needs_rate(workload) else None, **kwargs)
    # max_num_seqs is an engine setting: planner.sweep routes it to EngineConfig per point
    axes = {"allocator": list(dict.fromkeys(allocators)), param: list(SIM_SWEEPS[param][1])}
    return pd.DataFrame(run_sweep(expand_grid(axes), plan))


def cache_curve(workload: Workload, model_name: str, gpu_name: str, base: tuple,
                cpu_offload_gib: float | None = None,
                target_hit_rate: float | None = None) -> CurveReport:
    """The workload's hit-rate curves with the GPU pool of the model on the GPU marked
    (``base``: sorted capacity keyword items: tp, kv_dtype, gpu_memory_utilization, block_size,
    max_model_len). Raises InputError for a bad trace or configuration."""
    kw = dict(base)
    setup = build_engine(model=resolve_model(model_name), gpu=gpu_name,
                         tensor_parallel_size=kw["tp"],
                         kv_cache_dtype=kw["kv_dtype"],
                         gpu_memory_utilization=kw["gpu_memory_utilization"],
                         block_size=kw["block_size"], max_model_len=kw["max_model_len"],
                         step_s=1.0)
    return curve_report(load_requests(workload), setup, kv_dtype=kw["kv_dtype"], tp=kw["tp"],
                        cpu_offload_gib=cpu_offload_gib or None,
                        target_hit_rate=target_hit_rate, num_min_sizes=24)


# the benchmark sweep: vllm bench serve's random dataset at these client concurrencies
BENCH_CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def bench_sweep(model_name: str, gpus: tuple[str, ...], isl: int, osl: int, num_requests: int,
                concurrencies: tuple[int, ...], base: tuple) -> pd.DataFrame:
    """A closed-loop concurrency sweep of ``random:isl=..,osl=..,n=..`` on each GPU: one row per
    (gpu, concurrency) with vllm bench serve's figures, throughput per GPU, interactivity and the
    Pareto front (planner.sweep.mark_pareto). ``base``: sorted capacity keyword items."""
    from kvsim.planner.sweep import mark_pareto

    plan = PlanBase(workload=f"random:isl={isl},osl={osl},n={num_requests},seed=0",
                    **_plan_model(model_name), **dict(base))
    rows = run_sweep(expand_grid({"gpu": list(gpus), "concurrency": list(concurrencies)}), plan)
    return pd.DataFrame(mark_pareto(rows))


def max_rate(workload: Workload, model_name: str, gpu_name: str, base: tuple, slo: str) -> dict:
    """The highest arrival rate of the sidebar's workload on this model and GPU that meets
    ``slo`` (planner.rate_search.max_rate_under); InputError for a bad SLO or configuration."""
    from kvsim.planner.rate_search import max_rate_under
    from kvsim.planner.slo import parse_slo

    # the search starts from the workload's rate where it needs one (else its own, or 1/s)
    plan = PlanBase(workload=workload_source(workload), max_requests=workload.max_requests,
                    rate=workload.rate if needs_rate(workload) else None, gpu=gpu_name,
                    **_plan_model(model_name), **dict(base))
    return max_rate_under(plan, parse_slo(slo))


def _plan_model(model_name: str) -> dict:
    """PlanBase's model fields for a preset name or an uploaded config.json's path."""
    if os.path.isfile(model_name):
        hf_config, model = hf_config_source(model_name)
        return {"model": model, "hf_config": hf_config}
    return {"model": model_name}
