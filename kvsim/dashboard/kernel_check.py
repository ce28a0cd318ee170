"""The kernel validation page: the Triton paged-attention kernels over one snapshot's block
tables (kvsim.kernels.bridge), on CUDA when visible, else on CPU through the Triton interpreter.

kvsim.kernels is imported inside the functions: triton.jit reads TRITON_INTERPRET when a kernel
is defined, so kernel_device must run (and set it) before the first kernel import.
"""
from __future__ import annotations

import dataclasses
import os

import pandas as pd

from kvsim.errors import InputError

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
                   split_kv: bool, step: bool = False) -> tuple[pd.DataFrame, dict]:
    """Validate one snapshot's block tables: one decode query per sequence
    (kernels.bridge.validate_snapshot), or with ``step`` the engine step that produced the
    snapshot, its prefills, chunks and decodes in one unified launch (validate_step; max_seqs
    does not apply: a step is checked whole).

    Returns:
        (one row per sequence: seq_id, num_tokens, num_blocks, num_shared_blocks, max_abs_err,
        max_rel_err, bitwise_equal, passed, and for a step num_computed_tokens, num_new_tokens;
        the report's settings and verdict as a dict).
    Raises:
        InputError: ``step`` on a frame without a step batch (the simulation had taken no step
            there). Anything else the kernels refuse is an internal error.
    """
    if step and getattr(snapshot, "step_num_new_tokens", None) is None:
        raise InputError("this frame has no engine step to check (nothing ran just before it): "
                         "move the time slider, or turn the step check off")
    device = kernel_device()
    import torch

    from kvsim.kernels.bridge import SequenceCheck, StepCheck, validate_snapshot, validate_step
    geometry = dict(layout=layout, dtype=getattr(torch, dtype), device=device,
                    partition_size=SPLIT_KV_PARTITION_TOKENS if split_kv else None)
    if step:
        report, row = validate_step(snapshot, **geometry), StepCheck
    else:
        report, row = validate_snapshot(snapshot, max_seqs=max_seqs, **geometry), SequenceCheck
    checks = pd.DataFrame([dataclasses.asdict(c) for c in report.checks],
                          columns=[f.name for f in dataclasses.fields(row)])
    # the report's coverage: sequences with tokens, blocks two of them read, and of those the
    # blocks two checked sequences read (kernels.bridge.choose_sequences)
    info = {k: v for k, v in dataclasses.asdict(report).items() if k != "checks"}
    info["passed"] = report.passed
    return checks, info
