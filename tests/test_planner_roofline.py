"""Roofline step cost: hand-computed steps, monotonicity, closed-form runs equal summed steps."""
import math

import pytest

from kvsim.errors import InputError
from kvsim.planner.presets import get_gpu, get_model
from kvsim.planner.roofline import RooflineCost

from kvsim.simulator.cost import CostModel, StepBatch, summed_run_time_s


def decode(num_seqs, context_tokens):
    """num_seqs sequences decoding one token each over context_tokens of context (incl. the new one)."""
    return StepBatch(num_seqs=num_seqs, num_decode_tokens=num_seqs, num_scheduled_tokens=num_seqs,
                     kv_read_tokens=num_seqs * context_tokens, attn_token_pairs=num_seqs * context_tokens)


def grown(batch, i):
    return StepBatch(batch.num_seqs, batch.num_prefill_tokens, batch.num_decode_tokens,
                     batch.num_scheduled_tokens, batch.kv_read_tokens + i * batch.num_seqs,
                     batch.attn_token_pairs + i * batch.num_seqs)


@pytest.fixture
def llama_h100():
    return RooflineCost(get_model("Llama-3.1-8B"), get_gpu("h100"), step_overhead_s=0.0)


def test_small_decode_step_is_weight_bandwidth_bound(llama_h100):
    # 1 sequence, 1000 tokens of context: bytes = 16,060,522,496 (weights) + (1000 + 1) * 131,072
    #   = 16,060,522,496 + 131,203,072 = 16,191,725,568 B; / 3.35e12 B/s = 4.8333e-3 s. FLOPs = 2 * 8.03e9 + 4*32*32*128*1000
    #   = 1.66e10 -> 1.7e-5 s at 989.4 TFLOPS, far below.
    t = llama_h100.step_time_s(decode(1, 1000))
    assert t == pytest.approx(16_191_725_568 / 3.35e12, rel=1e-12)


def test_large_prefill_is_compute_bound(llama_h100):
    # 8192 prompt tokens attending causally (pairs ~ 8192^2 / 2): flops = 2*8,030,261,248*8192
    #   + 4*32*32*128*33,558,528 = 1.3157e14 + 1.7594e13 = 1.4916e14 -> 0.15076 s; bytes only 1.7e10
    pairs = 8192 * 8193 // 2
    b = StepBatch(num_seqs=1, num_prefill_tokens=8192, num_scheduled_tokens=8192, kv_read_tokens=8192,
                  attn_token_pairs=pairs)
    flops = 2 * 8_030_261_248 * 8192 + 4 * 32 * 32 * 128 * pairs
    assert llama_h100.step_time_s(b) == pytest.approx(flops / 989.4e12, rel=1e-12)


def test_step_time_grows_with_tokens_context_and_shrinks_with_tp():
    m, g = get_model("Llama-3.1-8B"), get_gpu("h100")
    cost = RooflineCost(m, g)
    times = [cost.step_time_s(decode(n, 2000)) for n in (1, 8, 64, 256, 1024)]
    assert times == sorted(times) and times[0] < times[-1]
    ctx = [cost.step_time_s(decode(64, c)) for c in (100, 1000, 10_000, 100_000)]
    assert ctx == sorted(ctx) and ctx[0] < ctx[-1]
    assert RooflineCost(m, g, tp=2).step_time_s(decode(64, 2000)) < cost.step_time_s(decode(64, 2000))
    assert RooflineCost(m, g, kv_dtype="fp8").step_time_s(decode(256, 8000)) < \
        cost.step_time_s(decode(256, 8000))
    assert cost.step_time_s(StepBatch()) == 0.0


@pytest.mark.parametrize("num_seqs,context,steps", [(1, 10, 500), (64, 2000, 300), (512, 100, 20_000),
                                                    (256, 3000, 1), (1024, 50, 20_000), (8, 8, 0)])
def test_closed_form_run_equals_summed_steps(num_seqs, context, steps):
    # (512, 100) and (1024, 50) cross from compute-bound to bandwidth-bound near step 11,000
    cost = RooflineCost(get_model("Llama-3.1-8B"), get_gpu("h100"), step_overhead_s=0.002,
                        flops_efficiency=0.05)
    b = decode(num_seqs, context)
    summed = math.fsum(cost.step_time_s(grown(b, i)) for i in range(steps))
    assert cost.run_time_s(b, steps) == pytest.approx(summed, rel=1e-9, abs=1e-12)
    # the simulator's own default (sum of single steps) gives the same
    assert cost.run_time_s(b, steps) == pytest.approx(summed_run_time_s(cost, b, steps), rel=1e-9)


def test_run_that_crosses_regimes_is_not_a_single_line():
    cost = RooflineCost(get_model("Llama-3.1-8B"), get_gpu("h100"), step_overhead_s=0.0, flops_efficiency=0.05)
    b = decode(512, 100)
    first, last = cost.step_time_s(b), cost.step_time_s(grown(b, 19_999))
    mem0, mem_slope, comp0, comp_slope = cost._lines(b)
    assert comp0 > mem0 and mem0 + 19_999 * mem_slope > comp0 + 19_999 * comp_slope  # it does cross
    assert min(first, last) < cost.run_time_s(b, 20_000) / 20_000 < max(first, last)


def test_mla_and_moe_use_latent_bytes_and_active_params():
    ds = RooflineCost(get_model("DeepSeek-V2-Lite"), get_gpu("h100"), step_overhead_s=0.0)
    assert ds.kv_bytes_per_token == 31_104
    assert ds.flops_per_token == 2 * 2_661_150_208


def test_roofline_satisfies_the_simulator_protocol():
    assert isinstance(RooflineCost(get_model("OPT-13B"), get_gpu("a100-40")), CostModel)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match=r"flops_efficiency must be in \(0, 1\], got 0"):
        RooflineCost(get_model("OPT-13B"), get_gpu("a100"), flops_efficiency=0)
    with pytest.raises(ValueError, match=r"num_steps must be >= 0, got -1"):
        RooflineCost(get_model("OPT-13B"), get_gpu("a100")).run_time_s(decode(1, 1), -1)


def test_moe_decode_reads_only_the_experts_its_tokens_touch():
    # gpt-oss-20b: 24 MoE layers of 32 experts, 4 per token. One decode token touches 4 of a
    # layer's 32 experts: of the experts' bytes it reads 4 / 32; n tokens 1 - (28 / 32) ** n
    m = get_model("gpt-oss-20b")
    b = m.weights.breakdown
    assert (b.num_experts, b.num_experts_per_tok) == (32, 4)
    cost = RooflineCost(m, get_gpu("h200"), step_overhead_s=0.0)
    experts, rest = m.weights.expert_bytes, m.weight_bytes - m.weights.expert_bytes
    assert 0 < experts < m.weight_bytes
    for n in (1, 2, 7, 64):
        touched = 1 - (1 - 4 / 32) ** n
        assert cost.weights_read_bytes(n) == pytest.approx(rest + experts * touched, rel=1e-12)
    # a lone decode token, hand-computed: rest + experts / 8 of weights, plus its KV
    step = decode(1, 1000)
    by_hand = (rest + experts * 4 / 32 + 1001 * cost.kv_bytes_per_token) / get_gpu("h200").memory_bandwidth_bytes_per_s
    assert cost.step_time_s(step) == pytest.approx(by_hand, rel=1e-12)
    # more tokens touch more experts, up to every one of them
    reads = [cost.weights_read_bytes(n) for n in (1, 2, 4, 16, 64, 4096)]
    assert reads == sorted(reads) and len(set(reads)) == len(reads)
    assert cost.weights_read_bytes(4096) == pytest.approx(m.weight_bytes, rel=1e-12)


def test_moe_expert_share_holds_per_tensor_parallel_rank():
    m, g = get_model("gpt-oss-120b"), get_gpu("h100")
    one, two = RooflineCost(m, g), RooflineCost(m, g, tp=2)
    assert two.weights_read_bytes(1) == pytest.approx(one.weights_read_bytes(1) / 2, rel=1e-6)
    assert "4 of 128 each" in one.describe()


def test_dense_models_read_every_weight_each_step():
    cost = RooflineCost(get_model("Llama-3.1-8B"), get_gpu("h100"))
    assert cost.weights_read_bytes(1) == cost.weights_read_bytes(512) == cost.weight_bytes
    assert get_model("Llama-3.1-8B").weights.expert_bytes == 0
    assert "experts" not in cost.describe()


@pytest.mark.parametrize("num_seqs,context,steps", [(1, 10, 500), (16, 2000, 300), (512, 100, 20_000)])
def test_moe_closed_form_run_equals_summed_steps(num_seqs, context, steps):
    # DeepSeek-V2-Lite: 6 of 64 routed experts a token, beside shared experts and a dense layer
    cost = RooflineCost(get_model("DeepSeek-V2-Lite"), get_gpu("h200"), flops_efficiency=0.05)
    b = decode(num_seqs, context)
    summed = math.fsum(cost.step_time_s(grown(b, i)) for i in range(steps))
    assert cost.run_time_s(b, steps) == pytest.approx(summed, rel=1e-9, abs=1e-12)


def test_shipped_flops_shares_are_the_fit_to_real_vllm_tables():
    # planner.roofline's shares are what bench/roofline_efficiency.py fits to the shipped tables of
    # real vLLM's grid steps: a table refitted or a share edited by hand fails here
    from bench.roofline_efficiency import fitted_shares, load_all
    from kvsim.planner.roofline import MEASURED_FLOPS_EFFICIENCY, MEASURED_MIXED_LAYER_S

    assert fitted_shares(load_all()) == {cls: (share, MEASURED_MIXED_LAYER_S[cls])
                                         for cls, share in MEASURED_FLOPS_EFFICIENCY.items()}


def test_the_share_fit_recovers_a_known_share_and_time_a_layer():
    import numpy as np

    from bench.roofline_efficiency import fit_share, priced

    rng = np.random.default_rng(0)
    mem, comp = rng.uniform(1e-3, 5e-3, 40), rng.uniform(1e-3, 0.1, 40)
    layers = rng.choice([32, 64], 40)
    rows = np.stack([mem, comp, np.full(40, 0.002), np.zeros(40), layers], axis=1)
    rows[:, 3] = priced(rows, 0.63)
    assert fit_share([rows]) == (0.63, 0.0)
    timed = rows.copy()
    timed[:, 3] = priced(rows, 0.63, 71e-6)       # a step with prompt tokens: 71 us a layer more
    assert fit_share([timed]) == (0.63, 71e-6)
    other = rows.copy()
    other[:, 3] = priced(rows, 0.81)
    assert 0.63 <= fit_share([rows, other])[0] <= 0.81


def test_a_step_with_prompt_tokens_pays_its_time_a_layer():
    """vLLM runs a step with prompt tokens on piecewise CUDA graphs, its attention outside them: the
    roofline adds layers x mixed_layer_s to such a step, never to a decode step (nor to a run of
    them); the default roofline takes the measured time for the weights, none where a roofline
    parameter is given."""
    from kvsim.planner.engine_setup import build_engine
    from kvsim.planner.roofline import MEASURED_MIXED_LAYER_S

    model = get_model("Qwen2.5-7B")
    bare = RooflineCost(model, get_gpu("h100"))
    timed = RooflineCost(model, get_gpu("h100"), mixed_layer_s=80e-6)
    prefill = StepBatch(num_seqs=2, num_prefill_tokens=300, num_decode_tokens=1, num_scheduled_tokens=301,
                        kv_read_tokens=900, attn_token_pairs=60_000)
    assert timed.step_time_s(prefill) - bare.step_time_s(prefill) == pytest.approx(model.num_layers * 80e-6)
    step = decode(16, 2000)
    assert timed.step_time_s(step) == bare.step_time_s(step) and timed.run_time_s(step, 9) == bare.run_time_s(step, 9)
    assert "80 us a layer more" not in bare.describe()
    with pytest.raises(InputError, match="mixed_layer_s"):
        RooflineCost(model, get_gpu("h100"), mixed_layer_s=-1e-6)
    for kwargs, cls in ((dict(model="Llama-3.1-8B"), "bf16"), (dict(model="Llama-3.1-8B", weight_dtype="fp8"), "fp8"),
                        (dict(model="gpt-oss-20b"), "mxfp4-moe")):
        cost = build_engine(gpu="h200", num_gpu_blocks=100, cost_table="roofline", **kwargs).cost
        assert cost.mixed_layer_s == MEASURED_MIXED_LAYER_S[cls]
        assert ("a layer more" in cost.describe()) == bool(MEASURED_MIXED_LAYER_S[cls])
    assert MEASURED_MIXED_LAYER_S["bf16"] > 0 and MEASURED_MIXED_LAYER_S["fp8"] > 0
    given = build_engine(gpu="h200", num_gpu_blocks=100, model="Llama-3.1-8B", step_overhead_s=0.003).cost
    assert given.mixed_layer_s == 0.0


@pytest.mark.parametrize("kwargs,share,cls", [
    (dict(model="Llama-3.1-8B"), 0.76, "bf16"),
    (dict(model="Llama-3.1-8B", weight_dtype="fp8"), 0.62, "fp8"),
    (dict(model="DeepSeek-V2-Lite"), 0.58, "bf16-moe"),
    (dict(model="gpt-oss-20b"), 0.79, "mxfp4-moe"),
])
def test_the_default_roofline_takes_real_vllms_share_for_the_weights(kwargs, share, cls):
    from kvsim.planner.engine_setup import build_engine
    from kvsim.planner.roofline import weight_class

    for gpu, where in (("h200", "measured"), ("a100-80", "extrapolated")):
        cost = build_engine(gpu=gpu, num_gpu_blocks=100, cost_table="roofline", **kwargs).cost
        assert cost.flops_efficiency == share and weight_class(cost.model) == cls
        assert f"{share:.0%} of the datasheet" in cost.describe() and where in cost.describe()
    # a share given is the share used, and says nothing of a measurement
    given = build_engine(gpu="h200", num_gpu_blocks=100, flops_efficiency=1.0, **kwargs).cost
    assert given.flops_efficiency == 1.0 and "prefill steps" not in given.describe()
    # a prefill priced at the measured share takes 1 / share as long where it is compute-bound
    step = StepBatch(num_seqs=1, num_prefill_tokens=8192, num_scheduled_tokens=8192, kv_read_tokens=8192,
                     attn_token_pairs=8192 * 8193 // 2)
    measured = build_engine(gpu="h200", num_gpu_blocks=100, cost_table="roofline", **kwargs).cost
    # real vLLM's time a layer, times the layers, and the time a layer of a step with prompt tokens
    # (both clocks)
    fixed = measured.step_overhead_s + measured.mixed_step_s
    assert fixed == given.step_overhead_s + given.mixed_step_s > 0
    assert (measured.step_time_s(step) - fixed) == pytest.approx((given.step_time_s(step) - fixed) / share, rel=1e-9)


def test_shipped_decode_shares_are_the_fit_to_real_vllm_decode_steps():
    # planner.roofline's decode shares are what bench/roofline_efficiency.py fits to the decode
    # rows of the shipped dense tables, per GPU: a table refitted or a share edited by hand fails
    from bench.roofline_efficiency import fitted_decode, load_decode
    from kvsim.planner.roofline import MEASURED_DECODE

    fitted = fitted_decode(load_decode())
    assert set(fitted) == set(MEASURED_DECODE)
    for gpu, got in fitted.items():
        ship = MEASURED_DECODE[gpu]
        assert (got.weights, got.kv, got.layer_s) == (ship.weights, ship.kv, ship.layer_s), gpu


def test_the_decode_fit_recovers_known_shares():
    import numpy as np

    from bench.roofline_efficiency import decode_priced, fit_decode
    from kvsim.planner.roofline import DecodeShares

    rng = np.random.default_rng(1)
    true = DecodeShares(0.91, 0.62, 47e-6, "")
    tables = []
    for layers in (32, 64, 80):
        rows = np.stack([rng.uniform(2e-3, 2e-2, 60), rng.uniform(1e-4, 8e-3, 60), np.full(60, layers),
                         np.zeros(60), np.zeros(60)], axis=1)
        rows[:, 3] = decode_priced(rows, true)
        tables.append(rows)
    got = fit_decode(tables)
    assert (got.weights, got.kv, got.layer_s) == (0.91, 0.62, 47e-6)


def test_measured_decode_shares_price_weights_and_kv_apart_and_a_time_a_layer():
    """With DecodeShares the weights (an untied input embedding left out: a step looks its rows up)
    stream at one share of the bandwidth, the KV at another, and a step costs layers x layer_s
    more; every decode step of a run one more token of KV at the KV's share. The default roofline
    of build_engine takes the GPU's measured shares (the H100's, said extrapolated, elsewhere),
    and any memory-side or fixed-cost parameter given switches them off."""
    from kvsim.planner.engine_setup import build_engine
    from kvsim.planner.roofline import MEASURED_DECODE, DecodeShares, input_embedding_bytes

    model, gpu = get_model("Llama-3.1-8B"), get_gpu("h100")
    shares = DecodeShares(0.8, 0.5, 50e-6, "test")
    cost = RooflineCost(model, gpu, step_overhead_s=0.0, decode=shares)
    emb = input_embedding_bytes(model)
    assert emb == 128256 * 4096 * 2          # Llama-3.1-8B's input embedding, untied
    bw = gpu.memory_bandwidth_bytes_per_s
    batch = StepBatch(num_seqs=8, num_decode_tokens=8, num_scheduled_tokens=8, kv_read_tokens=8 * 1000,
                      attn_token_pairs=8 * 1000)
    want = (model.weight_bytes - emb) / (bw * 0.8) + 8 * 1001 * cost.kv_bytes_per_token / (bw * 0.5) + 32 * 50e-6
    assert cost.step_time_s(batch) == pytest.approx(want, rel=1e-12)
    assert cost.run_time_s(batch, 2) - 2 * cost.step_time_s(batch) == pytest.approx(
        8 * cost.kv_bytes_per_token / (bw * 0.5), rel=1e-9)
    assert "80%, 50% and 100% of the datasheet" in cost.describe() and "50 us a layer" in cost.describe()
    # the default roofline: the GPU's measured shares; elsewhere the H100's, extrapolated
    default = build_engine(model="Llama-3.1-8B", gpu="h200", num_gpu_blocks=100, cost_table="roofline").cost
    assert default.decode == MEASURED_DECODE["H200"] and "decode steps on the H200" in default.describe()
    a100 = build_engine(model="Llama-3.1-8B", gpu="a100", num_gpu_blocks=100, cost_table="roofline").cost
    assert a100.decode.weights == MEASURED_DECODE["H100-80GB-SXM"].weights and "extrapolated to A100" in a100.describe()
    for given in (dict(bandwidth_efficiency=0.7), dict(step_overhead_s=0.004)):
        old = build_engine(model="Llama-3.1-8B", gpu="h200", num_gpu_blocks=100, **given).cost
        assert old.decode is None and old.embedding_bytes == 0.0
