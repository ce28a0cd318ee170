"""vLLM's num_gpu_blocks formula, checked against figures computed by hand for every preset."""
import math

import pytest

from kvsim.planner.capacity import (compute_capacity, estimate_activation_bytes, kv_bytes_per_token,
                              kv_heads_per_rank, vllm_batch_defaults)
from kvsim.planner.presets import BUNDLED_MODELS, GPU_PRESETS, MODEL_PRESETS, get_gpu, get_model
from kvsim.planner.specs import ModelSpec

GIB = 2**30
MIB = 2**20
NON_TORCH = GIB // 2  # 536,870,912: the default non-PyTorch allowance

# One case per model preset. The arithmetic, done by hand:
#   budget   = int(total * util)
#   act      = max(T * 2 * (6 H + 3 ceil(I / tp)), S * V * 4)     (T tokens, S seqs, 2-byte dtype)
#   non_kv   = weights / tp + act + 0.5 GiB
#   blocks   = (budget - non_kv) // (layers * 2 * kv_heads/tp * head_dim * 2 B * 16)
HAND_COMPUTED = [
    # Llama-3.1-8B on H100 (81,121 MiB = 85,061,533,696 B), tp 1, util 0.9, T 8192, S 256
    #   budget  = int(85,061,533,696 * 0.9)             = 76,555,380,326
    #   weights = 8,030,261,248 * 2                     = 16,060,522,496
    #   act     = 8192 * 2 * (24,576 + 43,008)          =  1,107,296,256 (> 256*128256*4 = 131,334,144)
    #   non_kv  = 16,060,522,496 + 1,107,296,256 + 536,870,912 = 17,704,689,664
    #   avail   = 58,850,690,662; block = 32*2*8*128*2*16 = 2,097,152 -> 28,062 blocks
    ("Llama-3.1-8B", "H100-80GB-SXM", 1, 8192, 256, 8192, 2_097_152, 28_062),
    # Llama-3.1-70B on 4 x H100, tp 4 (2 KV heads per GPU), T 8192, S 256
    #   weights = ceil(70,553,706,496 * 2 / 4)          = 35,276,853,248
    #   act     = 8192 * 2 * (6*8192 + 3*7168)          =  1,157,627,904
    #   non_kv  = 36,971,352,064; avail = 76,555,380,326 - 36,971,352,064 = 39,584,028,262
    #   block   = 80*2*2*128*2*16 = 1,310,720 -> 30,200 blocks
    ("Llama-3.1-70B", "H100-80GB-SXM", 4, 8192, 256, 8192, 1_310_720, 30_200),
    # Qwen2.5-7B on A100-80GB (81,152 MiB = 85,094,039,552 B), tp 1, T 2048, S 256
    #   budget  = 76,584,635,596; weights = 15,231,233,024
    #   act     = 2048 * 2 * (6*3584 + 3*18944)         =    320,864,256 (> 256*152064*4 = 155,713,536)
    #   non_kv  = 16,088,968,192; avail = 60,495,667,404
    #   block   = 28*2*4*128*2*16 = 917,504 -> 65,935 blocks
    ("Qwen2.5-7B", "A100-80GB", 1, 2048, 256, 8192, 917_504, 65_935),
    # Qwen2.5-72B on 2 x H200 (150,109,880,320 B), tp 2, util 0.9, T 8192, S 1024
    #   budget  = int(150,109,880,320 * 0.9)            = 135,098,892,288
    #   weights = 72,706,203,648
    #   act     = 8192 * 2 * (6*8192 + 3*14784)         =   1,531,969,536 (> 1024*152064*4 = 622,854,144)
    #   non_kv  = 74,775,044,096; avail = 60,323,848,192
    #   block   = 80*2*4*128*2*16 = 2,621,440 -> 23,011 blocks
    ("Qwen2.5-72B", "H200", 2, 8192, 1024, 8192, 2_621_440, 23_011),
    # Mistral-7B-v0.3 on L40S (46,068 MiB = 48,305,799,168 B), tp 1, T 2048, S 256
    #   budget  = 43,475,219,251; weights = 14,496,047,104
    #   act     = 2048 * 2 * (6*4096 + 3*14336)         =    276,824,064
    #   non_kv  = 15,309,742,080; avail = 28,165,477,171; block 2,097,152 -> 13,430 blocks
    ("Mistral-7B-v0.3", "L40S", 1, 2048, 256, 8192, 2_097_152, 13_430),
    # OPT-13B (fp16, 40 KV heads) on A100-40GB (40,448 MiB = 42,412,802,048 B), T 2048, S 256
    #   budget  = 38,171,521,843; weights = 25,706,946,560
    #   act     = 2048 * 2 * (6*5120 + 3*20480)         =    377,487,360
    #   non_kv  = 26,621,304,832; avail = 11,550,217,011
    #   block   = 40*2*40*128*2*16 = 13,107,200 -> 881 blocks
    ("OPT-13B", "A100-40GB", 1, 2048, 256, 2048, 13_107_200, 881),
    # DeepSeek-V2-Lite (MLA) on H100, tp 1, T 8192, S 256
    #   weights = 15,706,484,224 * 2 = 31,412,968,448
    #   act     = 8192 * 2 * (6*2048 + 3*10944)         =    739,246,080
    #   non_kv  = 32,689,085,440; avail = 43,866,294,886
    #   block   = 27 layers * (512 + 64) * 2 B * 16 = 497,664 (latent: no factor 2) -> 88,144 blocks
    ("DeepSeek-V2-Lite", "H100-80GB-SXM", 1, 8192, 256, 8192, 497_664, 88_144),
]


@pytest.mark.parametrize("model,gpu,tp,tokens,seqs,max_len,block_bytes,blocks", HAND_COMPUTED,
                         ids=[c[0] for c in HAND_COMPUTED])
def test_num_gpu_blocks_matches_hand_computation(model, gpu, tp, tokens, seqs, max_len, block_bytes, blocks):
    r = compute_capacity(get_model(model), get_gpu(gpu), tp=tp, gpu_memory_utilization=0.9,
                         max_model_len=max_len, max_num_seqs=seqs, max_num_batched_tokens=tokens)
    assert r.bytes_per_block == block_bytes
    assert r.num_gpu_blocks == blocks
    assert r.kv_cache_tokens == blocks * 16
    assert r.max_concurrency == pytest.approx(blocks / math.ceil(max_len / 16))


def test_every_preset_is_covered_by_a_hand_computed_case():
    # the hybrid presets are checked against vLLM's own planning (test_planner_kv_groups.py)
    assert {c[0] for c in HAND_COMPUTED} == set(MODEL_PRESETS) - set(BUNDLED_MODELS)


def test_llama8b_h100_8k_concurrency_is_blocks_over_blocks_per_request():
    r = compute_capacity(get_model("Llama-3.1-8B"), get_gpu("h100"), gpu_memory_utilization=0.9,
                         max_model_len=8192, max_num_seqs=256, max_num_batched_tokens=8192)
    # 28,062 blocks / (8192 / 16 = 512 blocks per request) = 54.81x (vLLM's log line)
    assert r.concurrency_for(8192) == pytest.approx(28_062 / 512)
    assert r.concurrency_for(8193) == pytest.approx(28_062 / 513)  # a partial block costs a block


def test_given_non_kv_replaces_the_estimate():
    # 80 GiB GPU x 0.5 = 40 GiB; minus 8 GiB given = 32 GiB = 16,384 blocks of 2 MiB
    from kvsim.planner.presets import custom_gpu
    r = compute_capacity(get_model("Llama-3.1-8B"), custom_gpu(80, 3350, 989), gpu_memory_utilization=0.5,
                         max_model_len=8192, non_kv_bytes=8 * GIB)
    assert (r.num_gpu_blocks, r.activation_bytes, r.non_kv_given) == (16_384, 0, True)


def test_fp8_kv_halves_bytes_and_doubles_blocks_when_non_kv_is_fixed():
    m, g = get_model("Llama-3.1-8B"), get_gpu("h100")
    assert kv_bytes_per_token(m, "fp8") * 2 == kv_bytes_per_token(m, "auto") == 131_072
    a = compute_capacity(m, g, max_model_len=8192, non_kv_bytes=20 * GIB)
    b = compute_capacity(m, g, max_model_len=8192, non_kv_bytes=20 * GIB, kv_dtype="fp8")
    assert b.bytes_per_block * 2 == a.bytes_per_block
    assert b.num_gpu_blocks in (2 * a.num_gpu_blocks, 2 * a.num_gpu_blocks + 1)


def test_tp_splits_kv_heads_and_replicates_beyond_them():
    llama = get_model("Llama-3.1-8B")  # 32 heads, 8 KV heads
    assert [kv_heads_per_rank(llama, tp) for tp in (1, 2, 4, 8, 16)] == [8, 4, 2, 1, 1]
    # 16 > 8 KV heads: each rank holds one (replicated) head, so per-GPU bytes stop shrinking
    assert kv_bytes_per_token(llama, tp=16) == kv_bytes_per_token(llama, tp=8) == 32 * 2 * 1 * 128 * 2


def test_tp_that_cannot_divide_heads_is_an_error():
    with pytest.raises(ValueError, match=r"num_attention_heads \(32\) must be divisible by tp \(3\)"):
        kv_heads_per_rank(get_model("Llama-3.1-8B"), 3)
    odd = ModelSpec(name="toy", num_layers=2, num_attention_heads=24, num_kv_heads=6, head_dim=64,
                    hidden_size=1536, intermediate_size=4096, vocab_size=1000, num_params=10**6)
    with pytest.raises(ValueError, match=r"num_kv_heads \(6\) must be divisible by tp \(4\)"):
        kv_heads_per_rank(odd, 4)
    # 24 heads / 12 ranks is fine, but 8 KV heads cannot be replicated evenly over 12 ranks
    with pytest.raises(ValueError, match=r"tp \(12\) > num_kv_heads \(8\) needs tp to be a multiple"):
        kv_heads_per_rank(ModelSpec(**{**odd.to_dict(), "num_kv_heads": 8}), 12)


def test_mla_latent_is_not_doubled_nor_split_by_tp():
    ds = get_model("DeepSeek-V2-Lite")
    # 27 layers * (512 + 64) * 2 B = 31,104 B per token on every rank
    assert kv_bytes_per_token(ds) == kv_bytes_per_token(ds, tp=2) == 31_104
    assert kv_bytes_per_token(ds, "fp8") == 15_552


def test_batch_defaults_follow_vllm_gpu_classes():
    assert vllm_batch_defaults(get_gpu("H100")) == (1024, 8192)
    assert vllm_batch_defaults(get_gpu("A100-80GB")) == (256, 2048)   # A100 is excluded by name
    assert vllm_batch_defaults(get_gpu("MI300X")) == (1024, 16384)
    assert vllm_batch_defaults(get_gpu("b200")) == (1024, 16384)       # 179 GiB: the large class
    assert vllm_batch_defaults(get_gpu("L4")) == (256, 2048)


def test_activation_estimate_prefers_the_larger_of_forward_and_sampler():
    m = get_model("Llama-3.1-8B")
    assert estimate_activation_bytes(m, 16, 1024, 1) == 1024 * 128256 * 4  # sampler dominates
    assert estimate_activation_bytes(m, 8192, 1, 2) == 8192 * 2 * (6 * 4096 + 3 * 7168)


@pytest.mark.parametrize("kwargs,message", [
    (dict(gpu_memory_utilization=0.0), r"gpu_memory_utilization must be in \(0, 1\], got 0.0"),
    (dict(gpu_memory_utilization=1.01), r"got 1.01"),
    (dict(block_size=0), r"block_size must be >= 1"),
    (dict(max_model_len=10**6), r"exceeds Llama-3.1-8B's max_position_embeddings \(131072\)"),
    (dict(kv_dtype="int4"), r"kv_dtype must be one of"),
])
def test_bad_configs_raise_one_line_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        compute_capacity(get_model("Llama-3.1-8B"), get_gpu("h100"), **kwargs)
    assert "\n" not in str(err.value)


def test_weights_larger_than_the_gpu_and_too_long_a_request_are_errors():
    with pytest.raises(ValueError, match=r"weights need 131.42 GiB per GPU at tp=1"):
        compute_capacity(get_model("Llama-3.1-70B"), get_gpu("h100"))
    # L4: 131,072-token request needs 16 GiB of KV; vLLM refuses to start and suggests a length
    with pytest.raises(ValueError, match=r"one request of max_model_len 131072 needs 16.00 GiB"):
        compute_capacity(get_model("Llama-3.1-8B"), get_gpu("L4"))
    with pytest.raises(ValueError, match="no memory left for the KV cache"):
        compute_capacity(get_model("Llama-3.1-8B"), get_gpu("h100"), gpu_memory_utilization=0.2)


def test_presets_are_all_reachable_by_alias():
    assert get_gpu("h100") is GPU_PRESETS["H100-80GB-SXM"]
    assert get_model("meta-llama/Llama-3.1-8B-Instruct") is MODEL_PRESETS["Llama-3.1-8B"]
    with pytest.raises(ValueError, match="presets: Llama-3.1-8B, Llama-3.1-70B"):
        get_model("llama-9000")
    with pytest.raises(ValueError, match="presets: A100-40GB"):
        get_gpu("tpu")


from hypothesis import assume, given, settings, strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(layers=st.integers(1, 96), kv_heads=st.sampled_from([1, 2, 4, 8, 16]),
       group=st.sampled_from([1, 2, 4, 8]), head_dim=st.sampled_from([64, 80, 128, 256]),
       params_b=st.floats(0.1, 20), tp=st.sampled_from([1, 2, 4, 8]), block=st.sampled_from([1, 8, 16, 32, 128]),
       util=st.floats(0.05, 1.0), fp8=st.booleans())
def test_num_gpu_blocks_is_the_floor_of_available_over_block_bytes(layers, kv_heads, group, head_dim, params_b,
                                                                   tp, block, util, fp8):
    heads = kv_heads * group
    # combinations vLLM rejects are tested above
    assume(not (heads % tp or (kv_heads >= tp and kv_heads % tp) or (kv_heads < tp and tp % kv_heads)))
    model = ModelSpec(name="h", num_layers=layers, num_attention_heads=heads, num_kv_heads=kv_heads,
                      head_dim=head_dim, hidden_size=heads * head_dim, intermediate_size=4 * heads * head_dim,
                      vocab_size=32000, num_params=int(params_b * 1e9), max_position_embeddings=1024)
    try:
        r = compute_capacity(model, get_gpu("H200"), tp=tp, block_size=block, gpu_memory_utilization=util,
                             kv_dtype="fp8" if fp8 else "auto", max_model_len=1024)
    except ValueError as err:  # too little memory at this utilization: must say so
        assert "GiB" in str(err)
        assume(False)
    per_rank_heads = max(1, kv_heads // tp)
    assert r.bytes_per_block == layers * 2 * block * per_rank_heads * head_dim * (1 if fp8 else 2)
    assert r.num_gpu_blocks * r.bytes_per_block <= r.available_kv_bytes < (r.num_gpu_blocks + 1) * r.bytes_per_block
    assert r.available_kv_bytes == int(r.total_memory_bytes * util) - r.non_kv_bytes
    assert r.num_gpu_blocks >= math.ceil(1024 / block)  # one max_model_len request always fits
