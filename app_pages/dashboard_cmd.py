"""``kvsim dashboard``: start the Streamlit dashboard (what ``make run`` does)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app.py"


def streamlit_command(port: int, headless: bool) -> list[str]:
    """The command line that serves app.py on ``port``."""
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    return [sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port),
            "--server.headless", "true" if headless else "false",
            "--browser.gatherUsageStats", "false"]


def run(args) -> int:
    """Serve the dashboard until interrupted; returns Streamlit's exit code."""
    # from the repository root, so that .streamlit/config.toml applies
    return subprocess.call(streamlit_command(args.port, args.headless), cwd=APP.parent)


def register(subparsers) -> None:
    """Add ``kvsim dashboard [--port N] [--open]``."""
    p = subparsers.add_parser("dashboard", help="open the Streamlit dashboard (live block pools, "
                              "metrics, capacity planner, kernel validation)")
    p.add_argument("--port", type=int, default=8501, help="local port (default 8501)")
    p.add_argument("--open", dest="headless", action="store_false",
                   help="also open a browser tab (default: just print the URL)")
    p.set_defaults(func=run)
