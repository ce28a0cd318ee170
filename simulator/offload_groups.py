"""The offloading connector's lookup over KV-cache groups: how many tokens the CPU tier adds after
a GPU hit when the model's layers are in several groups (issue 27: groups x a CPU tier).

vLLM 0.33's ``OffloadingConnectorScheduler`` keys a request's chunks per group (a block hash
and the group's index) and finds the tokens it can load in ``_lookup_complete_chunks``:

* the groups are looked up in a fixed order: the full-attention groups (in their order), then
  the windowed ones (sliding window, chunked local attention, Mamba) by window, widest first;
* a full-attention group needs every chunk from the GPU hit on: the hit is its run of
  consecutive chunks found from the start (``_maximal_prefix_lookup``);
* a windowed group needs only the last window before the hit's end: scanning back from the end,
  the hit ends where the last run of ``window`` consecutive chunks ends; a run that reaches the
  end may need a wider first window (``load_window_size_in_chunks``: the window in tokens plus
  the part of the chunk past the hit's end); a run cut short by the start counts what it has
  (``_sliding_window_lookup``);
* each group can only lower the hit (never below one chunk past the GPU hit, else nothing
  loads); when a group lowers it below what an earlier one found, the windowed groups are
  looked up again at the new end, until it holds (a deferred answer: every group again);
* with a windowed group the last prompt token is always recomputed (the hit ends a token short
  of the prompt), and with a Mamba group the end is a multiple of its alignment;
* a chunk still being written answers "pending": the whole lookup defers (None), as it does
  when any chunk of the hit is being loaded for another request.

This module is pure (no simpy, no numpy): ``hit_tokens`` takes the groups, the request's keys
per group and a ``find(key)`` answering HIT, PENDING or MISS (allocator.offload's answers, the
CPU tier's ``lookup``). What it leaves out of vLLM's: EAGLE draft groups, ``max_load_tokens``
and partial-tail chunks (kvsim models none of them), and the backend's RETRY (kvsim's tiers
answer at once). bench/offload_group_lookup.py checks it against vLLM's own method on random
cases; tests/test_offload_groups.py against the cases it recorded.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass

from kvsim.allocator.offload import MISS, PENDING
from kvsim.simulator.kv_slots import cdiv


@dataclass(frozen=True)
class GroupChunks:
    """One KV-cache group as the connector sees it.

    Attributes:
        tokens_per_chunk: tokens a chunk of this group holds (its block size x blocks per chunk).
        window_chunks: the chunks the group needs before the hit's end (vLLM's
            ``sliding_window_size_in_chunks``); None: full attention (every chunk).
        reach_tokens: a sliding-window group's tokens back from the last one that attention
            reads or keeps (``sliding_window - 1 + extra_retained_tokens``); None for the other
            kinds, whose window in chunks is fixed.
    """

    tokens_per_chunk: int
    window_chunks: int | None = None
    reach_tokens: int | None = None

    def load_window(self, end_tokens: int) -> int | None:
        """The window of a lookup whose hit would end at ``end_tokens`` (vLLM's
        ``load_window_size_in_chunks``): wider by the chunk's part past the end."""
        if self.reach_tokens is None:
            return self.window_chunks
        padding = -end_tokens % self.tokens_per_chunk
        return max(self.window_chunks, cdiv(self.reach_tokens + padding, self.tokens_per_chunk))


def sliding_window_chunks(sliding_window: int, tokens_per_chunk: int, extra_retained_tokens: int = 0) -> int:
    """A sliding-window group's window in chunks (vLLM's ``get_sliding_window_size_in_chunks``)."""
    return max(cdiv(sliding_window, tokens_per_chunk),
               cdiv(sliding_window - 1 + extra_retained_tokens, tokens_per_chunk))


def lookup_order(groups: Sequence[GroupChunks]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(every group in lookup order, the windowed ones in that order): full attention first in
    index order, then the windowed groups widest first (equal windows in index order)."""
    full = [i for i, g in enumerate(groups) if g.window_chunks is None]
    windowed = sorted((i for i, g in enumerate(groups) if g.window_chunks is not None),
                      key=lambda i: groups[i].window_chunks, reverse=True)
    return tuple(full + windowed), tuple(windowed)


def _prefix_hits(keys: Sequence[Hashable], find: Callable[[Hashable], str]) -> int | None:
    """Consecutive chunks found from the start; None: one of them is pending."""
    hits, defer = 0, False
    for key in keys:
        found = find(key)
        if found == MISS:
            break
        hits += 1
        defer |= found == PENDING
    return None if defer else hits


def _window_end(keys: Sequence[Hashable], window: int, first_window: int,
                find: Callable[[Hashable], str]) -> int | None:
    """Where the last run of ``window`` consecutive found chunks ends, scanning from the end
    (the run at the end needs ``first_window``); a run cut by the start: its length; 0: none;
    None: a pending chunk in the run that decided."""
    pending, run, need = False, 0, first_window
    for idx in range(len(keys) - 1, -1, -1):
        found = find(keys[idx])
        if found == MISS:
            run, pending, need = 0, False, window
        else:
            run += 1
            pending |= found == PENDING
        if run == need:
            return None if pending else idx + need
    return None if pending else run


def hit_tokens(groups: Sequence[GroupChunks], keys: Sequence[Sequence[Hashable]],
               find: Callable[[Hashable], str], num_computed_tokens: int, num_tokens: int, *,
               being_loaded: Collection[Hashable] = (), mamba_align_tokens: int | None = None,
               max_new_tokens: int | None = None) -> int | None:
    """Tokens the tier adds after a GPU hit of ``num_computed_tokens`` (0: nothing to load;
    None: defer the request), as vLLM 0.33's ``_lookup_complete_chunks`` (module doc).

    Args:
        groups: the KV-cache groups, in their index order.
        keys: each group's chunk keys, in order (at least ``num_tokens // tokens_per_chunk``).
        find: the tier's answer for a key (HIT, PENDING or MISS).
        num_computed_tokens: the GPU hit.
        num_tokens: the request's tokens (prompt and output so far).
        being_loaded: keys other requests are loading now (a hit on one defers).
        mamba_align_tokens: a Mamba group's alignment (the hit's end is a multiple of it).
        max_new_tokens: at most this many tokens past the GPU hit.
    """
    order, windowed = lookup_order(groups)
    max_hit = num_tokens
    if max_new_tokens is not None:
        max_hit = min(max_hit, num_computed_tokens + max_new_tokens)
    if windowed:
        max_hit -= 1        # the last prompt token is computed again for its logits
        if mamba_align_tokens is not None:
            max_hit -= max_hit % mamba_align_tokens
    found_tokens, defer, todo = 0, False, order
    while todo:
        looked_windowed, current, todo = False, todo, ()
        for g in current:
            group, group_keys = groups[g], keys[g]
            size = group.tokens_per_chunk
            max_hit = min(max_hit, len(group_keys) * size)
            if max_hit - num_computed_tokens < size:
                return 0
            num_chunks = min(cdiv(max_hit, size), len(group_keys))
            start = num_computed_tokens // size
            window = group_keys[start:num_chunks]
            if group.window_chunks is None:
                hits = _prefix_hits(window, find)
            else:
                first = group.load_window(min(max_hit, num_chunks * size))
                hits = _window_end(window, group.window_chunks, first, find)
            if hits == 0:
                return 0
            if hits is None:
                defer = True
            else:
                max_hit = min(max_hit, size * (start + hits))
            new = max_hit - num_computed_tokens
            if new < size:
                return 0
            if new < found_tokens:
                if defer:           # every group again: does it still defer?
                    defer, todo = False, order
                elif looked_windowed and not todo:   # the windows again, at the new end
                    todo = windowed
            looked_windowed |= group.window_chunks is not None
            found_tokens = new
    if defer:
        return None
    if being_loaded and _any_being_loaded(groups, keys, num_computed_tokens, found_tokens, being_loaded):
        return None
    return found_tokens


def _any_being_loaded(groups: Sequence[GroupChunks], keys: Sequence[Sequence[Hashable]],
                      num_computed_tokens: int, found_tokens: int,
                      being_loaded: Collection[Hashable]) -> bool:
    """Whether a chunk the load would read (a windowed group: its last window) is being loaded."""
    end = num_computed_tokens + found_tokens
    for group, group_keys in zip(groups, keys):
        size = group.tokens_per_chunk
        read = group_keys[num_computed_tokens // size:cdiv(end, size)]
        window = group.load_window(end)
        if window is not None:
            read = read[-window:]
        if any(key in being_loaded for key in read):
            return True
    return False
