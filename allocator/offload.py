"""An offload tier below the GPU pool: chunks of KV keyed like GPU blocks, evicted LRU.

vLLM 0.33's native CPU offloading (``vllm/v1/kv_offload/cpu/manager.py``
``CPUOffloadingManager`` with ``cpu/policies/lru.py`` ``LRUCachePolicy``), decision for decision;
the rules and where they come from are in docs/OFFLOAD.md. A chunk is one GPU block here (vLLM's
default ``blocks_per_chunk = 1``), keyed by the block's chained key, so a chunk names its whole
prefix. Each chunk is in one state::

    absent --prepare_store--> pending (being written, not readable, not evictable)
    pending --complete_store--> ready (ref_cnt 0: evictable)
    ready --prepare_load--> read by k loads (ref_cnt k: not evictable) --complete_load--> ready

Recency is per request (vLLM's request-scoped LRU): the chunks a request stores or reads share
one provisional rank, deeper chunks ranked older (``(request rank, -position)``); when the
request finishes, every chunk it touched becomes most recent, tail first, so its head ends most
recent. Eviction takes the oldest ready, unread chunk that is not part of the offer being placed;
an offer that cannot evict enough stores nothing (and is offered again by the scheduler).

Plain Python; the scheduler side (what is offered when, lookups, transfer times) lives with the
simulator.
"""
from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

HIT, PENDING, MISS = "hit", "pending", "miss"     # vLLM's LookupResult HIT, HIT_PENDING, MISS
_POS = 1 << 31        # vLLM's rank (r, -position) is kept as one int: r << 32 | (_POS - position)


def _rank(r: int, position: int = 0) -> int:
    """vLLM's LRU rank ``(r, -position)`` as an int with the same order (ints compare faster)."""
    return r << 32 | (_POS - position)


class _Request:
    __slots__ = ("rank", "seen")

    def __init__(self):
        self.rank: int | None = None               # provisional rank, given at first access
        self.seen: dict[Hashable, int] = {}        # key -> position, in first-seen order


class OffloadTier:
    """A tier of ``num_chunks`` chunks (vLLM's CPUOffloadingManager with the LRU policy).

    Args:
        num_chunks: chunks the tier holds (vLLM: cpu_bytes_to_use // aligned chunk bytes).
        name: for messages (``cpu``, ``disk``).
    """

    def __init__(self, num_chunks: int, name: str = "cpu", ties_by_key: bool = False):
        if type(num_chunks) is not int or num_chunks < 0:
            raise ValueError(f"num_chunks must be an integer >= 0, got {num_chunks!r}")
        self.num_chunks = num_chunks
        self.name = name
        self.ties_by_key = ties_by_key
        self._ref: dict[Hashable, int] = {}        # -1 pending, 0 ready, k > 0 read by k loads
        self._rank: dict[Hashable, int] = {}      # _rank(r, position), vLLM's (r, -position)
        self._evictable: set[Hashable] = set()
        self._heap: list[tuple[int, Hashable]] = []   # lazy: stale entries skipped
        self._next_rank = 0
        self._requests: dict[Hashable, _Request] = {}
        self.num_pending = 0
        self.num_stored = self.num_evicted = self.num_failed_stores = 0
        self.max_used = 0                          # most chunks held at once
        self.version = 0                           # bumped whenever a lookup answer can change

    # ---- queries ---------------------------------------------------------------------------
    def lookup(self, key: Hashable) -> str:
        """HIT (readable), PENDING (being written: the scheduler defers the request) or MISS."""
        ref = self._ref.get(key)
        if ref is None:
            return MISS
        return PENDING if ref < 0 else HIT

    @property
    def num_used(self) -> int:
        """Chunks holding data or being written."""
        return len(self._ref)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def keys(self) -> list[Hashable]:
        return list(self._ref)

    # ---- operations ------------------------------------------------------------------------
    def prepare_store(self, request_id: Hashable, keys: Sequence[Hashable],
                      positions: Sequence[int] | None) -> tuple[list, list] | None:
        """Place the chunks of an offer (``keys`` at ``positions`` of the request's chain).

        ``positions`` None: a copy from another tier, not a use by the request; new chunks are
        then ranked most recent in the given order (vLLM's LRU ``insert`` without a position).

        Returns:
            ``(keys_to_store, evicted)``: the offered chunks not in the tier, now pending (the
            caller copies them and calls ``complete_store``), and the chunks evicted to make
            room; None when too few chunks can be evicted (nothing placed).
        """
        ref = self._ref
        to_store = [k for k in keys if k not in ref]
        ready = {k for k in keys if ref.get(k, -1) >= 0}
        fresh = set(to_store)
        # vLLM records the request's access before any allocation can fail
        if positions is not None:
            self._record_access(request_id, [(k, p) for k, p in zip(keys, positions)
                                             if k in fresh or k in ready])
        if not to_store:
            return [], []
        evicted: list[Hashable] = []
        num_evict = len(to_store) - (self.num_chunks - len(ref))
        if num_evict > 0:
            if num_evict > len(self._evictable):
                self.num_failed_stores += 1
                return None
            evicted = self._evict(num_evict, set(keys))
            if evicted is None:
                self.num_failed_stores += 1
                return None
        if positions is None:
            for key in to_store:
                ref[key] = -1
                self._next_rank += 1
                self._rank[key] = _rank(self._next_rank)
        else:
            rank = self._request_rank(request_id)
            where = dict(zip(keys, positions))
            for key in to_store:
                ref[key] = -1
                self._rank[key] = _rank(rank, where[key])
        self.num_pending += len(to_store)
        self.version += 1
        if len(ref) > self.max_used:
            self.max_used = len(ref)
        return to_store, evicted

    def complete_store(self, keys: Sequence[Hashable]) -> None:
        """The copies of pending chunks finished: they become readable and evictable."""
        for key in keys:
            if self._ref.get(key) == -1:
                self._ref[key] = 0
                self.num_pending -= 1
                self.num_stored += 1
                self._make_evictable(key)
        self.version += 1

    def prepare_load(self, request_id: Hashable, keys: Sequence[Hashable],
                     positions: Sequence[int] | None) -> None:
        """Pin ready chunks for a load (they cannot be evicted until complete_load).

        ``positions`` None: a copy to another tier (vLLM's ``prepare_read``), which is not a
        use by the request and leaves recency alone."""
        ref = self._ref
        for key in keys:
            count = ref.get(key, -1)
            if count < 0:
                raise ValueError(f"{self.name} chunk {key!r} is not ready to be read")
            if count == 0:
                self._evictable.discard(key)
            ref[key] = count + 1
        if positions is not None:
            self._record_access(request_id, list(zip(keys, positions)))

    def complete_load(self, keys: Sequence[Hashable]) -> None:
        for key in keys:
            count = self._ref[key]
            if count <= 0:
                raise ValueError(f"{self.name} chunk {key!r} is not being read")
            self._ref[key] = count - 1
            if count == 1:
                self._make_evictable(key)

    def request_finished(self, request_id: Hashable) -> None:
        """Commit the request's recency: its chunks become most recent, tail first."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return
        seen = state.seen
        # head to tail; KV-cache groups key one position once per group: vLLM orders those by
        # group (the key's second part) when the request finishes
        order = sorted(seen, key=(lambda k: (seen[k], k)) if self.ties_by_key
                       else seen.__getitem__)
        for key in reversed(order):
            if key in self._ref:
                self._next_rank += 1
                self._set_rank(key, _rank(self._next_rank))

    def check_invariants(self) -> None:
        assert len(self._ref) <= self.num_chunks, f"{len(self._ref)} > {self.num_chunks} chunks"
        assert self._evictable == {k for k, c in self._ref.items() if c == 0}, "evictable set"
        assert self.num_pending == sum(c == -1 for c in self._ref.values()), "pending count"
        assert set(self._rank) == set(self._ref), "ranks out of sync"

    # ---- helpers ---------------------------------------------------------------------------
    def _request_rank(self, request_id: Hashable) -> int:
        state = self._requests.setdefault(request_id, _Request())
        if state.rank is None:
            self._next_rank += 1
            state.rank = self._next_rank
        return state.rank

    def _record_access(self, request_id: Hashable, keyed: list[tuple[Hashable, int]]) -> None:
        """vLLM's on_request_access: a request's first access to a chunk ranks it with the
        request (never older than it was)."""
        state = self._requests.setdefault(request_id, _Request())
        new = [(k, p) for k, p in keyed if k not in state.seen]
        if not new:
            return
        for key, position in new:
            state.seen[key] = position
        rank = self._request_rank(request_id)
        for key, position in new:
            if key in self._ref and self._rank[key] < _rank(rank, position):
                self._set_rank(key, _rank(rank, position))

    def _set_rank(self, key: Hashable, rank: int) -> None:
        self._rank[key] = rank
        if key in self._evictable:
            heapq.heappush(self._heap, (rank, key))

    def _make_evictable(self, key: Hashable) -> None:
        self._evictable.add(key)
        heapq.heappush(self._heap, (self._rank[key], key))

    def _evict(self, n: int, protected: set) -> list[Hashable] | None:
        """The n oldest evictable chunks outside ``protected``, removed; None (nothing changed)
        if there are fewer."""
        heap, chosen, kept, seen = self._heap, [], [], set()
        while heap and len(chosen) < n:
            rank, key = heapq.heappop(heap)
            if key not in self._evictable or self._rank.get(key) != rank or key in seen:
                continue                  # stale entry
            seen.add(key)
            if key in protected:
                kept.append((rank, key))
                continue
            chosen.append(key)
        for entry in kept:
            heapq.heappush(heap, entry)
        if len(chosen) < n:
            for key in chosen:
                heapq.heappush(heap, (self._rank[key], key))
            return None
        for key in chosen:
            self._evictable.discard(key)
            del self._ref[key]
            del self._rank[key]
        self.num_evicted += len(chosen)
        self.version += 1
        if len(heap) > 2 * len(self._evictable) + 64:    # drop stale entries now and then
            self._heap = [(self._rank[k], k) for k in self._evictable]
            heapq.heapify(self._heap)
        return chosen
