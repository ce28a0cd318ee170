"""Shared test fixtures. TRITON_INTERPRET must be set before any kernel module is imported."""
import os
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACES = ROOT.parent / "shared" / "traces"


@pytest.fixture
def shared_traces() -> Path:
    """Path of ../shared/traces; skips the test cleanly when it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip("../shared/traces is absent")
    return SHARED_TRACES
