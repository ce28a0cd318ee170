"""The kernel validation page: the Triton paged-attention kernels over one snapshot's block
tables (kvsim.kernels.bridge), on CUDA when visible, else on CPU through the Triton interpreter.

kvsim.kernels is imported inside the functions: triton.jit reads TRITON_INTERPRET when a kernel
is defined, so kernel_device must run (and set it) before the first kernel import.
"""
from __future__ import annotations

import dataclasses
import os

import pandas as pd

KERNEL_DTYPES = ("float32", "float16", "bfloat16")
SPLIT_KV_PARTITION_TOKENS = 64  # the split-KV (v2) toggle forces partitions of this size


def kernel_device() -> str:
    """"cuda" when a GPU is visible; otherwise "cpu", with TRITON_INTERPRET set."""
    import torch
    if torch.cuda.is_available():
        return "cuda"
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return "cpu"


def check_snapshot(snapshot, layout: str, dtype: str, max_seqs: int,
                   split_kv: bool) -> tuple[pd.DataFrame, dict]:
    """Validate one snapshot's block tables with kernels.bridge.validate_snapshot.

    Returns:
        (one row per sequence: seq_id, num_tokens, num_blocks, num_shared_blocks, max_abs_err,
        max_rel_err, bitwise_equal, passed; the report's settings and verdict as a dict).
    Raises:
        ValueError for shapes or block ids the kernels refuse.
    """
    device = kernel_device()
    import torch

    from kvsim.kernels.bridge import SequenceCheck, validate_snapshot
    report = validate_snapshot(snapshot, layout=layout, dtype=getattr(torch, dtype),
                               device=device, max_seqs=max_seqs,
                               partition_size=SPLIT_KV_PARTITION_TOKENS if split_kv else None)
    checks = pd.DataFrame([dataclasses.asdict(c) for c in report.checks],
                          columns=[f.name for f in dataclasses.fields(SequenceCheck)])
    info = {k: v for k, v in dataclasses.asdict(report).items() if k != "checks"}
    info["passed"] = report.passed
    return checks, info
