"""Hit-rate curves: the one-pass LRU curve and MIN against brute-force caches and the allocator."""
from collections import OrderedDict
from dataclasses import replace
from functools import lru_cache
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvsim.allocator import PagedAllocator
from kvsim.allocator.block_stream import block_stream
from kvsim.allocator.cache_curve import lru_curve, min_hit_blocks
from kvsim.errors import InputError
from kvsim.simulator import EngineConfig, FixedStepCost, simulate
from kvsim.workloads import Request


# ---- workloads -----------------------------------------------------------------------------
@st.composite
def conversations(draw, max_requests=12, aligned_prompts=True, block_sizes=(1, 2, 4, 8)):
    """Requests whose prompts share prefixes: a prefix of an earlier prompt (segment ids from a
    small alphabet, so equal content also arises by chance, with partial-segment overlaps), an
    earlier request's whole prompt and answer (a later turn), then new segments."""
    reqs = []
    for i in range(draw(st.integers(1, max_requests))):
        segments = []
        if reqs and draw(st.booleans()):
            base = reqs[draw(st.integers(0, len(reqs) - 1))]
            if draw(st.booleans()):      # next turn: the base's prompt and answer
                segments = list(base.segments) + [(base.output_segment(), base.output_tokens)]
            else:
                segments = list(base.segments[:draw(st.integers(0, len(base.segments)))])
        segments += draw(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12)),
                                  min_size=0 if segments else 1, max_size=3))
        prompt = sum(n for _, n in segments)
        output = draw(st.integers(1, 12))
        reqs.append(Request(request_id=i, arrival_s=float(i), prompt_tokens=prompt,
                            output_tokens=output, segments=tuple(segments),
                            num_shareable_tokens=prompt + output))
    block_size = draw(st.sampled_from(block_sizes))
    if not aligned_prompts:
        reqs = [_unaligned(r, block_size) for r in reqs]
    return reqs, block_size


def _unaligned(req: Request, block_size: int) -> Request:
    """The same request with one more prompt token where its prompt is a multiple of the block
    size (then vLLM may recompute a cached last block into a duplicate: condition 2)."""
    if req.prompt_tokens % block_size:
        return req
    segments = req.segments + ((99, 1),)
    return replace(req, prompt_tokens=req.prompt_tokens + 1, segments=segments,
                   num_shareable_tokens=req.num_shareable_tokens + 1)


def _held_tokens(req: Request) -> int:
    return req.prompt_tokens + req.output_tokens - 1


# ---- brute-force references ----------------------------------------------------------------
def brute_lru_hit_blocks(reqs, block_size, capacity, free_queue=True):
    """A literal LRU cache of ``capacity`` blocks, key by key (no stack property used). With
    ``free_queue``, a request that left a partly filled block (uncached, reused first by the
    next request) hides the least recent cached block from the next lookup."""
    cache: OrderedDict = OrderedDict()      # first = most recent
    hits = hidden = 0
    for req in reqs:
        held = _held_tokens(req)
        keys = list(req.block_keys(block_size))[:held // block_size]
        cap = (req.prompt_tokens - 1) // block_size
        visible = set(list(cache)[:max(0, capacity - hidden)])
        h = 0
        while h < cap and keys[h] in visible:
            h += 1
        hits += h
        for key in reversed(keys):          # freed tail first: the head ends most recent
            cache.pop(key, None)
            cache[key] = True
            cache.move_to_end(key, last=False)
        while len(cache) > capacity:
            cache.popitem(last=True)
        hidden = int(free_queue and held % block_size != 0)
    return hits


def allocator_hit_tokens(reqs, block_size, num_blocks):
    """The real PagedAllocator, one request at a time: allocate the prompt, grow by the output,
    free (what a replay does when requests never overlap)."""
    alloc = PagedAllocator(num_blocks, block_size, enable_prefix_caching=True, null_block=True)
    for req in reqs:
        keys = req.block_keys(block_size)
        assert alloc.allocate(req.request_id, req.prompt_tokens, keys)
        assert alloc.append(req.request_id, _held_tokens(req) - req.prompt_tokens)
        alloc.check_invariants()
        alloc.free(req.request_id)
    return alloc.num_hit_tokens


def exhaustive_optimum(reqs, block_size, capacity):
    """The best total hit blocks of any policy keeping at most ``capacity`` blocks between
    requests (exhaustive search over what to keep)."""
    chains, caps = [], []
    for req in reqs:
        keys = list(req.block_keys(block_size))[:_held_tokens(req) // block_size]
        chains.append(tuple(keys))
        caps.append((req.prompt_tokens - 1) // block_size)

    @lru_cache(maxsize=None)
    def best(r, cache):
        if r == len(chains):
            return 0
        keys, h = chains[r], 0
        while h < caps[r] and keys[h] in cache:
            h += 1
        candidates = sorted(set(cache) | set(keys))
        options = [frozenset(c) for k in range(min(capacity, len(candidates)) + 1)
                   for c in combinations(candidates, k)]
        return h + max(best(r + 1, c) for c in options)

    return best(0, frozenset())


# ---- LRU -----------------------------------------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(conversations())
def test_lru_curve_equals_a_literal_lru_cache_at_every_size(case):
    reqs, bs = case
    stream = block_stream(reqs, bs)
    for free_queue in (True, False):
        curve = lru_curve(stream, free_queue=free_queue)
        top = curve.max_useful_blocks + 2
        sizes = np.arange(0, top + 1)
        got = curve.hit_blocks(sizes)
        want = [brute_lru_hit_blocks(reqs, bs, c, free_queue) for c in sizes]
        assert got.tolist() == want


@settings(max_examples=100, deadline=None)
@given(conversations(aligned_prompts=False, block_sizes=(2, 4, 8)))  # B = 1: all aligned
def test_lru_curve_equals_the_allocator_run_one_request_at_a_time(case):
    reqs, bs = case
    curve = lru_curve(block_stream(reqs, bs))
    smallest = max(-(-_held_tokens(r) // bs) for r in reqs)   # the pool must hold each request
    for usable in range(smallest, curve.max_useful_blocks + 3):
        assert allocator_hit_tokens(reqs, bs, usable + 1) == curve.hit_tokens(usable), usable


def test_a_block_aligned_prompt_fully_cached_is_the_one_allocator_difference():
    # b repeats a's 16-token prompt: vLLM recomputes its last block into a second block with the
    # same key (condition 2 of cache_curve's doc) and keeps both; with 6 usable blocks, g's new
    # block then evicts x, which the key model (one slot per key) still holds for f
    z = Request(0, 0.0, 5, 1, segments=((5, 5),), num_shareable_tokens=6)
    a = Request(1, 1.0, 16, 1, segments=((1, 16),), num_shareable_tokens=17)
    b = Request(2, 2.0, 16, 1, segments=((1, 16),), num_shareable_tokens=17)
    g = Request(3, 3.0, 4, 1, segments=((6, 4),), num_shareable_tokens=5)
    f = Request(4, 4.0, 9, 1, segments=((5, 5), (7, 4)), num_shareable_tokens=10)
    reqs = [z, a, b, g, f]
    curve = lru_curve(block_stream(reqs, 4))
    assert curve.hit_tokens(6) == 3 * 4 + 4             # b hits 3 blocks (its cap), f hits x
    assert allocator_hit_tokens(reqs, 4, 6 + 2) == curve.hit_tokens(6)  # room for the copy
    assert allocator_hit_tokens(reqs, 4, 6 + 1) == curve.hit_tokens(6) - 4


@settings(max_examples=60, deadline=None)
@given(conversations())
def test_curves_are_monotone_and_min_is_never_below_lru(case):
    reqs, bs = case
    stream = block_stream(reqs, bs)
    curve = lru_curve(stream)
    pure = lru_curve(stream, free_queue=False)
    sizes = np.arange(0, max(pure.max_useful_blocks, curve.max_useful_blocks) + 3)
    opt = min_hit_blocks(stream, sizes)
    lru = curve.hit_blocks(sizes)
    assert (np.diff(lru) >= 0).all() and (np.diff(opt) >= 0).all()
    assert (opt >= pure.hit_blocks(sizes)).all() and (pure.hit_blocks(sizes) >= lru).all()
    # with room for every block, every policy hits everything that was ever computed before
    assert opt[-1] == lru[-1] == pure.hit_blocks(sizes[-1])


@settings(max_examples=60, deadline=None)
@given(conversations(max_requests=5))
def test_min_is_the_optimum_of_an_exhaustive_search(case):
    reqs, bs = case
    stream = block_stream(reqs, bs)
    if stream.num_distinct_blocks > 9:
        reqs = reqs[:2]
        stream = block_stream(reqs, bs)
    if stream.num_distinct_blocks > 9:
        return                       # too many subsets to enumerate
    for capacity in range(0, 5):
        assert min_hit_blocks(stream, [capacity])[0] == exhaustive_optimum(reqs, bs, capacity)


def test_min_beats_lru_where_lru_evicts_what_comes_back():
    # A, B, A, B ... with room for one: LRU always evicts the block about to be asked for
    reqs = [Request(i, float(i), 17, 1, segments=((i % 2, 17),), num_shareable_tokens=18)
            for i in range(6)]
    stream = block_stream(reqs, 16)
    assert lru_curve(stream, free_queue=False).hit_blocks(1) == 0
    assert min_hit_blocks(stream, [1])[0] == 2     # keep A for request 2 and 4


def test_hit_rate_and_the_smallest_size_for_a_target():
    reqs = [Request(i, float(i), 40, 3, segments=((7, 33), (100 + i, 7)),
                    num_shareable_tokens=43) for i in range(4)]
    curve = lru_curve(block_stream(reqs, 8))
    # every request after the first hits the 4 shared blocks (32 tokens) of its 40-token prompt
    assert curve.hit_rate(curve.max_useful_blocks) == pytest.approx(3 * 32 / 160)
    size = curve.smallest_size_for(0.6)
    assert curve.hit_rate(size) >= 0.6 > curve.hit_rate(size - 1)
    assert curve.smallest_size_for(0.61) is None


def test_max_model_len_rejects_and_truncates_like_the_engine():
    reqs = [Request(0, 0.0, 100, 50, segments=((1, 100),)),
            Request(1, 1.0, 40, 200, segments=((1, 40),)),
            Request(2, 2.0, 60, 5, segments=((1, 60),))]
    stream = block_stream(reqs, 16, max_model_len=100)
    assert stream.num_rejected == 1 and stream.request_ids.tolist() == [1, 2]
    assert stream.num_blocks.tolist() == [99 // 16, 64 // 16]   # output stops at 100 tokens
    with pytest.raises(InputError, match="serves no request"):
        block_stream(reqs[:1], 16, max_model_len=100)
    with pytest.raises(InputError, match="block_size"):
        block_stream(reqs, 0)


# ---- against full replays --------------------------------------------------------------------
def _one_at_a_time(reqs, gap_s=1000.0):
    return [replace(r, arrival_s=i * gap_s) for i, r in enumerate(reqs)]


def _replay_hit_tokens(reqs, block_size, num_blocks):
    config = EngineConfig(allocator="paged", block_size=block_size, num_blocks=num_blocks,
                          null_block=True, max_num_seqs=256, max_num_batched_tokens=2048,
                          max_model_len=8192, enable_prefix_caching=True)
    summary = simulate(iter(reqs), config, FixedStepCost(0.01), progress=False).summary
    assert summary["requests_rejected"] == 0 and summary["num_preemptions"] == 0
    return summary["prefix_hit_tokens"], summary["prefix_query_tokens"]


def test_lru_curve_equals_full_replays_at_five_sizes():
    rng = np.random.default_rng(3)
    reqs = []
    for i in range(120):                     # a system prompt, conversations of 1-4 turns
        if reqs and rng.random() < 0.5:
            base = reqs[int(rng.integers(len(reqs)))]
            segments = base.segments + ((base.output_segment(), base.output_tokens),)
        else:
            segments = ((0, 300),)
        segments += ((10_000 + i, int(rng.integers(20, 400))),)
        prompt, output = sum(n for _, n in segments), int(rng.integers(1, 200))
        reqs.append(_unaligned(Request(i, 0.0, prompt, output, segments=segments,
                                       num_shareable_tokens=prompt + output), 16))
    reqs = _one_at_a_time(reqs)
    curve = lru_curve(block_stream(reqs, 16))
    smallest = max(-(-_held_tokens(r) // 16) for r in reqs)
    sizes = np.unique(np.geomspace(smallest, curve.max_useful_blocks, 6).astype(int))
    assert len(sizes) >= 5
    rates = []
    for usable in sizes:
        hit, query = _replay_hit_tokens(reqs, 16, int(usable) + 1)
        assert hit == curve.hit_tokens(usable)
        assert query == curve.num_query_tokens
        rates.append(hit / query)
    assert rates[0] < rates[-1]              # the sizes span evictions, not only a full cache


@pytest.mark.shared
def test_mooncake_excerpt_curve_equals_replays_one_request_at_a_time(shared_traces):
    from kvsim import workloads
    reqs = list(workloads.load(shared_traces / "mooncake" / "conversation_trace.jsonl",
                               max_requests=400))
    reqs = _one_at_a_time([_unaligned(r, 16) for r in reqs if r.prompt_tokens < 16_000])
    curve = lru_curve(block_stream(reqs, 16))
    smallest = max(-(-_held_tokens(r) // 16) for r in reqs)
    sizes = np.unique(np.geomspace(smallest, curve.max_useful_blocks, 5).astype(int))
    for usable in sizes:
        config = EngineConfig(allocator="paged", block_size=16, num_blocks=int(usable) + 1,
                              null_block=True, max_num_seqs=256, max_num_batched_tokens=8192,
                              max_model_len=131072, enable_prefix_caching=True)
        summary = simulate(iter(reqs), config, FixedStepCost(0.01), progress=False).summary
        assert summary["prefix_hit_tokens"] == curve.hit_tokens(usable)


def tier_hit_blocks(reqs, block_size, num_chunks):
    """kvsim's OffloadTier (vLLM's CPU offloading manager) alone, one request at a time, as the
    connector drives it: look up the chain, load the hit, offer every prompt chunk, finish."""
    from kvsim.allocator.offload import HIT, OffloadTier
    tier = OffloadTier(num_chunks)
    hits = 0
    for req in reqs:
        keys = list(req.block_keys(block_size))[:req.prompt_tokens // block_size]
        h = 0
        while h < len(keys) and tier.lookup(keys[h]) == HIT:
            h += 1
        hits += h
        tier.prepare_load(req.request_id, keys[:h], list(range(h)))
        tier.complete_load(keys[:h])
        placed = tier.prepare_store(req.request_id, keys[h:], list(range(h, len(keys))))
        assert placed is not None
        tier.complete_store(placed[0])
        tier.request_finished(req.request_id)
        tier.check_invariants()
    return hits


@settings(max_examples=100, deadline=None)
@given(conversations())
def test_prompt_only_curve_equals_the_offload_tier_run_one_request_at_a_time(case):
    reqs, bs = case
    curve = lru_curve(block_stream(reqs, bs, prompt_only=True), free_queue=False)
    smallest = max(r.prompt_tokens // bs for r in reqs)   # an offer larger than the tier fails
    for chunks in range(max(1, smallest), curve.max_useful_blocks + 3):
        assert tier_hit_blocks(reqs, bs, chunks) == curve.hit_blocks(chunks), chunks
