"""vLLM 0.33's OffloadingConnector over KV-cache groups (issue 27: groups x a CPU tier).

``GroupedOffloadConnector`` is ``offload.OffloadConnector`` (the CPU tier, the transfer queues and
their timing, unchanged) with what vLLM's ``OffloadingConnectorScheduler`` does differently when
the model's layers are in several KV-cache groups
(``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``):

* **Keys.** A CPU chunk holds one group's block (one slot = the worker's KV bytes per block, so
  every group's chunk is the same size); its key is the block's hash with the group's index
  (``make_offload_key``). Ties in the CPU tier's LRU (one position, one key per group) go by
  the key, as vLLM's do.
* **Lookup** (``get_num_new_matched_tokens``): every group's chunks, by the group's rule
  (``offload_groups.hit_tokens``: full attention from the GPU hit on, a sliding window only its
  last window). It first forgets the request's block ids and restarts its stores at chunk 0.
* **Loads** (``update_state_after_alloc``): in each group, from the first block of the load
  range that is not NULL (a sliding window allocates only its window) to the hit's end; one job
  for every group's chunks.
* **Block ids.** The connector keeps each request's block ids per group, as the scheduler
  output gave them (the whole table when the request is (re)admitted, the new blocks after
  that): a sliding-window block the allocator has since freed is still read by a later store,
  unless it was handed out again in this step (then its id is zeroed, ``_update_req_states``).
* **Stores** (``_build_store_jobs``): every scheduled request, every step, and each finished
  one once more: per group the prompt chunks computed by the end of the step and not offered
  yet, whose block id is not NULL and that a later hit can use (vLLM's
  ``reachable_block_mask`` with its default ``prefix_cache_retention_interval`` 0: a sliding
  window keeps only the window before the prompt's replay boundary and before a shared-prefix
  junction); one job for all groups' chunks the tier did not have. A refused offer is simply made again
  in the next step the request is scheduled.
* **Flushes.** A pending store is flushed before the next forward when a block it reads is
  handed out again: a sliding-window block from the store's creation on, a full-attention
  block once its request has finished (as with one group); and when its request is preempted.

* **Mamba groups** ("align" mode): a lookup needs one chunk, the state at the hit's end, and
  the hit ends on a whole chunk; a load reads that chunk. Never stored from the block table:
  each state the GPU caches is handed over with its exact block (vLLM's boundary-state
  hand-offs, ``GroupedPagedAllocator.take_boundary_states``) and stored alone
  (``store_states``, vLLM's ``_build_aligned_boundary_store_jobs``), fenced until done.

* **A disk tier** behind the CPU tier: chunks are keyed per group there too; a lookup that
  meets a chunk only the disk has promotes it into the CPU tier (vLLM's tiering manager, as with
  one group: ``OffloadConnector._promote``), and every completed CPU store is written through.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from kvsim.allocator.offload import HIT, MISS, PENDING, OffloadTier
from kvsim.simulator.kv_slots import cdiv
from kvsim.simulator.offload import STORE, WOULD_PROMOTE, OffloadConnector, TierConfig, _Job
from kvsim.simulator.offload_groups import GroupChunks, hit_tokens, sliding_window_chunks


@dataclass(slots=True)
class _GroupedRequest:
    """A request as the connector sees it (``offload._Request``'s fields, per group)."""

    num_groups: int
    jobs: set = field(default_factory=set)        # ids of its transfers in flight
    loading: int | None = None                    # its load job, until load_done
    loaded: bool = False                          # the load was reported complete
    finished: bool = False                        # its recency was committed
    done: bool = False                            # it finished (vLLM req.is_finished())
    next_stored: list = field(default_factory=list)   # per group: first chunk not offered
    block_ids: list = field(default_factory=list)     # per group: as the scheduler gave them

    def __post_init__(self):
        self.next_stored = [0] * self.num_groups
        self.block_ids = [[] for _ in range(self.num_groups)]


def connector_groups(specs: Sequence, block_size: int) -> tuple[GroupChunks, ...]:
    """The connector's view of the KV-cache groups (allocator.group_managers.KVGroupSpec):
    one GPU block a chunk (vLLM's default ``blocks_per_chunk``); a Mamba group needs one chunk,
    its state at the hit's end (``get_sliding_window_size_in_chunks``)."""
    groups = []
    for spec in specs:
        if spec.kind == "mamba":
            groups.append(GroupChunks(block_size, 1))
        elif spec.kind == "sliding_window":
            window = spec.sliding_window
            groups.append(GroupChunks(block_size, sliding_window_chunks(window, block_size),
                                      window - 1))
        else:
            groups.append(GroupChunks(block_size))
    return tuple(groups)


class _WouldPromote(Exception):
    """A lookup asked without side effects met a chunk only the disk tier has."""


class GroupedOffloadConnector(OffloadConnector):
    """The offloading connector of one replica whose model has KV-cache groups (module doc).

    Args:
        tiers: the CPU tier, optionally a disk tier behind it.
        block_size: tokens per GPU block (= per chunk) in every group.
        groups: the groups in their index order (``connector_groups``).
        reachable: per group, which of a range of blocks a later hit can use.
        states: per group, whether it is stored from the states the GPU caches (Mamba).
    """

    def __init__(self, tiers: Sequence[TierConfig], block_size: int,
                 groups: Sequence[GroupChunks], reachable: Sequence[Callable],
                 states: Sequence[bool] = ()):
        super().__init__(tiers, block_size)
        self.cpu = OffloadTier(tiers[0].num_chunks, "cpu", ties_by_key=True)
        self.groups = tuple(groups)
        # Mamba groups ("align" mode): stored from the states the GPU caches, never from the
        # block table (vLLM's requires_cow_source); a hit ends on a whole chunk
        self._states = tuple(states) or (False,) * len(self.groups)
        self._mamba_align = block_size if any(self._states) else None
        self._windowed = tuple(i for i, g in enumerate(groups) if g.window_chunks is not None)
        # per group, which of a range of blocks a later hit can use (vLLM's
        # reachable_block_mask; the GPU's own, the connector's alignment being one block)
        self._reachable = tuple(reachable)
        self._allocated: set[int] = set()      # vLLM _current_batch_allocated_block_ids
        self._fences: dict[int, set[int]] = {}  # block id -> pending stores reading it
        self._job_fences: dict[int, tuple[list, list]] = {}   # store -> (window, full) blocks

    # ---- scheduler side --------------------------------------------------------------------
    def _state(self, request_id: Hashable) -> _GroupedRequest:
        state = self._requests.get(request_id)
        if state is None:
            state = self._requests[request_id] = _GroupedRequest(len(self.groups))
        return state

    def _group_keys(self, request_id: Hashable, keys: Sequence[int]) -> list[list]:
        """The request's chunk keys per group (block hash, group index), grown as it grows."""
        cached = self._key_cache.get(request_id)
        if cached is None:
            cached = self._key_cache[request_id] = [[] for _ in self.groups]
        have = len(cached[0])
        if len(keys) > have:
            for g, group_keys in enumerate(cached):
                group_keys += [(key, g) for key in keys[have:]]
        return cached

    def lookup(self, request_id: Hashable, keys: Sequence[int], num_tokens: int,
               num_gpu_hit_tokens: int, *, peek: bool = False) -> int | None:
        """Tokens the CPU tier adds after a GPU hit of ``num_gpu_hit_tokens`` over every group;
        None: defer (``peek``: without side effects)."""
        state = self._requests.get(request_id)
        if not peek:
            self.stats.lookups += 1
            state = self._state(request_id)
            for g in range(len(self.groups)):
                state.block_ids[g] = []
                state.next_stored[g] = 0     # restarting at token 0: offer every chunk again
        if state is not None and state.jobs:
            return self._defer(peek)         # vLLM: still has transfers in flight
        # the answer reads only the tiers and the chunks being loaded (a request skipped or
        # stopped at is asked again every step): the last one stands while none changed
        disk = self.disk
        token = (num_tokens, num_gpu_hit_tokens, self.cpu.version,
                 disk.version if disk is not None else 0, self._loading_version)
        memo = self._memo.get(request_id)
        if memo is not None and memo[0] == token:
            return self._defer(peek) if memo[1] is None else memo[1]
        group_keys = self._group_keys(request_id, keys)
        find = self.cpu.lookup if disk is None else \
            self._tiered_find(request_id, group_keys, peek)
        try:
            found = hit_tokens(self.groups, group_keys, find, num_gpu_hit_tokens, num_tokens,
                               being_loaded=self._being_loaded,
                               mamba_align_tokens=self._mamba_align)
        except _WouldPromote:
            return WOULD_PROMOTE
        self._memo[request_id] = (token, found)
        if found is None:
            return self._defer(peek)
        return found

    def _tiered_find(self, request_id: Hashable, group_keys: Sequence[Sequence],
                     peek: bool) -> Callable[[Hashable], str]:
        """vLLM's tiering manager's ``lookup`` of one chunk: the CPU tier's answer, or for a
        chunk only the disk has, a promotion started now (room in the CPU tier: PENDING, else
        MISS; ``OffloadConnector._promote``). ``peek``: raise _WouldPromote instead."""
        cpu, disk = self.cpu, self.disk
        positions: dict | None = None

        def find(key: Hashable) -> str:
            nonlocal positions
            found = cpu.lookup(key)
            if found == MISS and disk.lookup(key) == HIT:
                if peek:
                    raise _WouldPromote
                if positions is None:        # the chunk's index in its group's chain
                    positions = {k: i for gk in group_keys for i, k in enumerate(gk)}
                found = PENDING if self._promote(request_id, key, positions[key]) else MISS
            return found

        return find

    def start_group_load(self, request_id: Hashable, keys: Sequence[int],
                         num_gpu_hit_tokens: int, num_external_tokens: int, num_tokens: int,
                         tables: Sequence[Sequence[int]], preempted: bool = False) -> None:
        """update_state_after_alloc: the request holds ``tables`` (every group's blocks, the
        loaded range included); pin each group's chunks from its first non-NULL block of the
        range to the hit's end and queue one load."""
        B = self.block_size
        end = num_gpu_hit_tokens + num_external_tokens
        num_chunks = cdiv(end, B)
        first = cdiv(num_gpu_hit_tokens, B)
        group_keys = self._group_keys(request_id, keys)
        state = self._state(request_id)
        load, positions = [], []
        for g, table in enumerate(tables):
            start = next((i for i in range(first, num_chunks) if table[i]), num_chunks)
            load += group_keys[g][start:num_chunks]
            positions += range(start, num_chunks)
            state.next_stored[g] = num_chunks
        self._queue_load(request_id, load, positions, num_gpu_hit_tokens, num_external_tokens,
                         num_tokens, preempted)

    def note_allocated(self, tables: Sequence[Sequence[int]]) -> None:
        """Blocks a request holds after an admission (vLLM's update_state_after_alloc)."""
        for table in tables:
            self._allocated.update(table)
        self._allocated.discard(0)

    def update_tables(self, updates: Sequence[tuple[Hashable, Sequence[Sequence[int]], bool]]
                      ) -> None:
        """vLLM's ``_update_req_states``: each scheduled request's block ids (``(request id,
        its tables now, whether the scheduler sends the whole table)``: a (re)admission does,
        else the blocks past those the connector has are new); then every sliding-window id
        not stored yet that was handed out in this step is zeroed."""
        ends: dict[Hashable, list[int]] = {}
        allocated = self._allocated
        for request_id, tables, full in updates:
            state = self._state(request_id)
            if full:
                for ids in state.block_ids:
                    ids.clear()
            ends[request_id] = [len(state.block_ids[g]) for g in self._windowed]
            for ids, table in zip(state.block_ids, tables):
                new = table[len(ids):]
                ids += new
                allocated.update(new)
        allocated.discard(0)
        if not self._windowed or not allocated:
            return
        for request_id, state in self._requests.items():
            end = ends.get(request_id)
            for i, g in enumerate(self._windowed):
                ids = state.block_ids[g]
                for j in range(state.next_stored[g], len(ids) if end is None else end[i]):
                    if ids[j] in allocated:
                        ids[j] = 0

    def flush_reused(self) -> None:
        """Pending stores that read a block handed out in this step are flushed."""
        if self._fences and self._allocated:
            fences = self._fences
            jobs = {j for b in self._allocated if b in fences for j in fences[b]}
            self._flush += sorted(jobs)

    def store(self, request_id: Hashable, keys: Sequence[int], num_prompt_tokens: int,
              num_tokens: int, num_tokens_after_step: int, boundaries: Sequence[int]) -> None:
        """vLLM's ``_build_store_jobs`` for one request: its prompt chunks computed by
        ``num_tokens_after_step``, not offered yet, that a later hit can use (``boundaries``:
        the request's replay boundary and shared-prefix junction), go to the CPU tier."""
        state = self._requests.get(request_id)
        if state is None:
            return
        B = self.block_size
        offloadable = min(num_tokens_after_step, num_tokens, num_prompt_tokens)
        group_keys = self._group_keys(request_id, keys)
        offer, positions, ranges = [], [], []
        for g, ids in enumerate(state.block_ids):
            gk = group_keys[g]
            stop = min(offloadable // B, len(ids), len(gk))
            start = state.next_stored[g]
            ranges.append((start, stop))
            if stop <= start or self._states[g]:
                continue
            mask = self._reachable[g](start, stop, boundaries)
            for c in range(start, stop):
                if ids[c] and (mask is None or mask[c - start]):
                    offer.append(gk[c])
                    positions.append(c)
        placed = self.cpu.prepare_store(request_id, offer, positions) if offer else ([], [])
        if placed is None:
            self.stats.num_failed_offers += 1
            return                           # offered again in the next step
        if not placed[0]:
            for g, (start, stop) in enumerate(ranges):
                state.next_stored[g] = max(state.next_stored[g], stop)
            return
        stored = set(placed[0])
        blocks, windowed, full = [], [], []
        for g, (start, stop) in enumerate(ranges):
            ids, gk = state.block_ids[g], group_keys[g]
            into = windowed if self.groups[g].window_chunks is not None else full
            for c in range(start, stop):
                if gk[c] in stored and ids[c]:
                    blocks.append(ids[c])
                    into.append(ids[c])
            state.next_stored[g] = max(state.next_stored[g], stop)
        job_id = self._add_job(_Job(STORE, request_id, placed[0],
                                    len(placed[0]) * self.chunk_bytes, tuple(blocks)),
                               self._new_stores)
        self._job_fences[job_id] = (windowed, full)
        self._fence(job_id, windowed)
        if state.done:
            self._fence(job_id, full)
            if not self._allocated.isdisjoint(full):
                self._flush.append(job_id)

    def store_states(self, states: dict[Hashable, list[tuple[int, int, int]]],
                     seq_of: Callable[[Hashable], object]) -> None:
        """vLLM's ``_build_aligned_boundary_store_jobs``: every Mamba state the GPU cached in
        this step (``GroupedPagedAllocator.take_boundary_states``) at a prompt chunk's end goes
        to the CPU tier from its own block, one store job each, fenced from now on (before the
        step's other stores). ``seq_of``: a request's SeqState (keys, prompt, tokens)."""
        B = self.block_size
        for request_id, entries in states.items():
            if request_id not in self._requests:
                continue
            seq = seq_of(request_id)
            limit = min(seq.num_tokens, seq.num_prompt_tokens)     # offload_prompt_only
            group_keys = self._group_keys(request_id, seq.keys)
            for g, block_id, boundary in entries:
                if not block_id or boundary > limit or boundary % B:
                    continue
                chunk = boundary // B - 1
                placed = self.cpu.prepare_store(request_id, [group_keys[g][chunk]], [chunk])
                if placed is None:
                    self.stats.num_failed_offers += 1
                    continue
                if not placed[0]:
                    continue
                job_id = self._add_job(_Job(STORE, request_id, placed[0], self.chunk_bytes,
                                            (block_id,)), self._new_stores)
                self._job_fences[job_id] = ([block_id], [])
                self._fence(job_id, [block_id])

    def fence_finished(self, request_id: Hashable) -> None:
        """vLLM's ``request_finished`` (when the request finishes, before its blocks are freed):
        its pending stores' full-attention blocks are fenced from now on."""
        state = self._requests.get(request_id)
        if state is None:
            return
        state.done = True
        for job_id in state.jobs:
            fences = self._job_fences.get(job_id)
            if fences is not None:
                self._fence(job_id, fences[1])

    def end_step(self) -> None:
        self._allocated = set()

    def apply(self, end_ns: int) -> None:
        """Completions as with one group; a completed store's blocks are no longer fenced."""
        for job_id in self._found:
            fences = self._job_fences.pop(job_id, None)
            if fences is None:
                continue
            state = self._requests.get(self._jobs[job_id].request_id)
            self._unfence(job_id, fences[0])
            if state is not None and state.done:
                self._unfence(job_id, fences[1])
        super().apply(end_ns)

    def _fence(self, job_id: int, blocks: list[int]) -> None:
        for block_id in blocks:
            self._fences.setdefault(block_id, set()).add(job_id)

    def _unfence(self, job_id: int, blocks: list[int]) -> None:
        for block_id in blocks:
            jobs = self._fences[block_id]
            jobs.discard(job_id)
            if not jobs:
                del self._fences[block_id]


def make_connector(config, tiers: Sequence[TierConfig], allocator) -> OffloadConnector:
    """The replica's connector for an EngineConfig: over its KV-cache groups if it has them
    (``allocator``: the replica's GroupedPagedAllocator then)."""
    if config.kv_cache_groups:
        allocator.record_boundary_states()
        return GroupedOffloadConnector(
            tiers, config.block_size, connector_groups(config.kv_cache_groups, config.block_size),
            [m.reachable_mask for m in allocator.managers],
            [m.boundary_states is not None for m in allocator.managers])
    return OffloadConnector(tiers, config.block_size)
