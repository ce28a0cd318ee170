"""Content keys for prefix caching: one chained key per FULL block, as vLLM hashes blocks.

A block's key depends on every token before it (the hash chains), so equal keys mean equal
prefixes and the KV of that block can be reused. Two ways to get keys:

* ``hash_token_blocks(token_ids, block_size)``: from real token ids (tests, small examples).
* ``SegmentKeys(segments, block_size)``: from a description of the sequence as runs of content,
  ``((segment_id, num_tokens), ...)``. A segment id names a run of tokens that is identical
  wherever that id appears (a shared system prompt, a Mooncake 512-token hash id, an earlier
  turn's answer, a request's own unique text). Keys are computed lazily, so memory stays
  proportional to the number of segments, never to the number of tokens.

Block ``i`` covers tokens ``[i*B, (i+1)*B)``; its key is determined by the segments before the
one holding its last token ``t = (i+1)*B - 1`` and by ``t``'s offset in that segment. This maps
keys given at one granularity (Mooncake: one id per 512 tokens) to any block size (DESIGN.md).
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

_MASK64 = (1 << 64) - 1
_TOKEN_SALT = 0x746F6B656E73  # keeps token-id keys apart from segment keys
_SEGMENT_SALT = 0x7365676D656E


def mix64(x: int) -> int:
    """splitmix64 finaliser: a cheap, deterministic 64-bit mixer (no per-process salt)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def segment_key(chain: int, offset: int) -> int:
    """Key of the block whose last token is at ``offset`` in the segment named by ``chain``."""
    return mix64(chain ^ (offset << 1 | 1))


def hash_token_blocks(token_ids: Sequence[int], block_size: int) -> list[int]:
    """One chained key per full block of ``token_ids`` (a trailing partial block gets none).

    Args:
        token_ids: the token ids of the sequence.
        block_size: tokens per block (> 0).
    Returns:
        ``len(token_ids) // block_size`` keys; key ``i`` depends on tokens ``[0, (i+1)*block_size)``.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    keys: list[int] = []
    parent = _TOKEN_SALT
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        h = parent
        for tok in token_ids[start:start + block_size]:
            h = mix64(h ^ (int(tok) & _MASK64))
        parent = mix64(h ^ block_size)
        keys.append(parent)
    return keys


class SegmentKeys(Sequence):
    """Lazy chained keys of the full blocks of a sequence made of content segments.

    Args:
        segments: ``((segment_id, num_tokens), ...)`` in order; ids are ints, lengths > 0.
        block_size: tokens per block.
        num_shareable_tokens: tokens at the start that other sequences may also hold (a shared
            prompt, earlier turns). Blocks that end past it can only ever be reused by this same
            sequence (after a preemption); a simulator may register those lazily. Defaults to
            all tokens.

    ``len(keys)`` is the number of full blocks; ``keys[i]`` the key of block ``i``.
    """

    __slots__ = ("block_size", "num_tokens", "num_shareable_tokens", "_starts", "_chains",
                 "_make_segments", "_runs", "_run_ends")

    def __init__(self, segments: Sequence[tuple[int, int]], block_size: int,
                 num_shareable_tokens: int | None = None):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self._make_segments = None
        self._runs = None
        self._build(segments)
        self.num_shareable_tokens = self.num_tokens if num_shareable_tokens is None else min(
            self.num_tokens, num_shareable_tokens)

    @classmethod
    def deferred(cls, make_segments, num_tokens: int, block_size: int,
                 num_shareable_tokens: int) -> "SegmentKeys":
        """Keys whose segments are made (``make_segments()``, which must cover ``num_tokens``)
        only when a key is first read: a simulator asks most sequences for their lengths only
        (nothing is cached yet, or their content is unique)."""
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        keys = cls.__new__(cls)
        keys.block_size = block_size
        keys.num_tokens = num_tokens
        keys.num_shareable_tokens = min(num_tokens, num_shareable_tokens)
        keys._starts = keys._chains = keys._runs = None
        keys._make_segments = make_segments
        return keys

    def _build(self, segments: Sequence[tuple[int, int]]) -> None:
        starts: list[int] = []
        chains: list[int] = []
        pos = 0
        chain = _SEGMENT_SALT
        mask = _MASK64
        for seg_id, length in segments:
            if length <= 0:
                raise ValueError(f"segment {seg_id} has length {length}; lengths must be > 0")
            starts.append(pos)
            # the chain names this segment and everything before it (ids and lengths):
            # mix64(chain ^ seg_id), then mix64(chain ^ length), inlined (two per segment)
            x = ((chain ^ (int(seg_id) & mask)) + 0x9E3779B97F4A7C15) & mask
            x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
            x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
            chain = x ^ (x >> 31)
            chains.append(chain)
            x = ((chain ^ length) + 0x9E3779B97F4A7C15) & mask
            x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
            x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
            chain = x ^ (x >> 31)
            pos += length
        self.num_tokens = pos
        self._starts = starts
        self._chains = chains

    def _build_deferred(self) -> None:
        num_tokens = self.num_tokens
        self._build(self._make_segments())
        self._make_segments = None
        if self.num_tokens != num_tokens:
            raise ValueError(f"segments cover {self.num_tokens} tokens, expected {num_tokens}")

    def __len__(self) -> int:
        return self.num_tokens // self.block_size

    @property
    def num_shareable_blocks(self) -> int:
        return self.num_shareable_tokens // self.block_size

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return [self[j] for j in range(start, stop, step)]
            return self._key_range(start, stop)
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"block {i} out of range for {n} full blocks")
        if self._chains is None:
            self._build_deferred()
        t = (i + 1) * self.block_size - 1
        s = bisect_right(self._starts, t) - 1
        return segment_key(self._chains[s], t - self._starts[s])

    def segment_runs(self, start: int, stop: int) -> list[tuple[int, int, int, int, int]]:
        """Blocks ``start..stop-1`` grouped by the segment that holds each block's last token:
        ``(chain, first_offset, j, i, i_end)`` per segment, in order.

        Blocks ``i..i_end-1`` are the segment's blocks ``j..`` (block ``j`` of a segment ends at
        offset ``j * block_size + first_offset`` in it, the same in every sequence with this
        chain, since the chain names the segment's start); block ``i``'s key is
        ``segment_key(chain, j * block_size + first_offset)``. A prefix cache can match and
        register a whole run at once instead of one key per block. The runs of all blocks
        are made once (a few per segment); a range is cut from them."""
        runs = self._runs
        if runs is None:
            runs = self._runs = self._all_runs()
        if start >= stop:
            return []
        if start == 0:                 # a prefix (look-ups): whole runs, the last one cut
            r = bisect_left(self._run_ends, stop)
            if r >= len(runs):
                return runs
            out = runs[:r]
            chain, first_offset, j, i, _i_end = runs[r]
            if i < stop:
                out.append((chain, first_offset, j, i, stop))
            return out
        # runs[r] covers blocks [runs[r][3], runs[r][4]); cut [start, stop) out of them
        r = bisect_right(self._run_ends, start)
        out = []
        while r < len(runs) and runs[r][3] < stop:
            chain, first_offset, j, i, i_end = runs[r]
            if i < start or i_end > stop:
                j += max(0, start - i)
                i, i_end = max(i, start), min(i_end, stop)
                out.append((chain, first_offset, j, i, i_end))
            else:
                out.append(runs[r])
            r += 1
        return out

    def _all_runs(self) -> list[tuple[int, int, int, int, int]]:
        if self._chains is None:
            self._build_deferred()
        size = self.block_size
        runs = []
        append = runs.append
        ends = self._starts[1:] + [self.num_tokens]
        for chain, seg_start, seg_end in zip(self._chains, self._starts, ends):
            # blocks seg_start // B .. seg_end // B - 1 end in this segment (none if it is
            # shorter than a block and holds no block end); the first ends at offset
            # (i + 1) * B - 1 - seg_start < B
            i, i_end = seg_start // size, seg_end // size
            if i_end > i:
                append((chain, (i + 1) * size - 1 - seg_start, 0, i, i_end))
        self._run_ends = [run[4] for run in runs]
        return runs

    def block_runs(self, stop: int) -> list[tuple[int, int, int]]:
        """Blocks ``0..stop-1`` grouped by the segment that holds their last token, as
        ``(segment key, first block, number of blocks)``.

        The segment key names the segment and everything before it (so also where it starts):
        blocks of two sequences have equal keys exactly when they have the same block number in
        runs with equal segment keys. A cache analysis compares runs, not blocks (a Mooncake
        512-token id is one run at any block size).
        """
        if not 0 <= stop <= len(self):
            raise IndexError(f"{stop} blocks out of range for {len(self)} full blocks")
        return [(chain, i, i_end - i)
                for chain, _first_offset, _j, i, i_end in self.segment_runs(0, stop)]

    def _key_range(self, start: int, stop: int) -> list[int]:
        """Keys of blocks ``start..stop-1`` in one walk over the segments (a slice: registering
        a prefill's blocks asks for many consecutive keys; no bisect per key)."""
        if start >= stop:
            return []
        if self._chains is None:
            self._build_deferred()
        size, starts, chains = self.block_size, self._starts, self._chains
        first_t = (start + 1) * size - 1
        s = bisect_right(starts, first_t) - 1
        num_segments = len(starts)
        next_start = starts[s + 1] if s + 1 < num_segments else None
        out = []
        for t in range(first_t, stop * size, size):      # t: the block's last token
            while next_start is not None and t >= next_start:
                s += 1
                next_start = starts[s + 1] if s + 1 < num_segments else None
            out.append(mix64(chains[s] ^ ((t - starts[s]) << 1 | 1)))   # segment_key, inlined
        return out


def rekey_blocks(block_ids: Sequence[int], key_block_tokens: int, num_tokens: int,
                 block_size: int) -> SegmentKeys:
    """Keys at ``block_size`` for a sequence whose content is given at another granularity.

    ``block_ids[j]`` identifies tokens ``[j*key_block_tokens, (j+1)*key_block_tokens)`` together
    with everything before them (Mooncake's chained 512-token ``hash_ids``); the last id may cover
    a partial block. Allocator block ``i`` (last token ``t``) is identified by
    ``(block_ids[t // key_block_tokens], t % key_block_tokens)``.
    """
    if num_tokens > len(block_ids) * key_block_tokens:
        raise ValueError(f"{len(block_ids)} ids of {key_block_tokens} tokens cannot cover "
                         f"{num_tokens} tokens")
    segments = []
    for j, bid in enumerate(block_ids):
        length = min(key_block_tokens, num_tokens - j * key_block_tokens)
        if length <= 0:
            break
        segments.append((bid, length))
    return SegmentKeys(segments, block_size)
