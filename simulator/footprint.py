"""What a simulation will allocate, checked against the memory there is before anything is allocated.

Every size a user gives ends in one of these terms (bytes measured with tracemalloc on CPython
3.11, rounded up; ``tests/test_footprint.py`` measures them again and checks that each is an
upper bound):

==========================  ===================================================================
term                        what grows
==========================  ===================================================================
paged pool                  ``BYTES_PER_BLOCK`` per block and replica: ref count, key and free-
                            queue entries, the prefix-cache hash map when every block is cached
                            (about 56 B when empty, 250 B full)
snapshots                   ``BYTES_PER_SNAPSHOT_CELL`` per cell (a paged block, a contiguous
                            token) per snapshot and replica (four numpy arrays and a ref count)
live sequences              ``BYTES_PER_SEQUENCE`` for each sequence that can be live at once:
                            ``max_num_seqs``, at most one per usable block (paged) or slot
                            (contiguous), times the largest ``samples`` / ``beam`` of the workload
request rows                ``BYTES_PER_REQUEST_ROW`` per finished request (the per-request
                            table; ``BYTES_PER_REQUEST_LATENCY`` without it)
requests held in a list     ``BYTES_PER_REQUEST`` per request when a caller materialises the
                            workload (plan's points, the dashboard), instead of streaming it
time-series samples         ``BYTES_PER_SAMPLE`` per sample and replica
offload tiers               ``BYTES_PER_TIER_CHUNK`` per chunk of every tier and replica
==========================  ===================================================================

``check_memory`` raises an ``InputError`` with the total and its largest term when the total is
above the memory available now (``available_memory_bytes``: the smaller of /proc/meminfo's
MemAvailable and the cgroup's limit left), so a pool of 10**10 blocks is refused in a
millisecond, on one line, instead of growing until the OS kills the process. A contiguous pool
holds O(live sequences) Python objects whatever its size; it is bounded through its snapshots.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvsim.errors import InputError

BYTES_PER_BLOCK = 280
BYTES_PER_SNAPSHOT_CELL = 32
BYTES_PER_SEQUENCE = 2048
BYTES_PER_REQUEST_ROW = 192
BYTES_PER_REQUEST_LATENCY = 32
BYTES_PER_REQUEST = 640
BYTES_PER_SAMPLE = 192
BYTES_PER_TIER_CHUNK = 640   # an offload tier's chunk: ref count, rank, evictable entry, up to two heap entries (peak 571 B measured)
GIB = 1 << 30


@dataclass(frozen=True)
class WorkloadSize:
    """What a caller knows of a workload's size before reading it (None: unknown).

    num_requests: requests it will yield (a spec's n=, or rate x duration_s).
    duration_s: the span of its arrivals.
    max_fanout: the largest samples / beam width of one request.
    """

    num_requests: int | None = None
    duration_s: float | None = None
    max_fanout: int = 1


def memory_terms(config, *, replicas: int = 1, num_snapshots: int = 0,
                 sample_interval_s: float | None = None, record_requests: bool = True,
                 workload: WorkloadSize | None = None, materialised: bool = False,
                 offload=()) -> dict[str, int]:
    """Bytes each term of the table above will take (a term that is unknown is left out).

    Args:
        config: the EngineConfig of every replica.
        replicas: engine replicas.
        num_snapshots: pool snapshots kept (each of every replica).
        sample_interval_s: time-series period (None: 1 s).
        record_requests: the per-request table is kept.
        workload: what is known of the workload's size.
        materialised: the caller holds the workload's requests in a list.
        offload: the offload tiers (simulator.offload.TierConfig) below every replica.
    """
    workload = workload or WorkloadSize()
    cells = config.pool_blocks if config.is_paged else config.pool_tokens
    terms = {"snapshots": num_snapshots * replicas * cells * BYTES_PER_SNAPSHOT_CELL}
    if config.is_paged:
        terms["pool"] = replicas * config.pool_blocks * BYTES_PER_BLOCK
    live = min(config.max_num_seqs, cells) * max(workload.max_fanout, 1)
    terms["live sequences"] = replicas * live * BYTES_PER_SEQUENCE
    n = workload.num_requests
    if n is not None:
        terms["request rows"] = n * (BYTES_PER_REQUEST_ROW if record_requests else BYTES_PER_REQUEST_LATENCY)
        if materialised:
            terms["requests in memory"] = n * BYTES_PER_REQUEST
    if offload:
        terms["offload tiers"] = replicas * sum(t.num_chunks for t in offload) * BYTES_PER_TIER_CHUNK
    if workload.duration_s is not None:
        interval = 1.0 if sample_interval_s is None else sample_interval_s
        terms["time-series samples"] = int(workload.duration_s / interval + 1) * replicas * BYTES_PER_SAMPLE
    return terms


def available_memory_bytes() -> int | None:
    """Memory this process can still take: the smaller of MemAvailable (/proc/meminfo) and the
    cgroup v2 limit minus its usage; None where neither can be read (then nothing is refused)."""
    candidates = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    candidates.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                candidates.append(int(limit) - int(f.read().strip()))
    except (OSError, ValueError):
        pass
    return min(candidates) if candidates else None


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:,.1f} GiB" if num_bytes >= GIB else f"{num_bytes / 2**20:,.1f} MiB"


def check_memory(terms: dict[str, int], what: str = "this run",
                 available_bytes: int | None = None) -> int:
    """Refuse a run whose terms add up to more than the memory available.

    Args:
        terms: from memory_terms.
        what: how the message names the run (the sizes that make it large).
        available_bytes: the limit (default: available_memory_bytes()).
    Returns:
        The total bytes.
    Raises:
        InputError: one line with the total, its largest terms and the memory available.
    """
    total = sum(terms.values())
    available = available_memory_bytes() if available_bytes is None else available_bytes
    if available is not None and total > available:
        largest = sorted(((v, k) for k, v in terms.items() if v), reverse=True)[:2]
        parts = ", ".join(f"{k} {_gib(v)}" for v, k in largest)
        raise InputError(f"{what} would need {_gib(total)} of memory ({parts}), more than the "
                         f"{_gib(available)} available")
    return total


def check_simulation(config, *, replicas: int = 1, num_snapshots: int = 0,
                     sample_interval_s: float | None = None, record_requests: bool = True,
                     workload: WorkloadSize | None = None, materialised: bool = False,
                     offload=()) -> int:
    """``check_memory(memory_terms(...))`` with a message naming the pool; returns the bytes."""
    pool = (f"{config.pool_blocks:,} blocks" if config.is_paged else f"{config.pool_tokens:,} tokens")
    what = f"a pool of {pool}" + (f" x {replicas} replicas" if replicas > 1 else "")
    for tier in offload:
        what += f", a {tier.name} tier of {tier.num_chunks:,} chunks"
    if num_snapshots:
        what += f", {num_snapshots:,} snapshots"
    if workload is not None and workload.num_requests is not None:
        what += f", {workload.num_requests:,} requests"
    return check_memory(memory_terms(config, replicas=replicas, num_snapshots=num_snapshots,
                                     sample_interval_s=sample_interval_s,
                                     record_requests=record_requests, workload=workload,
                                     materialised=materialised, offload=offload), what)


def check_requests_in_memory(workload: WorkloadSize) -> int:
    """Refuse to hold a workload's requests in a list when they would not fit (plan's points,
    the dashboard); returns the bytes (0 when the size is unknown)."""
    n = workload.num_requests
    if n is None:
        return 0
    return check_memory({"requests in memory": n * BYTES_PER_REQUEST}, f"{n:,} requests held in memory")


def max_model_len_warning(config) -> str | None:
    """vLLM 0.33 refuses to start an engine whose pool cannot hold one request of max_model_len
    tokens, also with ``num_gpu_blocks_override`` (``kv_cache_planning.py``: the needed
    ``cdiv(max_model_len, block_size)`` blocks against the pool less its null block); kvsim runs
    it and rejects the requests that would outgrow the pool. The warning's text for a paged
    pool of one group, or None (it fits, or another allocator or KV-cache groups)."""
    if not config.is_paged or config.is_grouped:
        return None
    usable = config.pool_blocks - int(config.null_block)
    need = -(-config.max_model_len // config.block_size)
    if need <= usable:
        return None
    return (f"max_model_len {config.max_model_len} needs {need} blocks of {config.block_size} tokens "
            f"and the pool has {usable} usable: vLLM 0.33 would refuse to start this engine (the "
            f"largest max_model_len it starts with here is {usable * config.block_size}); kvsim "
            "runs it and rejects the requests that would outgrow the pool")
