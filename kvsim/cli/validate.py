"""``kvsim validate``: paged attention on a simulated pool's real block tables equals dense attention.

    kvsim validate --snapshot pool.npz [--layout flat|vllm] [--dtype float32|float16|bfloat16]
    kvsim validate WORKLOAD --at SECONDS --num-blocks N [--block-size 16] [--step-s 0.02]
                   [--save-snapshot pool.npz]
    kvsim validate ... --step [--sliding-window W]
    kvsim validate WORKLOAD --at SECONDS --num-blocks N --kv-groups sliding:64,full [--group 0]
                   [--step]

``--step`` checks one engine step as vLLM v1 runs it: the step's whole batch (prefills, chunked
prefills after a prefix-cache hit, decodes) in one ``unified_attention`` launch, against dense
causal attention per sequence. In the WORKLOAD form the step is the first one after --at that
computes a prefill (one that admits an arrival), so prefill, prefix-hit and decode rows are mixed.

With ``--kv-groups`` (a hybrid model's KV-cache groups, ``kvsim replay``'s spelling) the replay
runs the grouped allocator and one group's tables are checked (``--group``, default the first
sliding-window group): the unified kernel with that group's window, over tables whose positions
below the window point at the null block (blocks a window left are freed and reused), against
dense attention with the window mask.

The first form reads a snapshot saved with ``kernels.bridge.save_snapshot``; the second replays
WORKLOAD (``kvsim replay``'s defaults, kvsim.cli.replay) and takes the pool at SECONDS. Hardware in
the loop stays here, in the CLI: the simulator never imports the kernels. Runs on CUDA when present, else on CPU through the Triton interpreter (head sizes scaled
down). Prints one row per sequence (worst first); exit code 0 when every sequence matches within the
dtype's tolerance and is bitwise equal to the identity-table run, 1 otherwise, 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from kvsim.cli.argtypes import add_rate_args, nonneg_float, positive_float, positive_int
from kvsim.errors import InputError

DTYPES = ("float32", "float16", "bfloat16")
MAX_ROWS = 20
PARTITION_TOKENS = 16  # split-KV partitions are whole multiples of the kernels' 16-token tiles


def register(subparsers) -> None:
    """Add ``kvsim validate``."""
    p = subparsers.add_parser(
        "validate", help="check paged attention on a pool snapshot against dense attention",
        description="Fill a KV pool from a snapshot's block contents, run the Triton paged-attention "
                    "kernels on its block tables, and compare every sequence with dense attention "
                    "(and bitwise with the same kernel on contiguous blocks).")
    p.add_argument("workload", nargs="?", metavar="WORKLOAD",
                   help="trace file or synthetic spec to simulate (use with --at)")
    p.add_argument("--snapshot", type=Path, help="pool snapshot (.npz from kernels.bridge.save_snapshot)")
    p.add_argument("--at", type=nonneg_float, metavar="SECONDS",
                   help="simulated time of the snapshot (WORKLOAD form)")
    p.add_argument("--num-blocks", type=positive_int, help="WORKLOAD form: vLLM's num_gpu_blocks")
    p.add_argument("--block-size", type=positive_int, default=16,
                   help="WORKLOAD form: tokens per block (default 16)")
    p.add_argument("--step-s", type=positive_float, default=0.02,
                   help="WORKLOAD form: fixed step time (default 0.02)")
    p.add_argument("--max-requests", type=positive_int,
                   help="WORKLOAD form: simulate only the first N requests")
    p.add_argument("--kv-groups", metavar="GROUPS",
                   help="WORKLOAD form: a hybrid model's KV-cache groups (full | sliding:W | "
                        "mamba | mamba_ckpt[:A], comma-separated)")
    p.add_argument("--group", type=int, metavar="I",
                   help="with --kv-groups: the attention group whose tables are checked "
                        "(default: the first sliding-window group; its window applies)")
    add_rate_args(p)
    p.add_argument("--layout", choices=("flat", "vllm"), default="flat")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--num-kv-heads", type=positive_int, help="default 2 on CPU, 8 on CUDA")
    p.add_argument("--num-heads", type=positive_int,
                   help="default 2x num_kv_heads on CPU, 32 on CUDA (a multiple of num_kv_heads)")
    p.add_argument("--head-size", type=positive_int, help="default 16 on CPU, 128 on CUDA")
    p.add_argument("--partition-size", type=positive_int,
                   help=f"force split-KV (v2) with this many tokens per partition (a multiple of "
                        f"{PARTITION_TOKENS})")
    p.add_argument("--max-seqs", type=positive_int,
                   help="validate at most N sequences, chosen so that shared blocks are read by two of "
                        "them (the summary says how many were)")
    p.add_argument("--seed", type=int, default=0, help="seed of the queries")
    p.add_argument("--json", type=Path, help="write the full report here")
    p.add_argument("--step", action="store_true",
                   help="check the step's mixed batch (prefills + decodes) in one unified launch, "
                        "instead of one decode query per sequence")
    p.add_argument("--sliding-window", type=positive_int, metavar="TOKENS",
                   help="with --step: the model's sliding window (keys outside it are masked)")
    p.add_argument("--save-snapshot", type=Path, metavar="FILE",
                   help="also save the snapshot as .npz (WORKLOAD form: validate it again with --snapshot)")
    p.set_defaults(func=run)


# --step, WORKLOAD form: snapshot times after the first arrival at or after --at, one step apart
# (the arrival is admitted at the first step boundary after it, so its prefill is in one of them)
STEP_PROBES = 4


def _simulated_snapshot(args):
    """PoolSnapshot at args.at from replaying args.workload (``kvsim replay``'s defaults:
    planner.service.RunSettings'); with --step, the first snapshot after --at whose last step
    computed a prefill."""
    from kvsim.planner.engine_setup import EngineSettings
    from kvsim.planner.service import RunSettings, simulate_settings

    if args.num_blocks is None:
        raise InputError("validate WORKLOAD: give --num-blocks")
    times = [args.at]
    if args.step:
        from kvsim import workloads

        arrival = next((r.arrival_s for r in workloads.load(args.workload, max_requests=args.max_requests)
                        if r.arrival_s >= args.at), args.at)
        times = [arrival + (j + 0.5) * args.step_s for j in range(STEP_PROBES)]
    engine = EngineSettings(num_gpu_blocks=args.num_blocks, block_size=args.block_size,
                            step_s=args.step_s, kv_cache_groups=args.kv_groups or ())
    result = simulate_settings(RunSettings(
        args.workload, engine, max_requests=args.max_requests, rate=args.rate,
        rate_scale=args.rate_scale, snapshot_times_s=tuple(times)))
    # Result.snapshots holds (time_s, replica, PoolSnapshot); one replica here
    snapshots = [snap for _, _, snap in result.snapshots]
    if not snapshots:
        raise InputError(f"--at {args.at}: the simulation ended before that time (no snapshot taken)")
    mixed = [s for s in snapshots if s.step_num_new_tokens is not None and len(s.step_num_new_tokens)
             and s.step_num_new_tokens.max() > 1]
    return (mixed or snapshots)[0]


def _group_pool(snapshot, kv_groups: str, group: int | None):
    """One attention group's view of a grouped pool's snapshot (its block tables over the pool's
    blocks and keys; the step, if recorded, kept) and the group's window (None: full)."""
    from dataclasses import replace

    from kvsim.simulator.config import parse_kv_groups

    groups = parse_kv_groups(kv_groups)
    if group is None:
        group = next((i for i, g in enumerate(groups) if g.kind == "sliding_window"), 0)
    if not 0 <= group < len(groups):
        raise InputError(f"--group {group}: the model has groups 0..{len(groups) - 1}",
                         field="group")
    if groups[group].kind == "mamba":
        raise InputError(f"--group {group}: a Mamba group holds states, not attention KV",
                         field="group")
    tables = {s: t[group] for s, t in snapshot.group_block_tables.items()}
    return replace(snapshot, block_tables=tables), groups[group].sliding_window


def _load_snapshot(path: Path):
    """The snapshot file the user named; a missing or malformed file is an InputError."""
    from kvsim.kernels.bridge import load_snapshot

    if not path.is_file():
        raise InputError("no such snapshot file" if not path.exists() else "not a file", file=str(path))
    try:
        return load_snapshot(path)
    except ValueError as err:  # load_snapshot's ValueErrors all describe the file's content
        raise InputError(str(err)) from None


def format_report(report) -> str:
    """Per-sequence table (worst MAX_ROWS by relative error) and a summary line; a step report
    (``--step``) adds each sequence's context and new tokens."""
    step = hasattr(report, "sliding_window")
    rows = sorted(report.checks, key=lambda c: (c.passed, -c.max_rel_err))
    head = f"{'seq_id':>8} {'tokens':>7} {'blocks':>6} {'shared':>6} {'max_abs_err':>11} {'max_rel_err':>11} " \
           f"{'bitwise':>7} {'ok':>3}"
    if step:
        head += f" {'context':>7} {'new':>5}"
    lines = [head]
    for c in rows[:MAX_ROWS]:
        line = (f"{c.seq_id:>8} {c.num_tokens:>7} {c.num_blocks:>6} {c.num_shared_blocks:>6} "
                f"{c.max_abs_err:>11.2e} {c.max_rel_err:>11.2e} {str(c.bitwise_equal):>7} "
                f"{'yes' if c.passed else 'NO':>3}")
        lines.append(line + (f" {c.num_computed_tokens:>7} {c.num_new_tokens:>5}" if step else ""))
    if len(rows) > MAX_ROWS:
        lines.append(f"... {len(rows) - MAX_ROWS} more sequences")
    worst = max((c.max_rel_err for c in report.checks), default=0.0)
    num_failed = sum(not c.passed for c in report.checks)
    if step:
        num_prefill = sum(c.num_new_tokens > 1 for c in report.checks)
        what = (f"one step of {len(report.checks)} sequences ({num_prefill} prefill or chunk, "
                f"{len(report.checks) - num_prefill} decode, {report.num_tokens} new tokens, "
                f"window {report.sliding_window or 'none'}) in one unified launch")
    else:
        what = (f"{len(report.checks)} of {report.num_sequences} sequences checked "
                f"({report.num_skipped_empty} with 0 tokens not run; {report.num_shared_blocks_checked} of "
                f"the {report.num_shared_blocks} shared blocks read by two checked sequences)")
    lines.append(
        f"{what}, "
        f"{sum(c.num_shared_blocks > 0 for c in report.checks)} with shared blocks; {report.dtype} "
        f"{report.layout} layout on {report.device}, heads {report.num_heads}/{report.num_kv_heads} kv, "
        f"head_size {report.head_size}, partition {report.partition_size or 'auto'}: worst relative error "
        f"{worst:.2e} (tolerance {report.tolerance:.2g}); "
        + ("all bitwise equal to the identity table, PASS" if num_failed == 0 else f"{num_failed} FAILED"))
    return "\n".join(lines)


def run(args) -> int:
    if args.kv_groups and (args.snapshot is not None or args.sliding_window is not None):
        raise InputError("--kv-groups goes with the WORKLOAD form, and the group's own window "
                         "applies (no --sliding-window)")
    if args.group is not None and not args.kv_groups:
        raise InputError("--group needs --kv-groups")
    if args.sliding_window is not None and not args.step:
        raise InputError("--sliding-window applies to --step (a decode-only check has no window)")
    if args.step and args.max_seqs is not None:
        raise InputError("--max-seqs does not apply to --step (a step is checked whole)")
    if (args.snapshot is None) == (args.workload is None):
        raise InputError("give exactly one of --snapshot FILE or WORKLOAD --at SECONDS")
    if args.workload is not None and args.at is None:
        raise InputError("WORKLOAD needs --at SECONDS")
    if args.num_heads is not None and args.num_kv_heads is not None and args.num_heads % args.num_kv_heads:
        raise InputError(f"--num-heads {args.num_heads} is not a multiple of --num-kv-heads {args.num_kv_heads}")
    if args.partition_size is not None and args.partition_size % PARTITION_TOKENS:
        raise InputError(f"--partition-size must be a multiple of {PARTITION_TOKENS}, got {args.partition_size}")
    from kvsim.cli.outputs import write_files
    from kvsim.simulator.result import prepare_output

    for path in (args.json, args.save_snapshot):  # checked before minutes of simulation
        if path is not None:
            prepare_output(path)
    import torch  # after parsing: `kvsim --help` stays fast

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available")
    if device == "cpu":
        # the interpreter must be chosen before the first kernel module is imported
        if "kvsim.kernels.attention" not in sys.modules:
            os.environ["TRITON_INTERPRET"] = "1"
        elif os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            raise InputError("--device cpu: the kernels were imported without TRITON_INTERPRET=1")
    from kvsim.kernels.bridge import save_snapshot, validate_snapshot, validate_step

    snapshot = _load_snapshot(args.snapshot) if args.snapshot is not None else _simulated_snapshot(args)
    window = args.sliding_window
    if args.kv_groups:
        snapshot, window = _group_pool(snapshot, args.kv_groups, args.group)
    geometry = dict(layout=args.layout, dtype=getattr(torch, args.dtype), device=device,
                    num_kv_heads=args.num_kv_heads, num_heads=args.num_heads, head_size=args.head_size,
                    partition_size=args.partition_size, seed=args.seed)
    if args.step:
        try:
            report = validate_step(snapshot, sliding_window=window, **geometry)
        except ValueError as err:   # the snapshot holds no step, or one that does not fit it
            raise InputError(f"--step: {err}") from None
    else:
        report = validate_snapshot(snapshot, max_seqs=args.max_seqs, sliding_window=window,
                                   **geometry)
    print(format_report(report))   # the table first, whatever happens to the files below
    if args.kv_groups and window is not None:
        print(f"sliding window {window}: the sliding-window group's tables (null block below "
              f"the window), dense reference masked to the window")
    data = asdict(report)
    data["passed"] = report.passed
    if args.kv_groups:
        data["sliding_window"] = window
    write_files([(path, write) for path, write in (
        (args.save_snapshot, lambda: save_snapshot(args.save_snapshot, snapshot)),
        (args.json, lambda: args.json.write_text(json.dumps(data, indent=1) + "\n"))) if path is not None])
    return 0 if report.passed else 1
