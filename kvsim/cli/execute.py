"""What ``kvsim profile`` and ``kvsim replay --execute cuda`` share: the model the step executor runs
(a preset's or a config.json's shape) and the executor built for it.

torch and the kernels are imported only inside the functions: ``kvsim --help`` stays light.
"""
from __future__ import annotations

import json
from pathlib import Path

from kvsim.errors import InputError

# the executor's families of the dense presets, with the RoPE settings of their config.json
# (timing does not depend on them; the reference comparison does)
_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
PRESET_CONFIGS = {
    "Llama-3.1-8B": {"model_type": "llama", "rope_theta": 500000.0, "rope_scaling": _LLAMA3_ROPE},
    "Llama-3.1-70B": {"model_type": "llama", "rope_theta": 500000.0, "rope_scaling": _LLAMA3_ROPE},
    "Qwen2.5-7B": {"model_type": "qwen2", "rope_theta": 1000000.0, "rms_norm_eps": 1e-6},
    "Qwen2.5-72B": {"model_type": "qwen2", "rope_theta": 1000000.0, "rms_norm_eps": 1e-6},
    "Mistral-7B-v0.3": {"model_type": "mistral", "rope_theta": 1000000.0},
}


def decoder_shape(model: str | None, hf_config: str | None):
    """The DecoderShape of a preset (``--model``) or of a config.json (``--hf-config``).

    Raises:
        InputError: an unknown preset, a preset or config the executor cannot run (MoE, MLA, OPT),
            unreadable JSON or a bad field (file and field named).
    """
    from kvsim.kernels.decoder import DecoderShape
    if hf_config is not None:
        path = str(hf_config)
        try:
            cfg = json.loads(Path(path).read_text())
        except json.JSONDecodeError as err:
            raise InputError(f"invalid JSON: {err.msg} (column {err.colno})", file=path, line=err.lineno) from None
        except UnicodeDecodeError as err:
            raise InputError(f"not UTF-8 text ({err.reason})", file=path) from None
        if not isinstance(cfg, dict):
            raise InputError("expected a JSON object", file=path)
        try:
            return DecoderShape.from_hf_config(cfg, name=Path(path).resolve().parent.name or "custom")
        except ValueError as err:
            field, _, message = str(err).partition(": ")
            raise InputError(message or field, file=path, field=field if message else None) from None
    from kvsim.planner.presets import get_model
    spec = get_model(model or "Llama-3.1-8B")
    if spec.name not in PRESET_CONFIGS:
        runs = ", ".join(PRESET_CONFIGS)
        raise InputError(f"the step executor runs dense Llama/Qwen/Mistral decoders ({runs}, or --hf-config "
                         f"of such a model); {spec.name} is not one", field="model")
    cfg = {"hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
           "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_attention_heads,
           "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim, "vocab_size": spec.vocab_size,
           **PRESET_CONFIGS[spec.name]}
    shape = DecoderShape.from_hf_config(cfg, name=spec.name)
    assert shape.num_params == spec.num_params, (shape.num_params, spec.num_params)
    return shape


def require_cuda(flag: str) -> None:
    """InputError unless torch sees a CUDA GPU (the executor times on one)."""
    import torch
    if not torch.cuda.is_available():
        raise InputError(f"{flag} needs a CUDA GPU and torch sees none")
