"""Allocator throughput: allocate / append / free operations per second, both allocator families.

Workload (seeded): prompts lognormal around 1k tokens, outputs around 200 tokens; 16-token blocks;
pool of 32768 blocks (512k tokens). Each round admits sequences until the pool is full, grows them
(one token per call, and one block per call as the simulator does), then frees them all (a quarter
as preemptions). With prefix caching, prompts start with one of 8 shared 512-token system prompts
and the rest is private content (SegmentKeys, as workloads produce).

Also prints the figure the simulator cares about: blocks allocated per second in a replay-like loop.

    python bench/allocator_ops.py [--rounds 4] [--seed 0]
"""
from __future__ import annotations

import argparse
import random
import time

from allocator import ContiguousAllocator, PagedAllocator, SegmentKeys

BLOCK_SIZE = 16
NUM_BLOCKS = 32768
MAX_MODEL_LEN = 4096


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


def run(name: str, alloc, requests, paged: bool) -> None:
    t_alloc = t_append1 = t_append_block = t_free = 0.0
    n_alloc = n_append1 = n_append_block = n_free = 0
    it = iter(range(len(requests)))
    for _ in range(ROUNDS):
        live = []
        t0 = time.perf_counter()
        for i in it:
            prompt, output, keys = requests[i]
            ok = (alloc.allocate(i, prompt, keys) if paged
                  else alloc.allocate(i, prompt, prompt + output))
            if not ok:
                break
            live.append(i)
        t_alloc += time.perf_counter() - t0
        n_alloc += len(live)
        t0 = time.perf_counter()
        for _step in range(8):                       # 8 decode steps, one token each
            for i in live:
                alloc.append(i, 1)
        t_append1 += time.perf_counter() - t0
        n_append1 += 8 * len(live)
        t0 = time.perf_counter()
        for i in live:                               # the simulator's block-boundary appends
            if alloc.append(i, BLOCK_SIZE):
                n_append_block += 1
            else:
                n_append_block += 1
        t_append_block += time.perf_counter() - t0
        t0 = time.perf_counter()
        for j, i in enumerate(live):
            if paged:
                alloc.free(i, preempted=(j % 4 == 0))
            else:
                alloc.free(i)
        t_free += time.perf_counter() - t0
        n_free += len(live)
    print(f"{name:<34} {n_alloc / t_alloc:>12,.0f} {n_append1 / t_append1:>12,.0f} "
          f"{n_append_block / t_append_block:>12,.0f} {n_free / t_free:>12,.0f}")


def replay_blocks_per_s(caching: bool, requests) -> tuple[int, float]:
    """Simulator-like loop: admit, grow block by block to the final length, finish."""
    alloc = PagedAllocator(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=caching)
    live: list[tuple[int, int]] = []
    num_blocks = 0
    t0 = time.perf_counter()
    for i, (prompt, output, keys) in enumerate(requests):
        while not alloc.allocate(i, prompt, keys if caching else None):
            j, remaining = live.pop(0)
            alloc.free(j)
        num_blocks += -(-prompt // BLOCK_SIZE)
        live.append((i, output))
        if len(live) > 64:                          # the oldest request finishes
            j, remaining = live.pop(0)
            while remaining > 0:
                step = min(remaining, BLOCK_SIZE)
                if not alloc.append(j, step):
                    break
                remaining -= step
            alloc.free(j)
    for j, _ in live:
        alloc.free(j)
    return num_blocks, time.perf_counter() - t0


ROUNDS = 4


def main() -> None:
    global ROUNDS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ROUNDS = args.rounds
    n = 2000 * ROUNDS
    plain = make_requests(n, args.seed, shared=False)
    shared = make_requests(n, args.seed, shared=True)
    print(f"ops/s; {NUM_BLOCKS} blocks x {BLOCK_SIZE} tokens, prompts ~1k tokens, "
          f"{ROUNDS} fill/grow/free rounds")
    print(f"{'allocator':<34} {'allocate':>12} {'append(1)':>12} {'append(16)':>12} {'free':>12}")
    run("paged, no prefix caching", PagedAllocator(NUM_BLOCKS, BLOCK_SIZE, False), plain, True)
    run("paged, prefix caching", PagedAllocator(NUM_BLOCKS, BLOCK_SIZE, True), shared, True)
    cap = NUM_BLOCKS * BLOCK_SIZE
    for policy in ("oracle", "max"):
        for placement in ("buddy", "first-fit"):
            run(f"contiguous {policy}, {placement}",
                ContiguousAllocator(cap, policy, MAX_MODEL_LEN, placement), plain, False)
    for caching in (False, True):
        reqs = make_requests(19_000, args.seed + 1, shared=caching)
        blocks, seconds = replay_blocks_per_s(caching, reqs)
        print(f"replay 19k requests, paged, prefix caching {'on ' if caching else 'off'}: "
              f"{blocks:,} prompt blocks in {seconds:.3f} s = {blocks / seconds:,.0f} blocks/s")


if __name__ == "__main__":
    main()
