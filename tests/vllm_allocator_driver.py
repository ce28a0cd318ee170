"""Drive vLLM's real KVCacheManager and kvsim's PagedAllocator side by side and compare each step.

Needs an interpreter with vLLM 0.33 installed (../shared/tools/vllm_oracle/setup.sh builds one);
run by tests/test_allocator_vs_vllm.py, or by hand:

    ../oracle-venv/bin/python tests/vllm_allocator_driver.py --seeds 20

Random admissions (prompts sharing a prefix within 3 groups), single-token decodes, finishes,
recompute preemptions and re-admissions. After every step: every running request's block table,
the whole free-queue order, the free-block count, usage and the prefix-hit tokens must be equal.
Variants: prefix caching on with eager registration, on with private blocks registered lazily
(kvsim's shortcut), and off. Prints one line per run; exits non-zero at the first difference.
"""
from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import logging
import os
import random
import sys
import tomllib
from pathlib import Path

for _key, _value in {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                     "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONHASHSEED": "0"}.items():
    os.environ.setdefault(_key, _value)
logging.getLogger("vllm").setLevel("ERROR")

import torch  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec)
from vllm.v1.request import Request  # noqa: E402


class _KvsimFolders(importlib.abc.MetaPathFinder):
    """Import kvsim's packages from the checkout (this interpreter has vLLM, not kvsim
    installed), through the package-dir mapping of pyproject.toml."""
    root = Path(__file__).resolve().parent.parent
    package_dir = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"]

    def find_spec(self, name, path=None, target=None):
        if name not in self.package_dir:
            return None
        folder = self.root / self.package_dir[name]
        return importlib.util.spec_from_file_location(
            name, folder / "__init__.py", submodule_search_locations=[str(folder)])


sys.meta_path.insert(0, _KvsimFolders())
from kvsim.allocator import PagedAllocator, hash_token_blocks  # noqa: E402

BLOCK_SIZE = 4


class Keys(list):
    """Token-id keys that say how many leading blocks other requests may share."""
    num_shareable_blocks = 0


def run(seed: int, steps: int, caching: bool, private: bool) -> tuple[int, int, int]:
    """One random run; returns (admissions with a hit, failed admissions, preemptions)."""
    rng = random.Random(seed)
    num_blocks = rng.randrange(8, 60)
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer0"], FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1,
                                                       head_size=1, dtype=torch.float32))])
    vllm = KVCacheManager(config, max_model_len=100_000, scheduler_block_size=BLOCK_SIZE,
                          hash_block_size=BLOCK_SIZE, enable_caching=caching)
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(BLOCK_SIZE, hash_fn)
    kvsim = PagedAllocator(num_blocks, BLOCK_SIZE, enable_prefix_caching=caching, null_block=True)
    requests: dict[int, tuple[Request, list[int], Keys]] = {}   # seq_id -> (request, output, keys)
    running: list[int] = []
    preempted: list[int] = []
    num_hit = num_failed = num_preempted = 0
    for step in range(steps):
        op = rng.choice(["new"] * 3 + ["decode"] * 6 + ["finish", "preempt"] + ["resume"] * 2)
        if (op == "resume" and not preempted) or (op in ("decode", "finish", "preempt")
                                                   and not running):
            op = "new"
        if op in ("new", "resume"):
            if op == "new":
                seq_id = step
                group = rng.randrange(3)
                shared = [1000 * group + i for i in range(rng.randrange(5 * BLOCK_SIZE))]
                prompt = shared + [10**6 + 1000 * step + i
                                   for i in range(rng.randrange(1, 4 * BLOCK_SIZE))]
                output = [2 * 10**6 + 1000 * step + i
                          for i in range(rng.randrange(1, 3 * BLOCK_SIZE))]
                keys = Keys(hash_token_blocks(prompt + output, BLOCK_SIZE))
                keys.num_shareable_blocks = len(shared) // BLOCK_SIZE if private else len(keys)
                request = Request(str(seq_id), prompt, SamplingParams(max_tokens=len(output)),
                                  None, block_hasher=hasher)
                requests[seq_id] = (request, output, keys)
            else:
                seq_id = preempted.pop(0)
            request, _, keys = requests[seq_id]
            hit_blocks, num_hit_tokens, *_ = vllm.get_computed_blocks(request)
            num_tokens = request.num_tokens
            ok = vllm.allocate_slots(request, num_tokens - num_hit_tokens, num_hit_tokens,
                                     hit_blocks) is not None
            assert ok == kvsim.allocate(seq_id, num_tokens, keys if caching else None), step
            if ok:
                request.num_computed_tokens = num_tokens
                running.append(seq_id)
                assert kvsim.num_cached_tokens(seq_id) == num_hit_tokens, step
                num_hit += num_hit_tokens > 0
            else:
                num_failed += 1
                if op == "resume":
                    preempted.insert(0, seq_id)
        else:
            seq_id = rng.choice(running)
            request, output, _ = requests[seq_id]
            generated = request.num_tokens - request.num_prompt_tokens
            if op == "decode" and generated < len(output):
                request.append_output_token_ids(output[generated])
                ok = vllm.allocate_slots(request, 1) is not None
                assert ok == kvsim.append(seq_id, 1), step
                if ok:
                    request.num_computed_tokens += 1
                else:
                    op = "preempt"        # what vLLM's scheduler does when a decode cannot fit
            if op in ("finish", "preempt"):
                running.remove(seq_id)
                vllm.free(request)
                kvsim.free(seq_id, preempted=op == "preempt")
                if op == "preempt":
                    request.num_computed_tokens = 0
                    preempted.append(seq_id)
                    num_preempted += 1
        for seq_id in running:
            assert list(vllm.get_block_ids(str(seq_id))[0]) == kvsim.block_table(seq_id), step
        queue = [b.block_id for b in vllm.block_pool.free_block_queue.get_all_free_blocks()]
        assert queue == kvsim.pool.free_queue(), step
        assert vllm.block_pool.get_num_free_blocks() == kvsim.num_free_blocks, step
        assert abs(vllm.block_pool.get_usage() - kvsim.usage) < 1e-12, step
    kvsim.check_invariants()
    return num_hit, num_failed, num_preempted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    for seed in range(args.seeds):
        for caching, private in ((True, False), (True, True), (False, False)):
            hits, failed, preempted = run(seed, args.steps, caching, private)
            print(f"seed {seed} caching={caching} private={private}: equal over {args.steps} "
                  f"steps ({hits} admissions with hits, {failed} failed, {preempted} preempted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
