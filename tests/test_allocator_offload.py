"""The offload tier (vLLM's CPUOffloadingManager with LRU): states, eviction order, vs vLLM."""
import subprocess

import pytest

from kvsim.allocator.offload import HIT, MISS, PENDING, OffloadTier
from test_allocator_vs_vllm import ROOT, vllm_python


def _store(tier, rid, keys, start=0):
    out = tier.prepare_store(rid, keys, list(range(start, start + len(keys))))
    if out is not None:
        tier.complete_store(out[0])
    tier.check_invariants()
    return out


def test_chunks_are_pending_until_their_copy_completes():
    tier = OffloadTier(4)
    stored, evicted = tier.prepare_store("a", [1, 2], [0, 1])
    assert (stored, evicted) == ([1, 2], [])
    assert tier.lookup(1) == PENDING and tier.lookup(3) == MISS
    assert tier.prepare_store("b", [1, 2, 3], [0, 1, 2]) == ([3], [])   # 1, 2 are there already
    tier.complete_store([1, 2])
    assert tier.lookup(1) == HIT and tier.lookup(3) == PENDING
    assert tier.num_pending == 1 and tier.num_evictable == 2
    tier.check_invariants()


def test_a_finished_request_is_most_recent_with_its_tail_evicted_first():
    tier = OffloadTier(4)
    _store(tier, "a", [1, 2])
    tier.request_finished("a")
    _store(tier, "b", [5, 6])
    tier.request_finished("b")
    # a's chunks are older than b's; within a, the tail (2) goes before the head (1)
    assert _store(tier, "c", [9]) == ([9], [2])
    assert _store(tier, "d", [8]) == ([8], [1])
    tier.request_finished("c")
    tier.request_finished("d")
    assert _store(tier, "e", [7]) == ([7], [6])


def test_reading_a_chunk_moves_it_up_when_the_reader_finishes():
    tier = OffloadTier(3)
    _store(tier, "a", [1, 2, 3])
    tier.request_finished("a")
    tier.prepare_load("b", [1, 2], [0, 1])       # pinned while it is read
    assert tier.prepare_store("c", [7, 8, 9], [0, 1, 2]) is None    # only 3 is evictable
    tier.complete_load([1, 2])
    tier.request_finished("b")
    assert _store(tier, "c", [7]) == ([7], [3])  # 1 and 2 were used after 3
    with pytest.raises(ValueError, match="not ready"):
        tier.prepare_load("d", [7, 99], [0, 1])


def test_an_offer_never_evicts_its_own_chunks_and_fails_whole():
    tier = OffloadTier(2)
    _store(tier, "a", [1, 2])
    tier.request_finished("a")
    # the offer holds 1 and 2 (already stored) and 3: the only evictable chunks are its own
    assert tier.prepare_store("b", [1, 2, 3], [0, 1, 2]) is None
    assert tier.keys() == [1, 2] and tier.num_failed_stores == 1
    assert tier.prepare_store("b", [3], [2]) == ([3], [2])
    tier.check_invariants()


def test_a_zero_chunk_tier_stores_nothing():
    tier = OffloadTier(0)
    assert tier.prepare_store("a", [1], [0]) is None
    assert tier.prepare_store("a", [], []) == ([], [])
    with pytest.raises(ValueError, match="num_chunks"):
        OffloadTier(-1)


@pytest.mark.slow
def test_offload_tier_decisions_equal_vllm_cpu_offloading_manager():
    python = vllm_python()
    if python is None:
        pytest.skip("no interpreter with vLLM ($KVSIM_VLLM_PYTHON or ../oracle-venv)")
    result = subprocess.run([python, str(ROOT / "tests" / "vllm_offload_driver.py"),
                             "--seeds", "8", "--steps", "400"],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert result.stdout.count("equal over 400 ops") == 8, result.stdout
