"""The vLLM oracle (../shared/tools/vllm_oracle/oracle.py) with hybrid KV-cache groups.

vLLM 0.33's real Scheduler, KVCacheManager and HybridKVCacheCoordinator over a trace, with the
groups of a hybrid model instead of the oracle's single full-attention group. Same arguments
and outputs as oracle.py (steps.csv, requests.csv, summary.json), plus:

    --kv-groups full,sliding:128     one entry per KV-cache group, in vLLM's order:
                                     full | sliding:W | mamba | mamba_ckpt[:A]
                                     (mamba_ckpt: Mamba2 layers exporting the prompt checkpoint
                                     from inside a chunk, alignment A, default 1)

Run under the oracle venv, e.g.

    ../oracle-venv/bin/python bench/hybrid_oracle.py --kv-groups sliding:128,full \\
        --trace t.csv --out-dir out --num-gpu-blocks 2000

The cache config follows vLLM's engine core: ``prefix_cache_retention_interval`` 0 (vLLM's
default), Mamba "align" mode with prefix caching (block size = the attention block size) and
"none" without (block size = max_model_len), scheduler and hash block sizes from
``resolve_kv_cache_block_sizes``. Only the groups' kinds matter to the scheduler; their page
sizes do not (one layer of one element each).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.fidelity_diff import ORACLE_DIR  # noqa: E402

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)   # keep bench/ (which holds a kernels.py) off the path vLLM imports from


def load_oracle():
    spec = importlib.util.spec_from_file_location("vllm_oracle", ORACLE_DIR / "oracle.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def parse_groups(text: str) -> list[tuple[str, int | None]]:
    """``full,sliding:128,mamba_ckpt`` -> [("full", None), ("sliding", 128), ("mamba_ckpt", 1)]."""
    out = []
    for item in text.split(","):
        kind, _, arg = item.strip().partition(":")
        if kind not in ("full", "sliding", "mamba", "mamba_ckpt"):
            raise SystemExit(f"--kv-groups: unknown group kind {kind!r}")
        if kind == "sliding" and not arg:
            raise SystemExit("--kv-groups: sliding needs a window, e.g. sliding:128")
        out.append((kind, int(arg) if arg else (1 if kind == "mamba_ckpt" else None)))
    return out


def hybrid_build_scheduler(oracle, groups, kv_offloading_size: float | None = None):
    """A replacement for oracle.build_scheduler that gives the Scheduler these groups and, with
    ``kv_offloading_size`` (GiB), vLLM's native CPU offloading (``--kv-offloading-size``: the
    VllmConfig turns it into the OffloadingConnector)."""
    original = oracle.build_scheduler

    def build(a):
        import torch
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import (get_request_block_hasher, init_none_hash,
                                                 resolve_kv_cache_block_sizes)
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                                KVCacheGroupSpec, MambaSpec, SlidingWindowSpec)
        from vllm.v1.structured_output import StructuredOutputManager

        _, _, vllm_config = original(a)            # the oracle's VllmConfig (model, scheduler)
        if kv_offloading_size is not None:
            import dataclasses

            from vllm.config import VllmConfig
            vllm_config = VllmConfig(
                model_config=vllm_config.model_config,
                scheduler_config=vllm_config.scheduler_config,
                device_config=vllm_config.device_config,
                cache_config=dataclasses.replace(vllm_config.cache_config,
                                                 kv_offloading_size=kv_offloading_size,
                                                 kv_offloading_backend="native"))
        caching = vllm_config.cache_config.enable_prefix_caching
        has_mamba = any(kind.startswith("mamba") for kind, _ in groups)
        if has_mamba:
            vllm_config.cache_config.mamba_cache_mode = "align" if caching else "none"
        common = dict(num_kv_heads=1, head_size=1, dtype=torch.float32)
        specs = []
        for kind, arg in groups:
            if kind == "full":
                specs.append(FullAttentionSpec(block_size=a.block_size, **common))
            elif kind == "sliding":
                specs.append(SlidingWindowSpec(block_size=a.block_size, sliding_window=arg,
                                               **common))
            else:
                checkpoint = kind == "mamba_ckpt" and caching
                specs.append(MambaSpec(
                    block_size=a.block_size if caching else a.max_model_len, shapes=((1,),),
                    dtypes=(torch.float32,), mamba_cache_mode="align" if caching else "none",
                    num_prefill_checkpoint_blocks=int(checkpoint),
                    prefill_checkpoint_alignment=arg if checkpoint else None))
        kv_cache_config = KVCacheConfig(
            num_blocks=a.num_gpu_blocks, kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec([f"model.layers.{i}.attn"], spec)
                             for i, spec in enumerate(specs)],
            prefix_cache_retention_interval=vllm_config.cache_config.prefix_cache_retention_interval)
        vllm_config.cache_config.num_gpu_blocks = a.num_gpu_blocks
        sched_bs, hash_bs = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
        kv_cache_config.hash_block_size = hash_bs
        scheduler_cls = vllm_config.scheduler_config.get_scheduler_cls()
        sched = scheduler_cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                              structured_output_manager=StructuredOutputManager(vllm_config),
                              block_size=sched_bs, hash_block_size=hash_bs, log_stats=True)
        block_hasher = None
        if caching:
            hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
            init_none_hash(hash_fn)
            block_hasher = get_request_block_hasher(hash_bs, hash_fn,
                                                    vllm_config.num_hash_lookahead_tokens)
        return sched, block_hasher, vllm_config

    return build


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--kv-groups", required=True)
    ours, rest = parser.parse_known_args(argv)
    oracle = load_oracle()
    oracle.build_scheduler = hybrid_build_scheduler(oracle, parse_groups(ours.kv_groups))
    return oracle.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
