"""Buddy arena: power-of-two extents that split in halves and merge back with their buddy.

An extent of order k holds ``2**k`` slots at an offset that is a multiple of ``2**k``; its buddy
is the other half of the order-(k+1) extent it came from, at ``offset ^ 2**k``::

    order 3  [0 ............. 8)
    order 2  [0 ..... 4)[4 ..... 8)        allocate 3 slots -> rounded to 4: [0, 4)
    order 1                                free [0, 4): buddy [4, 8) is free -> merge to [0, 8)

A request of n slots takes ``2**ceil(log2 n)`` slots: the rounding waste is external
fragmentation (the design card's "buddy splits"). A capacity that is not a power of two is cut
into maximal power-of-two zones laid out largest first (7168 = 4096 + 2048 + 1024 at offsets 0, 4096, 6144). Each zone's
offset is a multiple of its size, and its would-be buddy ``offset + size`` is the next, smaller
zone, which never holds an extent that large: so zones never merge, without any extra check.
Free extents are kept in one set per order, so the free space by order is O(1) to read.
"""
from __future__ import annotations

from kvsim.allocator.checks import require_int


def ceil_log2(n: int) -> int:
    """Smallest k with 2**k >= n (n >= 1)."""
    return (n - 1).bit_length()


class BuddyArena:
    """Buddy allocator over ``capacity_slots`` slots.

    Args:
        capacity_slots: slots in the arena (> 0).
    """

    def __init__(self, capacity_slots: int):
        self.capacity_slots = capacity_slots = require_int("capacity_slots", capacity_slots, 1)
        self.max_order = capacity_slots.bit_length() - 1
        self.free_lists: list[set[int]] = [set() for _ in range(self.max_order + 1)]
        self.allocated: dict[int, int] = {}          # offset -> order
        self.num_free_slots = capacity_slots
        offset = 0
        for order in range(self.max_order, -1, -1):   # zones, largest first
            if capacity_slots >> order & 1:
                self.free_lists[order].add(offset)
                offset += 1 << order

    def extent_slots(self, num_slots: int) -> int:
        """Slots actually taken by a request of ``num_slots``: the next power of two."""
        return 1 << ceil_log2(num_slots)

    def can_allocate(self, num_slots: int) -> bool:
        k = ceil_log2(num_slots)
        return any(self.free_lists[j] for j in range(k, self.max_order + 1))

    def allocate(self, num_slots: int) -> int | None:
        """Offset of a new extent of ``extent_slots(num_slots)`` slots, None if no free extent.

        Takes the smallest free extent that is large enough (lowest offset among equals) and
        splits it down, leaving one free buddy per order on the way.
        """
        k = ceil_log2(num_slots)
        for j in range(k, self.max_order + 1):
            if self.free_lists[j]:
                break
        else:
            return None
        offset = min(self.free_lists[j])
        self.free_lists[j].remove(offset)
        while j > k:
            j -= 1
            self.free_lists[j].add(offset + (1 << j))  # upper half stays free
        self.allocated[offset] = k
        self.num_free_slots -= 1 << k
        return offset

    def free(self, offset: int) -> None:
        """Release the extent at ``offset`` and merge it with free buddies as far as possible."""
        k = self.allocated.pop(offset)
        self.num_free_slots += 1 << k
        while k < self.max_order:
            buddy = offset ^ (1 << k)
            if buddy not in self.free_lists[k]:
                break
            self.free_lists[k].remove(buddy)
            offset = min(offset, buddy)
            k += 1
        self.free_lists[k].add(offset)

    def num_unusable_slots(self, num_slots: int) -> int:
        """Free slots in extents too small to hold a request of ``num_slots``. O(orders)."""
        k = min(ceil_log2(num_slots), self.max_order + 1)
        return sum(len(self.free_lists[j]) << j for j in range(k))

    def holes(self) -> list[tuple[int, int]]:
        """Free extents as (offset, slots), by offset."""
        return sorted((offset, 1 << order) for order, offsets in enumerate(self.free_lists)
                      for offset in offsets)

    def check_invariants(self) -> None:
        """Free and allocated extents tile the arena exactly; no two free buddies unmerged."""
        extents = sorted([(off, 1 << k) for off, k in self.allocated.items()] + self.holes())
        pos = 0
        for offset, size in extents:
            assert offset == pos, f"gap or overlap at slot {pos} (next extent at {offset})"
            assert offset % size == 0, f"extent at {offset} of {size} slots is misaligned"
            pos += size
        assert pos == self.capacity_slots, f"extents cover {pos} of {self.capacity_slots} slots"
        free = sum(size for _, size in self.holes())
        assert free == self.num_free_slots, f"{free} free slots, counter {self.num_free_slots}"
        for order, offsets in enumerate(self.free_lists):
            for offset in offsets:
                assert offset ^ (1 << order) not in offsets, f"free buddies at order {order}"
