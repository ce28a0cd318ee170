"""The CPU tier's lookup over KV-cache groups (simulator/offload_groups.py) against vLLM 0.33's
own ``_lookup_complete_chunks``: the 400 random cases bench/offload_group_lookup.py recorded with
vLLM's answers (seed 0; the script checks any number more under the oracle venv), and cases
worked by hand from vLLM's rules."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bench.offload_group_lookup import kvsim_answer
from kvsim.allocator.offload import HIT, MISS, PENDING
from kvsim.simulator.offload_groups import GroupChunks, hit_tokens, lookup_order, sliding_window_chunks

FIXTURE = Path(__file__).parent / "fixtures" / "offload_group_lookup.json"
S = 16    # tokens per chunk
FULL = GroupChunks(S)


def sliding(window_tokens: int) -> GroupChunks:
    return GroupChunks(S, sliding_window_chunks(window_tokens, S), window_tokens - 1)


def lookup(groups, letters, num_computed, num_tokens, **kw):
    answers = {"h": HIT, "p": PENDING, "m": MISS}
    keys = [[(g, c) for c in range(len(letters[g]))] for g in range(len(groups))]
    return hit_tokens(groups, keys, lambda key: answers[letters[key[0]][key[1]]], num_computed,
                      num_tokens, **kw)


def test_every_recorded_case_answers_as_vllm_does():
    cases = json.loads(FIXTURE.read_text())
    assert len(cases) == 400
    for i, case in enumerate(cases):
        assert kvsim_answer(case) == case["vllm"], (i, case)
    # the cases reach every outcome often (defer, nothing, a load), windowed and Mamba groups among them
    outcomes = Counter("defer" if c["vllm"] is None else "load" if c["vllm"] else "none" for c in cases)
    assert len(outcomes) == 3 and min(outcomes.values()) > 50
    assert sum(any(g["kind"] == "sliding" for g in c["groups"]) for c in cases) > 100
    assert sum(any(g["kind"] == "mamba" for g in c["groups"]) for c in cases) > 50


def test_a_full_attention_group_loads_its_run_from_the_gpu_hit():
    # chunks 0-1 on the GPU, 2-3 in the tier, 4 missing: 2 chunks load
    assert lookup([FULL], ["hhhhmh"], 2 * S, 6 * S + 5) == 2 * S
    assert lookup([FULL], ["hhmhhh"], 2 * S, 6 * S) == 0          # the chunk after the hit misses
    assert lookup([FULL], ["hhhphh"], 2 * S, 6 * S) is None       # one still being written
    assert lookup([FULL], ["hhhhhh"], 2 * S, 6 * S, being_loaded={(0, 3)}) is None
    assert lookup([FULL], ["hhhhhh"], 2 * S, 6 * S, being_loaded={(0, 0)}) == 4 * S  # on the GPU


def test_a_sliding_window_group_needs_only_the_last_window_before_the_end():
    two = sliding(2 * S)        # two chunks back from the last token
    assert two.window_chunks == 2 and lookup_order([FULL, two, sliding(5 * S)]) == ((0, 2, 1), (2, 1))
    # a miss early on does not matter: the last two chunks are there; the hit stops a token
    # short of the prompt (its last token is computed again)
    assert lookup([two], ["mmhmhh"], 0, 6 * S) == 6 * S - 1
    # the last chunk missing: the hit ends where the last full window ends
    assert lookup([two], ["hhmhhm"], 0, 6 * S + 3) == 5 * S
    # a window cut short by the start of the search counts what it has (one chunk past the GPU hit)
    assert lookup([two], ["hhhmmm"], 2 * S, 6 * S + 3) == S
    # with a full-attention group too, the shorter of the two holds
    assert lookup([FULL, two], ["hhhmhh", "hhhhhh"], 0, 6 * S + 3) == 3 * S


def test_a_window_is_looked_up_again_when_a_later_group_lowers_the_end():
    wide, narrow = sliding(3 * S), sliding(S)
    # the wide window finds chunks 3-5 (end 6), the narrow one only chunk 3 at its end: the end
    # falls to 4 chunks, where the wide window (chunks 1-3) has a hole at 2: it ends at 2 chunks
    letters = ["hmmhhh", "hhhhmm"]
    assert lookup([wide, narrow], letters, 0, 6 * S + 3) == S
    # its first window is wider when the end is not on a chunk's edge
    assert sliding(2 * S).load_window(6 * S - 1) == 2 and sliding(2 * S + 3).load_window(6 * S - 5) == 3
    # a window of one chunk keeping one token more (extra_retained_tokens 1) needs two chunks at a
    # hit ending a token short of a chunk's edge: the last chunk alone does not do
    kept = GroupChunks(S, sliding_window_chunks(S, S, 1), S)
    assert kept.window_chunks == 1 and lookup([kept], ["hhhhmh"], 0, 6 * S) == 4 * S
    assert lookup([kept], ["hhhhmh"], 0, 6 * S + 1) == 6 * S   # ends on the edge: one chunk


@pytest.mark.parametrize("mamba_align, expect", [(None, 6 * S - 1), (4 * S, 4 * S)])
def test_a_mamba_group_aligns_the_end(mamba_align, expect):
    mamba = GroupChunks(S, 1)
    assert lookup([FULL, mamba], ["hhhhhh", "hhhhhh"], 0, 6 * S, mamba_align_tokens=mamba_align) == expect


def _grouped_connector_with_disk(cpu_chunks: int):
    from kvsim.simulator.offload import TierConfig
    from kvsim.simulator.offload_grouped import GroupedOffloadConnector

    tiers = [TierConfig("cpu", cpu_chunks, 1024, 1e9), TierConfig("disk", 64, 1024, 1e9)]
    return GroupedOffloadConnector(tiers, S, [FULL, sliding(S)],
                                   [lambda start, stop, boundaries: None] * 2)


def test_a_grouped_lookup_promotes_what_only_the_disk_has():
    # vLLM's tiering manager under the grouped lookup: chunks 0-3 of both groups on disk only;
    # asked without side effects the lookup says it would promote; asked for real it promotes
    # every chunk it meets (the CPU tier has room) and defers the request until they are read
    from kvsim.simulator.offload import WOULD_PROMOTE

    conn = _grouped_connector_with_disk(cpu_chunks=32)
    keys = list(range(100, 105))                 # 5 chunks of 16 tokens
    stored = [(k, g) for g in range(2) for k in keys[:4]]
    assert conn.disk.prepare_store("other", stored, None)[0] == stored
    conn.disk.complete_store(stored)
    assert conn.lookup("r", keys, 80, 0, peek=True) == WOULD_PROMOTE
    assert all(conn.cpu.lookup(k) == MISS for k in stored)          # nothing promoted
    assert conn.lookup("r", keys, 80, 0) is None                    # deferred: promoting
    # full attention reads chunks 0-3 from the GPU hit on; the window only its last one
    promoting = {k for k in stored if conn.cpu.lookup(k) == PENDING}
    assert {(k, 0) for k in keys[:4]} <= promoting and (keys[3], 1) in promoting


def test_a_grouped_lookup_with_a_full_cpu_tier_misses_disk_chunks():
    # no room in the CPU tier (every chunk pinned by a pending store): a disk-only chunk is a
    # miss, as vLLM's _initiate_promotion answers when the primary tier cannot take it
    conn = _grouped_connector_with_disk(cpu_chunks=2)
    keys = list(range(200, 205))
    assert conn.cpu.prepare_store("x", ["a", "b"], None)[0] == ["a", "b"]   # pending: pinned
    stored = [(k, g) for g in range(2) for k in keys[:4]]
    conn.disk.prepare_store("other", stored, None)
    conn.disk.complete_store(stored)
    assert conn.lookup("r", keys, 80, 0) == 0
