"""Synthetic pool snapshots with the PoolSnapshot fields, for figure tests and the render bench.

They look like a busy pool (scattered paged blocks with shared prefixes and cached blocks;
contiguous extents with reservations and holes) but come from a seeded generator, not from an
allocator, so figures can be tested and timed at any size without running a simulation.
"""
from __future__ import annotations

import numpy as np

from kvsim.allocator import MEMORY_CLASSES, PoolSnapshot

_C = {name: i for i, name in enumerate(MEMORY_CLASSES)}


def synthetic_snapshot(num_cells: int, block_size: int = 16, kind: str = "paged",
                       seed: int = 0, num_seqs: int | None = None):
    """A PoolSnapshot of ``num_cells`` cells.

    Args:
        num_cells: blocks (paged) or cells (contiguous) in the pool.
        block_size: tokens per cell.
        kind: "paged" or "contiguous".
        seed: generator seed (same seed, same arrays).
        num_seqs: live sequences (default: about one per 40 cells).
    Returns:
        the PoolSnapshot.
    """
    if kind not in ("paged", "contiguous"):
        raise ValueError(f"kind must be 'paged' or 'contiguous', got {kind!r}")
    rng = np.random.Generator(np.random.PCG64(seed))
    n = int(num_cells)
    num_seqs = num_seqs if num_seqs is not None else max(1, n // 40)
    cell_class = np.full(n, _C["free"], dtype=np.int8)
    owner = np.full(n, -1, dtype=np.int64)
    ref_cnt = np.zeros(n, dtype=np.int32)
    fill = np.zeros(n, dtype=np.int32)
    block_key = np.zeros(n, dtype=np.uint64)
    tables: dict[int, np.ndarray] = {}
    seq_lens: dict[int, int] = {}
    if kind == "paged":
        order = rng.permutation(n)
        pos = 0
        shared_len = max(1, min(8, n // 20))
        shared = order[:shared_len]
        pos = shared_len
        cell_class[shared] = _C["token_states"]
        fill[shared] = block_size
        block_key[shared] = rng.integers(1, 2**63, shared_len, dtype=np.uint64)
        for seq_id in range(num_seqs):
            nblk = int(rng.integers(2, 30))
            if pos + nblk > int(n * 0.8):
                break
            mine = order[pos:pos + nblk]
            pos += nblk
            share = seq_id % 3 == 0  # every third sequence shares the system-prompt blocks
            table = np.concatenate([shared, mine]) if share else mine
            if share:
                ref_cnt[shared] += 1
                owner[shared] = np.where(owner[shared] < 0, seq_id, owner[shared])
            cell_class[mine] = _C["token_states"]
            owner[mine] = seq_id
            ref_cnt[mine] = 1
            fill[mine] = block_size
            last_fill = int(rng.integers(1, block_size + 1))
            fill[mine[-1]] = last_fill
            block_key[mine[:-1]] = rng.integers(1, 2**63, nblk - 1, dtype=np.uint64)
            tables[seq_id] = table.astype(np.int64)
            seq_lens[seq_id] = (len(table) - 1) * block_size + last_fill
        ncached = (n - pos) // 4
        cached = order[pos:pos + ncached]
        cell_class[cached] = _C["cached"]
        block_key[cached] = rng.integers(1, 2**63, ncached, dtype=np.uint64)
        fill[cached] = block_size
        unused = ref_cnt[shared] == 0
        cell_class[shared[unused]] = _C["cached"]
    else:
        pos = 0
        for seq_id in range(num_seqs):
            pos += int(rng.integers(0, 6))  # a hole before the extent
            ext = int(rng.integers(4, 64))
            if pos + ext > n:
                break
            used = int(rng.integers(1, ext + 1))
            reserved = int(rng.integers(0, ext - used + 1))
            cells = np.arange(pos, pos + ext)
            cell_class[cells[:used]] = _C["token_states"]
            cell_class[cells[used:used + reserved]] = _C["reservation"]
            cell_class[cells[used + reserved:]] = _C["internal_fragmentation"]
            fill[cells[:used]] = block_size
            owner[cells] = seq_id
            ref_cnt[cells] = 1
            tables[seq_id] = cells.astype(np.int64)
            seq_lens[seq_id] = used * block_size
            pos += ext
        holes = (cell_class == _C["free"]) & (np.arange(n) < pos)
        cell_class[holes] = _C["external_fragmentation"]
    return PoolSnapshot(kind=kind, block_size=block_size, num_cells=n, cell_class=cell_class,
                        owner=owner, ref_cnt=ref_cnt, fill=fill, block_key=block_key,
                        block_tables=tables, seq_lens=seq_lens)
