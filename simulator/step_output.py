"""What one scheduling step decided: ``StepOutput`` (vLLM's ``SchedulerOutput``, reduced to what
the engine prices and records)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class StepOutput:
    """What one scheduling step decided (vLLM's SchedulerOutput, reduced to what we record).

    ``entries`` are the sequences the step handles one by one, in vLLM's order; the
    ``num_clocked`` decoding sequences on the decode clock each got one token without being
    listed (``scheduled`` rebuilds the full list when asked)."""

    entries: list                     # [(SeqState, num_new_tokens)]
    num_clocked: int = 0
    num_scheduled_tokens: int = 0
    num_prefill_tokens: int = 0
    num_decode_seqs: int = 0
    kv_read_tokens: int = 0
    attn_token_pairs: int = 0
    num_new: int = 0
    num_resumed: int = 0
    num_preempted: int = 0
    pc_queries: int = 0
    pc_hits: int = 0
    pc_preempted_queries: int = 0
    pc_preempted_hits: int = 0
    finished: list = field(default_factory=list)
    view: list | None = None          # clocked step: ``running`` when it was scheduled
    view_loose: frozenset = frozenset()  # ids of the unclocked sequences among ``view``
    num_view_entries: int = 0         # entries that belong to ``view`` (the rest were admitted)
    view_done: list | tuple = ()      # async scheduling: requests of ``view`` done in flight

    @property
    def num_seqs(self) -> int:
        """Sequences scheduled in this step."""
        return len(self.entries) + self.num_clocked

    @property
    def scheduled(self) -> list:
        """Every scheduled (SeqState, num_new_tokens) in vLLM's order (running, then admitted)."""
        if self.view is None:
            return self.entries
        listed = {id(s): n for s, n in self.entries[:self.num_view_entries]}
        # not on the clock, or done in flight (async): no token of this step (one set to test,
        # the synchronous one as it is)
        skip = self.view_loose
        if self.view_done:
            skip = skip | {id(s) for s in self.view_done}
        full = []
        for seq in self.view:
            key = id(seq)
            if key in listed:
                full.append((seq, listed[key]))
            elif key not in skip:
                full.append((seq, 1))
        return full + self.entries[self.num_view_entries:]
