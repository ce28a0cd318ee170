"""Request shapes shared by the hybrid driver (vLLM side) and the golden replay (kvsim only):
the golden files store shapes, and both rebuild the same token ids from them."""
from __future__ import annotations

from kvsim.allocator.group_managers import KVCacheGroupSpec

# configuration name -> groups as (kind, sliding_window or Mamba checkpoint alignment)
CONFIGS = {
    "full_sliding": [("full_attention", None), ("sliding_window", 9)],
    "gemma_like": [("full_attention", None)] + [("sliding_window", 13)] * 3,
    "sliding_only": [("sliding_window", 6)],
    "mamba_full": [("mamba", None), ("mamba", None), ("full_attention", None)],
    "mamba_checkpoint": [("mamba", 1), ("full_attention", None), ("mamba", 1)],
    "three_kinds": [("full_attention", None), ("sliding_window", 10), ("mamba", None)],
}


def make_groups(groups: list) -> list[KVCacheGroupSpec]:
    """kvsim group specs from ``(kind, argument)`` pairs."""
    out = []
    for kind, arg in groups:
        if kind == "sliding_window":
            out.append(KVCacheGroupSpec(kind, sliding_window=arg))
        elif kind == "mamba":
            out.append(KVCacheGroupSpec(kind, mamba_checkpoint_alignment=arg))
        else:
            out.append(KVCacheGroupSpec(kind))
    return out


def tokens_of(shape: dict) -> tuple[list[int], list[int]]:
    """A request's prompt and output token ids: ``shared`` tokens common to its prefix group,
    then ``unique`` and ``output`` tokens nobody else has."""
    shared = [1000 * shape["group"] + i for i in range(shape["shared"])]
    prompt = shared + [10**6 + 1000 * shape["base"] + i for i in range(shape["unique"])]
    output = [2 * 10**6 + 1000 * shape["base"] + i for i in range(shape["output"])]
    return prompt, output
