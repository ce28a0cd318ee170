"""kvsim's grouped CPU-tier lookup (simulator/offload_groups.py) against vLLM 0.33's own
``OffloadingConnectorScheduler._lookup_complete_chunks`` on random cases (issue 27).

Each case: one to four KV-cache groups (full attention, sliding windows of a few tokens to a few
chunks, Mamba), chunks of 16-64 tokens, a request of up to 40 chunks with a GPU hit, and the
tier's answer per key (found, pending or missing, in runs as a tier's contents come), sometimes
keys another request is loading, a Mamba alignment or a step budget. vLLM's method runs
unchanged on its own ``GroupOffloadConfig`` and ``RequestGroupState`` records, with a manager
that answers from the case (``self`` is a stand-in holding what the method reads); kvsim's
``hit_tokens`` gets the same case. Run under the oracle venv:

    ../oracle-venv/bin/python bench/offload_group_lookup.py --cases 5000 [--seed 0] [--record F]

``--record`` writes the cases and vLLM's answers as JSON (tests/fixtures/offload_group_lookup.json
is 400 of them, seed 0), which tests/test_offload_groups.py replays without vLLM.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# a case's answers: one letter per chunk and group (h: found, p: pending, m: missing)
ANSWER = {"h": "HIT", "p": "HIT_PENDING", "m": "MISS"}


def random_case(rng: random.Random) -> dict:
    """One case as plain data (also the fixture's format)."""
    size = rng.choice([16, 32, 64])
    groups = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(["full", "full", "sliding", "sliding", "mamba"])
        if kind == "sliding":
            groups.append({"kind": "sliding", "tokens_per_chunk": size,
                           "sliding_window": rng.choice([1, 7, size - 1, size, size + 1, 2 * size,
                                                         rng.randint(2, 6 * size)]),
                           "extra_retained_tokens": rng.choice([0, 0, rng.randint(1, size)])})
        else:
            groups.append({"kind": kind, "tokens_per_chunk": size})
    num_chunks = rng.randint(1, 40)
    # a prompt ending on a chunk's edge or a token past it often: the hit's end then falls
    # inside a chunk, where a window may need one chunk more
    num_tokens = num_chunks * size + rng.choice([0, 1, rng.randint(0, size - 1)])
    hit = rng.choice([0, 0, rng.randint(0, num_chunks)]) * size
    p_miss, p_pending = rng.choice([0.0, 0.02, 0.1, 0.4]), rng.choice([0.0, 0.0, 0.03, 0.2])
    answers = []
    for g in range(len(groups)):
        state, letters = "h", []
        for c in range(num_chunks):
            r = rng.random()   # runs: a tier holds what it was given in stretches
            if r < p_miss:
                state = "m" if state != "m" else "h"
            letters.append("p" if p_miss <= r < p_miss + p_pending else state)
        answers.append("".join(letters))
    loading = [f"{g}:{c}" for g in range(len(groups)) for c in range(num_chunks)
               if rng.random() < rng.choice([0.0, 0.0, 0.05])]
    case = {"groups": groups, "num_chunks": num_chunks, "num_tokens": num_tokens,
            "num_computed_tokens": hit, "answers": answers, "being_loaded": loading}
    if any(g["kind"] == "mamba" for g in groups) and rng.random() < 0.5:
        case["mamba_align_tokens"] = rng.choice([size, 2 * size, 4 * size])
    if rng.random() < 0.3:
        case["max_new_tokens"] = rng.randint(0, num_tokens)
    return case


def letter(case: dict, key: str) -> str:
    """The case's answer letter for a key ``group:chunk``."""
    group, chunk = map(int, key.split(":"))
    return case["answers"][group][chunk]


def answer(case: dict, key: str) -> str:
    """kvsim's tier answer (allocator.offload's HIT / PENDING / MISS) for a key ``group:chunk``."""
    from kvsim.allocator.offload import HIT, MISS, PENDING

    return {"h": HIT, "p": PENDING, "m": MISS}[letter(case, key)]


def kvsim_answer(case: dict) -> int | None:
    from kvsim.simulator.offload_groups import GroupChunks, hit_tokens, sliding_window_chunks

    groups = []
    for g in case["groups"]:
        size = g["tokens_per_chunk"]
        if g["kind"] == "sliding":
            extra = g["extra_retained_tokens"]
            groups.append(GroupChunks(size, sliding_window_chunks(g["sliding_window"], size, extra),
                                      g["sliding_window"] - 1 + extra))
        else:
            groups.append(GroupChunks(size, 1 if g["kind"] == "mamba" else None))
    keys = [[f"{g}:{c}" for c in range(case["num_chunks"])] for g in range(len(groups))]
    return hit_tokens(groups, keys, lambda key: answer(case, key), case["num_computed_tokens"],
                      case["num_tokens"], being_loaded=set(case["being_loaded"]),
                      mamba_align_tokens=case.get("mamba_align_tokens"),
                      max_new_tokens=case.get("max_new_tokens"))


def vllm_answer(case: dict) -> int | None:
    """vLLM's ``_lookup_complete_chunks`` on the case."""
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler as s
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import \
        get_sliding_window_size_in_chunks
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec
    from vllm.v1.kv_offload.base import LookupResult

    configs = []
    for idx, g in enumerate(case["groups"]):
        size = g["tokens_per_chunk"]
        if g["kind"] == "sliding":
            spec = SlidingWindowSpec(block_size=size, num_kv_heads=1, head_size=1, dtype=torch.float16,
                                     sliding_window=g["sliding_window"],
                                     extra_retained_tokens=g["extra_retained_tokens"])
        elif g["kind"] == "mamba":
            spec = MambaSpec(block_size=size, shapes=((1,),), dtypes=(torch.float16,))
        else:
            spec = FullAttentionSpec(block_size=size, num_kv_heads=1, head_size=1, dtype=torch.float16)
        configs.append(s.GroupOffloadConfig(
            group_idx=idx, tokens_per_block=size, tokens_per_chunk=size, hashes_per_chunk=1,
            kv_event_group_spec=None, sliding_window_size_in_chunks=get_sliding_window_size_in_chunks(spec, size),
            kv_cache_spec=spec, manager_cls=None))
    full = tuple(i for i, c in enumerate(configs) if c.sliding_window_size_in_chunks is None)
    windowed = sorted((i for i, c in enumerate(configs) if c.sliding_window_size_in_chunks is not None),
                      key=lambda i: configs[i].sliding_window_size_in_chunks, reverse=True)
    manager = types.SimpleNamespace(lookup=lambda key, ctx: getattr(LookupResult, ANSWER[letter(case, key)]))
    me = types.SimpleNamespace(
        manager=manager, config=types.SimpleNamespace(kv_group_configs=configs),
        _lookup_groups=full + tuple(windowed), _sliding_window_groups=tuple(windowed),
        _mamba_align_size=case.get("mamba_align_tokens"), _chunks_being_loaded=set(case["being_loaded"]),
        _events_tracker=types.SimpleNamespace(record_lookup=lambda *a: None))
    cls = s.OffloadingConnectorScheduler
    me._maximal_prefix_lookup = types.MethodType(cls._maximal_prefix_lookup, me)
    me._sliding_window_lookup = types.MethodType(cls._sliding_window_lookup, me)
    states = tuple(s.RequestGroupState(offload_keys=[f"{g}:{c}" for c in range(case["num_chunks"])])
                   for g in range(len(configs)))
    status = types.SimpleNamespace(
        num_locally_computed_tokens=case["num_computed_tokens"], max_load_tokens=None,
        req=types.SimpleNamespace(num_tokens=case["num_tokens"], request_id="r"),
        group_states=states, req_context=None)
    return cls._lookup_complete_chunks(me, status, case.get("max_new_tokens"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--record", type=Path, help="write the first 400 cases and vLLM's answers here")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import kvsim
    kvsim.__path__.append(str(ROOT))   # the sub-packages' folders, as the editable install maps them
    rng = random.Random(a.seed)
    cases, differ, kinds = [], [], {"none": 0, "defer": 0, "hit": 0}
    for i in range(a.cases):
        case = random_case(rng)
        case["vllm"] = vllm_answer(case)
        kinds["defer" if case["vllm"] is None else "hit" if case["vllm"] else "none"] += 1
        if kvsim_answer(case) != case["vllm"]:
            differ.append(i)
        cases.append(case)
    print(f"{a.cases} cases (seed {a.seed}): vLLM loads in {kinds['hit']}, defers {kinds['defer']}, "
          f"loads nothing in {kinds['none']}; kvsim differs in {len(differ)}"
          + (f": {differ[:10]}" if differ else ""))
    if a.record:
        a.record.write_text(json.dumps(cases[:400], separators=(",", ":")) + "\n")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
