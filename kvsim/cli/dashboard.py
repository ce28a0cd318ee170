"""``kvsim dashboard``: serve the Streamlit dashboard (what ``make run`` does), from a checkout or
an installed wheel."""
from __future__ import annotations

import argparse
import os
import sys

from kvsim.cli.argtypes import positive_int

MAX_PORT = 65535


def port(text: str) -> int:
    """argparse type of ``--port``: 1..65535 (a bad value is a usage error, exit 2)."""
    value = positive_int(text)
    if value > MAX_PORT:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_PORT}, got {text}")
    return value


def run(args) -> int:
    """Become ``streamlit run`` on the packaged entry script (never returns on success).

    The process is replaced rather than wrapped, so that a signal to ``kvsim dashboard`` (Ctrl-C,
    kill) reaches the server itself and no orphaned server is left behind.
    """
    from kvsim.dashboard.launch import streamlit_command
    cmd = streamlit_command(args.port, args.headless)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(cmd[0], cmd)
    return 0  # not reached; os.execv raises OSError when it fails


def register(subparsers) -> None:
    """Add ``kvsim dashboard [--port N] [--open]``."""
    p = subparsers.add_parser("dashboard", help="open the Streamlit dashboard (live block pools, "
                              "metrics, capacity planner, kernel validation)")
    p.add_argument("--port", type=port, default=8501, help="local port (default 8501)")
    p.add_argument("--open", dest="headless", action="store_false",
                   help="also open a browser tab (default: just print the URL)")
    p.set_defaults(func=run)
