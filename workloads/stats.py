"""Statistics of a workload: counts, rates, length percentiles, sharing and ideal prefix reuse."""
from __future__ import annotations

from array import array
from collections.abc import Iterable

import numpy as np

from kvsim.workloads.request import Request


class PrefixReuse:
    """Prefix-cache hits of a request stream with an unlimited cache, in arrival order.

    Equivalent to keeping every full block key (``Request.block_keys``) of every earlier
    request (prompt and output: vLLM caches generated blocks too) in a set and counting each
    new prompt's leading full blocks found there, but it works on segments instead of blocks:
    a trie over (segment id, length) paths, storing per node the longest run of each next
    segment id seen. Equal keys mean equal segment prefixes (``workloads.keys``), so the common
    prefix with any earlier request is found in O(segments), not O(tokens / block_size).
    As vLLM does, the last prompt token is always recomputed: a prompt of P tokens can hit at
    most ``(P - 1) // block_size`` blocks.
    """

    def __init__(self, block_size: int):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.num_prompt_tokens = 0
        self.num_hit_tokens = 0
        self._longest: dict[tuple[int, int], int] = {}      # (node, segment id) -> tokens
        self._child: dict[tuple[int, int, int], int] = {}   # (node, id, length) -> node

    def add(self, req: Request) -> int:
        """Count ``req``'s prompt hits, then cache its prompt and output. Returns hit tokens."""
        segments = req.prompt_segments() + ((req.output_segment(0), req.output_tokens),)
        node, pos, common = 0, 0, None
        for seg_id, length in segments:
            seen = self._longest.get((node, seg_id), 0)
            nxt = self._child.get((node, seg_id, length))
            if seen < length or nxt is None:
                common = pos + min(seen, length)
                break
            pos += length
            node = nxt
        if common is None:
            common = pos
        max_blocks = (req.prompt_tokens - 1) // self.block_size
        hit_tokens = min(common // self.block_size, max_blocks) * self.block_size
        self.num_prompt_tokens += req.prompt_tokens
        self.num_hit_tokens += hit_tokens
        node = 0
        for seg_id, length in segments:
            key = (node, seg_id)
            if self._longest.get(key, 0) < length:
                self._longest[key] = length
            node = self._child.setdefault((node, seg_id, length), len(self._child) + 1)
        return hit_tokens

    @property
    def hit_fraction(self) -> float:
        """Hit tokens over prompt tokens (0 for an empty stream)."""
        return self.num_hit_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0


def workload_stats(requests: Iterable[Request], block_size: int = 16) -> dict:
    """One pass over a request stream.

    Args:
        requests: the stream (consumed).
        block_size: block size of the ideal prefix-reuse figure.
    Returns:
        A JSON-able dict: num_requests, num_conversations, duration_s, rate_per_s,
        prompt/output mean, p50, p99, max (tokens), shareable_fraction (shareable tokens over
        prompt+output tokens), prefix_hit_fraction (unlimited cache, ``block_size``), block_size.
    """
    prompts, outputs = array("q"), array("q")
    reuse = PrefixReuse(block_size)
    conversations: set[int] = set()
    num_shareable = 0
    first_s = last_s = 0.0
    for req in requests:
        if not prompts:
            first_s = req.arrival_s
        last_s = req.arrival_s
        prompts.append(req.prompt_tokens)
        outputs.append(req.output_tokens)
        num_shareable += req.num_shareable_tokens
        if req.conversation_id is not None:
            conversations.add(req.conversation_id)
        reuse.add(req)
    n = len(prompts)
    duration_s = last_s - first_s
    out: dict = {"num_requests": n, "num_conversations": len(conversations),
                 "duration_s": duration_s,
                 "rate_per_s": (n - 1) / duration_s if duration_s > 0 else None}
    for name, values in (("prompt", prompts), ("output", outputs)):
        arr = np.frombuffer(values, dtype=np.int64) if n else np.zeros(1, dtype=np.int64)
        out[f"{name}_mean_tokens"] = float(arr.mean())
        out[f"{name}_p50_tokens"] = float(np.percentile(arr, 50))
        out[f"{name}_p99_tokens"] = float(np.percentile(arr, 99))
        out[f"{name}_max_tokens"] = int(arr.max())
    total = sum(prompts) + sum(outputs)
    out["shareable_fraction"] = num_shareable / total if total else 0.0
    out["prefix_hit_fraction"] = reuse.hit_fraction
    out["block_size"] = block_size
    return out
