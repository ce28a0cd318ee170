"""Triton paged-attention kernels: reshape_and_cache, paged decode attention (v1 and split-KV v2)
over the flat and vLLM cache layouts, a float64 torch reference, and a bridge from allocator pool
snapshots. Imports torch and triton, never the simulator.

Set TRITON_INTERPRET=1 before the first use of a kernel to run on CPU tensors. Names are imported
lazily, so that ``import simulator.validate_cmd`` (the CLI) stays light and can still set it.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "paged_attention": "kernels.attention", "plan_partitions": "kernels.attention",
    "plan_launch": "kernels.attention", "KernelConfig": "kernels.attention", "default_config": "kernels.attention",
    "attention_workspace": "kernels.attention",
    "reshape_and_cache": "kernels.cache",
    "LAYOUTS": "kernels.layout", "allocate_kv_cache": "kernels.layout", "cache_shapes": "kernels.layout",
    "x_for": "kernels.layout",
    "dense_attention": "kernels.reference", "gather_kv": "kernels.reference",
    "reference_paged_attention": "kernels.reference",
    "validate_snapshot": "kernels.bridge", "save_snapshot": "kernels.bridge", "load_snapshot": "kernels.bridge",
    "pool_arrays": "kernels.bridge",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")
