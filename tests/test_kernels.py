"""Triton paged attention and reshape_and_cache under the CPU interpreter (TRITON_INTERPRET=1, set by
conftest before any kernel module is imported). Small shapes: the interpreter costs ~4 ms per
program-iteration."""
import math

import pytest
import torch

from kvsim.kernels import (KernelConfig, allocate_kv_cache, attention_workspace, dense_attention, gather_kv,
                     paged_attention, plan_launch, plan_partitions, reshape_and_cache)
from kvsim.kernels.layout import to_flat

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def make_case(layout="flat", dtype=torch.float32, seq_lens=(1, 16, 37, 100), block_size=16, num_kv_heads=2,
              num_heads=4, head_size=32, spare_blocks=5, seed=0):
    """A NaN-poisoned pool with each sequence's blocks scattered at random, written through
    reshape_and_cache; unused block-table entries are -1 (never read)."""
    g = torch.Generator().manual_seed(seed)
    per_seq = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(per_seq) + spare_blocks
    perm = torch.randperm(num_blocks, generator=g)
    tables = torch.full((len(seq_lens), max(per_seq)), -1, dtype=torch.int32)
    slots, start = [], 0
    for i, (n, nb) in enumerate(zip(seq_lens, per_seq)):
        tables[i, :nb] = perm[start:start + nb]
        start += nb
        pos = torch.arange(n)
        slots.append(tables[i, pos // block_size].long() * block_size + pos % block_size)
    slots = torch.cat(slots)
    key = torch.randn(len(slots), num_kv_heads, head_size, generator=g).to(dtype)
    value = torch.randn(len(slots), num_kv_heads, head_size, generator=g).to(dtype)
    kc, vc = allocate_kv_cache(num_blocks, block_size, num_kv_heads, head_size, dtype, "cpu", layout)
    reshape_and_cache(key, value, kc, vc, slots, layout)
    query = torch.randn(len(seq_lens), num_heads, head_size, generator=g).to(dtype)
    return dict(query=query, key_cache=kc, value_cache=vc, block_tables=tables,
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32), scale=head_size ** -0.5, layout=layout)


def identity_case(case):
    """The same sequences with their blocks copied contiguously (block table = 0, 1, 2, ...)."""
    tables = case["block_tables"]
    used = [tables[i][tables[i] >= 0] for i in range(tables.shape[0])]
    ids = torch.cat(used).long()
    ident = torch.full_like(tables, -1)
    start = 0
    for i, row in enumerate(used):
        ident[i, :len(row)] = torch.arange(start, start + len(row))
        start += len(row)
    return dict(case, key_cache=case["key_cache"][ids], value_cache=case["value_cache"][ids], block_tables=ident)


def run(case, partition_size=None):
    return paged_attention(case["query"], case["key_cache"], case["value_cache"], case["block_tables"],
                           case["seq_lens"], case["scale"], case["layout"], partition_size)


def assert_matches_reference(case, out, tol):
    assert not torch.isnan(out).any()
    for i, n in enumerate(case["seq_lens"].tolist()):
        k, v = gather_kv(case["key_cache"], case["value_cache"], case["block_tables"][i], n, case["layout"])
        ref = dense_attention(case["query"][i], k, v, case["scale"])
        err = (out[i].double() - ref).abs().max() / ref.abs().max()
        assert err <= tol, f"sequence {i} ({n} tokens): relative error {err:.2e} > {tol:.0e}"


@pytest.mark.parametrize("layout", ["flat", "vllm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("partition_size", [None, 32], ids=["v1", "v2"])
def test_matches_float64_dense_reference(layout, dtype, partition_size):
    # GQA 4 query heads / 2 KV heads; lengths 1 (single token), 16 (exactly one block), 37 and 100
    # (partial last blocks); free and tail slots hold NaN
    case = make_case(layout, dtype)
    assert_matches_reference(case, run(case, partition_size), TOL[dtype])


@pytest.mark.parametrize("layout", ["flat", "vllm"])
@pytest.mark.parametrize("partition_size", [None, 32], ids=["v1", "v2"])
def test_shuffled_blocks_bitwise_equal_identity_table(layout, partition_size):
    case = make_case(layout, torch.float16, seed=1)
    out = run(case, partition_size)
    assert torch.equal(out, run(identity_case(case), partition_size))


def test_v2_equals_v1_within_rounding():
    case = make_case("flat", torch.float32, seq_lens=(5, 70, 200), seed=2)
    v1 = run(case)
    ref_scale = v1.abs().max()
    for partition_size in (16, 48, 64):
        v2 = run(case, partition_size)
        assert (v2 - v1).abs().max() / ref_scale <= 1e-6


@pytest.mark.parametrize("partition_size", [None, 48], ids=["v1", "v2"])
def test_unmasked_full_tiles_equal_masked_tiles(partition_size):
    # 16-token tiles: several full tiles, then a partial tail (or none) per sequence / partition
    case = make_case("vllm", torch.float32, seq_lens=(1, 16, 37, 100), seed=5)
    outs = [paged_attention(case["query"], case["key_cache"], case["value_cache"], case["block_tables"],
                            case["seq_lens"], case["scale"], "vllm", partition_size,
                            config=KernelConfig(16, unmasked_full_tiles=unmasked)) for unmasked in (True, False)]
    assert torch.equal(outs[0], outs[1])
    assert_matches_reference(case, outs[0], TOL[torch.float32])


def test_partition_covering_every_sequence_is_v1():
    case = make_case("flat", torch.float16, seed=3)
    assert torch.equal(run(case, partition_size=128), run(case))


def test_poisoned_slots_would_show_a_wrong_read():
    # the NaN poisoning the other tests rely on is real: pointing a table at a free block poisons
    # exactly that sequence
    case = make_case("flat", torch.float32, seq_lens=(20, 20), spare_blocks=1)
    used = set(case["block_tables"][case["block_tables"] >= 0].tolist())
    free = next(b for b in range(case["key_cache"].shape[0]) if b not in used)
    case["block_tables"][1, 0] = free
    out = run(case)
    assert not torch.isnan(out[0]).any()
    assert torch.isnan(out[1]).all()


@pytest.mark.parametrize("block_size,head_size,layout", [(32, 64, "flat"), (64, 128, "vllm"), (256, 256, "flat")])
def test_block_and_head_sizes(block_size, head_size, layout):
    case = make_case(layout, torch.float32, seq_lens=(3, 300), block_size=block_size, head_size=head_size)
    assert_matches_reference(case, run(case), TOL[torch.float32])


@pytest.mark.parametrize("num_heads,num_kv_heads", [(32, 1), (2, 2)], ids=["gqa32", "mha"])
def test_gqa_groups(num_heads, num_kv_heads):
    case = make_case("flat", torch.float32, seq_lens=(9, 50), num_heads=num_heads, num_kv_heads=num_kv_heads)
    assert_matches_reference(case, run(case, partition_size=32), TOL[torch.float32])


def test_bfloat16_in_interpreter():
    # bf16 operands are upcast before tl.dot in the interpreter (its bf16 dot reads raw bits)
    case = make_case("vllm", torch.bfloat16, seq_lens=(7, 60))
    assert_matches_reference(case, run(case), TOL[torch.bfloat16])


@pytest.mark.parametrize("layout", ["flat", "vllm"])
def test_reshape_and_cache_scatters_and_skips_negative_slots(layout):
    g = torch.Generator().manual_seed(4)
    num_blocks, block_size, hkv, d = 6, 16, 2, 32
    kc, vc = allocate_kv_cache(num_blocks, block_size, hkv, d, torch.float16, "cpu", layout, fill=0.0)
    slots = torch.tensor([5, -1, 17, 95, -3, 40, 0])
    key = torch.randn(len(slots), hkv, d, generator=g).half()
    value = torch.randn(len(slots), hkv, d, generator=g).half()
    reshape_and_cache(key, value, kc, vc, slots, layout)
    k_flat, v_flat = to_flat(kc, vc, layout)
    k_slots = k_flat.reshape(num_blocks * block_size, hkv, d)
    v_slots = v_flat.reshape(num_blocks * block_size, hkv, d)
    written = slots >= 0
    assert torch.equal(k_slots[slots[written]], key[written])
    assert torch.equal(v_slots[slots[written]], value[written])
    others = torch.ones(num_blocks * block_size, dtype=torch.bool)
    others[slots[written]] = False
    assert not k_slots[others].any() and not v_slots[others].any()  # padding tokens wrote nothing


def test_dispatch_rule():
    sms = 132
    # small batch x long context: split-KV, a power of two of partitions of whole tiles
    ps = plan_partitions(1, 4, 131072, 64, sms)
    assert ps == 1024 and 131072 // ps == 128
    assert plan_partitions(1, 4, 512, 64, sms) == 64
    # a launch that already fills a wave: v1, whatever the context
    assert plan_partitions(256, 32, 2048, 64, sms) is None
    assert plan_partitions(64, 4, 32768, 64, sms) is None
    assert plan_partitions(8, 32, 32768, 64, sms) is None
    for args in [(1, 1, 1000), (3, 8, 5000), (8, 4, 8192), (2, 2, 70)]:
        ps = plan_partitions(*args, 64, sms)
        if ps is not None:
            num_parts = math.ceil(args[2] / ps)
            assert ps % 64 == 0 and num_parts >= 2 and args[0] * args[1] * num_parts <= 4 * sms
    # the interpreter: v1 unless asked, big tiles, fused merge
    ps, config = plan_launch(1, 4, 131072, 128, "flat", torch.device("cpu"))
    assert ps is None and config.tile_tokens == 256 and config.unmasked_full_tiles and config.fused_reduce


def test_merge_choice_fused_for_few_partial_rows():
    # GPU dispatch without a GPU: the rule only reads the multiprocessor count
    cuda = torch.device("cuda")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("kvsim.kernels.attention.num_sms", lambda device: 132)
        # batch 1, 512 tokens, 8 partitions: merged in the kernel for groups up to 8 (64 rows)
        ps, config = plan_launch(1, 4, 512, 128, "flat", cuda, num_queries_per_kv=8)
        assert ps == 64 and config.fused_reduce
        # batch 1, 32k tokens, GQA 8: 128 partitions x 8 heads -> a separate reduce launch
        ps, config = plan_launch(1, 4, 32768, 128, "flat", cuda, num_queries_per_kv=8)
        assert 32768 // ps == 128 and not config.fused_reduce
        ps, config = plan_launch(1, 32, 32768, 128, "flat", cuda, num_queries_per_kv=1)
        assert 32768 // ps == 16 and config.fused_reduce


def fused_case(dtype=torch.float32, layout="flat", seed=6):
    # ragged lengths: sequences with fewer partitions than the launch's maximum, partial tails
    return make_case(layout, dtype, seq_lens=(1, 40, 129, 300), num_heads=6, num_kv_heads=2, seed=seed)


def run_merge(case, partition_size, fused, workspace=None):
    return paged_attention(case["query"], case["key_cache"], case["value_cache"], case["block_tables"],
                           case["seq_lens"], case["scale"], case["layout"], partition_size,
                           config=KernelConfig(32, fused_reduce=fused), workspace=workspace)


@pytest.mark.parametrize("layout", ["flat", "vllm"])
def test_fused_merge_equals_separate_reduce_and_v1(layout):
    # group of 3 query heads (padded to 4 rows in the merge); NaN in free and tail slots
    case = fused_case(torch.float16, layout)
    fused = run_merge(case, 32, True)
    assert torch.equal(fused, run_merge(case, 32, False))  # same merge steps here: same bits
    assert_matches_reference(case, fused, TOL[torch.float16])
    v1 = run(case)
    assert (fused.float() - v1.float()).abs().max() <= 2e-3 * v1.float().abs().max()


def test_fused_merge_leaves_counters_at_zero_and_repeats():
    case = fused_case()
    workspace = attention_workspace(4, 2, "cpu")
    outs = [run_merge(case, partition_size, True, workspace) for partition_size in (16, 48, 16)]
    assert not workspace.any()  # reset by the last program of every (sequence, KV head)
    assert torch.equal(outs[0], outs[2])  # the same workspace serves the next call
    assert (outs[1] - outs[0]).abs().max() <= 1e-6 * outs[0].abs().max()


def test_fused_merge_bitwise_equal_on_identity_table():
    case = fused_case(torch.float16, seed=7)
    assert torch.equal(run_merge(case, 32, True), run_merge(identity_case(case), 32, True))


def test_workspace_checked():
    case = fused_case()
    with pytest.raises(ValueError, match="workspace must be int32 on cpu with at least 8 elements"):
        run_merge(case, 32, True, torch.zeros(7, dtype=torch.int32))


BAD_CALLS = [
    (dict(query=torch.zeros(2, 4)), "query must be a tensor"),
    (dict(query=torch.zeros(2, 4, 32, dtype=torch.float64)), "query is torch.float64"),
    (dict(query=torch.zeros(2, 4, 16)), "head_size 16 != cache head_size 32"),
    (dict(query=torch.zeros(2, 3, 32)), "not a multiple of num_kv_heads"),
    (dict(block_tables=torch.zeros(2, 4)), "block_tables must be an int32/int64 tensor"),
    (dict(block_tables=torch.zeros(3, 4, dtype=torch.int32)), r"block_tables must be \[num_seqs=2"),
    (dict(seq_lens=torch.tensor([1, 2, 3])), r"seq_lens must be \[num_seqs=2\]"),
    (dict(seq_lens=torch.tensor([0, 5])), r"seq_lens\[0\] = 0"),
    (dict(seq_lens=torch.tensor([3, 65])), "needs more than the 4 blocks"),
    (dict(block_tables=torch.tensor([[0, 1, 2, 3], [4, 99, -1, -1]], dtype=torch.int32)),
     r"block_tables\[1, 1\] = 99 is outside the pool of 10 blocks"),
    (dict(block_tables=torch.tensor([[0, 1, 2, 3], [-1, 5, -1, -1]], dtype=torch.int32)),
     r"block_tables\[1, 0\] = -1"),
    (dict(layout="paged"), "layout must be one of"),
    (dict(value_cache=torch.zeros(10, 16, 2, 16)), "value_cache shape"),
    (dict(partition_size=24), "partition_size must be a positive multiple of 16"),
    (dict(block_tables=torch.zeros(2, 4, dtype=torch.int32, device="meta")), "block_tables is on meta"),
    (dict(value_cache=torch.zeros(10, 16, 2, 32, dtype=torch.float16)), "value_cache is torch.float16"),
]


@pytest.mark.parametrize("bad,message", BAD_CALLS, ids=[m[:30] for _, m in BAD_CALLS])
def test_paged_attention_rejects_bad_input(bad, message):
    kc, vc = allocate_kv_cache(10, 16, 2, 32, torch.float32, "cpu", "flat")
    call = dict(query=torch.zeros(2, 4, 32), key_cache=kc, value_cache=vc,
                block_tables=torch.tensor([[0, 1, 2, 3], [4, 5, -1, -1]], dtype=torch.int32),
                seq_lens=torch.tensor([60, 20]), scale=1.0, layout="flat", partition_size=None)
    call.update(bad)
    with pytest.raises(ValueError, match=message):
        paged_attention(**call)


def test_vllm_layout_shape_checked():
    kc = torch.zeros(4, 2, 4, 16, 4)  # x must be 8 for fp16
    with pytest.raises(ValueError, match="x=8"):
        paged_attention(torch.zeros(1, 2, 16, dtype=torch.float16), kc.half(), torch.zeros(4, 2, 16, 16).half(),
                        torch.zeros(1, 1, dtype=torch.int32), torch.tensor([3]), 1.0, "vllm")


def test_reshape_and_cache_rejects_bad_input():
    kc, vc = allocate_kv_cache(2, 16, 2, 32, torch.float32, "cpu", "flat")
    key = torch.zeros(3, 2, 32)
    with pytest.raises(ValueError, match=r"slot_mapping\[1\] = 32 is past the pool's 32 slots"):
        reshape_and_cache(key, key, kc, vc, torch.tensor([0, 32, -1]))
    with pytest.raises(ValueError, match="key must be"):
        reshape_and_cache(torch.zeros(3, 2, 16), key, kc, vc, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="value is torch.float16"):
        reshape_and_cache(key, key.half(), kc, vc, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="slot_mapping must be an int32/int64"):
        reshape_and_cache(key, key, kc, vc, torch.tensor([0.0, 1.0, 2.0]))
