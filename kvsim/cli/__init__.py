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


class Parser(argparse.ArgumentParser):
    """argparse's parser whose flag errors end in two lines, not the whole usage block: a usage
    line with the positionals alone and the error, pointing to ``--help`` (``kvsim replay`` has 60
    flags; argparse would print them all before the one line that matters). Subparsers inherit it."""

    def short_usage(self) -> str:
        positionals = " ".join(a.metavar or a.dest.upper() if a.nargs is None or isinstance(a.nargs, int)
                               else f"[{a.metavar or a.dest.upper()}]" if a.nargs == "?"
                               else f"{a.metavar or a.dest.upper()} ..."
                               for a in self._get_positional_actions())
        return f"usage: {self.prog} [flags] {positionals}".rstrip()

    def parse_args(self, args=None, namespace=None):
        """argparse's, except that arguments nobody knows are reported by the (sub)command that was
        being parsed (argparse reports them with the top-level usage)."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self
            while True:
                action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
                chosen = getattr(namespace, action.dest, None) if action and action.dest else None
                if chosen not in (action.choices if action else {}):
                    break
                parser = action.choices[chosen]
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace

    def error(self, message: str):
        self.exit(2, f"{self.short_usage()}\n{self.prog}: error: {message} "
                     f"(`{self.prog} --help` lists the flags)\n")


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
