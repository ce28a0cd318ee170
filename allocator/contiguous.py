"""ContiguousAllocator: one contiguous extent per sequence, reserved at admission (Orca-style).

The baselines of the vLLM paper (section 1, Figure 2). A sequence cannot grow in place past its
extent, so the whole extent is reserved when it is admitted, sized by a policy:

* ``max``: max_model_len tokens, whatever the request;
* ``pow2``: the prompt plus the output length rounded up to a power of two, capped at
  max_model_len -- the vLLM paper's "Orca (Pow2)", which "over-reserves the space for outputs by at
  most 2x. For example, if the true output length is 25, it reserves 32 positions for outputs"
  (section 6.1). Only the output is rounded: rounding prompt + output instead would, on a buddy
  arena, hand out exactly Oracle's extent and make the two baselines indistinguishable;
* ``oracle``: exactly prompt + output (knows the future: a lower bound on waste).

and placed by an arena: ``buddy`` (rounded up to a power of two) or ``first-fit`` (exact size).
The prompt length is passed as ``num_prompt_tokens`` (default: the tokens present at admission);
it is not the first prefill chunk, which may be smaller, nor, for a preempted sequence that is
recomputed, the prompt plus the tokens it had generated.
Accounting of one extent (``final`` = prompt + output tokens)::

    [ token states | reservation     | internal fragmentation | external (buddy rounding) ]
    0          num_tokens          final                   reserved                  extent

so the over-reservation of the output by ``pow2`` or ``max`` is internal fragmentation and the
buddy rounding on top of it external fragmentation.
"""
from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from kvsim.allocator.accounting import (EXTERNAL, FREE, INTERNAL, RESERVATION, TOKEN_STATES,
                                  PoolSnapshot, check_breakdown, make_breakdown)
from kvsim.allocator.buddy import BuddyArena
from kvsim.allocator.checks import (owner_codes, require_int, require_live, require_new_seq_id,
                                    snapshot_order)
from kvsim.allocator.first_fit import FirstFitArena

POLICIES = ("max", "pow2", "oracle")
PLACEMENTS = {"buddy": BuddyArena, "first-fit": FirstFitArena}


class _Extent:
    __slots__ = ("offset", "num_tokens", "final_num_tokens", "reserved_tokens", "extent_tokens")

    def __init__(self, offset, num_tokens, final_num_tokens, reserved_tokens, extent_tokens):
        self.offset = offset
        self.num_tokens = num_tokens
        self.final_num_tokens = final_num_tokens    # max(requested final, num_tokens)
        self.reserved_tokens = reserved_tokens      # what the policy reserved
        self.extent_tokens = extent_tokens          # what the arena handed out (>= reserved)


class ContiguousAllocator:
    """Per-sequence contiguous reservations on a buddy or first-fit arena.

    Args:
        capacity_tokens: token slots in the pool.
        policy: "max", "pow2" or "oracle" (see module doc).
        max_model_len: longest sequence allowed; the ``max`` policy reserves it.
        placement: "buddy" or "first-fit".
    """

    def __init__(self, capacity_tokens: int, policy: str = "max", max_model_len: int = 2048,
                 placement: str = "buddy"):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {tuple(PLACEMENTS)}, got {placement!r}")
        capacity_tokens = require_int("capacity_tokens", capacity_tokens, 1)
        max_model_len = require_int("max_model_len", max_model_len, 1)
        self.capacity_tokens = capacity_tokens
        self.policy = policy
        self.max_model_len = max_model_len
        self.placement = placement
        self.arena = PLACEMENTS[placement](capacity_tokens)
        self._seqs: dict[int, _Extent] = {}
        # sums over live sequences, so breakdown() is O(1)
        self._num_tokens = self._num_final_tokens = self._num_reserved = self._num_extent = 0

    # ---- queries ---------------------------------------------------------------------------
    def reservation_tokens(self, final_num_tokens: int, *,
                           num_prompt_tokens: int | None = None) -> int:
        """Tokens the policy reserves for a request.

        Args:
            final_num_tokens: prompt + output tokens the request will reach.
            num_prompt_tokens: its prompt tokens (only ``pow2`` reads it: it rounds the output
                ``final_num_tokens - num_prompt_tokens`` up to a power of two). None: the whole
                request is prompt (nothing to round).
        Returns:
            max_model_len (``max``); num_prompt_tokens + next_pow2(output), capped at
            max_model_len (``pow2``); final_num_tokens (``oracle``). Never below final_num_tokens.
        """
        final_num_tokens = require_int("final_num_tokens", final_num_tokens, 1)
        if final_num_tokens > self.max_model_len:
            raise ValueError(f"final_num_tokens {final_num_tokens} exceeds max_model_len "
                             f"{self.max_model_len}")
        if num_prompt_tokens is None:
            num_prompt_tokens = final_num_tokens
        num_prompt_tokens = require_int("num_prompt_tokens", num_prompt_tokens, 1)
        if num_prompt_tokens > final_num_tokens:
            raise ValueError(f"num_prompt_tokens {num_prompt_tokens} exceeds final_num_tokens "
                             f"{final_num_tokens}")
        if self.policy == "max":
            return self.max_model_len
        if self.policy == "pow2":
            num_output_tokens = final_num_tokens - num_prompt_tokens
            if num_output_tokens == 0:
                return final_num_tokens
            rounded = num_prompt_tokens + (1 << (num_output_tokens - 1).bit_length())
            return min(rounded, self.max_model_len)   # >= final: final <= max_model_len
        return final_num_tokens

    def extent_tokens(self, final_num_tokens: int, *,
                      num_prompt_tokens: int | None = None) -> int:
        """Slots the arena takes for that request (buddy: reservation rounded to a power of 2).

        Args: as reservation_tokens().
        """
        return self.arena.extent_slots(
            self.reservation_tokens(final_num_tokens, num_prompt_tokens=num_prompt_tokens))

    def can_allocate(self, num_tokens: int, final_num_tokens: int, *,
                     num_prompt_tokens: int | None = None) -> bool:
        """Whether allocate() would succeed now (raises on the same bad arguments)."""
        return self.arena.can_allocate(
            self._check_request(num_tokens, final_num_tokens, num_prompt_tokens)[2])

    @property
    def num_free_tokens(self) -> int:
        return self.arena.num_free_slots

    @property
    def usage(self) -> float:
        """Fraction of the pool held by extents."""
        return 1.0 - self.arena.num_free_slots / self.capacity_tokens

    @property
    def seq_ids(self) -> list[Hashable]:
        return list(self._seqs)

    def num_tokens(self, seq_id: Hashable) -> int:
        return self._seq(seq_id).num_tokens

    def block_table(self, seq_id: Hashable) -> list[int]:
        """The slots of the sequence's extent (its cells in the snapshot)."""
        ext = self._seq(seq_id)
        return list(range(ext.offset, ext.offset + ext.extent_tokens))

    def slot_mapping(self, seq_id: Hashable) -> list[int]:
        ext = self._seq(seq_id)
        return list(range(ext.offset, ext.offset + ext.num_tokens))

    # ---- operations ------------------------------------------------------------------------
    def allocate(self, seq_id: Hashable, num_tokens: int, final_num_tokens: int, *,
                 num_prompt_tokens: int | None = None) -> bool:
        """Reserve an extent for a new sequence holding ``num_tokens`` now.

        Args:
            seq_id: new sequence id, any hashable: an int >= 0, or a string such as vLLM's
                request ids.
            num_tokens: tokens the sequence holds now (its prompt, or a first prefill chunk).
            final_num_tokens: prompt + output tokens it will reach (the policy sizes from it).
            num_prompt_tokens: its prompt tokens, 1 <= num_prompt_tokens <= final_num_tokens
                (``pow2`` rounds the output up from there). None: num_tokens.
        Returns:
            False, with nothing changed, if no hole is large enough.
        """
        seq_id = require_new_seq_id(seq_id, self._seqs)
        num_tokens, final_num_tokens, reserved = self._check_request(
            num_tokens, final_num_tokens, num_prompt_tokens)
        offset = self.arena.allocate(reserved)
        if offset is None:
            return False
        ext = _Extent(offset, num_tokens, final_num_tokens, reserved,
                      self.arena.extent_slots(reserved))
        self._seqs[seq_id] = ext
        self._num_tokens += num_tokens
        self._num_final_tokens += final_num_tokens
        self._num_reserved += reserved
        self._num_extent += ext.extent_tokens
        return True

    def append(self, seq_id: Hashable, num_tokens: int = 1) -> bool:
        """Grow a sequence inside its extent; False (nothing changed) past the reservation."""
        ext = self._seq(seq_id)
        num_tokens = require_int("num_tokens", num_tokens)
        new_num_tokens = ext.num_tokens + num_tokens
        if new_num_tokens > ext.reserved_tokens:
            return False
        self._num_tokens += num_tokens
        ext.num_tokens = new_num_tokens
        if new_num_tokens > ext.final_num_tokens:   # ran past the announced output length
            self._num_final_tokens += new_num_tokens - ext.final_num_tokens
            ext.final_num_tokens = new_num_tokens
        return True

    def free(self, seq_id: Hashable, preempted: bool = False) -> None:
        """Release the sequence's extent (``preempted`` is accepted for symmetry; no cache)."""
        ext = self._seq(seq_id)
        del self._seqs[seq_id]
        self.arena.free(ext.offset)
        self._num_tokens -= ext.num_tokens
        self._num_final_tokens -= ext.final_num_tokens
        self._num_reserved -= ext.reserved_tokens
        self._num_extent -= ext.extent_tokens

    # ---- accounting ------------------------------------------------------------------------
    def breakdown(self, waiting_num_tokens: int | None = None, *,
                  waiting_num_prompt_tokens: int | None = None) -> dict[str, int]:
        """Slots per memory class (MEMORY_CLASSES), summing to capacity_tokens.

        Args:
            waiting_num_tokens: final tokens (prompt + output) of the request at the head of
                the waiting queue; free slots in holes too small for the extent it needs are
                external fragmentation. None: nothing waits, so only rounding waste is.
            waiting_num_prompt_tokens: that request's prompt tokens (sizes ``pow2``; None:
                as reservation_tokens()).
        """
        unusable = 0
        if waiting_num_tokens is not None:
            unusable = self.arena.num_unusable_slots(self.extent_tokens(
                waiting_num_tokens, num_prompt_tokens=waiting_num_prompt_tokens))
        return make_breakdown(
            token_states=self._num_tokens,
            reservation=self._num_final_tokens - self._num_tokens,
            internal_fragmentation=self._num_reserved - self._num_final_tokens,
            external_fragmentation=self._num_extent - self._num_reserved + unusable,
            cached=0, free=self.arena.num_free_slots - unusable)

    def snapshot(self, waiting_num_tokens: int | None = None, *,
                 waiting_num_prompt_tokens: int | None = None) -> PoolSnapshot:
        """Per-slot arrays of the pool now (one cell per token slot); arguments as breakdown()."""
        n = self.capacity_tokens
        cell_class = np.full(n, FREE, dtype=np.int8)
        owner = np.full(n, -1, dtype=np.int64)
        ref_cnt = np.zeros(n, dtype=np.int32)
        fill = np.zeros(n, dtype=np.int32)
        if waiting_num_tokens is not None:
            need = self.extent_tokens(waiting_num_tokens,
                                      num_prompt_tokens=waiting_num_prompt_tokens)
            for offset, size in self.arena.holes():
                if size < need:
                    cell_class[offset:offset + size] = EXTERNAL
        tables, lens = {}, {}
        ordered = snapshot_order(self._seqs)
        code_of, owner_ids = owner_codes(ordered)
        for seq_id in ordered:
            ext = self._seqs[seq_id]
            o = ext.offset
            cell_class[o:o + ext.num_tokens] = TOKEN_STATES
            cell_class[o + ext.num_tokens:o + ext.final_num_tokens] = RESERVATION
            cell_class[o + ext.final_num_tokens:o + ext.reserved_tokens] = INTERNAL
            cell_class[o + ext.reserved_tokens:o + ext.extent_tokens] = EXTERNAL
            owner[o:o + ext.extent_tokens] = code_of[seq_id]
            ref_cnt[o:o + ext.extent_tokens] = 1
            fill[o:o + ext.num_tokens] = 1
            tables[seq_id] = np.arange(o, o + ext.extent_tokens, dtype=np.int64)
            lens[seq_id] = ext.num_tokens
        return PoolSnapshot("contiguous", 1, n, cell_class, owner, ref_cnt, fill,
                            np.zeros(n, dtype=np.uint64), tables, lens, owner_ids)

    def check_invariants(self) -> None:
        """Recompute the sums and the arena from scratch and assert they match."""
        self.arena.check_invariants()
        assert sorted(self.arena.allocated) == sorted(e.offset for e in self._seqs.values()), \
            "arena extents and sequences differ"
        for seq_id, ext in self._seqs.items():
            assert 0 <= ext.num_tokens <= ext.final_num_tokens <= ext.reserved_tokens \
                <= ext.extent_tokens, f"seq {seq_id}: {ext.num_tokens} <= {ext.final_num_tokens}" \
                f" <= {ext.reserved_tokens} <= {ext.extent_tokens} violated"
            assert ext.extent_tokens == self.arena.extent_slots(ext.reserved_tokens)
        exts = list(self._seqs.values())
        assert self._num_tokens == sum(e.num_tokens for e in exts)
        assert self._num_final_tokens == sum(e.final_num_tokens for e in exts)
        assert self._num_reserved == sum(e.reserved_tokens for e in exts)
        assert self._num_extent == sum(e.extent_tokens for e in exts)
        assert self._num_extent + self.arena.num_free_slots == self.capacity_tokens, \
            "free + used != total"
        check_breakdown(self.breakdown(), self.capacity_tokens)

    # ---- helpers ---------------------------------------------------------------------------
    def _seq(self, seq_id: Hashable) -> _Extent:
        return require_live(seq_id, self._seqs)

    def _check_request(self, num_tokens: int, final_num_tokens: int,
                       num_prompt_tokens: int | None) -> tuple[int, int, int]:
        """Validate a request; return (num_tokens, final_num_tokens, reserved tokens) as ints."""
        num_tokens = require_int("num_tokens", num_tokens)
        final_num_tokens = require_int("final_num_tokens", final_num_tokens, 1)
        if num_tokens > final_num_tokens:
            raise ValueError(f"num_tokens {num_tokens} exceeds final_num_tokens "
                             f"{final_num_tokens}")
        reserved = self.reservation_tokens(
            final_num_tokens, num_prompt_tokens=num_tokens if num_prompt_tokens is None
            else num_prompt_tokens)
        if self.arena.extent_slots(reserved) > self.capacity_tokens:
            raise ValueError(f"a request of {final_num_tokens} tokens reserves "
                             f"{self.arena.extent_slots(reserved)} slots ({self.policy}, "
                             f"{self.placement}), the pool has {self.capacity_tokens}")
        return num_tokens, final_num_tokens, reserved
