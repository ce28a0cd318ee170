"""Memory accounting shared by every allocator: the six slot classes and the pool snapshot.

Every slot of a pool is, at every moment, in exactly one class (DESIGN.md, vLLM paper section 3.1):

=========================  ==================================================================
token_states               slots holding KV of tokens the sequence already has
reservation                slots held for tokens the sequence will still produce
internal_fragmentation     held slots nobody will ever fill (over-reservation, the unused
                           tail of a partially filled block, vLLM's null block)
external_fragmentation     free slots that cannot serve the waiting request (holes too small,
                           buddy rounding waste)
cached                     free blocks still holding reusable prefix KV (paged only)
free                       everything else
=========================  ==================================================================

``breakdown()`` returns a dict over MEMORY_CLASSES (slots) that sums to the pool's capacity;
``snapshot()`` returns a PoolSnapshot: plain numpy arrays for the UI and the kernels, never
allocator objects.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MEMORY_CLASSES = ("token_states", "reservation", "internal_fragmentation",
                  "external_fragmentation", "cached", "free")
TOKEN_STATES, RESERVATION, INTERNAL, EXTERNAL, CACHED, FREE = range(len(MEMORY_CLASSES))


def make_breakdown(token_states: int, reservation: int, internal_fragmentation: int,
                   external_fragmentation: int, cached: int, free: int) -> dict[str, int]:
    """The breakdown dict, keys in MEMORY_CLASSES order (slots)."""
    return {"token_states": token_states, "reservation": reservation,
            "internal_fragmentation": internal_fragmentation,
            "external_fragmentation": external_fragmentation, "cached": cached, "free": free}


def check_breakdown(breakdown: dict[str, int], capacity_slots: int) -> None:
    """Assert that ``breakdown`` has the six classes, none negative, summing to the capacity."""
    assert tuple(breakdown) == MEMORY_CLASSES, f"classes {tuple(breakdown)}"
    assert all(v >= 0 for v in breakdown.values()), f"negative class in {breakdown}"
    total = sum(breakdown.values())
    assert total == capacity_slots, f"breakdown sums to {total}, capacity is {capacity_slots}"


@dataclass(frozen=True)
class PoolSnapshot:
    """A picture of a pool at one moment, as numpy arrays (one row per cell).

    A cell is a block for a paged pool and one token slot for a contiguous pool.
    """

    kind: str                 # "paged" or "contiguous"
    block_size: int           # tokens per cell
    num_cells: int
    cell_class: np.ndarray    # int8 [num_cells]: index into MEMORY_CLASSES (dominant class)
    owner: np.ndarray         # int64 [num_cells]: seq_id holding the cell, -1 none (shared:
    #                           lowest); with ids that are not ints, the id's index in owner_ids
    ref_cnt: np.ndarray       # int32 [num_cells]: sequences referencing the cell
    fill: np.ndarray          # int32 [num_cells]: slots of the cell holding tokens
    block_key: np.ndarray     # uint64 [num_cells]: prefix-cache key, 0 none
    block_tables: dict[int, np.ndarray] = field(default_factory=dict)  # seq_id -> cells
    seq_lens: dict[int, int] = field(default_factory=dict)             # seq_id -> tokens
    owner_ids: tuple | None = None  # None: owner values are the (int) seq_ids; else code -> id
    # the engine step that ran just before the snapshot, in batch order (set by the simulator;
    # None from a bare allocator): which sequences, and how many tokens each computed in it
    step_seq_ids: np.ndarray | None = None          # int64 [num_step_seqs]
    step_num_new_tokens: np.ndarray | None = None   # int64 [num_step_seqs], >= 1
    # KV-cache groups (GroupedPagedAllocator): the group holding each cell (-1 none; a cached
    # free cell: the group whose key it carries), every group's tables, the groups' names
    block_group: np.ndarray | None = None
    group_block_tables: dict | None = None  # seq_id -> (cells of group 0, of group 1, ...)
    group_names: tuple | None = None

    def __post_init__(self):
        if self.kind not in ("paged", "contiguous"):
            raise ValueError(f"kind must be 'paged' or 'contiguous', got {self.kind!r}")
        for name in ("cell_class", "owner", "ref_cnt", "fill", "block_key"):
            n = len(getattr(self, name))
            if n != self.num_cells:
                raise ValueError(f"{name} has {n} cells, num_cells is {self.num_cells}")

    def owner_id(self, code: int):
        """The seq_id behind an ``owner`` value (None for -1, no owner)."""
        if code < 0:
            return None
        return code if self.owner_ids is None else self.owner_ids[code]

    def class_counts(self) -> dict[str, int]:
        """Cells per class (dominant class of each cell)."""
        counts = np.bincount(self.cell_class, minlength=len(MEMORY_CLASSES))
        return dict(zip(MEMORY_CLASSES, (int(c) for c in counts)))


def pool_cells(pool, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Snapshot arrays of a BlockPool before any table is written: (cell_class, owner, fill,
    block_key), with cached free blocks CACHED and full, the null block INTERNAL, the rest
    FREE and unowned."""
    n = pool.num_blocks
    cell_class = np.full(n, FREE, dtype=np.int8)
    owner = np.full(n, -1, dtype=np.int64)
    fill = np.zeros(n, dtype=np.int32)
    block_key = np.zeros(n, dtype=np.uint64)
    for block_id, key in enumerate(pool.block_key):
        if key is not None:
            block_key[block_id] = pool.key_of(block_id) & 0xFFFFFFFFFFFFFFFF
            if pool.ref_cnt[block_id] == 0:
                cell_class[block_id] = CACHED
                fill[block_id] = block_size
    if pool.null_block is not None:
        cell_class[pool.null_block] = INTERNAL
    return cell_class, owner, fill, block_key
