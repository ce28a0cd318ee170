"""kvsim's PagedAllocator against vLLM 0.33's own KVCacheManager, step by step.

Runs tests/vllm_allocator_driver.py under an interpreter that has vLLM (the oracle venv built by
../shared/tools/vllm_oracle/setup.sh): $KVSIM_VLLM_PYTHON, else ../oracle-venv/bin/python.
Skipped when neither exists.
"""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def vllm_python() -> str | None:
    for candidate in (os.environ.get("KVSIM_VLLM_PYTHON"),
                      ROOT.parent / "oracle-venv" / "bin" / "python"):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    return None


def run_vllm_driver(script: str, *args: str, timeout_s: int = 600) -> str:
    """Run a driver in tests/ under the vLLM interpreter (skip without one); its stdout."""
    python = vllm_python()
    if python is None:
        pytest.skip("no interpreter with vLLM ($KVSIM_VLLM_PYTHON or ../oracle-venv)")
    result = subprocess.run([python, str(ROOT / "tests" / script), *args],
                            capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout


@pytest.mark.slow
def test_paged_allocator_decisions_equal_vllm_kv_cache_manager():
    stdout = run_vllm_driver("vllm_allocator_driver.py", "--seeds", "2", "--steps", "300")
    assert stdout.count("equal over 300 steps") == 6, stdout
