"""Capacity planning: model/GPU presets, vLLM's KV-cache sizing, the roofline cost model, the one
(model, GPU, settings) -> EngineConfig + cost builder, sweeps, the paper reproduction.

    from kvsim.planner import build_engine, compute_capacity, get_gpu, get_model
    report = compute_capacity(get_model("Llama-3.1-8B"), get_gpu("h100"), max_model_len=8192)
    setup = build_engine(model="Llama-3.1-8B", gpu="h100", max_model_len=8192)
    # setup.config: simulator EngineConfig, setup.cost: RooflineCost, setup.capacity: the report

The planner sits above the simulator (it builds the simulator's inputs); the simulator never
imports it. The command-line front ends live in ``kvsim.cli``.
"""
from kvsim.planner.capacity import CapacityReport, compute_capacity, kv_bytes_per_token, kv_heads_per_rank
from kvsim.planner.engine_setup import EngineSetup, build_engine
from kvsim.planner.presets import GPU_PRESETS, MODEL_PRESETS, custom_gpu, get_gpu, get_model, load_hf_config
from kvsim.planner.roofline import RooflineCost
from kvsim.planner.specs import GpuSpec, ModelSpec

__all__ = ["CapacityReport", "EngineSetup", "GPU_PRESETS", "GpuSpec", "MODEL_PRESETS", "ModelSpec", "RooflineCost",
           "build_engine", "compute_capacity", "custom_gpu", "get_gpu", "get_model", "kv_bytes_per_token",
           "kv_heads_per_rank", "load_hf_config"]
