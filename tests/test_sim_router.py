"""The router: which replica an arriving request goes to."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvsim.simulator.router import ROUTERS, Router, affinity_key
from kvsim.workloads import Request


def _replicas(loads):
    """Stand-ins with what a router reads: index, the scheduler's queues and the inbox (requests
    that wait for the replica's next schedule; a third load, 0 if not given)."""
    return [SimpleNamespace(index=i, sched=SimpleNamespace(running=[0] * load[0], waiting=[0] * load[1]),
                            batch=SimpleNamespace(inbox=[0] * (load[2] if len(load) > 2 else 0)))
            for i, load in enumerate(loads)]


def test_round_robin_takes_replicas_in_turn():
    reps = _replicas([(0, 0)] * 3)
    router = Router("round-robin")
    picked = [router.pick(Request(i, 0.0, 8, 4), reps).index for i in range(7)]
    assert picked == [0, 1, 2, 0, 1, 2, 0]


def test_least_loaded_counts_running_and_waiting_ties_to_lowest_index():
    router = Router("least-loaded")
    assert router.pick(Request(0, 0.0, 8, 4), _replicas([(3, 0), (1, 1), (0, 2)])).index == 1
    assert router.pick(Request(0, 0.0, 8, 4), _replicas([(2, 1), (3, 0), (0, 4)])).index == 0
    # a request that reached a replica but waits for its next schedule counts too
    assert router.pick(Request(0, 0.0, 8, 4), _replicas([(1, 0, 2), (1, 1), (4, 0)])).index == 1


def test_prefix_affinity_follows_the_conversation_and_the_shared_prefix():
    reps = _replicas([(0, 0)] * 4)
    router = Router("prefix-affinity")
    turns = [Request(i, 0.0, 8, 4, conversation_id=77, turn=i) for i in range(5)]
    assert len({router.pick(r, reps).index for r in turns}) == 1
    # the second shared segment decides (the first is often a prompt everybody shares)
    a = Request(0, 0.0, 40, 4, segments=((1, 16), (5, 16), (100, 8)), num_shareable_tokens=32)
    b = Request(1, 0.0, 40, 4, segments=((1, 16), (5, 16), (101, 8)), num_shareable_tokens=32)
    assert affinity_key(a) == affinity_key(b) == 5
    assert router.pick(a, reps) is router.pick(b, reps)
    # nothing shared: round-robin
    alone = [Request(i, 0.0, 8, 4, segments=((200 + i, 8),)) for i in range(4)]
    assert all(affinity_key(r) is None for r in alone)
    assert [router.pick(r, reps).index for r in alone] == [0, 1, 2, 3]


def test_one_replica_and_unknown_policy():
    assert Router("least-loaded").pick(Request(0, 0.0, 8, 4), _replicas([(9, 9)])).index == 0
    with pytest.raises(ValueError, match="router must be one of"):
        Router("random")
    assert set(ROUTERS) == {"round-robin", "least-loaded", "prefix-affinity"}
