import pytest
from hypothesis import given, strategies as st

from kvsim.workloads.keys import SegmentKeys, hash_token_blocks, rekey_blocks


def test_token_keys_chain_over_the_whole_prefix():
    a = hash_token_blocks(list(range(48)), 16)
    b = hash_token_blocks([999] + list(range(1, 48)), 16)
    assert len(a) == 3
    assert all(x != y for x, y in zip(a, b))  # a change in token 0 changes every later key
    assert hash_token_blocks(list(range(40)), 16) == a[:2]  # partial tail block gets no key


def test_segment_keys_match_where_content_matches():
    shared = [(7, 100)]
    a = SegmentKeys(shared + [(1, 50)], 16)
    b = SegmentKeys(shared + [(2, 80)], 16)
    assert len(a) == 150 // 16 and len(b) == 180 // 16
    assert list(a)[:6] == list(b)[:6]  # blocks 0..5 end at token 95 < 100: inside the shared part
    assert a[6] != b[6]  # block 6 ends at token 111, past the shared part


def test_mooncake_ids_map_to_any_block_size():
    a = rekey_blocks([0, 5, 9], 512, 1300, 64)
    b = rekey_blocks([0, 5, 7], 512, 1400, 64)
    assert list(a)[:16] == list(b)[:16]  # the first 1024 tokens are the same
    assert a[16] != b[16]


@given(st.lists(st.integers(0, 2**63), min_size=1, max_size=64), st.sampled_from([1, 2, 8, 16]))
def test_rekey_at_key_granularity_is_injective_on_ids(ids, bs):
    # equal keys at the same position iff equal id prefixes
    k1 = rekey_blocks(ids, 16, 16 * len(ids), bs)
    k2 = rekey_blocks(ids[:-1] + [ids[-1] + 1], 16, 16 * len(ids), bs)
    n = 16 * (len(ids) - 1) // bs
    assert list(k1)[:n] == list(k2)[:n]
    assert k1[-1] != k2[-1]


def test_deferred_keys_equal_eager_ones_and_are_made_on_first_read():
    segments = ((7, 40), (9, 25), (11, 3))
    calls = []

    def make():
        calls.append(1)
        return segments

    eager = SegmentKeys(segments, 16, num_shareable_tokens=50)
    lazy = SegmentKeys.deferred(make, 68, 16, num_shareable_tokens=50)
    # lengths need no segments
    assert (len(lazy), lazy.num_shareable_blocks) == (4, 3)
    assert (len(eager), eager.num_shareable_blocks) == (4, 3)
    assert not calls
    assert lazy[1:3] == eager[1:3] and list(lazy) == list(eager) and lazy[-1] == eager[-1]
    assert len(calls) == 1          # made once
    wrong = SegmentKeys.deferred(lambda: segments, 70, 16, num_shareable_tokens=0)
    with pytest.raises(ValueError, match="cover 68 tokens, expected 70"):
        wrong[0]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40)), min_size=1, max_size=5),
       st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40)), min_size=1, max_size=5),
       st.sampled_from([1, 4, 16]))
def test_block_runs_name_equal_keys_by_segment_key_and_block_number(seg_a, seg_b, bs):
    a, b = SegmentKeys(seg_a, bs), SegmentKeys(seg_b, bs)
    runs_a, runs_b = a.block_runs(len(a)), b.block_runs(len(b))
    # the runs partition the blocks in order
    assert [first for _, first, _ in runs_a] == [sum(n for _, _, n in runs_a[:i])
                                                 for i in range(len(runs_a))]
    assert sum(n for _, _, n in runs_a) == len(a)
    name_a = {first + j: (seg, j) for seg, first, n in runs_a for j in range(n)}
    name_b = {first + j: (seg, j) for seg, first, n in runs_b for j in range(n)}
    for i in range(min(len(a), len(b))):
        assert (a[i] == b[i]) == (name_a[i] == name_b[i])
    assert a.block_runs(len(a) // 2) == [run for run in (
        (seg, first, min(n, len(a) // 2 - first)) for seg, first, n in runs_a) if run[2] > 0]
