"""Drive vLLM 0.33's real KVCacheManager with hybrid KV-cache groups and kvsim's
GroupedPagedAllocator side by side, and compare them after every call.

Needs an interpreter with vLLM 0.33 (the oracle venv); run by tests/test_grouped_vs_vllm.py, or:

    ../oracle-venv/bin/python tests/vllm_hybrid_driver.py --seeds 5
    ../oracle-venv/bin/python tests/vllm_hybrid_driver.py --write-golden tests/fixtures/hybrid

A small scheduler of our own makes vLLM's calls in vLLM's order: every step starts with
``new_step_starts``; running requests first (chunked prefill, Mamba block-aligned chunks, one
token per decode; on a failed allocation the last running request is preempted, recompute);
then, if nobody was preempted, waiting requests in FCFS order (prefix lookup, the full-sequence
admission gate, the watermark). Prompts share prefixes within a few groups; outputs are unique.
After every allocation both sides must agree on success; after every lookup on the hit tokens,
every group's hit blocks and the shared-prefix boundary; after every step on every running
request's block table in every group, the whole free-queue order, the free-block count, usage
and the prefix-cache counters. Configurations: full + sliding window (gpt-oss-like), several
sliding groups + one full group (Gemma-3-like), Mamba groups + full attention (with and without
prompt checkpoints), a sliding window alone, and each with prefix caching off.

``--write-golden DIR`` stores, per configuration, the calls and vLLM's answers (gzipped JSON);
the CI test tests/test_grouped_golden.py replays them against kvsim without vLLM.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_allocator_driver  # noqa: E402,F401  (environment, vLLM imports, kvsim importer)
import torch  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, MambaSpec, SlidingWindowSpec)
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from kvsim.allocator.grouped import GroupedPagedAllocator  # noqa: E402
from kvsim.workloads.keys import hash_token_blocks  # noqa: E402
from hybrid_requests import CONFIGS, make_groups, tokens_of  # noqa: E402

def vllm_config(groups: list, num_blocks: int, block_size: int, max_model_len: int,
                caching: bool) -> tuple[KVCacheConfig, int]:
    """vLLM's KVCacheConfig for these groups and its scheduler block size."""
    specs, sizes = [], []
    for g in groups:
        common = dict(num_kv_heads=1, head_size=1, dtype=torch.float32)
        if g.kind == "full_attention":
            spec = FullAttentionSpec(block_size=block_size, **common)
        elif g.kind == "sliding_window":
            spec = SlidingWindowSpec(block_size=block_size, sliding_window=g.sliding_window,
                                     **common)
        else:
            checkpoint = g.mamba_checkpoint_alignment is not None
            spec = MambaSpec(block_size=block_size if caching else max_model_len,
                             shapes=((1,),), dtypes=(torch.float32,),
                             mamba_cache_mode="align" if caching else "none",
                             num_prefill_checkpoint_blocks=int(checkpoint and caching),
                             prefill_checkpoint_alignment=g.mamba_checkpoint_alignment)
        specs.append(spec)
        sizes.append(spec.block_size)
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec([f"layer{i}"], spec) for i, spec in enumerate(specs)],
        prefix_cache_retention_interval=0)
    return config, math.lcm(*sizes)


class Req:
    def __init__(self, seq_id: int, shape: dict, hasher):
        self.seq_id = seq_id
        self.shape = shape
        prompt, self.output = tokens_of(shape)
        self.request = Request(str(seq_id), prompt, SamplingParams(max_tokens=len(self.output)),
                               None, block_hasher=hasher)
        self.num_prompt_tokens = len(prompt)
        self.keys = hash_token_blocks(prompt + self.output, shape["block_size"])
        self.num_computed = 0

    @property
    def num_tokens(self) -> int:
        return self.request.num_tokens


def mamba_chunk(start: int, num_new: int, prefill_end: int, block_size: int, budget: int) -> int:
    """Chunks end on block boundaries during a prefill (vLLM's Mamba "align" split, without
    the checkpoint refinements our calls do not depend on)."""
    end = start + num_new
    if start >= prefill_end or end >= prefill_end:
        return num_new
    aligned = end // block_size * block_size
    if aligned > start or block_size <= budget:
        end = aligned
    return max(end - start, 0)


def run(config: str, seed: int, steps: int, caching: bool, log: list | None = None,
        lazy: bool = False, external: bool = False) -> dict:
    """One random run; returns counters. ``log`` collects the golden calls and answers.
    ``lazy``: kvsim is not told the decodes ``decode_changes_state`` says change nothing.
    ``external``: some admissions load tokens after their hit, as from a KV connector (blocks
    allocated uncached, the request waits 1-3 steps, then its loaded blocks are cached and it
    is scheduled before the waiting queue, vLLM's order)."""
    rng = random.Random(seed * 7919 + len(config))
    groups = make_groups(CONFIGS[config])
    block_size = rng.choice([2, 4])
    num_blocks = rng.randrange(24, 90)
    max_model_len = 96 * block_size
    budget = rng.choice([6, 12, 32, 64])
    max_num_seqs = rng.choice([3, 6, 64])
    watermark = rng.choice([0.0, 0.0, 0.05])
    config_v, sched_block = vllm_config(groups, num_blocks, block_size, max_model_len, caching)
    vllm = KVCacheManager(config_v, max_model_len=max_model_len, scheduler_block_size=sched_block,
                          hash_block_size=block_size if caching else sched_block,
                          max_in_flight_tokens=budget, enable_caching=caching, log_stats=True,
                          watermark=watermark)
    hasher = None
    if caching:
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        hasher = get_request_block_hasher(block_size, hash_fn)
    kvsim = GroupedPagedAllocator(num_blocks, block_size, groups, enable_prefix_caching=caching,
                                  max_model_len=max_model_len, max_num_batched_tokens=budget)
    watermark_blocks = int(watermark * num_blocks)
    has_mamba = any(g.kind == "mamba" for g in groups)
    params = dict(config=config, seed=seed, caching=caching, block_size=block_size,
                  num_blocks=num_blocks, max_model_len=max_model_len, budget=budget,
                  groups=CONFIGS[config])
    if log is not None:
        log.append(["config", params])
    reqs: dict[int, Req] = {}
    waiting: list[Req] = []
    running: list[Req] = []
    stats = dict(hits=0, failed=0, preempted=0, finished=0, swa_frees=0, skipped=0, loads=0)
    holding: list[list] = []      # [request, the step its load is done, cached yet]
    loads = external and caching and not has_mamba

    def allocate(r: Req, num_new: int, hit=None, hit_v=None, admission=False) -> bool:
        free_before = vllm.block_pool.get_num_free_blocks()
        kw = {}
        if admission:
            kw = dict(num_new_computed_tokens=hit.num_tokens, new_computed_blocks=hit_v,
                      full_sequence_must_fit=True, has_scheduled_reqs=bool(running))
        ok_v = vllm.allocate_slots(r.request, num_new, **kw) is not None
        if lazy and not admission and num_new == 1 and r.num_computed >= r.num_prompt_tokens \
                and not kvsim.decode_changes_state(r.seq_id, r.num_computed):
            # a decode kvsim may skip: vLLM's call must have succeeded and changed nothing
            assert ok_v, f"step {step}: a skipped decode of seq {r.seq_id} failed in vLLM"
            stats["skipped"] += 1
            return True
        wm = watermark_blocks if (admission and running) else 0
        ok_k = kvsim.allocate_slots(r.seq_id, num_new, num_computed_tokens=r.num_computed,
                                    num_tokens=r.num_tokens,
                                    num_prompt_tokens=r.num_prompt_tokens,
                                    block_hashes=r.keys if caching else None, hit=hit,
                                    full_sequence_must_fit=admission, watermark_blocks=wm)
        assert ok_v == ok_k, (f"step {step}: seq {r.seq_id} allocate({num_new}) vLLM {ok_v} "
                              f"kvsim {ok_k}")
        if not ok_v and vllm.block_pool.get_num_free_blocks() > free_before:
            stats["swa_frees"] += 1
        if log is not None:
            log.append(["alloc", r.seq_id, num_new, r.num_computed, r.num_tokens,
                        int(admission), wm, int(ok_v)])
        return ok_v

    def free(r: Req, preempted: bool) -> None:
        vllm.free(r.request)
        kvsim.free(r.seq_id, preempted=preempted)
        if log is not None:
            log.append(["free", r.seq_id, int(preempted)])

    for step in range(steps):
        burst_group = rng.randrange(3)     # a burst shares one prefix group
        for _ in range(rng.choice([0, 0, 0, 1, 1, 2, 3])):
            seq_id = len(reqs)
            shared = rng.randrange(1, 12 * block_size)
            shape = dict(group=burst_group, shared=shared,
                         unique=rng.choice([0, 0, rng.randrange(1, 8 * block_size)]),
                         output=rng.randrange(1, 24), base=seq_id, block_size=block_size)
            r = Req(seq_id, shape, hasher)
            if r.num_tokens + len(r.output) > max_model_len:
                continue
            reqs[seq_id] = r
            waiting.append(r)
            if log is not None:
                log.append(["new", seq_id, shape])
        vllm.new_step_starts()
        kvsim.new_step()
        if log is not None:
            log.append(["step"])
        token_budget = budget
        scheduled: list[tuple[Req, int]] = []
        preempted_any = False
        i = 0
        while i < len(running) and token_budget > 0:
            r = running[i]
            num_new = min(r.num_tokens - r.num_computed, token_budget,
                          max_model_len - r.num_computed - 1)
            if has_mamba and caching:
                num_new = mamba_chunk(r.num_computed, num_new,
                                      max(r.num_prompt_tokens, r.num_tokens - 1), block_size,
                                      budget)
            if num_new <= 0:
                i += 1
                continue
            ok = False
            while True:
                if allocate(r, num_new):
                    ok = True
                    break
                victim = running.pop()
                free(victim, True)
                victim.num_computed = 0
                victim.request.num_computed_tokens = 0
                victim.request.status = RequestStatus.PREEMPTED
                victim.request.num_preemptions += 1
                waiting.insert(0, victim)
                stats["preempted"] += 1
                preempted_any = True
                if victim is r:
                    break
            if not ok:
                break
            scheduled.append((r, num_new))
            token_budget -= num_new
            i += 1
        blocked = False
        for entry in list(holding):       # vLLM drains the requests holding blocks first
            if preempted_any or token_budget <= 0 or len(running) >= max_num_seqs:
                break
            r, done, cached = entry
            if done > step:
                continue
            if not cached:                # _update_waiting_for_remote_kv
                vllm.cache_blocks(r.request, r.num_computed)
                kvsim.cache_blocks(r.seq_id, r.num_computed)
                entry[2] = True
            num_new = min(r.num_tokens - r.num_computed, token_budget)
            ok_v = vllm.allocate_slots(r.request, num_new, full_sequence_must_fit=True,
                                       has_scheduled_reqs=bool(running)) is not None
            ok_k = kvsim.allocate_slots(r.seq_id, num_new, num_computed_tokens=r.num_computed,
                                        num_tokens=r.num_tokens,
                                        num_prompt_tokens=r.num_prompt_tokens,
                                        full_sequence_must_fit=True,
                                        watermark_blocks=watermark_blocks if running else 0)
            assert ok_v == ok_k, f"step {step}: loaded seq {r.seq_id} vLLM {ok_v} kvsim {ok_k}"
            if not ok_v:
                blocked = True
                break
            holding.remove(entry)
            running.append(r)
            r.request.status = RequestStatus.RUNNING
            scheduled.append((r, num_new))
            token_budget -= num_new
        while not preempted_any and not blocked and token_budget > 0 and waiting and \
                len(running) < max_num_seqs:
            r = waiting[0]
            hit_v, hit_tokens_v, boundary = vllm.get_computed_blocks(r.request)
            r.request.shared_prefix_boundary = boundary
            hit = kvsim.find_cache_hit(r.keys if caching else None, r.num_tokens)
            assert hit.num_tokens == hit_tokens_v, (
                f"step {step}: seq {r.seq_id} hit vLLM {hit_tokens_v} kvsim {hit.num_tokens}")
            assert [list(b) for b in hit.blocks] == [
                [blk.block_id for blk in g] for g in hit_v.blocks], f"step {step}: hit blocks"
            assert hit.shared_prefix_boundary == boundary, f"step {step}: shared boundary"
            if log is not None:
                log.append(["hit", r.seq_id, r.num_tokens, hit.num_tokens,
                            [list(b) for b in hit.blocks], boundary])
            stats["hits"] += hit.num_tokens > 0
            first_block, last_block = hit.num_tokens // block_size + 1, \
                (r.num_tokens - 1) // block_size
            if loads and first_block <= last_block and rng.random() < 0.35:
                ext = rng.randint(first_block, last_block) * block_size - hit.num_tokens
                reserved = rng.choice([0, 0, 1, 3])
                ok_v = vllm.allocate_slots(
                    r.request, 0, num_new_computed_tokens=hit.num_tokens,
                    new_computed_blocks=hit_v, num_external_computed_tokens=ext,
                    delay_cache_blocks=True, full_sequence_must_fit=True,
                    reserved_blocks=reserved, has_scheduled_reqs=bool(running)) is not None
                ok_k = kvsim.allocate_slots(
                    r.seq_id, 0, num_computed_tokens=0, num_tokens=r.num_tokens,
                    num_prompt_tokens=r.num_prompt_tokens, block_hashes=r.keys, hit=hit,
                    full_sequence_must_fit=True,
                    watermark_blocks=watermark_blocks if running else 0,
                    num_external_computed_tokens=ext, delay_cache_blocks=True,
                    reserved_blocks=reserved)
                assert ok_v == ok_k, f"step {step}: load of seq {r.seq_id} vLLM {ok_v} {ok_k}"
                if not ok_v:
                    stats["failed"] += 1
                    break
                vllm.record_prefix_cache_stats(r.request, hit.num_tokens)
                waiting.pop(0)
                r.num_computed = r.request.num_computed_tokens = hit.num_tokens + ext
                holding.append([r, step + rng.randint(1, 3), False])
                stats["loads"] += 1
                continue
            num_new = min(r.num_tokens - hit.num_tokens, token_budget)
            if has_mamba and caching:
                num_new = mamba_chunk(hit.num_tokens, num_new,
                                      max(r.num_prompt_tokens, r.num_tokens - 1), block_size,
                                      budget)
                if num_new == 0:
                    break
            if not allocate(r, num_new, hit, hit_v, admission=True):
                stats["failed"] += 1
                break
            vllm.record_prefix_cache_stats(r.request, hit.num_tokens)   # as the scheduler does
            waiting.pop(0)
            running.append(r)
            r.num_computed = hit.num_tokens
            r.request.num_computed_tokens = hit.num_tokens
            r.request.status = RequestStatus.RUNNING
            scheduled.append((r, num_new))
            token_budget -= num_new
        for r, num_new in scheduled:
            if r not in running:
                continue
            r.num_computed += num_new
            r.request.num_computed_tokens = r.num_computed
            if r.num_computed == r.num_tokens:
                generated = r.num_tokens - r.num_prompt_tokens
                r.request.append_output_token_ids(r.output[generated])
                if generated + 1 >= len(r.output):
                    running.remove(r)
                    free(r, False)
                    stats["finished"] += 1
        compare(vllm, kvsim, running, step)
        if log is not None:
            log.append(["state", observe(vllm, running)])
    kvsim.check_invariants()
    return stats


def observe(vllm: KVCacheManager, running: list[Req]) -> dict:
    """What both sides must agree on after a step (vLLM's side)."""
    pcs = vllm.prefix_cache_stats
    return {
        "tables": {str(r.seq_id): [list(ids) for ids in vllm.get_block_ids(str(r.seq_id))]
                   for r in running},
        "free_queue": [b.block_id
                       for b in vllm.block_pool.free_block_queue.get_all_free_blocks()],
        "num_free": vllm.block_pool.get_num_free_blocks(),
        "prefix": [pcs.queries, pcs.hits, pcs.preempted_queries, pcs.preempted_hits],
    }


def compare(vllm: KVCacheManager, kvsim: GroupedPagedAllocator, running: list[Req],
            step: int) -> None:
    expected = observe(vllm, running)
    for r in running:
        got = [list(t) for t in kvsim.block_tables(r.seq_id)]
        assert got == expected["tables"][str(r.seq_id)], (
            f"step {step}: seq {r.seq_id} tables vLLM {expected['tables'][str(r.seq_id)]} "
            f"kvsim {got}")
    assert kvsim.pool.free_queue() == expected["free_queue"], f"step {step}: free queue"
    assert kvsim.num_free_blocks == expected["num_free"], f"step {step}: free blocks"
    assert abs(kvsim.usage - vllm.usage) < 1e-12, f"step {step}: usage"
    got = [kvsim.num_queried_tokens, kvsim.num_hit_tokens, kvsim.num_preempted_queried_tokens,
           kvsim.num_preempted_hit_tokens]
    assert got == expected["prefix"], f"step {step}: prefix stats vLLM {expected['prefix']} {got}"
    kvsim.check_invariants()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS))
    parser.add_argument("--external", action="store_true",
                        help="some admissions load tokens after their hit (a KV connector)")
    parser.add_argument("--lazy", action="store_true",
                        help="skip kvsim's decode calls that decode_changes_state rules out")
    parser.add_argument("--write-golden", metavar="DIR",
                        help="write one JSON of calls and answers per configuration")
    args = parser.parse_args()
    for config in args.configs:
        for caching in (True, False):
            for seed in range(args.seeds):
                stats = run(config, seed, args.steps, caching, lazy=args.lazy,
                            external=args.external)
                print(f"{config} caching={caching} seed {seed}: equal over {args.steps} steps "
                      + " ".join(f"{k}={v}" for k, v in stats.items()), flush=True)
    if args.write_golden:
        out = Path(args.write_golden)
        out.mkdir(parents=True, exist_ok=True)
        for config in args.configs:
            for caching in (True, False):
                # the first seed whose run hits, fails an admission and preempts
                for seed in range(1000, 1050):
                    log: list = []
                    stats = run(config, seed, 120, caching, log)
                    if stats["failed"] and stats["preempted"] and (stats["hits"] or not caching):
                        break
                path = out / f"{config}{'' if caching else '_no_caching'}.json.gz"
                path.write_bytes(gzip.compress(
                    json.dumps(log, separators=(",", ":")).encode(), mtime=0))
                print(f"wrote {path} ({len(log)} records, "
                      + " ".join(f"{k}={v}" for k, v in stats.items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
