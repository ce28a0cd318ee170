"""Capacity planning: model/GPU presets, vLLM's KV-cache sizing, the roofline cost model, sweeps.

    from kvsim.planner import get_model, get_gpu, compute_capacity, RooflineCost
    report = compute_capacity(get_model("Llama-3.1-8B"), get_gpu("h100"), max_model_len=8192)
    cost = RooflineCost(get_model("Llama-3.1-8B"), get_gpu("h100"))   # a simulator CostModel

Sweeps (``planner.sweep``) and the ``kvsim capacity`` / ``kvsim plan`` subcommands
(``planner.capacity_cmd``, ``planner.plan_cmd``) import the simulator lazily, so this package
stays importable on its own.
"""
from kvsim.planner.capacity import CapacityReport, compute_capacity, kv_bytes_per_token, kv_heads_per_rank
from kvsim.planner.presets import GPU_PRESETS, MODEL_PRESETS, custom_gpu, get_gpu, get_model, load_hf_config
from kvsim.planner.roofline import RooflineCost
from kvsim.planner.specs import GpuSpec, ModelSpec

__all__ = ["CapacityReport", "GPU_PRESETS", "GpuSpec", "MODEL_PRESETS", "ModelSpec", "RooflineCost",
           "compute_capacity", "custom_gpu", "get_gpu", "get_model", "kv_bytes_per_token",
           "kv_heads_per_rank", "load_hf_config"]
