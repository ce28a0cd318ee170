"""From an allocator pool snapshot to real tensors: prove that paged attention over the simulator's
block tables computes exactly what dense (causal) attention computes.

The bridge takes plain arrays (what ``allocator.PoolSnapshot`` carries; duck-typed, never imported):
block tables, sequence lengths, the pool size, the block size and each block's content key. It

1. builds a KV pool of ``num_blocks`` blocks (head sizes scaled down on CPU, where the Triton
   interpreter runs the kernels), every slot poisoned with NaN;
2. derives every token's K/V deterministically from its block's content key and its offset in the
   block, so blocks that hold the same content (shared prefix blocks, or two copies of one key) hold
   identical data, as they must for prefix caching to be correct;
3. writes those tokens through ``reshape_and_cache`` (with padding slots interleaved, which must be
   skipped);
4. runs ``unified_attention`` on the snapshot's real block tables and compares each sequence with
   float64 dense attention over K/V rebuilt from the content function (not read back from the pool);
5. runs the same kernel on an identity block table (each sequence's blocks copied contiguously) and
   checks that the paged output is bitwise equal: paging must change where KV lives, never what
   attention computes.

``validate_snapshot`` checks a decode of every sequence (its last token over all of its tokens);
``validate_step`` checks one mixed step of the simulator (``unified_attention``): which sequences
run, how many new tokens each (a prefill chunk, the uncached rest of a prompt after a prefix hit,
a decode) over how many tokens of context already in the pool; see its docstring for the array
contract, and ``with_step`` / the ``step_*`` snapshot arrays to carry a step in a snapshot.

Snapshots travel as ``.npz`` (``save_snapshot`` / ``load_snapshot``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)
_UNKEYED_SALT = np.uint64(0x6B65726E656C73)  # seeds blocks that have no content key
_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@dataclass(frozen=True)
class PoolArrays:
    """The parts of a pool snapshot the bridge needs (plain numpy; see module docstring)."""
    block_size: int                         # tokens per block (cell)
    num_blocks: int
    block_key: np.ndarray                   # uint64 [num_blocks], 0 = no content key
    block_tables: dict[int, np.ndarray]     # seq_id -> block ids
    seq_lens: dict[int, int]                # seq_id -> tokens
    kind: str = "paged"
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # other snapshot arrays, kept for save

    def __post_init__(self):
        if self.block_size < 1 or self.num_blocks < 1:
            raise ValueError(f"block_size and num_blocks must be positive, got {self.block_size} "
                             f"and {self.num_blocks}")
        if len(self.block_key) != self.num_blocks:
            raise ValueError(f"block_key has {len(self.block_key)} entries, num_blocks is {self.num_blocks}")
        if set(self.block_tables) != set(self.seq_lens):
            missing = sorted(set(self.block_tables) ^ set(self.seq_lens))[:5]
            raise ValueError(f"block_tables and seq_lens name different sequences, e.g. {missing}")
        for seq_id, table in self.block_tables.items():
            num_tokens = self.seq_lens[seq_id]
            if num_tokens < 0:
                raise ValueError(f"seq {seq_id}: negative length {num_tokens}")
            need = -(-num_tokens // self.block_size)
            if len(table) < need:
                raise ValueError(f"seq {seq_id}: {num_tokens} tokens need {need} blocks of {self.block_size}, "
                                 f"its block table has {len(table)}")
            used = np.asarray(table[:need], dtype=np.int64)
            if need and (used.min() < 0 or used.max() >= self.num_blocks):
                bad = int(used[(used < 0) | (used >= self.num_blocks)][0])
                raise ValueError(f"seq {seq_id}: block id {bad} is outside the pool of {self.num_blocks} blocks")


def pool_arrays(snapshot=None, *, block_tables=None, seq_lens=None, num_blocks=None, block_size=None,
                block_key=None) -> PoolArrays:
    """Read a snapshot (any object with PoolSnapshot's fields) or plain arguments into PoolArrays.

    Args:
        snapshot: an ``allocator.PoolSnapshot`` or look-alike (block_size, num_cells, block_key,
            block_tables, seq_lens; kind optional), or a PoolArrays.
        block_tables, seq_lens, num_blocks, block_size, block_key: the same as plain arguments
            (block_key may be None: no content keys).
    Returns:
        PoolArrays (validated).
    """
    if isinstance(snapshot, PoolArrays):
        return snapshot
    if snapshot is not None:
        extra = {name: np.asarray(getattr(snapshot, name))
                 for name in ("cell_class", "owner", "ref_cnt", "fill") + STEP_FIELDS
                 if getattr(snapshot, name, None) is not None}
        return PoolArrays(int(snapshot.block_size), int(snapshot.num_cells),
                          np.asarray(snapshot.block_key, dtype=np.uint64),
                          {int(k): np.asarray(v, dtype=np.int64) for k, v in snapshot.block_tables.items()},
                          {int(k): int(v) for k, v in snapshot.seq_lens.items()},
                          str(getattr(snapshot, "kind", "paged")), extra)
    if block_tables is None or seq_lens is None or num_blocks is None or block_size is None:
        raise ValueError("give a snapshot, or block_tables, seq_lens, num_blocks and block_size")
    keys = np.zeros(num_blocks, dtype=np.uint64) if block_key is None else np.asarray(block_key, dtype=np.uint64)
    return PoolArrays(int(block_size), int(num_blocks), keys,
                      {int(k): np.asarray(v, dtype=np.int64) for k, v in block_tables.items()},
                      {int(k): int(v) for k, v in seq_lens.items()})


def save_snapshot(path, snapshot) -> None:
    """Write a snapshot (PoolSnapshot look-alike or PoolArrays) to ``path`` as .npz.

    Block tables are stored flattened: ``seq_ids``, ``table_offsets`` (CSR row starts) and
    ``table_blocks``."""
    arrays = pool_arrays(snapshot)
    seq_ids = np.array(sorted(arrays.block_tables), dtype=np.int64)
    tables = [arrays.block_tables[int(s)] for s in seq_ids]
    offsets = np.zeros(len(seq_ids) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(t) for t in tables])
    np.savez_compressed(
        path, kind=np.array(arrays.kind), block_size=np.int64(arrays.block_size),
        num_cells=np.int64(arrays.num_blocks), block_key=arrays.block_key, seq_ids=seq_ids,
        seq_lens=np.array([arrays.seq_lens[int(s)] for s in seq_ids], dtype=np.int64),
        table_offsets=offsets,
        table_blocks=np.concatenate(tables).astype(np.int64) if tables else np.zeros(0, np.int64),
        **arrays.extra)


def load_snapshot(path) -> PoolArrays:
    """Read a snapshot written by ``save_snapshot``.

    Raises:
        ValueError: naming the file and the field, when a field is missing or inconsistent.
    """
    path = Path(path)
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise ValueError(f"{path}: not a snapshot .npz file ({err})") from None
    with data:
        required = ("kind", "block_size", "num_cells", "block_key", "seq_ids", "seq_lens", "table_offsets",
                    "table_blocks")
        for name in required:
            if name not in data.files:
                raise ValueError(f"{path}: field '{name}' is missing")
        seq_ids, lens, offsets, blocks = (data[n] for n in ("seq_ids", "seq_lens", "table_offsets", "table_blocks"))
        if len(lens) != len(seq_ids) or len(offsets) != len(seq_ids) + 1 or offsets[-1] != len(blocks):
            raise ValueError(f"{path}: field 'table_offsets' does not match seq_ids/seq_lens/table_blocks")
        tables = {int(s): blocks[offsets[i]:offsets[i + 1]] for i, s in enumerate(seq_ids)}
        extra = {n: data[n] for n in data.files if n not in required}
        try:
            return PoolArrays(int(data["block_size"]), int(data["num_cells"]), data["block_key"].astype(np.uint64),
                              tables, {int(s): int(n) for s, n in zip(seq_ids, lens)}, str(data["kind"]), extra)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK
        return x ^ (x >> np.uint64(31))


def block_seeds(arrays: PoolArrays) -> np.ndarray:
    """Per block: its content key, or for an unkeyed block a seed derived from its id (uint64)."""
    ids = np.arange(arrays.num_blocks, dtype=np.uint64)
    return np.where(arrays.block_key != 0, arrays.block_key, _mix(ids ^ _UNKEYED_SALT))


def token_kv(seeds: np.ndarray, offsets: np.ndarray, num_kv_heads: int, head_size: int) -> np.ndarray:
    """K and V of tokens, a pure function of (block seed, offset in block): float64 in [-1, 1).

    Args:
        seeds: uint64 [n], the seed of each token's block.
        offsets: [n], each token's slot in its block.
    Returns:
        [n, 2, num_kv_heads, head_size] float64 (index 0 = K, 1 = V).
    """
    n_elem = 2 * num_kv_heads * head_size
    with np.errstate(over="ignore"):
        tok = _mix(seeds.astype(np.uint64) ^ _mix(offsets.astype(np.uint64)))
        bits = _mix(tok[:, None] + np.arange(n_elem, dtype=np.uint64)[None, :])
    vals = (bits >> np.uint64(11)).astype(np.float64) * (2.0 / (1 << 53)) - 1.0
    return vals.reshape(-1, 2, num_kv_heads, head_size)


@dataclass(frozen=True)
class SequenceCheck:
    """Result of one sequence: paged vs dense and paged vs identity table."""
    seq_id: int
    num_tokens: int
    num_blocks: int
    num_shared_blocks: int      # blocks of this sequence that other sequences' tables also hold
    max_abs_err: float
    max_rel_err: float          # max |paged - dense| / max |dense|
    bitwise_equal: bool         # paged output == same kernel on an identity block table
    passed: bool


@dataclass(frozen=True)
class ValidationReport:
    """All sequences of a snapshot (sequences with 0 tokens attend to nothing and are counted apart)."""
    checks: list[SequenceCheck]
    num_skipped_empty: int
    tolerance: float
    dtype: str
    layout: str
    device: str
    partition_size: int | None
    num_kv_heads: int
    num_heads: int
    head_size: int
    num_sequences: int = 0              # sequences with tokens in the snapshot (checked or not)
    num_shared_blocks: int = 0          # blocks that two or more of them read
    num_shared_blocks_checked: int = 0  # of those, blocks two or more CHECKED sequences read

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


def _readers(tables: dict[int, np.ndarray], num_blocks: int) -> np.ndarray:
    """How many of the sequences' block tables hold each block."""
    if not tables:
        return np.zeros(num_blocks, np.int64)
    return np.bincount(np.concatenate([np.unique(t) for t in tables.values()]), minlength=num_blocks)


def choose_sequences(tables: dict[int, np.ndarray], num_blocks: int, max_seqs: int | None) -> list[int]:
    """Which sequences to check when at most ``max_seqs`` may be: the ones that exercise sharing.

    A shared block is only tested when two sequences of the same launch read it, so the choice is
    greedy on shared blocks: each pick is the sequence that brings the most shared blocks to two
    checked readers, then to one (ties: the lower seq_id); once no pick adds any, the lowest
    remaining seq_ids fill the batch. All sequences when ``max_seqs`` is None or large enough.

    Args:
        tables: seq_id -> the blocks it reads.
        num_blocks: blocks in the pool.
        max_seqs: most sequences to check.
    Returns:
        The chosen seq_ids, sorted.
    """
    ids = sorted(tables)
    if max_seqs is None or max_seqs >= len(ids):
        return ids
    shared = _readers(tables, num_blocks) >= 2
    sets = {s: np.unique(tables[s])[shared[np.unique(tables[s])]] for s in ids}
    count = np.zeros(num_blocks, np.int64)   # checked readers of each block so far
    chosen: list[int] = []
    left = set(ids)
    while len(chosen) < max_seqs:
        def gain(s):
            c = count[sets[s]]
            return (int((c == 1).sum()), int((c == 0).sum()), -s)
        best = max(left, key=gain)
        if gain(best)[:2] == (0, 0):
            break
        chosen.append(best)
        left.discard(best)
        count[sets[best]] += 1
    chosen += sorted(left)[:max_seqs - len(chosen)]
    return sorted(chosen)


@dataclass(frozen=True)
class StepCheck(SequenceCheck):
    """Result of one sequence of a mixed step: unified attention over its new tokens vs dense causal
    attention, and vs the same kernel on an identity block table (num_tokens = computed + new)."""
    num_computed_tokens: int = 0    # context already in the pool before the step
    num_new_tokens: int = 1         # the step's tokens of this sequence (1 = a decode)


@dataclass(frozen=True)
class StepReport(ValidationReport):
    """All sequences of one step of a simulated batch (prefills, chunked prefills, decodes), in
    batch order; num_skipped_empty is 0 (every scheduled sequence has a new token)."""
    sliding_window: int | None = None

    @property
    def num_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.checks)


# names of a step's arrays in a snapshot (attributes of a PoolSnapshot look-alike, or .npz fields)
STEP_FIELDS = ("step_seq_ids", "step_num_new_tokens", "step_num_computed_tokens")


@dataclass(frozen=True)
class StepArrays:
    """One step's batch (see ``validate_step``): int64 arrays of one entry per scheduled sequence."""
    seq_ids: np.ndarray
    num_new_tokens: np.ndarray
    num_computed_tokens: np.ndarray


def step_arrays(arrays: PoolArrays, seq_ids=None, num_new_tokens=None, num_computed_tokens=None) -> StepArrays:
    """The step's batch, from the arguments or else from the snapshot's ``step_*`` arrays.

    Args:
        arrays: the pool (PoolArrays).
        seq_ids: int [n], the step's sequences, in batch order (each once).
        num_new_tokens: int [n], >= 1: the tokens each computes this step (vLLM's
            num_scheduled_tokens; 1 for a decode).
        num_computed_tokens: int [n] or None: context already in the pool (vLLM's
            num_computed_tokens before the step). None: the snapshot's seq_lens minus the new
            tokens (a snapshot taken once the step's tokens are in the pool).
    Returns:
        StepArrays, checked against the pool: every sequence exists and its block table holds
        num_computed_tokens + num_new_tokens tokens.
    Raises:
        ValueError: naming the field and the sequence.
    """
    if seq_ids is None:
        missing = [n for n in STEP_FIELDS[:2] if n not in arrays.extra]
        if missing:
            raise ValueError(f"the snapshot has no step batch: field '{missing[0]}' is missing")
        seq_ids = arrays.extra["step_seq_ids"]
        num_new_tokens = arrays.extra["step_num_new_tokens"]
        num_computed_tokens = arrays.extra.get("step_num_computed_tokens")
    if num_new_tokens is None:
        raise ValueError("give num_new_tokens with seq_ids")
    ids = np.asarray(seq_ids, dtype=np.int64).reshape(-1)
    new = np.asarray(num_new_tokens, dtype=np.int64).reshape(-1)
    if len(new) != len(ids):
        raise ValueError(f"step_num_new_tokens has {len(new)} entries for {len(ids)} step_seq_ids")
    uniq, counts = np.unique(ids, return_counts=True)
    if len(uniq) != len(ids):
        raise ValueError(f"step_seq_ids names seq {int(uniq[np.argmax(counts)])} more than once")
    for s in ids:
        if int(s) not in arrays.block_tables:
            raise ValueError(f"step_seq_ids: seq {int(s)} has no block table in the snapshot")
    if len(new) and new.min() < 1:
        s = int(ids[np.argmin(new)])
        raise ValueError(f"step_num_new_tokens: seq {s} has {int(new.min())} new tokens; each needs at least 1")
    if num_computed_tokens is None:
        computed = np.array([arrays.seq_lens[int(s)] for s in ids], dtype=np.int64) - new
    else:
        computed = np.asarray(num_computed_tokens, dtype=np.int64).reshape(-1)
        if len(computed) != len(ids):
            raise ValueError(f"step_num_computed_tokens has {len(computed)} entries for {len(ids)} step_seq_ids")
    for s, c, n in zip(ids, computed, new):
        if c < 0:
            raise ValueError(f"seq_lens: seq {int(s)} has {int(c + n)} tokens, fewer than its {int(n)} new ones"
                             if num_computed_tokens is None else f"step_num_computed_tokens: seq {int(s)} has {int(c)}")
        need = -(-int(c + n) // arrays.block_size)
        if len(arrays.block_tables[int(s)]) < need:
            raise ValueError(f"step: seq {int(s)} needs {need} blocks of {arrays.block_size} for {int(c)} + {int(n)} "
                             f"tokens, its block table has {len(arrays.block_tables[int(s)])}")
    return StepArrays(ids, new, computed)


def with_step(snapshot, seq_ids, num_new_tokens, num_computed_tokens=None) -> PoolArrays:
    """The snapshot (as PoolArrays) carrying a step's batch, so that ``save_snapshot`` keeps it."""
    arrays = pool_arrays(snapshot)
    step = step_arrays(arrays, seq_ids, num_new_tokens, num_computed_tokens)
    extra = dict(arrays.extra, step_seq_ids=step.seq_ids, step_num_new_tokens=step.num_new_tokens,
                 step_num_computed_tokens=step.num_computed_tokens)
    return PoolArrays(arrays.block_size, arrays.num_blocks, arrays.block_key, arrays.block_tables, arrays.seq_lens,
                      arrays.kind, extra)


@dataclass(frozen=True)
class _SeqResult:
    seq_id: int
    seq_len: int
    num_blocks: int
    num_shared_blocks: int
    max_abs_err: float
    max_rel_err: float
    bitwise_equal: bool


def _run_batch(arrays: PoolArrays, seq_ids: list[int], computed: list[int], new: list[int], layout, dtype, device,
               num_kv_heads, num_heads, head_size, partition_size, sliding_window, seed) -> list[_SeqResult]:
    """Fill a pool with the batch's K/V, run ``unified_attention`` on the snapshot's block tables and
    on an identity table, and compare every sequence with float64 dense causal attention."""
    from kvsim.kernels import allocate_kv_cache, dense_causal_attention, reshape_and_cache, unified_attention

    bs = arrays.block_size
    lens = [c + n for c, n in zip(computed, new)]
    tables = {s: np.asarray(arrays.block_tables[s][:-(-n // bs)], dtype=np.int64) for s, n in zip(seq_ids, lens)}
    seeds = block_seeds(arrays)

    # every slot any sequence reads, written once; a shared block's slots are one set of slots
    def first_read(c):
        return 0 if sliding_window is None else max(0, c - sliding_window + 1)
    slot_lists = [tables[s][np.arange(first_read(c), n) // bs] * bs + np.arange(first_read(c), n) % bs
                  for s, c, n in zip(seq_ids, computed, lens)]
    slots = np.unique(np.concatenate(slot_lists)) if slot_lists else np.zeros(0, np.int64)
    kv = token_kv(seeds[slots // bs], slots % bs, num_kv_heads, head_size)
    key_cache, value_cache = allocate_kv_cache(arrays.num_blocks, bs, num_kv_heads, head_size, dtype, device, layout)
    # padding tokens (slot -1) between real ones must be skipped by reshape_and_cache
    slot_mapping = np.full(2 * len(slots), -1, dtype=np.int64)
    slot_mapping[::2] = slots
    kv_padded = np.zeros((2 * len(slots), 2, num_kv_heads, head_size))
    kv_padded[::2] = kv
    kv_padded[1::2] = 7.0  # padding tokens carry values of their own
    kv_t = torch.from_numpy(kv_padded).to(device=device, dtype=dtype)
    reshape_and_cache(kv_t[:, 0], kv_t[:, 1], key_cache, value_cache,
                      torch.from_numpy(slot_mapping).to(device), layout)

    rng = np.random.Generator(np.random.PCG64(seed))
    query = torch.from_numpy(rng.standard_normal((sum(new), num_heads, head_size))).to(device=device, dtype=dtype)
    width = max((len(tables[s]) for s in seq_ids), default=1)
    block_tables = torch.full((len(seq_ids), width), -1, dtype=torch.int32)  # unused entries: never read
    for i, s in enumerate(seq_ids):
        block_tables[i, :len(tables[s])] = torch.from_numpy(tables[s])
    seq_lens = torch.tensor(lens, dtype=torch.int32).to(device)
    qsl_host = np.concatenate([[0], np.cumsum(new)]).astype(np.int64)
    qsl = torch.from_numpy(qsl_host).to(torch.int32).to(device)
    scale = head_size ** -0.5

    def run(key_cache, value_cache, block_tables):
        return unified_attention(query, key_cache, value_cache, block_tables.to(device), seq_lens, qsl, scale, layout,
                                 sliding_window, partition_size=partition_size)
    out = run(key_cache, value_cache, block_tables)
    # identity table: the same blocks copied so that sequence i's blocks are contiguous
    flat_ids = torch.from_numpy(np.concatenate([tables[s] for s in seq_ids])).to(device)
    ident_tables = torch.full_like(block_tables, -1)
    start = 0
    for i, s in enumerate(seq_ids):
        ident_tables[i, :len(tables[s])] = torch.arange(start, start + len(tables[s]))
        start += len(tables[s])
    out_ident = run(key_cache[flat_ids], value_cache[flat_ids], ident_tables)

    holders = _readers(tables, arrays.num_blocks)
    q64 = query.to("cpu", torch.float64)
    out64 = out.to("cpu", torch.float64)
    results = []
    for i, (s, n) in enumerate(zip(seq_ids, lens)):
        rows = slice(int(qsl_host[i]), int(qsl_host[i + 1]))
        pos = np.arange(n)
        # dense K/V from the content function, rounded to the cache dtype as the pool stores them
        dense = torch.from_numpy(token_kv(seeds[tables[s][pos // bs]], pos % bs, num_kv_heads, head_size))
        dense = dense.to(dtype).to(torch.float64)
        ref = dense_causal_attention(q64[rows], dense[:, 0], dense[:, 1], scale, sliding_window)
        abs_err = float((out64[rows] - ref).abs().max())
        rel_err = abs_err / max(float(ref.abs().max()), 1e-30)
        same = bool(torch.equal(out[rows], out_ident[rows]))
        results.append(_SeqResult(int(s), int(n), len(tables[s]), int((holders[tables[s]] > 1).sum()), abs_err,
                                  rel_err, same))
    return results


def _check_fields(r: _SeqResult, tol: float) -> tuple:
    """SequenceCheck's fields of one result: passed = bitwise equal and within the tolerance."""
    return (r.seq_id, r.seq_len, r.num_blocks, r.num_shared_blocks, r.max_abs_err, r.max_rel_err, r.bitwise_equal,
            r.bitwise_equal and r.max_rel_err <= tol)


def _model_geometry(device, num_kv_heads, num_heads, head_size, dtype):
    on_gpu = device.type == "cuda"
    num_kv_heads = num_kv_heads or (8 if on_gpu else 2)
    num_heads = num_heads or (32 if on_gpu else 2 * num_kv_heads)
    head_size = head_size or (128 if on_gpu else 16)
    if dtype not in _TOLERANCE:
        raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
    return num_kv_heads, num_heads, head_size


def validate_snapshot(snapshot, *, layout: str = "flat", dtype: torch.dtype = torch.float32,
                      device: str | torch.device | None = None, num_kv_heads: int | None = None,
                      num_heads: int | None = None, head_size: int | None = None,
                      partition_size: int | None = None, max_seqs: int | None = None,
                      seed: int = 0, sliding_window: int | None = None) -> ValidationReport:
    """Run paged (decode) attention over a snapshot's block tables: every sequence's last token
    attends to all of its tokens (the last ``sliding_window`` with a window: a sliding-window
    group's tables hold the null block below it). Compare with dense attention (with the
    window mask) and with an identity table.

    Args:
        snapshot: PoolSnapshot look-alike or PoolArrays (see ``pool_arrays``).
        layout: "flat" or "vllm".
        dtype: KV and query dtype.
        device: "cuda" or "cpu" (None: CUDA when available; CPU needs TRITON_INTERPRET=1).
        num_kv_heads, num_heads, head_size: model geometry (None: 2/4/16 on CPU, 8/32/128 on GPU).
        partition_size: None = dispatch rule; an int forces split-KV (v2).
        max_seqs: validate at most max_seqs sequences, chosen so that shared blocks are read by
            two of them (``choose_sequences``); the report says how many shared blocks were.
        seed: seed of the queries (numpy PCG64).
        sliding_window: None or the window in tokens.
    Returns:
        ValidationReport, one SequenceCheck per checked sequence with tokens.
    """
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
    arrays = pool_arrays(snapshot)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    num_kv_heads, num_heads, head_size = _model_geometry(device, num_kv_heads, num_heads, head_size, dtype)
    bs = arrays.block_size
    seq_ids = sorted(arrays.block_tables)
    num_empty = sum(arrays.seq_lens[s] == 0 for s in seq_ids)
    all_tables = {s: np.asarray(arrays.block_tables[s][:-(-arrays.seq_lens[s] // bs)], dtype=np.int64)
                  for s in seq_ids if arrays.seq_lens[s] > 0}
    if sliding_window is not None:
        # the blocks the last token reads: from its window's first position (a sliding-window
        # group's positions below it hold the null block, which is not sharing)
        all_tables = {s: t[max(0, arrays.seq_lens[s] - sliding_window) // bs:]
                      for s, t in all_tables.items()}
    seq_ids = choose_sequences(all_tables, arrays.num_blocks, max_seqs)
    coverage = dict(num_sequences=len(all_tables),
                    num_shared_blocks=int((_readers(all_tables, arrays.num_blocks) >= 2).sum()),
                    num_shared_blocks_checked=int((_readers({s: all_tables[s] for s in seq_ids},
                                                            arrays.num_blocks) >= 2).sum()))
    tol = _TOLERANCE[dtype]
    results = _run_batch(arrays, seq_ids, [arrays.seq_lens[s] - 1 for s in seq_ids], [1] * len(seq_ids), layout,
                         dtype, device, num_kv_heads, num_heads, head_size, partition_size, sliding_window,
                         seed) \
        if seq_ids else []
    checks = [SequenceCheck(*_check_fields(r, tol)) for r in results]
    if sliding_window is not None and checks:   # shared = read by two checked sequences
        readers = _readers({s: all_tables[s] for s in seq_ids}, arrays.num_blocks)
        checks = [replace(c, num_shared_blocks=int(
            (readers[np.unique(all_tables[c.seq_id])] > 1).sum())) for c in checks]
    return ValidationReport(checks, int(num_empty), tol, str(dtype).replace("torch.", ""), layout, str(device),
                            partition_size, num_kv_heads, num_heads, head_size, **coverage)


def validate_step(snapshot, seq_ids=None, num_new_tokens=None, num_computed_tokens=None, *,
                  layout: str = "flat", dtype: torch.dtype = torch.float32,
                  device: str | torch.device | None = None, num_kv_heads: int | None = None,
                  num_heads: int | None = None, head_size: int | None = None,
                  partition_size: int | None = None, sliding_window: int | None = None,
                  seed: int = 0) -> StepReport:
    """Run one mixed step of a simulated batch (prefills, chunked prefills after a prefix hit,
    decodes, in one launch of ``unified_attention``) over a pool snapshot's block tables and
    compare every sequence's new tokens with float64 dense causal attention over its own tokens,
    and bitwise with the same kernel on an identity block table.

    Array contract (plain arrays; ``step_arrays`` checks them):
        snapshot: the pool (PoolSnapshot look-alike or PoolArrays): block_size, num_cells,
            block_key (content keys: blocks with equal keys get equal K/V, so shared prefix blocks
            are real sharing), block_tables {seq_id: block ids}, seq_lens {seq_id: tokens}.
        seq_ids: int [n], the step's sequences in batch order (query rows follow this order).
        num_new_tokens: int [n] >= 1, tokens each computes in the step (1 = decode; a chunk of a
            prefill; the uncached part of a prompt after a prefix-cache hit).
        num_computed_tokens: int [n] or None, tokens already in the pool before the step; None =
            seq_lens[seq] - num_new_tokens (the snapshot is taken with the step's tokens in the pool).
        The three may instead travel in the snapshot as arrays ``step_seq_ids``,
        ``step_num_new_tokens`` and (optional) ``step_num_computed_tokens`` (``with_step``,
        ``save_snapshot`` keeps them). Sequence i's new token j sits at position
        num_computed_tokens[i] + j; its block table must hold num_computed_tokens[i] +
        num_new_tokens[i] tokens.

    Args (the rest): as in ``validate_snapshot``; sliding_window: None or the model's window.
    Returns:
        StepReport, one StepCheck per sequence, in batch order.
    Raises:
        ValueError: the step does not fit the snapshot (naming the field and sequence).
    """
    arrays = pool_arrays(snapshot)
    step = step_arrays(arrays, seq_ids, num_new_tokens, num_computed_tokens)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    num_kv_heads, num_heads, head_size = _model_geometry(device, num_kv_heads, num_heads, head_size, dtype)
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
    ids, computed, new = ([int(x) for x in a] for a in (step.seq_ids, step.num_computed_tokens, step.num_new_tokens))
    tol = _TOLERANCE[dtype]
    results = _run_batch(arrays, ids, computed, new, layout, dtype, device, num_kv_heads, num_heads, head_size,
                         partition_size, sliding_window, seed) if ids else []
    checks = [StepCheck(*_check_fields(r, tol), c, n) for r, c, n in zip(results, computed, new)]
    # every sequence of the step is checked: each block two of them read is exercised
    shared = int((_readers({s: np.asarray(arrays.block_tables[s][:-(-(c + n) // arrays.block_size)])
                            for s, c, n in zip(ids, computed, new)}, arrays.num_blocks) >= 2).sum())
    return StepReport(checks, 0, tol, str(dtype).replace("torch.", ""), layout, str(device), partition_size,
                      num_kv_heads, num_heads, head_size, num_sequences=len(checks),
                      num_shared_blocks=shared, num_shared_blocks_checked=shared,
                      sliding_window=sliding_window)
