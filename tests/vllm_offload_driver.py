"""Drive vLLM's CPUOffloadingManager (LRU) and kvsim's OffloadTier side by side, op by op.

Needs an interpreter with vLLM 0.33 (the oracle venv); run by tests/test_allocator_offload.py or
by hand:

    ../oracle-venv/bin/python tests/vllm_offload_driver.py --seeds 20

Random requests whose chains share prefixes within 3 groups offer chunks for storing (in chain
order, as the connector does), complete stores, look their chains up and load the hit prefix,
complete loads and finish, in random interleavings. After every op: what prepare_store returned
(None, the keys to store, the evicted keys in eviction order) and the lookup state of every key
ever seen must be equal. Prints one line per run; exits non-zero at the first difference.
"""
from __future__ import annotations

import argparse
import random
import sys

import vllm_allocator_driver  # noqa: F401  (puts kvsim's folders on the import path, sets env)
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

from kvsim.allocator.offload import HIT, MISS, PENDING, OffloadTier  # noqa: E402

TOKENS_PER_CHUNK = 16
RESULT = {LookupResult.HIT: HIT, LookupResult.HIT_PENDING: PENDING, LookupResult.MISS: MISS}


def vkey(key: int):
    return make_offload_key(key.to_bytes(8, "little"), 0)


def run(seed: int, steps: int) -> tuple[int, int, int]:
    """One random run; returns (stores placed, failed offers, evictions)."""
    rng = random.Random(seed)
    num_chunks = rng.randrange(2, 14)
    vllm = CPUOffloadingManager(num_chunks=num_chunks)
    kvsim = OffloadTier(num_chunks)
    requests: dict[int, dict] = {}
    stores: list[list[int]] = []
    loads: list[list[int]] = []
    every_key: set[int] = set()
    placed = failed = evicted = 0
    for step in range(steps):
        active = [r for r, s in requests.items() if not s["finished"]]
        op = rng.choice(["new"] * 2 + ["store"] * 5 + ["complete_store"] * 3 + ["load"] * 2
                        + ["complete_load"] * 2 + ["finish"])
        if op in ("store", "load", "finish") and not active:
            op = "new"
        if op == "new":
            group = rng.randrange(3)
            chain = ([1000 * group + i for i in range(rng.randrange(0, 7))]
                     + [10**6 + 100 * step + i for i in range(rng.randrange(1, 5))])
            ctx = ReqContext(req_id=str(step))
            for i, key in enumerate(chain):
                ctx.set_offload_key_position(vkey(key), (i + 1) * TOKENS_PER_CHUNK)
            vllm.on_new_request(ctx)
            requests[step] = {"ctx": ctx, "chain": chain, "offered": 0, "finished": False}
            every_key.update(chain)
        elif op == "store":
            rid = rng.choice(active)
            state = requests[rid]
            start = state["offered"]
            stop = min(len(state["chain"]), start + rng.randrange(1, 4))
            if start == stop:
                continue
            keys = state["chain"][start:stop]
            out_v = vllm.prepare_store([vkey(k) for k in keys], state["ctx"])
            out_k = kvsim.prepare_store(rid, keys, list(range(start, stop)))
            assert (out_v is None) == (out_k is None), (seed, step, out_v, out_k)
            if out_k is None:
                failed += 1
            else:
                assert [vkey(k) for k in out_k[0]] == list(out_v.keys_to_store), (seed, step)
                assert [vkey(k) for k in out_k[1]] == list(out_v.evicted_keys), (seed, step)
                state["offered"] = stop
                if out_k[0]:
                    stores.append(out_k[0])
                placed += len(out_k[0])
                evicted += len(out_k[1])
        elif op == "complete_store" and stores:
            keys = stores.pop(rng.randrange(len(stores)))
            vllm.complete_store([vkey(k) for k in keys], None)
            kvsim.complete_store(keys)
        elif op == "load":
            rid = rng.choice(active)
            state = requests[rid]
            hits = 0
            for key in state["chain"]:
                if kvsim.lookup(key) != HIT:
                    break
                hits += 1
            if hits:
                keys = state["chain"][:hits]
                vllm.prepare_load([vkey(k) for k in keys], state["ctx"])
                kvsim.prepare_load(rid, keys, list(range(hits)))
                loads.append(keys)
        elif op == "complete_load" and loads:
            keys = loads.pop(rng.randrange(len(loads)))
            vllm.complete_load([vkey(k) for k in keys], None)
            kvsim.complete_load(keys)
        elif op == "finish":
            rid = rng.choice(active)
            requests[rid]["finished"] = True
            vllm.on_request_finished(requests[rid]["ctx"])
            kvsim.request_finished(rid)
        kvsim.check_invariants()
        for key in every_key:
            got = kvsim.lookup(key)
            want = RESULT[vllm.lookup(vkey(key), None)]
            assert got == want, (seed, step, op, key, got, want)
    return placed, failed, evicted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args()
    for seed in range(args.seeds):
        placed, failed, evicted = run(seed, args.steps)
        print(f"seed {seed}: equal over {args.steps} ops ({placed} chunks stored, {failed} "
              f"offers refused, {evicted} evictions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
