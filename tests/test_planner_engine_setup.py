"""planner.engine_setup.build_engine: the one (model, GPU, flags) -> EngineConfig + cost builder."""
from __future__ import annotations

import copy

import pytest

from kvsim.errors import InputError
from kvsim.planner.capacity import compute_capacity, vllm_batch_defaults
from kvsim.planner.engine_setup import DEFAULT_MAX_MODEL_LEN, build_engine
from kvsim.planner.presets import custom_gpu, get_gpu, get_model
from kvsim.planner.roofline import MEASURED_DECODE, MEASURED_FLOPS_EFFICIENCY, MEASURED_MIXED_LAYER_S, RooflineCost
from kvsim.simulator.cost import CarriedCost, FixedStepCost, ScaledCost, StepBatch, SyncCost, TableCost
from kvsim.simulator.cost_table import StepShapeCost

PREFILL = StepBatch(num_seqs=2, num_prefill_tokens=600, num_scheduled_tokens=600,
                    kv_read_tokens=900, attn_token_pairs=200_000)


@pytest.mark.parametrize("allocator", ["paged", "max", "pow2", "oracle"])
def test_one_null_block_rule_gives_every_allocator_the_same_usable_slots(allocator):
    vllm_v1 = build_engine(allocator=allocator, num_gpu_blocks=300, block_size=16, step_s=0.01).config
    no_null = build_engine(allocator=allocator, num_gpu_blocks=300, block_size=16, step_s=0.01,
                           null_block=False).config
    if allocator == "paged":
        assert (vllm_v1.num_blocks, vllm_v1.null_block) == (300, True)
        assert (no_null.num_blocks, no_null.null_block) == (300, False)
    else:
        assert vllm_v1.capacity_tokens == 299 * 16 and not vllm_v1.null_block
        assert no_null.capacity_tokens == 300 * 16


def test_kv_tokens_are_usable_slots_rounded_to_whole_blocks():
    paged = build_engine(kv_tokens=6000, block_size=16, step_s=0.01).config
    assert paged.num_blocks == 6000 // 16 + 1 and paged.null_block
    contiguous = build_engine(allocator="max", kv_tokens=6000, block_size=16, step_s=0.01).config
    assert contiguous.capacity_tokens == 6000 // 16 * 16
    with pytest.raises(InputError, match="less than one block of 16 tokens"):
        build_engine(kv_tokens=15, step_s=0.01)


def test_model_and_gpu_size_the_pool_with_vllms_formula():
    setup = build_engine(model="Llama-3.1-8B", gpu="h100", max_model_len=8192)
    expected = compute_capacity(get_model("Llama-3.1-8B"), get_gpu("h100"), max_model_len=8192)
    assert setup.capacity == expected
    assert setup.config.num_blocks == expected.num_gpu_blocks and setup.config.null_block
    # batch limits left as None are vLLM's `vllm serve` defaults for the GPU, as in the report
    assert (setup.config.max_num_seqs, setup.config.max_num_batched_tokens) == \
        vllm_batch_defaults(get_gpu("h100")) == (expected.max_num_seqs, expected.max_num_batched_tokens)
    assert setup.gpu.name == "H100-80GB-SXM"
    # the default clock: real vLLM's steps measured for Llama-3.1-8B bf16 on an H100 (the finest grid)
    assert isinstance(setup.cost, StepShapeCost) and setup.cost.path.endswith("llama8b-bf16-fine_H100.csv")


def test_the_default_clock_is_a_fitting_vllm_table_else_the_roofline():
    """Where a shipped real-vLLM table fits the run (model, GPU, weights, KV dtype, TP, async
    scheduling) it is the clock; the roofline otherwise, or when asked for by name or by one of its
    own parameters."""
    def clock(**kw):
        return build_engine(model="Llama-3.1-8B", gpu="h100", max_model_len=8192, **kw).cost

    assert clock(kv_cache_dtype="fp8", weight_dtype="fp8").path.endswith("llama8b-fp8-fine_H100.csv")
    for kw in (dict(cost_table="roofline"), dict(bandwidth_efficiency=0.8), dict(step_overhead_s=0.004),
               dict(kv_cache_dtype="fp8"), dict(tensor_parallel_size=2)):
        assert isinstance(clock(**kw), RooflineCost), kw     # asked for, or no table measured this setup
    # fp8 with async off: no table measured it; the roofline, plus what async hid as the dense
    # engine's measured line says, extrapolated (a roofline parameter given: the roofline alone)
    off = clock(async_scheduling=False, kv_cache_dtype="fp8", weight_dtype="fp8")
    assert isinstance(off, SyncCost) and isinstance(off.inner, RooflineCost)
    assert "llama8b-bf16-fine_H100.csv's line, extrapolated to Llama-3.1-8B" in off.describe()
    moe = build_engine(model="gpt-oss-20b", gpu="a100", max_model_len=8192, async_scheduling=False).cost
    assert isinstance(moe, SyncCost) and "qwen3-30b-a3b-fine_H100.csv's line" in moe.describe()
    assert isinstance(clock(async_scheduling=False, kv_cache_dtype="fp8", weight_dtype="fp8",
                            bandwidth_efficiency=0.9), RooflineCost)
    # async off: the async table plus its measured '# async off:' line, where the table has one
    sync = clock(async_scheduling=False)
    from kvsim.planner.vllm_tables import shipped_cost
    assert isinstance(sync, SyncCost) and sync.inner is shipped_cost(clock().path) and sync.cpu_s > 0
    assert "async scheduling off" in sync.describe()
    assert isinstance(build_engine(model="Qwen2.5-7B", gpu="h100", max_model_len=8192).cost, RooflineCost)
    assert isinstance(clock(gpu_memory_utilization=0.5), StepShapeCost)      # the pool is not the clock
    assert clock() is clock(max_num_seqs=64)      # a shipped table is read and fitted once per process
    # a GPU nobody measured: the same setup's table carried there by the two GPUs' rooflines, said so
    a100 = build_engine(model="Llama-3.1-8B", gpu="a100", max_model_len=8192).cost
    assert isinstance(a100, CarriedCost) and a100.inner is shipped_cost(clock().path)
    assert "carried from H100-80GB-SXM to A100-80GB" in a100.describe() and "extrapolated" in a100.describe()
    assert isinstance(build_engine(model="Llama-3.1-8B", gpu="a100", max_model_len=8192,
                                   cost_table="roofline").cost, RooflineCost)
    with pytest.raises(InputError, match="no table of real vLLM's steps"):    # vllm: measured there, or nothing
        build_engine(model="Llama-3.1-8B", gpu="a100", max_model_len=8192, cost_table="vllm")


def test_max_model_len_defaults_to_the_models_context_only_when_the_model_sizes_the_pool():
    assert build_engine(gpu="h100").config.max_model_len == get_model("Llama-3.1-8B").max_position_embeddings
    given = build_engine(num_gpu_blocks=100, step_s=0.01).config
    assert given.max_model_len == DEFAULT_MAX_MODEL_LEN == 8192
    assert build_engine(num_gpu_blocks=100, step_s=0.01).capacity is None


def test_batch_defaults_follow_the_gpu():
    small = build_engine(gpu="a100-40", num_gpu_blocks=100, step_s=0.01).config
    assert (small.max_num_seqs, small.max_num_batched_tokens) == (256, 2048)
    explicit = build_engine(gpu="a100-40", num_gpu_blocks=100, step_s=0.01, max_num_seqs=8,
                            max_num_batched_tokens=512).config
    assert (explicit.max_num_seqs, explicit.max_num_batched_tokens) == (8, 512)


def test_async_scheduling_follows_vllm_unless_chosen(tmp_path):
    """vLLM 0.33 turns AsyncScheduler on for generation on a GPU: kvsim does when the step time
    comes from the GPU (roofline, measured table) for the paged v1 scheduler; with a fixed step
    time (the step clock), a contiguous allocator or v0 the default is synchronous."""
    table = tmp_path / "t.csv"
    table.write_text("num_scheduled_tokens,step_s\n1,0.01\n1000,0.05\n")
    assert build_engine(num_gpu_blocks=100).config.async_scheduling              # roofline
    assert build_engine(num_gpu_blocks=100, cost_table=str(table)).config.async_scheduling
    for kw in (dict(step_s=1.0), dict(step_s=0.02), dict(allocator="max"), dict(scheduler="v0")):
        assert not build_engine(num_gpu_blocks=100, **kw).config.async_scheduling, kw
    # the caller's choice wins either way
    assert build_engine(num_gpu_blocks=100, step_s=1.0, async_scheduling=True).config.async_scheduling
    assert not build_engine(num_gpu_blocks=100, async_scheduling=False).config.async_scheduling
    assert build_engine(allocator="max", num_gpu_blocks=100,
                        async_scheduling=True).config.async_scheduling
    with pytest.raises(InputError, match="no async scheduling"):
        build_engine(scheduler="v0", num_gpu_blocks=100, async_scheduling=True)


def test_v0_takes_vllm_v0s_batch_defaults():
    """vLLM 0.4's SchedulerConfig without chunked prefill: 256 sequences and a token budget of
    max(max_model_len, 2048); v0's pool has no null block and a 1 % watermark."""
    def v0(**kw):
        return build_engine(scheduler="v0", num_gpu_blocks=100, step_s=0.01, **kw).config
    assert (v0(max_model_len=1024).max_num_seqs, v0(max_model_len=1024).max_num_batched_tokens) \
        == (256, 2048)
    assert v0(max_model_len=4096).max_num_batched_tokens == 4096
    assert v0(max_model_len=1024, max_num_batched_tokens=3000).max_num_batched_tokens == 3000
    with pytest.raises(InputError, match="smaller than max_model_len"):
        v0(max_model_len=4096, max_num_batched_tokens=3000)
    # sized by the model: its context length sets the budget, and the pool is sized with it
    setup = build_engine(scheduler="v0", model="Llama-3.1-8B", gpu="h100")
    context = get_model("Llama-3.1-8B").max_position_embeddings
    assert setup.config.max_num_batched_tokens == setup.config.max_model_len == context
    assert setup.capacity.max_num_batched_tokens == context
    assert (setup.config.null_block, setup.config.watermark) == (False, 0.01)
    assert setup.config.num_blocks == setup.capacity.num_gpu_blocks


def test_step_time_models_in_order(tmp_path):
    assert build_engine(num_gpu_blocks=100, step_s=1.0).cost == FixedStepCost(1.0)
    table = tmp_path / "t.csv"
    table.write_text("num_scheduled_tokens,step_s\n1,0.01\n1000,0.05\n")
    assert isinstance(build_engine(num_gpu_blocks=100, cost_table=str(table)).cost, TableCost)
    roof = build_engine(model="Llama-3.1-70B", gpu="h200", tensor_parallel_size=4,
                        kv_cache_dtype="fp8", num_gpu_blocks=100).cost
    # the roofline at real vLLM's measured FLOP/s share for bf16 weights and its decode shares
    # (bandwidth of weights and KV, time a layer) on the GPU, and the time a layer of a step with
    # prompt tokens (planner.roofline)
    ref = RooflineCost(get_model("Llama-3.1-70B"), get_gpu("h200"), tp=4, kv_dtype="fp8",
                       flops_efficiency=MEASURED_FLOPS_EFFICIENCY["bf16"], decode=MEASURED_DECODE["H200"],
                       mixed_layer_s=MEASURED_MIXED_LAYER_S["bf16"])
    assert roof.step_time_s(PREFILL) == ref.step_time_s(PREFILL)
    scaled = build_engine(num_gpu_blocks=100, step_time_scale=2.5, cost_table="roofline").cost
    assert isinstance(scaled, ScaledCost)
    assert scaled.step_time_s(PREFILL) == 2.5 * RooflineCost(
        get_model("Llama-3.1-8B"), get_gpu("h100"), flops_efficiency=MEASURED_FLOPS_EFFICIENCY["bf16"],
        decode=MEASURED_DECODE["H100-80GB-SXM"], mixed_layer_s=MEASURED_MIXED_LAYER_S["bf16"]).step_time_s(PREFILL)
    measured = build_engine(num_gpu_blocks=100, step_time_scale=2.5).cost      # the default clock, scaled
    assert measured.step_time_s(PREFILL) == 2.5 * measured.inner.step_time_s(PREFILL)
    assert isinstance(measured.inner, StepShapeCost)
    assert scaled.run_time_s(PREFILL, 3) == 2.5 * scaled.inner.run_time_s(PREFILL, 3)


def test_specs_are_accepted_as_well_as_names():
    gpu = custom_gpu(40, 1000, 300)
    setup = build_engine(model=get_model("Qwen2.5-7B"), gpu=gpu, max_model_len=4096)
    assert setup.gpu is gpu and setup.capacity.gpu == "custom" and setup.capacity.model == "Qwen2.5-7B"


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_gpu_blocks=100, kv_tokens=1600, step_s=0.01), "at most one of num_gpu_blocks and kv_tokens"),
    (dict(num_gpu_blocks=100, step_s=0.01, cost_table="x.csv"), "at most one of step_s and cost_table"),
    # a name that is given is resolved even when nothing needs it: a typo is never ignored
    (dict(model="Llama-9", num_gpu_blocks=100, step_s=0.01), "unknown model 'Llama-9'"),
    (dict(model="Llama-3.1-70B", gpu="h100"), "weights need 131.42 GiB"),
    (dict(num_gpu_blocks=100, step_s=0.01, watermark=1.5), r"watermark must be in \[0, 1\)"),
    (dict(num_gpu_blocks=100, step_s=0), "step_s must be a positive finite number"),
    (dict(num_gpu_blocks=100, cost_table="/nonexistent/t.csv"), "cannot read the cost table"),
    (dict(num_gpu_blocks=100, step_time_scale=0), "step_time_scale must be a positive"),
])
def test_bad_settings_are_input_errors(kwargs, match):
    with pytest.raises(InputError, match=match):
        build_engine(**kwargs)


def test_the_paper_reproduction_counts_the_pool_without_vllms_null_block():
    from kvsim.planner.reproduce import ReproConfig, system_engine

    cfg = ReproConfig()
    vllm = system_engine("vllm", cfg).config
    orca = system_engine("orca_max", cfg).config
    assert (vllm.num_blocks, vllm.null_block, vllm.watermark) == (983, False, 0.01)
    assert orca.capacity_tokens == vllm.num_blocks * vllm.block_size == cfg.capacity_tokens == 15_728
    assert orca.max_num_batched_tokens == cfg.max_num_seqs * cfg.max_model_len
    assert not vllm.enable_prefix_caching and not orca.enable_prefix_caching
    slow = system_engine("vllm", cfg, step_time_scale=2.0).cost
    assert slow.step_time_s(PREFILL) == 2.0 * system_engine("vllm", cfg).cost.step_time_s(PREFILL)


def test_a_table_measured_with_async_scheduling_is_no_clock_for_a_synchronous_run():
    """A table given by path is checked for the scheduling mode too (a table measured with async
    scheduling on hides CPU work that a synchronous run shows), unless forced."""
    from pathlib import Path
    tables = Path(__file__).resolve().parent.parent / "tables" / "vllm"
    kw = dict(model="Llama-3.1-8B", gpu="h100", max_model_len=8192, kv_cache_dtype="fp8", weight_dtype="fp8",
              cost_table=str(tables / "llama8b-fp8-fine_H100.csv"))     # no '# async off:' line
    assert isinstance(build_engine(**kw).cost, StepShapeCost)
    with pytest.raises(InputError, match="async scheduling off"):
        build_engine(async_scheduling=False, **kw)
    assert isinstance(build_engine(async_scheduling=False, force_cost_table=True, **kw).cost, StepShapeCost)
    # a table with the line measured: a synchronous run takes it, plus what async hid
    bf16 = dict(model="Llama-3.1-8B", gpu="h100", max_model_len=8192,
                cost_table=str(tables / "llama8b-bf16-fine_H100.csv"))
    assert isinstance(build_engine(async_scheduling=False, **bf16).cost, SyncCost)


def test_the_default_roofline_takes_the_measured_engines_way_in_and_out():
    """vLLM's frontend (a request's way in to the scheduler, a token's way out to the client: CPU
    and IPC, no GPU work) is no step's price: the roofline takes the '# frontend:' line of the
    measured engine of the model's kind on the GPU (on another GPU the H100's, said so), and the
    engine adds it outside the steps, as for a table; a roofline parameter given leaves it out."""
    from kvsim.planner.engine_setup import FRONTEND_TABLES
    from kvsim.planner.vllm_tables import TABLES_DIR, shipped_cost
    from kvsim.simulator import simulate
    from kvsim.workloads import Request

    def roof(model, gpu, **kw):
        return build_engine(model=model, gpu=gpu, max_model_len=8192, cost_table="roofline", **kw)

    for model, gpu, kind in (("Qwen2.5-7B", "h100", "dense"), ("Qwen2.5-7B", "h200", "dense"),
                             ("gpt-oss-20b", "h200", "moe"), ("DeepSeek-V2-Lite", "h100", "moe")):
        cost = roof(model, gpu).cost
        table = FRONTEND_TABLES[cost.gpu.name][kind]
        assert cost.frontend_s == shipped_cost(str(TABLES_DIR / table)).frontend_s and all(cost.frontend_s)
        assert f"({table}'s frontend line: real vLLM 0.23.0's lone prompts)" in cost.describe()
    assert FRONTEND_TABLES["H200"]["dense"] != FRONTEND_TABLES["H100-80GB-SXM"]["dense"]   # each GPU's host
    a100 = roof("Qwen2.5-7B", "a100").cost
    assert a100.frontend_s == roof("Qwen2.5-7B", "h100").cost.frontend_s
    assert "extrapolated to A100" in a100.describe()
    for kw in (dict(bandwidth_efficiency=0.8), dict(step_overhead_s=0.004)):
        given = roof("Qwen2.5-7B", "h100", **kw).cost
        assert given.frontend_s == (0.0, 0.0, 0.0) and "way in" not in given.describe()
    # a lone request: its TTFT is the way in, its steps and the way out
    setup = roof("Qwen2.5-7B", "h100")
    bare = copy.copy(setup.cost)
    bare.frontend_s = (0.0, 0.0, 0.0)
    way_in, per_token, way_out = setup.cost.frontend_s
    ttft = {}
    for name, cost in (("with", setup.cost), ("without", bare)):
        res = simulate(iter([Request(0, 0.0, 1024, 4)]), setup.config, cost)
        ttft[name] = float(res.requests["ttft_s"].iloc[0])
    assert ttft["with"] - ttft["without"] == pytest.approx(way_in + 1024 * per_token + way_out, rel=1e-3, abs=2e-6)
