"""unified_attention (mixed prefill + decode batches) under the CPU interpreter (TRITON_INTERPRET=1,
set by conftest before any kernel module is imported): ragged q_len, contexts that start mid-block,
prefix-hit blocks shared between sequences, shuffled tables, GQA, sliding windows, split-KV, and
bitwise equality between a shuffled and an identity block table."""
import math

import numpy as np
import pytest
import torch

import kvsim.kernels.attention as attention
from test_kernels import identity_case as identity_batch  # the same sequences, blocks copied contiguously

from kvsim.kernels import (KernelConfig, allocate_kv_cache, attention_workspace, paged_attention, plan_attention,
                           plan_launch, reference_unified_attention, reshape_and_cache, unified_attention)

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def make_batch(contexts, q_lens, layout="flat", dtype=torch.float32, block_size=16, num_kv_heads=2, num_heads=4,
               head_size=32, shared_prefix_blocks=0, spare_blocks=4, seed=0):
    """A NaN-poisoned pool; sequence i has contexts[i] tokens of context and q_lens[i] new tokens, its
    blocks scattered at random (the first ``shared_prefix_blocks`` blocks of every sequence are the
    same physical blocks: a prefix-cache hit). Every token's K/V is written through reshape_and_cache."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in zip(contexts, q_lens)]
    per_seq = [math.ceil(n / block_size) for n in seq_lens]
    own = [n - shared_prefix_blocks for n in per_seq]
    assert min(own) >= 0
    num_blocks = shared_prefix_blocks + sum(own) + spare_blocks
    perm = torch.randperm(num_blocks, generator=g)
    shared, start = perm[:shared_prefix_blocks], shared_prefix_blocks
    tables = torch.full((len(seq_lens), max(per_seq)), -1, dtype=torch.int32)
    for i, n in enumerate(own):
        tables[i, :shared_prefix_blocks] = shared
        tables[i, shared_prefix_blocks:per_seq[i]] = perm[start:start + n]
        start += n
    slots = set()
    for i, n in enumerate(seq_lens):
        pos = torch.arange(n)
        slots.update((tables[i, pos // block_size].long() * block_size + pos % block_size).tolist())
    slots = torch.tensor(sorted(slots))
    key = torch.randn(len(slots), num_kv_heads, head_size, generator=g).to(dtype)
    value = torch.randn(len(slots), num_kv_heads, head_size, generator=g).to(dtype)
    kc, vc = allocate_kv_cache(num_blocks, block_size, num_kv_heads, head_size, dtype, "cpu", layout)
    reshape_and_cache(key, value, kc, vc, slots, layout)
    query = torch.randn(sum(q_lens), num_heads, head_size, generator=g).to(dtype)
    qsl = torch.tensor([0, *np.cumsum(q_lens).tolist()], dtype=torch.int32)
    return dict(query=query, key_cache=kc, value_cache=vc, block_tables=tables,
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32), query_start_loc=qsl,
                scale=head_size ** -0.5, layout=layout)


def run(case, sliding_window=None, **tuning):
    return unified_attention(case["query"], case["key_cache"], case["value_cache"], case["block_tables"],
                             case["seq_lens"], case["query_start_loc"], case["scale"], case["layout"],
                             sliding_window, **tuning)


def assert_matches_reference(case, out, tol, sliding_window=None):
    assert not torch.isnan(out).any()
    ref = reference_unified_attention(case["query"], case["key_cache"], case["value_cache"], case["block_tables"],
                                      case["seq_lens"], case["query_start_loc"], case["scale"], case["layout"],
                                      sliding_window)
    qsl = case["query_start_loc"].tolist()
    for i in range(len(qsl) - 1):
        rows = slice(qsl[i], qsl[i + 1])
        err = (out[rows].double() - ref[rows]).abs().max() / ref[rows].abs().max()
        assert err <= tol, f"sequence {i} ({qsl[i + 1] - qsl[i]} new tokens): relative error {err:.2e} > {tol:.0e}"


# q_len 1, block-1, block, block+1 and a few hundred; contexts of 0, mid-block and whole blocks
RAGGED = dict(contexts=[0, 5, 16, 37, 3, 0], q_lens=[1, 15, 16, 17, 260, 33])


@pytest.mark.parametrize("layout,dtype", [("flat", torch.float32), ("flat", torch.float16), ("vllm", torch.float16),
                                          ("vllm", torch.float32), ("flat", torch.bfloat16)])
def test_ragged_batch_matches_dense_causal_reference(layout, dtype):
    case = make_batch(**RAGGED, layout=layout, dtype=dtype)
    assert_matches_reference(case, run(case), TOL[dtype])


SMALL_RAGGED = dict(contexts=[0, 5, 37, 3], q_lens=[1, 15, 17, 70])


@pytest.mark.parametrize("layout,tuning", [("flat", {}), ("flat", dict(partition_size=32)), ("vllm", {}),
                                           ("vllm", dict(partition_size=64)),
                                           ("flat", dict(config=KernelConfig(16, block_rows=32)))],
                         ids=["flat", "flat-split", "vllm", "vllm-split", "flat-small-tiles"])
def test_shuffled_blocks_bitwise_equal_identity_table(layout, tuning):
    case = make_batch(**SMALL_RAGGED, layout=layout, dtype=torch.float16, seed=1)
    out = run(case, **tuning)
    assert torch.equal(out, run(identity_batch(case), **tuning))
    assert_matches_reference(case, out, TOL[torch.float16])


def test_prefix_hit_blocks_shared_between_sequences():
    # three sequences share their first 3 blocks (48 tokens of a cached prefix): one prefills the rest
    # of its prompt from mid-block, one runs a chunk, one decodes; the shared blocks are read by all
    case = make_batch(contexts=[48, 53, 90], q_lens=[40, 16, 1], num_heads=8, num_kv_heads=2,
                      shared_prefix_blocks=3, seed=2)
    out = run(case)
    assert_matches_reference(case, out, TOL[torch.float32])
    assert torch.equal(out, run(identity_batch(case)))  # the copy unshares them: same bits


@pytest.mark.parametrize("window,tuning", [(5, {}), (24, {}), (100, {}), (24, dict(partition_size=32)),
                                           (5, dict(partition_size=16, config=KernelConfig(16)))],
                         ids=["5", "24", "100", "24-split", "5-split-16-token-tiles"])
def test_sliding_window_reads_only_the_window(window, tuning):
    case = make_batch(contexts=[0, 70, 150, 9], q_lens=[40, 1, 30, 20], seed=3, spare_blocks=1)
    # blocks wholly before a sequence's first new token's window are never read: point them at a
    # free (NaN) block, as vLLM points them at its null block
    free = case["key_cache"].shape[0] - 1
    assert free not in case["block_tables"].tolist()
    tables = case["block_tables"]
    for i, (n, q) in enumerate(zip(case["seq_lens"].tolist(), [40, 1, 30, 20])):
        first = max(0, n - q - window + 1)
        tables[i, :first // 16] = free
    out = run(case, window, **tuning)
    assert_matches_reference(case, out, TOL[torch.float32], window)
    assert torch.equal(out, run(identity_batch(case), window, **tuning))


def test_window_of_one_sees_only_itself():
    case = make_batch(contexts=[10], q_lens=[20], seed=4, num_heads=2, num_kv_heads=2)
    out = run(case, 1)
    # with a window of 1 every token's output is its own V (softmax over one position)
    from kvsim.kernels import gather_kv
    _, values = gather_kv(case["key_cache"], case["value_cache"], case["block_tables"][0], 30, "flat")
    assert torch.allclose(out, values[10:30], atol=1e-6)


@pytest.mark.parametrize("block_size,head_size,layout,tile", [(32, 64, "flat", None), (64, 128, "vllm", None),
                                                              (128, 64, "flat", 16), (16, 80, "flat", 32)])
def test_block_sizes_head_sizes_and_tiles(block_size, head_size, layout, tile):
    # tiles spanning several blocks, and tiles smaller than a block; head size 80 pads to 128
    case = make_batch(contexts=[7, 200], q_lens=[150, 3], layout=layout, block_size=block_size, head_size=head_size)
    config = KernelConfig(tile, block_rows=64) if tile else None
    assert_matches_reference(case, run(case, config=config), TOL[torch.float32])


@pytest.mark.parametrize("num_heads,num_kv_heads", [(32, 1), (2, 2), (6, 2)], ids=["gqa32", "mha", "gqa3"])
def test_gqa_groups(num_heads, num_kv_heads):
    # a group of 3 does not divide the 16+ rows of a program: the last rows are padding
    case = make_batch(contexts=[9, 0], q_lens=[25, 50], num_heads=num_heads, num_kv_heads=num_kv_heads, seed=5)
    assert_matches_reference(case, run(case), TOL[torch.float32])
    assert_matches_reference(case, run(case, partition_size=16), TOL[torch.float32])


def test_decode_only_batch_is_paged_attention():
    case = make_batch(contexts=[0, 15, 99, 300], q_lens=[1, 1, 1, 1], seed=6)
    args = (case["query"], case["key_cache"], case["value_cache"], case["block_tables"], case["seq_lens"],
            case["scale"])
    for partition_size in (None, 32):
        assert torch.equal(run(case, partition_size=partition_size),
                           paged_attention(*args, partition_size=partition_size))


def test_small_row_path_for_decodes_in_a_mixed_launch():
    # 64-row programs: the prefill's q-blocks run 64 rows, the decodes and the 2-token chunk take the
    # 16-row path; both paths compute the same attention
    case = make_batch(contexts=[0, 40, 300, 17], q_lens=[100, 1, 1, 2], seed=7)
    outs = [run(case, config=KernelConfig(64, block_rows=64, small_rows=small, small_unmasked_full_tiles=False))
            for small in (16, 0)]
    assert_matches_reference(case, outs[0], TOL[torch.float32])
    assert (outs[0] - outs[1]).abs().max() <= 1e-6 * outs[1].abs().max()
    assert torch.equal(outs[0], run(identity_batch(case), config=KernelConfig(64, block_rows=64, small_rows=16)))


def test_program_order_does_not_change_the_bits():
    case = make_batch(**SMALL_RAGGED, seed=8)
    for tuning in ({}, dict(partition_size=32)):
        outs = [run(case, config=KernelConfig(256, longest_first=first), **tuning) for first in (True, False)]
        assert torch.equal(outs[0], outs[1])


def test_split_fused_merge_equals_separate_reduce():
    # multi-token q-blocks over long contexts: partitions where some rows have no token yet (causal)
    case = make_batch(contexts=[130, 0, 61], q_lens=[9, 30, 1], dtype=torch.float16, num_heads=2, num_kv_heads=1,
                      seed=9)
    workspace = attention_workspace(200, 1, "cpu")
    fused = run(case, partition_size=32, config=KernelConfig(32, fused_reduce=True), workspace=workspace)
    assert not workspace.any()  # every (q-block, KV head) counter reset by its last program
    separate = run(case, partition_size=32, config=KernelConfig(32, fused_reduce=False))
    assert torch.equal(fused, separate)
    assert_matches_reference(case, fused, TOL[torch.float16])
    one_pass = run(case)
    assert (fused.float() - one_pass.float()).abs().max() <= 2e-3 * one_pass.float().abs().max()


def test_split_of_the_decodes_alone_in_a_full_mixed_launch():
    # long decodes next to a short chunk: only the small-row path (decodes, the chunk's 2-token tail
    # q-block) is split, the chunk's full q-blocks run whole in partition 0; fused merge and separate
    # reduce, against the unsplit launch, the reference and an identity table
    case = make_batch(contexts=[0, 300, 200, 9], q_lens=[66, 1, 1, 2], dtype=torch.float16, seed=12)
    base = dict(tile_tokens=32, block_rows=64, small_rows=16, small_partition_tokens=64)
    plan = plan_attention(70, 4, 4, 2, 32, 301, 66, "flat", torch.device("cpu"), config=KernelConfig(**base))
    assert plan.partition_size == 64 and not plan.big_split and plan.num_parts == 5
    workspace = attention_workspace(70 + 4, 2, "cpu")
    fused = run(case, config=KernelConfig(**base, fused_reduce=True), workspace=workspace)
    assert not workspace.any()
    separate = run(case, config=KernelConfig(**base, fused_reduce=False))
    whole = run(case, config=KernelConfig(**dict(base, small_partition_tokens=0)))
    assert torch.equal(fused, separate)
    assert torch.equal(fused[:64], whole[:64])  # the chunk's full q-blocks: the unsplit code
    assert (fused.float() - whole.float()).abs().max() <= 2e-3 * whole.float().abs().max()
    assert_matches_reference(case, fused, TOL[torch.float16])
    assert torch.equal(fused, run(identity_batch(case), config=KernelConfig(**base, fused_reduce=True)))


def test_repeated_split_calls_reuse_their_buffers(monkeypatch):
    case = make_batch(contexts=[300, 5], q_lens=[3, 1], seed=10)
    first = run(case, partition_size=32, validate=False, max_seq_len=303, max_query_len=3)
    scratch = dict(attention._SCRATCH)
    counters = dict(attention._COUNTERS)
    calls = []
    monkeypatch.setattr(attention, "plan_attention", lambda *a, **k: calls.append(a))  # must not be asked again
    again = run(case, partition_size=32, validate=False, max_seq_len=303, max_query_len=3)
    assert torch.equal(first, again) and not calls
    assert all(attention._SCRATCH[k] is v for k, v in scratch.items())
    assert all(attention._COUNTERS[k] is v for k, v in counters.items())


def test_random_mixed_batches():
    # a seeded sweep of the space: block size, GQA, layout, window, split, ragged q_len and context
    rng = np.random.default_rng(11)
    for trial in range(3):
        num_seqs = int(rng.integers(1, 5))
        block_size = int(rng.choice([16, 32, 64]))
        num_kv_heads, group = int(rng.choice([1, 2])), int(rng.choice([1, 2, 4]))
        contexts = rng.integers(0, 100, num_seqs).tolist()
        q_lens = [int(rng.choice([1, int(rng.integers(2, 50))])) for _ in range(num_seqs)]
        window = None if rng.random() < 0.5 else int(rng.integers(1, 90))
        layout = str(rng.choice(["flat", "vllm"]))
        case = make_batch(contexts, q_lens, layout, torch.float16, block_size, num_kv_heads, num_kv_heads * group,
                          seed=100 + trial)
        tuning = dict(partition_size=32) if rng.random() < 0.5 else {}
        out = run(case, window, **tuning)
        assert_matches_reference(case, out, TOL[torch.float16], window)
        assert torch.equal(out, run(identity_batch(case), window, **tuning))


def test_poisoned_slot_past_the_context_would_show():
    # the NaN poisoning the tests rely on is real: a table pointing one of a prefill's blocks at a
    # free block poisons exactly that sequence's rows that read it
    case = make_batch(contexts=[0, 0], q_lens=[20, 40], spare_blocks=1)
    used = set(case["block_tables"][case["block_tables"] >= 0].tolist())
    free = next(b for b in range(case["key_cache"].shape[0]) if b not in used)
    case["block_tables"][1, 2] = free  # tokens 32..39 of sequence 1
    out = run(case)
    assert not torch.isnan(out[:20]).any()
    assert torch.isnan(out[52:]).all()  # the tokens at positions 32..39 read their own K/V


def test_dispatch_rules_on_a_gpu(monkeypatch):
    # GPU dispatch without a GPU: the rule only reads the multiprocessor count
    monkeypatch.setattr(attention, "num_sms", lambda device: 132)
    cuda = torch.device("cuda")
    # prefill: 128-row programs (16 tokens x 8 heads at GQA 8), 64-token tiles, 8 warps capped at 128
    # registers, no split; a decode-sized path for the decodes next to it
    plan = plan_attention(8192 + 64, 65, 32, 4, 128, 32768, 8192, "flat", cuda)
    assert (plan.block_rows, plan.block_q, plan.tile, plan.config.num_warps, plan.small_rows) == (128, 16, 64, 8, 16)
    assert plan.config.max_registers == 128
    assert not plan.config.small_unmasked_full_tiles  # the decodes of a large launch: every tile masked
    assert plan.partition_size is None and plan.num_qblocks == (8192 + 64) // 16 + 65
    # a few query tokens over a long context (speculative decoding): few programs, split-KV
    plan = plan_attention(4, 1, 32, 8, 128, 32768, 4, "flat", cuda)
    assert plan.block_rows == 16 and plan.block_q == 4 and plan.partition_size is not None
    assert 32768 // plan.partition_size >= 16
    # a decode-only launch is the decode rule
    plan = plan_attention(8, 8, 32, 8, 128, 4096, 1, "flat", cuda)
    assert plan.decode_only and plan.block_q == 1
    assert (plan.partition_size, plan.config) == plan_launch(8, 8, 4096, 128, "flat", cuda, num_queries_per_kv=4)
    # a full launch with a few long decodes next to a short chunk: the decodes alone are split
    plan = plan_attention(1024 + 8, 9, 32, 8, 128, 16384, 1024, "flat", cuda)
    assert plan.num_qblocks * 8 >= 132 and not plan.big_split
    assert plan.partition_size == attention.SMALL_PARTITION_TOKENS and plan.num_parts == 8 and plan.fused
    assert plan.config.small_unmasked_full_tiles
    # unless their partials (laid out by query token) would outgrow SPLIT_SCRATCH_MAX_BYTES
    plan = plan_attention(8192 + 16, 17, 32, 8, 128, 32768, 8192, "flat", cuda)
    assert plan.partition_size is None
    # a window bounds the range a program reads: split by the window, not the context
    plan = plan_attention(1, 1, 32, 8, 128, 131072, 1, "flat", cuda, sliding_window=4096)
    assert plan.partition_size is not None and plan.num_parts * plan.partition_size <= 4096 + 2 * plan.partition_size
    # the interpreter: 128-row programs, 256-token tiles, no split unless asked
    plan = plan_attention(300, 3, 4, 2, 32, 400, 260, "flat", torch.device("cpu"))
    assert (plan.block_rows, plan.block_q, plan.tile, plan.partition_size) == (128, 64, 256, None)


BAD_CALLS = [
    (dict(query_start_loc=torch.tensor([0, 3, 5])), r"query_start_loc must be \[num_seqs \+ 1 = 4\]"),
    (dict(seq_lens=torch.tensor([[3, 20, 30]])), r"seq_lens must be \[num_seqs=0\] \(1-D\)"),
    (dict(query_start_loc=torch.tensor([1, 3, 5, 6])), "must start at 0 and end at num_tokens=6"),
    (dict(query_start_loc=torch.tensor([0, 3, 3, 6])), "gives sequence 1 0 new tokens"),
    (dict(query_start_loc=torch.tensor([0.0, 3, 5, 6])), "query_start_loc must be an int32/int64 tensor"),
    (dict(query_start_loc=None), "query_start_loc must be an int tensor"),
    (dict(seq_lens=torch.tensor([2, 20, 30])), r"seq_lens\[0\] = 2 is less than its 3 new tokens"),
    (dict(query=torch.zeros(2, 4, 32)), "query has 2 tokens for 3 sequences"),
    (dict(sliding_window=0), "sliding_window must be a positive int"),
    (dict(block_tables=torch.tensor([[0, 1], [2, 3], [4, 99]], dtype=torch.int32)),
     r"block_tables\[2, 1\] = 99 is outside the pool of 10 blocks"),
]


@pytest.mark.parametrize("bad,message", BAD_CALLS, ids=[m[:30] for _, m in BAD_CALLS])
def test_unified_attention_rejects_bad_input(bad, message):
    kc, vc = allocate_kv_cache(10, 16, 2, 32, torch.float32, "cpu", "flat")
    call = dict(query=torch.zeros(6, 4, 32), key_cache=kc, value_cache=vc,
                block_tables=torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32),
                seq_lens=torch.tensor([3, 20, 30]), query_start_loc=torch.tensor([0, 3, 5, 6]), scale=1.0,
                layout="flat", sliding_window=None)
    call.update(bad)
    with pytest.raises(ValueError, match=message):
        unified_attention(**call)


def test_window_allows_unread_table_entries_before_it():
    # with a window, entries wholly before the first new token's window may be anything (-1 here)
    case = make_batch(contexts=[100], q_lens=[4], seed=12)
    case["block_tables"][0, :4] = -1
    out = run(case, 20)
    assert_matches_reference(dict(case, block_tables=make_batch(contexts=[100], q_lens=[4], seed=12)["block_tables"]),
                             out, TOL[torch.float32], 20)
    with pytest.raises(ValueError, match=r"block_tables\[0, 0\] = -1"):
        run(case)
