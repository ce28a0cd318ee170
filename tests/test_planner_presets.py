"""Presets against their config.json fields; config.json loading (nested, malformed)."""
import json

import pytest

from kvsim.planner.presets import PRESET_CONFIGS, MODEL_PRESETS, estimate_num_params, get_gpu, get_model, load_hf_config
from kvsim.planner.specs import GpuSpec, ModelSpec
from kvsim.errors import InputError

# the config.json fields of each preset (as published on the Hugging Face Hub)
CONFIGS = PRESET_CONFIGS


def test_param_counts_of_presets_are_reproduced_from_their_configs():
    # exact counts: e.g. Llama-3.1-8B = 2 * 128256*4096 (embed + lm_head) + 32 * 218,112,000 + 4096
    for name, cfg in CONFIGS.items():
        total, active = estimate_num_params(cfg)
        preset = MODEL_PRESETS[name]
        assert total == preset.num_params, name
        assert active == preset.active_params, name


@pytest.mark.parametrize("name", list(CONFIGS))
def test_loading_the_config_json_gives_the_preset(tmp_path, name):
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(CONFIGS[name]))
    spec = load_hf_config(path)
    preset = get_model(name)
    for field in ("num_layers", "num_attention_heads", "head_dim", "hidden_size", "vocab_size",
                  "num_params", "dtype", "kv_lora_rank", "qk_rope_head_dim", "max_position_embeddings"):
        assert getattr(spec, field) == getattr(preset, field), field
    assert spec.num_kv_heads == preset.num_kv_heads
    assert spec.name == name  # the directory's name


def test_nested_text_config_is_read(tmp_path):
    cfg = {"architectures": ["LlavaForConditionalGeneration"], "torch_dtype": "float16",
           "vision_config": {"hidden_size": 1024},
           "text_config": {k: v for k, v in CONFIGS["Mistral-7B-v0.3"].items() if k != "torch_dtype"}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = load_hf_config(path, name="llava")
    assert (spec.num_layers, spec.num_kv_heads, spec.dtype) == (32, 8, "float16")  # dtype from the top level


@pytest.mark.parametrize("content,match", [
    ('{"hidden_size": 4096,', r"config.json:1: invalid JSON"),
    ("[1, 2]", r"config.json: expected a JSON object, got list"),
    ('{"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 10}',
     r"config.json: field 'num_hidden_layers': missing required field"),
    ('{"model_type": "llama", "hidden_size": "4096", "num_hidden_layers": 2, "num_attention_heads": 32, "vocab_size": 10}',
     r"field 'hidden_size': must be a positive integer, got '4096'"),
    ('{"model_type": "llama", "hidden_size": 100, "num_hidden_layers": 2, "num_attention_heads": 32, "vocab_size": 10}',
     r"field 'head_dim': hidden_size \(100\) is not a multiple of num_attention_heads \(32\)"),
    ('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10, '
     '"torch_dtype": "int3"}', r"field 'torch_dtype': unknown dtype 'int3'"),
    ('{"text_config": 5}', r"field 'text_config': must be an object"),
])
def test_malformed_config_json_names_file_and_field(tmp_path, content, match):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(InputError, match=match) as err:
        load_hf_config(path)
    assert "\n" not in str(err.value)


def test_specs_validate_with_numbers_in_the_message():
    base = MODEL_PRESETS["Llama-3.1-8B"].to_dict()
    with pytest.raises(ValueError, match=r"num_layers must be > 0, got 0"):
        ModelSpec(**{**base, "num_layers": 0})
    with pytest.raises(ValueError, match=r"num_attention_heads \(32\) is not a multiple of num_kv_heads \(5\)"):
        ModelSpec(**{**base, "num_kv_heads": 5})
    with pytest.raises(ValueError, match="MLA needs both"):
        ModelSpec(**{**base, "kv_lora_rank": 512})
    with pytest.raises(ValueError, match=r"memory_bandwidth_bytes_per_s must be > 0, got -1"):
        GpuSpec(name="x", memory_bytes=1, memory_bandwidth_bytes_per_s=-1, bf16_flops_per_s=1)


def test_fp8_peak_is_used_for_one_byte_compute_only_where_the_gpu_has_it():
    from kvsim.planner.presets import get_gpu
    assert get_gpu("h100").peak_flops_per_s("fp8") == 1978.9e12
    assert get_gpu("h100").peak_flops_per_s("bfloat16") == 989.4e12
    assert get_gpu("a100").peak_flops_per_s("fp8") == 312e12  # no FP8 tensor cores on Ampere


def test_b200_is_a_preset_and_runs_a_measured_table_carried_there():
    """B200 (HGX, 1,000 W datasheet figures): sized and clocked by name; with no table of its own
    the H100's is carried to it, said extrapolated; its roofline takes the H100's decode shares."""
    from kvsim.planner.engine_setup import build_engine
    from kvsim.planner.roofline import MEASURED_DECODE
    from kvsim.simulator.cost import CarriedCost

    b200 = get_gpu("B200")
    assert b200.memory_bandwidth_bytes_per_s == 8.0e12 and b200.peak_flops_per_s("fp8") == 2 * b200.peak_flops_per_s("bfloat16")
    setup = build_engine(model="Llama-3.1-8B", gpu="b200", max_model_len=8192)
    assert isinstance(setup.cost, CarriedCost) and "to B200" in setup.cost.describe()
    assert setup.capacity.num_gpu_blocks > 2 * build_engine(model="Llama-3.1-8B", gpu="h100", max_model_len=8192).capacity.num_gpu_blocks
    roof = build_engine(model="Llama-3.1-8B", gpu="b200", max_model_len=8192, cost_table="roofline").cost
    assert roof.decode.weights == MEASURED_DECODE["H100-80GB-SXM"].weights and "extrapolated to B200" in roof.describe()
