"""What the scheduler tracks per sequence: ``SeqState`` (vLLM's ``Request`` as the scheduler sees
it), ``ForkGroup`` (the sequences of one forked request) and the status codes.

Shared by every scheduling policy and by the modules that speed the scheduler up (decode clock,
decode runs, forks): the counters mean what vLLM's do (``num_computed_tokens``, ``num_tokens``,
``num_output_tokens``), plus a few fields that only those speed-ups read.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from operator import attrgetter

# vLLM's RequestStatus, reduced to what the synchronous scheduler distinguishes
WAITING, RUNNING, PREEMPTED, FINISHED = 0, 1, 2, 3


@dataclass(slots=True)
class SeqState:
    """One sequence the scheduler tracks (a request, or one sample/beam of a forked request)."""

    seq_id: int                      # allocator sequence id
    req: object                      # the workloads.Request
    num_prompt_tokens: int
    max_output_tokens: int           # output_tokens capped by max_model_len - prompt
    arrival_ns: int
    keys: object = None              # block keys (SegmentKeys) of prompt + output, or None
    status: int = WAITING
    num_output_tokens: int = 0       # sampled so far
    num_tokens: int = 0              # prompt + outputs so far (kept in step with num_output_tokens)
    num_computed_tokens: int = 0     # tokens whose KV is computed or scheduled this step
    num_alloc_tokens: int = 0        # tokens the allocator has been told about (<= computed)
    num_preemptions: int = 0
    eager: bool = False              # output blocks are shareable: register them as they fill
    plain: bool = True               # not eager, not forked: decodes may be told lazily
    group: object = None             # ForkGroup for n > 1 / beams, else None
    sample: int = 0                  # sample / beam index within the group
    # recorded times (ns) and steps; -1 = not yet
    first_sched_ns: int = -1
    first_token_ns: int = -1
    finish_ns: int = -1
    first_sched_step: int = -1
    first_token_step: int = -1
    finish_step: int = -1
    cached_tokens_first: int = -1
    num_cached_tokens_total: int = 0  # prefix-hit tokens over all admissions
    # decode clock (decode_clock.py): while ``clocked``, num_computed_tokens is as of the
    # clock's c == base_c and num_output_tokens / num_tokens as of its o == base_o; the true
    # values add how far those clocks have moved since (``DecodeClock.counters``)
    order: int = 0                    # admission counter: ``running`` is sorted by it
    clocked: bool = False
    base_c: int = 0
    base_o: int = 0
    fin: int = 0                      # output clock at which it has all its tokens
    bucket: int = 0                   # crossing bucket: needs a block when c % B == bucket
    # async scheduling (async_scheduling.py): step sequence numbers of the last step that listed
    # it, that gave it a token, and that it entered with its input token still in flight
    sched_seq: int = -1
    sampled_seq: int = -1
    inflight_seq: int = -1
    sched_tokens: int = 0             # tokens it was given in step ``sched_seq`` (KV-cache groups)


@dataclass(slots=True)
class ForkGroup:
    """Sequences of one request that share blocks (parallel samples or beams; forks.py)."""

    request_id: int
    kind: str                         # "sample" or "beam"
    width: int
    members: list = field(default_factory=list)   # SeqState, index = sample/beam
    rng: random.Random | None = None
    recorded: bool = False            # the request's row was written (once, when all finish)


ORDER = attrgetter("order")           # sort key: running order (``SeqState.order``)
