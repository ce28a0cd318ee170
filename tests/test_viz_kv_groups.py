"""viz.kv_groups: each group's view of the pool and a request's tables across groups."""
import numpy as np
import pytest

from kvsim.allocator import GroupedPagedAllocator, KVCacheGroupSpec, hash_token_blocks
from kvsim.viz.kv_groups import (group_counts, group_pool_figure, group_view,
                                 request_tables_figure)
from kvsim.viz.pool import CODE_EXTERNAL, cell_codes


def hybrid_snapshot(num_decodes: int):
    alloc = GroupedPagedAllocator(80, 16, [KVCacheGroupSpec("sliding_window", sliding_window=32,
                                                            name="sliding 32"),
                                           KVCacheGroupSpec("full_attention", name="full")],
                                  max_model_len=1024, max_num_batched_tokens=512)
    keys = hash_token_blocks(list(range(400)), 16)
    assert alloc.allocate_slots(3, 64, num_computed_tokens=0, num_tokens=64, num_prompt_tokens=64,
                                block_hashes=keys)
    for c in range(64, 64 + num_decodes):
        assert alloc.allocate_slots(3, 1, num_computed_tokens=c, num_tokens=c + 1,
                                    num_prompt_tokens=64, block_hashes=keys)
    return alloc.snapshot()


def test_each_group_sees_the_other_groups_blocks_as_taken():
    snap = hybrid_snapshot(40)
    view = group_view(snap, 0)
    codes = cell_codes(view.cell_class, view.owner, view.ref_cnt)
    full_blocks = snap.group_block_tables[3][1]
    assert (codes[full_blocks] == CODE_EXTERNAL).all()          # grey in the sliding view
    sliding = snap.group_block_tables[3][0]
    held = sliding[sliding != 0]
    assert (codes[held] != CODE_EXTERNAL).all()


def test_the_sliding_window_leaves_released_positions_behind_as_the_request_decodes():
    before, after = group_counts(hybrid_snapshot(0)), group_counts(hybrid_snapshot(60))
    assert before[0]["released_positions"] < after[0]["released_positions"]
    assert after[1]["released_positions"] == 0                   # full attention keeps all
    assert after[0]["held_blocks"] < after[1]["held_blocks"]
    fig = request_tables_figure(hybrid_snapshot(60), 3)
    z = fig.data[0].z
    assert np.nansum(z[0] == 0) == after[0]["released_positions"] and np.nansum(z[1] == 0) == 0


def test_figures_build_and_name_the_groups():
    snap = hybrid_snapshot(20)
    fig = group_pool_figure(snap)
    assert [t.name for t in fig.data[:2]] == ["sliding 32", "full"]
    assert "sliding 32" in fig.layout.annotations[0].text
    # one block axis: the second panel's labels would overlap the first panel
    assert fig.layout.yaxis2.matches == "y" and fig.layout.yaxis2.showticklabels is False
    with pytest.raises(ValueError, match="not in this snapshot"):
        request_tables_figure(snap, 99)
