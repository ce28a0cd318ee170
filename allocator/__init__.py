"""KV-cache allocators: paged (vLLM-style blocks, prefix cache, fork/CoW), KV-cache groups
(hybrid models: sliding window, Mamba state, full attention), contiguous (Orca-style).

Read in this order: block_pool.py (free queue + hash map), paged.py (block tables, prefix hits,
copy-on-write), group_managers.py / grouped.py (one table per KV-cache group over one pool),
buddy.py / first_fit.py (arenas), contiguous.py (reservation policies), accounting.py (the six
memory classes every slot belongs to).
"""
from kvsim.allocator.accounting import MEMORY_CLASSES, PoolSnapshot
from kvsim.allocator.block_pool import BlockPool
from kvsim.allocator.buddy import BuddyArena
from kvsim.allocator.contiguous import ContiguousAllocator
from kvsim.allocator.first_fit import FirstFitArena
# content keys live with the workloads that describe content (DESIGN.md "Content identity");
# re-exported here because every allocator caller needs them
from kvsim.workloads.keys import SegmentKeys, hash_token_blocks, mix64, rekey_blocks
from kvsim.allocator.paged import PagedAllocator
from kvsim.allocator.group_managers import KVCacheGroupSpec
from kvsim.allocator.grouped import CacheHit, GroupedPagedAllocator

__all__ = ["MEMORY_CLASSES", "BlockPool", "BuddyArena", "CacheHit", "ContiguousAllocator",
           "FirstFitArena", "GroupedPagedAllocator", "KVCacheGroupSpec", "PagedAllocator",
           "PoolSnapshot", "SegmentKeys", "hash_token_blocks", "mix64", "rekey_blocks"]
