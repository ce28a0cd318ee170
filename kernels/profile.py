"""Time a grid of step shapes on the step executor: the rows of a measured cost table.

A grid point is a step the scheduler could produce::

    num_decode_seqs sequences decoding one token each at decode_context_tokens of context
  + num_prefill_seqs prompt chunks of prefill_tokens each, after prefix_tokens already cached

Each point gets fresh blocks drawn from a shuffled pool (as a long-running server's pool looks),
runs once to warm up (Triton compiles, CUDA graph capture), then ``repeat`` more times; re-running a
step is idempotent (it writes the same K/V to the same slots). A row carries the step's totals under
the simulator's names (``simulator.cost.StepBatch``: kv_read_tokens = sum of contexts after the
step, attn_token_pairs = sum of new tokens x context, a one-token chunk of a prompt counts as
prefill) and the median, min and max of the measured times.

The default grid covers decode at every CUDA-graph capture size (the time is a step function of the
padded batch) at three contexts, decode batches with one long sequence among short ones, and mixed
steps of 16 to max_num_batched_tokens tokens: one fresh prompt, one chunk after a cached prefix, many
short prompts, and a prompt chunk beside decodes; then ``context_grid``: long and unequal decode
contexts at every power-of-two bucket, and chunks after long cached prefixes. It stays inside the
pool: every point's blocks fit in num_blocks.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from kvsim.kernels.executor import MIN_BUCKET_TOKENS, StepExecutor, build_step

COLUMNS = ("kind", "num_seqs", "num_prefill_seqs", "num_prefill_tokens", "num_decode_tokens",
           "num_scheduled_tokens", "kv_read_tokens", "attn_token_pairs", "max_context_tokens", "padded_num_seqs",
           "graph", "step_s", "step_s_min", "step_s_max", "repeats")


@dataclass(frozen=True)
class GridPoint:
    num_decode_seqs: int = 0
    decode_context_tokens: int = 0      # context of each decoding sequence after the step
    num_prefill_seqs: int = 0
    prefill_tokens: int = 0             # new tokens of each prompt chunk
    prefix_tokens: int = 0              # tokens of each prompt already cached before the chunk
    long_context_tokens: int = 0        # > 0: the last num_long_seqs decoding sequences have this context
    num_long_seqs: int = 1

    @property
    def kind(self) -> str:
        return "decode" if self.num_prefill_seqs == 0 else "mixed"

    def sequences(self) -> tuple[list[int], list[int]]:
        """(context after the step, new tokens) of each sequence, decoders first."""
        ctx = [self.decode_context_tokens] * self.num_decode_seqs
        if self.long_context_tokens and ctx:
            k = min(self.num_long_seqs, len(ctx))
            ctx[len(ctx) - k:] = [self.long_context_tokens] * k
        ctx += [self.prefix_tokens + self.prefill_tokens] * self.num_prefill_seqs
        return ctx, [1] * self.num_decode_seqs + [self.prefill_tokens] * self.num_prefill_seqs

    def num_blocks(self, block_size: int) -> int:
        return sum(-(-c // block_size) for c in self.sequences()[0])

    def totals(self) -> dict:
        """The step's StepBatch fields, as the simulator's scheduler counts them."""
        ctx, new = self.sequences()
        d, p = self.num_decode_seqs, self.num_prefill_seqs
        return {"num_seqs": d + p, "num_prefill_seqs": p, "num_prefill_tokens": p * self.prefill_tokens,
                "num_decode_tokens": d, "num_scheduled_tokens": sum(new), "kv_read_tokens": sum(ctx),
                "attn_token_pairs": sum(c * n for c, n in zip(ctx, new)), "max_context_tokens": max(ctx)}


def default_grid(capture_sizes: list[int], *, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, num_blocks: int, block_size: int) -> list[GridPoint]:
    """The grid of the module docstring, cut to the engine limits and the pool."""
    points = []
    for b in capture_sizes:
        if b > max_num_seqs:
            break
        for ctx in (256, 1024, 3072):
            points.append(GridPoint(num_decode_seqs=b, decode_context_tokens=min(ctx, max_model_len)))
    for b in (24, 64, 128, 256):    # skewed decode batches: one long sequence among short ones
        if b <= max_num_seqs and max_model_len > 1024:
            points.append(GridPoint(num_decode_seqs=b, decode_context_tokens=512,
                                    long_context_tokens=min(16384, max_model_len)))
    sizes = [16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384]
    for t in (s for s in sizes if s <= max_num_batched_tokens):
        if t <= max_model_len:
            points.append(GridPoint(num_prefill_seqs=1, prefill_tokens=t))
        for prefix in (2048, 8192) + ((32768,) if t >= 2048 else ()):
            if prefix + t <= max_model_len:
                points.append(GridPoint(num_prefill_seqs=1, prefill_tokens=t, prefix_tokens=prefix))
        if t >= 512:
            n = min(256, max_model_len)
            points.append(GridPoint(num_prefill_seqs=min(t // n, max_num_seqs), prefill_tokens=n))
        for d in (16, 64, 128):
            if t > d and d + 1 <= max_num_seqs and t - d <= max_model_len:
                points.append(GridPoint(num_decode_seqs=d, decode_context_tokens=min(1024, max_model_len),
                                        num_prefill_seqs=1, prefill_tokens=t - d))
    points += context_grid(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                           max_model_len=max_model_len, num_blocks=num_blocks, block_size=block_size)
    # clamping to max_model_len can repeat a point: keep the first of each
    return [pt for pt in dict.fromkeys(points) if pt.num_blocks(block_size) <= num_blocks]


def context_grid(*, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int, num_blocks: int,
                 block_size: int) -> list[GridPoint]:
    """Steps whose contexts are long or unequal, most informative first (part of ``default_grid``).

    A decode batch's time is not a function of its total context alone: the longest sequence is
    read by few programs (one per KV head once the batch fills a wave, unless the executor splits
    it), so one long context among short ones sets a floor, and the split-KV plans depend on the
    longest context's power-of-two bucket (``simulator.cost_table`` prices the floor from these
    rows). The points: one long sequence among 512-token ones at every bucket, at batches below
    and above one wave; prompt chunks after long cached prefixes (conversation traces reach
    16k-64k tokens of cache), and beside decodes of long contexts (in an eager mixed step each
    sequence's attention is one program per KV head, so the longest context is a tail the other
    work does not hide).
    """
    short = 512
    points = []

    def decode(b, long):
        if b <= max_num_seqs and long <= max_model_len:
            points.append(GridPoint(num_decode_seqs=b, decode_context_tokens=min(short, long),
                                    long_context_tokens=long))
    for b in (24, 32, 48, 64, 96, 128, 192, 256):     # a wave or more, unsplit (bucket 4096)
        for long in (2048, 4096):
            decode(b, long)
    for b in (1, 2, 4, 8, 16):                        # under a wave: the kernel splits by bucket
        for long in (8192, 16384, 32768, 65536, 131072):
            decode(b, long)
    for prefix in (16384, 32768, 65536):              # chunks after a long cached prefix
        for t in (2048, 8192):
            if t <= max_num_batched_tokens and prefix + t <= max_model_len:
                points.append(GridPoint(num_prefill_seqs=1, prefill_tokens=t, prefix_tokens=prefix))
    for b in (24, 32, 64, 128, 256):                  # a wave or more, split into partitions
        for long in (8192, 32768, 131072):
            decode(b, long)
    for t in (2048, 8192):                            # long decodes beside a chunk (eager, unsplit):
        for d, ctx in ((1, 32768), (1, 131072), (16, 16384)):   # the longest program outlasts the rest
            if d < max_num_seqs and t <= max_num_batched_tokens and ctx <= max_model_len:
                points.append(GridPoint(num_decode_seqs=d, decode_context_tokens=ctx, num_prefill_seqs=1,
                                        prefill_tokens=t - d))
    if max_num_seqs > 11 and max_num_batched_tokens >= 8192 and max_model_len >= 65536:
        points.append(GridPoint(num_decode_seqs=10, decode_context_tokens=2048, long_context_tokens=65536,
                                num_prefill_seqs=1, prefill_tokens=8182))
    return [pt for pt in dict.fromkeys(points) if pt.num_blocks(block_size) <= num_blocks]


def point_step(point: GridPoint, executor: StepExecutor, rng: np.random.Generator):
    """StepInputs of a grid point, its sequences on fresh blocks of a shuffled pool."""
    bs = executor.block_size
    ctx, new = point.sequences()
    need = [-(-c // bs) for c in ctx]
    ids = rng.permutation(executor.num_blocks)[:sum(need)]
    tables, start = [], 0
    for k in need:
        tables.append(ids[start:start + k])
        start += k
    computed = [c - n for c, n in zip(ctx, new)]
    return build_step(tables, computed, new, bs, executor.shape.vocab_size)


def profile_grid(executor: StepExecutor, points: list[GridPoint], *, repeat: int = 7, seed: int = 0,
                 progress=None, time_budget_s: float | None = None) -> list[dict]:
    """Time each grid point (after one warm-up run); rows with COLUMNS.

    Args:
        executor: where to run.
        points: the grid (``default_grid``).
        repeat: timed runs per point (median kept, min and max beside it).
        seed: block shuffling seed.
        progress: optional callable(done, total, row) after each point.
        time_budget_s: stop starting new points after this many seconds (wall clock).
    """
    import time
    deadline = time.monotonic() + time_budget_s if time_budget_s else None
    rng = np.random.default_rng(seed)
    rows = []
    for i, point in enumerate(points):
        if deadline is not None and time.monotonic() > deadline:
            break
        step = point_step(point, executor, rng)
        first = executor.execute(step)   # warm-up: compiles, captures the graph of this size
        times = [executor.execute(step).time_s for _ in range(repeat)]
        row = {"kind": point.kind, **point.totals(), "padded_num_seqs": first.padded_num_seqs,
               "graph": int(first.graph), "step_s": statistics.median(times), "step_s_min": min(times),
               "step_s_max": max(times), "repeats": repeat}
        rows.append(row)
        if progress is not None:
            progress(i + 1, len(points), row)
    return rows


def provenance(executor: StepExecutor, command: str, repeat: int) -> dict[str, str]:
    """What a table was measured on and how: the ``#`` lines of its header."""
    import datetime
    import json
    import platform

    import torch
    import triton
    try:
        from importlib.metadata import version
        kvsim_version = version("kvsim")
    except Exception:   # an uninstalled checkout
        kvsim_version = "unknown"
    dev = executor.device
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu ({platform.processor() or 'interpreter'})"
    shape = executor.shape
    return {
        "kvsim cost table": "step times measured by `kvsim profile` on the step executor",
        "gpu": gpu,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "versions": f"kvsim {kvsim_version}, torch {torch.__version__}, triton {triton.__version__}, "
                    f"cuda {torch.version.cuda}, python {platform.python_version()}",
        "model": shape.name or "custom",
        "shape": json.dumps(shape.to_dict(), sort_keys=True),
        "executor": (f"dtype {str(executor.dtype).replace('torch.', '')}, block_size {executor.block_size}, "
                     f"num_blocks {executor.num_blocks}, max_num_seqs {executor.max_num_seqs}, "
                     f"max_num_batched_tokens {executor.max_num_batched_tokens}, max_model_len "
                     f"{executor.max_model_len}, decode attention paged_attention, mixed attention "
                     f"{executor.attention_name}, cuda graphs {executor.cuda_graphs}"),
        "context buckets": (f"powers of two from {MIN_BUCKET_TOKENS} tokens (decode graphs and their split-KV "
                            "plans are chosen by the longest context's bucket)"),
        "timing": (f"{'CUDA events' if dev.type == 'cuda' else 'wall clock'}, first kernel to sample; "
                   f"median of {repeat} runs after one warm-up"),
        "command": command,
    }


def write_table(path, rows: list[dict], header: dict[str, str]) -> None:
    """The cost table: ``# key: value`` provenance lines, then COLUMNS as CSV."""
    import csv
    with open(path, "w", newline="") as f:
        for key, value in header.items():
            f.write(f"# {key}: {value}\n")
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.9g}" if isinstance(v, float) else v) for k, v in row.items()})
