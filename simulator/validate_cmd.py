"""``kvsim validate``: paged attention on a simulated pool's real block tables equals dense attention.

    kvsim validate --snapshot pool.npz [--layout flat|vllm] [--dtype float32|float16|bfloat16]
    kvsim validate WORKLOAD --at SECONDS --num-blocks N [--block-size 16] [--step-s 0.02]
                   [--save-snapshot pool.npz]

The first form reads a snapshot saved with ``kernels.bridge.save_snapshot``; the second simulates
WORKLOAD (through ``simulator.replay_cmd``) and takes the pool at
SECONDS. Runs on CUDA when present, else on CPU through the Triton interpreter (head sizes scaled
down). Prints one row per sequence (worst first); exit code 0 when every sequence matches within the
dtype's tolerance and is bitwise equal to the identity-table run, 1 otherwise, 2 on bad input.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

DTYPES = ("float32", "float16", "bfloat16")
MAX_ROWS = 20


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "validate", help="check paged attention on a pool snapshot against dense attention",
        description="Fill a KV pool from a snapshot's block contents, run the Triton paged-attention "
                    "kernels on its block tables, and compare every sequence with dense attention "
                    "(and bitwise with the same kernel on contiguous blocks).")
    p.add_argument("workload", nargs="?", metavar="WORKLOAD",
                   help="trace file or synthetic spec to simulate (needs the simulator; use with --at)")
    p.add_argument("--snapshot", type=Path, help="pool snapshot (.npz from kernels.bridge.save_snapshot)")
    p.add_argument("--at", type=float, metavar="SECONDS", help="simulated time of the snapshot (WORKLOAD form)")
    p.add_argument("--num-blocks", type=int, help="WORKLOAD form: vLLM's num_gpu_blocks")
    p.add_argument("--block-size", type=int, default=16, help="WORKLOAD form: tokens per block (default 16)")
    p.add_argument("--step-s", type=float, default=0.02, help="WORKLOAD form: fixed step time (default 0.02)")
    p.add_argument("--max-requests", type=int, help="WORKLOAD form: simulate only the first N requests")
    p.add_argument("--layout", choices=("flat", "vllm"), default="flat")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--num-kv-heads", type=int, help="default 2 on CPU, 8 on CUDA")
    p.add_argument("--num-heads", type=int, help="default 2x num_kv_heads on CPU, 32 on CUDA")
    p.add_argument("--head-size", type=int, help="default 16 on CPU, 128 on CUDA")
    p.add_argument("--partition-size", type=int, help="force split-KV (v2) with this many tokens per partition")
    p.add_argument("--max-seqs", type=int, help="validate only the first N sequences (by seq_id)")
    p.add_argument("--seed", type=int, default=0, help="seed of the queries")
    p.add_argument("--json", type=Path, help="write the full report here")
    p.add_argument("--save-snapshot", type=Path, metavar="FILE",
                   help="also save the snapshot as .npz (WORKLOAD form: validate it again with --snapshot)")
    p.set_defaults(func=run)


def _simulated_snapshot(args):
    """PoolSnapshot at args.at from simulating args.workload (reuses the replay command's options)."""
    import argparse

    from kvsim.simulator.replay_cmd import add_workload_and_engine_args, run_one
    if args.num_blocks is None:
        raise ValueError("validate WORKLOAD: give --num-blocks")
    parser = argparse.ArgumentParser(prog="kvsim validate")
    add_workload_and_engine_args(parser)
    argv = [args.workload, "--block-size", str(args.block_size), "--num-blocks", str(args.num_blocks),
            "--step-s", str(args.step_s), "--snapshot-times-s", repr(args.at), "--quiet"]
    if args.max_requests:
        argv += ["--max-requests", str(args.max_requests)]
    result = run_one(parser.parse_args(argv), "paged")
    if not result.snapshots:
        raise ValueError(f"--at {args.at}: the simulation ended before that time (no snapshot taken)")
    # TEAM.md's contract says (time_s, PoolSnapshot); the simulator adds the replica in between:
    # the snapshot is the last element either way (replica 0 first)
    return result.snapshots[0][-1]


def format_report(report) -> str:
    """Per-sequence table (worst MAX_ROWS by relative error) and a summary line."""
    rows = sorted(report.checks, key=lambda c: (c.passed, -c.max_rel_err))
    head = f"{'seq_id':>8} {'tokens':>7} {'blocks':>6} {'shared':>6} {'max_abs_err':>11} {'max_rel_err':>11} " \
           f"{'bitwise':>7} {'ok':>3}"
    lines = [head]
    for c in rows[:MAX_ROWS]:
        lines.append(f"{c.seq_id:>8} {c.num_tokens:>7} {c.num_blocks:>6} {c.num_shared_blocks:>6} "
                     f"{c.max_abs_err:>11.2e} {c.max_rel_err:>11.2e} {str(c.bitwise_equal):>7} "
                     f"{'yes' if c.passed else 'NO':>3}")
    if len(rows) > MAX_ROWS:
        lines.append(f"... {len(rows) - MAX_ROWS} more sequences")
    worst = max((c.max_rel_err for c in report.checks), default=0.0)
    num_failed = sum(not c.passed for c in report.checks)
    lines.append(
        f"{len(report.checks)} sequences ({report.num_skipped_empty} with 0 tokens not run), "
        f"{sum(c.num_shared_blocks > 0 for c in report.checks)} with shared blocks; {report.dtype} "
        f"{report.layout} layout on {report.device}, heads {report.num_heads}/{report.num_kv_heads} kv, "
        f"head_size {report.head_size}, partition {report.partition_size or 'auto'}: worst relative error "
        f"{worst:.2e} (tolerance {report.tolerance:.2g}); "
        + ("all bitwise equal to the identity table, PASS" if num_failed == 0 else f"{num_failed} FAILED"))
    return "\n".join(lines)


def run(args) -> int:
    if (args.snapshot is None) == (args.workload is None):
        raise ValueError("give exactly one of --snapshot FILE or WORKLOAD --at SECONDS")
    if args.workload is not None and args.at is None:
        raise ValueError("WORKLOAD needs --at SECONDS")
    for name in ("num_kv_heads", "num_heads", "head_size", "partition_size", "max_seqs", "max_requests"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    import torch  # after parsing: `kvsim --help` stays fast

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    if device == "cpu":
        # the interpreter must be chosen before the first kernel module is imported
        if "kvsim.kernels.attention" not in __import__("sys").modules:
            os.environ["TRITON_INTERPRET"] = "1"
        elif os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            raise ValueError("--device cpu: the kernels were imported without TRITON_INTERPRET=1")
    from kvsim.kernels.bridge import load_snapshot, save_snapshot, validate_snapshot

    snapshot = load_snapshot(args.snapshot) if args.snapshot is not None else _simulated_snapshot(args)
    if args.save_snapshot is not None:
        save_snapshot(args.save_snapshot, snapshot)
    report = validate_snapshot(snapshot, layout=args.layout, dtype=getattr(torch, args.dtype), device=device,
                               num_kv_heads=args.num_kv_heads, num_heads=args.num_heads,
                               head_size=args.head_size, partition_size=args.partition_size,
                               max_seqs=args.max_seqs, seed=args.seed)
    print(format_report(report))
    if args.json is not None:
        data = asdict(report)
        data["passed"] = report.passed
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0 if report.passed else 1
