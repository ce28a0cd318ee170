"""The shape of a dense decoder (Llama, Mistral, Qwen2/2.5, Qwen3) and random weights of that shape.

The step executor (``kernels.executor``) and its plain-torch reference (``kernels.dense_decoder``)
run the same weights. Timing depends on shapes, not on values, so the weights are random (nothing is
downloaded); the values are scaled so that activations stay O(1) through the layers and the
reference comparison means something.

``DecoderShape`` is plain data: the CLI builds it from a preset or from a Hugging Face
``config.json`` dict (``DecoderShape.from_hf_config``); kernels/ never imports planner/.

Weight layout (vLLM's: ``F.linear`` weights are ``[out_features, in_features]``; QKV and gate/up
fused so each is one GEMM)::

    embed     [vocab, hidden]                  lm_head [vocab, hidden] (= embed when tied)
    per layer input_norm [hidden]   qkv [(nq + 2 nkv) * head_dim, hidden]  (+ qkv_bias, Qwen2)
              q_norm, k_norm [head_dim] (Qwen3)   o [hidden, nq * head_dim]
              post_norm [hidden]    gate_up [2 * intermediate, hidden]    down [hidden, intermediate]
    final_norm [hidden]
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
_MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


@dataclass(frozen=True)
class DecoderShape:
    """Layer shapes of a dense decoder-only transformer (tensor parallel 1).

    family: "llama" | "mistral" | "qwen2" | "qwen3" (Qwen2 has q/k/v biases, Qwen3 per-head q/k
        RMSNorm; Mistral may have a sliding window).
    rope_scaling: the config's dict ("llama3" and "linear" are applied; other types run plain RoPE,
        which costs the same: timing does not see the frequencies).
    sliding_window: tokens each query attends back (None = full attention).
    """

    family: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, compare=False)
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    name: str = ""

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2 or self.head_dim > 256:
            raise ValueError(f"head_dim must be even and at most 256 (RoPE rotates pairs; the attention "
                             f"kernels' limit), got {self.head_dim}")
        if not (self.rms_norm_eps > 0 and self.rope_theta > 0):
            raise ValueError(f"rms_norm_eps and rope_theta must be > 0, got {self.rms_norm_eps} and "
                             f"{self.rope_theta}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {self.sliding_window}")

    @property
    def qkv_size(self) -> int:
        """Output width of the fused QKV projection."""
        return (self.num_attention_heads + 2 * self.num_kv_heads) * self.head_dim

    @property
    def num_params(self) -> int:
        """Weights of the model (the same count as ``planner.presets.estimate_num_params``)."""
        h, i, hd = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * self.qkv_size + self.num_attention_heads * hd * h
        if self.qkv_bias:
            attn += self.qkv_size
        if self.qk_norm:
            attn += 2 * hd
        layer = attn + 3 * h * i + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + embed + h

    def weight_bytes(self, dtype: torch.dtype) -> int:
        return self.num_params * _elem_bytes(dtype)

    def step_weight_bytes(self, dtype: torch.dtype) -> int:
        """Weight bytes one step reads: all but the embedding table, of which only the scheduled
        tokens' rows are read (with tied embeddings the table is the LM head, read in full)."""
        unread = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return (self.num_params - unread) * _elem_bytes(dtype)

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """K and V of one token over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * _elem_bytes(dtype)

    @classmethod
    def from_hf_config(cls, cfg: dict, name: str = "") -> "DecoderShape":
        """The shape of a Hugging Face ``config.json`` (already parsed; ``text_config`` unwrapped).

        Args:
            cfg: the config dict; ``model_type`` picks the family (llama, mistral, qwen2, qwen3).
            name: a label kept in the shape.
        Raises:
            ValueError: another architecture (MoE, MLA, OPT, ...) or a malformed field; the message
                names the field.
        """
        if isinstance(cfg.get("text_config"), dict):
            cfg = {**{k: v for k, v in cfg.items() if k != "text_config"}, **cfg["text_config"]}
        model_type = str(cfg.get("model_type", "")).lower()
        if model_type not in FAMILIES:
            raise ValueError(f"model_type: {model_type or 'missing'!r} is not a dense decoder the executor "
                             f"runs ({', '.join(FAMILIES)})")
        for key in _MOE_FIELDS:
            if cfg.get(key):
                raise ValueError(f"{key}: mixture-of-experts layers are not supported by the executor")

        def need(key, default=None):
            value = cfg.get(key, default)
            if value is None:
                raise ValueError(f"{key}: missing required field")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}: must be a positive integer, got {value!r}")
            return value

        heads = need("num_attention_heads")
        hidden = need("hidden_size")
        head_dim = cfg.get("head_dim") or None
        if head_dim is None:
            if hidden % heads:
                raise ValueError(f"head_dim: absent and hidden_size ({hidden}) is not a multiple of "
                                 f"num_attention_heads ({heads})")
            head_dim = hidden // heads
        window = cfg.get("sliding_window")
        if model_type in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
            window = None  # Qwen configs carry a window that is off unless use_sliding_window
        try:
            return cls(family=model_type, num_layers=need("num_hidden_layers"), hidden_size=hidden,
                       num_attention_heads=heads, num_kv_heads=need("num_key_value_heads", heads),
                       head_dim=int(head_dim), intermediate_size=need("intermediate_size"),
                       vocab_size=need("vocab_size"),
                       rms_norm_eps=float(cfg.get("rms_norm_eps") or 1e-5),
                       rope_theta=float(cfg.get("rope_theta") or 10000.0),
                       rope_scaling=cfg.get("rope_scaling") or None,
                       qkv_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
                       qk_norm=model_type == "qwen3",
                       sliding_window=int(window) if window else None,
                       tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)), name=name)
        except (TypeError, ValueError) as err:
            raise ValueError(str(err)) from None

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _elem_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@dataclass
class DecoderWeights:
    """All weights of a DecoderShape (layout in the module docstring)."""
    embed: torch.Tensor
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor

    def to(self, dtype: torch.dtype | None = None, device=None) -> "DecoderWeights":
        """A converted copy (e.g. float64 on the CPU for the reference)."""
        def cv(t):
            return None if t is None else t.to(device=device or t.device, dtype=dtype or t.dtype)
        layers = [LayerWeights(**{k: cv(getattr(lw, k)) for k in LayerWeights.__dataclass_fields__})
                  for lw in self.layers]
        embed = cv(self.embed)
        lm_head = embed if self.lm_head is self.embed else cv(self.lm_head)
        return DecoderWeights(embed, layers, cv(self.final_norm), lm_head)


def random_weights(shape: DecoderShape, dtype: torch.dtype = torch.bfloat16, device="cpu",
                   seed: int = 0) -> DecoderWeights:
    """Random weights of ``shape``: projections ~ N(0, 1/fan_in) (activations stay O(1)), norm
    weights ~ 1 + N(0, 0.1^2), embeddings ~ N(0, 1). Deterministic for a seed and device.

    Args:
        shape: the model.
        dtype, device: where the weights live (bf16 on the GPU for timing, fp32/fp64 for tests).
        seed: generator seed.
    """
    gen = torch.Generator(device=device).manual_seed(seed)

    def mat(rows, cols):
        t = torch.empty(rows, cols, dtype=dtype, device=device)
        return t.normal_(0.0, 1.0 / math.sqrt(cols), generator=gen)

    def vec(n, mean=1.0, std=0.1):
        return torch.empty(n, dtype=dtype, device=device).normal_(mean, std, generator=gen)

    h, hd = shape.hidden_size, shape.head_dim
    layers = []
    for _ in range(shape.num_layers):
        layers.append(LayerWeights(
            input_norm=vec(h), qkv=mat(shape.qkv_size, h),
            qkv_bias=vec(shape.qkv_size, 0.0, 0.02) if shape.qkv_bias else None,
            q_norm=vec(hd) if shape.qk_norm else None, k_norm=vec(hd) if shape.qk_norm else None,
            o=mat(h, shape.num_attention_heads * hd), post_norm=vec(h),
            gate_up=mat(2 * shape.intermediate_size, h), down=mat(h, shape.intermediate_size)))
    embed = torch.empty(shape.vocab_size, h, dtype=dtype, device=device).normal_(0.0, 1.0, generator=gen)
    lm_head = embed if shape.tie_word_embeddings else mat(shape.vocab_size, h)
    return DecoderWeights(embed, layers, vec(h), lm_head)
