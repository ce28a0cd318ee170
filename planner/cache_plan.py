"""Cache sizing from hit-rate curves: the curve as a table, and the smallest GPU + CPU cache that
reaches a target hit rate.

Two curves of one workload (``allocator.cache_curve``):

* the GPU curve: every full block a request holds (prompt and output), vLLM's prefix cache;
* the CPU-tier curve: the prompt-only stream vLLM's CPU offloading stores
  (``offload_prompt_only``), looked up to the whole prompt.

The CPU tier is written through (every prompt chunk is offered as it is computed), so it holds
what the GPU cache holds of prompts and more: with a CPU tier of C chunks the hit rate is about
the larger of the GPU curve at the GPU's size and the CPU-tier curve at C (never the sum). The
answer is an estimate from the one-request-at-a-time model (allocator.cache_curve says when it is
exact); replay the answer (``kvsim replay --cpu-offload-gib``) to see it with the engine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvsim.allocator.block_stream import BlockStream, block_stream
from kvsim.allocator.cache_curve import LruCurve, lru_curve, min_hit_blocks
from kvsim.planner.tiers import block_bytes, checked_chunks, chunk_bytes

GIB = 1 << 30


def curve_sizes(curve: LruCurve, num_points: int = 240, extra=()) -> np.ndarray:
    """Cache sizes (blocks) for a table: log-spaced from 1 past the largest useful size, plus
    ``extra`` sizes (marked ones)."""
    top = max(2, int(curve.max_useful_blocks * 1.25))
    grid = np.geomspace(1, top, num_points).round().astype(np.int64)
    return np.unique(np.concatenate([grid, np.asarray(list(extra), dtype=np.int64)]))


def curve_table(stream: BlockStream, curve: LruCurve, *, bytes_per_block: int | None = None,
                num_points: int = 240, num_min_sizes: int = 40, extra_sizes=()) -> pd.DataFrame:
    """One row per cache size: blocks, tokens, GiB (with ``bytes_per_block``), the LRU hit rate,
    and MIN's hit rate at ``num_min_sizes`` log-spaced sizes and at ``extra_sizes`` (NaN
    elsewhere)."""
    sizes = curve_sizes(curve, num_points, extra_sizes)
    table = pd.DataFrame({"cache_blocks": sizes, "cache_tokens": sizes * stream.block_size})
    if bytes_per_block:
        table["cache_gib"] = sizes * bytes_per_block / GIB
    table["lru_hit_rate"] = curve.hit_rate(sizes)
    table["min_hit_rate"] = np.nan
    if num_min_sizes:
        every = np.unique(np.linspace(0, len(sizes) - 1, num_min_sizes).round().astype(int))
        picks = np.unique(np.concatenate([sizes[every],
                                          np.asarray(list(extra_sizes), dtype=np.int64)]))
        rates = min_hit_blocks(stream, picks) * stream.block_size / max(1, stream.num_query_tokens)
        table["min_hit_rate"] = table["cache_blocks"].map(dict(zip(picks.tolist(),
                                                                   rates.tolist())))
    return table


@dataclass(frozen=True)
class CachePlan:
    """The answer to "the smallest GPU + CPU cache that reaches ``target_hit_rate``"."""

    target_hit_rate: float
    gpu_blocks: int                   # the GPU pool's usable blocks
    gpu_hit_rate: float               # the GPU curve at the pool's size
    needed_blocks: int | None         # smallest single cache (GPU curve) reaching the target
    cpu_chunks: int | None            # CPU-tier chunks needed with this GPU (0: none needed)
    cpu_offload_gib: float | None     # the same in GiB (chunks of all ranks, page-aligned)
    best_hit_rate: float              # an unbounded cache's hit rate
    min_needed_blocks: int | None     # smallest size at which MIN reaches it (any policy)

    @property
    def reachable(self) -> bool:
        return self.cpu_chunks is not None

    def describe(self) -> str:
        """One line for the CLI."""
        if not self.reachable:
            return (f"no cache reaches {self.target_hit_rate:.1%}: an unbounded cache gets "
                    f"{self.best_hit_rate:.1%}")
        if not self.cpu_chunks:
            return (f"the GPU pool alone ({self.gpu_blocks:,} blocks, {self.gpu_hit_rate:.1%}) "
                    f"reaches {self.target_hit_rate:.1%}; {self.needed_blocks:,} blocks would do")
        return (f"{self.target_hit_rate:.1%} needs a CPU tier of {self.cpu_chunks:,} chunks = "
                f"--cpu-offload-gib {self.cpu_offload_gib:g} (the GPU pool alone, "
                f"{self.gpu_blocks:,} blocks, gets {self.gpu_hit_rate:.1%})")


def plan_cache(gpu_curve: LruCurve, cpu_curve: LruCurve, target_hit_rate: float, *,
               gpu_blocks: int, chunk_bytes: int, min_stream: BlockStream | None = None
               ) -> CachePlan:
    """The smallest cache that reaches ``target_hit_rate`` with this GPU pool (module doc).

    Args:
        gpu_curve, cpu_curve: the GPU and CPU-tier curves of the workload.
        target_hit_rate: in (0, 1].
        gpu_blocks: the pool's usable blocks for the model on the GPU.
        chunk_bytes: bytes of one CPU chunk (``planner.tiers.TierSpec.chunk_bytes``).
        min_stream: the GPU stream, to also say where MIN (any policy) would get there.
    """
    gpu_rate = float(gpu_curve.hit_rate(gpu_blocks))
    needed = gpu_curve.smallest_size_for(target_hit_rate)
    best = float(max(gpu_curve.hit_rate(gpu_curve.max_useful_blocks),
                     cpu_curve.hit_rate(cpu_curve.max_useful_blocks)))
    if gpu_rate >= target_hit_rate:
        cpu_chunks, gib = 0, 0.0
    else:
        cpu_chunks = cpu_curve.smallest_size_for(target_hit_rate)
        gib = None if cpu_chunks is None else math.ceil(cpu_chunks * chunk_bytes / GIB * 100) / 100
    min_needed = None
    if min_stream is not None and needed is not None:
        min_needed = _smallest_min_size(min_stream, target_hit_rate, needed)
    return CachePlan(target_hit_rate, gpu_blocks, gpu_rate, needed, cpu_chunks, gib, best,
                     min_needed)


def _smallest_min_size(stream: BlockStream, target: float, upper: int) -> int:
    """Bisect MIN's curve (non-decreasing) below ``upper`` (where LRU, hence MIN, reaches it)."""
    need = target * stream.num_query_tokens / stream.block_size
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi) // 2
        if min_hit_blocks(stream, [mid])[0] >= need:
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass
class CurveReport:
    """What ``kvsim cache-curve`` and the dashboard show: the table, the sizes to mark (GiB), one
    line per finding, and the planner's answer when a target was asked."""

    table: pd.DataFrame
    marks: dict = field(default_factory=dict)
    lines: list = field(default_factory=list)
    plan: CachePlan | None = None


def curve_report(requests, setup, *, kv_dtype: str = "auto", tp: int = 1,
                 cpu_offload_gib: float | None = None, target_hit_rate: float | None = None,
                 num_min_sizes: int = 40) -> CurveReport:
    """The curves of ``requests`` with the GPU pool of ``setup`` (planner.engine_setup.EngineSetup:
    its block size, max_model_len, pool and model) marked.

    Args:
        requests: the workload's requests (a list: it is read twice with a CPU tier).
        cpu_offload_gib: also mark a CPU tier of this size and draw the CPU-tier curve.
        target_hit_rate: answer "the smallest GPU + CPU cache that reaches it" (plan_cache).
        num_min_sizes: sizes at which MIN is computed.
    Raises:
        InputError: a bad target or tier size.
    """
    from kvsim.errors import InputError

    if target_hit_rate is not None and not 0 < target_hit_rate <= 1:
        raise InputError(f"must be in (0, 1], got {target_hit_rate}", field="--target-hit-rate")
    cfg = setup.config
    B = cfg.block_size
    per_rank, copies = block_bytes(setup.model, kv_dtype, tp, B)
    cpu_chunks = None if cpu_offload_gib is None else \
        checked_chunks(cpu_offload_gib, per_rank, copies, "--cpu-offload-gib")
    gib = per_rank * copies / GIB
    gpu_blocks = cfg.pool_blocks - int(cfg.null_block)
    stream = block_stream(requests, B, max_model_len=cfg.max_model_len)
    curve = lru_curve(stream)
    cpu_curve = None
    if cpu_chunks or target_hit_rate is not None:
        cpu_curve = lru_curve(block_stream(requests, B, max_model_len=cfg.max_model_len,
                                           prompt_only=True), free_queue=False)
    table = curve_table(stream, curve, bytes_per_block=per_rank * copies,
                        num_min_sizes=num_min_sizes,
                        extra_sizes=[gpu_blocks] + ([cpu_chunks] if cpu_chunks else []))
    if cpu_curve is not None:
        table["cpu_tier_hit_rate"] = cpu_curve.hit_rate(table["cache_blocks"].to_numpy())
    pool = f"{setup.model.name} on {tp} x {setup.gpu.name}" if setup.capacity else \
        f"{cfg.pool_blocks:,} blocks"
    at_pool = table.loc[table["cache_blocks"] == gpu_blocks, "min_hit_rate"]
    best = f", MIN {float(at_pool.iloc[0]):.4f}" if at_pool.notna().any() else ""
    report = CurveReport(table, {f"GPU pool ({pool})": gpu_blocks * gib})
    report.lines += [
        f"{stream.num_requests:,} requests ({stream.num_rejected:,} rejected by max_model_len "
        f"{cfg.max_model_len:,}), block size {B}: {stream.num_block_touches:,} block touches, "
        f"{stream.num_distinct_blocks:,} distinct blocks",
        f"GPU pool ({pool}): {gpu_blocks:,} blocks, {gpu_blocks * gib:.2f} GiB: LRU hit rate "
        f"{float(curve.hit_rate(gpu_blocks)):.4f}{best}",
        f"an unbounded cache: {float(curve.hit_rate(curve.max_useful_blocks)):.4f} from "
        f"{curve.max_useful_blocks:,} blocks ({curve.max_useful_blocks * gib:.2f} GiB)"]
    if cpu_chunks:
        report.marks[f"CPU tier {cpu_offload_gib:g} GiB"] = cpu_chunks * gib
        report.lines.append(f"CPU tier ({cpu_offload_gib:g} GiB, {cpu_chunks:,} chunks): "
                            f"CPU-tier curve {float(cpu_curve.hit_rate(cpu_chunks)):.4f}")
    if target_hit_rate is not None:
        report.plan = plan_cache(curve, cpu_curve, target_hit_rate, gpu_blocks=gpu_blocks,
                                 chunk_bytes=chunk_bytes(per_rank, copies), min_stream=stream)
        report.lines.append(report.plan.describe())
    return report
