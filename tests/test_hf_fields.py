"""A config.json is trusted only as far as it is understood (issue 29 item 1): an unknown
model_type, a near-miss field name and an absent MoE width are errors naming the file and field;
the defaults taken and the fields not read are named."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvsim.cli import main
from kvsim.errors import InputError
from kvsim.planner.hf_fields import ARCHITECTURES, MODEL_TYPES
from kvsim.planner.presets import load_hf_config

ROOT = Path(__file__).resolve().parent.parent
QWEN3_MOE = json.loads((ROOT / "bench/vllm_gpu/configs/Qwen3-30B-A3B/config.json").read_text())
LLAMA = json.loads((ROOT / "bench/vllm_gpu/configs/Llama-3.1-8B/config.json").read_text())
CONFIGS = sorted([*ROOT.glob("planner/hf_configs/*/config.json"), *ROOT.glob("bench/vllm_gpu/configs/*/config.json")])


def _write(tmp_path, cfg) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _without(cfg, field):
    out = copy.deepcopy(cfg)
    del out[field]
    return out


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.parent.name)
def test_every_shipped_config_loads_without_an_unknown_field(path):
    spec = load_hf_config(path)
    assert not any("does not read" in n for n in spec.config_notes), spec.config_notes


def test_an_moe_config_without_its_expert_width_is_an_error_not_434_gib(tmp_path):
    # sized with intermediate_size the experts were 434.87 GiB, and --tp 8 ran on without a word
    path = _write(tmp_path, _without(QWEN3_MOE, "moe_intermediate_size"))
    with pytest.raises(InputError) as err:
        load_hf_config(path)
    assert str(err.value).startswith(f"{path}: field 'moe_intermediate_size': missing, and Qwen3-MoE needs it")
    assert load_hf_config(_write(tmp_path, QWEN3_MOE)).num_params < 31e9   # the real one: 30.5B


def test_a_near_miss_field_name_is_named(tmp_path):
    cfg = _without(LLAMA, "num_key_value_heads")
    cfg["num_key_value_head"] = 8         # the typo silently became 32 KV heads, 8x the KV bytes
    with pytest.raises(InputError, match=r"field 'num_key_value_head': unknown field; did you mean "
                                         r"num_key_value_heads\?"):
        load_hf_config(_write(tmp_path, cfg))


def test_an_unknown_model_type_is_an_error_unless_forced(tmp_path):
    cfg = {**QWEN3_MOE, "model_type": "qwen4_moe"}
    path = _write(tmp_path, cfg)
    with pytest.raises(InputError, match=r"field 'model_type': model_type 'qwen4_moe' is not one kvsim "
                                         r"sizes \(known: .*\); --force-hf-config"):
        load_hf_config(path)
    spec = load_hf_config(path, force=True)
    assert "model_type 'qwen4_moe' sized as a generic decoder (--force-hf-config)" in spec.config_notes
    with pytest.raises(InputError, match="no model_type"):
        load_hf_config(_write(tmp_path, _without(_without(LLAMA, "model_type"), "architectures")))


def test_a_config_named_by_its_architecture_alone_loads(tmp_path):
    assert all(t in MODEL_TYPES for t in ARCHITECTURES.values())
    spec = load_hf_config(_write(tmp_path, _without(LLAMA, "model_type")))
    assert spec.num_kv_heads == 8


def test_defaults_taken_and_fields_not_read_are_named(tmp_path):
    cfg = _without(_without(LLAMA, "num_key_value_heads"), "torch_dtype")
    cfg["my_lab_setting"] = 3
    spec = load_hf_config(_write(tmp_path, cfg))
    assert spec.num_kv_heads == 32 and spec.dtype == "bfloat16"
    assert spec.config_notes == (
        "absent, default taken: num_key_value_heads 32 (num_attention_heads, as vLLM takes it); "
        "torch_dtype bfloat16", "fields kvsim does not read: my_lab_setting")


def test_the_cli_prints_the_notes_and_the_errors_in_one_line(tmp_path, capsys):
    cfg = {**_without(LLAMA, "torch_dtype"), "my_lab_setting": 3}
    path = _write(tmp_path, cfg)
    assert main(["capacity", "--hf-config", path, "--gpu", "h100"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"kvsim: note: {path}: absent, default taken: torch_dtype bfloat16",
                   f"kvsim: note: {path}: fields kvsim does not read: my_lab_setting"]
    bad = _write(tmp_path, {**QWEN3_MOE, "model_type": "qwen4_moe"})
    for argv in (["capacity", "--hf-config", bad, "--gpu", "h100", "--tp", "8"],
                 ["plan", "sharegpt:rate=2,n=5,seed=0", "--hf-config", bad, "--sweep", "block_size=16,32"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"kvsim: error: {bad}: field 'model_type'")
    assert main(["capacity", "--hf-config", bad, "--gpu", "h100", "--tp", "8", "--force-hf-config"]) == 0
