"""The request record every workload source yields, and the content ids it is made of.

Content identity (DESIGN.md): a request's prompt is described as runs of content,
``segments = ((segment_id, num_tokens), ...)``; a segment id names a run of tokens that is
identical wherever that id appears after the same earlier segments. ``block_keys`` turns the
prompt segments plus the output into lazy chained block keys (``workloads.keys.SegmentKeys``) at
any block size, so a request costs memory proportional to its segments, never to its tokens::

    prompt                                             output (sample j)
    | system prompt (shared) | earlier turns | new msg || generated tokens |
    '------ num_shareable_tokens ------------'

Segment ids from different sources never meet in one run, but ids we derive ourselves (the unique
prompt/output of a request, a synthetic conversation's turns) live in separate namespaces of a
64-bit mixer so that they cannot collide by construction of small integers.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kvsim.workloads.keys import SegmentKeys, mix64

# namespaces of derived segment ids (arbitrary distinct constants)
NS_PROMPT = 0x70726F6D7074      # unique prompt content of a request
NS_OUTPUT = 0x6F7574707574      # output of a request (sample 0)
NS_SAMPLE = 0x73616D706C65      # output of sample j > 0 of a parallel-sampling request
NS_GROUP = 0x67726F7570         # a named prefix group (vllm-oracle traces)
NS_SYSTEM = 0x73797374656D      # a synthetic shared system prompt
NS_USER = 0x75736572            # a synthetic conversation's user message
NS_TURN_OUTPUT = 0x7475726E     # a synthetic conversation's turn output


def derived_id(namespace: int, *values: int) -> int:
    """A 64-bit segment id for ``values`` in ``namespace`` (deterministic, no process salt)."""
    h = mix64(namespace)
    for v in values:
        h = mix64(h ^ (v & 0xFFFFFFFFFFFFFFFF))
    return h


def label_id(namespace: int, label: str) -> int:
    """A 64-bit segment id for a text label (Python's ``hash()`` is salted per process)."""
    digest = hashlib.blake2b(label.encode("utf-8"), digest_size=8).digest()
    return derived_id(namespace, int.from_bytes(digest, "little"))


@dataclass(slots=True)
class Request:
    """One inference request.

    ``num_shareable_tokens`` follows the source: a Mooncake prompt (its ids are shared prefixes),
    a shared system prompt's L tokens, a conversation's history, the prompt of a request with
    several samples (its siblings hold it); 0 for unique content.
    """

    request_id: int
    arrival_s: float                 # from the start of the workload (first request at 0)
    prompt_tokens: int
    output_tokens: int
    # content of the PROMPT: ((segment_id, num_tokens), ...), lengths sum to prompt_tokens;
    # () = unique content
    segments: tuple[tuple[int, int], ...] = ()
    output_segment_id: int | None = None  # None: derived from request_id (unique output)
    num_shareable_tokens: int = 0    # leading tokens of prompt+output other sequences may hold
    conversation_id: int | None = None
    turn: int = 0                    # 0-based turn within the conversation
    n: int = 1                       # parallel samples
    beam_width: int = 1
    arrival_step: int | None = None  # vllm-oracle traces: arrival in engine steps

    def __post_init__(self):
        # programming errors only: loaders validate user input first and raise InputError
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(f"request {self.request_id}: prompt_tokens and output_tokens must "
                             f"be >= 1, got {self.prompt_tokens} and {self.output_tokens}")
        if self.segments and sum(n for _, n in self.segments) != self.prompt_tokens:
            raise ValueError(f"request {self.request_id}: segments cover "
                             f"{sum(n for _, n in self.segments)} tokens, prompt has "
                             f"{self.prompt_tokens}")
        if not 0 <= self.num_shareable_tokens <= self.prompt_tokens + self.output_tokens:
            raise ValueError(f"request {self.request_id}: num_shareable_tokens "
                             f"{self.num_shareable_tokens} outside [0, prompt+output]")
        if self.n < 1 or self.beam_width < 1:
            raise ValueError(f"request {self.request_id}: n and beam_width must be >= 1, "
                             f"got {self.n} and {self.beam_width}")

    def prompt_segments(self) -> tuple[tuple[int, int], ...]:
        """The prompt's segments; a unique prompt is one segment derived from request_id."""
        return self.segments or ((derived_id(NS_PROMPT, self.request_id), self.prompt_tokens),)

    def output_segment(self, sample: int = 0) -> int:
        """Segment id of the output of ``sample`` (samples of one request differ)."""
        base = (derived_id(NS_OUTPUT, self.request_id) if self.output_segment_id is None
                else self.output_segment_id)
        return base if sample == 0 else derived_id(NS_SAMPLE, base, sample)

    def block_keys(self, block_size: int, sample: int = 0) -> SegmentKeys:
        """Chained keys of the full blocks of prompt + output of one sample.

        Args:
            block_size: allocator block size in tokens.
            sample: which parallel sample / beam (0-based); its output content differs from
                the other samples', its prompt is the same.
        Returns:
            ``SegmentKeys`` of ``prompt_tokens + output_tokens`` tokens, with
            ``num_shareable_tokens`` set; its segments are made when a key is first read.
        """
        if not 0 <= sample < max(self.n, self.beam_width):
            raise ValueError(f"request {self.request_id}: sample {sample} out of range for "
                             f"n={self.n}, beam_width={self.beam_width}")
        return SegmentKeys.deferred(
            lambda: self.prompt_segments() + ((self.output_segment(sample), self.output_tokens),),
            self.prompt_tokens + self.output_tokens, block_size, self.num_shareable_tokens)
