"""The step executor under the Triton interpreter (conftest sets TRITON_INTERPRET=1): a tiny model
runs mixed and decode steps over shuffled block tables, and its logits must equal the plain-torch
dense decoder's (float64, contiguous KV). Plus the decoder shape, the fused layers and the inputs."""
import json

import numpy as np
import pytest
import torch

from kvsim.kernels.decoder import DecoderShape, random_weights
from kvsim.kernels.dense_decoder import DenseDecoder
from kvsim.kernels.executor import (StepExecutor, StepInputs, build_step, check_device_memory,
                                    cudagraph_capture_sizes, memory_estimate_bytes, torch_attention)
from kvsim.kernels.layers import (add_rms_norm, rms_norm_reference, rope_, rope_cos_sin, rope_reference,
                                  silu_and_mul)

TINY = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=96, vocab_size=101)
FAMILIES = {
    "llama": DecoderShape("llama", **TINY, rope_theta=500000.0,
                          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "qwen2": DecoderShape("qwen2", **TINY, qkv_bias=True, rope_theta=1e6),
    "qwen3": DecoderShape("qwen3", **TINY, qk_norm=True, tie_word_embeddings=True),
    "mistral": DecoderShape("mistral", **TINY, sliding_window=7),
}
BLOCK_SIZE = 4
# (sequence, new tokens) per step: chunked prefills beside decodes, a decode-only step, a prefill
# that starts while others decode
PLAN = [[(0, 9), (1, 5)], [(0, 1), (1, 6), (2, 3)], [(0, 1), (1, 1), (2, 1)], [(2, 1), (0, 7), (1, 1)]]


def run_plan(shape, *, pad_steps=False, attention=None, seed=0, plan=PLAN):
    """Run PLAN through the executor (fp32) and the dense reference (fp64); yield both logits."""
    weights = random_weights(shape, torch.float32, "cpu", seed=seed)
    ex = StepExecutor(shape, num_blocks=40, block_size=BLOCK_SIZE, max_num_seqs=8, max_num_batched_tokens=64,
                      max_model_len=64, dtype=torch.float32, device="cpu", weights=weights,
                      pad_steps=pad_steps, attention=attention)
    ref = DenseDecoder(shape, weights.to(torch.float64), max_num_seqs=8, max_model_len=64)
    perm = np.random.default_rng(seed).permutation(40)
    tables = [perm[0:10].tolist(), perm[10:20].tolist(), perm[20:30].tolist()]  # shuffled blocks
    computed = [0, 0, 0]
    for sched in plan:
        seqs = [i for i, _ in sched]
        step = build_step([tables[i] for i in seqs], [computed[i] for i in seqs], [n for _, n in sched],
                          BLOCK_SIZE, shape.vocab_size)
        result = ex.execute(step, return_logits=True)
        expected = ref.step(seqs, step.token_ids, step.positions, step.query_start_loc)
        yield step, result, expected
        for i, n in sched:
            computed[i] += n


def rel_err(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_executor_logits_equal_dense_reference(family):
    kinds = []
    for step, result, expected in run_plan(FAMILIES[family]):
        assert result.logits.shape == expected.shape
        assert rel_err(result.logits, expected) < 2e-5, (family, step.query_start_loc)
        assert torch.equal(result.next_token_ids, result.logits.argmax(-1))
        kinds.append(step.decode_only)
    assert kinds == [False, False, True, False]


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_padded_steps_do_not_change_results(family):
    # steps padded to the CUDA-graph sizes: decode batches to 4 sequences (the padding row reads
    # block 0, writes nothing), mixed steps to 16 tokens run piece by piece over the static buffers
    sizes = []
    for step, padded, expected in run_plan(FAMILIES[family], pad_steps=True):
        sizes.append((padded.padded_num_seqs, padded.padded_num_tokens))
        assert padded.logits.shape == expected.shape
        assert rel_err(padded.logits, expected) < 2e-5
    assert sizes == [(2, 16), (3, 16), (4, 4), (3, 16)]


def test_mixed_steps_use_the_attention_given():
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[5].shape[0] - 1)   # num_seqs from query_start_loc
        return torch_attention(*args, **kwargs)

    steps = list(run_plan(FAMILIES["qwen2"], attention=spy))
    # 3 mixed steps x 2 layers; the decode-only step goes to paged_attention
    assert calls == [2, 2, 3, 3, 3, 3]
    assert all(rel_err(r.logits, e) < 2e-5 for _, r, e in steps)


def test_rerunning_a_step_is_idempotent():
    shape = FAMILIES["llama"]
    weights = random_weights(shape, torch.float32, "cpu", seed=3)
    ex = StepExecutor(shape, num_blocks=16, block_size=BLOCK_SIZE, max_num_seqs=4, max_num_batched_tokens=32,
                      max_model_len=32, dtype=torch.float32, device="cpu", weights=weights)
    step = build_step([[5, 2, 9], [1, 7]], [0, 0], [10, 6], BLOCK_SIZE, shape.vocab_size)
    first = ex.execute(step, return_logits=True).logits
    pool = ex.kv_cache.clone()
    again = ex.execute(step, return_logits=True).logits
    assert torch.equal(first, again)
    assert torch.equal(pool, ex.kv_cache)
    # the slots the step wrote and nothing else changed from the initial random fill
    ex2 = StepExecutor(shape, num_blocks=16, block_size=BLOCK_SIZE, max_num_seqs=4, max_num_batched_tokens=32,
                       max_model_len=32, dtype=torch.float32, device="cpu", weights=weights)
    changed = (ex2.kv_cache != pool).flatten(4).any(-1)   # [layers, k/v, blocks, slots]
    slots = torch.nonzero(changed[0, 0].flatten()).flatten()
    assert sorted(slots.tolist()) == sorted(step.slot_mapping.tolist())


def test_build_step_slot_mapping_and_layout():
    step = build_step([[7, 3], [4], [0, 2, 6]], [5, 0, 8], [2, 3, 1], block_size=4, vocab_size=50)
    assert step.query_start_loc.tolist() == [0, 2, 5, 6]
    assert step.positions.tolist() == [5, 6, 0, 1, 2, 8]
    assert step.slot_mapping.tolist() == [3 * 4 + 1, 3 * 4 + 2, 16, 17, 18, 6 * 4 + 0]
    assert step.seq_lens.tolist() == [7, 3, 9]
    assert step.block_tables.tolist() == [[7, 3, 0], [4, 0, 0], [0, 2, 6]]
    assert not step.decode_only and step.token_ids.max() < 50
    assert build_step([[1], [2]], [3, 0], [1, 1], 4, 50).decode_only


@pytest.mark.parametrize("change, message", [
    (dict(slot_mapping=np.array([999, 17, 18, 1, 2, 3])), "past the pool"),
    (dict(block_tables=np.array([[7, 3], [40, 0], [0, 2]])), "outside the pool"),
    (dict(seq_lens=np.array([7, 3, 90])), "max_model_len"),
    (dict(query_start_loc=np.array([0, 2, 2, 6])), "query_start_loc"),
    (dict(token_ids=np.array([1, 2, 3, 4, 5, 60])), "vocab_size"),
])
def test_step_check_rejects_what_does_not_fit(change, message):
    step = build_step([[7, 3], [4], [0, 2, 6]], [1, 0, 4], [2, 3, 1], block_size=4, vocab_size=50)
    fields = {k: getattr(step, k) for k in StepInputs.__dataclass_fields__}
    bad = StepInputs(**{**fields, **change})
    with pytest.raises(ValueError, match=message):
        bad.check(num_blocks=16, block_size=4, max_model_len=32, vocab_size=50)
    step.check(num_blocks=16, block_size=4, max_model_len=32, vocab_size=50)


def test_capture_sizes_are_vllms():
    assert cudagraph_capture_sizes(512)[:6] == [1, 2, 4, 8, 16, 24]
    assert cudagraph_capture_sizes(512)[-3:] == [480, 496, 512]
    assert cudagraph_capture_sizes(256)[-2:] == [248, 256]
    assert cudagraph_capture_sizes(5) == [1, 2, 4, 8]
    assert len(cudagraph_capture_sizes(1024)) == 3 + 31 + 17


def test_memory_check_names_the_numbers():
    est = memory_estimate_bytes(FAMILIES["llama"], 1000, 16, 512, 8, torch.bfloat16)
    check_device_memory(est, sum(est.values()) + 2 * 2**30, "test")
    with pytest.raises(ValueError, match="GiB are free on test"):
        check_device_memory(est, sum(est.values()), "test")


def test_layers_match_torch():
    g = torch.Generator().manual_seed(0)
    x, res, w = (torch.randn(5, 48, generator=g) for _ in range(3))
    w = w[0]
    res0 = res.clone()
    out = add_rms_norm(x, res, w, 1e-5)
    assert torch.allclose(res, res0 + x)
    assert torch.allclose(out, rms_norm_reference(res0 + x, w, 1e-5), atol=1e-5)
    assert torch.allclose(add_rms_norm(x, None, w, 1e-6), rms_norm_reference(x, w, 1e-6), atol=1e-5)
    qkv = torch.randn(6, 5 * 8, generator=g)      # 3 query/key heads to rotate + 2 untouched
    pos = torch.tensor([0, 3, 1, 9, 2, 2])
    cos, sin = rope_cos_sin(8, 10000.0, None, 16)
    want = rope_reference(qkv[:, :24].reshape(6, 3, 8), pos, cos, sin).reshape(6, 24)
    tail = qkv[:, 24:].clone()
    rope_(qkv, pos, cos, sin, 3)
    assert torch.allclose(qkv[:, :24], want, atol=1e-6) and torch.equal(qkv[:, 24:], tail)
    gu = torch.randn(7, 20, generator=g)
    assert torch.allclose(silu_and_mul(gu), torch.nn.functional.silu(gu[:, :10]) * gu[:, 10:], atol=1e-6)


def test_llama3_rope_scaling_matches_hugging_face():
    # HF _compute_llama3_parameters on head_dim 8, theta 500000, factor 8, low 1, high 4, old len 16
    from kvsim.kernels.layers import rope_inv_freq
    inv = rope_inv_freq(8, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    base = 1.0 / 500000.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    # wavelengths 2*pi/base: 6.3 (between 16/4 and 16/1: blended), 167, 4443, 118k (> 16: divided by 8)
    smooth = (16 / (2 * torch.pi / base[0]) - 1) / (4 - 1)
    first = (1 - smooth) * base[0] / 8 + smooth * base[0]
    assert torch.allclose(inv, torch.cat([first.reshape(1), base[1:] / 8]))
    short = rope_inv_freq(8, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    assert short[0] == base[0]   # wavelength 6.3 < 64/4: kept


def test_shape_from_hf_config(tmp_path):
    from kvsim.planner.presets import get_model, estimate_num_params
    llama = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-5,
             "rope_theta": 500000.0, "tie_word_embeddings": False,
             "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    shape = DecoderShape.from_hf_config(llama)
    assert shape.num_params == get_model("Llama-3.1-8B").num_params == estimate_num_params(llama)[0]
    assert shape.head_dim == 128 and not shape.qkv_bias and shape.sliding_window is None
    qwen = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
            "sliding_window": 131072, "use_sliding_window": False}
    shape = DecoderShape.from_hf_config({"text_config": qwen, "architectures": ["X"]})
    assert shape.qkv_bias and shape.sliding_window is None
    assert shape.num_params == get_model("Qwen2.5-7B").num_params
    mistral = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32768, "sliding_window": 4096}
    assert DecoderShape.from_hf_config(mistral).sliding_window == 4096
    assert DecoderShape.from_hf_config({**mistral, "sliding_window": None}).num_params == \
        get_model("Mistral-7B-v0.3").num_params
    assert DecoderShape.from_hf_config({**qwen, "model_type": "qwen3", "head_dim": 128}).qk_norm
    for bad, message in [({**llama, "model_type": "opt"}, "model_type"),
                         ({**qwen, "num_experts": 64}, "num_experts"),
                         ({k: v for k, v in llama.items() if k != "vocab_size"}, "vocab_size"),
                         ({**llama, "num_key_value_heads": 0}, "num_key_value_heads"),
                         ({**llama, "num_key_value_heads": 5}, "num_kv_heads")]:
        with pytest.raises(ValueError, match=message):
            DecoderShape.from_hf_config(bad)
    json.dumps(DecoderShape.from_hf_config(llama).to_dict())
