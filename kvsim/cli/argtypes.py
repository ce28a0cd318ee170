"""argparse types for counts and sizes (a bad value is a usage error, exit 2, before any work),
the flag groups that need nothing else (``--rate``/``--rate-scale``) and ``Parser``, the short-usage parser.

Kept apart from ``options`` (which imports the planner's presets for its help texts; it
re-exports these) so that a command needing only these, such as ``kvsim workload``, starts
without the planner.
"""
from __future__ import annotations

import argparse
import math


def _number(kind, lo, *, strict: bool):
    """An argparse type: a ``kind`` >= lo (> lo when strict); argparse reports a bad value as a
    usage error (exit 2) before any work starts."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not {'an integer' if kind is int else 'a number'}: {text!r}") from None
        if not math.isfinite(value) or value < lo or (strict and value == lo):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {lo}, got {text}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


positive_int = _number(int, 1, strict=False)
nonneg_int = _number(int, 0, strict=False)
positive_float = _number(float, 0, strict=True)
nonneg_float = _number(float, 0, strict=False)


def fraction(text: str) -> float:
    """An argparse type: a number in (0, 1] (a share of memory, bandwidth or FLOP/s)."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


fraction.__name__ = "float"


def add_rate_args(p: argparse.ArgumentParser) -> None:
    """``--rate`` and ``--rate-scale``: one meaning in every command (workloads.retime)."""
    g = p.add_argument_group("arrival rate (the same in every command)")
    g.add_argument("--rate", type=positive_float, metavar="PER_S",
                   help="give the workload this many requests/s: a spec's rate= is replaced, a "
                        "trace without timestamps gets Poisson arrivals, a timestamped trace is "
                        "re-timed to this mean rate")
    g.add_argument("--rate-scale", type=positive_float, metavar="X",
                   help="X times the workload's own rate (or --rate's): a trace keeps its own "
                        "arrival pattern, its times divided by X ('what if traffic doubles?': 2)")


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
