"""The ``kvsim`` command line.

Each subcommand lives in the package it belongs to and exposes ``register(subparsers)``, which
adds its parser and sets ``func``; this module only routes. A user's mistake (``ValueError``,
which ``kvsim.errors.InputError`` subclasses) is printed on one line with exit code 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# module names, imported lazily so that `kvsim --help` stays fast and a missing optional
# dependency of one subcommand does not break the others
SUBCOMMAND_MODULES: list[str] = [
    "kvsim.simulator.replay_cmd",
    "kvsim.simulator.compare_cmd",
    "kvsim.workloads.cli",
    "kvsim.planner.capacity_cmd",
    "kvsim.planner.plan_cmd",
    "kvsim.planner.reproduce_cmd",
    "kvsim.simulator.validate_cmd",
    "kvsim.app_pages.dashboard_cmd",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvsim", description="Simulate, plan and visualise KV-cache memory in LLM serving.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as err:  # bad input: one line, exit 2, never a traceback
        print(f"kvsim: error: {err}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, PermissionError) as err:
        print(f"kvsim: error: {err.filename}: {err.strerror}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
