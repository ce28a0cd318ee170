"""First-fit arena: exact-size extents placed in the lowest hole that is large enough.

No rounding, but freed extents leave holes between live ones; a hole smaller than the waiting
request is external fragmentation::

    [ A:300 | hole:100 | B:500 | hole:124 ]   a request of 200 slots fits nowhere: 224 slots wasted
"""
from __future__ import annotations

from bisect import bisect_left, insort

from kvsim.allocator.checks import require_int


class FirstFitArena:
    """First-fit allocator over ``capacity_slots`` slots; adjacent holes coalesce on free.

    Args:
        capacity_slots: slots in the arena (> 0).
    """

    def __init__(self, capacity_slots: int):
        self.capacity_slots = capacity_slots = require_int("capacity_slots", capacity_slots, 1)
        self._hole_starts = [0]                       # sorted offsets of holes
        self._hole_size = {0: capacity_slots}         # offset -> slots
        self.allocated: dict[int, int] = {}           # offset -> slots
        self.num_free_slots = capacity_slots

    def extent_slots(self, num_slots: int) -> int:
        return num_slots

    def can_allocate(self, num_slots: int) -> bool:
        return any(size >= num_slots for size in self._hole_size.values())

    def allocate(self, num_slots: int) -> int | None:
        """Offset of a new extent of ``num_slots`` slots in the lowest hole that fits, or None."""
        for i, start in enumerate(self._hole_starts):
            size = self._hole_size[start]
            if size >= num_slots:
                del self._hole_size[start]
                if size > num_slots:
                    self._hole_starts[i] = start + num_slots
                    self._hole_size[start + num_slots] = size - num_slots
                else:
                    del self._hole_starts[i]
                self.allocated[start] = num_slots
                self.num_free_slots -= num_slots
                return start
        return None

    def free(self, offset: int) -> None:
        """Release the extent at ``offset``, merging it with the holes on either side."""
        size = self.allocated.pop(offset)
        self.num_free_slots += size
        i = bisect_left(self._hole_starts, offset)
        end = offset + size
        if i < len(self._hole_starts) and self._hole_starts[i] == end:   # hole right after
            size += self._hole_size.pop(end)
            del self._hole_starts[i]
        if i > 0:
            prev = self._hole_starts[i - 1]
            if prev + self._hole_size[prev] == offset:                  # hole right before
                self._hole_size[prev] += size
                return
        insort(self._hole_starts, offset)
        self._hole_size[offset] = size

    def num_unusable_slots(self, num_slots: int) -> int:
        """Free slots in holes too small to hold ``num_slots``. O(holes)."""
        return sum(size for size in self._hole_size.values() if size < num_slots)

    def holes(self) -> list[tuple[int, int]]:
        """Holes as (offset, slots), by offset."""
        return [(start, self._hole_size[start]) for start in self._hole_starts]

    def check_invariants(self) -> None:
        """Extents and holes tile the arena; holes are sorted and never adjacent."""
        assert self._hole_starts == sorted(self._hole_size), "hole index out of sync"
        extents = sorted([(off, size, "used") for off, size in self.allocated.items()]
                         + [(off, size, "hole") for off, size in self.holes()])
        pos, prev_kind = 0, None
        for offset, size, kind in extents:
            assert offset == pos, f"gap or overlap at slot {pos} (next extent at {offset})"
            assert size > 0, f"empty {kind} at {offset}"
            assert not (kind == prev_kind == "hole"), f"adjacent holes at {offset}"
            pos, prev_kind = pos + size, kind
        assert pos == self.capacity_slots, f"extents cover {pos} of {self.capacity_slots} slots"
        free = sum(size for _, size in self.holes())
        assert free == self.num_free_slots, f"{free} free slots, counter {self.num_free_slots}"
