"""Decision fidelity with a CPU tier: kvsim against vLLM's scheduler with its OffloadingConnector.

vLLM 0.33's real Scheduler, KVCacheManager and OffloadingConnector (scheduler side), with a
worker stub that completes the load and store jobs on kvsim's transfer timing
(bench/offload_oracle.py), and `kvsim replay --step-clock --cpu-offload-gib ...` replay the
same traces; compared per request (first scheduled step, first token, finish step,
preemptions, cached tokens at first admission: GPU and CPU hits) and per step
(bench/fidelity_diff.py), and on the tier's totals (chunks loaded and stored, flush stalls).

Cases: the oracle's example trace b (half the requests share a 512-token prefix) at pools and
CPU tiers chosen to load, evict and flush, at 0, 1 and 4 steps per chunk; and --num-random
random traces (fidelity_fuzz's generator, then prefix groups that come back after the GPU has
evicted them, a CPU tier from a few chunks to more than the workload, 0-5 steps per chunk).
One KV-cache group; with --kv-groups, random cases over random groups (sliding windows of one
token to several blocks, with or without full attention; names end in _groups); with --mamba,
over groups with Mamba groups (names end in _mamba). Synchronous
scheduling, or vLLM's AsyncScheduler with --async-scheduling (case names end in _async). Outputs are cached
under runs/fidelity/offload/ (git-ignored).

Usage:
    python bench/fidelity_offload.py [--cases NAME ...] [--num-random 40] [--seed 0]
                                     [--async-scheduling] [--kv-groups | --mamba]
                                     [--oracle-only]
                                     [--jobs 2] [-v]
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.fidelity_fuzz import random_case  # noqa: E402
from bench.fidelity_hybrid import (case_parser, collect_cases, compare_cases,  # noqa: E402
                                   run_oracle_batch)
from bench.fidelity_diff import ORACLE_DEFAULTS  # noqa: E402
from bench.fidelity_vllm import RUNS  # noqa: E402

OFFLOAD = RUNS / "offload"
# (trace, GPU blocks, CPU chunks, steps per chunk)
NAMED = [("b", nb, chunks, k) for nb in (300, 1500) for chunks in (64, 2000) for k in (0, 1, 4)]


def named_cases() -> list[tuple[str, str, dict]]:
    """The NAMED cases; a pool too small for the oracle's default max_model_len gets the largest
    that fits, as vLLM 0.33 requires at start-up (also with num_gpu_blocks_override:
    kv_cache_planning's check against the usable blocks, the null block held back). With 300
    blocks and 8,192 a request grew to 4,785 tokens, was preempted and could never come back:
    the oracle stalled where vLLM would not have started."""
    block, default = ORACLE_DEFAULTS["block_size"], ORACLE_DEFAULTS["max_model_len"]
    return [(f"{trace}_nb{nb}_cpu{chunks}_k{k}", trace,
             {"num_gpu_blocks": nb, "cpu_chunks": chunks, "transfer_steps_per_chunk": k,
              **({"max_model_len": (nb - 1) * block} if (nb - 1) * block < default else {})})
            for trace, nb, chunks, k in NAMED]


def random_offload_case(rng: random.Random) -> tuple[list[list], dict]:
    """A random trace and configuration with a CPU tier: fidelity_fuzz's trace and pool, prefix
    caching on, and prompts that share prefixes often enough, and far enough apart, that the GPU
    has evicted them when they come back."""
    rows, args = random_case(rng)
    args["prefix_caching"] = "on"
    block = args["block_size"]
    groups = [(f"p{g}", rng.choice([block, 3 * block, rng.randint(1, 900)]))
              for g in range(rng.randint(2, 8))]
    share = rng.choice([0.3, 0.6, 0.9])
    for row in rows:
        if rng.random() < share:
            name, plen = rng.choice(groups)
            own = 0 if rng.random() < 0.2 else row[1]   # a whole prompt seen before
            row[1], row[3], row[4] = plen + own, name, plen
    longest = max(r[1] for r in rows)
    args["max_model_len"] = max(args["max_model_len"], longest + 1)
    need = max(-(-min(r[1] + r[2], args["max_model_len"]) // block) for r in rows)
    args["num_gpu_blocks"] = max(args["num_gpu_blocks"], need + 2)
    workload = sum(-(-r[1] // block) for r in rows)
    args["cpu_chunks"] = max(1, rng.choice([2, 16, workload // 8, workload // 2, 2 * workload]))
    args["transfer_steps_per_chunk"] = rng.choice([0, 0, 1, 1, 2, 5])
    return rows, args


def random_grouped_offload_case(rng: random.Random) -> tuple[list[list], dict]:
    """A random case with a CPU tier (``random_offload_case``) over random KV-cache groups: one
    to three sliding windows (from one token to several blocks), with full attention or not;
    the pool and the tier scaled by the number of groups (each group takes a block a block)."""
    rows, args = random_offload_case(rng)
    block = args["block_size"]
    groups = [f"sliding:{rng.choice([1, block - 1, block, 3 * block + 5, 128, 700])}"
              for _ in range(rng.choice([1, 1, 2, 3]))]
    if rng.random() < 0.85:
        groups.insert(rng.randrange(len(groups) + 1), "full")
    args["kv_groups"] = ",".join(groups)
    args["num_gpu_blocks"] = (args["num_gpu_blocks"] - 1) * len(groups) + 1
    args["cpu_chunks"] *= len(groups)
    return rows, args


def random_mamba_offload_case(rng: random.Random) -> tuple[list[list], dict]:
    """A random case with a CPU tier (``random_offload_case``) over groups with one or two Mamba
    groups (with or without prompt checkpoints), full attention (always: vLLM sizes a Mamba
    block off the attention page) and sometimes a sliding window."""
    rows, args = random_offload_case(rng)
    block = args["block_size"]
    groups = [rng.choice(["mamba", "mamba_ckpt"]) for _ in range(rng.choice([1, 1, 2]))]
    if rng.random() < 0.3:
        groups.append(f"sliding:{rng.choice([1, block, 3 * block + 5, 128])}")
    groups.insert(rng.randrange(len(groups) + 1), "full")
    args["kv_groups"] = ",".join(groups)
    args["num_gpu_blocks"] = (args["num_gpu_blocks"] - 1) * len(groups) + 1
    args["cpu_chunks"] *= len(groups)
    args.pop("no_reserve_full_isl", None)   # vLLM's Mamba prefix caching needs the gate
    return rows, args


def main(argv: list[str] | None = None) -> int:
    ap = case_parser(__doc__.splitlines()[0], 40, None)
    ap.add_argument("--async-scheduling", action="store_true",
                    help="every case under vLLM's AsyncScheduler (names end in _async)")
    ap.add_argument("--kv-groups", action="store_true",
                    help="random cases over random KV-cache groups (sliding windows, full "
                         "attention; names end in _groups); no named cases")
    ap.add_argument("--mamba", action="store_true",
                    help="random cases over groups with Mamba groups (names end in _mamba); "
                         "no named cases")
    a = ap.parse_args(argv)
    mode = ("_groups" if a.kv_groups else "_mamba" if a.mamba else "") + \
        ("_async" if a.async_scheduling else "")
    extra = {"async_scheduling": True} if a.async_scheduling else {}
    a.csv = a.csv or str(OFFLOAD / f"fidelity_offload{mode}.csv")
    draw = random_grouped_offload_case if a.kv_groups else \
        random_mamba_offload_case if a.mamba else random_offload_case
    cases = collect_cases([] if a.kv_groups or a.mamba else named_cases(), draw,
                          a.num_random, a.seed, OFFLOAD, a.cases, mode, extra)
    run_oracle_batch(cases, a.jobs, a.venv, workdir=OFFLOAD)
    if a.oracle_only:
        return 0
    return compare_cases(cases, "offload", a.csv, a.verbose, tier_differences)


def tier_differences(oracle_dir: Path, kvsim_dir: Path) -> list[str]:
    """The CPU tier's totals that differ: chunks loaded and stored, flush stall steps, and
    vLLM's connector counters (queries: num_tokens - GPU hit; hits: tokens loaded; first
    admissions and re-admissions after preemption apart)."""
    o = json.loads((oracle_dir / "summary.json").read_text())["summary"]["offload"]
    k = json.loads((kvsim_dir / "result.json").read_text())["offload"]
    chunk = k["tiers"][0]["chunk_bytes"]
    pairs = [("loaded_chunks", k["loaded_bytes"]["cpu"] / chunk),
             ("stored_chunks", k["stored_bytes"]["cpu"] / chunk),
             ("flush_stall_steps", k["flush_stall_s"]),
             ("connector_queries", k["query_tokens"]), ("connector_hits", k["hit_tokens"]["cpu"]),
             ("connector_preempted_queries", k["preempted_query_tokens"]),
             ("connector_preempted_hits", k["preempted_hit_tokens"])]
    return [f"{name} vllm={o.get(name)} kvsim={value:g}" for name, value in pairs
            if o.get(name) != value]


if __name__ == "__main__":
    sys.exit(main())
