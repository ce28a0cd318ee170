"""Triton paged-attention kernels: reshape_and_cache, paged decode attention (v1 and split-KV v2)
over the flat and vLLM cache layouts, a float64 torch reference, and a bridge from allocator pool
snapshots. Imports torch and triton, never the simulator.

Set TRITON_INTERPRET=1 before importing this package to run the kernels on CPU tensors.
"""
from kernels.attention import KernelConfig, default_config, paged_attention, plan_launch, plan_partitions
from kernels.cache import reshape_and_cache
from kernels.layout import LAYOUTS, allocate_kv_cache, cache_shapes, x_for
from kernels.reference import dense_attention, gather_kv, reference_paged_attention

__all__ = ["paged_attention", "reshape_and_cache", "plan_partitions", "plan_launch", "KernelConfig", "default_config",
           "LAYOUTS", "allocate_kv_cache", "cache_shapes", "x_for", "dense_attention", "gather_kv",
           "reference_paged_attention"]
