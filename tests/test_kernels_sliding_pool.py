"""The unified kernel with a sliding window over a simulated sliding-window pool (the sliding
group's tables of GroupedPagedAllocator, NULL below the window, freed blocks reused by others)
equals dense attention with the window mask (CPU: Triton interpreter)."""
import numpy as np
import pytest
import torch

from kvsim.allocator import GroupedPagedAllocator, KVCacheGroupSpec, hash_token_blocks
from kvsim.allocator.group_managers import NULL
from kvsim.kernels.bridge import pool_arrays, validate_step

WINDOW = 40


def sliding_pool():
    """A pool after three requests grew past the window: their sliding tables start with NULL
    and the blocks they freed went to later requests."""
    alloc = GroupedPagedAllocator(48, 16, [KVCacheGroupSpec("full_attention"),
                                           KVCacheGroupSpec("sliding_window",
                                                            sliding_window=WINDOW)],
                                  max_model_len=1024, max_num_batched_tokens=256)
    lengths = {}
    for seq_id, (prompt, decodes) in enumerate([(70, 30), (100, 12), (20, 60), (33, 1)]):
        tokens = [seq_id * 1000 + i for i in range(prompt + decodes)]
        keys = hash_token_blocks(tokens, 16)
        assert alloc.allocate_slots(seq_id, prompt, num_computed_tokens=0, num_tokens=prompt,
                                    num_prompt_tokens=prompt, block_hashes=keys)
        for c in range(prompt, prompt + decodes - 1):
            assert alloc.allocate_slots(seq_id, 1, num_computed_tokens=c, num_tokens=c + 1,
                                        num_prompt_tokens=prompt, block_hashes=keys)
        lengths[seq_id] = prompt + decodes - 1
    return alloc, lengths


def test_sliding_tables_hold_nulls_below_the_window():
    alloc, lengths = sliding_pool()
    snap = alloc.snapshot()
    sliding = {s: tables[1] for s, tables in snap.group_block_tables.items()}
    assert (sliding[0][:3] == NULL).all() and (sliding[2][:2] == NULL).all()
    for s, table in sliding.items():
        first_needed = max(0, lengths[s] - 1 - WINDOW + 1) // 16     # the last token's window
        assert (table[first_needed:] != NULL).all()


@pytest.mark.parametrize("partition_size", [None, 16])
def test_unified_kernel_with_window_on_the_sliding_pool_equals_dense(partition_size):
    alloc, lengths = sliding_pool()
    snap = alloc.snapshot()
    # the sliding group's view of the pool: its tables (with NULLs), the pool's content keys
    arrays = pool_arrays(block_tables={s: t[1] for s, t in snap.group_block_tables.items()},
                         seq_lens=snap.seq_lens, num_blocks=snap.num_cells,
                         block_size=snap.block_size, block_key=snap.block_key)
    seq_ids = sorted(arrays.block_tables)
    report = validate_step(arrays, seq_ids, [1] * len(seq_ids), sliding_window=WINDOW,
                           partition_size=partition_size, dtype=torch.float32)
    # the bridge writes only the slots inside each window; the NULL entries below it point at
    # block 0, which stays NaN: a kernel that read below the window would fail here
    assert report.passed, [c for c in report.checks if not c.passed]
    assert len(report.checks) == 4 and max(c.max_rel_err for c in report.checks) <= 1e-5
    assert np.isfinite([c.max_abs_err for c in report.checks]).all()
