"""Sizes a user gives are checked against the memory they would take before anything is allocated.

The footprint terms (simulator.footprint) are measured again here and must be upper bounds; a
refused size returns at once, on one line, having allocated almost nothing (RSS measured in a
subprocess).
"""
from __future__ import annotations

import gc
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from kvsim import workloads
from kvsim.allocator import PagedAllocator
from kvsim.errors import InputError
from kvsim.simulator import footprint
from kvsim.simulator.config import EngineConfig
from kvsim.simulator.recorder import RequestLog

ROOT = Path(__file__).resolve().parent.parent


def _traced(build):
    gc.collect()
    tracemalloc.start()
    try:
        keep = build()
        return tracemalloc.get_traced_memory()[1], keep
    finally:
        tracemalloc.stop()


def test_a_paged_pool_full_of_cached_blocks_stays_under_its_term():
    n, blocks_per_seq = 50_000, 64
    rng = random.Random(0)
    hashes = [[rng.getrandbits(63) for _ in range(blocks_per_seq)] for _ in range(n // blocks_per_seq)]

    def fill():
        pool = PagedAllocator(n, 16, enable_prefix_caching=True, null_block=True)
        for seq_id, keys in enumerate(hashes):   # every block keyed, then freed: all cached
            if pool.num_free_blocks >= blocks_per_seq:
                pool.allocate(seq_id, blocks_per_seq * 16, block_hashes=keys)
        for seq_id in list(pool.seq_ids):
            pool.free(seq_id)
        return pool

    peak, pool = _traced(fill)
    assert pool.pool.num_cached_blocks > 0.9 * n
    assert peak <= footprint.BYTES_PER_BLOCK * n
    snap_peak, _ = _traced(pool.snapshot)
    assert snap_peak <= footprint.BYTES_PER_SNAPSHOT_CELL * n


def test_an_offload_tier_full_of_chunks_stays_under_its_term():
    """A CPU tier filled three times over (offers, completions, evictions, request finishes):
    what it keeps per chunk stays under BYTES_PER_TIER_CHUNK."""
    from kvsim.allocator.offload import OffloadTier

    n, per_request = 50_000, 64
    rng = random.Random(0)
    offers = [[rng.getrandbits(63) for _ in range(per_request)] for _ in range(3 * n // per_request)]

    def fill():
        tier = OffloadTier(n)
        for rid, keys in enumerate(offers):
            placed = tier.prepare_store(rid, keys, list(range(per_request)))
            assert placed is not None
            tier.complete_store(placed[0])
            tier.request_finished(rid)
        return tier

    peak, tier = _traced(fill)
    assert tier.num_used == n and tier.num_evicted > n
    assert peak <= footprint.BYTES_PER_TIER_CHUNK * n


def test_request_rows_and_held_requests_stay_under_their_terms():
    n = 20_000
    row = dict(request_id=1, replica=0, arrival_s=1.0, first_sched_s=1.0, first_token_s=1.0,
               finish_s=2.0, ttft_s=0.1, tpot_s=0.01, e2e_s=1.0, prompt_tokens=100,
               output_tokens=10, num_output=10, num_samples=1, num_preemptions=0,
               cached_tokens_first=0, cached_tokens_total=0, arrival_step=-1,
               first_sched_step=1, first_token_step=2, finish_step=3, rejected=0,
               client_queue_s=0.0)

    def rows():
        log = RequestLog()
        for i in range(n):
            log.add(**{**row, "request_id": i})
        return log

    assert _traced(rows)[0] <= footprint.BYTES_PER_REQUEST_ROW * n
    spec = "sharegpt:rate=1,system=512,turns=uniform(1,6),think_s=30,n=20000,seed=1"
    peak, held = _traced(lambda: list(workloads.load(spec)))
    assert len(held) == n and peak <= footprint.BYTES_PER_REQUEST * n


def test_the_check_refuses_above_the_memory_and_names_the_largest_terms():
    config = EngineConfig(num_blocks=10**6)
    terms = footprint.memory_terms(config, num_snapshots=3)
    assert terms["pool"] == 10**6 * footprint.BYTES_PER_BLOCK
    assert terms["snapshots"] == 3 * 10**6 * footprint.BYTES_PER_SNAPSHOT_CELL
    total = sum(terms.values())
    assert footprint.check_memory(terms, available_bytes=total) == total
    with pytest.raises(InputError, match=r"^a run would need 35[0-9.]* MiB of memory \(pool 267\.0 MiB, "
                                         r"snapshots 91\.6 MiB\), more than the 1\.0 MiB available$"):
        footprint.check_memory(terms, "a run", available_bytes=2**20)
    # the workload's size: a spec's n=, or its rate x duration
    size = workloads.workload_size("sharegpt:rate=2,duration_s=100,seed=0")
    assert 150 < size["num_requests"] < 250 and size["duration_s"] == 100
    assert workloads.workload_size("alpaca:rate=5,samples=4,n=30")["max_fanout"] == 4
    assert footprint.available_memory_bytes() > 0


# (arguments after `kvsim`) that would take terabytes; each refused in one line
HUGE = {
    "num-blocks": ["replay", "sharegpt:rate=2,n=10", "--num-blocks", "10000000000"],
    "kv-tokens": ["compare", "sharegpt:rate=2,n=10", "--kv-tokens", "100000000000000"],
    "n=": ["replay", "sharegpt:rate=2,n=100000000000", "--num-blocks", "1000"],
    "samples=": ["replay", "alpaca:rate=2,n=10,samples=10000000000", "--num-blocks", "1000"],
    "sample interval": ["replay", "sharegpt:rate=2,n=100", "--num-blocks", "1000",
                        "--sample-interval-s", "1e-9"],
    "custom GPU": ["replay", "sharegpt:rate=2,n=10", "--gpu-memory-gib", "1e9",
                   "--gpu-bandwidth-gbps", "1000", "--gpu-tflops", "100"],
    "snapshots": ["replay", "sharegpt:rate=2,n=10", "--num-blocks", "100000000",
                  "--snapshot-times-s", ",".join(str(t) for t in range(200))],
    "plan n=": ["plan", "sharegpt:rate=2,n=100000000000"],
    # issue 18: a CPU tier's chunks, and the requests the hit-rate curve holds
    "cpu tier": ["replay", "sharegpt:rate=2,n=10", "--num-blocks", "1000", "--cpu-offload-gib", "1e9"],
    "disk tier": ["replay", "sharegpt:rate=2,n=10", "--num-blocks", "1000", "--cpu-offload-gib", "8",
                  "--disk-offload-gib", "1e9", "--disk-bandwidth-gbps", "2"],
    "cache-curve n=": ["cache-curve", "sharegpt:rate=2,n=100000000000"],
    "capacity n=": ["capacity", "sharegpt:rate=2,n=100000000000"],
}


def test_refused_sizes_return_at_once_with_little_memory():
    """Each in its own process: exit 2, one line with the memory it would need, and a peak RSS
    of a fresh interpreter with kvsim imported (far below what the sizes would take)."""
    code = ("import resource, subprocess, sys\n"
            "p = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)\n"
            "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
            "sys.stderr.write(p.stderr)\n")
    for name, argv in HUGE.items():
        quiet = ["--quiet"] if argv[0] in ("replay", "compare", "plan") else []
        out = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "kvsim.cli", *argv,
                              *quiet], capture_output=True, text=True, cwd=ROOT, timeout=180)
        rc, rss_kib = (int(v) for v in out.stdout.split())
        assert rc == 2, (name, out.stderr)
        assert out.stderr.startswith("kvsim: error: ") and out.stderr.count("\n") == 1, (name, out.stderr)
        assert "would need" in out.stderr and "GiB of memory" in out.stderr, (name, out.stderr)
        assert rss_kib < 600 * 1024, (name, rss_kib)   # KiB: under 600 MiB
