"""Allocator throughput: allocate / append / free operations per second, both allocator families.

Workload (seeded): prompts lognormal around 1k tokens, outputs around 200 tokens; 16-token blocks;
pool of 32768 blocks (512k tokens). Each round admits sequences until the pool is full, grows them
(one token per call, and one block per call as the simulator does), then frees them all (a quarter
as preemptions). With prefix caching, prompts start with one of 8 shared 512-token system prompts
and the rest is private content (SegmentKeys, as workloads produce).

Also prints the figure the simulator cares about: blocks allocated per second in a replay-like loop,
on the Azure LLM conversation trace (19,366 requests, ~1.6M blocks; read from ../shared/traces
when present) and on 19k synthetic requests with heavy prefix sharing, with lazy SegmentKeys and
with precomputed keys (to separate the allocator's own cost from the cost of computing keys).

Times are CPU seconds of this process (time.process_time), best of --repeat runs, so that other
processes on a shared machine inflate them less.

    python bench/allocator_ops.py [--rounds 4] [--repeat 3] [--seed 0]
"""
from __future__ import annotations

import argparse
import csv
import random
import time
from pathlib import Path

from kvsim.allocator import ContiguousAllocator, PagedAllocator, SegmentKeys

BLOCK_SIZE = 16
NUM_BLOCKS = 32768
MAX_MODEL_LEN = 4096
# read in place when present, never copied into the repository
AZURE_TRACE = (Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023"
               / "AzureLLMInferenceTrace_conv.csv")


def load_azure(path: Path) -> list[tuple[int, int]]:
    """(prompt, output) tokens per request of the Azure LLM inference trace (conv)."""
    with open(path, newline="") as f:
        return [(max(int(row["ContextTokens"]), 1), int(row["GeneratedTokens"]))
                for row in csv.DictReader(f)]


def make_requests(n: int, seed: int, shared: bool) -> list[tuple[int, int, SegmentKeys | None]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = min(int(rng.lognormvariate(6.9, 0.5)), 3000)        # median ~1k tokens
        output = min(int(rng.lognormvariate(5.3, 0.6)) + 1, MAX_MODEL_LEN - prompt)
        keys = None
        if shared:
            system = min(512, prompt)
            segments = [(rng.randrange(8), system)]
            if prompt + output > system:
                segments.append((1_000_000 + i, prompt + output - system))
            keys = SegmentKeys(segments, BLOCK_SIZE, num_shareable_tokens=system)
        out.append((max(prompt, 1), output, keys))
    return out


def run(alloc, requests, paged: bool) -> tuple[float, float, float, float]:
    """Operations per second: allocate, append(1), append(BLOCK_SIZE), free."""
    t_alloc = t_append1 = t_append_block = t_free = 0.0
    n_alloc = n_append1 = n_append_block = n_free = 0
    it = iter(range(len(requests)))
    for _ in range(ROUNDS):
        live = []
        t0 = time.process_time()
        for i in it:
            prompt, output, keys = requests[i]
            ok = (alloc.allocate(i, prompt, keys) if paged
                  else alloc.allocate(i, prompt, prompt + output))
            if not ok:
                break
            live.append(i)
        t_alloc += time.process_time() - t0
        n_alloc += len(live)
        t0 = time.process_time()
        for _step in range(8):                       # 8 decode steps, one token each
            for i in live:
                alloc.append(i, 1)
        t_append1 += time.process_time() - t0
        n_append1 += 8 * len(live)
        t0 = time.process_time()
        for i in live:                               # the simulator's block-boundary appends
            alloc.append(i, BLOCK_SIZE)
        t_append_block += time.process_time() - t0
        n_append_block += len(live)
        t0 = time.process_time()
        for j, i in enumerate(live):
            if paged:
                alloc.free(i, preempted=(j % 4 == 0))
            else:
                alloc.free(i)
        t_free += time.process_time() - t0
        n_free += len(live)
    return (n_alloc / t_alloc, n_append1 / t_append1, n_append_block / t_append_block,
            n_free / t_free)


ROUNDS = 4


class ListKeys(list):
    """Precomputed keys (a list indexes in C): separates allocator cost from key cost."""
    num_shareable_blocks = 0


def precompute(keys: SegmentKeys | None) -> ListKeys | None:
    if keys is None:
        return None
    out = ListKeys(keys[i] for i in range(len(keys)))
    out.num_shareable_blocks = keys.num_shareable_blocks
    return out


def replay_blocks_per_s(caching: bool, requests) -> tuple[int, float]:
    """Simulator-like loop: admit, grow block by block to the final length, finish.

    Returns the blocks allocated (prompt and output, hits excluded) and the seconds taken.
    """
    alloc = PagedAllocator(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=caching)
    live: list[tuple[int, int]] = []
    t0 = time.process_time()
    for i, (prompt, output, keys) in enumerate(requests):
        while not alloc.allocate(i, prompt, keys):
            alloc.free(live.pop(0)[0], preempted=True)   # make room: preempt the oldest
        live.append((i, output))
        if len(live) > 64:                              # the oldest request finishes
            j, remaining = live.pop(0)
            while remaining > 0:
                step = min(remaining, BLOCK_SIZE)
                if not alloc.append(j, step):
                    break
                remaining -= step
            alloc.free(j)
    for j, _ in live:
        alloc.free(j)
    seconds = time.process_time() - t0
    return alloc.pool.num_popped_blocks, seconds


def best_of(repeat: int, fn, *args):
    runs = [fn(*args) for _ in range(repeat)]
    return min(runs, key=lambda r: r[1])


def main() -> None:
    global ROUNDS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ROUNDS = args.rounds
    n = 2000 * ROUNDS
    plain = make_requests(n, args.seed, shared=False)
    shared = make_requests(n, args.seed, shared=True)
    print(f"ops/s, best of {args.repeat}; {NUM_BLOCKS} blocks x {BLOCK_SIZE} tokens, prompts "
          f"~1k tokens, {ROUNDS} fill/grow/free rounds")
    print(f"{'allocator':<34} {'allocate':>12} {'append(1)':>12} {'append(16)':>12} {'free':>12}")
    cap = NUM_BLOCKS * BLOCK_SIZE
    configs = [("paged, no prefix caching",
                lambda: PagedAllocator(NUM_BLOCKS, BLOCK_SIZE, False), plain, True),
               ("paged, prefix caching",
                lambda: PagedAllocator(NUM_BLOCKS, BLOCK_SIZE, True), shared, True)]
    for policy in ("oracle", "max"):
        for placement in ("buddy", "first-fit"):
            configs.append((f"contiguous {policy}, {placement}",
                            lambda p=policy, q=placement: ContiguousAllocator(
                                cap, p, MAX_MODEL_LEN, q), plain, False))
    for name, factory, reqs, paged in configs:
        rates = [run(factory(), reqs, paged) for _ in range(args.repeat)]
        best = [max(r[k] for r in rates) for k in range(4)]
        print(f"{name:<34} " + " ".join(f"{x:>12,.0f}" for x in best))
    print()
    if AZURE_TRACE.is_file():
        trace = load_azure(AZURE_TRACE)
        print(f"replay of {AZURE_TRACE.name} ({len(trace):,} requests; unique content: prefix "
              "hits only after preemptions)")
        for caching in (False, True):
            blocks, seconds = best_of(args.repeat, replay_blocks_per_s, caching, [
                (p, o, SegmentKeys([(i, p + o)], BLOCK_SIZE, num_shareable_tokens=0)
                 if caching else None) for i, (p, o) in enumerate(trace)])
            print(f"  prefix caching {'on ' if caching else 'off'}: {blocks:>9,} blocks in "
                  f"{seconds:.3f} s = {blocks / seconds:>10,.0f} blocks/s")
    print("synthetic 19k requests, every prompt starting with one of 8 shared 512-token prompts")
    reqs = make_requests(19_000, args.seed + 1, shared=True)
    for label, caching, keyed in [("prefix caching off", False, []),
                                  ("prefix caching on, SegmentKeys", True, reqs),
                                  ("prefix caching on, precomputed keys", True,
                                   [(p, o, precompute(k)) for p, o, k in reqs])]:
        rows = keyed or [(p, o, None) for p, o, _ in reqs]
        blocks, seconds = best_of(args.repeat, replay_blocks_per_s, caching, rows)
        print(f"  {label:<36}: {blocks:>9,} blocks in {seconds:.3f} s "
              f"= {blocks / seconds:>10,.0f} blocks/s")


if __name__ == "__main__":
    main()
