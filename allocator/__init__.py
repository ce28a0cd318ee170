"""KV-cache allocators: paged (vLLM-style blocks, prefix cache, fork/CoW), contiguous (Orca-style).

Read in this order: block_pool.py (free queue + hash map), paged.py (block tables, prefix hits,
copy-on-write), buddy.py / first_fit.py (arenas), contiguous.py (reservation policies),
accounting.py (the six memory classes every slot belongs to).
"""
from allocator.accounting import MEMORY_CLASSES, PoolSnapshot
from allocator.block_pool import BlockPool
from allocator.buddy import BuddyArena
from allocator.contiguous import ContiguousAllocator
from allocator.first_fit import FirstFitArena
# content keys live with the workloads that describe content (DESIGN.md "Content identity");
# re-exported here because every allocator caller needs them
from workloads.keys import SegmentKeys, hash_token_blocks, mix64, rekey_blocks
from allocator.paged import PagedAllocator

__all__ = ["MEMORY_CLASSES", "BlockPool", "BuddyArena", "ContiguousAllocator", "FirstFitArena",
           "PagedAllocator", "PoolSnapshot", "SegmentKeys", "hash_token_blocks", "mix64",
           "rekey_blocks"]
