"""GroupedPagedAllocator replays the calls of tests/vllm_hybrid_driver.py and must give vLLM
0.33's answers (recorded in tests/fixtures/hybrid/*.json.gz): allocation results, prefix hits
(tokens, every group's blocks, the shared-prefix boundary) and, after every step, every running
request's block table per group, the free-queue order, the free-block count and the prefix
counters. Regenerate with ``../oracle-venv/bin/python tests/vllm_hybrid_driver.py --seeds 0
--write-golden tests/fixtures/hybrid``."""
import gzip
import json
from pathlib import Path

import pytest

from hybrid_requests import make_groups, tokens_of
from kvsim.allocator.grouped import GroupedPagedAllocator
from kvsim.workloads.keys import hash_token_blocks

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "hybrid").glob("*.json.gz"))


def replay(records: list) -> dict:
    """Replay one golden run; returns counts of what was checked."""
    checked = dict(allocations=0, hits=0, states=0)
    alloc = keys = hits = params = None
    step = -1
    for record in records:
        kind, args = record[0], record[1:]
        if kind == "config":
            params = args[0]
            alloc = GroupedPagedAllocator(
                params["num_blocks"], params["block_size"], make_groups(params["groups"]),
                enable_prefix_caching=params["caching"], max_model_len=params["max_model_len"],
                max_num_batched_tokens=params["budget"])
            keys, hits = {}, {}
        elif kind == "new":
            seq_id, shape = args
            prompt, output = tokens_of(shape)
            keys[seq_id] = (hash_token_blocks(prompt + output, shape["block_size"]), len(prompt))
        elif kind == "step":
            step += 1
            alloc.new_step()
        elif kind == "hit":
            seq_id, num_tokens, hit_tokens, blocks, boundary = args
            hit = alloc.find_cache_hit(keys[seq_id][0] if params["caching"] else None, num_tokens)
            assert (hit.num_tokens, [list(b) for b in hit.blocks], hit.shared_prefix_boundary) \
                == (hit_tokens, blocks, boundary), f"step {step}: seq {seq_id} hit"
            hits[seq_id] = hit
            checked["hits"] += 1
        elif kind == "alloc":
            seq_id, num_new, num_computed, num_tokens, admission, watermark, ok = args
            block_hashes, num_prompt = keys[seq_id]
            got = alloc.allocate_slots(
                seq_id, num_new, num_computed_tokens=num_computed, num_tokens=num_tokens,
                num_prompt_tokens=num_prompt,
                block_hashes=block_hashes if params["caching"] else None,
                hit=hits.get(seq_id) if admission else None,
                full_sequence_must_fit=bool(admission), watermark_blocks=watermark)
            assert got == bool(ok), f"step {step}: seq {seq_id} allocate({num_new}): {got}"
            checked["allocations"] += 1
        elif kind == "free":
            alloc.free(args[0], preempted=bool(args[1]))
        elif kind == "state":
            expected = args[0]
            for seq_id, tables in expected["tables"].items():
                assert [list(t) for t in alloc.block_tables(int(seq_id))] == tables, \
                    f"step {step}: seq {seq_id} block tables"
            assert alloc.pool.free_queue() == expected["free_queue"], f"step {step}: free queue"
            assert alloc.num_free_blocks == expected["num_free"]
            assert [alloc.num_queried_tokens, alloc.num_hit_tokens,
                    alloc.num_preempted_queried_tokens, alloc.num_preempted_hit_tokens] \
                == expected["prefix"], f"step {step}: prefix counters"
            alloc.check_invariants()
            checked["states"] += 1
        else:
            raise AssertionError(f"unknown record {kind!r}")
    return checked


def test_golden_files_cover_every_configuration():
    names = {p.name.split(".")[0].removesuffix("_no_caching") for p in FIXTURES}
    from hybrid_requests import CONFIGS
    assert names == set(CONFIGS), names


@pytest.mark.parametrize("path", FIXTURES, ids=[p.name.split(".")[0] for p in FIXTURES])
def test_grouped_allocator_replays_vllm_hybrid_manager(path):
    checked = replay(json.loads(gzip.decompress(path.read_bytes())))
    assert checked["states"] >= 100 and checked["allocations"] > 100, checked
