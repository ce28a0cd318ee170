"""Weights as served: parameter counts by kind (against published totals) and their bytes under
fp8 / MXFP4 / AWQ-GPTQ int4 quantization or --weight-dtype."""
import json
from pathlib import Path

import pytest

from kvsim.errors import InputError
from kvsim.planner.presets import estimate_num_params
from kvsim.planner.weights import WeightFormat, param_breakdown, weight_bytes, weight_format
from test_planner_presets import CONFIGS

HF = Path(__file__).resolve().parent.parent / "planner" / "hf_configs"
GIB = 2**30


def text_config(name: str) -> dict:
    raw = json.loads((HF / name / "config.json").read_text())
    cfg = {**raw, **raw.get("text_config", {})}
    if "vision_config" in raw:
        cfg["vision_config"] = raw["vision_config"]
    return cfg


def test_breakdown_reproduces_every_existing_preset_count():
    for name, cfg in CONFIGS.items():
        breakdown = param_breakdown(cfg)
        assert (breakdown.num_params, breakdown.num_active_params) == estimate_num_params(cfg), name


@pytest.mark.parametrize("name, total_b, active_b", [
    ("gpt-oss-120b", 116.83, 5.71),     # model card: 116.83B; 5.13B active + unembedding 0.58B
    ("gpt-oss-20b", 20.91, 4.19),
    ("gemma-3-27b-it", 27.43, 27.43),   # text 27.0B + SigLIP tower 0.42B
    ("DeepSeek-V3", 671.03, 37.55),     # 671B without the MTP layer, 37B active
    ("Qwen3-Next-80B-A3B-Instruct", 79.67, 3.87),
    ("Nemotron-H-8B-Base-8K", 8.10, 8.10),
])
def test_hybrid_model_counts_match_published_totals(name, total_b, active_b):
    breakdown = param_breakdown(text_config(name))
    assert breakdown.num_params / 1e9 == pytest.approx(total_b, abs=0.015)
    assert breakdown.num_active_params / 1e9 == pytest.approx(active_b, abs=0.015)


def test_quantization_config_gives_the_served_sizes():
    oss = text_config("gpt-oss-120b")
    fmt = weight_format(oss, 2)
    assert fmt.method == "mxfp4" and "mxfp4" in fmt.source
    # MXFP4 experts (4.25 bits) + bf16 attention/embeddings: the 60.8 GiB checkpoint, one H100
    assert weight_bytes(param_breakdown(oss), fmt) / GIB == pytest.approx(60.8, abs=0.05)
    ds = text_config("DeepSeek-V3")
    fmt = weight_format(ds, 2)
    assert fmt.method == "fp8" and fmt.block_scales
    per_gpu = weight_bytes(param_breakdown(ds), fmt) / 8 / GIB
    assert 78 < per_gpu < 79       # fp8 at tp=8 (bf16 would be 156 GiB)


def test_int4_and_weight_dtype_override():
    cfg = dict(CONFIGS["Llama-3.1-8B"])
    breakdown = param_breakdown(cfg)
    bf16 = weight_bytes(breakdown, weight_format(cfg, 2))
    awq = {**cfg, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    int4 = weight_bytes(breakdown, weight_format(awq, 2))
    linear = breakdown.num_params - breakdown.total["embedding"] - breakdown.total["lm_head"] \
        - breakdown.total["other"]
    # 4 bits + (fp16 scale + 4-bit zero) per 128 weights on linear layers; embeddings 16-bit
    assert int4 == bf16 - 2 * linear + linear // 2 + (-(-linear // 128)) * 20 // 8
    assert weight_bytes(breakdown, weight_format(awq, 2, "bfloat16")) == bf16
    assert weight_bytes(breakdown, weight_format(cfg, 2, "int4")) == int4
    fp8 = weight_bytes(breakdown, weight_format(cfg, 2, "fp8"))
    assert fp8 == bf16 - linear
    assert weight_bytes(breakdown, weight_format(cfg, 2), active=True) == bf16


def test_bad_quantization_is_one_line_input_error():
    with pytest.raises(InputError, match="unsupported quant_method 'bitsandbytes'"):
        weight_format({"quantization_config": {"quant_method": "bitsandbytes"}}, 2, path="c.json")
    with pytest.raises(InputError, match="4 or 8 bits"):
        weight_format({"quantization_config": {"quant_method": "gptq", "bits": 3}}, 2)
    with pytest.raises(InputError, match="weight dtype must be one of"):
        weight_format({}, 2, "nf4")
    with pytest.raises(ValueError, match="4 or 8 bits"):
        WeightFormat("int", 2, bits=2)
