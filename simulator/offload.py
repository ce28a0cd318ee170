"""vLLM 0.33's OffloadingConnector for one replica: the scheduler side and the transfer queues.

The scheduler asks it what vLLM's scheduler asks the connector (docs/OFFLOAD.md gives each rule
and its source):

* ``lookup`` (``get_num_new_matched_tokens``): after the GPU prefix hit, how many more tokens the
  CPU tier holds, in whole chunks from the hit's end up to ``num_tokens``; None defers the
  request for this step (a chunk is still being written or promoted from disk, another request
  is loading it, or the request has transfers in flight). A CPU miss that the disk tier holds
  starts a promotion into the CPU tier.
* ``start_load`` (``update_state_after_alloc``): the request got GPU blocks for its GPU + CPU
  hit; the CPU chunks are pinned and a load is queued. The request waits
  (``WAITING_FOR_REMOTE_KVS``) until ``load_done``.
* ``offer`` (``_build_store_jobs``): after each step, the prompt chunks a request has computed
  by the end of the step are offered to the CPU tier (write-through); new ones are stored.
* ``request_finished``, ``preempted``: commit the CPU tier's request-scoped recency; a preempted
  request's pending stores are flushed (the next step waits for them).

Time (``step``): one queue per direction and tier, each transfer after the previous one in its
queue. A step's loads start when its forward ends; stores queued in step N are submitted in step
N+1 and start when that step's forward ends (vLLM defers them past token sampling). Completions
are polled at each step's start and applied at its end (the scheduler sees them from the next
step on). A CPU store that completes is copied on to the disk tier (write-through). The GPU
never waits for a transfer except for a flush.
"""
from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from kvsim.allocator.offload import HIT, MISS, PENDING, OffloadTier

NS_PER_S = 1_000_000_000
LOAD, STORE, CASCADE, PROMOTE = "load", "store", "cascade", "promote"
WOULD_PROMOTE = "would promote"   # lookup(peek=True): a disk hit that a real lookup would promote


@dataclass(frozen=True)
class TierConfig:
    """One offload tier as the simulator needs it (planner.tiers.TierSpec builds it).

    ``bytes_per_s`` and ``latency_s`` describe the link between this tier and the one above it
    (CPU: the GPU's host link; disk: the disk or network, to and from the CPU tier).
    """

    name: str
    num_chunks: int
    chunk_bytes: int
    bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self):
        if self.num_chunks < 1 or self.chunk_bytes < 1 or not self.bytes_per_s > 0 \
                or self.latency_s < 0:
            raise ValueError(f"bad offload tier {self!r}")


class _Queue:
    """Transfers in one direction, one after the other (vLLM: each transfer's stream waits for
    the previous one's end event)."""

    __slots__ = ("bytes_per_s", "latency_ns", "free_ns", "busy_ns")

    def __init__(self, bytes_per_s: float, latency_s: float):
        self.bytes_per_s = bytes_per_s
        self.latency_ns = round(latency_s * NS_PER_S)
        self.free_ns = 0
        self.busy_ns = 0

    def schedule(self, ready_ns: int, num_bytes: int) -> int:
        """When a transfer of ``num_bytes`` that may start at ``ready_ns`` is done."""
        start = max(ready_ns, self.free_ns)
        took = self.latency_ns + round(num_bytes * NS_PER_S / self.bytes_per_s)
        self.free_ns = start + took
        self.busy_ns += took
        return self.free_ns


@dataclass(slots=True)
class _Job:
    kind: str
    request_id: Hashable
    keys: list
    num_bytes: int
    blocks: tuple = ()                # GPU blocks a store reads (flushed if reused)
    done_ns: int | None = None        # None: not submitted yet


@dataclass(slots=True)
class _Request:
    next_stored: int = 0              # first chunk not offered yet
    jobs: set = field(default_factory=set)          # ids of its transfers in flight
    loading: int | None = None        # its load job, until load_done
    loaded: bool = False              # the load was reported complete
    finished: bool = False


@dataclass
class OffloadStats:
    """Counters over a run (summed over tiers where not per tier)."""

    lookups: int = 0                  # connector lookups (a blocked head is asked every step)
    query_tokens: int = 0             # num_tokens - GPU hit, at first admissions
    preempted_query_tokens: int = 0   # the same for re-admissions after preemption
    preempted_hit_tokens: int = 0     # tokens loaded from CPU at re-admissions
    hit_tokens: dict = field(default_factory=dict)       # tier -> tokens loaded from it
    loaded_bytes: dict = field(default_factory=dict)     # tier -> bytes moved up (to GPU/CPU)
    stored_bytes: dict = field(default_factory=dict)     # tier -> bytes written into it
    num_loads: int = 0
    num_deferred: int = 0             # lookups answered "not yet"
    num_failed_offers: int = 0        # offers refused (too few chunks evictable)
    flush_stall_ns: int = 0           # time steps waited for flushed stores


class OffloadConnector:
    """The offloading connector of one replica (module doc).

    Args:
        tiers: CPU first, then optionally disk.
        block_size: tokens per GPU block (= per chunk).
    """

    def __init__(self, tiers: Sequence[TierConfig], block_size: int):
        if not tiers or tiers[0].name != "cpu" or len(tiers) > 2:
            raise ValueError("offload tiers: cpu, optionally followed by disk")
        self.block_size = block_size
        self.tiers = tuple(tiers)
        self.cpu = OffloadTier(tiers[0].num_chunks, "cpu")
        self.disk = OffloadTier(tiers[1].num_chunks, "disk") if len(tiers) > 1 else None
        cpu = tiers[0]
        self.chunk_bytes = cpu.chunk_bytes
        self.h2d = _Queue(cpu.bytes_per_s, cpu.latency_s)
        self.d2h = _Queue(cpu.bytes_per_s, cpu.latency_s)
        if self.disk is not None:
            self.disk_read = _Queue(tiers[1].bytes_per_s, tiers[1].latency_s)
            self.disk_write = _Queue(tiers[1].bytes_per_s, tiers[1].latency_s)
        self._requests: dict[Hashable, _Request] = {}
        self._jobs: dict[int, _Job] = {}
        self._next_job = 0
        self._new_loads: list[int] = []       # created this step: start after its forward
        self._deferred_stores: list[int] = []  # queued last step: submitted in this one
        self._new_stores: list[int] = []       # created this step
        self._new_promotions: list[int] = []   # disk reads asked for in this schedule
        self._promoting: dict[Hashable, int] = {}     # request -> its read in this schedule
        self._inflight: list[tuple[int, int]] = []   # heap of (done_ns, job id)
        self._found: list[int] = []            # completions polled this step, applied at its end
        self._held: list[int] = []             # async: found by the step in flight (``hold``)
        self._flush: list[int] = []            # jobs the next step must wait for
        self._being_loaded: dict[Hashable, int] = {}  # key -> loads reading it (CPU to GPU)
        self._finished_stores: list[int] = []  # stores of finished requests (flush if reused)
        self.retry: set = set()                # requests whose last offer failed: offer again
        # speed: a request's chunk keys, computed once; the last lookup answer per request with
        # what it depended on (a blocked head is asked again every step)
        self._key_cache: dict[Hashable, list] = {}
        self._memo: dict[Hashable, tuple] = {}
        self._loading_version = 0
        self.stats = OffloadStats(hit_tokens={t.name: 0 for t in tiers},
                                  loaded_bytes={t.name: 0 for t in tiers},
                                  stored_bytes={t.name: 0 for t in tiers})

    # ---- scheduler side --------------------------------------------------------------------
    def lookup(self, request_id: Hashable, keys: Sequence[int], num_tokens: int,
               num_gpu_hit_tokens: int, *, peek: bool = False) -> int | None:
        """Tokens the offload tiers add after a GPU hit of ``num_gpu_hit_tokens``; None: defer.

        ``peek``: ask without side effects (no promotion, no counters); a disk hit then
        answers WOULD_PROMOTE.
        """
        B = self.block_size
        state = self._requests.get(request_id)
        if not peek:
            self.stats.lookups += 1
            if state is None:
                state = self._requests[request_id] = _Request()
            state.next_stored = 0          # restarting at token 0: offer every chunk again
        if state is not None and state.jobs:
            return self._defer(peek)       # vLLM: still has transfers in flight
        start = num_gpu_hit_tokens // B
        stop = min(num_tokens, len(keys) * B) // B   # whole chunks, up to num_tokens
        if stop - start < 1:
            return 0
        cpu, disk = self.cpu, self.disk
        token = (num_tokens, num_gpu_hit_tokens, cpu.version,
                 disk.version if disk is not None else 0, self._loading_version)
        memo = self._memo.get(request_id)
        if memo is not None and memo[0] == token:
            return self._defer(peek) if memo[1] is None else memo[1]
        chunk_keys = self._chunk_keys(request_id, keys, stop)
        hits = 0
        defer = False
        for i in range(start, stop):
            key = chunk_keys[i]
            found = cpu.lookup(key)
            if found == MISS and disk is not None and disk.lookup(key) == HIT:
                # vLLM's tiering manager: room in the CPU tier now, a read from disk, and the
                # chunk answers "pending"; no room: it is a miss
                if peek:
                    return WOULD_PROMOTE
                found = PENDING if self._promote(request_id, key, i) else MISS
            if found == MISS:
                break
            hits += 1
            defer |= found == PENDING
        if defer or self._being_loaded and any(k in self._being_loaded
                                               for k in chunk_keys[start:start + hits]):
            # still being written, or another request is loading these chunks
            self._memo[request_id] = (token, None)
            return self._defer(peek)
        self._memo[request_id] = (token, hits * B)
        return hits * B

    def _chunk_keys(self, request_id: Hashable, keys: Sequence[int], stop: int) -> list:
        """The request's first ``stop`` chunk keys (computed once per request)."""
        cached = self._key_cache.get(request_id)
        if cached is None:
            cached = self._key_cache[request_id] = []
        if len(cached) < stop:
            cached += keys[len(cached):stop]
        return cached

    def _defer(self, peek: bool) -> None:
        if not peek:
            self.stats.num_deferred += 1
        return None

    def _promote(self, request_id: Hashable, key: int, position: int) -> bool:
        """A disk hit: a CPU chunk for it now (it may evict), and a read from disk, submitted at
        the end of this schedule (vLLM's ``_initiate_promotion``)."""
        placed = self.cpu.prepare_store(request_id, [key], [position])
        if placed is None:
            return False
        self.disk.prepare_load(request_id, [key], [position])
        job_id = self._promoting.get(request_id)
        if job_id is None:      # one batched read per request and schedule
            self._promoting[request_id] = self._add_job(
                _Job(PROMOTE, request_id, [key], self.chunk_bytes), self._new_promotions)
        else:
            job = self._jobs[job_id]
            job.keys.append(key)
            job.num_bytes += self.chunk_bytes
        return True

    def start_load(self, request_id: Hashable, keys: Sequence[int], num_gpu_hit_tokens: int,
                   num_external_tokens: int, num_tokens: int, preempted: bool = False) -> None:
        """The request got GPU blocks for its GPU + offload hit: pin the chunks, queue the load
        (it starts when this step's forward ends)."""
        B = self.block_size
        first, stop = num_gpu_hit_tokens // B, (num_gpu_hit_tokens + num_external_tokens) // B
        chunk_keys = self._chunk_keys(request_id, keys, stop)[first:stop]
        self._queue_load(request_id, chunk_keys, list(range(first, stop)), num_gpu_hit_tokens,
                         num_external_tokens, num_tokens, preempted)
        state = self._requests[request_id]
        state.next_stored = -(-(num_gpu_hit_tokens + num_external_tokens) // B)   # chunk level

    def _queue_load(self, request_id: Hashable, chunk_keys: list, positions: list[int],
                    num_gpu_hit_tokens: int, num_external_tokens: int, num_tokens: int,
                    preempted: bool) -> None:
        """Pin ``chunk_keys`` (at ``positions`` of the request's chain) and queue one load of
        them; the connector's counters."""
        self.cpu.prepare_load(request_id, chunk_keys, positions)
        for key in chunk_keys:
            self._being_loaded[key] = self._being_loaded.get(key, 0) + 1
        self._loading_version += 1
        state = self._requests[request_id]
        state.loading = self._add_job(_Job(LOAD, request_id, chunk_keys,
                                           len(chunk_keys) * self.chunk_bytes), self._new_loads)
        state.loaded = False
        self.stats.num_loads += 1
        if preempted:   # vLLM counts re-admissions apart (connector_prefix_cache_stats)
            self.stats.preempted_hit_tokens += num_external_tokens
            self.stats.preempted_query_tokens += num_tokens - num_gpu_hit_tokens
        else:
            self.stats.hit_tokens["cpu"] += num_external_tokens
            self.stats.query_tokens += num_tokens - num_gpu_hit_tokens

    def count_query(self, num_tokens: int, num_gpu_hit_tokens: int,
                    preempted: bool = False) -> None:
        """An admission that loads nothing still asked the connector (vLLM's query count)."""
        if preempted:
            self.stats.preempted_query_tokens += num_tokens - num_gpu_hit_tokens
        else:
            self.stats.query_tokens += num_tokens - num_gpu_hit_tokens

    def load_done(self, request_id: Hashable) -> bool:
        """Whether the request's load was reported complete (then it may be scheduled)."""
        state = self._requests.get(request_id)
        if state is None or not state.loaded:
            return False
        state.loaded = False
        state.loading = None
        return True

    def load_reported(self, request_id: Hashable) -> bool:
        """Whether ``load_done`` would say yes (without taking the answer)."""
        state = self._requests.get(request_id)
        return state is not None and state.loaded

    def is_loading(self, request_id: Hashable) -> bool:
        state = self._requests.get(request_id)
        return state is not None and state.loading is not None

    def offer(self, request_id: Hashable, keys: Sequence[int], num_prompt_tokens: int,
              num_computed_tokens: int, block_table: Sequence[int]) -> None:
        """The prompt chunks computed by the end of this step, not offered yet, go to the CPU
        tier (vLLM ``_build_store_jobs`` with ``offload_prompt_only``)."""
        B = self.block_size
        state = self._requests.get(request_id)
        if state is None:
            state = self._requests[request_id] = _Request()
        num_chunks = min(min(num_computed_tokens, num_prompt_tokens) // B, len(block_table),
                         len(keys))
        start = state.next_stored
        if num_chunks <= start:
            return
        new = self._chunk_keys(request_id, keys, num_chunks)[start:num_chunks]
        placed = self.cpu.prepare_store(request_id, new, list(range(start, num_chunks)))
        if placed is None:
            self.stats.num_failed_offers += 1
            self.retry.add(request_id)      # offered again in each step it is scheduled in
            return
        self.retry.discard(request_id)
        state.next_stored = num_chunks
        if placed[0]:
            where = {k: start + i for i, k in enumerate(new)}
            blocks = tuple(block_table[where[k]] for k in placed[0])
            self._add_job(_Job(STORE, request_id, placed[0], len(placed[0]) * self.chunk_bytes,
                               blocks), self._new_stores)

    def has_unoffered(self, request_id: Hashable, num_prompt_tokens: int) -> bool:
        """Whether some of the request's prompt chunks were not stored yet (an offer failed):
        vLLM offers them again when the request finishes."""
        state = self._requests.get(request_id)
        return state is not None and state.next_stored < num_prompt_tokens // self.block_size

    def request_finished(self, request_id: Hashable) -> None:
        """Commit the request's recency in every tier (after its last offer)."""
        self.retry.discard(request_id)
        self._key_cache.pop(request_id, None)
        self._memo.pop(request_id, None)
        self.cpu.request_finished(request_id)
        if self.disk is not None:
            self.disk.request_finished(request_id)
        state = self._requests.get(request_id)
        if state is None:
            return
        state.finished = True
        self._finished_stores += [j for j in state.jobs if self._jobs[j].kind == STORE]
        if not state.jobs:
            del self._requests[request_id]

    def preempted(self, request_id: Hashable) -> None:
        """A preempted request's pending stores are flushed before the next forward."""
        state = self._requests.get(request_id)
        if state is not None:
            self._flush += [j for j in state.jobs if self._jobs[j].kind == STORE]

    def check_reused_blocks(self, handed_out: Sequence[int]) -> None:
        """Stores of finished requests whose GPU blocks were handed out again in this step
        (``handed_out``: the step's new block ids, prefix hits included) are flushed before the
        next forward (vLLM ``jobs_to_flush``: ``_block_id_to_pending_jobs`` against
        ``_current_batch_allocated_block_ids``)."""
        if not self._finished_stores or not handed_out:
            return
        given = set(handed_out)
        keep = []
        for job_id in self._finished_stores:
            job = self._jobs.get(job_id)
            if job is None:
                continue                    # completed
            if not given.isdisjoint(job.blocks):
                self._flush.append(job_id)
            else:
                keep.append(job_id)
        self._finished_stores = keep

    # ---- time ------------------------------------------------------------------------------
    def step(self, start_ns: int, forward_ns: int) -> int:
        """A step scheduled at ``start_ns`` whose forward takes ``forward_ns``: flush, poll,
        submit. Returns the flush stall (the forward starts that much later)."""
        stall = 0
        if self._flush:
            for job_id in self._flush:
                job = self._jobs.get(job_id)
                if job is None:
                    continue
                if job.done_ns is None:     # not submitted yet: it is now, at once
                    self._submit(job_id, start_ns)
                stall = max(stall, self._jobs[job_id].done_ns - start_ns)
            self._flush = []
            self.stats.flush_stall_ns += stall
        poll = start_ns + stall
        inflight = self._inflight
        while inflight and inflight[0][0] <= poll:
            self._found.append(heapq.heappop(inflight)[1])
        for job_id in self._new_promotions:     # disk reads do not wait for the GPU
            self._submit(job_id, start_ns)
        self._promoting = {}
        forward_end = poll + forward_ns
        for job_id in self._new_loads + self._deferred_stores:
            self._submit(job_id, forward_end)
        self._new_promotions = []
        self._new_loads = []
        self._deferred_stores = self._new_stores
        self._new_stores = []
        return stall

    def idle_until(self, now_ns: int) -> int | None:
        """Nothing to schedule: when the next transfer completes (vLLM keeps taking empty steps
        that poll), or None if nothing is in flight. Pending stores are submitted now."""
        for job_id in self._new_promotions + self._new_loads + self._deferred_stores \
                + self._new_stores:
            self._submit(job_id, now_ns)
        self._new_promotions, self._new_loads, self._deferred_stores, self._new_stores = \
            [], [], [], []
        self._promoting = {}
        return self._inflight[0][0] if self._inflight else None

    def poll(self, now_ns: int) -> None:
        """An empty step at ``now_ns``: find and apply what completed."""
        inflight = self._inflight
        while inflight and inflight[0][0] <= now_ns:
            self._found.append(heapq.heappop(inflight)[1])
        self.apply(now_ns)

    def apply(self, end_ns: int) -> None:
        """At a step's end: apply the completions its poll found (update_connector_output)."""
        found, self._found = self._found, []
        for job_id in found:
            job = self._jobs.pop(job_id)
            state = self._requests.get(job.request_id)
            if state is not None:
                state.jobs.discard(job_id)
            kind = job.kind
            if kind == LOAD:
                self.cpu.complete_load(job.keys)
                for key in job.keys:
                    left = self._being_loaded[key] - 1
                    if left:
                        self._being_loaded[key] = left
                    else:
                        del self._being_loaded[key]
                self._loading_version += 1
                if state is not None:
                    state.loaded = True
                self.stats.loaded_bytes["cpu"] += job.num_bytes
            elif kind == STORE:
                self.cpu.complete_store(job.keys)
                self.stats.stored_bytes["cpu"] += job.num_bytes
                if self.disk is not None:
                    self._cascade(job, end_ns)
            elif kind == CASCADE:
                self.cpu.complete_load(job.keys)          # unpinned in the CPU tier
                self.disk.complete_store(job.keys)
                self.stats.stored_bytes["disk"] += job.num_bytes
            else:  # PROMOTE
                self.disk.complete_load(job.keys)
                self.cpu.complete_store(job.keys)
                self.stats.loaded_bytes["disk"] += job.num_bytes
                self.stats.hit_tokens["disk"] += len(job.keys) * self.block_size
            if state is not None and state.finished and not state.jobs:
                del self._requests[job.request_id]

    def hold(self) -> None:
        """Async scheduling, at a step's end: what its poll found is applied when the step is
        processed, after the next step is scheduled (``apply_held``)."""
        self._held += self._found
        self._found = []

    def apply_held(self, now_ns: int) -> None:
        """Async scheduling: the step in flight is processed; apply what its poll found."""
        if self._held:
            found, self._found, self._held = self._found, self._held, []
            self.apply(now_ns)
            self._found = found

    @property
    def has_held(self) -> bool:
        """Async scheduling: completions of the step in flight, not applied yet."""
        return bool(self._held)

    def _cascade(self, store: _Job, now_ns: int) -> None:
        """A completed CPU store is copied on to the disk tier at once (vLLM's tiering manager,
        ``complete_store``); the CPU chunks stay pinned until the copy is done."""
        # a copy, not a use: the head ends most recent (vLLM's fs tier keeps everything; a
        # sized disk tier evicts its least recently written chunk first)
        placed = self.disk.prepare_store(store.request_id, store.keys[::-1], None)
        if placed is None or not placed[0]:
            return
        self.cpu.prepare_load(store.request_id, placed[0], None)
        job_id = self._add_job(_Job(CASCADE, store.request_id, placed[0],
                                    len(placed[0]) * self.chunk_bytes), [])
        self._submit(job_id, now_ns)

    # ---- recording ---------------------------------------------------------------------------
    def sample_row(self) -> tuple:
        """Per tier: chunks used, tokens loaded from it, bytes loaded from it, bytes stored."""
        st = self.stats
        row = ()
        for tier in self.tiers:
            store = self.cpu if tier.name == "cpu" else self.disk
            row += (store.num_used, st.hit_tokens[tier.name], st.loaded_bytes[tier.name],
                    st.stored_bytes[tier.name])
        return row

    def link_busy_ns(self) -> dict:
        """Nanoseconds each transfer queue was busy."""
        busy = {"cpu_load": self.h2d.busy_ns, "cpu_store": self.d2h.busy_ns}
        if self.disk is not None:
            busy.update(disk_read=self.disk_read.busy_ns, disk_write=self.disk_write.busy_ns)
        return busy

    @property
    def next_event_ns(self) -> int | None:
        """When the next submitted transfer completes (None: none in flight)."""
        return self._inflight[0][0] if self._inflight else None

    @property
    def has_unflushed_finished_stores(self) -> bool:
        """Stores of finished requests still pending (reusing their blocks would flush them)."""
        return any(j in self._jobs for j in self._finished_stores)

    @property
    def has_found(self) -> bool:
        """Completions polled in this step, not applied yet."""
        return bool(self._found)

    @property
    def busy(self) -> bool:
        """Transfers queued or in flight (vLLM keeps the engine stepping)."""
        return bool(self._jobs)

    # ---- helpers ---------------------------------------------------------------------------
    def _add_job(self, job: _Job, queue: list) -> int:
        job_id = self._next_job
        self._next_job += 1
        self._jobs[job_id] = job
        queue.append(job_id)
        state = self._requests.get(job.request_id)
        if state is not None and job.kind in (LOAD, STORE):
            state.jobs.add(job_id)
        return job_id

    def _submit(self, job_id: int, ready_ns: int) -> None:
        job = self._jobs.get(job_id)
        if job is None or job.done_ns is not None:
            return                          # done, or submitted early by a flush
        queue = {LOAD: self.h2d, STORE: self.d2h}.get(job.kind)
        if queue is None:
            queue = self.disk_write if job.kind == CASCADE else self.disk_read
        job.done_ns = queue.schedule(ready_ns, job.num_bytes)
        heapq.heappush(self._inflight, (job.done_ns, job_id))


def summarize_offload(connectors: Sequence[OffloadConnector], *, prefix_query_tokens: int,
                      prefix_hit_tokens: int) -> dict:
    """The summary's ``offload`` value, over every replica's connector (docs/SIMULATOR.md).

    ``hit_tokens``: tokens loaded from each tier into the one above it (cpu: into the GPU, at
    first admissions; disk: promoted into the CPU tier). ``hit_rate``: vLLM's connector hit rate
    (CPU hit tokens over the tokens asked of the connector, ``num_tokens`` - GPU hit);
    ``combined_hit_rate``: GPU and CPU hits over the prompt tokens looked up.
    """
    tiers = connectors[0].tiers
    names = [t.name for t in tiers]

    def total(field: str) -> dict:
        return {n: sum(getattr(c.stats, field)[n] for c in connectors) for n in names}

    hits = total("hit_tokens")
    queries = sum(c.stats.query_tokens for c in connectors)
    busy = {}
    for c in connectors:
        for k, v in c.link_busy_ns().items():
            busy[k] = busy.get(k, 0) + v
    stores = {"cpu": [c.cpu for c in connectors], "disk": [c.disk for c in connectors]}
    return {
        "tiers": [{"name": t.name, "num_chunks": t.num_chunks, "chunk_bytes": t.chunk_bytes,
                   "size_gib": round(t.num_chunks * t.chunk_bytes / 2**30, 6),
                   "bandwidth_gbps": round(t.bytes_per_s / 1e9, 6), "latency_s": t.latency_s}
                  for t in tiers],
        "hit_tokens": hits,
        "query_tokens": queries,
        "hit_rate": round(hits["cpu"] / queries, 6) if queries else 0.0,
        "combined_hit_rate": round((prefix_hit_tokens + hits["cpu"]) / prefix_query_tokens, 6)
        if prefix_query_tokens else 0.0,
        "preempted_query_tokens": sum(c.stats.preempted_query_tokens for c in connectors),
        "preempted_hit_tokens": sum(c.stats.preempted_hit_tokens for c in connectors),
        "loaded_bytes": total("loaded_bytes"),
        "stored_bytes": total("stored_bytes"),
        "num_loads": sum(c.stats.num_loads for c in connectors),
        "num_failed_offers": sum(c.stats.num_failed_offers for c in connectors),
        "flush_stall_s": round(sum(c.stats.flush_stall_ns for c in connectors) / NS_PER_S, 9),
        "link_busy_s": {k: round(v / NS_PER_S, 9) for k, v in busy.items()},
        "max_used_chunks": {n: max(s.max_used for s in stores[n]) for n in names},
        "evicted_chunks": {n: sum(s.num_evicted for s in stores[n]) for n in names},
    }
