"""Per-layer KV-cache shapes of a model: which layers keep what, read from an HF config.json.

A layer keeps one of:

=====================  ========================================================================
full_attention         K and V of every token (num_kv_heads x head_dim each)
sliding_window         K and V of the last ``sliding_window`` tokens only
mla                    one latent of ``kv_lora_rank + qk_rope_head_dim`` per token (DeepSeek)
mamba                  a fixed-size state per request: Mamba2's conv + SSM state, or Gated
                       DeltaNet's (Qwen3-Next's "linear_attention")
(none)                 an MLP-only layer (Nemotron-H's "-" and "E")
=====================  ========================================================================

The shapes are per model; ``kvsim.planner.kv_groups`` turns them into vLLM's per-rank
KV-cache specs (tensor parallelism, dtypes, block sizes) and groups.

Where the config says it:

* ``layer_types`` (gpt-oss, Gemma 3 in recent transformers, Qwen3-Next): "full_attention",
  "sliding_attention", "linear_attention";
* ``sliding_window_pattern`` (Gemma 3): every n-th layer is full, the others sliding;
* ``full_attention_interval`` (Qwen3-Next): every n-th layer is full, the others linear;
* ``hybrid_override_pattern`` (Nemotron-H): "M" Mamba2, "*" attention, "-" MLP, "E" MoE;
* ``kv_lora_rank`` (DeepSeek V2/V3): every layer is MLA.

Anything else is uniform full attention; an unknown layer type is an InputError.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvsim.errors import InputError

ATTENTION_KINDS = ("full_attention", "sliding_window", "mla")
LAYER_TYPE_KINDS = {"full_attention": "full_attention", "sliding_attention": "sliding_window",
                    "linear_attention": "mamba"}
NEMOTRON_PATTERN = {"M": "mamba", "*": "full_attention", "-": None, "E": None}


@dataclass(frozen=True)
class AttentionLayer:
    """An attention layer's cache per token (before tensor parallelism).

    MLA caches one latent per token for all heads: ``num_kv_heads`` is 1, ``head_size`` is
    ``kv_lora_rank + qk_rope_head_dim`` and ``head_size_v`` 0 (no separate V).
    """

    kind: str
    num_kv_heads: int
    head_size: int
    head_size_v: int
    sliding_window: int | None = None

    def __post_init__(self):
        if self.kind not in ATTENTION_KINDS:
            raise ValueError(f"attention kind must be one of {ATTENTION_KINDS}, got {self.kind!r}")
        if (self.kind == "sliding_window") != (self.sliding_window is not None):
            raise ValueError(f"sliding_window goes with sliding_window layers only, got "
                             f"{self.kind!r} and {self.sliding_window}")
        for name in ("num_kv_heads", "head_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class MambaLayer:
    """A state-space (Mamba2) or linear-attention (Gated DeltaNet) layer's per-request state.

    ``variant`` "mamba2": conv state ``(conv_kernel - 1, (num_heads * head_dim + 2 * n_groups *
    state_size) / tp)``, SSM state ``(num_heads / tp, head_dim, state_size)``.
    ``variant`` "gated_delta_net": conv state ``(conv_kernel - 1, (2 * num_k_heads * head_k_dim +
    num_v_heads * head_v_dim) / tp)``, recurrent state ``(num_v_heads / tp, head_v_dim,
    head_k_dim)``. Same formulas as vLLM's ``MambaStateShapeCalculator``.
    """

    variant: str
    conv_kernel: int
    num_heads: int                  # mamba2: heads; gated_delta_net: value heads
    head_dim: int                   # mamba2: head dim; gated_delta_net: value head dim
    state_size: int = 0             # mamba2: SSM state size
    n_groups: int = 0               # mamba2: B/C groups
    num_k_heads: int = 0            # gated_delta_net: key heads
    head_k_dim: int = 0             # gated_delta_net: key head dim
    ssm_dtype: str = "auto"         # "auto": the conv dtype (the model's); Nemotron-H: float32

    kind = "mamba"

    def __post_init__(self):
        if self.variant not in ("mamba2", "gated_delta_net"):
            raise ValueError(f"mamba variant must be mamba2 or gated_delta_net, got "
                             f"{self.variant!r}")

    def state_shapes(self, tp: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv state shape, SSM / recurrent state shape) on one tensor-parallel rank."""
        if self.variant == "mamba2":
            groups = self.n_groups + (0 if self.n_groups % tp == 0 else tp - self.n_groups)
            conv_dim = self.num_heads * self.head_dim + 2 * groups * self.state_size
            return ((self.conv_kernel - 1, _divide(conv_dim, tp, "mamba conv dim")),
                    (_divide(self.num_heads, tp, "mamba_num_heads"), self.head_dim,
                     self.state_size))
        conv_dim = 2 * self.num_k_heads * self.head_k_dim + self.num_heads * self.head_dim
        return ((self.conv_kernel - 1, _divide(conv_dim, tp, "linear attention conv dim")),
                (_divide(self.num_heads, tp, "linear_num_value_heads"), self.head_dim,
                 self.head_k_dim))


def _divide(value: int, tp: int, what: str) -> int:
    if value % tp:
        raise ValueError(f"{what} ({value}) must be divisible by tp ({tp})")
    return value // tp


Layer = AttentionLayer | MambaLayer | None


def _int(cfg: dict, name: str, path: str, default: int | None = None) -> int:
    value = cfg.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        if value is None:
            raise InputError("missing required field", file=path, field=name)
        raise InputError(f"must be a positive integer, got {value!r}", file=path, field=name)
    return value


def parse_layers(cfg: dict, path: str, num_layers: int, num_kv_heads: int,
                 head_dim: int) -> tuple[Layer, ...] | None:
    """The per-layer KV-cache shapes a config describes, or None for uniform full attention
    (the model's num_kv_heads x head_dim in every layer).

    Args:
        cfg: the (text) config dict; ``path`` names it in errors.
        num_layers, num_kv_heads, head_dim: already read from the config.
    Raises:
        InputError: an unsupported layer type, or a missing or malformed field (one line).
    """
    if cfg.get("kv_lora_rank"):
        latent = _int(cfg, "kv_lora_rank", path) + _int(cfg, "qk_rope_head_dim", path)
        return (AttentionLayer("mla", 1, latent, 0),) * num_layers
    kinds = _layer_kinds(cfg, path, num_layers)
    if kinds is None:
        return None
    window = None
    if "sliding_window" in kinds:
        window = _int(cfg, "sliding_window", path)
    full = AttentionLayer("full_attention", num_kv_heads, head_dim, head_dim)
    sliding = AttentionLayer("sliding_window", num_kv_heads, head_dim, head_dim, window) \
        if window else None
    mamba = _mamba_layer(cfg, path) if "mamba" in kinds else None
    by_kind = {"full_attention": full, "sliding_window": sliding, "mamba": mamba, None: None}
    return tuple(by_kind[k] for k in kinds)


def _layer_kinds(cfg: dict, path: str, num_layers: int) -> list[str | None] | None:
    model_type = str(cfg.get("model_type", "")).lower()
    if "hybrid_override_pattern" in cfg:
        pattern = cfg["hybrid_override_pattern"]
        if not isinstance(pattern, str) or len(pattern) != num_layers:
            raise InputError(f"must be a string of num_hidden_layers ({num_layers}) characters, "
                             f"got {pattern!r}", file=path, field="hybrid_override_pattern")
        bad = sorted(set(pattern) - set(NEMOTRON_PATTERN))
        if bad:
            raise InputError(f"unsupported layer type {bad[0]!r} (supported: "
                             f"{', '.join(repr(c) for c in NEMOTRON_PATTERN)})", file=path,
                             field="hybrid_override_pattern")
        return [NEMOTRON_PATTERN[c] for c in pattern]
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers:
            raise InputError(f"must be a list of num_hidden_layers ({num_layers}) layer types",
                             file=path, field="layer_types")
        for i, t in enumerate(types):
            if t not in LAYER_TYPE_KINDS:
                raise InputError(f"unsupported layer type {t!r} at layer {i} (supported: "
                                 f"{', '.join(LAYER_TYPE_KINDS)})", file=path,
                                 field="layer_types")
        kinds = [LAYER_TYPE_KINDS[t] for t in types]
        return None if set(kinds) == {"full_attention"} else kinds
    if model_type.startswith("gemma3") and cfg.get("sliding_window"):
        every = _int(cfg, "sliding_window_pattern", path, default=6)
        return ["full_attention" if (i + 1) % every == 0 else "sliding_window"
                for i in range(num_layers)]
    if model_type.startswith("qwen3_next") or "full_attention_interval" in cfg:
        every = _int(cfg, "full_attention_interval", path)
        return ["full_attention" if (i + 1) % every == 0 else "mamba" for i in range(num_layers)]
    return None


# MambaLayer field -> config field, per variant
_MAMBA_FIELDS = {
    "mamba2": {"conv_kernel": "conv_kernel", "num_heads": "mamba_num_heads",        # Nemotron-H
               "head_dim": "mamba_head_dim", "state_size": "ssm_state_size",
               "n_groups": "n_groups"},
    "gated_delta_net": {"conv_kernel": "linear_conv_kernel_dim",                     # Qwen3-Next
                        "num_heads": "linear_num_value_heads",
                        "head_dim": "linear_value_head_dim",
                        "num_k_heads": "linear_num_key_heads",
                        "head_k_dim": "linear_key_head_dim"},
}


def _mamba_layer(cfg: dict, path: str) -> MambaLayer:
    variant = "mamba2" if "hybrid_override_pattern" in cfg else "gated_delta_net"
    fields = {name: _int(cfg, key, path) for name, key in _MAMBA_FIELDS[variant].items()}
    # vLLM's NemotronHForCausalLMConfig keeps the SSM state in float32 unless the config says
    ssm_dtype = str(cfg.get("mamba_ssm_cache_dtype", "float32")) if variant == "mamba2" \
        else str(cfg.get("mamba_ssm_dtype", "auto"))
    return MambaLayer(variant, ssm_dtype=ssm_dtype, **fields)
