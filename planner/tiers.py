"""KV offload tiers below the GPU pool: their sizes in chunks (vLLM's formula) and their links.

A tier is CPU DRAM (``--cpu-offload-gib``, reached over the GPU's host link: PCIe or
NVLink-C2C) or disk / remote storage behind it (``--disk-offload-gib``, with its own bandwidth
and latency). vLLM 0.33 sizes the CPU tier as ``cpu_bytes_to_use // round_up(bytes of one
chunk on all ranks, PAGESIZE)`` (``vllm/v1/kv_offload/cpu/spec.py: CPUOffloadingSpec``), one
chunk per GPU block by default; the size is the total over tensor-parallel ranks
(``config/cache.py: kv_offloading_size``). docs/OFFLOAD.md has the rules.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kvsim.errors import InputError
from kvsim.planner.capacity import kv_bytes_per_token
from kvsim.simulator.footprint import BYTES_PER_TIER_CHUNK, available_memory_bytes

GIB = 1 << 30
PAGE_BYTES = 4096                 # mmap.PAGESIZE on x86-64 Linux: vLLM aligns chunks to it

# Host link of each GPU preset, GB/s (1e9 B/s) per direction, nominal: PCIe 4.0 x16 is 31.5,
# PCIe 5.0 x16 63.0 (after 128b/130b encoding). Pinned-memory DMA sustains less (typically
# 80-90 %); pass --offload-bandwidth-gbps with a measured figure where it matters.
HOST_LINKS: dict[str, tuple[str, float]] = {
    "A100-40GB": ("PCIe 4.0 x16", 31.5),
    "A100-80GB": ("PCIe 4.0 x16", 31.5),
    "H100-80GB-SXM": ("PCIe 5.0 x16", 63.0),
    "H200": ("PCIe 5.0 x16", 63.0),
    "L40S": ("PCIe 4.0 x16", 31.5),
    "L4": ("PCIe 4.0 x16", 31.5),
    "MI300X": ("PCIe 5.0 x16", 63.0),
}
NVLINK_C2C_GBPS = 450.0           # Grace Hopper: 900 GB/s both directions together


@dataclass(frozen=True)
class TierSpec:
    """One offload tier.

    Args:
        name: ``cpu`` or ``disk``.
        size_gib: capacity in GiB (the total over tensor-parallel ranks, as vLLM's).
        bandwidth_gbps: GB/s per direction between this tier and the one above it.
        latency_s: fixed time before a transfer's first byte (disk/remote; 0 for DRAM).
    """

    name: str
    size_gib: float
    bandwidth_gbps: float
    latency_s: float = 0.0

    def __post_init__(self):
        check_gib(self.size_gib, f"--{self.name}-offload-gib")
        if not (isinstance(self.bandwidth_gbps, (int, float))
                and math.isfinite(self.bandwidth_gbps) and self.bandwidth_gbps > 0):
            raise InputError(f"must be a positive number of GB/s, got {self.bandwidth_gbps!r}",
                             field=_bandwidth_flag(self.name))
        if not (isinstance(self.latency_s, (int, float)) and math.isfinite(self.latency_s)
                and self.latency_s >= 0):
            raise InputError(f"must be >= 0, got {self.latency_s * 1e3!r} ms",
                             field=f"--{self.name}-latency-ms")

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9

    def chunk_bytes(self, bytes_per_block: int, tp: int = 1) -> int:
        return chunk_bytes(bytes_per_block, tp)

    def num_chunks(self, bytes_per_block: int, tp: int = 1) -> int:
        return num_chunks(self.size_gib, bytes_per_block, tp)


def check_gib(size_gib, flag: str) -> float:
    """A tier size: a positive, finite number of GiB (one-line InputError naming ``flag``)."""
    if not (isinstance(size_gib, (int, float)) and math.isfinite(size_gib) and size_gib > 0):
        raise InputError(f"must be a positive number of GiB, got {size_gib!r}", field=flag)
    return size_gib


def chunk_bytes(bytes_per_block: int, copies: int = 1) -> int:
    """Bytes one chunk takes in a tier: one block on every rank that holds a copy, page-aligned
    (vLLM's ``CPUOffloadingSpec``)."""
    return -(-(bytes_per_block * copies) // PAGE_BYTES) * PAGE_BYTES


def num_chunks(size_gib: float, bytes_per_block: int, copies: int = 1) -> int:
    """Chunks a tier of ``size_gib`` holds (vLLM: ``cpu_bytes_to_use // aligned chunk bytes``)."""
    return int(size_gib * GIB) // chunk_bytes(bytes_per_block, copies)


def checked_chunks(size_gib, bytes_per_block: int, copies: int, flag: str) -> int:
    """``num_chunks`` of a size a user gave: a positive size that holds at least one chunk."""
    n = num_chunks(check_gib(size_gib, flag), bytes_per_block, copies)
    if n < 1:
        raise InputError(f"{size_gib:g} GiB holds no chunk: one chunk (a block on {copies} "
                         f"GPU(s)) takes {chunk_bytes(bytes_per_block, copies) / 2**20:.2f} MiB",
                         field=flag)
    return n


def block_bytes(model, kv_dtype: str, tp: int, block_size: int) -> tuple[int, int]:
    """(bytes of one block on one rank, ranks holding a copy): what one chunk of an offload tier
    holds (vLLM: every rank's block; an MLA latent, the same on every rank, once)."""
    per_rank = kv_bytes_per_token(model, kv_dtype, tp) * block_size
    return per_rank, 1 if model.is_mla else tp


def _bandwidth_flag(name: str) -> str:
    return "--offload-bandwidth-gbps" if name == "cpu" else f"--{name}-bandwidth-gbps"


def host_link_gbps(gpu_name: str) -> float | None:
    """Nominal per-direction GB/s of a GPU preset's host link (None for a custom GPU)."""
    link = HOST_LINKS.get(gpu_name)
    return None if link is None else link[1]


def build_tiers(*, gpu_name: str | None, bytes_per_block: int, tp: int = 1,
                cpu_offload_gib: float | None = None, offload_bandwidth_gbps: float | None = None,
                disk_offload_gib: float | None = None, disk_bandwidth_gbps: float | None = None,
                disk_latency_ms: float | None = None,
                memory_limit_bytes: int | None = None) -> tuple[TierSpec, ...]:
    """The tiers a command's flags ask for, checked (one-line InputErrors) before anything runs.

    Returns:
        () with no tier, (cpu,) or (cpu, disk); each holds at least one chunk, and kvsim's
        bookkeeping for every chunk fits in ``memory_limit_bytes`` (default: memory available).
    """
    if cpu_offload_gib is None:
        stray = [flag for flag, value in (("--offload-bandwidth-gbps", offload_bandwidth_gbps),
                                          ("--disk-offload-gib", disk_offload_gib),
                                          ("--disk-bandwidth-gbps", disk_bandwidth_gbps),
                                          ("--disk-latency-ms", disk_latency_ms))
                 if value is not None]
        if stray:
            raise InputError("needs --cpu-offload-gib (vLLM offloads to CPU first; disk sits "
                             "behind it)", field=stray[0])
        return ()
    bandwidth = offload_bandwidth_gbps
    if bandwidth is None:
        bandwidth = host_link_gbps(gpu_name) if gpu_name else None
        if bandwidth is None:
            raise InputError(f"no host-link bandwidth known for GPU {gpu_name!r}: give it",
                             field="--offload-bandwidth-gbps")
    tiers = [TierSpec("cpu", cpu_offload_gib, bandwidth)]
    if disk_offload_gib is not None:
        if disk_bandwidth_gbps is None:
            raise InputError("--disk-offload-gib needs it", field="--disk-bandwidth-gbps")
        tiers.append(TierSpec("disk", disk_offload_gib, disk_bandwidth_gbps,
                              (disk_latency_ms or 0.0) / 1e3))
    elif disk_bandwidth_gbps is not None or disk_latency_ms is not None:
        flag = "--disk-bandwidth-gbps" if disk_bandwidth_gbps is not None else "--disk-latency-ms"
        raise InputError("needs --disk-offload-gib", field=flag)
    limit = available_memory_bytes() if memory_limit_bytes is None else memory_limit_bytes
    for tier in tiers:
        flag = f"--{tier.name}-offload-gib"
        n = checked_chunks(tier.size_gib, bytes_per_block, tp, flag)
        if limit is not None and n * BYTES_PER_TIER_CHUNK > limit:
            # kvsim keeps bookkeeping per chunk, never the KV bytes: a tier larger than this
            # machine's DRAM is a valid what-if as long as its chunks' bookkeeping fits
            raise InputError(f"{tier.size_gib:g} GiB is {n:,} chunks: simulating it would need "
                             f"about {n * BYTES_PER_TIER_CHUNK / GIB:,.1f} GiB of memory, more "
                             f"than the {limit / GIB:,.1f} GiB available", field=flag)
    return tuple(tiers)
