"""KV-cache capacity cases checked against vLLM 0.33's own planning (bench/vllm_kv_capacity.py):
the bundled hybrid configs (planner/hf_configs) across tp, prefix caching, kv dtype, block size,
max_model_len and memory, plus memory too small for one request.

``python tests/capacity_cases.py`` (with ``$KVSIM_VLLM_PYTHON`` or ../oracle-venv) rewrites
tests/fixtures/vllm_kv_capacity.json, which tests/test_planner_kv_groups.py compares with.
"""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "fixtures" / "vllm_kv_capacity.json"
MODELS = {  # config folder -> tensor-parallel sizes its heads allow
    "gpt-oss-20b": (1, 2, 8), "gpt-oss-120b": (1, 4, 8), "gemma-3-27b-it": (1, 2),
    "DeepSeek-V3": (8,), "Qwen3-Next-80B-A3B-Instruct": (1, 2, 4),
    "Nemotron-H-8B-Base-8K": (1, 2, 8),
}


# every bundled preset on the GPUs it fits, at the KV memory kvsim computes for it (vLLM's
# defaults otherwise: batch limits of the GPU, gpu_memory_utilization 0.92): (preset, GPU, tp,
# max_model_len, prefix caching, hybrid manager off)
PRESET_CASES = [
    ("gpt-oss-20b", "H100-80GB-SXM", 1, 131072, True, False),
    ("gpt-oss-20b", "H200", 1, 131072, True, False),
    ("gpt-oss-120b", "H100-80GB-SXM", 1, 131072, True, False),
    ("gpt-oss-120b", "H200", 1, 131072, True, False),
    ("gpt-oss-120b", "H100-80GB-SXM", 1, 131072, True, True),
    ("gpt-oss-120b", "H200", 1, 131072, True, True),
    ("Gemma-3-27B", "H100-80GB-SXM", 1, 131072, True, False),
    ("Gemma-3-27B", "H200", 1, 131072, True, False),
    ("DeepSeek-V3", "H200", 8, 163840, True, False),
    ("Qwen3-Next-80B-A3B", "H100-80GB-SXM", 4, 262144, True, False),
    ("Qwen3-Next-80B-A3B", "H200", 2, 262144, True, False),
    ("Qwen3-Next-80B-A3B", "H200", 2, 262144, False, False),
    ("Nemotron-H-8B", "H100-80GB-SXM", 1, 8192, True, False),
    ("Nemotron-H-8B", "H200", 1, 8192, True, False),
    ("Nemotron-H-8B", "H200", 1, 8192, False, False),
    ("Qwen3-30B-A3B", "H100-80GB-SXM", 1, 40960, True, False),
    ("Qwen3-30B-A3B", "H200", 1, 40960, True, False),
    ("Qwen3-32B", "H100-80GB-SXM", 1, 8192, True, False),
    ("Qwen3-32B", "H200", 1, 40960, True, False),
]


def preset_capacity(preset: str, gpu: str, tp: int, max_model_len: int, caching: bool,
                    no_hybrid: bool):
    """kvsim's capacity report of a preset (planner.capacity.compute_capacity)."""
    from kvsim.planner.capacity import compute_capacity
    from kvsim.planner.presets import get_gpu, get_model

    return compute_capacity(get_model(preset), get_gpu(gpu), tp=tp, max_model_len=max_model_len,
                            enable_prefix_caching=caching,
                            disable_hybrid_kv_cache_manager=no_hybrid)


def preset_cases() -> list[dict]:
    from kvsim.planner.presets import BUNDLED_MODELS

    out = []
    for preset, gpu, tp, max_len, caching, no_hybrid in PRESET_CASES:
        r = preset_capacity(preset, gpu, tp, max_len, caching, no_hybrid)
        case = dict(preset=preset, gpu=gpu,
                    config=f"planner/hf_configs/{BUNDLED_MODELS[preset][0]}/config.json", tp=tp,
                    prefix_caching=caching, max_model_len=max_len,
                    available_kv_bytes=r.available_kv_bytes,
                    max_num_batched_tokens=r.max_num_batched_tokens,
                    max_num_seqs=r.max_num_seqs)
        if no_hybrid:
            case["disable_hybrid_kv_cache_manager"] = True
        out.append(case)
    return out


def report_plan(r) -> dict:
    """A capacity report in the harness's output format (a model of one attention kind: vLLM's
    one full-attention group of every layer)."""
    if r.kv_plan is not None:
        return plan_dict(r.kv_plan)
    from kvsim.planner.presets import get_model

    layers = get_model(r.model).num_layers
    return {"num_gpu_blocks": r.num_gpu_blocks, "block_size": r.block_size, "bytes_per_block": r.bytes_per_block,
            "kv_cache_tokens": r.kv_cache_tokens, "max_concurrency": r.max_concurrency,
            "groups": [{"kind": "full_attention", "layers": list(range(layers)), "block_size": r.block_size,
                        "page_size_bytes": r.bytes_per_block // layers, "group_page_bytes": r.bytes_per_block}]}


def plan_dict(plan) -> dict:
    """A KVCachePlan in the harness's output format."""
    kinds = {"full_attention": "full_attention", "sliding_window": "sliding_window",
             "mla": "mla_attention", "mamba": "mamba"}
    return {"num_gpu_blocks": plan.num_gpu_blocks, "block_size": plan.block_size,
            "bytes_per_block": plan.bytes_per_block, "kv_cache_tokens": plan.kv_cache_tokens,
            "max_concurrency": plan.max_concurrency,
            "groups": [{"kind": kinds[g.spec.kind], "layers": list(g.layers),
                        "block_size": g.block_size, "page_size_bytes": g.spec.page_size_bytes,
                        "group_page_bytes": g.page_bytes} for g in plan.groups]}


def cases() -> list[dict]:
    out = preset_cases()
    for model, tps in MODELS.items():
        config = f"planner/hf_configs/{model}/config.json"
        for tp, caching, (kv_dtype, block), (max_len, gib) in itertools.product(
                tps, (True, False), (("auto", None), ("fp8", None), ("auto", 32)),
                ((8192, 40.0), (32768, 17.5))):
            if model.startswith("Nemotron") and max_len > 8192:
                max_len = 8192
            out.append(dict(config=config, tp=tp, prefix_caching=caching,
                            kv_cache_dtype=kv_dtype, block_size=block, max_model_len=max_len,
                            available_kv_bytes=int(gib * 2**30), max_num_batched_tokens=8192))
        # too little memory for one request; and every layer full (hybrid manager off)
        out.append(dict(config=config, tp=tps[0], max_model_len=8192,
                        available_kv_bytes=2**24, max_num_batched_tokens=8192))
        if "gpt-oss" in model or "gemma" in model:
            out.append(dict(config=config, tp=tps[0], max_model_len=32768,
                            available_kv_bytes=30 * 2**30, max_num_batched_tokens=2048,
                            disable_hybrid_kv_cache_manager=True))
    return out


def kvsim_plan(case: dict) -> dict:
    """kvsim's plan for a case, in the harness's output format."""
    from kvsim.planner.kv_groups import default_block_size, layer_kv_specs, plan_kv_cache
    from kvsim.planner.layers import AttentionLayer, parse_layers
    from kvsim.planner.presets import load_hf_config
    from kvsim.planner.specs import dtype_bytes

    path = str(ROOT / case["config"])
    model = load_hf_config(path)
    raw = json.loads(Path(path).read_text())
    cfg = {**raw, **raw.get("text_config", {})}
    head_dim = cfg.get("attention_head_dim") or model.head_dim
    layers = parse_layers(cfg, path, model.num_layers, model.num_kv_heads, head_dim) or \
        (AttentionLayer("full_attention", model.num_kv_heads, head_dim, head_dim),) * \
        model.num_layers
    kv_dtype = case.get("kv_cache_dtype", "auto")
    block = case.get("block_size") or default_block_size(layers)
    specs, block = layer_kv_specs(
        layers, tp=case.get("tp", 1),
        kv_dtype_bytes=model.dtype_bytes if kv_dtype == "auto" else dtype_bytes(kv_dtype),
        model_dtype=model.dtype, block_size=block,
        enable_prefix_caching=case.get("prefix_caching", True),
        max_model_len=case["max_model_len"],
        disable_hybrid=case.get("disable_hybrid_kv_cache_manager", False))
    try:
        plan = plan_kv_cache(specs, block, case["available_kv_bytes"], case["max_model_len"],
                             2 * case.get("max_num_batched_tokens", 8192))
    except ValueError as err:
        return {"error": str(err)}
    return plan_dict(plan)


def vllm_plans(python: str, all_cases: list[dict]) -> list[dict]:
    """Run the harness under an interpreter with vLLM."""
    absolute = [{**c, "config": str(ROOT / c["config"])} for c in all_cases]
    result = subprocess.run([python, str(ROOT / "bench" / "vllm_kv_capacity.py")],
                            input=json.dumps(absolute), capture_output=True, text=True,
                            timeout=900, cwd=ROOT)
    if result.returncode:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout)


def main() -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_allocator_vs_vllm import vllm_python
    python = vllm_python()
    if python is None:
        sys.exit("no interpreter with vLLM ($KVSIM_VLLM_PYTHON or ../oracle-venv)")
    all_cases = cases()
    plans = vllm_plans(python, all_cases)
    GOLDEN.write_text("[\n" + ",\n".join(json.dumps({"case": c, "vllm": p})
                                          for c, p in zip(all_cases, plans)) + "\n]\n")
    print(f"wrote {GOLDEN} ({len(all_cases)} cases, "
          f"{sum('error' in p for p in plans)} that do not fit)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
