"""The memory classes, as the allocator defines them (re-exported so viz has one import site)."""
try:
    from allocator import MEMORY_CLASSES
except ImportError:  # allocator branch not merged yet; same tuple as the TEAM.md contract
    MEMORY_CLASSES = ("token_states", "reservation", "internal_fragmentation",
                      "external_fragmentation", "cached", "free")
