"""Weights as served: parameter counts by kind, and their bytes under a checkpoint's quantization.

``param_breakdown(cfg)`` counts a decoder's weights by kind from its config.json fields:

=============  =====================================================================  ==========
kind           what                                                                   quantized
=============  =====================================================================  ==========
embedding      input token embeddings (and learned positions)                         never
lm_head        output projection (0 when tied to the embeddings)                      never
attention      attention projections (q/k/v/o; MLA's down/up projections)             yes
dense_mlp      dense MLP projections and shared experts                               yes
experts        routed MoE experts                                                     yes
router         MoE router and gates                                                   never
mamba          Mamba / Gated DeltaNet input and output projections                    yes
other          norms, biases, convolutions, SSM A/D/dt, attention sinks, vision tower never
=============  =====================================================================  ==========

``weight_bytes(breakdown, fmt)`` prices them for one format (what vLLM loads):

* dtype (bf16/fp16/fp32): every weight at that size;
* ``fp8`` (DeepSeek's block fp8, vLLM ``--quantization fp8``): quantized kinds 1 B, plus one
  fp32 scale per 128 x 128 block when the checkpoint has block scales;
* ``mxfp4`` (gpt-oss): routed experts 4 bits + one 8-bit scale per 32 values (4.25 bits); the
  rest (attention, router, embeddings) stays 16-bit, as gpt-oss ships;
* ``int`` (AWQ / GPTQ, 4 or 8 bits): quantized kinds ``bits`` each + per group of
  ``group_size`` weights one fp16 scale and a ``bits``-bit zero point (GPTQ's per-column
  ``g_idx``, under 0.1 %, is left out).

Architectures: Llama / Mistral / Qwen2 / OPT / Mixtral / Qwen-MoE / DeepSeek (MLA + MoE), gpt-oss,
Gemma 3 (with its SigLIP vision tower), Qwen3-Next (Gated DeltaNet + gated attention + MoE),
Nemotron-H (Mamba2 + attention + MLP).
"""
from __future__ import annotations

from dataclasses import dataclass

KINDS = ("embedding", "lm_head", "attention", "dense_mlp", "experts", "router", "mamba", "other")
QUANTIZED = ("attention", "dense_mlp", "experts", "mamba")
WEIGHT_DTYPES = ("auto", "bfloat16", "bf16", "float16", "fp16", "float32", "fp8", "int8", "int4",
                 "mxfp4")
QUANT_METHODS = ("fp8", "mxfp4", "awq", "gptq")


@dataclass(frozen=True)
class ParamBreakdown:
    """Weights by kind (counts in ``KINDS`` order): all of them, and those one token touches
    (MoE: its top-k experts). Tuples, so that a ModelSpec holding one stays hashable.
    ``num_experts`` and ``num_experts_per_tok``: an MoE layer's routed experts and how many each
    token is routed to (0 for a dense model)."""

    total_counts: tuple[int, ...]
    active_counts: tuple[int, ...]
    num_experts: int = 0
    num_experts_per_tok: int = 0

    @classmethod
    def of(cls, total: dict[str, int], active: dict[str, int], num_experts: int = 0,
           num_experts_per_tok: int = 0) -> "ParamBreakdown":
        return cls(tuple(total[k] for k in KINDS), tuple(active[k] for k in KINDS), num_experts,
                   num_experts_per_tok)

    def experts_touched_fraction(self, num_tokens: int) -> float:
        """The expected share of an MoE layer's routed experts that a step of ``num_tokens``
        tokens touches, each token routed to num_experts_per_tok of num_experts distinct experts
        uniformly at random: ``1 - (1 - k / E) ** num_tokens`` (k / E for one token, all of them
        once the step has a few times E / k tokens). A skewed router touches fewer (real vLLM's
        gpt-oss-120b with dummy weights on the H200 decodes 32 sequences in 5.3 ms, under the
        8 ms that reading 64 % of its experts takes). 1 for a dense model."""
        if not self.num_experts:
            return 1.0
        if num_tokens <= 0:
            return 0.0
        return 1.0 - (1.0 - self.num_experts_per_tok / self.num_experts) ** num_tokens

    @property
    def total(self) -> dict[str, int]:
        return dict(zip(KINDS, self.total_counts))

    @property
    def active(self) -> dict[str, int]:
        return dict(zip(KINDS, self.active_counts))

    @property
    def num_params(self) -> int:
        return sum(self.total_counts)

    @property
    def num_active_params(self) -> int:
        return sum(self.active_counts)


@dataclass(frozen=True)
class WeightFormat:
    """How a checkpoint stores its weights.

    Args:
        method: "dtype" (no quantization), "fp8", "mxfp4" or "int" (AWQ / GPTQ).
        dtype_bytes: bytes of the weights that stay unquantized.
        block_scales: fp8 with one fp32 scale per 128 x 128 block (``weight_block_size``).
        bits, group_size: the integer formats' width and quantization group.
        source: where the format comes from (the config's quantization_config, or the flag).
    """

    method: str
    dtype_bytes: int
    block_scales: bool = False
    bits: int = 4
    group_size: int = 128
    source: str = ""

    def __post_init__(self):
        if self.method not in ("dtype", "fp8", "mxfp4", "int"):
            raise ValueError(f"unknown weight format {self.method!r}")
        if self.method == "int" and (self.bits not in (4, 8) or self.group_size < 1):
            raise ValueError(f"integer weights need 4 or 8 bits and a group size >= 1, got "
                             f"{self.bits} bits, group {self.group_size}")

    @property
    def label(self) -> str:
        return {"dtype": f"{8 * self.dtype_bytes}-bit", "fp8": "fp8",
                "mxfp4": "MXFP4 experts",
                "int": f"int{self.bits} (group {self.group_size})"}[self.method]


@dataclass(frozen=True)
class ServedWeights:
    """A model's weights as a server holds them: counts by kind and the format."""

    breakdown: ParamBreakdown
    format: WeightFormat

    @property
    def bytes(self) -> int:
        return weight_bytes(self.breakdown, self.format)

    @property
    def active_bytes(self) -> int:
        """Bytes one token reads (MoE: its experts only)."""
        return weight_bytes(self.breakdown, self.format, active=True)

    @property
    def expert_bytes(self) -> int:
        """Bytes of the routed experts alone (0 for a dense model)."""
        counts = dict.fromkeys(KINDS, 0)
        counts["experts"] = self.breakdown.total["experts"]
        return weight_bytes(ParamBreakdown.of(counts, counts), self.format)

    def step_bytes(self, num_tokens: int) -> float:
        """The bytes a step of ``num_tokens`` tokens reads: every weight but the routed experts,
        and of those the expected share its tokens touch (``experts_touched_fraction``)."""
        experts = self.expert_bytes
        return self.bytes - experts + experts * self.breakdown.experts_touched_fraction(num_tokens)


def weight_bytes(breakdown: ParamBreakdown, fmt: WeightFormat, active: bool = False) -> int:
    """Bytes of the weights in this format (all weights, or those one token reads)."""
    counts = breakdown.active if active else breakdown.total
    plain = sum(n for kind, n in counts.items()) * fmt.dtype_bytes
    if fmt.method == "dtype":
        return plain
    if fmt.method == "mxfp4":
        n = counts["experts"]
        return plain - n * fmt.dtype_bytes + (n * 17 + 31) // 32      # 4 bits + 8 bits / 32
    n = sum(counts[kind] for kind in QUANTIZED)
    rest = plain - n * fmt.dtype_bytes
    if fmt.method == "fp8":
        return rest + n + (4 * n // (128 * 128) if fmt.block_scales else 0)
    groups = -(-n // fmt.group_size)
    return rest + n * fmt.bits // 8 + groups * (16 + fmt.bits) // 8   # fp16 scale + zero


def _int(cfg: dict, *names: str, default: int = 0) -> int:
    for name in names:
        value = cfg.get(name)
        if value is not None:
            return int(value)
    return default


def param_breakdown(cfg: dict) -> ParamBreakdown:
    """Weights of a decoder by kind, from its (text) config.json fields.

    Raises:
        KeyError, TypeError, ValueError: a field the architecture needs is missing or malformed.
    """
    model_type = str(cfg.get("model_type", "")).lower()
    total = dict.fromkeys(KINDS, 0)
    active = dict.fromkeys(KINDS, 0)
    if model_type == "nemotron_h":
        _nemotron_h(cfg, total)
        active.update(total)
        return ParamBreakdown.of(total, active)
    h = int(cfg["hidden_size"])
    num_layers = int(cfg["num_hidden_layers"])
    vocab = int(cfg["vocab_size"])
    opt_like = model_type == "opt"
    gemma = model_type.startswith("gemma3")
    tied = bool(cfg.get("tie_word_embeddings", opt_like or gemma))
    norm = 2 * h if opt_like else h                  # LayerNorm has a bias, RMSNorm does not
    total["embedding"] = vocab * h + (
        (_int(cfg, "max_position_embeddings", default=2048) + 2) * h if opt_like else 0)
    total["lm_head"] = 0 if tied else vocab * h
    total["other"] = norm                           # final norm

    kinds = _layer_kinds(cfg, num_layers)
    attention, attention_other = _attention(cfg, model_type, h)
    mamba, mamba_other = _gated_delta_net(cfg, h) if "mamba" in kinds else (0, 0)
    mlp = _mlp(cfg, model_type, h, num_layers)
    per_layer_norms = (4 if gemma else 2) * norm
    for kind in kinds:
        if kind == "mamba":
            total["mamba"] += mamba
            total["other"] += mamba_other
        else:
            total["attention"] += attention
            total["other"] += attention_other
        total["other"] += per_layer_norms
    for key in ("dense_mlp", "experts", "router", "other"):
        total[key] += mlp["total"][key]
    active.update(total)
    active["experts"] = mlp["active_experts"]
    active["other"] -= mlp["inactive_other"]
    if gemma and isinstance(cfg.get("vision_config"), dict):
        vision = _siglip(cfg["vision_config"], h)
        total["other"] += vision
        active["other"] += vision
    return ParamBreakdown.of(total, active, mlp["num_experts"], mlp["num_experts_per_tok"])


def _layer_kinds(cfg: dict, num_layers: int) -> list[str]:
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == num_layers:
        return ["mamba" if t == "linear_attention" else "attention" for t in types]
    every = cfg.get("full_attention_interval")
    if every:
        return ["attention" if (i + 1) % int(every) == 0 else "mamba" for i in range(num_layers)]
    return ["attention"] * num_layers


def _attention(cfg: dict, model_type: str, h: int) -> tuple[int, int]:
    """(projection weights, other weights) of one attention layer."""
    nh = int(cfg["num_attention_heads"])
    if cfg.get("kv_lora_rank"):                     # DeepSeek MLA
        rope, nope = int(cfg["qk_rope_head_dim"]), int(cfg["qk_nope_head_dim"])
        v_dim, kv_rank = int(cfg["v_head_dim"]), int(cfg["kv_lora_rank"])
        q_rank = cfg.get("q_lora_rank")
        q = h * int(q_rank) + int(q_rank) * nh * (nope + rope) if q_rank else h * nh * (nope + rope)
        proj = q + h * (kv_rank + rope) + kv_rank * nh * (nope + v_dim) + nh * v_dim * h
        return proj, kv_rank + (int(q_rank) if q_rank else 0)      # the two latent norms
    hd = _int(cfg, "head_dim", default=h // nh)
    nkv = _int(cfg, "num_key_value_heads", default=nh)
    gated = cfg.get("attn_output_gate", model_type == "qwen3_next")  # Qwen3-Next's default
    q_out = nh * hd * (2 if gated else 1)
    proj = h * q_out + 2 * h * nkv * hd + nh * hd * h
    other = 0
    if model_type == "opt":
        other = nh * hd + 2 * nkv * hd + h
    elif model_type == "gpt_oss":
        other = nh * hd + 2 * nkv * hd + h + nh                    # biases, attention sinks
    elif cfg.get("attention_bias") or model_type.startswith("qwen2"):
        other = nh * hd + 2 * nkv * hd
    if model_type.startswith("gemma3") or model_type == "qwen3_next":
        other += 2 * hd                                            # q_norm, k_norm
    return proj, other


def _mlp(cfg: dict, model_type: str, h: int, num_layers: int) -> dict:
    """MLP weights over all layers (dense and MoE) and the experts one token touches."""
    inter = _int(cfg, "intermediate_size", "ffn_dim", default=4 * h)
    opt_like = model_type == "opt"
    dense = 2 * h * inter if opt_like else 3 * h * inter
    dense_bias = inter + h if opt_like else 0
    num_experts = _int(cfg, "n_routed_experts", "num_local_experts", "num_experts")
    out = {"total": dict.fromkeys(("dense_mlp", "experts", "router", "other"), 0),
           "active_experts": 0, "inactive_other": 0, "num_experts": 0, "num_experts_per_tok": 0}
    if not num_experts:
        out["total"]["dense_mlp"] = num_layers * dense
        out["total"]["other"] = num_layers * dense_bias
        return out
    moe_inter = _int(cfg, "moe_intermediate_size", default=inter)
    top_k = _int(cfg, "num_experts_per_tok", "experts_per_token", default=1)
    expert = 3 * h * moe_inter
    expert_bias = 0
    router_bias = 0
    shared = 0
    if model_type == "gpt_oss":
        expert_bias = 3 * moe_inter + h            # gate_up and down biases
        router_bias = num_experts
    if cfg.get("n_shared_experts"):
        shared = 3 * h * moe_inter * int(cfg["n_shared_experts"])
    elif cfg.get("shared_expert_intermediate_size"):
        shared = 3 * h * int(cfg["shared_expert_intermediate_size"])
        router_bias = h                             # the shared expert's sigmoid gate
    if str(cfg.get("topk_method", "")) == "noaux_tc":
        router_bias = num_experts                   # e_score_correction_bias
    first_dense = _int(cfg, "first_k_dense_replace")
    num_moe = num_layers - first_dense
    t = out["total"]
    t["dense_mlp"] = first_dense * dense + num_moe * shared
    t["experts"] = num_moe * num_experts * expert
    t["router"] = num_moe * (num_experts * h + router_bias)
    t["other"] = num_moe * num_experts * expert_bias
    out["active_experts"] = num_moe * top_k * expert
    if num_moe:
        out["num_experts"], out["num_experts_per_tok"] = num_experts, top_k
    out["inactive_other"] = num_moe * (num_experts - top_k) * expert_bias
    return out


def _gated_delta_net(cfg: dict, h: int) -> tuple[int, int]:
    """(projections, other) of one Qwen3-Next linear-attention layer."""
    nk, dk = int(cfg["linear_num_key_heads"]), int(cfg["linear_key_head_dim"])
    nv, dv = int(cfg["linear_num_value_heads"]), int(cfg["linear_value_head_dim"])
    conv_dim = 2 * nk * dk + nv * dv
    proj = h * (2 * nk * dk + 2 * nv * dv) + h * 2 * nv + nv * dv * h   # qkvz, ba, out
    other = conv_dim * int(cfg["linear_conv_kernel_dim"]) + 2 * nv + dv  # conv, dt_bias + A, norm
    return proj, other


def _nemotron_h(cfg: dict, total: dict) -> None:
    """Nemotron-H: Mamba2 ("M"), attention ("*") and MLP ("-") blocks, one norm each."""
    h, vocab = int(cfg["hidden_size"]), int(cfg["vocab_size"])
    total["embedding"] = vocab * h
    total["lm_head"] = 0 if cfg.get("tie_word_embeddings") else vocab * h
    heads, head_dim = int(cfg["mamba_num_heads"]), int(cfg["mamba_head_dim"])
    inner = heads * head_dim
    state, groups = int(cfg["ssm_state_size"]), int(cfg["n_groups"])
    conv_dim = inner + 2 * groups * state
    nh, nkv = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    hd = _int(cfg, "attention_head_dim", "head_dim", default=h // nh)
    inter = int(cfg["intermediate_size"])
    total["other"] = h                               # final norm
    for block in cfg["hybrid_override_pattern"]:
        total["other"] += h
        if block == "M":
            total["mamba"] += h * (2 * inner + 2 * groups * state + heads) + inner * h
            total["other"] += conv_dim * int(cfg["conv_kernel"]) + conv_dim * bool(
                cfg.get("use_conv_bias", True)) + 3 * heads + inner
        elif block == "*":
            total["attention"] += h * nh * hd + 2 * h * nkv * hd + nh * hd * h
        elif block == "-":
            total["dense_mlp"] += 2 * h * inter
        else:
            raise ValueError(f"unsupported Nemotron-H block {block!r} (MoE blocks 'E' are not "
                             "counted)")


def _siglip(vision: dict, text_hidden: int) -> int:
    """Gemma 3's SigLIP vision tower and its projector into the text model."""
    d, inter = int(vision["hidden_size"]), int(vision["intermediate_size"])
    layers, patch = int(vision["num_hidden_layers"]), int(vision["patch_size"])
    positions = (int(vision["image_size"]) // patch) ** 2
    layer = 4 * (d * d + d) + 2 * d * inter + inter + d + 4 * d     # attention, MLP, 2 LNs
    embed = 3 * patch * patch * d + d + positions * d
    return layers * layer + embed + 2 * d + d + d * text_hidden      # post LN, projector


def weight_format(cfg: dict, model_dtype_bytes: int, weight_dtype: str = "auto",
                  path: str = "", field: str = "quantization_config") -> WeightFormat:
    """The format the weights are served in: ``weight_dtype`` (vLLM's dtype / --quantization),
    or with "auto" the config's ``quantization_config`` (none: the model dtype).

    Raises:
        InputError: an unsupported quant_method or weight_dtype, malformed fields (one line).
    """
    from kvsim.errors import InputError
    from kvsim.planner.specs import dtype_bytes

    weight_dtype = str(weight_dtype).lower()
    if weight_dtype not in WEIGHT_DTYPES:
        raise InputError(f"weight dtype must be one of {', '.join(WEIGHT_DTYPES)}, got "
                         f"{weight_dtype!r}", field="weight_dtype")
    if weight_dtype != "auto":
        flag = f"--weight-dtype {weight_dtype}"
        if weight_dtype in ("fp8", "mxfp4"):
            return WeightFormat(weight_dtype, model_dtype_bytes, source=flag)
        if weight_dtype in ("int4", "int8"):
            return WeightFormat("int", model_dtype_bytes, bits=int(weight_dtype[3:]), source=flag)
        return WeightFormat("dtype", dtype_bytes(weight_dtype), source=flag)
    quant = cfg.get("quantization_config")
    if quant is None:
        return WeightFormat("dtype", model_dtype_bytes, source="torch_dtype")
    if not isinstance(quant, dict):
        raise InputError("must be an object", file=path or None, field=field)
    method = str(quant.get("quant_method", "")).lower()
    source = f"quantization_config ({method})"
    if method == "fp8":
        return WeightFormat("fp8", model_dtype_bytes, bool(quant.get("weight_block_size")),
                            source=source)
    if method == "mxfp4":
        return WeightFormat("mxfp4", model_dtype_bytes, source=source)
    if method in ("awq", "gptq"):
        bits, group = quant.get("bits", quant.get("w_bit")), quant.get(
            "group_size", quant.get("q_group_size", 128))
        if bits not in (4, 8) or not isinstance(group, int) or (group < 1 and group != -1):
            raise InputError(f"{method}: supported are 4 or 8 bits and a group size >= 1, got "
                             f"bits={bits!r} group_size={group!r}", file=path or None, field=field)
        # group_size -1 (GPTQ): one scale per output channel, about one group per row
        return WeightFormat("int", model_dtype_bytes, bits=bits,
                            group_size=group if group > 0 else 4096, source=source)
    raise InputError(f"unsupported quant_method {method!r} (supported: "
                     f"{', '.join(QUANT_METHODS)}; or pass --weight-dtype)", file=path or None,
                     field=field)


def serve_weights_as(model, weight_dtype: str):
    """The model with its weights served as ``weight_dtype`` (``--weight-dtype``; "auto":
    unchanged: the checkpoint's quantization_config, else its dtype).

    Raises:
        InputError: an unknown dtype, or a model without weights by kind (a bare ModelSpec).
    """
    from dataclasses import replace

    from kvsim.errors import InputError

    if weight_dtype == "auto":
        return model
    fmt = weight_format({}, model.dtype_bytes, weight_dtype)
    if model.weights is None:
        raise InputError(f"{model.name}: no weights by kind to serve as {weight_dtype} (load it "
                         "with load_hf_config)", field="weight_dtype")
    return replace(model, weights=ServedWeights(model.weights.breakdown, fmt))
