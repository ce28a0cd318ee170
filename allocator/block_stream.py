"""The stream of block keys a workload shows a prefix cache, reduced to runs of reuse.

The cache model both hit-rate curves (``cache_curve``) are computed in::

    for each request r, in arrival order, one at a time:
        look up its prompt's chained keys: hits = longest cached prefix, capped at
            (num_prompt_tokens - 1) // block_size blocks (vLLM recomputes the last token)
        it then holds all its full blocks (prompt + computed output, the same keys the
        allocator registers) and frees them tail first (PagedAllocator.free)
        the cache keeps at most C blocks

A key names its whole prefix (``workloads.keys``), so a request that holds block i holds blocks
0..i-1 too. That makes the stream compressible: along a request's chain, the request that last
held each block can only get older (a parent is held whenever its child is), so the chain splits
into a few *runs* of consecutive blocks last held by the same earlier request, and likewise into
runs of blocks next held by the same later request. Runs are found per content segment, never
per block (``SegmentKeys.block_runs``: equal keys are equal block numbers of equal segment
keys), so the work and memory are proportional to the trace's segments at any block size: the
Mooncake trace (9.3 million block touches at B = 16) is 290 thousand segments and 17 thousand
runs.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kvsim.errors import InputError

NEVER = -1                  # no earlier holder / no later counted use


@dataclass(frozen=True)
class BlockStream:
    """A workload's block stream at one block size, as runs (see module doc).

    Per served request (arrival order; rejected requests are left out): ``request_ids``,
    ``num_prompt_tokens`` (vLLM's prefix-cache query tokens), ``num_lookup_blocks`` (the hit
    cap), ``num_blocks`` (full blocks held at the end), ``has_partial_block`` (a partly filled
    last block: the free queue reuses it first, so it takes one slot until the next request).

    ``reuse_runs`` rows ``(r, q, a, b)``: blocks ``a..b-1`` of request r were last held by
    request q < r (every block r holds that some earlier request held; rows of one request in
    chain order, q decreasing). ``next_runs`` rows ``(r, t, a, b)``: blocks ``a..b-1`` of r are
    next held by request t, which looks them up (counted hits; blocks next held without being
    looked up, or never, have no row).
    """

    block_size: int
    request_ids: np.ndarray
    num_prompt_tokens: np.ndarray
    num_lookup_blocks: np.ndarray
    num_blocks: np.ndarray
    has_partial_block: np.ndarray
    reuse_runs: np.ndarray
    next_runs: np.ndarray
    num_distinct_blocks: int
    num_rejected: int

    @property
    def num_requests(self) -> int:
        return len(self.request_ids)

    @property
    def num_query_tokens(self) -> int:
        return int(self.num_prompt_tokens.sum())

    @property
    def num_block_touches(self) -> int:
        return int(self.num_blocks.sum())


def block_stream(requests: Iterable, block_size: int, *, max_model_len: int | None = None,
                 prompt_only: bool = False) -> BlockStream:
    """The block stream of ``requests`` at ``block_size`` (sample 0 of each request).

    Args:
        requests: ``workloads.Request`` records in arrival order.
        block_size: allocator block size in tokens (> 0).
        max_model_len: as the engine applies it: a prompt of ``max_model_len`` tokens or more is
            rejected, outputs stop at ``max_model_len`` tokens in all; None: no limit.
        prompt_only: the stream a CPU offload tier sees in vLLM (``offload_prompt_only``): only
            the prompt's full blocks are stored, and a lookup may hit all of them (the connector
            looks up to ``num_tokens``, not ``num_tokens - 1``).
    Raises:
        InputError: a bad block size, or the workload serves no request.
    """
    if type(block_size) is not int or block_size < 1:
        raise InputError(f"block_size must be a positive integer, got {block_size!r}",
                         field="block_size")
    request_ids, prompt, held_blocks, partial = [], [], [], []
    occurrences = []            # (request index, segment key, first block, number of blocks)
    num_rejected = 0
    for req in requests:
        if max_model_len is not None and req.prompt_tokens + 1 > max_model_len:
            num_rejected += 1    # vLLM rejects a prompt that leaves no room for one token
            continue
        final = req.prompt_tokens + req.output_tokens
        if max_model_len is not None:
            final = min(final, max_model_len)
        held = final - 1         # the last sampled token's KV is never computed
        if prompt_only:
            held = req.prompt_tokens
        r = len(request_ids)
        request_ids.append(req.request_id)
        prompt.append(req.prompt_tokens)
        held_blocks.append(held // block_size)
        partial.append(held % block_size != 0 and not prompt_only)
        occurrences += [(r, chain, first, count) for chain, first, count
                        in req.block_keys(block_size).block_runs(held // block_size)]
    if not request_ids:
        raise InputError("the workload serves no request (all rejected by max_model_len)",
                         field="max_model_len")
    prompt_arr = np.asarray(prompt, dtype=np.int64)
    lookup = (prompt_arr - (0 if prompt_only else 1)) // block_size
    reuse = _merge(_holders(occurrences))
    nexts = _merge(_sorted(_holders(occurrences[::-1])))
    _check_chains(reuse, nexts)
    # a later holder counts only where it looks the block up (before its hit cap)
    nexts[:, 3] = np.minimum(nexts[:, 3], lookup[nexts[:, 1]] if len(nexts) else 0)
    nexts = nexts[nexts[:, 2] < nexts[:, 3]]
    return BlockStream(block_size, np.asarray(request_ids, dtype=np.int64), prompt_arr, lookup,
                       np.asarray(held_blocks, dtype=np.int64), np.asarray(partial, dtype=bool),
                       reuse, nexts, _num_distinct(occurrences), num_rejected)


def _holders(occurrences) -> list[tuple[int, int, int, int]]:
    """For each segment occurrence, in the given order: runs ``(r, h, a, b)`` of its blocks
    whose nearest holder among the occurrences already seen is request h.

    Per segment key, a stack of earlier occurrences, nearest on top, each covering more blocks
    than the ones above it (an occurrence covering no more than a nearer one is never the
    nearest holder of anything again): the nearest holder of block j is the top-most entry that
    covers j, so a lookup walks down the stack and the walk is paid for by the pops.
    """
    stacks: dict[int, list[tuple[int, int]]] = {}
    rows = []
    for r, chain, first, count in occurrences:
        stack = stacks.get(chain)
        if stack is None:
            stacks[chain] = [(count, r)]
            continue
        cover, holder = stack[-1]
        if cover >= count:            # the nearest holder covers it all (the common case)
            rows.append((r, holder, first, first + count))
            if cover == count:
                stack[-1] = (count, r)
            else:
                stack.append((count, r))
            continue
        covered = 0
        for depth in range(len(stack) - 1, -1, -1):
            cover, holder = stack[depth]
            top = min(cover, count)
            rows.append((r, holder, first + covered, first + top))
            covered = top
            if covered == count:
                break
        while stack and stack[-1][0] <= count:
            stack.pop()
        stack.append((count, r))
    return rows


def _sorted(rows: list) -> list:
    return sorted(rows, key=lambda row: (row[0], row[2]))


def _merge(rows: list) -> np.ndarray:
    """Maximal runs: consecutive rows of one request with the same holder and touching ranges
    (a run crosses segment boundaries) become one row; ``rows`` sorted by request, position."""
    if not rows:
        return np.zeros((0, 4), dtype=np.int64)
    arr = np.asarray(rows, dtype=np.int64)
    new = np.ones(len(arr), dtype=bool)
    new[1:] = ((arr[1:, 0] != arr[:-1, 0]) | (arr[1:, 1] != arr[:-1, 1])
               | (arr[1:, 2] != arr[:-1, 3]))
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(arr)) - 1
    out = arr[first].copy()
    out[:, 3] = arr[last, 3]
    return out


def _num_distinct(occurrences) -> int:
    """Distinct blocks: per segment key, the most blocks any occurrence covers."""
    most: dict[int, int] = {}
    for _, chain, _, count in occurrences:
        if count > most.get(chain, 0):
            most[chain] = count
    return sum(most.values())


def _check_chains(reuse: np.ndarray, nexts: np.ndarray) -> None:
    """Keys chain: along a request, the runs start at block 0, touch, and their holders only
    get older (reuse) or later (next). A 64-bit key collision would break that."""
    for rows, older in ((reuse, True), (nexts, False)):
        if not len(rows):
            continue
        same = rows[1:, 0] == rows[:-1, 0]
        first = np.ones(len(rows), dtype=bool)
        first[1:] = ~same
        step = rows[1:, 1] - rows[:-1, 1]
        bad = np.zeros(len(rows), dtype=bool)
        bad[first] = rows[first, 2] != 0
        bad[1:] |= same & ((rows[1:, 2] != rows[:-1, 3]) | ((step >= 0) if older else (step <= 0)))
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise ValueError(f"block keys do not chain at request index {int(rows[j, 0])}, "
                             f"block {int(rows[j, 2])} (a key collision?)")
