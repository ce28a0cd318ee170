"""The router: which replica serves an arriving request.

* ``round-robin``: replicas in turn.
* ``least-loaded``: fewest running + waiting requests, those that reached a replica but wait for
  its next schedule included (ties: the lowest index).
* ``prefix-affinity``: a hash of the request's conversation, or of its shared prompt prefix
  (``affinity_key``), so that requests that can share KV land on the same replica's prefix
  cache; round-robin for a request that shares nothing.
"""
from __future__ import annotations

from kvsim.allocator import mix64
from kvsim.simulator.config import ROUTERS   # the choices live with the other light config names


def affinity_key(req) -> int | None:
    """What prefix-affinity routing hashes: the conversation, else the second shared prompt
    segment (the first is often a prompt every request shares, e.g. Mooncake's block 0), else
    the first; None (round-robin) for a request that shares nothing."""
    if req.conversation_id is not None:
        return req.conversation_id
    key = None
    end = 0
    for seg_id, length in req.segments[:2]:
        end += length
        if end > req.num_shareable_tokens:
            break
        key = seg_id
    return key


class Router:
    """Picks a replica per request under one of ``ROUTERS``.

    Args:
        policy: "round-robin", "least-loaded" or "prefix-affinity".
    """

    def __init__(self, policy: str):
        if policy not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {policy!r}")
        self.policy = policy
        self.rr_next = 0

    def pick(self, req, replicas: list):
        """The replica (an item of ``replicas``, each with ``.index``, ``.sched`` and
        ``.batch.inbox``, the requests its scheduler has not seen yet) for ``req``."""
        if len(replicas) == 1:
            return replicas[0]
        if self.policy == "least-loaded":
            return min(replicas,
                       key=lambda r: (len(r.sched.running) + len(r.sched.waiting) + len(r.batch.inbox), r.index))
        key = affinity_key(req) if self.policy == "prefix-affinity" else None
        if key is None:
            rep = replicas[self.rr_next % len(replicas)]
            self.rr_next += 1
            return rep
        return replicas[mix64(key & 0xFFFFFFFFFFFFFFFF) % len(replicas)]
