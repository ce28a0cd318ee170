"""The step executor: run the very steps the simulator schedules, on the very block tables, and time them.

A decoder of a ``DecoderShape`` (random weights) over a paged KV pool of ``num_blocks`` blocks. Each
step takes what vLLM's model runner takes from its scheduler, as plain arrays (``StepInputs``)::

    token_ids, positions, slot_mapping      [num_tokens]     (slot = block * block_size + offset; < 0 = padding)
    block_tables                            [num_seqs, max_num_blocks_per_seq]
    seq_lens                                [num_seqs]       (context after the step, new tokens included)
    query_start_loc                         [num_seqs + 1]   (sequence i's new tokens are [qsl[i], qsl[i+1]))

and runs embedding, then per layer RMSNorm, QKV, RoPE, ``reshape_and_cache`` (new tokens' K/V into
their slots), attention through the block tables, output projection, residual + RMSNorm, SwiGLU MLP;
then logits at the sampled positions (each sequence's last token, as vLLM v1 computes them) and a
greedy sample. Every step is timed with CUDA events, from its first kernel to the sample (the
copy of its inputs before it is not timed); a run whose launch took over COMPILE_LAUNCH_S on the
host compiled a kernel (the first use of a Triton specialization) and is run and timed again.

Decode-only steps (one new token per sequence) replay CUDA graphs captured at padded batch sizes
(vLLM's list: 1, 2, 4, 8, 16, ..., 248, 256, 272, ...), padding with slot -1 / seq_len 1 rows that
read block 0 and write nothing; graphs are captured the first time a size is needed. A graph's
attention launch is planned for a context bucket (the step's longest context rounded up to a power
of two, at least 4096): above 4096 tokens, batches of at least one wave split every sequence into
up to 16 partitions, so that one long sequence among short ones does not leave a single program
reading it while the rest of the GPU idles. Other steps
(prefill chunks, mixed batches) run eagerly: attention there is the unified prefill+decode kernel
when ``kvsim.kernels`` has one, else ``torch_attention`` (gather + SDPA; slow, for checking).
Decode attention is ``kvsim.kernels.paged_attention`` (the tuned decode kernel; CUDA-graph safe:
its grid depends only on the batch size and max_model_len).

Never imports the simulator: the CLI hands each scheduled step's arrays in and takes the time out.
Re-running a step is idempotent (it writes the same K/V to the same slots), which the profiler uses
to time a step many times.
"""
from __future__ import annotations

import importlib
import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from kvsim.kernels.attention import attention_workspace, paged_attention
from kvsim.kernels.cache import reshape_and_cache
from kvsim.kernels.decoder import DecoderShape, DecoderWeights, random_weights
from kvsim.kernels.layers import add_rms_norm, rms_norm_reference, rope_, rope_cos_sin, silu_and_mul

GIB = 2**30
COMPILE_LAUNCH_S = 0.2     # host time to launch a step above which it must have compiled a kernel
MIN_BUCKET_TOKENS = 4096   # decode graphs are planned for contexts of 4096, 8192, ... tokens
SPLIT_PARTITIONS = 16      # long-context decode: partitions per sequence (the fused merge's limit at GQA 4)


def piecewise_capture_sizes() -> list[int]:
    """Token counts of vLLM's piecewise graphs for mixed steps: 1, 2, 4, 8, 16, ..., 248, 256, 272,
    ..., 512 (larger steps run eagerly, as there)."""
    return [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))


def cudagraph_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's default decode capture sizes, ``[1, 2, 4] + range(8, 256, 8) + range(256, cap + 1, 16)``
    with cap = min(2 * max_num_seqs, 512), cut after the first size >= max_num_seqs (a decode batch
    never holds more sequences than that)."""
    cap = min(2 * max_num_seqs, 512)
    sizes = [s for s in [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, cap + 1, 16)) if s <= cap]
    out = []
    for s in sizes:
        out.append(s)
        if s >= max_num_seqs:
            break
    return out


# ------------------------------------------------------------------------------------ inputs
@dataclass
class StepInputs:
    """One scheduled step as plain int arrays (module docstring); ``logits_indices`` defaults to
    each sequence's last new token (``query_start_loc[1:] - 1``)."""
    token_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    block_tables: np.ndarray
    seq_lens: np.ndarray
    query_start_loc: np.ndarray
    logits_indices: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def query_lens(self) -> np.ndarray:
        return np.diff(self.query_start_loc)

    @property
    def decode_only(self) -> bool:
        """Every sequence computes one token (vLLM's uniform decode batch)."""
        return self.num_seqs > 0 and self.num_tokens == self.num_seqs

    def check(self, num_blocks: int, block_size: int, max_model_len: int, vocab_size: int) -> None:
        """Raise ValueError (naming the array and index) unless the step fits the executor's pool."""
        n, s = self.num_tokens, self.num_seqs
        for name in ("token_ids", "positions", "slot_mapping"):
            if np.shape(getattr(self, name)) != (n,):
                raise ValueError(f"{name} must have num_tokens={n} entries, got shape {np.shape(getattr(self, name))}")
        if s == 0 or n == 0:
            raise ValueError("a step needs at least one sequence and one token")
        qsl = np.asarray(self.query_start_loc)
        if qsl.shape != (s + 1,) or qsl[0] != 0 or qsl[-1] != n or np.any(np.diff(qsl) < 1):
            raise ValueError(f"query_start_loc must rise strictly from 0 to num_tokens={n} over num_seqs+1={s + 1} "
                             f"entries, got {qsl.tolist()[:8]}")
        bt = np.asarray(self.block_tables)
        if bt.ndim != 2 or bt.shape[0] != s:
            raise ValueError(f"block_tables must be [num_seqs={s}, width], got shape {bt.shape}")
        lens = np.asarray(self.seq_lens)
        q = np.diff(qsl)
        if np.any(lens < q) or lens.max() > max_model_len:
            i = int(np.argmax((lens < q) | (lens > max_model_len)))
            raise ValueError(f"seq_lens[{i}] = {int(lens[i])} must be >= its {int(q[i])} new tokens and "
                             f"<= max_model_len={max_model_len}")
        need = -(-lens // block_size)
        if need.max() > bt.shape[1]:
            i = int(np.argmax(need))
            raise ValueError(f"seq_lens[{i}] = {int(lens[i])} needs {int(need[i])} blocks; block_tables has "
                             f"{bt.shape[1]} columns")
        used = np.arange(bt.shape[1])[None, :] < need[:, None]
        bad = used & ((bt < 0) | (bt >= num_blocks))
        if bad.any():
            i, j = (int(x) for x in np.argwhere(bad)[0])
            raise ValueError(f"block_tables[{i}, {j}] = {int(bt[i, j])} is outside the pool of {num_blocks} blocks")
        pos = np.asarray(self.positions)
        if pos.min() < 0 or pos.max() >= max_model_len:
            raise ValueError(f"positions must lie in [0, max_model_len={max_model_len}), got "
                             f"[{int(pos.min())}, {int(pos.max())}]")
        slots = np.asarray(self.slot_mapping)
        if slots.max() >= num_blocks * block_size:
            raise ValueError(f"slot_mapping holds {int(slots.max())}, past the pool's {num_blocks * block_size} slots")
        ids = np.asarray(self.token_ids)
        if ids.min() < 0 or ids.max() >= vocab_size:
            raise ValueError(f"token_ids must lie in [0, vocab_size={vocab_size})")
        if self.logits_indices is not None:
            li = np.asarray(self.logits_indices)
            if li.ndim != 1 or len(li) == 0 or li.min() < 0 or li.max() >= n:
                raise ValueError(f"logits_indices must index the step's {n} tokens")


def build_step(block_tables: Sequence[Sequence[int]], num_computed_tokens: Sequence[int],
               num_new_tokens: Sequence[int], block_size: int, vocab_size: int,
               token_ids: np.ndarray | None = None) -> StepInputs:
    """StepInputs of sequences that each compute ``num_new_tokens[i]`` tokens after
    ``num_computed_tokens[i]`` cached ones, their KV living in ``block_tables[i]``.

    Args:
        block_tables: per sequence, its block ids (at least enough for its context after the step).
        num_computed_tokens, num_new_tokens: per sequence (vLLM's names).
        block_size: tokens per block.
        vocab_size: token ids default to a fixed hash of (sequence, position) below it (timing
            does not depend on the values).
        token_ids: the step's token ids, if known.
    """
    computed = np.asarray(num_computed_tokens, dtype=np.int64)
    new = np.asarray(num_new_tokens, dtype=np.int64)
    num_seqs = len(new)
    qsl = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(new, out=qsl[1:])
    width = max((len(t) for t in block_tables), default=1) or 1
    bt = np.zeros((num_seqs, width), dtype=np.int64)
    for i, table in enumerate(block_tables):
        bt[i, :len(table)] = table
    seq_of_token = np.repeat(np.arange(num_seqs), new)
    positions = computed[seq_of_token] + (np.arange(int(qsl[-1])) - qsl[:-1][seq_of_token])
    slots = bt[seq_of_token, positions // block_size] * block_size + positions % block_size
    if token_ids is None:
        token_ids = (positions * 2654435761 + seq_of_token * 40503 + 12345) % vocab_size
    return StepInputs(np.asarray(token_ids, dtype=np.int64), positions, slots, bt, computed + new, qsl)


# ------------------------------------------------------------------------------------ attention
def torch_attention(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale,
                    layout="flat", sliding_window=None, **_):
    """Plain-torch attention with the unified kernel's contract (per sequence: gather its blocks,
    SDPA with the causal mask of its new tokens at the end of its context). Slow; for checks.

    Returns:
        [num_tokens, num_heads, head_size] in query's dtype.
    """
    from kvsim.kernels.reference import gather_kv
    out = torch.empty_like(query)
    qsl = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        lo, hi = qsl[i], qsl[i + 1]
        k, v = gather_kv(key_cache, value_cache, block_tables[i], seq_len, layout)
        q_pos = torch.arange(seq_len - (hi - lo), seq_len, device=query.device)
        k_pos = torch.arange(seq_len, device=query.device)
        mask = k_pos[None, :] <= q_pos[:, None]
        if sliding_window is not None:
            mask &= k_pos[None, :] > q_pos[:, None] - sliding_window
        o = F.scaled_dot_product_attention(query[lo:hi].transpose(0, 1)[None], k.transpose(0, 1)[None],
                                           v.transpose(0, 1)[None], attn_mask=mask, scale=scale,
                                           enable_gqa=True)
        out[lo:hi] = o[0].transpose(0, 1)
    return out


def kernels_unified_attention() -> Callable | None:
    """``kvsim.kernels.unified_attention`` (the prefill + decode Triton kernel), or None while the
    package has none."""
    try:
        return getattr(importlib.import_module("kvsim.kernels"), "unified_attention")
    except AttributeError:
        return None


# ------------------------------------------------------------------------------------ executor
@dataclass
class StepResult:
    time_s: float                   # CUDA-event time (wall clock on the CPU) of the step
    graph: bool                     # replayed captured CUDA graphs (whole step, or its pieces)
    padded_num_seqs: int            # batch size it ran at (decode graph size, or num_seqs)
    padded_num_tokens: int          # tokens it ran at (graph or piece size, or num_tokens)
    next_token_ids: torch.Tensor    # [num_seqs] greedy samples (device)
    logits: torch.Tensor | None     # [num_seqs, vocab] when asked for


@dataclass
class _Views:
    """Device views of one step's packed inputs, plus what the host knows about them."""
    token_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    logits_indices: torch.Tensor
    block_tables: torch.Tensor
    decode_only: bool
    max_seq_len: int
    max_query_len: int
    partition_size: int | None = None   # decode attention: forced split-KV partition (None: plan)


def _layout(num_tokens: int, num_seqs: int, width: int) -> list[tuple[str, int, tuple[int, ...]]]:
    """(name, offset, shape) of each input in the packed int32 buffer."""
    fields = [("token_ids", (num_tokens,)), ("positions", (num_tokens,)), ("slot_mapping", (num_tokens,)),
              ("seq_lens", (num_seqs,)), ("query_start_loc", (num_seqs + 1,)), ("logits_indices", (num_seqs,)),
              ("block_tables", (num_seqs, width))]
    out, off = [], 0
    for name, shape in fields:
        out.append((name, off, shape))
        off += math.prod(shape)
    return out


def _packed_len(num_tokens: int, num_seqs: int, width: int) -> int:
    return 3 * num_tokens + 3 * num_seqs + 1 + num_seqs * width


def memory_estimate_bytes(shape: DecoderShape, num_blocks: int, block_size: int, max_num_batched_tokens: int,
                          max_num_seqs: int, dtype: torch.dtype) -> dict[str, int]:
    """Device memory the executor takes: weights, KV pool, activations of the largest step, logits."""
    elem = torch.empty((), dtype=dtype).element_size()
    per_token = (4 * shape.hidden_size + shape.qkv_size + shape.num_attention_heads * shape.head_dim
                 + 3 * shape.intermediate_size) * elem
    return {"weights": shape.weight_bytes(dtype),
            "kv_cache": num_blocks * block_size * shape.kv_bytes_per_token(dtype),
            "activations": int(1.5 * per_token * max_num_batched_tokens),
            "logits": max_num_seqs * shape.vocab_size * (elem + 4)}


def check_device_memory(estimate_bytes: dict[str, int], free_bytes: int, device_name: str) -> None:
    """Raise ValueError (with the numbers) unless ``estimate_bytes`` plus 1 GiB of slack (CUDA
    graphs, workspaces, allocator) fits in ``free_bytes``; called before anything is allocated."""
    need = sum(estimate_bytes.values()) + GIB
    if need > free_bytes:
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in estimate_bytes.items())
        raise ValueError(f"the executor needs {need / GIB:.1f} GiB ({parts}, + 1 GiB slack) but "
                         f"{free_bytes / GIB:.1f} GiB are free on {device_name}: use fewer KV blocks "
                         "or a smaller max_num_batched_tokens")


class StepExecutor:
    """Runs and times scheduled steps of a random-weight decoder over a paged KV pool.

    Args:
        shape: the model (``DecoderShape``).
        num_blocks, block_size: the KV pool (the simulated pool's, or fewer blocks, stated).
        max_num_seqs, max_num_batched_tokens, max_model_len: the engine limits steps stay within.
        dtype, device: bf16 on CUDA for timing; fp32 on the CPU (Triton interpreter) for tests.
        weights: DecoderWeights to use (default: ``random_weights(shape, dtype, device, seed)``).
        seed: weight seed.
        attention: the mixed-step attention (unified_attention's contract); None = the unified
            kernel of ``kvsim.kernels`` if present, else ``torch_attention``.
        cuda_graphs: replay captured graphs for decode-only steps (CUDA only).
        pad_steps: pad steps to the capture sizes even when running them eagerly (default: with
            CUDA graphs only); tests use it to check the padding and the pieces on the CPU.
        fill_kv: fill the pool with random values (timing never runs on zeros; a slot read before
            it is written holds finite data).
    Raises:
        ValueError: the pool and model do not fit the device's free memory (numbers given).
    """

    def __init__(self, shape: DecoderShape, *, num_blocks: int, block_size: int = 16, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, max_model_len: int = 8192,
                 dtype: torch.dtype = torch.bfloat16, device=None, weights: DecoderWeights | None = None,
                 seed: int = 0, attention: Callable | None = None, cuda_graphs: bool = True,
                 pad_steps: bool | None = None, fill_kv: bool = True):
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size), ("max_num_seqs", max_num_seqs),
                            ("max_num_batched_tokens", max_num_batched_tokens), ("max_model_len", max_model_len)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.shape, self.dtype = shape, dtype
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.memory_bytes = memory_estimate_bytes(shape, num_blocks, block_size, max_num_batched_tokens,
                                                  max_num_seqs, dtype)
        if weights is not None:
            self.memory_bytes["weights"] = 0
        if self.device.type == "cuda":
            check_device_memory(self.memory_bytes, torch.cuda.mem_get_info(self.device)[0],
                                torch.cuda.get_device_name(self.device))
        self.weights = weights if weights is not None else random_weights(shape, dtype, self.device, seed)
        kv_shape = (shape.num_layers, 2, num_blocks, block_size, shape.num_kv_heads, shape.head_dim)
        self.kv_cache = torch.empty(kv_shape, dtype=dtype, device=self.device)
        if fill_kv:
            self.kv_cache.normal_(0.0, 1.0, generator=torch.Generator(self.device).manual_seed(seed + 1))
        self.cos, self.sin = rope_cos_sin(shape.head_dim, shape.rope_theta, shape.rope_scaling, max_model_len,
                                          device=self.device)
        self.scale = shape.head_dim ** -0.5
        unified = kernels_unified_attention()
        self.attention = attention or unified or torch_attention
        self.attention_name = getattr(self.attention, "__name__", type(self.attention).__name__)
        # one merge counter per (q-block, KV head): a mixed step has at most
        # max_num_batched_tokens + max_num_seqs q-blocks (unified_attention splits its decodes)
        self._workspace = attention_workspace(max(max_num_batched_tokens + max_num_seqs, 512), shape.num_kv_heads,
                                              self.device)
        self.capture_sizes = cudagraph_capture_sizes(max_num_seqs)
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self.pad_steps = self.cuda_graphs if pad_steps is None else pad_steps
        self.piecewise_sizes = [t for t in piecewise_capture_sizes() if t <= max_num_batched_tokens]
        self._pieces: dict[int, list] = {}
        self._pw = None
        biggest = max(_packed_len(max(max_num_batched_tokens, 512), max_num_seqs, self.max_blocks_per_seq),
                      _packed_len(self.capture_sizes[-1], self.capture_sizes[-1], self.max_blocks_per_seq))
        self._dev_ints = torch.zeros(biggest, dtype=torch.int32, device=self.device)
        self._host_ints = torch.zeros(biggest, dtype=torch.int32,
                                      pin_memory=self.device.type == "cuda")
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}
        self._graph_pool = None

    # -------------------------------------------------------------- packing
    def _pack(self, step: StepInputs, num_tokens: int, num_seqs: int, width: int) -> int:
        """Write the step, padded to (num_tokens, num_seqs, width), into the pinned host buffer."""
        host = self._host_ints.numpy()
        n, s = step.num_tokens, step.num_seqs
        li = step.logits_indices if step.logits_indices is not None else step.query_start_loc[1:] - 1
        total = _packed_len(num_tokens, num_seqs, width)
        values = {"token_ids": (step.token_ids, 0), "positions": (step.positions, 0),
                  "slot_mapping": (step.slot_mapping, -1), "seq_lens": (step.seq_lens, 1),
                  "logits_indices": (li, None), "query_start_loc": (step.query_start_loc, None)}
        for name, off, shape in _layout(num_tokens, num_seqs, width):
            if name == "block_tables":
                # entries past a sequence's last block are never read: only the used columns are
                # written (stale values elsewhere are harmless); padding rows read block 0
                bt = host[off:off + num_seqs * width].reshape(num_seqs, width)
                w = min(width, step.block_tables.shape[1])
                bt[:s, :w] = step.block_tables[:, :w]
                bt[s:, 0] = 0
                continue
            arr, pad = values[name]
            k = len(arr)
            host[off:off + k] = arr
            if name == "query_start_loc":   # padding sequences take one padding token each
                host[off + k:off + shape[0]] = np.arange(n + 1, n + 1 + shape[0] - k)
            elif name == "logits_indices":
                host[off + k:off + shape[0]] = np.arange(n, n + shape[0] - k)
            else:
                host[off + k:off + shape[0]] = pad
        return total

    def _views(self, num_tokens: int, num_seqs: int, width: int, decode_only: bool, max_seq_len: int,
               max_query_len: int) -> _Views:
        parts = {}
        for name, off, shape in _layout(num_tokens, num_seqs, width):
            parts[name] = self._dev_ints[off:off + math.prod(shape)].view(shape)
        return _Views(**parts, decode_only=decode_only, max_seq_len=max_seq_len, max_query_len=max_query_len,
                      partition_size=self._decode_partition(num_seqs, max_seq_len) if decode_only else None)

    def context_bucket(self, max_seq_len: int) -> int:
        """The context a decode graph is planned for: max_seq_len rounded up to a power of two,
        at least MIN_BUCKET_TOKENS, at most max_model_len."""
        bucket = MIN_BUCKET_TOKENS
        while bucket < max_seq_len:
            bucket *= 2
        return min(bucket, self.max_model_len)

    def _decode_partition(self, num_seqs: int, max_seq_len: int) -> int | None:
        # under one wave the attention kernel's own plan splits to fill the GPU; from one wave on it
        # would run one program per (sequence, KV head): split long contexts so that the longest
        # sequence is not read by one program alone
        if self.device.type != "cuda" or max_seq_len <= MIN_BUCKET_TOKENS:
            return None
        if num_seqs * self.shape.num_kv_heads < torch.cuda.get_device_properties(self.device).multi_processor_count:
            return None
        return 16 * -(-max_seq_len // (SPLIT_PARTITIONS * 16))

    # -------------------------------------------------------------- the model
    def _attend(self, q, key_cache, value_cache, v: _Views) -> torch.Tensor:
        if v.decode_only:
            return paged_attention(q, key_cache, value_cache, v.block_tables, v.seq_lens, self.scale, "flat",
                                   v.partition_size, max_seq_len=v.max_seq_len, validate=False,
                                   workspace=self._workspace, sliding_window=self.shape.sliding_window)
        return self.attention(q, key_cache, value_cache, v.block_tables, v.seq_lens, v.query_start_loc,
                              self.scale, layout="flat", sliding_window=self.shape.sliding_window,
                              max_seq_len=v.max_seq_len, max_query_len=v.max_query_len, validate=False,
                              workspace=self._workspace)

    def _qkv(self, layer: int, h: torch.Tensor, v: _Views, out: torch.Tensor | None = None) -> torch.Tensor:
        """QKV projection (into ``out`` if given), q/k norms, RoPE, and the new K/V into the pool."""
        s, lw = self.shape, self.weights.layers[layer]
        nq, nkv, hd = s.num_attention_heads, s.num_kv_heads, s.head_dim
        if out is None:
            qkv = F.linear(h, lw.qkv, lw.qkv_bias)
        else:
            qkv = torch.matmul(h, lw.qkv.t(), out=out)
            if lw.qkv_bias is not None:
                qkv += lw.qkv_bias
        num_tokens = qkv.shape[0]
        if s.qk_norm:
            q = qkv[:, :nq * hd].view(num_tokens, nq, hd)
            k = qkv[:, nq * hd:(nq + nkv) * hd].view(num_tokens, nkv, hd)
            q.copy_(rms_norm_reference(q, lw.q_norm, s.rms_norm_eps))
            k.copy_(rms_norm_reference(k, lw.k_norm, s.rms_norm_eps))
        rope_(qkv, v.positions, self.cos, self.sin, nq + nkv)
        reshape_and_cache(qkv[:, nq * hd:(nq + nkv) * hd].view(num_tokens, nkv, hd),
                          qkv[:, (nq + nkv) * hd:].view(num_tokens, nkv, hd),
                          self.kv_cache[layer, 0], self.kv_cache[layer, 1], v.slot_mapping, validate=False)
        return qkv

    def _layer_attention(self, layer: int, qkv: torch.Tensor, v: _Views, num_tokens: int,
                         out: torch.Tensor | None = None) -> torch.Tensor:
        s = self.shape
        q = qkv[:num_tokens, :s.num_attention_heads * s.head_dim].view(num_tokens, s.num_attention_heads, s.head_dim)
        attn = self._attend(q, self.kv_cache[layer, 0], self.kv_cache[layer, 1], v)
        if out is not None:
            out[:num_tokens].copy_(attn)
            return out
        return attn

    def _mlp(self, layer: int, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Output projection, residual + post-attention norm, SwiGLU MLP (residual updated in place)."""
        s, lw = self.shape, self.weights.layers[layer]
        x = F.linear(attn.reshape(attn.shape[0], s.num_attention_heads * s.head_dim), lw.o)
        h = add_rms_norm(x, residual, lw.post_norm, s.rms_norm_eps)
        return F.linear(silu_and_mul(F.linear(h, lw.gate_up)), lw.down)

    def _logits(self, x: torch.Tensor, residual: torch.Tensor, idx: torch.Tensor):
        h = add_rms_norm(x.index_select(0, idx), residual.index_select(0, idx), self.weights.final_norm,
                         self.shape.rms_norm_eps)
        logits = F.linear(h, self.weights.lm_head)
        return logits, logits.argmax(dim=-1)

    def _forward(self, v: _Views) -> tuple[torch.Tensor, torch.Tensor]:
        eps = self.shape.rms_norm_eps
        num_tokens = v.token_ids.shape[0]
        x = F.embedding(v.token_ids, self.weights.embed)
        residual = None
        for layer, lw in enumerate(self.weights.layers):
            h = add_rms_norm(x, residual, lw.input_norm, eps)
            if residual is None:
                residual = x
            qkv = self._qkv(layer, h, v)
            x = self._mlp(layer, self._layer_attention(layer, qkv, v, num_tokens), residual)
        return self._logits(x, residual, v.logits_indices)

    # -------------------------------------------------------------- piecewise graphs (mixed steps)
    def _piece(self, i: int, v: _Views) -> None:
        """Piece i of a padded mixed step: everything between two attentions, on the static buffers
        (0: embedding, norm, QKV of layer 0; i: layer i-1's MLP, layer i's norm and QKV; L: the last
        MLP into the hidden buffer)."""
        b, eps, size = self._pw, self.shape.rms_norm_eps, v.token_ids.shape[0]
        residual = b["residual"][:size]
        layers = self.weights.layers
        if i == 0:
            x = F.embedding(v.token_ids, self.weights.embed)
            residual.copy_(x)
            h = add_rms_norm(x, None, layers[0].input_norm, eps)
        else:
            x = self._mlp(i - 1, b["attn"][:size], residual)
            if i == len(layers):
                b["hidden"][:size].copy_(x)
                return
            h = add_rms_norm(x, residual, layers[i].input_norm, eps)
        self._qkv(i, h, v, out=b["qkv"][:size])

    def _piecewise_buffers(self) -> None:
        if getattr(self, "_pw", None) is None:
            s, n = self.shape, self.piecewise_sizes[-1]
            def buf(*shape):
                return torch.zeros(shape, dtype=self.dtype, device=self.device)
            self._pw = {"residual": buf(n, s.hidden_size), "qkv": buf(n, s.qkv_size),
                        "attn": buf(n, s.num_attention_heads, s.head_dim), "hidden": buf(n, s.hidden_size)}

    def _piecewise_graphs(self, size: int, v: _Views) -> list:
        """The captured pieces of padded size ``size`` (captured on first use)."""
        if size in self._pieces:
            return self._pieces[size]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        graphs = []
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        for i in range(self.shape.num_layers + 1):
            with torch.cuda.stream(stream), torch.inference_mode():
                self._piece(i, v)    # compiles outside the capture
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(graph, pool=self._graph_pool):
                self._piece(i, v)
            graphs.append(graph)
        self._pieces[size] = graphs
        return graphs

    def _piecewise_forward(self, v: _Views, num_tokens: int, graphs: list | None):
        """A padded mixed step: pieces (replayed, or run eagerly when ``graphs`` is None) with the
        attention of the real tokens between them, then the logits."""
        b = self._pw
        for i in range(self.shape.num_layers + 1):
            if graphs is None:
                self._piece(i, v)
            else:
                graphs[i].replay()
            if i < self.shape.num_layers:
                self._layer_attention(i, b["qkv"], v, num_tokens, out=b["attn"])
        size = v.token_ids.shape[0]
        return self._logits(b["hidden"][:size], b["residual"][:size], v.logits_indices)

    # -------------------------------------------------------------- graphs
    def graph_size(self, num_seqs: int) -> int | None:
        """The captured batch size a decode step of ``num_seqs`` sequences pads to (None: unpadded)."""
        if not self.pad_steps:
            return None
        for size in self.capture_sizes:
            if size >= num_seqs:
                return size
        return None

    def _graph(self, size: int, bucket: int):
        key = (size, bucket)
        if key in self._graphs:
            return self._graphs[key]
        width = self.max_blocks_per_seq
        n = _packed_len(size, size, width)
        pad = StepInputs(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                         np.zeros((0, width), np.int64), np.zeros(0, np.int64), np.zeros(1, np.int64))
        self._pack(pad, size, size, width)
        self._dev_ints[:n].copy_(self._host_ints[:n])
        views = self._views(size, size, width, True, bucket, 1)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), torch.inference_mode():
            self._forward(views)   # compiles this size's Triton kernels outside the capture
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph, pool=self._graph_pool):
            out = self._forward(views)
        self._graphs[key] = (graph, out)
        return graph, out

    # -------------------------------------------------------------- running
    def execute(self, step: StepInputs, *, return_logits: bool = False) -> StepResult:
        """Run one step (writing its K/V into the pool) and time it.

        Returns:
            StepResult with the step's time in seconds (CUDA events on GPU).
        Raises:
            ValueError: the step does not fit the pool or the engine limits.
        """
        step.check(self.num_blocks, self.block_size, self.max_model_len, self.shape.vocab_size)
        if step.num_tokens > self.max_num_batched_tokens or step.num_seqs > max(self.max_num_seqs, 1):
            raise ValueError(f"the step has {step.num_tokens} tokens of {step.num_seqs} sequences; the "
                             f"executor was sized for {self.max_num_batched_tokens} and {self.max_num_seqs}")
        size = self.graph_size(step.num_seqs) if step.decode_only else None
        cuda = self.device.type == "cuda"
        graph = pieces = None
        piece_size = None if size is not None or not self.pad_steps else \
            next((t for t in self.piecewise_sizes if t >= step.num_tokens), None)
        if piece_size is not None:
            # pack and copy first: the capture runs this very step's pieces (idempotent)
            width = max(1, int(-(-int(step.seq_lens.max()) // self.block_size)))
            n = self._pack(step, piece_size, step.num_seqs, width)
            self._dev_ints[:n].copy_(self._host_ints[:n], non_blocking=cuda)
            views = self._views(piece_size, step.num_seqs, width, False, int(step.seq_lens.max()),
                                int(step.query_lens.max()))
            self._piecewise_buffers()
            if self.cuda_graphs:
                pieces = self._piecewise_graphs(piece_size, views)
        elif size is not None:
            bucket = self.context_bucket(int(step.seq_lens.max()))
            if self.cuda_graphs:
                graph, out = self._graph(size, bucket)   # captured on first use (packs a dummy step)
            else:
                views = self._views(size, size, self.max_blocks_per_seq, True, bucket, 1)
            n = self._pack(step, size, size, self.max_blocks_per_seq)
        else:
            width = max(1, int(-(-int(step.seq_lens.max()) // self.block_size)))
            n = self._pack(step, step.num_tokens, step.num_seqs, width)
            views = self._views(step.num_tokens, step.num_seqs, width, step.decode_only,
                                int(step.seq_lens.max()), int(step.query_lens.max()))
        # the inputs' copy is not timed: vLLM keeps block tables on the GPU and updates them in
        # place, so a step's own time starts with its first kernel
        self._dev_ints[:n].copy_(self._host_ints[:n], non_blocking=cuda)
        for attempt in range(2):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            with torch.inference_mode():
                if graph is not None:
                    graph.replay()
                    logits, tokens = out
                elif piece_size is not None:
                    logits, tokens = self._piecewise_forward(views, step.num_tokens, pieces)
                else:
                    logits, tokens = self._forward(views)
            launch_s = time.perf_counter() - t0
            if cuda:
                end.record()
                end.synchronize()
                elapsed = start.elapsed_time(end) / 1e3
            else:
                elapsed = time.perf_counter() - t0
            # launching never takes this long on the host unless a kernel was just compiled (the
            # first use of a Triton specialization): that run is not the step's time, so the step
            # runs again (idempotent: the same K/V into the same slots) and that run is timed
            if not (cuda and launch_s > COMPILE_LAUNCH_S):
                break
        s = step.num_seqs
        return StepResult(elapsed, graph is not None or pieces is not None, size or s,
                          size or piece_size or step.num_tokens, tokens[:s],
                          logits[:s].clone() if return_logits else None)
