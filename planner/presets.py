"""Model and GPU presets, ``config.json`` loading and a custom GPU from flags.

Model presets carry the numbers of the models' Hugging Face ``config.json``; ``num_params`` is
the exact weight count, and ``estimate_num_params`` reproduces it from the config fields (a test
checks every preset), so ``--hf-config`` on any other model gets the same treatment.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path

from kvsim.errors import InputError, json_problem
from kvsim.planner.hf_fields import check_fields
from kvsim.planner.layers import parse_layers
from kvsim.planner.specs import GIB, GpuSpec, ModelSpec, dtype_bytes
from kvsim.planner.weights import ServedWeights, param_breakdown, weight_format

MIB = 2**20
TB = 1e12

# ---------------------------------------------------------------------------------------------
# models: fields copied from config.json on the Hugging Face Hub (path given per preset); the
# values were cross-checked with public copies of those files (search of public code, Nov 2026).
# ---------------------------------------------------------------------------------------------
_MODELS = [
    # meta-llama/Llama-3.1-8B config.json: hidden_size 4096, intermediate_size 14336,
    # num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, vocab_size 128256,
    # max_position_embeddings 131072, torch_dtype bfloat16, tie_word_embeddings false
    # (seen verbatim in citsjtu2020/LLM-Prof sglang/Model_Config.md). 8,030,261,248 params.
    ModelSpec(name="Llama-3.1-8B", num_layers=32, num_attention_heads=32, num_kv_heads=8,
              head_dim=128, hidden_size=4096, intermediate_size=14336, vocab_size=128256,
              num_params=8_030_261_248, dtype="bfloat16", max_position_embeddings=131072,
              source="hf:meta-llama/Llama-3.1-8B/config.json"),
    # meta-llama/Llama-3.1-70B: hidden 8192, intermediate 28672, 80 layers, 64 heads, 8 KV heads,
    # vocab 128256 (oumi configs/recipes/llama3_1/README.md quotes the same). 70,553,706,496 params.
    ModelSpec(name="Llama-3.1-70B", num_layers=80, num_attention_heads=64, num_kv_heads=8,
              head_dim=128, hidden_size=8192, intermediate_size=28672, vocab_size=128256,
              num_params=70_553_706_496, dtype="bfloat16", max_position_embeddings=131072,
              source="hf:meta-llama/Llama-3.1-70B/config.json"),
    # Qwen/Qwen2.5-7B: hidden 3584, intermediate 18944, 28 layers, 28 heads, 4 KV heads,
    # vocab 152064, q/k/v bias, untied embeddings, max_position_embeddings 131072, bfloat16.
    # 7,615,616,512 params.
    ModelSpec(name="Qwen2.5-7B", num_layers=28, num_attention_heads=28, num_kv_heads=4,
              head_dim=128, hidden_size=3584, intermediate_size=18944, vocab_size=152064,
              num_params=7_615_616_512, dtype="bfloat16", max_position_embeddings=131072,
              source="hf:Qwen/Qwen2.5-7B/config.json"),
    # Qwen/Qwen2.5-72B: hidden 8192, intermediate 29568, 80 layers, 64 heads, 8 KV heads,
    # vocab 152064, q/k/v bias, bfloat16. 72,706,203,648 params.
    ModelSpec(name="Qwen2.5-72B", num_layers=80, num_attention_heads=64, num_kv_heads=8,
              head_dim=128, hidden_size=8192, intermediate_size=29568, vocab_size=152064,
              num_params=72_706_203_648, dtype="bfloat16", max_position_embeddings=131072,
              source="hf:Qwen/Qwen2.5-72B/config.json"),
    # mistralai/Mistral-7B-v0.3: hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 KV heads,
    # vocab 32768, max_position_embeddings 32768, bfloat16. 7,248,023,552 params.
    ModelSpec(name="Mistral-7B-v0.3", num_layers=32, num_attention_heads=32, num_kv_heads=8,
              head_dim=128, hidden_size=4096, intermediate_size=14336, vocab_size=32768,
              num_params=7_248_023_552, dtype="bfloat16", max_position_embeddings=32768,
              source="hf:mistralai/Mistral-7B-v0.3/config.json"),
    # facebook/opt-13b: hidden_size 5120, ffn_dim 20480, 40 layers, 40 heads (no GQA),
    # vocab 50272, max_position_embeddings 2048 (learned, +2 offset), torch_dtype float16,
    # biases everywhere, tied lm_head. 12,853,473,280 params. The vLLM paper's OPT-13B.
    ModelSpec(name="OPT-13B", num_layers=40, num_attention_heads=40, num_kv_heads=40,
              head_dim=128, hidden_size=5120, intermediate_size=20480, vocab_size=50272,
              num_params=12_853_473_280, dtype="float16", max_position_embeddings=2048,
              source="hf:facebook/opt-13b/config.json"),
    # deepseek-ai/DeepSeek-V2-Lite: hidden 2048, 27 layers, 16 heads, MLA with q_lora_rank null,
    # kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128; MoE with
    # 64 routed experts (6 per token) + 2 shared, moe_intermediate_size 1408, first_k_dense_replace 1,
    # dense intermediate_size 10944; vocab 102400; max_position_embeddings 163840; bfloat16.
    # 15,706,484,224 params (15.7B), 2,661,150,208 touched per token (incl. embeddings).
    ModelSpec(name="DeepSeek-V2-Lite", num_layers=27, num_attention_heads=16, num_kv_heads=1,
              head_dim=128, hidden_size=2048, intermediate_size=10944, vocab_size=102400,
              num_params=15_706_484_224, num_active_params=2_661_150_208, dtype="bfloat16",
              kv_lora_rank=512, qk_rope_head_dim=64, qk_head_dim=192,
              max_position_embeddings=163840, source="hf:deepseek-ai/DeepSeek-V2-Lite/config.json"),
]

# the config.json fields of the presets above (the weights by kind are counted from them; a test
# checks that the counts reproduce num_params exactly; the RoPE and norm settings are the step
# executor's, kvsim.cli.execute: timing does not depend on them, the reference comparison does)
_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
PRESET_CONFIGS: dict[str, dict] = {
    "Llama-3.1-8B": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                         max_position_embeddings=131072, tie_word_embeddings=False, torch_dtype="bfloat16",
                         rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE),
    "Llama-3.1-70B": dict(model_type="llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                          num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
                          max_position_embeddings=131072, tie_word_embeddings=False, torch_dtype="bfloat16",
                          rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE),
    "Qwen2.5-7B": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       max_position_embeddings=131072, tie_word_embeddings=False, torch_dtype="bfloat16",
                       rope_theta=1000000.0, rms_norm_eps=1e-6),
    "Qwen2.5-72B": dict(model_type="qwen2", hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
                        num_attention_heads=64, num_key_value_heads=8, vocab_size=152064,
                        max_position_embeddings=131072, tie_word_embeddings=False, torch_dtype="bfloat16",
                        rope_theta=1000000.0, rms_norm_eps=1e-6),
    "Mistral-7B-v0.3": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336,
                            num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                            vocab_size=32768, max_position_embeddings=32768, tie_word_embeddings=False,
                            torch_dtype="bfloat16", rope_theta=1000000.0),
    "OPT-13B": dict(model_type="opt", hidden_size=5120, ffn_dim=20480, num_hidden_layers=40,
                    num_attention_heads=40, vocab_size=50272, max_position_embeddings=2048,
                    torch_dtype="float16"),
    "DeepSeek-V2-Lite": dict(model_type="deepseek_v2", hidden_size=2048, intermediate_size=10944,
                             num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16,
                             vocab_size=102400, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
                             qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=64, n_shared_experts=2,
                             num_experts_per_tok=6, moe_intermediate_size=1408, first_k_dense_replace=1,
                             max_position_embeddings=163840, tie_word_embeddings=False,
                             torch_dtype="bfloat16"),
}


# presets read from the config.json files bundled in planner/hf_configs (copied from the Hugging
# Face Hub; see each folder): the hybrid models, and the models real vLLM was measured serving
# (their shipped tables in tables/vllm/ are then their default clock), name -> (folder, Hub id)
HF_CONFIG_DIR = Path(__file__).resolve().parent / "hf_configs"
BUNDLED_MODELS = {
    "gpt-oss-20b": ("gpt-oss-20b", "openai/gpt-oss-20b"),
    "gpt-oss-120b": ("gpt-oss-120b", "openai/gpt-oss-120b"),
    "Gemma-3-27B": ("gemma-3-27b-it", "google/gemma-3-27b-it"),
    "DeepSeek-V3": ("DeepSeek-V3", "deepseek-ai/DeepSeek-V3"),
    "Qwen3-Next-80B-A3B": ("Qwen3-Next-80B-A3B-Instruct", "Qwen/Qwen3-Next-80B-A3B-Instruct"),
    "Nemotron-H-8B": ("Nemotron-H-8B-Base-8K", "nvidia/Nemotron-H-8B-Base-8K"),
    "Qwen3-30B-A3B": ("Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B"),
    "Qwen3-32B": ("Qwen3-32B", "Qwen/Qwen3-32B"),
}


# ---------------------------------------------------------------------------------------------
# GPUs. memory_bytes: the total the driver reports (vLLM's total_gpu_memory), not the datasheet
# figure. Bandwidth and dense (non-sparse) peaks from the vendors' datasheets: NVIDIA A100
# datasheet (1,555 / 2,039 GB/s, BF16 312 TFLOPS), H100 SXM datasheet (3.35 TB/s, BF16 989.4,
# FP8 1,978.9 TFLOPS dense = half the "with sparsity" figures), H200 SXM datasheet (4.8 TB/s,
# same tensor cores as H100), L40S datasheet (864 GB/s, BF16 362.05, FP8 733 TFLOPS dense),
# L4 datasheet (300 GB/s, BF16 121, FP8 242.5 TFLOPS dense), AMD Instinct MI300X datasheet
# (5.3 TB/s, BF16 1,307.4, FP8 2,614.9 TFLOPS dense), NVIDIA HGX B200 at 1,000 W (8 TB/s, BF16
# 2,250, FP8 4,500 TFLOPS dense: half the sparse figures).
# price_rank: an ordinal of typical on-demand cloud prices per GPU-hour (1 = cheapest), used
# only to name the cheapest configuration that meets an SLO; override in planner.sweep if needed.
# ---------------------------------------------------------------------------------------------
_GPUS = [
    GpuSpec(name="A100-40GB", memory_bytes=40_448 * MIB,  # "total capacity of 39.50 GiB" (PyTorch
            # OOM message on an A100-40GB, github.com/TianheWu/CoSeR/issues/10)
            memory_bandwidth_bytes_per_s=1.555 * TB, bf16_flops_per_s=312e12, fp8_flops_per_s=None,
            datasheet_memory_gb=40, price_rank=3, source="NVIDIA A100 datasheet (SXM)"),
    GpuSpec(name="A100-80GB", memory_bytes=81_152 * MIB,  # "79.25 GiB total capacity" (PyTorch OOM
            # message on an A100 80GB, github.com/levihsu/OOTDiffusion/issues/235)
            memory_bandwidth_bytes_per_s=2.039 * TB, bf16_flops_per_s=312e12, fp8_flops_per_s=None,
            datasheet_memory_gb=80, price_rank=4, source="NVIDIA A100 datasheet (SXM)"),
    GpuSpec(name="H100-80GB-SXM", memory_bytes=81_121 * MIB,  # total_gpu_memory 79.22GiB in vLLM's
            # profiling log on an H100 (github.com/vllm-project/vllm/pull/10511)
            memory_bandwidth_bytes_per_s=3.35 * TB, bf16_flops_per_s=989.4e12,
            fp8_flops_per_s=1978.9e12, datasheet_memory_gb=80, price_rank=5,
            source="NVIDIA H100 datasheet (SXM5)"),
    GpuSpec(name="H200", memory_bytes=150_109_880_320,  # torch.cuda.mem_get_info() total, measured
            # on an NVIDIA H200 (nvidia-smi: 143771 MiB) for this project, 2026-11-30
            memory_bandwidth_bytes_per_s=4.8 * TB, bf16_flops_per_s=989.4e12,
            fp8_flops_per_s=1978.9e12, datasheet_memory_gb=141, price_rank=7,
            source="NVIDIA H200 datasheet (SXM)"),
    GpuSpec(name="B200", memory_bytes=183_359 * MIB,  # nvidia-smi total on HGX B200 (public logs of
            # many hosts: "NVIDIA B200, 183359 MiB"); approximate, as L40S: the CUDA total is a few
            # hundred MiB lower. Not measured here.
            memory_bandwidth_bytes_per_s=8.0 * TB, bf16_flops_per_s=2250e12, fp8_flops_per_s=4500e12,
            datasheet_memory_gb=180, price_rank=8,
            source="NVIDIA DGX/HGX B200 datasheets (8 TB/s a GPU; dense BF16 2.25 and FP8 4.5 PFLOPS at 1,000 W)"),
    GpuSpec(name="L40S", memory_bytes=46_068 * MIB,  # nvidia-smi total (approximate: the CUDA
            # total is a few hundred MiB lower, as on H100/H200); not measured here
            memory_bandwidth_bytes_per_s=864e9, bf16_flops_per_s=362.05e12, fp8_flops_per_s=733e12,
            datasheet_memory_gb=48, price_rank=2, source="NVIDIA L40S datasheet"),
    GpuSpec(name="L4", memory_bytes=23_034 * MIB,  # nvidia-smi total (approximate, as L40S)
            memory_bandwidth_bytes_per_s=300e9, bf16_flops_per_s=121e12, fp8_flops_per_s=242.5e12,
            datasheet_memory_gb=24, price_rank=1, source="NVIDIA L4 datasheet"),
    GpuSpec(name="MI300X", memory_bytes=192 * GIB,  # datasheet 192 GB HBM3 (approximate: ROCm
            # reports slightly less)
            memory_bandwidth_bytes_per_s=5.3 * TB, bf16_flops_per_s=1307.4e12,
            fp8_flops_per_s=2614.9e12, datasheet_memory_gb=192, price_rank=6,
            source="AMD Instinct MI300X datasheet"),
]


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", str(name).lower())


def _with_weights(model: ModelSpec) -> ModelSpec:
    """A preset with its weights by kind (from its config fields), served at its dtype."""
    cfg = PRESET_CONFIGS[model.name]
    return replace(model, weights=ServedWeights(param_breakdown(cfg),
                                                weight_format(cfg, model.dtype_bytes)))


def _bundled(name: str) -> ModelSpec:
    folder, hub_id = BUNDLED_MODELS[name]
    spec = load_hf_config(HF_CONFIG_DIR / folder / "config.json", name=name)
    return replace(spec, source=f"hf:{hub_id}/config.json (bundled: planner/hf_configs/{folder})")


MODEL_PRESETS: dict[str, ModelSpec] = {m.name: _with_weights(m) for m in _MODELS}
GPU_PRESETS: dict[str, GpuSpec] = {g.name: g for g in _GPUS}

_MODEL_ALIASES = {_norm(m.name): m.name for m in _MODELS}
_MODEL_ALIASES.update({_norm(a): n for a, n in {
    "meta-llama/Llama-3.1-8B": "Llama-3.1-8B", "llama3.1-8b": "Llama-3.1-8B",
    "meta-llama/Llama-3.1-8B-Instruct": "Llama-3.1-8B", "llama-8b": "Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B": "Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct": "Llama-3.1-70B",
    "Qwen/Qwen2.5-7B": "Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct": "Qwen2.5-7B",
    "Qwen/Qwen2.5-72B": "Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct": "Qwen2.5-72B",
    "mistral-7b": "Mistral-7B-v0.3", "mistralai/Mistral-7B-v0.3": "Mistral-7B-v0.3",
    "mistralai/Mistral-7B-Instruct-v0.3": "Mistral-7B-v0.3",
    "opt13b": "OPT-13B", "facebook/opt-13b": "OPT-13B",
    "deepseek-ai/DeepSeek-V2-Lite": "DeepSeek-V2-Lite", "deepseek-ai/DeepSeek-V2-Lite-Chat": "DeepSeek-V2-Lite",
}.items()})
_MODEL_ALIASES.update({_norm(a): n for n, (folder, hub_id) in BUNDLED_MODELS.items()
                       for a in (n, folder, hub_id)})
_MODEL_ALIASES.update({_norm(a): n for a, n in {
    "gemma-3-27b": "Gemma-3-27B", "gemma3-27b": "Gemma-3-27B", "deepseek-v3": "DeepSeek-V3",
    "deepseek-ai/DeepSeek-R1": "DeepSeek-V3", "deepseek-ai/DeepSeek-V3-0324": "DeepSeek-V3",
    "Qwen/Qwen3-Next-80B-A3B-Thinking": "Qwen3-Next-80B-A3B", "qwen3-next": "Qwen3-Next-80B-A3B",
    "nemotron-h-8b": "Nemotron-H-8B",
}.items()})

_GPU_ALIASES = {_norm(g.name): g.name for g in _GPUS}
_GPU_ALIASES.update({_norm(a): n for a, n in {
    "a100-40": "A100-40GB", "a100": "A100-80GB", "a100-80": "A100-80GB",
    "h100": "H100-80GB-SXM", "h100-80gb": "H100-80GB-SXM", "h100-sxm": "H100-80GB-SXM",
    "h100-80": "H100-80GB-SXM", "h200-141gb": "H200", "mi300": "MI300X",
}.items()})


def get_model(name: str) -> ModelSpec:
    """A model preset by name or alias (case and punctuation ignored).

    Raises:
        InputError: unknown name; the message lists the presets.
    """
    key = _MODEL_ALIASES.get(_norm(name))
    if key is None:
        raise InputError(f"unknown model {name!r}; presets: {', '.join(MODEL_PRESETS)} "
                         "(or pass --hf-config path/to/config.json)", field="model")
    return MODEL_PRESETS[key]


def get_gpu(name: str) -> GpuSpec:
    """A GPU preset by name or alias (case and punctuation ignored).

    Raises:
        InputError: unknown name; the message lists the presets.
    """
    key = _GPU_ALIASES.get(_norm(name))
    if key is None:
        raise InputError(f"unknown GPU {name!r}; presets: {', '.join(GPU_PRESETS)} "
                         "(or describe one with --gpu-memory-gib/--gpu-bandwidth-gbps/--gpu-tflops)",
                         field="gpu")
    return GPU_PRESETS[key]


def custom_gpu(memory_gib: float, bandwidth_gb_per_s: float, bf16_tflops: float,
               fp8_tflops: float | None = None, name: str = "custom", price_rank: int = 1) -> GpuSpec:
    """A GPU described by flags (memory in GiB as the driver reports it, GB/s, dense TFLOPS)."""
    return GpuSpec(name=name, memory_bytes=int(memory_gib * GIB),
                   memory_bandwidth_bytes_per_s=bandwidth_gb_per_s * 1e9,
                   bf16_flops_per_s=bf16_tflops * 1e12,
                   fp8_flops_per_s=None if fp8_tflops is None else fp8_tflops * 1e12,
                   price_rank=price_rank, source="flags")


# ---------------------------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------------------------
def estimate_num_params(cfg: dict) -> tuple[int, int]:
    """Weight count of a decoder-only model from its config.json fields (``param_breakdown``:
    Llama/Mistral/Qwen2, OPT, Mixtral/Qwen-MoE/DeepSeek MoE, MLA, gpt-oss, Gemma 3, Qwen3-Next,
    Nemotron-H).

    Args:
        cfg: the (text) config dict.
    Returns:
        (num_params, num_active_params): all weights, and the weights one token touches
        (MoE: only num_experts_per_tok routed experts).
    """
    breakdown = param_breakdown(cfg)
    return breakdown.num_params, breakdown.num_active_params


def _field(cfg: dict, names: tuple[str, ...], path: str, required: bool = True):
    for name in names:
        value = cfg.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InputError(f"must be a positive integer, got {value!r}", file=path, field=name)
            return value
    if required:
        raise InputError("missing required field", file=path, field=names[0])
    return None


def hf_config_source(path: str) -> tuple[str, str]:
    """``--hf-config PATH``: the config.json to read (PATH itself, or PATH/config.json for a model
    folder) and the model's name: the config's ``_name_or_path``, else its first
    ``architectures`` entry, else the folder's name. A file that cannot be read keeps the folder's
    name here; load_hf_config then reports it (one line)."""
    config = os.path.join(path, "config.json") if os.path.isdir(path) else path
    name = None
    try:
        with open(config, encoding="utf-8") as f:
            raw = json.load(f)
        if isinstance(raw, dict):
            arch = raw.get("architectures")
            name = (raw.get("_name_or_path") or (arch[0] if isinstance(arch, list) and arch else None))
    except (OSError, ValueError):
        pass
    if not isinstance(name, str) or not name.strip():
        name = os.path.basename(os.path.dirname(os.path.abspath(config))) or "custom"
    return config, name.strip()


def _read_config(path: str) -> tuple[dict, dict]:
    """A config.json's object, and the text model's fields (a multimodal wrapper's
    ``text_config`` merged over the rest)."""
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError as err:
        raise InputError(f"not UTF-8 text ({err.reason})", file=path) from None
    except OSError as err:  # missing, a directory, unreadable
        raise InputError(f"cannot read: {err.strerror}", file=path) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"invalid JSON: {json_problem(err)}", file=path, line=err.lineno) from None
    if not isinstance(raw, dict):
        raise InputError(f"expected a JSON object, got {type(raw).__name__}", file=path)
    cfg = raw
    if "text_config" in raw:  # multimodal wrappers (Llava, Gemma 3, Mistral 3, ...)
        if not isinstance(raw["text_config"], dict):
            raise InputError("must be an object", file=path, field="text_config")
        cfg = {**{k: v for k, v in raw.items() if k != "text_config"}, **raw["text_config"]}
    return raw, cfg


def _attention_shape(cfg: dict, path: str, hidden: int, nh: int, defaulted: list) -> tuple:
    """(num_kv_heads, head_dim, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim): MLA's
    latent (one KV head of v_head_dim) or the attention heads; each default taken is added to
    ``defaulted``."""
    nkv = _field(cfg, ("num_key_value_heads",), path, required=False)
    head_dim = _field(cfg, ("head_dim", "attention_head_dim"), path, required=False)
    kv_lora_rank = _field(cfg, ("kv_lora_rank",), path, required=False)
    if nkv is None and not kv_lora_rank:
        nkv = nh
        defaulted.append(f"num_key_value_heads {nh} (num_attention_heads, as vLLM takes it)")
    rope = nope = None
    if kv_lora_rank:
        rope = _field(cfg, ("qk_rope_head_dim",), path)
        nope = _field(cfg, ("qk_nope_head_dim",), path)
        head_dim = _field(cfg, ("v_head_dim",), path)
        nkv = 1  # one latent per token, shared by all heads
    elif head_dim is None:
        if hidden % nh:
            raise InputError(f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({nh}) "
                             "and head_dim is absent", file=path, field="head_dim")
        head_dim = hidden // nh
        defaulted.append(f"head_dim {head_dim} (hidden_size / num_attention_heads)")
    return nkv, head_dim, kv_lora_rank, rope, nope


def load_hf_config(path: str | Path, name: str | None = None, *, force: bool = False) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (nested ``text_config`` too).

    Args:
        path: the config.json file.
        name: the spec's name; default: the parent directory's name.
        force: size a model_type kvsim does not know as a generic decoder (planner.hf_fields).
    Returns:
        The model spec, with num_params estimated from the architecture; its ``config_notes``
        name every sizing field that was absent and the default taken, and the fields not read.
    Raises:
        InputError: unreadable JSON, missing or malformed fields, an unknown model_type, a near
            miss of a field name (names the file and field; planner.hf_fields).
    """
    path = str(path)
    raw, cfg = _read_config(path)
    notes = check_fields(cfg, path, force=force)
    defaulted = []

    num_layers = _field(cfg, ("num_hidden_layers", "n_layer", "num_layers"), path)
    hidden = _field(cfg, ("hidden_size", "n_embd", "d_model"), path)
    nh = _field(cfg, ("num_attention_heads", "n_head"), path)
    vocab = _field(cfg, ("vocab_size",), path)
    nkv, head_dim, kv_lora_rank, rope, nope = _attention_shape(cfg, path, hidden, nh, defaulted)
    inter = _field(cfg, ("intermediate_size", "ffn_dim", "n_inner"), path, required=False)
    if inter is None:
        inter = 4 * hidden
        defaulted.append(f"intermediate_size {inter} (4 x hidden_size)")
    dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    if not dtype:
        dtype = "bfloat16"
        defaulted.append("torch_dtype bfloat16")
    if dtype == "float":
        dtype = "float32"
    try:
        dtype_bytes(dtype)
    except ValueError as err:
        raise InputError(str(err), file=path, field="torch_dtype") from None
    max_pos = _field(cfg, ("max_position_embeddings", "n_positions"), path, required=False)
    if max_pos is None:
        defaulted.append("max_position_embeddings none (give max_model_len)")
    if defaulted:
        notes.insert(0, f"absent, default taken: {'; '.join(defaulted)}")
    norm_cfg = {**cfg, "hidden_size": hidden, "num_hidden_layers": num_layers,
                "num_attention_heads": nh, "vocab_size": vocab, "intermediate_size": inter}
    if isinstance(raw.get("vision_config"), dict):
        norm_cfg["vision_config"] = raw["vision_config"]
    try:
        breakdown = param_breakdown(norm_cfg)
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(f"cannot count parameters: {err}", file=path) from None
    num_params, num_active = breakdown.num_params, breakdown.num_active_params
    layers = parse_layers(cfg, path, num_layers, nkv, head_dim)
    weights = ServedWeights(breakdown, weight_format(cfg, dtype_bytes(dtype), path=path))
    try:
        return ModelSpec(name=name or Path(path).resolve().parent.name or "custom",
                         num_layers=num_layers, num_attention_heads=nh, num_kv_heads=nkv,
                         head_dim=head_dim, hidden_size=hidden, intermediate_size=inter,
                         vocab_size=vocab, num_params=num_params,
                         num_active_params=num_active if num_active != num_params else None,
                         dtype=dtype, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=rope,
                         qk_head_dim=(nope + rope) if kv_lora_rank else None,
                         max_position_embeddings=max_pos, source=path, layers=layers,
                         weights=weights, config_notes=tuple(notes))
    except ValueError as err:  # the spec's own checks (an InputError without the file)
        raise InputError(str(err), file=path) from None


# the hybrid presets, after load_hf_config is defined (they are read through it)
MODEL_PRESETS.update({name: _bundled(name) for name in BUNDLED_MODELS})
