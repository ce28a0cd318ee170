"""kvsim.kernels.bridge and ``kvsim validate --snapshot`` on hand-built pool snapshots (CPU interpreter)."""
import argparse
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import kvsim.kernels.attention
from kvsim.cli import validate as validate_cmd
from kvsim.errors import InputError
from kvsim.kernels.bridge import (block_seeds, choose_sequences, load_snapshot, pool_arrays, save_snapshot,
                                  token_kv, validate_snapshot, validate_step, with_step)


def paged_snapshot():
    """A PoolSnapshot look-alike: seqs 0 and 1 share a two-block prefix (blocks 3, 7); seq 2 starts
    with block 9, a second copy of block 3's content (same key); seq 4 has no tokens yet; blocks 1, 5
    are partial last blocks; blocks 4, 6, 8, 10, 11 are free (NaN in the pool)."""
    num_cells = 12
    keys = np.zeros(num_cells, dtype=np.uint64)
    keys[[3, 7, 9]] = [0xABC, 0xDEF, 0xABC]
    return SimpleNamespace(
        kind="paged", block_size=16, num_cells=num_cells,
        cell_class=np.zeros(num_cells, np.int8), owner=np.full(num_cells, -1, np.int64),
        ref_cnt=np.zeros(num_cells, np.int32), fill=np.zeros(num_cells, np.int32), block_key=keys,
        block_tables={0: np.array([3, 7, 1]), 1: np.array([3, 7, 5, 0]), 2: np.array([9, 2]), 4: np.array([], int)},
        seq_lens={0: 40, 1: 50, 2: 17, 4: 0})


@pytest.mark.parametrize("layout,dtype,partition_size", [("flat", torch.float32, None),
                                                          ("vllm", torch.float16, 16)])
def test_snapshot_with_shared_prefix_blocks_validates(layout, dtype, partition_size):
    report = validate_snapshot(paged_snapshot(), layout=layout, dtype=dtype, partition_size=partition_size)
    assert report.passed
    by_seq = {c.seq_id: c for c in report.checks}
    assert sorted(by_seq) == [0, 1, 2] and report.num_skipped_empty == 1
    assert by_seq[0].num_shared_blocks == 2 and by_seq[1].num_shared_blocks == 2
    assert by_seq[2].num_shared_blocks == 0 and by_seq[2].num_blocks == 2
    assert all(c.bitwise_equal for c in report.checks)
    assert max(c.max_rel_err for c in report.checks) <= report.tolerance


def test_equal_keys_give_equal_content():
    arrays = pool_arrays(paged_snapshot())
    seeds = block_seeds(arrays)
    offsets = np.arange(16)
    same_a = token_kv(np.full(16, seeds[3]), offsets, 2, 8)
    same_b = token_kv(np.full(16, seeds[9]), offsets, 2, 8)
    other = token_kv(np.full(16, seeds[7]), offsets, 2, 8)
    unkeyed = token_kv(np.full(16, seeds[1]), offsets, 2, 8)
    assert np.array_equal(same_a, same_b)
    assert not np.allclose(same_a, other) and not np.allclose(unkeyed, token_kv(np.full(16, seeds[2]), offsets, 2, 8))
    assert np.abs(same_a).max() < 1 and same_a.std() > 0.4  # spread over [-1, 1)


def test_validation_detects_a_wrong_block_table(monkeypatch):
    # a kernel that reads one wrong block must fail the check: the check can fail
    real = kvsim.kernels.attention.unified_attention

    def off_by_one_block(query, key_cache, value_cache, block_tables, *args, **kwargs):
        tables = block_tables.clone()
        tables[0, 0] = tables[0, 1]
        return real(query, key_cache, value_cache, tables, *args, **kwargs)

    monkeypatch.setattr(kvsim.kernels.attention, "unified_attention", off_by_one_block)
    report = validate_snapshot(paged_snapshot())
    assert not report.passed
    assert [c.passed for c in report.checks] == [False, True, True]


def test_contiguous_snapshot_cells_of_one_token():
    # contiguous pools: a cell is one token slot and a table lists the cells of the extent
    extents = {0: np.arange(5, 45), 3: np.arange(60, 61), 7: np.arange(100, 133)}
    report = validate_snapshot(pool_arrays(block_tables=extents, seq_lens={0: 40, 3: 1, 7: 30},
                                           num_blocks=140, block_size=1))
    assert report.passed and [c.num_tokens for c in report.checks] == [40, 1, 30]


def test_save_load_round_trip(tmp_path):
    path = tmp_path / "pool.npz"
    save_snapshot(path, paged_snapshot())
    loaded = load_snapshot(path)
    original = pool_arrays(paged_snapshot())
    assert (loaded.kind, loaded.block_size, loaded.num_blocks) == ("paged", 16, 12)
    assert np.array_equal(loaded.block_key, original.block_key) and loaded.seq_lens == original.seq_lens
    assert all(np.array_equal(loaded.block_tables[s], original.block_tables[s]) for s in original.block_tables)
    assert sorted(loaded.extra) == ["cell_class", "fill", "owner", "ref_cnt"]


def test_load_snapshot_errors_name_file_and_field(tmp_path):
    path = tmp_path / "broken.npz"
    np.savez(path, kind=np.array("paged"), block_size=np.int64(16))
    with pytest.raises(ValueError, match=r"broken.npz: field 'num_cells' is missing"):
        load_snapshot(path)
    text = tmp_path / "pool.npz"
    text.write_text("not a zip")
    with pytest.raises(ValueError, match="not a snapshot .npz file"):
        load_snapshot(text)


@pytest.mark.parametrize("tables,lens,message", [
    ({0: [1]}, {0: 20}, "20 tokens need 2 blocks of 16"),
    ({0: [1, 12]}, {0: 20}, "block id 12 is outside the pool of 12 blocks"),
    ({0: [1]}, {1: 3}, "name different sequences"),
])
def test_pool_arrays_rejects_inconsistent_tables(tables, lens, message):
    with pytest.raises(ValueError, match=message):
        pool_arrays(block_tables=tables, seq_lens=lens, num_blocks=12, block_size=16)


def _parser():
    parser = argparse.ArgumentParser(prog="kvsim")
    validate_cmd.register(parser.add_subparsers(dest="command"))
    return parser


def test_validate_command_on_a_snapshot_file(tmp_path, capsys):
    path = tmp_path / "pool.npz"
    save_snapshot(path, paged_snapshot())
    out_json = tmp_path / "report.json"
    copy = tmp_path / "copy.npz"
    args = _parser().parse_args(["validate", "--snapshot", str(path), "--device", "cpu", "--json", str(out_json),
                                 "--save-snapshot", str(copy)])
    assert args.func(args) == 0
    assert load_snapshot(copy).seq_lens == load_snapshot(path).seq_lens
    text = capsys.readouterr().out
    assert ("3 of 3 sequences checked (1 with 0 tokens not run; 2 of the 2 shared blocks read by two "
            "checked sequences), 2 with shared blocks") in text and "PASS" in text
    report = json.loads(out_json.read_text())
    assert report["passed"] and len(report["checks"]) == 3


@pytest.mark.parametrize("argv,message", [
    (["validate"], "exactly one of --snapshot FILE or WORKLOAD"),
    (["validate", "sharegpt:n=5", "--snapshot", "x.npz"], "exactly one of"),
    (["validate", "sharegpt:n=5"], "WORKLOAD needs --at SECONDS"),
    (["validate", "--snapshot", "x.npz", "--partition-size", "24"], "--partition-size must be a multiple of 16"),
    (["validate", "--snapshot", "x.npz", "--num-heads", "6", "--num-kv-heads", "4"],
     "--num-heads 6 is not a multiple of --num-kv-heads 4"),
    (["validate", "--snapshot", "x.npz", "--sliding-window", "8"], "--sliding-window applies to --step"),
    (["validate", "--snapshot", "x.npz", "--step", "--max-seqs", "2"], "--max-seqs does not apply to --step"),
])
def test_validate_command_rejects_bad_arguments(argv, message):
    args = _parser().parse_args(argv)
    with pytest.raises(InputError, match=message):
        args.func(args)


def mixed_snapshot():
    """A pool in the middle of a mixed step (block size 16): seq 0 hit the prefix cache on blocks 3
    and 7 (32 tokens, shared with seq 1) and prefills 40 more tokens; seq 1 decodes its 50th token;
    seq 2 runs a chunk of 20 tokens that starts mid-block, after 5 computed ones; seq 4 is not
    scheduled. The snapshot's seq_lens count the step's tokens."""
    num_cells = 12
    keys = np.zeros(num_cells, dtype=np.uint64)
    keys[[3, 7]] = [0xABC, 0xDEF]
    return SimpleNamespace(
        kind="paged", block_size=16, num_cells=num_cells, block_key=keys,
        block_tables={0: np.array([3, 7, 1, 5, 8]), 1: np.array([3, 7, 6, 0]), 2: np.array([9, 2]),
                      4: np.array([10])},
        seq_lens={0: 72, 1: 50, 2: 25, 4: 10})


STEP = dict(seq_ids=[0, 1, 2], num_new_tokens=[40, 1, 20])


@pytest.mark.parametrize("layout,dtype,partition_size,window", [("flat", torch.float32, None, None),
                                                                 ("vllm", torch.float16, 16, None),
                                                                 ("flat", torch.float32, None, 8)])
def test_mixed_step_validates(layout, dtype, partition_size, window):
    report = validate_step(mixed_snapshot(), **STEP, layout=layout, dtype=dtype, partition_size=partition_size,
                           sliding_window=window)
    assert report.passed and report.num_tokens == 61
    assert [(c.seq_id, c.num_computed_tokens, c.num_new_tokens) for c in report.checks] == \
        [(0, 32, 40), (1, 49, 1), (2, 5, 20)]
    assert [c.num_shared_blocks for c in report.checks] == [2, 2, 0]
    assert all(c.bitwise_equal for c in report.checks)
    assert max(c.max_rel_err for c in report.checks) <= report.tolerance


def test_mixed_step_detects_a_wrong_block_table(monkeypatch):
    real = kvsim.kernels.attention.unified_attention

    def wrong_block(query, key_cache, value_cache, block_tables, *args, **kwargs):
        tables = block_tables.clone()
        tables[2, 1] = tables[0, 4]  # seq 2's second block replaced by one of seq 0's
        return real(query, key_cache, value_cache, tables, *args, **kwargs)

    monkeypatch.setattr(kvsim.kernels.attention, "unified_attention", wrong_block)
    report = validate_step(mixed_snapshot(), **STEP)
    assert [c.passed for c in report.checks] == [True, True, False]


def test_step_travels_in_the_snapshot(tmp_path):
    path = tmp_path / "step.npz"
    save_snapshot(path, with_step(mixed_snapshot(), **STEP))
    loaded = load_snapshot(path)
    assert list(loaded.extra["step_num_computed_tokens"]) == [32, 49, 5]
    from_file = validate_step(loaded)
    explicit = validate_step(mixed_snapshot(), **STEP, num_computed_tokens=[32, 49, 5])
    assert from_file == explicit and from_file.passed
    # a PoolSnapshot look-alike carrying the step as attributes
    snap = mixed_snapshot()
    snap.step_seq_ids, snap.step_num_new_tokens = np.array([2, 1]), np.array([20, 1])
    assert [c.seq_id for c in validate_step(snap).checks] == [2, 1]


def test_decode_step_is_the_snapshot_check():
    snap = paged_snapshot()
    decode = validate_step(snap, seq_ids=[0, 1, 2], num_new_tokens=[1, 1, 1])
    whole = validate_snapshot(snap)
    assert [(c.max_abs_err, c.bitwise_equal) for c in decode.checks] == \
        [(c.max_abs_err, c.bitwise_equal) for c in whole.checks]


@pytest.mark.parametrize("step,message", [
    (dict(seq_ids=[0, 3], num_new_tokens=[1, 1]), "seq 3 has no block table"),
    (dict(seq_ids=[0, 0], num_new_tokens=[1, 1]), "names seq 0 more than once"),
    (dict(seq_ids=[0, 1], num_new_tokens=[1, 0]), "seq 1 has 0 new tokens"),
    (dict(seq_ids=[0, 1], num_new_tokens=[1]), "has 1 entries for 2"),
    (dict(seq_ids=[4], num_new_tokens=[11]), "seq_lens: seq 4 has 10 tokens, fewer than its 11 new ones"),
    (dict(seq_ids=[4], num_new_tokens=[10], num_computed_tokens=[20]), "seq 4 needs 2 blocks of 16"),
    (dict(), "field 'step_seq_ids' is missing"),
])
def test_step_arrays_checked(step, message):
    with pytest.raises(ValueError, match=message):
        validate_step(mixed_snapshot(), **step)


def test_validate_step_command_on_a_simulated_mixed_step(capsys):
    """kvsim validate WORKLOAD --step: the first step after --at that admits an arrival, run as one
    unified launch; a shared system prompt makes that arrival a prefix hit (context > 0, new > 1)."""
    args = _parser().parse_args(["validate", "sharegpt:rate=2,n=40,seed=0,system=256,system_frac=1",
                                 "--at", "8", "--num-blocks", "400", "--device", "cpu", "--step"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()[1:-1]]
    assert rows and all(r[7] == "yes" for r in rows)
    context, new = [int(r[8]) for r in rows], [int(r[9]) for r in rows]
    assert any(n > 1 and c >= 256 for c, n in zip(context, new)), out     # a prefill after a hit
    assert any(n == 1 for n in new), out                                  # beside decodes
    assert "in one unified launch" in out and "PASS" in out


def test_validate_step_on_a_snapshot_without_a_step_is_one_line(tmp_path):
    path = tmp_path / "pool.npz"
    save_snapshot(path, paged_snapshot())
    args = _parser().parse_args(["validate", "--snapshot", str(path), "--device", "cpu", "--step"])
    with pytest.raises(InputError, match="--step: .*step_seq_ids"):
        args.func(args)


def test_checked_sequences_are_chosen_to_exercise_shared_blocks():
    """The first N by seq_id share nothing here; sequences 10-12 share a prefix (blocks 20-23)."""
    tables = {s: np.array([s]) for s in range(8)}            # eight sequences, one private block each
    tables.update({10: np.array([20, 21, 22, 23, 30]), 11: np.array([20, 21, 22, 23, 31]),
                   12: np.array([20, 21, 32])})
    chosen = choose_sequences(tables, 40, 2)
    assert chosen == [10, 11]   # both readers of the four shared blocks in one launch
    # 12 reads only blocks two chosen sequences already read: the lowest ids fill the batch
    assert choose_sequences(tables, 40, 4) == [0, 1, 10, 11]
    assert choose_sequences(tables, 40, None) == sorted(tables)
    snapshot = SimpleNamespace(kind="paged", block_size=16, num_cells=40,
                               block_key=np.arange(40, dtype=np.uint64) + 1,
                               block_tables=tables, seq_lens={s: 16 * len(t) for s, t in tables.items()})
    report = validate_snapshot(snapshot, max_seqs=2)
    assert sorted(c.seq_id for c in report.checks) == [10, 11] and report.passed
    assert (report.num_sequences, report.num_shared_blocks, report.num_shared_blocks_checked) == (11, 4, 4)
    first_two = validate_snapshot(SimpleNamespace(**{**vars(snapshot), "block_tables": {
        s: tables[s] for s in (0, 1)}, "seq_lens": {0: 16, 1: 16}}))
    assert first_two.num_shared_blocks_checked == 0   # what "the first N by id" would have tested
