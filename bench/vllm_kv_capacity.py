"""vLLM 0.33's own KV-cache planning for a model, on CPU: the reference for kvsim's capacity.

Runs under an interpreter with vLLM (the oracle venv): reads cases as JSON on stdin, prints one
JSON result per case on stdout. A case names an HF config.json, tp, the KV memory per GPU (what
kvsim computes), block size, kv dtype, max_model_len, max_num_batched_tokens, max_num_seqs and
prefix caching::

    echo '[{"config": "planner/hf_configs/gpt-oss-120b/config.json", "tp": 1,
            "available_kv_bytes": 60000000000, "max_model_len": 8192}]' |
        ../oracle-venv/bin/python bench/vllm_kv_capacity.py

What is vLLM's own code: ModelConfig (KV heads and head size per rank, MLA detection),
MambaModelConfig / NemotronHForCausalLMConfig (Mamba cache mode, block size, SSM dtype),
MambaStateShapeCalculator / MambaStateDtypeCalculator (state shapes and dtypes),
Platform._preferred_block_size_for_backends and _align_hybrid_block_size (block sizes),
the KV-cache spec classes and get_global_kv_cache_groups / get_kv_cache_configs /
generate_scheduler_kv_cache_config / get_kv_cache_capacity (groups, num_gpu_blocks,
concurrency). What stands in for the GPU and the model files (which need CUDA kernels):
a dummy architecture for ModelConfig (the config's own numbers, without quantization_config,
which does not change the KV cache); the attention backends of an H100/H200 (FlashAttention:
blocks in multiples of 16; FlashMLA: 64; FlashInfer's Gated DeltaNet prefill: checkpoints on
a 64-token grid); and which layer is which kind, read off the config as each model file does
(gpt_oss.py: even layers slide; gemma3.py: layer_types; qwen3_next.py: layer_types;
nemotron_h.py: hybrid_override_pattern).
"""
from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path

# bench/ holds a kernels.py, and vLLM imports Hugging Face's ``kernels``: keep bench/ off the path
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)
for _key, _value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                     "VLLM_NO_USAGE_STATS": "1", "VLLM_LOGGING_LEVEL": "ERROR"}.items():
    os.environ.setdefault(_key, _value)
logging.getLogger("vllm").setLevel("ERROR")

from torch import nn  # noqa: E402
from vllm import ModelRegistry  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, ParallelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig)
from vllm.model_executor.layers.mamba import abstract as mamba_abstract  # noqa: E402
from vllm.model_executor.layers.mamba.mamba_utils import (  # noqa: E402
    MambaStateDtypeCalculator, MambaStateShapeCalculator)
from vllm.platforms import current_platform  # noqa: E402
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE  # noqa: E402
from vllm.v1.attention.backend import AttentionBackend, MultipleOf  # noqa: E402
from vllm.v1.core.kv_cache_planning import (get_global_kv_cache_groups,  # noqa: E402
                                            get_kv_cache_configs, _pool_bytes_per_block)
from vllm.v1.core.kv_cache_utils import (generate_scheduler_kv_cache_config,  # noqa: E402
                                         get_kv_cache_capacity)
from vllm.v1.kv_cache_interface import (FullAttentionSpec, MambaSpec,  # noqa: E402
                                        MLAAttentionSpec, SlidingWindowSpec,
                                        get_kv_cache_spec_kind, get_kv_quant_mode)

DUMMY = "KvsimCapacityDummyForCausalLM"


class _Dummy(nn.Module):
    """Never instantiated: vLLM's registry only inspects it."""

    def __init__(self, *, vllm_config=None, prefix: str = ""):
        super().__init__()

    def embed_input_ids(self, input_ids):
        raise NotImplementedError

    def forward(self, input_ids, positions, **kwargs):
        raise NotImplementedError

    def compute_logits(self, hidden_states):
        raise NotImplementedError


_Dummy.__name__ = DUMMY
ModelRegistry.register_model(DUMMY, _Dummy)


def _backend(name: str, kernel_block: int, mla: bool = False) -> type[AttentionBackend]:
    """An attention backend as vLLM's block-size rules see it on an H100/H200."""
    sizes = [MultipleOf(kernel_block)] if not mla else [kernel_block]

    class Backend(AttentionBackend):
        @staticmethod
        def get_name() -> str:
            return name

        @staticmethod
        def get_impl_cls():
            raise NotImplementedError

        @staticmethod
        def get_builder_cls():
            raise NotImplementedError

        @classmethod
        def get_supported_kernel_block_sizes(cls, kv_cache_spec=None):
            return sizes

        @classmethod
        def is_mla(cls) -> bool:
            return mla

    return Backend


FLASH_ATTN = _backend("FLASH_ATTN", 16)
FLASHMLA = _backend("FLASHMLA", 64, mla=True)
GDN_CHECKPOINT_ALIGNMENT = 64      # FlashInfer GDN prefill on SM90 (FLASHINFER_GDN_...)


def layer_kinds(hf) -> list[str | None]:
    """Each layer's kind, read off the config the way the model file reads it."""
    n = hf.num_hidden_layers
    if getattr(hf, "kv_lora_rank", None):
        return ["mla"] * n
    if hasattr(hf, "hybrid_override_pattern"):                  # nemotron_h.py
        kinds = {"M": "mamba", "*": "full_attention", "-": None, "E": None}
        return [kinds[c] for c in hf.hybrid_override_pattern]
    if getattr(hf, "model_type", "") == "gpt_oss":              # gpt_oss.py: layer_idx % 2
        return ["sliding_window" if i % 2 == 0 else "full_attention" for i in range(n)]
    types = getattr(hf, "layer_types", None)
    if types:                                                    # gemma3.py, qwen3_next.py
        return [{"sliding_attention": "sliding_window", "full_attention": "full_attention",
                 "linear_attention": "mamba"}[t] for t in types]
    return ["full_attention"] * n


def mamba_shape_and_dtype(vllm_config: VllmConfig) -> tuple[tuple, tuple, bool]:
    """(shapes, dtypes, is_mamba2) as the model class computes them."""
    hf = vllm_config.model_config.hf_text_config
    tp = vllm_config.parallel_config.tensor_parallel_size
    cache = vllm_config.cache_config
    dtype = vllm_config.model_config.dtype
    if hasattr(hf, "hybrid_override_pattern"):                   # NemotronH classmethods
        shapes = MambaStateShapeCalculator.mamba2_state_shape(
            intermediate_size=hf.mamba_num_heads * hf.mamba_head_dim, tp_world_size=tp,
            n_groups=hf.n_groups, num_heads=hf.mamba_num_heads, head_dim=hf.mamba_head_dim,
            state_size=hf.ssm_state_size, conv_kernel=hf.conv_kernel, num_spec=0)
        dtypes = MambaStateDtypeCalculator.mamba2_state_dtype(
            dtype, cache.mamba_cache_dtype, cache.mamba_ssm_cache_dtype)
        return shapes, dtypes, True
    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(      # Qwen3Next
        tp, hf.linear_num_key_heads, hf.linear_num_value_heads, hf.linear_key_head_dim,
        hf.linear_value_head_dim, hf.linear_conv_kernel_dim, 0)
    dtypes = MambaStateDtypeCalculator.gated_delta_net_state_dtype(
        dtype, cache.mamba_cache_dtype, cache.mamba_ssm_cache_dtype)
    return shapes, dtypes, False


def build_config(case: dict, work: Path) -> tuple[VllmConfig, list]:
    raw = json.loads(Path(case["config"]).read_text())
    real_arch = (raw.get("architectures") or [""])[0]
    raw["architectures"] = [DUMMY]
    for key in ("auto_map", "quantization_config"):
        raw.pop(key, None)
    model_dir = work / Path(case["config"]).parent.name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(raw))
    model_config = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="auto",
                               max_model_len=case["max_model_len"])
    block_size = case.get("block_size")
    cache_config = CacheConfig(block_size=block_size, cache_dtype=case.get("kv_cache_dtype", "auto"),
                               enable_prefix_caching=case.get("prefix_caching", True))
    vllm_config = VllmConfig(
        model_config=model_config, cache_config=cache_config,
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=case.get("max_num_batched_tokens", 8192),
            max_num_seqs=case.get("max_num_seqs", 1024), max_model_len=case["max_model_len"],
            is_encoder_decoder=False, enable_chunked_prefill=True),
        parallel_config=ParallelConfig(), device_config=DeviceConfig(device="cpu"))
    # a GPU engine: the hybrid KV-cache manager (off only on request), async scheduling (2
    # batches in flight), tp ranks, FlashAttention's layout
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = case.get(
        "disable_hybrid_kv_cache_manager", False)
    vllm_config.scheduler_config.async_scheduling = case.get("async_scheduling", True)
    vllm_config.parallel_config.tensor_parallel_size = case.get("tp", 1)
    vllm_config.cache_config.kv_cache_layout = "LBNHC"
    cache_config.user_specified_block_size = block_size is not None
    kinds = layer_kinds(model_config.hf_text_config)
    mla = "mla" in kinds
    has_mamba = "mamba" in kinds
    if has_mamba:
        from vllm.model_executor.models.config import MODELS_CONFIG_MAP, MambaModelConfig
        MambaModelConfig.verify_and_update_config(vllm_config)
        if real_arch in MODELS_CONFIG_MAP:
            MODELS_CONFIG_MAP[real_arch].verify_and_update_config(vllm_config)
    backend = FLASHMLA if mla else FLASH_ATTN
    if not cache_config.user_specified_block_size:
        cache_config.block_size = current_platform._preferred_block_size_for_backends(
            [backend], CacheConfig.DEFAULT_BLOCK_SIZE, vllm_config)
    if has_mamba:
        _align_hybrid(vllm_config, backend)
    return vllm_config, kinds


def _align_hybrid(vllm_config: VllmConfig, backend) -> None:
    """vLLM's Platform._align_hybrid_block_size with the model class and layers standing in."""
    shapes, dtypes, is_mamba2 = mamba_shape_and_dtype(vllm_config)
    align = vllm_config.cache_config.mamba_cache_mode == "align"

    class ModelClass:
        @staticmethod
        def get_mamba_state_shape_from_config(vllm_config):
            return shapes

        @staticmethod
        def get_mamba_state_dtype_from_config(vllm_config):
            return dtypes

    checkpoint = None if is_mamba2 or not align else GDN_CHECKPOINT_ALIGNMENT
    saved = (ModelRegistry.resolve_model_cls, type(current_platform)._find_non_ssm_backends,
             mamba_abstract.get_mamba_prefill_checkpoint_alignment)
    ModelRegistry.resolve_model_cls = lambda *a, **k: (ModelClass, DUMMY)
    type(current_platform)._find_non_ssm_backends = classmethod(lambda cls, cfg: [backend])
    mamba_abstract.get_mamba_prefill_checkpoint_alignment = lambda cfg: checkpoint
    try:
        current_platform._align_hybrid_block_size(vllm_config, backend)
    finally:
        ModelRegistry.resolve_model_cls = saved[0]
        type(current_platform)._find_non_ssm_backends = saved[1]
        mamba_abstract.get_mamba_prefill_checkpoint_alignment = saved[2]


def layer_specs(vllm_config: VllmConfig, kinds: list) -> dict:
    """Every layer's KVCacheSpec, as the attention / Mamba layers build them."""
    mc, cache = vllm_config.model_config, vllm_config.cache_config
    block = cache.block_size
    kv_dtype = mc.dtype if cache.cache_dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[
        cache.cache_dtype]
    quant = get_kv_quant_mode(cache.cache_dtype)
    heads = mc.get_num_kv_heads(vllm_config.parallel_config)
    head = mc.get_head_size()
    hf = mc.hf_text_config
    specs = {}
    for i, kind in enumerate(kinds):
        name = f"model.layers.{i}.attn"
        if kind == "full_attention":
            specs[name] = FullAttentionSpec(block_size=block, num_kv_heads=heads, head_size=head,
                                            dtype=kv_dtype, kv_quant_mode=quant)
        elif kind == "sliding_window":
            specs[name] = SlidingWindowSpec(block_size=block, num_kv_heads=heads, head_size=head,
                                            dtype=kv_dtype, kv_quant_mode=quant,
                                            sliding_window=hf.sliding_window)
        elif kind == "mla":
            specs[name] = MLAAttentionSpec(block_size=block, num_kv_heads=1, max_tp_shards=1,
                                           head_size=head, dtype=kv_dtype,
                                           cache_dtype_str=cache.cache_dtype,
                                           kv_quant_mode=quant)
        elif kind == "mamba":
            shapes, dtypes, is_mamba2 = mamba_shape_and_dtype(vllm_config)
            align = cache.mamba_cache_mode == "align"
            checkpoint = is_mamba2 or align       # Mamba2 always; GDN with FlashInfer in align
            specs[name] = MambaSpec(
                shapes=tuple(shapes), dtypes=tuple(dtypes), block_size=cache.mamba_block_size,
                page_size_padded=cache.mamba_page_size_padded,
                mamba_cache_mode=cache.mamba_cache_mode,
                num_prefill_checkpoint_blocks=int(checkpoint),
                prefill_checkpoint_alignment=(1 if is_mamba2 else cache.mamba_block_size)
                if checkpoint else None)
    return specs


def plan(case: dict, work: Path) -> dict:
    vllm_config, kinds = build_config(case, work)
    specs = layer_specs(vllm_config, kinds)
    try:
        groups = get_global_kv_cache_groups(vllm_config, [specs])
        configs = get_kv_cache_configs(vllm_config, [specs], [case["available_kv_bytes"]],
                                       groups)
    except ValueError as err:
        return {"error": str(err).split(". ")[0]}
    scheduler = generate_scheduler_kv_cache_config(configs)
    tokens, concurrency = get_kv_cache_capacity(vllm_config, scheduler)
    out_groups = []
    for group in configs[0].kv_cache_groups:
        layer_ids = [int(name.split(".")[2]) for name in group.layer_names]
        page = group.kv_cache_spec.page_size_bytes
        out_groups.append({"kind": get_kv_cache_spec_kind(group.kv_cache_spec).value,
                           "layers": layer_ids, "block_size": group.kv_cache_spec.block_size,
                           "page_size_bytes": page, "group_page_bytes": page * len(layer_ids)})
    return {"num_gpu_blocks": configs[0].num_blocks,
            "block_size": vllm_config.cache_config.block_size,
            "bytes_per_block": _pool_bytes_per_block(vllm_config, configs[0].kv_cache_groups),
            "kv_cache_tokens": tokens, "max_concurrency": concurrency, "groups": out_groups}


def main() -> int:
    cases = json.load(sys.stdin)
    with tempfile.TemporaryDirectory() as work:
        results = [plan(case, Path(work)) for case in cases]
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
