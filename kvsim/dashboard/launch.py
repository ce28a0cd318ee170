"""How ``kvsim dashboard`` starts Streamlit, from a checkout or from an installed wheel.

Streamlit runs ENTRY_SCRIPT, a file inside the package, and puts that file's folder first on
sys.path. The folder holds nothing but the script, so no sub-package of kvsim (``kernels``,
``allocator``...) becomes a top-level import name in the dashboard's process, where it would
shadow Hugging Face's ``kernels``. The repository's ``.streamlit/config.toml`` is not beside an
installed wheel, so its settings are passed as flags (a test keeps the two equal).
"""
from __future__ import annotations

import sys
from pathlib import Path

from kvsim.dashboard.sources import MAX_UPLOAD_MB
from kvsim.viz.style import ALLOCATOR_COLORS

ENTRY_SCRIPT = Path(__file__).resolve().parent / "entry" / "kvsim_dashboard.py"

STREAMLIT_OPTIONS = {
    "browser.gatherUsageStats": False,          # no telemetry calls from a local tool
    "client.toolbarMode": "viewer",             # no "Deploy" button: a local tool
    "server.maxUploadSize": MAX_UPLOAD_MB,      # MB; the trace uploader caps itself the same
    "theme.primaryColor": ALLOCATOR_COLORS["paged"],  # the paged allocator's colour
}


def _flag_value(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def streamlit_command(port: int, headless: bool) -> list[str]:
    """The command line that serves the dashboard on ``port`` (checked by ``kvsim dashboard``)."""
    options = {**STREAMLIT_OPTIONS, "server.port": port, "server.headless": headless}
    return [sys.executable, "-m", "streamlit", "run", str(ENTRY_SCRIPT),
            *(arg for key, value in options.items() for arg in (f"--{key}", _flag_value(value)))]
