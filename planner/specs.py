"""Model and GPU specifications: the numbers capacity math and the roofline cost model need.

Both are frozen dataclasses that validate in ``__post_init__``; a bad value (a user's config.json
or custom GPU flags) raises ``InputError`` with the number in the message (the CLI turns it into
one line and exit code 2).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from kvsim.errors import InputError

GIB = 2**30

# bytes per element; names as they appear in config.json (torch_dtype) and in vLLM's --kv-cache-dtype
DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "fp32": 4, "float": 4,
    "float16": 2, "fp16": 2, "half": 2,
    "bfloat16": 2, "bf16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "int8": 1,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name.

    Args:
        dtype: e.g. "bfloat16", "fp16", "fp8" (case-insensitive).
    Returns:
        Bytes per element.
    Raises:
        InputError: unknown name (the message lists the known ones).
    """
    try:
        return DTYPE_BYTES[str(dtype).lower()]
    except KeyError:
        raise InputError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}") from None


def _require_positive(owner: str, **values) -> None:
    for name, value in values.items():
        if value is None or value <= 0:
            raise InputError(f"{owner}: {name} must be > 0, got {value}")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer as far as KV memory and step cost are concerned.

    MLA models (DeepSeek-V2/V3) set ``kv_lora_rank`` and ``qk_rope_head_dim``: vLLM caches one
    latent vector of kv_lora_rank + qk_rope_head_dim elements per token and layer (no separate K
    and V, so no factor 2) and does not split it across tensor-parallel ranks.
    """

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int                       # K/V head size (MLA: v_head_dim, used for attention FLOPs)
    hidden_size: int
    intermediate_size: int              # dense MLP width (MoE: width of the dense layers)
    vocab_size: int
    num_params: int                     # all weights (what must sit in GPU memory)
    dtype: str = "bfloat16"             # weight/activation dtype (config.json torch_dtype)
    num_active_params: int | None = None  # MoE: weights touched per token; None = num_params
    kv_lora_rank: int | None = None     # MLA latent width
    qk_rope_head_dim: int | None = None  # MLA decoupled RoPE key width (cached with the latent)
    qk_head_dim: int | None = None      # query/key width per head if != head_dim (MLA: nope + rope)
    max_position_embeddings: int | None = None
    source: str = ""                    # where the numbers come from
    # per-layer KV-cache shapes (planner.layers: AttentionLayer / MambaLayer / None for an MLP
    # layer); None: every layer is full attention (num_kv_heads x head_dim, or MLA's latent)
    layers: tuple | None = None
    # the weights as served (planner.weights.ServedWeights: counts by kind and the checkpoint's
    # quantization); None: num_params at ``dtype``
    weights: object | None = None
    # a config.json's fields absent (the default taken) and not read (presets.load_hf_config)
    config_notes: tuple[str, ...] = ()

    def __post_init__(self):
        who = f"model {self.name!r}"
        _require_positive(who, num_layers=self.num_layers, num_attention_heads=self.num_attention_heads,
                          num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                          hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                          vocab_size=self.vocab_size, num_params=self.num_params)
        dtype_bytes(self.dtype)
        if self.num_kv_heads > self.num_attention_heads:
            raise InputError(f"{who}: num_kv_heads ({self.num_kv_heads}) exceeds num_attention_heads "
                             f"({self.num_attention_heads})")
        if self.num_attention_heads % self.num_kv_heads:
            raise InputError(f"{who}: num_attention_heads ({self.num_attention_heads}) is not a multiple "
                             f"of num_kv_heads ({self.num_kv_heads})")
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise InputError(f"{who}: MLA needs both kv_lora_rank and qk_rope_head_dim, got "
                             f"{self.kv_lora_rank} and {self.qk_rope_head_dim}")
        if self.is_mla:
            _require_positive(who, kv_lora_rank=self.kv_lora_rank, qk_rope_head_dim=self.qk_rope_head_dim)
        if self.num_active_params is not None and not 0 < self.num_active_params <= self.num_params:
            raise InputError(f"{who}: num_active_params must be in (0, num_params={self.num_params}], "
                             f"got {self.num_active_params}")
        if self.max_position_embeddings is not None:
            _require_positive(who, max_position_embeddings=self.max_position_embeddings)
        if self.layers is not None and len(self.layers) != self.num_layers:
            raise ValueError(f"{who}: {len(self.layers)} layer shapes for num_layers "
                             f"{self.num_layers}")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights as served (one copy, before tensor parallelism): the checkpoint's
        quantization when known (``weights``), else every parameter at the model's dtype."""
        if self.weights is not None:
            return self.weights.bytes
        return self.num_params * self.dtype_bytes

    @property
    def is_hybrid(self) -> bool:
        """Layers of more than one KV-cache kind (sliding windows, Mamba state, full)."""
        return self.layers is not None and len({getattr(x, "kind", None) for x in self.layers
                                                if x is not None}) > 1

    @property
    def num_attention_layers(self) -> int:
        """Layers that attend over cached tokens (all of them without per-layer shapes)."""
        if self.layers is None:
            return self.num_layers
        return sum(1 for x in self.layers if x is not None and x.kind != "mamba")

    @property
    def active_params(self) -> int:
        return self.num_active_params if self.num_active_params is not None else self.num_params

    @property
    def attn_flops_per_token_pair(self) -> int:
        """FLOPs of one (query token, context token) pair over all layers: QK^T and PV, 2 each.

        Dense heads: 2*h*d (scores) + 2*h*d (weighted sum) = 4*h*d per layer.
        """
        qk = self.qk_head_dim if self.qk_head_dim is not None else self.head_dim
        return 2 * self.num_attention_layers * self.num_attention_heads * (qk + self.head_dim)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator.

    ``memory_bytes`` is the total the driver reports (``torch.cuda.mem_get_info()[1]``), which is
    what vLLM multiplies by gpu_memory_utilization; it is a little below the datasheet figure.
    Peaks are dense (no 2:4 sparsity) tensor-core FLOP/s.
    """

    name: str
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    bf16_flops_per_s: float
    fp8_flops_per_s: float | None = None  # None: no FP8 tensor cores (A100)
    datasheet_memory_gb: float | None = None
    price_rank: int = 1                  # ordinal cost of one GPU (1 = cheapest); see presets.py
    source: str = ""

    def __post_init__(self):
        who = f"GPU {self.name!r}"
        _require_positive(who, memory_bytes=self.memory_bytes,
                          memory_bandwidth_bytes_per_s=self.memory_bandwidth_bytes_per_s,
                          bf16_flops_per_s=self.bf16_flops_per_s, price_rank=self.price_rank)
        if self.fp8_flops_per_s is not None:
            _require_positive(who, fp8_flops_per_s=self.fp8_flops_per_s)

    def peak_flops_per_s(self, dtype: str) -> float:
        """Dense peak for a compute dtype: FP8 peak for 1-byte dtypes where the GPU has one."""
        if dtype_bytes(dtype) == 1 and self.fp8_flops_per_s is not None:
            return self.fp8_flops_per_s
        return self.bf16_flops_per_s

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    def to_dict(self) -> dict:
        return asdict(self)
