"""One manager per KV-cache group: full attention, sliding window, Mamba state (vLLM 0.33's
``single_type_kv_cache_manager.py``, the subset a synchronous scheduler without speculative
decoding, KV connector or DCP reaches).

Every group keeps its own block table per request, over one shared BlockPool; a table entry is
a block id or ``NULL`` (vLLM's null block, id 0: a position whose KV the group no longer keeps)::

    sliding window W = 8, block_size 4, 14 tokens computed
    full     [ 7 | 2 | 9 | 5 ]          every block kept until the request finishes
    sliding  [ 0 | 0 | 9'| 5']          blocks wholly below token 14 - 8 + 1 = 7 freed (NULL)
    mamba    [ 0 | 0 | 0 | 4"]          one running state (plus a prompt checkpoint)

Prefix caching keys a block by (group, chained key): ``group_key(key, salt)``. What each group
caches and how it hits:

* full attention: every full block; a hit is the longest run of cached blocks from block 0.
* sliding window: with vLLM 0.33's default ``prefix_cache_retention_interval=0`` only the
  ``cdiv(W - 1, B)`` blocks just below a replay boundary (the prompt's ``P - 1``, and a shared
  prefix that another group holds longer) are cached; a hit is the rightmost run of that many
  cached blocks (or a run reaching block 0), so the blocks below the window may be gone.
* Mamba ("align" mode, prefix caching on): only the state block at a replay boundary; a hit is
  the rightmost cached state. Prefix caching off ("none" mode): one block per request, sized
  ``max_model_len``.
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from kvsim.allocator.block_pool import BlockPool

NULL = 0                     # vLLM's null block: a skipped position in a block table
GROUP_KINDS = ("full_attention", "sliding_window", "mamba")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """What the allocator needs to know about one KV-cache group (vLLM's KVCacheGroupSpec).

    Args:
        kind: "full_attention" (MLA too: one latent head is a bytes matter), "sliding_window"
            or "mamba".
        sliding_window: tokens a query attends to (sliding_window groups).
        mamba_checkpoint_alignment: Mamba layers that export the prompt's state from inside a
            prefill chunk (vLLM ``num_prefill_checkpoint_blocks=1``): the token alignment of the
            checkpoint offset (Mamba2: 1; Gated DeltaNet: the block size); None: they do not.
        num_layers: layers that share this group's block table (accounting).
        page_size_bytes: bytes of one block of one layer (accounting; the pool's unified page).
        name: label for tables and the dashboard.
    """

    kind: str
    sliding_window: int | None = None
    mamba_checkpoint_alignment: int | None = None
    num_layers: int = 1
    page_size_bytes: int = 0
    name: str = ""

    def __post_init__(self):
        if self.kind not in GROUP_KINDS:
            raise ValueError(f"kind must be one of {', '.join(GROUP_KINDS)}, got {self.kind!r}")
        if (self.kind == "sliding_window") != (self.sliding_window is not None):
            raise ValueError(f"sliding_window is required for (and only for) sliding_window "
                             f"groups, got kind {self.kind!r} and {self.sliding_window}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {self.sliding_window}")
        if self.mamba_checkpoint_alignment is not None and (
                self.kind != "mamba" or self.mamba_checkpoint_alignment < 1):
            raise ValueError(f"mamba_checkpoint_alignment must be >= 1 on a mamba group, got "
                             f"{self.mamba_checkpoint_alignment} on {self.kind!r}")
        if self.num_layers < 1 or self.page_size_bytes < 0:
            raise ValueError(f"num_layers must be >= 1 and page_size_bytes >= 0, got "
                             f"{self.num_layers} and {self.page_size_bytes}")

    @property
    def lookup_key(self) -> tuple:
        """Groups with equal keys are looked up together (vLLM merges equal specs)."""
        return (self.kind, self.sliding_window, self.mamba_checkpoint_alignment,
                self.page_size_bytes)


def group_salt(group_id: int) -> int:
    """XOR-ed into a content key to give the key of a block of this group (group 0: unchanged,
    so a single-group pool keeps the plain keys)."""
    if group_id == 0:
        return 0
    x = (group_id * 0x9E3779B97F4A7C15 + 0x6A09E667F3BCC909) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 31)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 29)


@dataclass
class RequestKeys:
    """What caching needs from a request: its keys and the replay boundaries they imply."""

    block_hashes: Sequence[int] | None
    num_prompt_tokens: int
    num_tokens: int                      # current length (prompt + outputs so far)
    shared_prefix_boundary: int = 0      # set at the request's last prefix lookup

    def replay_boundaries(self) -> list[int]:
        """Token positions a later hit can end at (vLLM's ``reachable_boundaries``): the
        prompt's last token and the shared-prefix junction, if any."""
        boundaries = [self.num_prompt_tokens - 1]
        if self.shared_prefix_boundary:
            boundaries.append(self.shared_prefix_boundary)
        return boundaries


class GroupManager:
    """Block tables of one group; the hooks vLLM's KVCacheCoordinator calls, in its order.

    Block frees of this group always go through ``_free_blocks`` (tail-first eviction order,
    hashless blocks to the front of the free queue, hashed to the back).
    """

    boundary_states: list | None = None    # the states to offload (MambaManager's)

    def __init__(self, spec: KVCacheGroupSpec, pool: BlockPool, group_id: int, block_size: int,
                 enable_caching: bool, block_group: list[int],
                 max_admission_blocks: int | None = None):
        self.spec = spec
        self.block_group = block_group      # shared: the group that last took each block
        self.pool = pool
        self.group_id = group_id
        self.salt = group_salt(group_id)
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_admission_blocks = max_admission_blocks
        self.req_blocks: dict[Hashable, list[int]] = {}
        # full blocks already considered for caching; present once the request holds or has
        # cached a block (vLLM's num_cached_block: its "running request" fast path)
        self.num_cached_block: dict[Hashable, int] = {}
        self.num_used_blocks = 0        # distinct blocks of this group in use (accounting)

    # ---- hooks ---------------------------------------------------------------------------
    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return 0

    def blocks_to_allocate(self, seq_id, num_tokens: int, hit: Sequence[int],
                           total_computed_tokens: int, num_tokens_main: int,
                           apply_admission_cap: bool, prefill_end: int) -> int:
        """Free blocks ``allocate_new`` (plus touching ``hit``) would take (vLLM's
        ``get_num_blocks_to_allocate``)."""
        size = self.block_size
        num_required = cdiv(num_tokens, size)
        if apply_admission_cap and self.max_admission_blocks is not None:
            num_required = min(num_required, self.max_admission_blocks)
        num_held = len(self.req_blocks.get(seq_id, ()))
        if seq_id in self.num_cached_block:          # running: no new hits
            return max(num_required - num_held, 0)
        num_skipped_blocks = max(self.num_skipped_tokens(total_computed_tokens), 0) // size
        num_new = max(num_required - max(num_skipped_blocks, len(hit) + num_held), 0)
        skip_hits = max(0, num_skipped_blocks - num_held)
        ref = self.pool.ref_cnt
        return num_new + sum(1 for b in hit[skip_hits:] if b != NULL and ref[b] == 0)

    def add_hit_blocks(self, seq_id, hit: Sequence[int], num_computed_tokens: int) -> None:
        """Adopt a new request's prefix-hit blocks (vLLM's ``add_local_computed_blocks``);
        ``num_computed_tokens``: the hit and what a connector loads after it."""
        num_skipped = max(self.num_skipped_tokens(num_computed_tokens), 0) // self.block_size
        hit = list(hit[num_skipped:])
        if self.enable_caching:
            self._touch(hit)
        blocks = [NULL] * num_skipped + hit
        self.req_blocks[seq_id] = blocks
        self.num_cached_block[seq_id] = len(blocks)

    def allocate_external(self, seq_id, num_local_computed_tokens: int,
                          num_external_tokens: int) -> None:
        """Blocks for the tokens a connector loads after the hit, those the group keeps (vLLM's
        ``allocate_external_computed_blocks``)."""
        total = num_local_computed_tokens + num_external_tokens
        if self.num_skipped_tokens(total) > 0:
            num_external_tokens = min(total - self.num_skipped_tokens(total), num_external_tokens)
        if num_external_tokens <= 0:
            return
        blocks = self.req_blocks[seq_id]
        num_new = cdiv(total, self.block_size) - len(blocks)
        if num_new > 0:
            blocks += self._pop(num_new)

    def allocate_new(self, seq_id, num_tokens: int, num_tokens_main: int) -> None:
        blocks = self.req_blocks.setdefault(seq_id, [])
        num_new = cdiv(num_tokens, self.block_size) - len(blocks)
        if num_new > 0:
            blocks += self._pop(num_new)

    def remove_skipped(self, seq_id, num_processed_tokens: int) -> None:
        """Free the blocks no token after ``num_processed_tokens`` attends to."""
        num_skipped = self.num_skipped_tokens(num_processed_tokens)
        if num_skipped <= 0:
            return
        blocks = self.req_blocks.get(seq_id)
        if blocks is not None:
            self._remove_range(seq_id, 0, min(num_skipped // self.block_size, len(blocks)))

    def _remove_range(self, seq_id, first: int, last: int) -> None:
        """NULL out and free blocks ``[first, last)``, from the top down to the first NULL."""
        blocks = self.req_blocks[seq_id]
        freed = []
        for i in range(min(last, len(blocks)) - 1, first - 1, -1):
            if blocks[i] == NULL:
                break
            freed.append(blocks[i])
            blocks[i] = NULL
        if freed:
            self._free_blocks(freed)

    def reachable_mask(self, start: int, end: int, boundaries: Sequence[int]) -> list[bool] | None:
        """Which of blocks ``[start, end)`` a later hit can use (None: all)."""
        return None

    def cache_blocks(self, seq_id, req: RequestKeys, num_tokens: int) -> None:
        """Register the request's newly full blocks (vLLM caches at schedule time)."""
        if req.block_hashes is None:
            return
        num_cached = self.num_cached_block.get(seq_id, 0)
        num_full = min(num_tokens, len(req.block_hashes) * self.block_size) // self.block_size
        if num_cached >= num_full:
            return
        mask = self.reachable_mask(num_cached, num_full, req.replay_boundaries())
        blocks, hashes, key_of, salt = (self.req_blocks[seq_id], req.block_hashes,
                                        self.pool.block_key, self.salt)
        ids, keys = [], []
        for i in range(num_cached, num_full):
            block_id = blocks[i]
            if block_id == NULL or (mask is not None and not mask[i - num_cached]):
                continue
            key = hashes[i] ^ salt
            # vLLM only re-keys a block on a partial -> full promotion (sub-block hashes)
            assert key_of[block_id] is None, f"block {block_id} is already cached"
            ids.append(block_id)
            keys.append(key)
        if ids:
            self.pool.register_many(ids, keys)
        self.num_cached_block[seq_id] = num_full

    def free(self, seq_id) -> None:
        self._free_blocks(self.pop_for_free(seq_id)[::-1])

    def pop_for_free(self, seq_id) -> list[int]:
        """The request's blocks in table order, leading NULLs dropped; its state forgotten."""
        blocks = self.req_blocks.pop(seq_id, [])
        self.num_cached_block.pop(seq_id, None)
        num_null_head = 0
        while num_null_head < len(blocks) and blocks[num_null_head] == NULL:
            num_null_head += 1
        return blocks[num_null_head:]

    def new_step(self) -> None:
        return None

    # ---- lookup (one call per set of groups with equal specs) -----------------------------
    @staticmethod
    def find_hit(pool: BlockPool, salts: Sequence[int], spec: KVCacheGroupSpec, block_size: int,
                 block_hashes: Sequence[int], max_length: int) -> tuple[list[list[int]], int]:
        """Full attention: the longest run of blocks cached in every group, from block 0."""
        get = pool.get_cached_block
        hits: list[list[int]] = [[] for _ in salts]
        for i in range(min(max_length // block_size, len(block_hashes))):
            key = block_hashes[i]
            found = [get(key ^ s) for s in salts]
            if None in found:
                break
            for group_hits, block_id in zip(hits, found):
                group_hits.append(block_id)
        return hits, len(hits[0]) * block_size

    # ---- pool access (with per-group accounting) -----------------------------------------
    def _pop(self, n: int) -> list[int]:
        blocks = self.pool.pop(n)
        self.num_used_blocks += n
        group_of, group_id = self.block_group, self.group_id
        for block_id in blocks:
            group_of[block_id] = group_id
        return blocks

    def _touch(self, blocks: Sequence[int]) -> None:
        real = [b for b in blocks if b != NULL]
        ref = self.pool.ref_cnt
        self.num_used_blocks += sum(1 for b in real if ref[b] == 0)
        self.pool.touch(real)

    def _free_blocks(self, blocks_in_eviction_order: Sequence[int]) -> None:
        """vLLM's ``free_blocks``: blocks reaching ref 0 without a key go to the front of the
        free queue (in the given order), keyed ones to the back (LRU)."""
        real = [b for b in blocks_in_eviction_order if b != NULL]
        if self.enable_caching:
            key = self.pool.block_key
            first = [b for b in real if key[b] is None]
            ordered = first + [b for b in real if key[b] is not None]
        else:
            first = ordered = real
        num_free_before = self.pool.num_free_blocks
        self.pool.free(ordered, len(first))
        self.num_used_blocks -= self.pool.num_free_blocks - num_free_before


class FullAttentionManager(GroupManager):
    """Full attention (and MLA): every block kept until the request finishes."""


class SlidingWindowManager(GroupManager):
    """Sliding window: blocks wholly below the window of the next token are freed."""

    def __init__(self, spec: KVCacheGroupSpec, pool: BlockPool, group_id: int, block_size: int,
                 enable_caching: bool, block_group: list[int],
                 max_admission_blocks: int | None = None):
        super().__init__(spec, pool, group_id, block_size, enable_caching, block_group,
                         max_admission_blocks)
        self.sliding_window = spec.sliding_window

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # the next token (position num_computed_tokens) attends to the W tokens ending at it
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def reachable_mask(self, start: int, end: int, boundaries: Sequence[int]) -> list[bool]:
        # retention interval 0: only the blocks a hit at a replay boundary needs
        size = self.block_size
        need = cdiv(self.sliding_window - 1, size)
        mask = [False] * (end - start)
        for boundary in boundaries:
            stop = boundary // size
            for j in range(max(start, stop - need), min(end, stop)):
                mask[j - start] = True
        return mask

    @staticmethod
    def find_hit(pool: BlockPool, salts: Sequence[int], spec: KVCacheGroupSpec, block_size: int,
                 block_hashes: Sequence[int], max_length: int) -> tuple[list[list[int]], int]:
        """The rightmost run of ``cdiv(W - 1, B)`` cached blocks (the window of the first
        computed token), NULL below it; failing that, a shorter run that starts at block 0."""
        need = cdiv(spec.sliding_window - 1, block_size)
        num_blocks = max_length // block_size
        hits = [[NULL] * num_blocks for _ in salts]
        get = pool.get_cached_block
        run = 0
        for i in range(num_blocks - 1, -1, -1):
            key = block_hashes[i]
            found = [get(key ^ s) for s in salts]
            if None in found:
                run = 0
                continue
            for group_hits, block_id in zip(hits, found):
                group_hits[i] = block_id
            run += 1
            if run >= need:
                for group_hits in hits:
                    del group_hits[i + run:]
                return hits, (i + run) * block_size
        for group_hits in hits:
            del group_hits[run:]
        return hits, run * block_size


class MambaManager(GroupManager):
    """Mamba / linear-attention state: a fixed-size state per request.

    "align" mode (prefix caching on): the table is indexed by block position; entry ``p``
    holds the state after ``(p + 1) * B`` tokens. The running state moves to a new block at
    each block boundary (the old one is freed a step later), a prompt checkpoint may get its
    own block, and only states at a replay boundary are cached. "none" mode: one block
    (``block_size = max_model_len``) for the whole request.
    """

    def __init__(self, spec: KVCacheGroupSpec, pool: BlockPool, group_id: int, block_size: int,
                 enable_caching: bool, block_group: list[int],
                 max_admission_blocks: int | None = None):
        super().__init__(spec, pool, group_id, block_size, enable_caching, block_group,
                         max_admission_blocks)
        self.align = enable_caching
        self.checkpoint_alignment = spec.mamba_checkpoint_alignment
        self.last_state_index: dict[Hashable, int] = {}   # state block of the previous step
        self.num_retired_blocks: dict[Hashable, int] = {}
        self.allocated: set[Hashable] = set()
        self.checkpoints: dict[Hashable, tuple[int, int]] = {}   # (position, table index)
        self.cached_this_step: set[int] = set()          # keys registered in this step
        # the states cached since the last take, (request, block id, boundary tokens), for a
        # KV connector to offload (vLLM's _pending_boundary_state_offloads); None: no connector
        self.boundary_states: list[tuple[Hashable, int, int]] | None = None

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens - 1          # only the last state is needed

    def new_step(self) -> None:
        self.cached_this_step.clear()

    def checkpoint_position(self, num_tokens: int) -> int:
        """The last block boundary strictly before ``num_tokens`` (its last token is
        recomputed for logits)."""
        return max((num_tokens - 1) // self.block_size * self.block_size, 0)

    def checkpoint_valid(self, start: int, end: int, position: int) -> bool:
        """vLLM's ``is_mamba_prefill_checkpoint_valid``: the backend can export the state at
        ``position`` from inside the chunk ``[start, end)``."""
        size = self.block_size
        return (start % size == 0 and cdiv(end, size) - 2 > (start - 1) // size
                and start + size <= position and start < position < end
                and (position - start) % self.checkpoint_alignment == 0)

    def _needs_checkpoint(self, seq_id, start: int, end: int, position: int,
                          prefill_end: int) -> bool:
        if self.checkpoint_alignment is None or end < prefill_end \
                or not self.checkpoint_valid(start, end, position):
            return False
        index = cdiv(end, self.block_size) - 2
        blocks = self.req_blocks.get(seq_id, [])
        return index >= 0 and (index >= len(blocks) or blocks[index] == NULL)

    def blocks_to_allocate(self, seq_id, num_tokens: int, hit: Sequence[int],
                           total_computed_tokens: int, num_tokens_main: int,
                           apply_admission_cap: bool, prefill_end: int) -> int:
        if not self.align:
            return super().blocks_to_allocate(seq_id, num_tokens, hit, total_computed_tokens,
                                              num_tokens_main, apply_admission_cap, prefill_end)
        if hit and self.pool.block_key[hit[-1]] in self.cached_this_step:
            # a state cached by another request in this step is not written yet: not now
            return self.pool.num_blocks + 1
        num_tokens = num_tokens_main
        num_held = len(self.req_blocks.get(seq_id, ()))
        num_new = cdiv(num_tokens, self.block_size) - len(hit) - num_held
        position = self.checkpoint_position(num_tokens)
        if not self._needs_checkpoint(seq_id, total_computed_tokens, num_tokens, position,
                                      prefill_end):
            position = 0
        if not apply_admission_cap:
            if position > 0:
                self.checkpoints[seq_id] = (position, cdiv(num_tokens, self.block_size) - 2)
            else:
                self.checkpoints.pop(seq_id, None)
        if num_new > 0:
            # at most the running state, plus the checkpoint's own block
            num_new = min(num_new, 1 + (position > 0))
        ref = self.pool.ref_cnt
        return num_new + sum(1 for b in hit if b != NULL and ref[b] == 0)

    def allocate_new(self, seq_id, num_tokens: int, num_tokens_main: int) -> None:
        if not self.align:
            return super().allocate_new(seq_id, num_tokens, num_tokens_main)
        blocks = self.req_blocks.setdefault(seq_id, [])
        num_required = cdiv(num_tokens_main, self.block_size)
        checkpoint = seq_id in self.checkpoints
        if num_required <= len(blocks) and not checkpoint:
            self.allocated.add(seq_id)
            return
        num_held = len(blocks)
        if seq_id in self.allocated or num_held > 0:
            self.last_state_index[seq_id] = num_held - 1
        null_end = num_required - 1 - checkpoint
        if num_held < num_required - 1 and null_end > num_held:
            blocks += [NULL] * (null_end - num_held)
        num_new = num_required - len(blocks)
        if num_new > 0:
            blocks += self._pop(num_new)
        self.allocated.add(seq_id)

    def remove_skipped(self, seq_id, num_processed_tokens: int) -> None:
        super().remove_skipped(seq_id, num_processed_tokens)
        if not self.align:
            return
        index = self.last_state_index.get(seq_id)
        if index is not None and index < cdiv(num_processed_tokens, self.block_size) - 1:
            blocks = self.req_blocks[seq_id]
            if blocks[index] != NULL:
                # the previous step's state was copied into this step's block: free it
                self._free_blocks([blocks[index]])
                blocks[index] = NULL

    def _remove_range(self, seq_id, first: int, last: int) -> None:
        if not self.align:
            return super()._remove_range(seq_id, first, last)
        blocks = self.req_blocks[seq_id]
        first = max(first, self.num_retired_blocks.get(seq_id, 0))
        last = min(last, len(blocks))
        if first >= last:
            return
        freed = []
        for i in range(last - 1, first - 1, -1):   # NULL gaps between states: skip, not stop
            if blocks[i] != NULL:
                freed.append(blocks[i])
                blocks[i] = NULL
        if freed:
            self._free_blocks(freed)
        self.num_retired_blocks[seq_id] = last

    def reachable_mask(self, start: int, end: int, boundaries: Sequence[int]) -> list[bool]:
        # a hit needs exactly the state block that ends on a replay boundary
        mask = [False] * (end - start)
        for boundary in boundaries:
            index = boundary // self.block_size - 1
            if start <= index < end:
                mask[index - start] = True
        return mask

    def cache_blocks(self, seq_id, req: RequestKeys, num_tokens: int) -> None:
        before = self.num_cached_block.get(seq_id, 0)
        super().cache_blocks(seq_id, req, num_tokens)
        after = self.num_cached_block.get(seq_id, 0)
        key = self._cache_checkpoint(seq_id, req, num_tokens)
        if key is not None:
            self.cached_this_step.add(key)
        if after > before:
            blocks, key_of = self.req_blocks[seq_id], self.pool.block_key
            states = self.boundary_states
            for i in range(before, after):
                if blocks[i] != NULL and key_of[blocks[i]] is not None:
                    self.cached_this_step.add(key_of[blocks[i]])
                    if states is not None:       # every retained state, with its exact block
                        states.append((seq_id, blocks[i], (i + 1) * self.block_size))

    def _cache_checkpoint(self, seq_id, req: RequestKeys, num_tokens: int) -> int | None:
        """Key the block holding the prompt's checkpoint state (vLLM's
        ``_cache_partial_tail_block`` where hits are block-aligned)."""
        size, pool = self.block_size, self.pool
        checkpoint = self.checkpoints.get(seq_id)
        if checkpoint is not None:
            position, index = checkpoint
            block_id = self.req_blocks[seq_id][index]
            if position != self.checkpoint_position(req.num_prompt_tokens) \
                    and position != req.shared_prefix_boundary:
                # a transient state: the slot is overwritten, so it must not be hit
                if block_id != NULL:
                    pool.unregister(block_id)
                return None
            return self._key_block(block_id, req, position, replace=True)
        if num_tokens <= 0 or num_tokens % size \
                or num_tokens != self.checkpoint_position(req.num_prompt_tokens):
            return None
        blocks = self.req_blocks[seq_id]
        index = num_tokens // size - 1
        if index >= len(blocks) or blocks[index] == NULL:
            return None
        return self._key_block(blocks[index], req, num_tokens, replace=False)

    def _key_block(self, block_id: int, req: RequestKeys, position: int,
                   replace: bool) -> int | None:
        if block_id == NULL or req.block_hashes is None:
            return None
        pool = self.pool
        key = req.block_hashes[position // self.block_size - 1] ^ self.salt
        if pool.block_key[block_id] == key:
            # already keyed here (a hit, or an earlier step): nothing new this step
            return None
        if replace:
            pool.unregister(block_id)
        assert pool.block_key[block_id] is None, f"block {block_id} keyed twice"
        pool.register(block_id, key)
        return key

    def pop_for_free(self, seq_id) -> list[int]:
        if self.boundary_states:
            # its blocks go back to the pool: states not taken yet are no longer offered
            self.boundary_states = [s for s in self.boundary_states if s[0] != seq_id]
        self.allocated.discard(seq_id)
        self.last_state_index.pop(seq_id, None)
        self.num_retired_blocks.pop(seq_id, None)
        self.checkpoints.pop(seq_id, None)
        return super().pop_for_free(seq_id)

    @staticmethod
    def find_hit(pool: BlockPool, salts: Sequence[int], spec: KVCacheGroupSpec, block_size: int,
                 block_hashes: Sequence[int], max_length: int) -> tuple[list[list[int]], int]:
        """The rightmost cached state at or below ``max_length``; NULL before it."""
        get = pool.get_cached_block
        for i in range(max_length // block_size - 1, -1, -1):
            key = block_hashes[i]
            found = [get(key ^ s) for s in salts]
            if None not in found:
                return [[NULL] * i + [block_id] for block_id in found], (i + 1) * block_size
        return [[] for _ in salts], 0


MANAGER_OF_KIND = {"full_attention": FullAttentionManager,
                   "sliding_window": SlidingWindowManager, "mamba": MambaManager}
