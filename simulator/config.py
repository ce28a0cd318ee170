"""EngineConfig: one serving replica's cache and scheduler settings (vLLM's names and meanings).

The names users choose from live here, once, for the CLI, the sweeps and the dashboard:
``ALLOCATORS``, ``PLACEMENTS`` and the replica ``ROUTERS``. This module is light (no simpy, no
pandas), so a command line can offer the choices without loading the simulator.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvsim.errors import InputError
from kvsim.simulator.modes import check_mode

ALLOCATORS = ("paged", "max", "pow2", "oracle")
SCHEDULERS = ("v1", "v0")
V0_WATERMARK = 0.01   # vLLM v0 BlockSpaceManager(watermark=0.01), not configurable there
PLACEMENTS = ("buddy", "first-fit")
ROUTERS = ("round-robin", "least-loaded", "prefix-affinity")


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one replica. Frozen and validated: a bad value raises InputError (every field
    is a user's setting), with the numbers in the message.

    Args:
        allocator: "paged" (vLLM blocks + prefix cache) or a contiguous reservation policy
            ("max": max_model_len, "pow2": the prompt plus the output rounded up to a power of
            two, "oracle": the exact final length), as in the vLLM paper's baselines.
        placement: contiguous allocators only: "buddy" or "first-fit".
        block_size: tokens per block (paged) / per cell (contiguous accounting).
        num_blocks: pool size in blocks (vLLM's num_gpu_blocks). With ``null_block`` the first is
            reserved as vLLM's null block, so ``num_blocks - 1`` are usable.
        capacity_tokens: alternative to num_blocks (contiguous pools are sized in tokens);
            exactly one of the two must be given.
        null_block: reserve block 0 as vLLM does (fidelity with vLLM's usage metric).
        max_num_seqs: most requests in RUNNING at once.
        max_num_batched_tokens: token budget of one step.
        max_model_len: longest sequence (prompt + output); longer prompts are rejected.
        enable_prefix_caching: reuse cached full blocks (paged only).
        long_prefill_token_threshold: cap on one request's prefill chunk when more than one
            request is eligible (0 = off), as vLLM.
        full_prompt_admission: admit a waiting request only if its whole current length fits
            (vLLM's scheduler_reserve_full_isl, on by default).
        watermark: fraction of num_blocks kept free when admitting waiting requests (vLLM's
            scheduler watermark, 0 = off).
        async_scheduling: vLLM's AsyncScheduler with two batches in flight
            (``EngineCore.step_with_batch_queue``, vLLM's default on a GPU): step k+1 is
            scheduled before step k's output is processed (docs/FIDELITY.md 1.6). False: the
            synchronous ``Scheduler``.
        scheduler: "v1" (vLLM 0.33's scheduler) or "v0" (vLLM 0.2-0.5 with chunked prefill off:
            prompt-only steps, then decode steps; scheduler_v0.py). v0 is paged only, has no
            prefix caching and no null block, keeps int(0.01 * num_blocks) blocks free at
            admission unless ``watermark`` says otherwise, and needs max_num_batched_tokens >=
            max_model_len (as vLLM v0 did).
        kv_cache_groups: the KV-cache groups of a hybrid model (allocator.KVCacheGroupSpec, in
            vLLM's order; ``parse_kv_groups``), paged only: one block table per group over
            the one pool (GroupedPagedAllocator, null block included). Empty: every layer is
            full attention (PagedAllocator).
    """

    allocator: str = "paged"
    placement: str = "buddy"
    block_size: int = 16
    num_blocks: int | None = None
    capacity_tokens: int | None = None
    null_block: bool = False
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    full_prompt_admission: bool = True
    watermark: float = 0.0
    async_scheduling: bool = False
    scheduler: str = "v1"
    kv_cache_groups: tuple = ()

    def __post_init__(self):
        if self.allocator not in ALLOCATORS:
            raise InputError(f"allocator must be one of {', '.join(ALLOCATORS)}, got {self.allocator!r}")
        if self.placement not in PLACEMENTS:
            raise InputError(f"placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if self.block_size <= 0:
            raise InputError(f"block_size must be positive, got {self.block_size}")
        if (self.num_blocks is None) == (self.capacity_tokens is None):
            raise InputError("give exactly one of num_blocks and capacity_tokens, got "
                             f"num_blocks={self.num_blocks}, capacity_tokens={self.capacity_tokens}")
        if self.num_blocks is not None and self.num_blocks < 1 + int(self.null_block):
            raise InputError(f"num_blocks must be >= {1 + int(self.null_block)}, got {self.num_blocks}")
        if self.capacity_tokens is not None and self.capacity_tokens < self.block_size:
            raise InputError(f"capacity_tokens must be >= block_size ({self.block_size}), "
                             f"got {self.capacity_tokens}")
        if self.max_num_seqs < 1:
            raise InputError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise InputError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_model_len < 2:
            raise InputError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.long_prefill_token_threshold < 0:
            raise InputError("long_prefill_token_threshold must be >= 0, got "
                             f"{self.long_prefill_token_threshold}")
        if not 0.0 <= self.watermark < 1.0:
            raise InputError(f"watermark must be in [0, 1), got {self.watermark}")
        if self.allocator != "paged" and self.null_block:
            raise InputError("null_block applies to the paged allocator only")
        if self.scheduler not in SCHEDULERS:
            raise InputError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got "
                             f"{self.scheduler!r}")
        if self.kv_cache_groups:
            from kvsim.allocator.group_managers import KVCacheGroupSpec  # light module: lazy

            if not all(isinstance(g, KVCacheGroupSpec) for g in self.kv_cache_groups):
                raise InputError("kv_cache_groups must be KVCacheGroupSpec (parse_kv_groups)")
            if self.allocator != "paged" or not self.null_block:
                raise InputError("kv_cache_groups need the paged allocator with vLLM's null "
                                 "block")
        # the combination of policy, KV manager and features, against the declared table
        check_mode(self)
        if self.scheduler == "v0":
            self._check_v0()

    @property
    def is_grouped(self) -> bool:
        """KV-cache groups (a hybrid model): GroupedPagedAllocator and HybridScheduler."""
        return bool(self.kv_cache_groups)

    def _check_v0(self) -> None:
        """vLLM v0's constraints; its defaults where v1's differ (no prefix caching, no null
        block, watermark 0.01: vLLM v0's BlockSpaceManager)."""
        if self.long_prefill_token_threshold:
            raise InputError("scheduler v0 does not chunk prefills: "
                             "long_prefill_token_threshold must be 0")
        if self.max_num_batched_tokens < self.max_model_len:
            raise InputError(f"scheduler v0: max_num_batched_tokens ({self.max_num_batched_tokens}) "
                             f"is smaller than max_model_len ({self.max_model_len}); vLLM v0 "
                             "without chunked prefill refuses that (a longer prompt could never "
                             "run)")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InputError(f"scheduler v0: max_num_batched_tokens ({self.max_num_batched_tokens}) "
                             f"is smaller than max_num_seqs ({self.max_num_seqs})")
        object.__setattr__(self, "enable_prefix_caching", False)
        object.__setattr__(self, "null_block", False)
        if self.watermark == 0.0:
            object.__setattr__(self, "watermark", V0_WATERMARK)

    def as_dict(self) -> dict:
        """The settings for result.json. The scheduling mode is listed only where it is not
        the synchronous v1 default and the KV-cache groups (``parse_kv_groups``' spelling) only
        where there are some, so that the files of other runs keep their keys."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if not self.async_scheduling:
            del out["async_scheduling"]
        if self.scheduler == "v1":
            del out["scheduler"]
        if not self.kv_cache_groups:
            del out["kv_cache_groups"]
        else:
            out["kv_cache_groups"] = format_kv_groups(self.kv_cache_groups)
        return out

    @property
    def is_paged(self) -> bool:
        return self.allocator == "paged"

    @property
    def pool_tokens(self) -> int:
        """Slots in the pool (usable or not)."""
        if self.capacity_tokens is not None:
            return self.capacity_tokens
        return self.num_blocks * self.block_size

    @property
    def pool_blocks(self) -> int:
        """Blocks in the pool (vLLM's num_gpu_blocks, null block included)."""
        if self.num_blocks is not None:
            return self.num_blocks
        return self.capacity_tokens // self.block_size

    @property
    def watermark_blocks(self) -> int:
        """Blocks kept free at admission: int(watermark * num_gpu_blocks), as vLLM."""
        return int(self.watermark * self.pool_blocks)


# EngineConfig's own batch limits (max_num_seqs, max_num_batched_tokens): the dashboard's teaching
# pools, which have no GPU whose ``vllm serve`` defaults would apply, take them
ENGINE_BATCH_DEFAULTS: tuple[int, int] = (EngineConfig.max_num_seqs,
                                          EngineConfig.max_num_batched_tokens)

# ``--kv-groups`` spellings (the hybrid oracle's, bench/hybrid_oracle.py): one entry per group
_GROUP_SPELLINGS = {"full": "full_attention", "sliding": "sliding_window", "mamba": "mamba",
                    "mamba_ckpt": "mamba"}


def parse_kv_groups(text: str, field: str = "kv_groups") -> tuple:
    """KV-cache groups from ``full,sliding:128,mamba,mamba_ckpt:64`` (vLLM's group order).

    ``full`` full attention (MLA too), ``sliding:W`` a sliding window of W tokens, ``mamba``
    Mamba / linear-attention state, ``mamba_ckpt[:A]`` Mamba layers that export the prompt's
    state from inside a prefill chunk at alignment A (default 1: Mamba2; Gated DeltaNet: the
    block size).

    Raises:
        InputError: an unknown kind or a bad number (naming the entry).
    Returns:
        a tuple of allocator.KVCacheGroupSpec.
    """
    from kvsim.allocator.group_managers import KVCacheGroupSpec

    groups = []
    for i, item in enumerate(str(text).split(",")):
        kind, _, arg = item.strip().partition(":")
        where = f"{field} entry {i + 1} ({item.strip()!r})"
        if kind not in _GROUP_SPELLINGS:
            raise InputError(f"{where}: kind must be one of {', '.join(_GROUP_SPELLINGS)}",
                             field=field)
        if kind == "sliding" and not arg:
            raise InputError(f"{where}: sliding needs a window, e.g. sliding:128", field=field)
        if kind in ("full", "mamba") and arg:
            raise InputError(f"{where}: {kind} takes no argument", field=field)
        try:
            number = int(arg) if arg else (1 if kind == "mamba_ckpt" else None)
            if number is not None and number < 1:
                raise ValueError
        except ValueError:
            raise InputError(f"{where}: {arg!r} is not an integer >= 1", field=field) from None
        groups.append(KVCacheGroupSpec(
            _GROUP_SPELLINGS[kind], sliding_window=number if kind == "sliding" else None,
            mamba_checkpoint_alignment=number if kind == "mamba_ckpt" else None,
            name=f"{kind}:{number}" if number and kind == "sliding" else kind))
    return tuple(groups)


def format_kv_groups(groups) -> str:
    """The ``parse_kv_groups`` spelling of groups (round trip)."""
    out = []
    for g in groups:
        if g.kind == "full_attention":
            out.append("full")
        elif g.kind == "sliding_window":
            out.append(f"sliding:{g.sliding_window}")
        elif g.mamba_checkpoint_alignment is None:
            out.append("mamba")
        else:
            out.append(f"mamba_ckpt:{g.mamba_checkpoint_alignment}")
    return ",".join(out)
