"""What a Hugging Face config.json may hold, for ``presets.load_hf_config`` (issue 29 item 1).

A config.json is trusted only as far as it is understood:

* ``model_type`` must be one kvsim sizes (``MODEL_TYPES``: its weights, layers and KV-cache
  groups are counted as vLLM counts them); another is an error unless forced, and then the
  model is sized as a generic decoder (Llama-like attention and MLP, MoE from the usual fields).
* A field that sizes memory or time and is absent is reported with the default taken (a
  ``note``), e.g. ``num_key_value_heads`` absent: 32, num_attention_heads, as vLLM takes it.
* A field of a model type's MoE or MLA that has no default worth taking (``REQUIRED``: Qwen3-MoE's
  ``moe_intermediate_size``, without which the experts would be sized with the dense
  ``intermediate_size``, 434.87 GiB for Qwen3-30B-A3B) is an error.
* A field kvsim does not know that is one edit away from one it reads (``num_key_value_head``) is
  an error naming the field it resembles; other unknown fields are named in a note.
"""
from __future__ import annotations

import difflib

from kvsim.errors import InputError

# model_type -> what kvsim counts for it (the checks in tests/test_hf_fields.py load each)
MODEL_TYPES: dict[str, str] = {
    "llama": "Llama", "mistral": "Mistral", "mixtral": "Mixtral (MoE)", "qwen2": "Qwen2/2.5",
    "qwen2_moe": "Qwen2-MoE", "qwen3": "Qwen3", "qwen3_moe": "Qwen3-MoE", "qwen3_next": "Qwen3-Next",
    "gemma3": "Gemma 3", "gemma3_text": "Gemma 3", "deepseek_v2": "DeepSeek-V2 (MLA)",
    "deepseek_v3": "DeepSeek-V3 (MLA)", "gpt_oss": "gpt-oss", "opt": "OPT", "nemotron_h": "Nemotron-H",
}
# the Hugging Face class names of those types, for a config.json without model_type
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2", "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "Qwen3NextForCausalLM": "qwen3_next",
    "Gemma3ForCausalLM": "gemma3_text", "Gemma3ForConditionalGeneration": "gemma3",
    "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss", "OPTForCausalLM": "opt", "NemotronHForCausalLM": "nemotron_h",
}
# fields a model type must give (no default is right for them)
_MOE = ("num_experts_per_tok", "moe_intermediate_size")
REQUIRED: dict[str, tuple[str, ...]] = {
    "qwen2_moe": ("num_experts", *_MOE, "shared_expert_intermediate_size"),
    "qwen3_moe": ("num_experts", *_MOE),
    "mixtral": ("num_local_experts", "num_experts_per_tok"),
    "deepseek_v2": ("n_routed_experts", *_MOE, "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                    "v_head_dim"),
    "deepseek_v3": ("n_routed_experts", *_MOE, "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                    "v_head_dim"),
    "gpt_oss": ("num_local_experts", "intermediate_size", "sliding_window"),
    "nemotron_h": ("hybrid_override_pattern", "mamba_num_heads", "mamba_head_dim", "ssm_state_size",
                   "n_groups", "conv_kernel"),
    "qwen3_next": ("num_experts", *_MOE, "linear_num_key_heads", "linear_key_head_dim",
                   "linear_num_value_heads", "linear_value_head_dim", "linear_conv_kernel_dim"),
}
# every field kvsim reads to size weights, KV cache or step time (planner.presets, .weights, .layers)
SIZING_FIELDS = frozenset({
    "model_type", "architectures", "hidden_size", "n_embd", "d_model", "num_hidden_layers", "n_layer",
    "num_layers", "num_attention_heads", "n_head", "num_key_value_heads", "head_dim",
    "attention_head_dim", "vocab_size", "intermediate_size", "ffn_dim", "n_inner", "torch_dtype", "dtype",
    "max_position_embeddings", "n_positions", "tie_word_embeddings", "attention_bias", "attn_output_gate",
    "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
    "n_routed_experts", "num_local_experts", "num_experts", "num_experts_per_tok", "experts_per_token",
    "moe_intermediate_size", "n_shared_experts", "shared_expert_intermediate_size", "topk_method",
    "first_k_dense_replace", "layer_types", "full_attention_interval", "sliding_window",
    "use_sliding_window", "sliding_window_pattern", "max_window_layers", "linear_num_key_heads",
    "linear_key_head_dim", "linear_num_value_heads", "linear_value_head_dim", "linear_conv_kernel_dim",
    "hybrid_override_pattern", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
    "conv_kernel", "use_conv_bias", "mamba_ssm_cache_dtype", "mamba_ssm_dtype", "quantization_config",
    "text_config", "vision_config",
})
# fields known not to change memory or time (tokenizer ids, training settings, RoPE, norms...)
OTHER_FIELDS = frozenset({
    "_name_or_path", "auto_map", "bos_token_id", "eos_token_id", "pad_token_id", "transformers_version",
    "use_cache", "initializer_range", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
    "hidden_act", "mlp_hidden_act", "mamba_hidden_act", "activation_function", "rope_theta",
    "rope_scaling", "partial_rotary_factor", "pretraining_tp", "attention_dropout", "hidden_dropout",
    "dropout", "mlp_bias", "use_bias", "mamba_proj_bias", "norm_topk_prob", "router_aux_loss_coef",
    "output_router_logits", "routed_scaling_factor", "scoring_func", "n_group", "topk_group",
    "ep_size", "moe_layer_freq", "decoder_sparse_step", "mlp_only_layers", "num_nextn_predict_layers",
    "swiglu_limit", "initial_context_length", "query_pre_attn_scalar", "final_logit_softcapping",
    "attn_logit_softcapping", "cache_implementation", "rescale_prenorm_residual", "residual_in_fp32",
    "use_mamba_kernels", "chunk_size", "expand", "time_step_min", "time_step_max", "time_step_floor",
    "time_step_limit", "num_logits_to_keep", "boi_token_index", "eoi_token_index", "image_token_index",
    "mm_tokens_per_image", "rope_local_base_freq", "do_layer_norm_before", "word_embed_proj_dim",
    "enable_bias", "prefix", "rope_parameters", "head_dim_original", "bias", "tokenizer_class",
    "torchscript", "return_dict", "is_encoder_decoder", "qkv_bias", "aux_loss_alpha", "seq_aux",
    "moe_router_enable_expert_bias", "layerdrop", "init_std", "embd_pdrop", "resid_pdrop", "attn_pdrop",
})
KNOWN_FIELDS = SIZING_FIELDS | OTHER_FIELDS
NEAR_MISS_CUTOFF = 0.88


def model_type_of(cfg: dict) -> str | None:
    """The config's model_type, or the one its ``architectures`` name; None when neither says."""
    model_type = cfg.get("model_type")
    if isinstance(model_type, str) and model_type:
        return model_type.lower()
    arch = cfg.get("architectures")
    if isinstance(arch, list) and arch and isinstance(arch[0], str):
        return ARCHITECTURES.get(arch[0])
    return None


def check_fields(cfg: dict, path: str, *, force: bool = False) -> list[str]:
    """Check ``cfg`` (the text config, text_config merged in) before it is sized.

    Returns:
        Notes for the user: the fields kvsim does not know (not read).
    Raises:
        InputError: an unknown or absent model_type (unless ``force``), a field its model type
            needs that is absent, a near miss of a field kvsim reads.
    """
    model_type = model_type_of(cfg)
    if model_type not in MODEL_TYPES and not force:
        said = f"model_type {model_type!r} is not one kvsim sizes" if model_type else \
            "no model_type (and no architectures kvsim knows)"
        raise InputError(f"{said} (known: {', '.join(sorted(MODEL_TYPES))}); --force-hf-config sizes it "
                         "as a generic decoder (Llama-like attention and MLP)", file=path, field="model_type")
    for name in cfg:
        if name in KNOWN_FIELDS:
            continue
        near = difflib.get_close_matches(name, SIZING_FIELDS, n=1, cutoff=NEAR_MISS_CUTOFF)
        if near and near[0] not in cfg:
            raise InputError(f"unknown field; did you mean {near[0]}? (kvsim would take {near[0]}'s "
                             "default and size the model wrongly)", file=path, field=name)
    for name in REQUIRED.get(model_type, ()):
        if cfg.get(name) is None:
            raise InputError(f"missing, and {MODEL_TYPES[model_type]} needs it (no default is right: "
                             "the weights or KV cache would be sized wrongly)", file=path, field=name)
    unknown = sorted(n for n in cfg if n not in KNOWN_FIELDS)
    notes = []
    if model_type not in MODEL_TYPES:
        notes.append(f"model_type {model_type!r} sized as a generic decoder (--force-hf-config)")
    if unknown:
        notes.append(f"fields kvsim does not read: {', '.join(unknown)}")
    return notes
