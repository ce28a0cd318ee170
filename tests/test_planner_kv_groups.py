"""kvsim's KV-cache plan (layers -> per-rank specs -> groups -> num_gpu_blocks) equals vLLM
0.33's own planning functions, case by case (tests/fixtures/vllm_kv_capacity.json, made by
tests/capacity_cases.py with bench/vllm_kv_capacity.py), and its rules hold on their own."""
import json

import pytest

from capacity_cases import (GOLDEN, PRESET_CASES, cases, kvsim_plan, preset_capacity, report_plan,
                            vllm_plans)
from kvsim.planner.kv_groups import kv_cache_groups, layer_kv_specs, plan_kv_cache
from kvsim.planner.layers import AttentionLayer, MambaLayer, parse_layers
from kvsim.errors import InputError
from test_allocator_vs_vllm import vllm_python

RECORDS = json.loads(GOLDEN.read_text())


def label(record):
    c = record["case"]
    if "preset" in c:
        return (f"{c['preset']}-{c['gpu']}-tp{c['tp']}-L{c['max_model_len']}-"
                f"pc{int(c['prefix_caching'])}{'-nohma' if c.get('disable_hybrid_kv_cache_manager') else ''}")
    return (f"{c['config'].split('/')[2]}-tp{c['tp']}-{c.get('kv_cache_dtype', 'auto')}-"
            f"b{c.get('block_size')}-L{c['max_model_len']}-pc{int(c.get('prefix_caching', 1))}"
            f"-{c['available_kv_bytes'] >> 20}M{'-nohma' if c.get('disable_hybrid_kv_cache_manager') else ''}")


def test_golden_cases_are_the_current_cases():
    assert [r["case"] for r in RECORDS] == cases()


@pytest.mark.parametrize("record", RECORDS, ids=[label(r) for r in RECORDS])
def test_plan_equals_vllm(record):
    got, want = kvsim_plan(record["case"]), record["vllm"]
    if "error" in want:                   # vLLM refuses to start: so must kvsim
        assert "error" in got and "max_model_len" in got["error"], got
        return
    assert got == want


PRESET_RECORDS = [r for r in RECORDS if "preset" in r["case"]]


def test_every_hybrid_preset_has_capacity_cases():
    from kvsim.planner.presets import BUNDLED_MODELS
    assert {r["case"]["preset"] for r in PRESET_RECORDS} == set(BUNDLED_MODELS)
    assert len(PRESET_RECORDS) == len(PRESET_CASES)


@pytest.mark.parametrize("record", PRESET_RECORDS, ids=[label(r) for r in PRESET_RECORDS])
def test_preset_capacity_equals_vllm(record):
    """``kvsim capacity --model P``'s numbers (compute_capacity, at the KV memory it computes)
    equal vLLM's own planning at that memory: num_gpu_blocks, block size, every group's layers,
    page and bytes per token, max concurrency."""
    c = record["case"]
    r = preset_capacity(c["preset"], c["gpu"], c["tp"], c["max_model_len"], c["prefix_caching"],
                        c.get("disable_hybrid_kv_cache_manager", False))
    assert r.available_kv_bytes == c["available_kv_bytes"]
    assert report_plan(r) == record["vllm"]
    for row, group in zip(r.kv_groups, record["vllm"]["groups"]):
        assert row["bytes_per_token"] == group["group_page_bytes"] / group["block_size"]


@pytest.mark.slow
def test_plans_equal_vllm_live():
    python = vllm_python()
    if python is None:
        pytest.skip("no interpreter with vLLM ($KVSIM_VLLM_PYTHON or ../oracle-venv)")
    all_cases = cases()
    for case, want in zip(all_cases, vllm_plans(python, all_cases)):
        got = kvsim_plan(case)
        assert ("error" in got) == ("error" in want) and ("error" in want or got == want), case


def test_gpt_oss_shape_fits_twice_the_blocks_of_all_full_layers():
    layers = [AttentionLayer("sliding_window", 8, 64, 64, 128),
              AttentionLayer("full_attention", 8, 64, 64)] * 18
    full = [AttentionLayer("full_attention", 8, 64, 64)] * 36
    common = dict(tp=1, kv_dtype_bytes=2, model_dtype="bfloat16", block_size=16,
                  enable_prefix_caching=True, max_model_len=131072)
    hybrid = plan_kv_cache(layer_kv_specs(layers, **common)[0], 16, 2**36, 131072, 16384)
    uniform = plan_kv_cache(layer_kv_specs(full, **common)[0], 16, 2**36, 131072, 16384)
    assert [g.kind for g in hybrid.groups] == ["sliding_window", "full_attention"]
    assert 2 * hybrid.bytes_per_block == uniform.bytes_per_block == 36 * 16 * 8 * 128 * 2
    assert hybrid.num_gpu_blocks == 2 * uniform.num_gpu_blocks
    # a request of 131072 tokens: 8192 full blocks + cdiv(127 + 16384, 16) + 1 sliding blocks
    assert hybrid.blocks_per_request == (1033, 8192)
    assert hybrid.max_concurrency == pytest.approx(uniform.max_concurrency * 2 * 8192 / 9225)


def test_groups_split_buckets_by_the_smallest_and_pad_none():
    specs = layer_kv_specs([AttentionLayer("sliding_window", 4, 128, 128, 1024)] * 5
                           + [AttentionLayer("full_attention", 4, 128, 128)], tp=1,
                           kv_dtype_bytes=2, model_dtype="bfloat16", block_size=16,
                           enable_prefix_caching=True, max_model_len=4096)[0] * 2
    groups = kv_cache_groups(specs)
    # 10 sliding + 2 full layers: group size 2, so 5 sliding groups and 1 full group
    assert [len(g.layers) for g in groups] == [2] * 6
    assert groups[0].layers == (0, 6) and groups[-1].layers == (5, 11)


def test_mamba_raises_the_attention_block_and_pads_its_page():
    mamba = MambaLayer("mamba2", conv_kernel=4, num_heads=128, head_dim=64, state_size=128,
                       n_groups=8, ssm_dtype="float32")
    layers = [mamba, None, AttentionLayer("full_attention", 8, 128, 128)]
    specs, block = layer_kv_specs(layers, tp=1, kv_dtype_bytes=2, model_dtype="bfloat16",
                                  block_size=16, enable_prefix_caching=True, max_model_len=8192)
    # state 3 x 10240 x 2 + 128 x 64 x 128 x 4 = 4,255,744 B; 4,096 B per attention token
    assert block == 1040 and specs[0].page_size_bytes == specs[2].page_size_bytes == 1040 * 4096
    assert specs[1] is None and specs[0].mamba_cache_mode == "align"


def test_unsupported_layer_type_is_one_line_input_error():
    with pytest.raises(InputError, match="unsupported layer type 'chunked_attention' at layer 1"):
        parse_layers({"layer_types": ["full_attention", "chunked_attention"]}, "c.json", 2, 8,
                     128)
    with pytest.raises(InputError, match="field 'hybrid_override_pattern'"):
        parse_layers({"hybrid_override_pattern": "M*X"}, "c.json", 3, 8, 128)
