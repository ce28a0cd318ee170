"""kvsim's GroupedPagedAllocator against vLLM 0.33's own KVCacheManager with hybrid KV-cache
groups (sliding window, Mamba state, full attention), call by call: runs
tests/vllm_hybrid_driver.py under an interpreter with vLLM; skipped without one (CI replays the
golden files instead: tests/test_grouped_golden.py)."""
import pytest

from hybrid_requests import CONFIGS
from test_allocator_vs_vllm import run_vllm_driver


@pytest.mark.slow
def test_grouped_allocator_decisions_equal_vllm_hybrid_manager():
    stdout = run_vllm_driver("vllm_hybrid_driver.py", "--seeds", "2", "--steps", "200",
                             timeout_s=900)
    assert stdout.count("equal over 200 steps") == 2 * 2 * len(CONFIGS), stdout


@pytest.mark.slow
def test_skipping_decodes_that_change_nothing_keeps_the_decisions():
    # kvsim is not told the decodes decode_changes_state rules out; vLLM is told every one
    stdout = run_vllm_driver("vllm_hybrid_driver.py", "--seeds", "2", "--steps", "200",
                             "--lazy", timeout_s=900)
    assert stdout.count("equal over 200 steps") == 2 * 2 * len(CONFIGS), stdout
    skipped = [int(w.split("=")[1]) for w in stdout.split() if w.startswith("skipped=")]
    assert sum(skipped) > 1000, skipped           # the skipping was exercised


@pytest.mark.slow
def test_tokens_loaded_by_a_connector_get_vllms_blocks_in_every_group():
    # allocate_slots(num_external_computed_tokens=..., delay_cache_blocks=True,
    # reserved_blocks=...), the load's cache_blocks, then the loaded request's own chunk
    stdout = run_vllm_driver("vllm_hybrid_driver.py", "--seeds", "2", "--steps", "200",
                             "--external", "--configs", "full_sliding", "gemma_like",
                             "sliding_only", timeout_s=900)
    assert stdout.count("equal over 200 steps") == 2 * 2 * 3, stdout
    loads = [int(w.split("=")[1]) for w in stdout.split() if w.startswith("loads=")]
    assert sum(loads) > 50, loads                 # loads were exercised
