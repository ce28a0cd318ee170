"""Triton paged-attention kernels: reshape_and_cache, unified paged attention for vLLM v1's mixed
prefill + decode batches (``paged_attention`` is its decode case; split-KV with a fused or separate
merge) over the flat and vLLM cache layouts, a float64 torch reference, and a bridge from allocator
pool snapshots. Imports torch and triton, never the simulator.

Set TRITON_INTERPRET=1 before the first use of a kernel to run on CPU tensors. Names are imported
lazily, so that ``import simulator.validate_cmd`` (the CLI) stays light and can still set it.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "paged_attention": "kvsim.kernels.attention", "unified_attention": "kvsim.kernels.attention",
    "plan_attention": "kvsim.kernels.attention", "plan_partitions": "kvsim.kernels.attention",
    "plan_launch": "kvsim.kernels.attention", "KernelConfig": "kvsim.kernels.attention", "default_config": "kvsim.kernels.attention",
    "attention_workspace": "kvsim.kernels.attention",
    "reshape_and_cache": "kvsim.kernels.cache",
    "LAYOUTS": "kvsim.kernels.layout", "allocate_kv_cache": "kvsim.kernels.layout", "cache_shapes": "kvsim.kernels.layout",
    "x_for": "kvsim.kernels.layout",
    "dense_attention": "kvsim.kernels.reference", "gather_kv": "kvsim.kernels.reference",
    "reference_paged_attention": "kvsim.kernels.reference", "dense_causal_attention": "kvsim.kernels.reference",
    "reference_unified_attention": "kvsim.kernels.reference",
    "validate_snapshot": "kvsim.kernels.bridge", "save_snapshot": "kvsim.kernels.bridge", "load_snapshot": "kvsim.kernels.bridge",
    "pool_arrays": "kvsim.kernels.bridge",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")
