"""Prefix-cache hit rate for every cache size in one pass (LRU), and the offline optimum (MIN).

Both work on a ``BlockStream`` (the cache model is in its module doc). Cache sizes are in
blocks; hits are counted in tokens as vLLM counts them (``block_size`` per hit block, over the
prompt tokens of the requests).

**LRU, every size at once (stack distances).** LRU is a stack algorithm: the cache of C blocks
always holds the C most recently used blocks, so the hit of a lookup at every size follows from
one number, the key's depth in the recency stack (Mattson et al., 1970). vLLM frees a request's
blocks tail first, so its head is the most recent; a parent is then always above its child and
a request hits the keys of its chain whose depth is at most C: a prefix, as the prefix cache
hits. Depths come from a Fenwick tree over requests that counts each request's blocks still at
its place in the stack (a run of blocks last held by request q sits below everything held by the
requests after q): O(log R) per run, O(n log n) over the stream.

With ``free_queue=True`` the model also follows vLLM's free queue: a request that ends with a
partly filled block leaves it, uncached, at the front of the free queue, where the next request
takes it first; until then it costs the cache one slot, so the next lookup sees C - 1 blocks.

**When the LRU curve equals a full replay.** ``lru_curve(stream).hit_tokens(C)`` equals the
``prefix_hit_tokens`` of a kvsim replay (and of vLLM's KVCacheManager) with ``num_blocks =
C + 1`` (null block) when

1. requests run one at a time, in arrival order (each arrives after the previous finished), so
   no request holds blocks while another looks up, waits or is preempted;
2. no request looks up a prompt whose every full block is cached while its length is a
   multiple of the block size: vLLM then recomputes the last block into a *second* block with
   the same key (the hash map keeps both, lookups return the older), one slot the key model does
   not see;
3. the pool holds the largest request (``C >= max num_blocks``; otherwise the engine rejects it);
4. one sample per request (n = 1, no beams), prefix caching on.

Where the engine differs, the curve is not a replay: concurrent requests pin their blocks (not
evictable while running, and they count against the pool), admission waits and preemptions
reorder frees, chunked prefills of concurrent requests interleave. docs/OFFLOAD.md measures the
gap on the Mooncake trace.

**MIN (Belady, offline optimal).** At every size, after each request keep the C blocks whose
next counted use is soonest (a block that is next held without being looked up, or never, is
dropped: it costs nothing to drop, it comes back for free), evicting the deeper block of a
chain first on ties. Among all policies that keep at most C blocks between requests (any
eviction order, with or without caching what a request computed) none gets more hit tokens: a
counted hit is an interval of residency between two holds, and keeping the intervals that end
soonest is optimal for interval packing; the tie rule keeps the cache prefix-closed, so every
resident block counted is a prefix hit. MIN is computed size by size (a heap of runs per size);
it is at least the LRU curve at every size (LRU is one such policy).
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvsim.allocator.block_stream import BlockStream


class _Fenwick:
    """Prefix sums over 0..n-1 with point updates (1-based tree inside)."""

    __slots__ = ("tree", "n")

    def __init__(self, n: int):
        self.n = n
        self.tree = [0] * (n + 1)

    def add(self, i: int, delta: int) -> None:
        tree, n = self.tree, self.n
        i += 1
        while i <= n:
            tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum of entries 0..i."""
        tree = self.tree
        i += 1
        total = 0
        while i:
            total += tree[i]
            i -= i & -i
        return total


@dataclass(frozen=True)
class LruCurve:
    """Hit tokens of an LRU prefix cache of every size (piecewise linear in the size).

    ``depth_start[k]``, ``depth_count[k]``: a run of looked-up blocks found at stack depths
    ``depth_start .. depth_start + depth_count - 1``; a cache of C blocks hits those at depth
    <= C.
    """

    block_size: int
    num_query_tokens: int
    depth_start: np.ndarray
    depth_count: np.ndarray
    free_queue: bool

    def __post_init__(self):
        lo = np.sort(self.depth_start)
        hi = np.sort(self.depth_start + self.depth_count)
        object.__setattr__(self, "_lo", lo)
        object.__setattr__(self, "_hi", hi)
        object.__setattr__(self, "_lo_sum", np.concatenate(([0], np.cumsum(lo))))
        object.__setattr__(self, "_hi_sum", np.concatenate(([0], np.cumsum(hi))))

    @property
    def max_useful_blocks(self) -> int:
        """The smallest size that hits everything any size hits."""
        if not len(self.depth_start):
            return 0
        return int((self.depth_start + self.depth_count).max()) - 1

    def hit_blocks(self, num_cache_blocks) -> np.ndarray:
        """Blocks hit at each size (array-like of sizes in blocks)."""
        c = np.asarray(num_cache_blocks, dtype=np.int64)
        # sum over runs of clamp(C - start + 1, 0, count): runs started contribute C - start + 1,
        # runs ended take back C - end + 1
        i = np.searchsorted(self._lo, c, side="right")
        j = np.searchsorted(self._hi, c, side="right")
        return (i * (c + 1) - self._lo_sum[i]) - (j * (c + 1) - self._hi_sum[j])

    def hit_tokens(self, num_cache_blocks) -> np.ndarray:
        return self.hit_blocks(num_cache_blocks) * self.block_size

    def hit_rate(self, num_cache_blocks) -> np.ndarray:
        """vLLM's prefix-cache hit rate (hit tokens over prompt tokens) at each size."""
        return self.hit_tokens(num_cache_blocks) / max(1, self.num_query_tokens)

    def smallest_size_for(self, hit_rate: float) -> int | None:
        """The smallest cache (blocks) whose hit rate is at least ``hit_rate``; None if no size
        reaches it."""
        top = self.max_useful_blocks
        if self.hit_rate(top) < hit_rate:
            return None
        lo, hi = 0, top          # hit rate is non-decreasing in the size: bisect
        while lo < hi:
            mid = (lo + hi) // 2
            if self.hit_rate(mid) >= hit_rate:
                hi = mid
            else:
                lo = mid + 1
        return lo


def lru_curve(stream: BlockStream, *, free_queue: bool = True) -> LruCurve:
    """The LRU prefix-cache curve of ``stream`` at every cache size, in one pass.

    Args:
        stream: the workload's block stream.
        free_queue: model vLLM's free queue (a partly filled last block takes one slot until the
            next request); False gives the textbook key-only LRU.
    """
    runs = stream.reuse_runs
    num_requests = stream.num_requests
    run_stop = np.searchsorted(runs[:, 0], np.arange(num_requests), side="right").tolist()
    r_q, r_a, r_b = (runs[:, k].tolist() for k in (1, 2, 3))
    lookup = stream.num_lookup_blocks.tolist()
    num_blocks = stream.num_blocks.tolist()
    partial = stream.has_partial_block.tolist()
    live = _Fenwick(num_requests)     # per request: its blocks still at its place in the stack
    total_live = 0
    starts: list[int] = []
    counts: list[int] = []
    pseudo = 0
    k = 0
    for r in range(num_requests):
        stop = run_stop[r]
        cap = lookup[r]
        # lookups first: the stack as it was before this request
        for i in range(k, stop):
            a = r_a[i]
            if a >= cap:
                break                 # runs are in chain order: the rest is past the hit cap
            above = total_live - live.prefix(r_q[i])   # held by requests after q
            starts.append(above + 1 + pseudo)
            counts.append(min(r_b[i], cap) - a)
        for i in range(k, stop):      # this request now holds them: they leave q's place
            n = r_b[i] - r_a[i]
            live.add(r_q[i], -n)
            total_live -= n
        live.add(r, num_blocks[r])
        total_live += num_blocks[r]
        pseudo = int(partial[r]) if free_queue else 0
        k = stop
    return LruCurve(stream.block_size, stream.num_query_tokens,
                    np.asarray(starts, dtype=np.int64), np.asarray(counts, dtype=np.int64),
                    free_queue)


def min_hit_blocks(stream: BlockStream, sizes: Sequence[int]) -> np.ndarray:
    """Belady's MIN: the most blocks any policy can hit with a cache of each size (see module
    doc); one pass over the stream per size."""
    runs = stream.next_runs
    num_requests = stream.num_requests
    run_stop = np.searchsorted(runs[:, 0], np.arange(num_requests), side="right").tolist()
    rows = runs[:, 1:].tolist()
    out = np.zeros(len(sizes), dtype=np.int64)
    for s, size in enumerate(sizes):
        out[s] = _min_one_size(rows, run_stop, int(size))
    return out


def _min_one_size(rows: list, run_stop: list, capacity: int) -> int:
    """MIN at one size. The cache holds runs of blocks with one next counted use each; the heap
    pops the run used last (deepest first on ties) and trims it from its deep end."""
    heap: list[tuple[int, int, int]] = []
    length: dict[int, int] = {}         # run id -> blocks of it still cached
    due: dict[int, list[int]] = {}      # request -> runs it will look up
    size = hits = 0
    k = 0
    for r, stop in enumerate(run_stop):
        for rid in due.pop(r, ()):      # the cached blocks this request looks up: hits
            n = length.pop(rid, 0)
            hits += n
            size -= n
        for rid in range(k, stop):
            use, a, b = rows[rid]
            length[rid] = b - a
            size += b - a
            heapq.heappush(heap, (-use, -b, rid))
            due.setdefault(use, []).append(rid)
        while size > capacity:
            rid = heap[0][2]
            n = length.get(rid)
            if n is None:               # already looked up (its heap entry is stale)
                heapq.heappop(heap)
                continue
            excess = size - capacity
            if n <= excess:
                heapq.heappop(heap)
                del length[rid]
                size -= n
            else:
                length[rid] = n - excess
                size = capacity
        k = stop
    return hits
