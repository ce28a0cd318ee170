"""``Admission``: what an admission rule decides for a waiting request, one record for every
policy and feature (``Scheduler._admission`` and its overrides return it).

    WAIT      it waits, and the waiting loop stops (FCFS: nothing behind it is admitted)
    SKIP      the KV connector cannot answer yet: the loop tries the next request
    PROMOTE   (asked without side effects) the connector would promote a disk hit: something to do
    ADMITTED  admitted, with its token counts not computed (asked for the verdict only)
    Admission(ADMIT, num_hit_tokens, num_new_tokens[, num_external_tokens])  admitted now
"""
from __future__ import annotations

from dataclasses import dataclass

ADMIT, WAITS, SKIPPED, PROMOTES = "admit", "wait", "skip", "promote"


@dataclass(frozen=True, slots=True)
class Admission:
    """An admission decision.

    verdict: ADMIT, WAITS, SKIPPED or PROMOTES (the module docstring).
    num_hit_tokens: the local prefix-cache hit it starts with (a request whose external hit was
        loaded: the tokens it has computed); -1 when not computed.
    num_new_tokens: its first chunk (0 while an external hit loads); -1 when not computed.
    num_external_tokens: tokens the KV connector loads asynchronously before it runs (0: none).
    """

    verdict: str
    num_hit_tokens: int = -1
    num_new_tokens: int = -1
    num_external_tokens: int = 0

    @property
    def admitted(self) -> bool:
        return self.verdict == ADMIT


WAIT = Admission(WAITS)
SKIP = Admission(SKIPPED)
PROMOTE = Admission(PROMOTES)
ADMITTED = Admission(ADMIT)
