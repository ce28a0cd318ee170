"""KV-cache allocators: paged (vLLM-style blocks, prefix cache, fork/CoW) and contiguous (Orca-style)."""
from allocator.keys import SegmentKeys, hash_token_blocks, mix64, rekey_blocks

__all__ = ["SegmentKeys", "hash_token_blocks", "mix64", "rekey_blocks"]
