"""Regenerate the golden fixtures of tests/fixtures/oracle/ from vLLM's own scheduler.

Each case is a small trace (written here, deterministic by seed) plus the oracle arguments that
exercise one scheduling or allocation rule of vLLM 0.33 (see docs/FIDELITY.md). The oracle
(../shared/tools/vllm_oracle/oracle.py, run in its own venv) replays the trace through vLLM's
unmodified v1 Scheduler + KVCacheManager; its steps.csv / requests.csv / summary.json are trimmed
to the columns the golden test compares and committed next to the trace, with a manifest.json
that maps each case to its oracle arguments.

Usage (about 10 s per case, mostly vLLM's imports):
    python bench/make_oracle_fixtures.py [--only CASE ...] [--venv /work/oracle-venv]
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.fidelity_diff import (  # noqa: E402
    FIXTURE_DIR,
    ORACLE_DIR,
    ORACLE_ENV,
    REQUEST_FIELDS,
    STEP_FIELDS,
    find_oracle_python,
    oracle_cli_args,
)

TRACE_FIELDS = ["arrival_step", "prompt_tokens", "output_tokens", "prefix_group", "prefix_len"]


@dataclass(frozen=True)
class Case:
    """One golden case: a trace recipe and the oracle's arguments."""

    name: str
    description: str
    trace: str  # key of TRACES
    oracle_args: dict = field(default_factory=dict)


def _lognormal_int(rng: random.Random, mean: float, lo: int, hi: int, sigma: float = 0.6) -> int:
    mu = math.log(mean) - sigma * sigma / 2.0
    return max(lo, min(hi, int(round(rng.lognormvariate(mu, sigma)))))


def _poisson_rows(seed: int, num_requests: int, rate_per_step: float, prompt_mean: float,
                  output_mean: float, prompt_max: int = 4096, output_max: int = 2048,
                  prompt_min: int = 1) -> list[list]:
    rng = random.Random(seed)
    t = 0.0
    rows = []
    for _ in range(num_requests):
        t += rng.expovariate(rate_per_step)
        p = _lognormal_int(rng, prompt_mean, prompt_min, prompt_max)
        o = _lognormal_int(rng, output_mean, 1, output_max)
        rows.append([int(t), p, o, "", ""])
    return rows


def trace_basic() -> list[list]:
    # light load, no sharing: timing of first token / finish without any pressure
    return _poisson_rows(seed=11, num_requests=80, rate_per_step=0.5, prompt_mean=200,
                         output_mean=40)


def trace_chunked() -> list[list]:
    # long prompts against a small token budget: every prompt is split into several chunks,
    # and decodes of earlier requests share each step with the chunks
    return _poisson_rows(seed=12, num_requests=40, rate_per_step=0.08, prompt_mean=1500,
                         output_mean=25, prompt_max=4000)


def trace_prefix_groups() -> list[list]:
    """Several prefix groups whose shared part is shorter than, equal to, and longer than a
    block, requests whose whole prompt is the shared prefix (the last-token cap), same-step
    bursts (hits on blocks cached earlier in the same step) and unique requests."""
    rng = random.Random(13)
    groups = [("short", 10), ("one", 16), ("mid", 100), ("long", 600), ("b2", 47)]
    rows = []
    t = 0
    for i in range(150):
        if i % 10 == 0:
            t += rng.randint(0, 1)  # bursts: several arrivals in the same step
        else:
            t += int(rng.expovariate(0.7))
        own = _lognormal_int(rng, 150, 1, 1500)
        out = _lognormal_int(rng, 30, 1, 300)
        pick = rng.random()
        if pick < 0.15:
            rows.append([t, own, out, "", ""])
            continue
        name, plen = groups[rng.randrange(len(groups))]
        if rng.random() < 0.08:
            own = 0  # prompt == shared prefix: the hit is capped at prompt_tokens - 1
        rows.append([t, plen + own, out, name, plen])
    return rows


def trace_storm() -> list[list]:
    # long outputs into a tiny pool: preemption storms, re-admissions hitting their own blocks
    return _poisson_rows(seed=14, num_requests=100, rate_per_step=0.5, prompt_mean=150,
                         output_mean=120, output_max=600)


def trace_long_prompts_small_pool() -> list[list]:
    # prompts that need a large part of the pool: with --no-reserve-full-isl a request is
    # admitted for its first chunk only and may be preempted mid-prefill
    return _poisson_rows(seed=15, num_requests=40, rate_per_step=0.1, prompt_mean=700,
                         output_mean=60, prompt_max=1800)


def trace_long_prefill() -> list[list]:
    rows = _poisson_rows(seed=16, num_requests=50, rate_per_step=0.05, prompt_mean=1000,
                         output_mean=30, prompt_max=4000)
    # a lone request long after the others: the threshold is not applied when the request is
    # the only one running or waiting
    last = rows[-1][0]
    rows.append([last + 400, 1500, 5, "", ""])
    return rows


def trace_max_model_len() -> list[list]:
    # prompt + output often exceeds max_model_len 400: the output is cut at the cap
    rng = random.Random(17)
    rows = []
    t = 0
    for _ in range(60):
        t += int(rng.expovariate(0.3))
        p = rng.randint(20, 380)
        o = rng.randint(1, 300)
        rows.append([t, p, o, "", ""])
    return rows


def trace_burst() -> list[list]:
    # everything arrives in a few bursts: FCFS order among same-step arrivals, max_num_seqs
    rng = random.Random(18)
    rows = []
    for burst_step in (0, 5, 60, 61, 200):
        for _ in range(12):
            rows.append([burst_step, _lognormal_int(rng, 120, 1, 800),
                         _lognormal_int(rng, 25, 1, 200), "", ""])
    return rows


def trace_custom_ids() -> list[list]:
    """Sparse, non-sequential request ids (the optional request_id column), equal arrival
    steps (file order decides FCFS) and a prefix group, in a pool that preempts."""
    rng = random.Random(19)
    rows = []
    for i in range(40):
        rid = 1000 + 7 * ((i * 13) % 40)
        grp = "x" if i % 3 == 0 else ""
        rows.append([rng.randint(0, 60), rng.randint(10, 300), rng.randint(1, 80), grp,
                     40 if grp else "", rid])
    rows.sort(key=lambda r: r[0])  # stable: equal steps keep file order
    return rows


def trace_big_prompts() -> list[list]:
    """Prompts of 57-62 blocks arriving into an empty 63-block pool, each followed in the same
    step by small requests: vLLM admits the big one without the watermark (nothing running)
    and the small ones with it."""
    rng = random.Random(20)
    rows = []
    for i in range(12):
        step = 100 * i
        rows.append([step, rng.randint(900, 990), rng.randint(1, 10), "", ""])
        for _ in range(rng.randint(0, 2)):
            rows.append([step, rng.randint(20, 120), rng.randint(1, 30), "", ""])
    return rows


def trace_short_outputs() -> list[list]:
    """Outputs of 1-3 tokens into a small pool, in bursts: under async scheduling a request
    whose in-flight step samples its last token is not scheduled again but keeps its blocks and
    its place in ``running`` until that step's output is processed (one step later), so
    admissions wait, steps schedule nothing while a step is in flight, and such requests can
    be preempted after their last token was sampled."""
    rng = random.Random(21)
    rows = []
    t = 0
    for i in range(120):
        t += rng.randint(0, 2) if i % 8 else rng.randint(3, 12)
        rows.append([t, _lognormal_int(rng, 220, 1, 700), rng.randint(1, 3), "", ""])
    return rows


def trace_mixed_outputs() -> list[list]:
    """Very short and long outputs mixed in a 40-block pool: under async scheduling the request
    admitted last is often one whose in-flight step samples its last token, so it is preempted
    (and counted) although it needs nothing more, and finishes while waiting."""
    rng = random.Random(22)
    rows = []
    t = 0
    for _ in range(90):
        t += rng.randint(0, 3)
        rows.append([t, rng.randint(20, 200), rng.choice([1, 2, 2, 3, 40, 80, 150]), "", ""])
    return rows


def trace_closed_loop() -> list[list]:
    """vllm bench serve's random dataset, all due at step 0 (its rate inf): inputs 200 +- 50 %
    behind one 64-token prefix (its --random-prefix-len), outputs 30 +- 50 %; a closed loop's
    --max-concurrency then sends them."""
    rng = random.Random(31)
    return [[0, 64 + rng.randint(100, 300), rng.randint(15, 45), "prefix", 64] for _ in range(70)]


def trace_closed_loop_rate() -> list[list]:
    """Due at Poisson steps (about one in three), inputs 100-900, outputs 5-60, no sharing."""
    rng = random.Random(32)
    rows, t = [], 0
    for _ in range(60):
        t += int(rng.expovariate(1 / 3))
        rows.append([t, rng.randint(100, 900), rng.randint(5, 60), "", ""])
    return rows


def random_offload_trace(seed: int, index: int, kv_groups: bool = False,
                         mamba: bool = False) -> list[list]:
    """The trace of bench/fidelity_offload.py's random case ``random_s{seed}_c{index}`` (with
    ``kv_groups``: of ``--kv-groups``, ``random_s{seed}_c{index}_groups``; with ``mamba``: of
    ``--mamba``, ``random_s{seed}_c{index}_mamba``)."""
    # here: it imports this module
    from bench.fidelity_offload import (random_grouped_offload_case, random_mamba_offload_case,
                                        random_offload_case)

    draw = random_grouped_offload_case if kv_groups else \
        random_mamba_offload_case if mamba else random_offload_case
    rng = random.Random(seed)
    for _ in range(index + 1):
        rows, _ = draw(rng)
    return rows


TRACES = {
    "offload_s0_c17": lambda: random_offload_trace(0, 17),
    "offload_s1_c12": lambda: random_offload_trace(1, 12),
    "offload_groups_s0_c18": lambda: random_offload_trace(0, 18, kv_groups=True),
    "offload_groups_s1_c44": lambda: random_offload_trace(1, 44, kv_groups=True),
    "offload_mamba_s1_c58": lambda: random_offload_trace(1, 58, mamba=True),
    "basic": trace_basic,
    "chunked": trace_chunked,
    "prefix_groups": trace_prefix_groups,
    "storm": trace_storm,
    "long_prompts_small_pool": trace_long_prompts_small_pool,
    "long_prefill": trace_long_prefill,
    "max_model_len": trace_max_model_len,
    "burst": trace_burst,
    "custom_ids": trace_custom_ids,
    "big_prompts": trace_big_prompts,
    "short_outputs": trace_short_outputs,
    "mixed_outputs": trace_mixed_outputs,
    "closed_loop": trace_closed_loop,
    "closed_loop_rate": trace_closed_loop_rate,
}

# oracle defaults (oracle.py): block 16, max_num_seqs 128, max_num_batched_tokens 2048,
# max_model_len 8192, prefix caching on, threshold 0, reserve_full_isl on, watermark 0
CASES = [
    Case("basic", "light load, no sharing, prefix caching on: plain timing",
         "basic", {"num_gpu_blocks": 2000}),
    Case("chunked_prefill", "long prompts chunked by a 512-token budget, decodes mixed in",
         "chunked", {"num_gpu_blocks": 4000, "max_num_batched_tokens": 512,
                     "max_num_seqs": 32, "prefix_caching": "off"}),
    Case("prefix_groups", "prefix groups of 10/16/47/100/600 tokens, bursts, full-prompt hits",
         "prefix_groups", {"num_gpu_blocks": 600}),
    Case("prefix_groups_pc_off", "the prefix_groups trace with prefix caching off",
         "prefix_groups", {"num_gpu_blocks": 600, "prefix_caching": "off"}),
    Case("prefix_groups_block32", "the prefix_groups trace with 32-token blocks",
         "prefix_groups", {"num_gpu_blocks": 300, "block_size": 32}),
    Case("preemption_storm", "tiny pool, long outputs: preemptions, resumed own-block hits",
         "storm", {"num_gpu_blocks": 120, "max_num_seqs": 64}),
    Case("preemption_storm_pc_off", "the storm with prefix caching off (full recompute)",
         "storm", {"num_gpu_blocks": 120, "max_num_seqs": 64, "prefix_caching": "off"}),
    Case("watermark", "the storm with watermark 0.05 (int(0.05*120)=6 blocks kept free)",
         "storm", {"num_gpu_blocks": 120, "max_num_seqs": 64, "watermark": 0.05}),
    Case("no_reserve_full_isl", "first-chunk admission: mid-prefill preemptions",
         "long_prompts_small_pool", {"num_gpu_blocks": 150, "max_num_batched_tokens": 256,
                                     "no_reserve_full_isl": True}),
    Case("reserve_full_isl", "the same trace with vLLM's default full-prompt admission",
         "long_prompts_small_pool", {"num_gpu_blocks": 150, "max_num_batched_tokens": 256}),
    Case("long_prefill_threshold", "long_prefill_token_threshold 128, budget 1024",
         "long_prefill", {"num_gpu_blocks": 3000, "max_num_batched_tokens": 1024,
                          "long_prefill_token_threshold": 128, "prefix_caching": "off"}),
    Case("max_model_len_cap", "max_model_len 400: outputs cut at the cap",
         "max_model_len", {"num_gpu_blocks": 300, "max_model_len": 400}),
    Case("prefix_groups_storm", "prefix groups in a small pool: shared blocks under preemption",
         "prefix_groups", {"num_gpu_blocks": 160, "max_num_seqs": 64}),
    Case("watermark_empty_engine", "watermark 0.1 (6 blocks) skipped for the first admission",
         "big_prompts", {"num_gpu_blocks": 64, "watermark": 0.1}),
    Case("mixed_knobs", "threshold 64 + watermark 0.02 + first-chunk admission, small pool",
         "long_prompts_small_pool", {"num_gpu_blocks": 150, "max_num_batched_tokens": 256,
                                     "long_prefill_token_threshold": 64, "watermark": 0.02,
                                     "no_reserve_full_isl": True}),
    Case("custom_ids", "request_id column with sparse ids, same-step arrivals, small pool",
         "custom_ids", {"num_gpu_blocks": 60, "max_num_seqs": 8}),
    Case("max_num_seqs", "bursts into max_num_seqs 4 (budget 256)",
         "burst", {"num_gpu_blocks": 1000, "max_num_seqs": 4, "max_num_batched_tokens": 256}),
    Case("short_outputs", "outputs of 1-3 tokens in bursts into a 64-block pool",
         "short_outputs", {"num_gpu_blocks": 64, "max_num_seqs": 16}),
    Case("mixed_outputs", "outputs of 1-3 and 40-150 tokens mixed, 40-block pool",
         "mixed_outputs", {"num_gpu_blocks": 40, "max_num_seqs": 16}),
    # closed loops (bench/closed_loop_oracle.py: a client with at most C requests in flight)
    Case("closed_loop", "concurrency 8 below max_num_seqs, one shared prefix: prefix hits",
         "closed_loop", {"num_gpu_blocks": 2000, "max_concurrency": 8}),
    Case("closed_loop_pc_off", "the closed loop with prefix caching off",
         "closed_loop", {"num_gpu_blocks": 2000, "max_concurrency": 8, "prefix_caching": "off"}),
    Case("closed_loop_over_max_num_seqs", "concurrency 24 above max_num_seqs 8: the engine queues",
         "closed_loop", {"num_gpu_blocks": 2000, "max_concurrency": 24, "max_num_seqs": 8,
                         "max_num_batched_tokens": 512}),
    Case("closed_loop_small_pool", "concurrency 32 into a 160-block pool: preemptions",
         "closed_loop", {"num_gpu_blocks": 160, "max_concurrency": 32, "max_num_seqs": 64}),
    Case("closed_loop_rate", "due at Poisson steps, at most 4 in flight, prefix caching off",
         "closed_loop_rate", {"num_gpu_blocks": 1000, "max_concurrency": 4, "prefix_caching": "off",
                              "max_num_batched_tokens": 512}),
    # hybrid models (bench/hybrid_oracle.py: vLLM's HybridKVCacheCoordinator with these groups)
    Case("hybrid_sliding_prefix", "gpt-oss groups (window 128 + full): prefix hits, preemptions",
         "prefix_groups", {"num_gpu_blocks": 320, "max_num_seqs": 64,
                           "kv_groups": "sliding:128,full"}),
    Case("hybrid_sliding_storm", "window 32 + full in a tiny pool: windows free blocks, storms",
         "storm", {"num_gpu_blocks": 150, "max_num_seqs": 64, "kv_groups": "sliding:32,full"}),
    Case("hybrid_gemma_like", "three windows of 64 + full (Gemma 3's shape), prefix groups",
         "prefix_groups", {"num_gpu_blocks": 420, "max_num_seqs": 64,
                           "kv_groups": "sliding:64,sliding:64,sliding:64,full"}),
    Case("hybrid_mamba_prefix", "Mamba2 groups (prompt checkpoints) + full: block-boundary hits",
         "prefix_groups", {"num_gpu_blocks": 240, "max_num_seqs": 64,
                           "kv_groups": "mamba_ckpt,mamba_ckpt,full"}),
    Case("hybrid_mamba_storm", "Mamba + full in a tiny pool: state blocks under preemption",
         "storm", {"num_gpu_blocks": 150, "max_num_seqs": 64, "kv_groups": "mamba,full"}),
    Case("hybrid_gdn_block64", "Gated DeltaNet (checkpoints on the 64-token grid) + full",
         "prefix_groups", {"num_gpu_blocks": 130, "block_size": 64, "max_num_seqs": 64,
                           "kv_groups": "mamba_ckpt:64,full"}),
    Case("hybrid_mamba_pc_off", "Mamba + window + full without prefix caching (one state)",
         "prefix_groups", {"num_gpu_blocks": 300, "max_num_seqs": 64, "prefix_caching": "off",
                           "kv_groups": "mamba,sliding:100,full"}),
]
# a CPU tier (bench/offload_oracle.py: vLLM's OffloadingConnector, the worker stub completing
# transfers in `transfer_steps_per_chunk` steps per chunk; synchronous scheduling)
CASES += [
    Case("offload_prefix_groups", "CPU tier under a small pool: prefixes loaded back, stores queue",
         "prefix_groups", {"num_gpu_blocks": 200, "max_num_seqs": 64, "cpu_chunks": 400,
                           "transfer_steps_per_chunk": 1}),
    Case("offload_tiny_tier", "an 8-chunk tier: refused offers, offered again, evictions",
         "prefix_groups", {"num_gpu_blocks": 300, "max_num_seqs": 64, "cpu_chunks": 8,
                           "transfer_steps_per_chunk": 2}),
    Case("offload_storm", "preemptions flush pending stores; instant transfers",
         "storm", {"num_gpu_blocks": 150, "max_num_seqs": 64, "cpu_chunks": 300,
                   "transfer_steps_per_chunk": 0}),
    # two of bench/fidelity_offload.py's random cases, each the one that found a divergence
    Case("offload_lpt_holding", "random_s0_c0017: a loading request counts for the long-prefill "
         "threshold", "offload_s0_c17",
         {"block_size": 16, "cpu_chunks": 16, "long_prefill_token_threshold": 8,
          "max_num_batched_tokens": 2048, "max_num_seqs": 128, "num_gpu_blocks": 2358,
          "transfer_steps_per_chunk": 5, "watermark": 0.2}),
    Case("offload_empty_step_reschedules", "random_s1_c0012: a load found by an empty step's poll "
         "is scheduled at once", "offload_s1_c12",
         {"block_size": 16, "cpu_chunks": 1382, "long_prefill_token_threshold": 1,
          "max_model_len": 601, "max_num_batched_tokens": 2048, "max_num_seqs": 2,
          "num_gpu_blocks": 40, "transfer_steps_per_chunk": 0, "watermark": 0.05}),
    Case("offload_long_prefill", "loads beside chunked prompts under a long-prefill threshold",
         "prefix_groups", {"num_gpu_blocks": 250, "max_num_seqs": 64, "cpu_chunks": 600,
                           "long_prefill_token_threshold": 64, "watermark": 0.05,
                           "transfer_steps_per_chunk": 3}),
    # KV-cache groups with a CPU tier (HybridOffloadScheduler)
    Case("offload_hybrid_sliding", "window 128 + full with a CPU tier: windows' last blocks "
         "stored, loads into both groups, sliding-window flushes",
         "prefix_groups", {"num_gpu_blocks": 320, "max_num_seqs": 64, "cpu_chunks": 300,
                           "transfer_steps_per_chunk": 1, "kv_groups": "sliding:128,full"}),
    Case("offload_hybrid_gemma_like", "three windows of 64 + full, a small tier: refused offers",
         "prefix_groups", {"num_gpu_blocks": 420, "max_num_seqs": 64, "cpu_chunks": 120,
                           "transfer_steps_per_chunk": 2,
                           "kv_groups": "sliding:64,sliding:64,sliding:64,full"}),
    Case("offload_hybrid_storm", "window 32 + full in a tiny pool with a tier: preemptions "
         "flush stores, loads reserve blocks", "storm",
         {"num_gpu_blocks": 150, "max_num_seqs": 64, "cpu_chunks": 400,
          "transfer_steps_per_chunk": 0, "kv_groups": "sliding:32,full"}),
    Case("offload_hybrid_idle_arrival", "random_s0_c0018_groups: a request arriving as the "
         "engine goes idle is scheduled before the empty step that signals who finished",
         "offload_groups_s0_c18",
         {"block_size": 32, "cpu_chunks": 32, "kv_groups": "full,sliding:32",
          "max_model_len": 8192, "max_num_batched_tokens": 8192, "max_num_seqs": 128,
          "num_gpu_blocks": 943, "transfer_steps_per_chunk": 0}),
    Case("offload_hybrid_mamba", "Mamba2 (checkpoints) + full with a CPU tier: states handed "
         "over and stored alone, loads of one state block, loaded chunks cut at Mamba boundaries",
         "prefix_groups", {"num_gpu_blocks": 240, "max_num_seqs": 64, "cpu_chunks": 300,
                           "transfer_steps_per_chunk": 1, "kv_groups": "mamba_ckpt,full"}),
    Case("offload_hybrid_mamba_storm", "Mamba + window 32 + full in a tiny pool with a tier: "
         "preemptions drop states not handed over, flush the stores of those that were",
         "storm", {"num_gpu_blocks": 220, "max_num_seqs": 64, "cpu_chunks": 400,
                   "transfer_steps_per_chunk": 2, "kv_groups": "mamba,sliding:32,full"}),
    Case("offload_hybrid_loaded_at_capacity", "random_s1_c0058_mamba: a finished load is taken "
         "(its blocks cached) only when the waiting loop could run its request: with max_num_seqs "
         "running, not at all, so a Mamba state it caches defers a hit on it one step later",
         "offload_mamba_s1_c58",
         {"block_size": 8, "cpu_chunks": 837, "kv_groups": "mamba_ckpt,sliding:8,full",
          "max_model_len": 8192, "max_num_batched_tokens": 256, "max_num_seqs": 2,
          "num_gpu_blocks": 343, "prefix_caching": "on", "transfer_steps_per_chunk": 2}),
    Case("async_offload_hybrid_finish_window", "random_s1_c0044_groups_async: a finished "
         "request frees its window's old blocks before the rest (vLLM's _connector_finished), "
         "so block ids, and the stores that read them, follow vLLM's", "offload_groups_s1_c44",
         {"async_scheduling": True, "block_size": 8, "cpu_chunks": 32,
          "kv_groups": "full,sliding:29", "max_model_len": 467, "max_num_batched_tokens": 256,
          "max_num_seqs": 16, "num_gpu_blocks": 121, "transfer_steps_per_chunk": 2}),
]
# vLLM's GPU default: AsyncScheduler, 2 batches in flight (EngineCore.step_with_batch_queue).
# Each async case is a sync case above with --async-scheduling, under the name async_<case>.
ASYNC_OF = ["basic", "chunked_prefill", "prefix_groups", "preemption_storm",
            "preemption_storm_pc_off", "watermark", "no_reserve_full_isl",
            "long_prefill_threshold", "max_model_len_cap", "prefix_groups_storm",
            "watermark_empty_engine", "custom_ids", "max_num_seqs", "short_outputs",
            "mixed_outputs", "closed_loop", "closed_loop_over_max_num_seqs", "closed_loop_small_pool",
            # async scheduling over KV-cache groups (vLLM's default for a hybrid model on a GPU)
            "hybrid_sliding_prefix", "hybrid_sliding_storm", "hybrid_gemma_like",
            "hybrid_mamba_prefix", "hybrid_mamba_storm", "hybrid_gdn_block64",
            "hybrid_mamba_pc_off",
            # async scheduling with a CPU tier (AsyncOffloadScheduler)
            "offload_prefix_groups", "offload_tiny_tier", "offload_storm", "offload_lpt_holding",
            "offload_empty_step_reschedules", "offload_long_prefill",
            # async scheduling over KV-cache groups with a CPU tier (AsyncHybridOffloadScheduler)
            "offload_hybrid_sliding", "offload_hybrid_gemma_like", "offload_hybrid_storm",
            "offload_hybrid_mamba", "offload_hybrid_mamba_storm"]
CASES += [Case(f"async_{c.name}", f"async scheduling: {c.description}", c.trace,
               {**c.oracle_args, "async_scheduling": True})
          for c in CASES if c.name in ASYNC_OF]


def write_trace(path: Path, rows: list[list]) -> None:
    """Write a trace in the oracle's format; rows with a sixth value carry a request_id."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(TRACE_FIELDS + (["request_id"] if rows and len(rows[0]) > 5 else []))
        w.writerows(rows)


def _trim_csv(src: Path, dst: Path, columns: list[str]) -> None:
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(dst, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(columns)
        for row in rows:
            w.writerow([row[c] for c in columns])


def make_case(case: Case, oracle_python: str) -> dict:
    """Run the oracle on one case and write its trimmed outputs; returns the manifest entry."""
    case_dir = FIXTURE_DIR / case.name
    case_dir.mkdir(parents=True, exist_ok=True)
    trace_path = case_dir / "trace.csv"
    write_trace(trace_path, TRACES[case.trace]())
    args = dict(case.oracle_args)
    script, groups = ORACLE_DIR / "oracle.py", []
    if "cpu_chunks" in args:    # the oracle with vLLM's OffloadingConnector and a worker stub
        script = ROOT / "bench" / "offload_oracle.py"
        groups = ["--cpu-chunks", str(args.pop("cpu_chunks")), "--transfer-steps-per-chunk",
                  str(args.pop("transfer_steps_per_chunk", 1))]
        if "kv_groups" in args:
            groups += ["--kv-groups", args.pop("kv_groups")]
    elif "kv_groups" in args:   # the oracle with a hybrid model's KV-cache groups
        script, groups = ROOT / "bench" / "hybrid_oracle.py", ["--kv-groups", args.pop("kv_groups")]
    elif "max_concurrency" in args:    # the oracle driven by a closed-loop client
        script = ROOT / "bench" / "closed_loop_oracle.py"
        groups = ["--max-concurrency", str(args.pop("max_concurrency"))]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [oracle_python, str(script), "--trace", str(trace_path),
               "--out-dir", tmp, *groups, *oracle_cli_args(args)]
        run = subprocess.run(cmd, capture_output=True, text=True, env=ORACLE_ENV)
        if run.returncode != 0:
            raise SystemExit(f"oracle failed on {case.name}: {run.stderr.strip()[-2000:]}")
        print(f"{case.name}: {run.stdout.strip()}")
        _trim_csv(Path(tmp) / "steps.csv", case_dir / "steps.csv", STEP_FIELDS)
        _trim_csv(Path(tmp) / "requests.csv", case_dir / "requests.csv", REQUEST_FIELDS)
        full = json.loads((Path(tmp) / "summary.json").read_text())
    summary = {k: v for k, v in full["summary"].items() if k not in ("setup_s", "loop_s")}
    (case_dir / "summary.json").write_text(json.dumps(
        {"summary": summary, "effective_config": full["effective_config"]}, indent=1) + "\n")
    return {"description": case.description, "trace": f"{case.name}/trace.csv",
            "oracle_args": case.oracle_args}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="regenerate only these cases")
    ap.add_argument("--venv", help="the oracle's virtual environment (default: autodetect)")
    a = ap.parse_args(argv)
    py = find_oracle_python(a.venv)
    if py is None:
        raise SystemExit("vLLM oracle venv not found: build it with "
                         f"`bash {ORACLE_DIR}/setup.sh /work/oracle-venv`")
    manifest_path = FIXTURE_DIR / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    names = {c.name for c in CASES}
    unknown = set(a.only or ()) - names
    if unknown:
        raise SystemExit(f"unknown case(s) {sorted(unknown)}; known: {sorted(names)}")
    for case in CASES:
        if a.only and case.name not in a.only:
            continue
        manifest[case.name] = make_case(case, py)
    manifest = {c.name: manifest[c.name] for c in CASES if c.name in manifest}
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
