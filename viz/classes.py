"""The memory classes, as the allocator defines them (viz's one import site for them)."""
from kvsim.allocator import MEMORY_CLASSES

__all__ = ["MEMORY_CLASSES"]
