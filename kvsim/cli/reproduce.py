"""``kvsim reproduce vllm-paper --out DIR [--quick] [--quiet]``: run the reproduction, write the report.

The paper's setup is fixed (OPT-13B on an A100-40GB, 12 GiB of KV cache: planner.reproduce), so
this command takes no model, GPU or engine flags; ``ReproConfig`` names every knob.
"""
from __future__ import annotations

import argparse
import sys
import time


def register(subparsers) -> None:
    """Add the ``reproduce`` command (one target today: ``vllm-paper``)."""
    parser = subparsers.add_parser(
        "reproduce", help="reproduce published results with kvsim",
        description="Reproduce published results from first principles and compare.")
    targets = parser.add_subparsers(dest="target", metavar="TARGET")
    targets.required = True
    p = targets.add_parser(
        "vllm-paper", help="the vLLM paper's memory results (SOSP'23 Fig. 2, 13, 15)",
        description="Simulate the vLLM paper's memory experiments (OPT-13B, A100-40GB, ShareGPT "
                    "and Alpaca) and write DIR/results.json, DIR/report.md and DIR/report.html.")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created)")
    p.add_argument("--quick", action="store_true",
                   help="scaled-down run: 10-minute traces, fewer sensitivity points")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--no-sensitivity", action="store_true", help="skip the sensitivity checks")
    p.add_argument("--sharegpt-file", default=None, metavar="CSV",
                   help="real ShareGPT length CSV (default: ../shared/traces when present; '' skips)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvsim.cli.outputs import write_files
    from kvsim.errors import InputError
    from kvsim.planner.reproduce import ReproConfig, run_reproduction
    from kvsim.planner.reproduce_report import (OUTPUT_NAMES, differences, ordering_checks,
                                                output_writes, render_markdown)
    from kvsim.simulator.result import prepare_output_dir

    # fail before minutes of simulation, not after
    prepare_output_dir(args.out, names=tuple(OUTPUT_NAMES.values()))
    overrides = dict(seed=args.seed, sensitivity=not args.no_sensitivity,
                     sharegpt_file=args.sharegpt_file)
    config = ReproConfig.quick(**overrides) if args.quick else ReproConfig(**overrides)
    start = time.perf_counter()
    results = run_reproduction(config, progress=not args.quiet and sys.stderr.isatty())   # a bar on a terminal only
    if not args.quiet:   # the report on the terminal first, whatever happens to the files
        print(render_markdown(results))
    try:
        paths = write_files(output_writes(results, args.out))
    except InputError:
        if args.quiet:   # no result is lost: the report goes to the terminal instead
            print(render_markdown(results))
        raise
    if not args.quiet:
        flagged = sum(d["flag"] for d in differences(results))
        broken = [k for k, ok in ordering_checks(results).items() if not ok]
        print(f"wrote {', '.join(paths)} "
              f"in {time.perf_counter() - start:.0f} s; {flagged} figures differ from the paper "
              f"by more than 3 points / 10 %; orderings broken: {', '.join(broken) or 'none'}",
              file=sys.stderr)
    return 0
