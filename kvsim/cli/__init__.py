"""The ``kvsim`` command line: one module per subcommand, one shared set of flags (``options``).

Each command module exposes ``register(subparsers)``, which adds its parser and sets ``func``;
this module only routes. ``kvsim COMMAND ...`` imports that command's module alone, and every
module keeps its heavy imports (pandas, simpy, torch, plotly) inside the functions that run the
work, so ``--help`` stays fast.

Errors: a user's mistake is a ``kvsim.errors.InputError`` (a bad flag value, file, spec or
configuration; the layers below raise it where the value is checked) and is printed on one line
with exit code 2. Every other exception, ValueError included, keeps its traceback: an internal
bug must never look like a user's mistake.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from kvsim.cli.argtypes import Parser
from kvsim.errors import InputError

# command -> module with register(subparsers); imported lazily (only the command being run, or
# all of them for `kvsim --help`)
COMMANDS: dict[str, str] = {
    "replay": "kvsim.cli.replay",
    "compare": "kvsim.cli.compare",
    "bench": "kvsim.cli.bench",
    "workload": "kvsim.cli.workload",
    "capacity": "kvsim.cli.capacity",
    "plan": "kvsim.cli.plan",
    "reproduce": "kvsim.cli.reproduce",
    "validate": "kvsim.cli.validate",
    "dashboard": "kvsim.cli.dashboard",
    "profile": "kvsim.cli.profile",
    "cache-curve": "kvsim.cli.cache_curve",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``kvsim`` parser with every command, or with ``only`` that one (what parsing it needs)."""
    parser = Parser(
        prog="kvsim", description="Simulate, plan and visualise KV-cache memory in LLM serving.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``kvsim`` with ``argv`` (default sys.argv[1:]); returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InputError as err:  # a user's mistake: one line, exit 2, never a traceback
        print(f"kvsim: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kvsim ... | head`: the reader left; no traceback, no more output
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
