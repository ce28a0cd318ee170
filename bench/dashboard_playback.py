"""The live pool's playback in a real browser: time to first render and frames per second.

Runs tests/test_browser.py (Playwright on Debian's /usr/bin/chromium, never a downloaded browser)
with $KVSIM_PLAYBACK_REPORT set, and prints what it measured: the default scenario (512 blocks
beside an 8,192-token contiguous pool) and 131,072 blocks beside a 2,097,152-token contiguous pool
(3,000 ShareGPT-like requests at 40/s), frames per second at the player's 10, 30 and 60 frames/s
settings, and the seconds until the player first draws.

    python bench/dashboard_playback.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "playback.json"
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "browser", "-p", "no:cacheprovider",
                               str(ROOT / "tests" / "test_browser.py")], cwd=ROOT,
                              env={**os.environ, "KVSIM_PLAYBACK_REPORT": str(report)})
        if not report.exists():
            print("no measurements (is /usr/bin/chromium installed?)")
            return proc.returncode or 1
        figures = json.loads(report.read_text())
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
