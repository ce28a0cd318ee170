"""The decoder's small layers as fused Triton kernels, each with its plain-torch reference.

* ``add_rms_norm(x, residual, weight, eps)``: ``residual += x`` (in place) then RMSNorm of the sum,
  in fp32 (vLLM's fused_add_rms_norm); without a residual, plain RMSNorm.
* ``rope_(qkv, positions, cos, sin, num_heads)``: rotates the query and key heads of the fused QKV
  output in place (the "neox" half-split rotation of Hugging Face Llama/Qwen/Mistral:
  ``x[i], x[i + d/2] -> x[i] cos - x[i + d/2] sin, x[i + d/2] cos + x[i] sin``).
* ``silu_and_mul(gate_up)``: ``silu(gate) * up`` of the fused gate/up projection.

One launch each where torch needs two to eight, which matters on the eager (mixed-step) path; in
captured CUDA graphs it saves the small kernels' fixed costs. All three run on CPU tensors under
TRITON_INTERPRET=1 (tests) with bigger tiles, since the interpreter pays per program.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvsim.kernels.attention import interpreting


def _rows_per_program(num_rows: int, block: int, device: torch.device) -> int:
    # GPU: one row of up to 8k elements per program; interpreter: everything in a few programs
    if device.type == "cuda":
        return max(1, 4096 // block)
    return max(1, min(triton.next_power_of_2(max(num_rows, 1)), max(1, 65536 // block)))


def _check_device(t: torch.Tensor) -> None:
    if t.device.type == "cpu" and not interpreting():
        raise ValueError("CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 before importing kernels")


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, num_rows, stride_x, stride_res, stride_out, eps,
                         HIDDEN: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, HAS_RES: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows < num_rows)[:, None] & (cols < HIDDEN)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + r64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        x += tl.load(res_ptr + r64 * stride_res + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(res_ptr + r64 * stride_res + cols[None, :], x.to(res_ptr.dtype.element_ty), mask=mask)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, 1) / HIDDEN + eps)
    w = tl.load(w_ptr + cols, mask=cols < HIDDEN, other=0.0).to(tl.float32)
    y = x * inv[:, None] * w[None, :]
    tl.store(out_ptr + r64 * stride_out + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """RMSNorm of ``x + residual`` (``residual`` is updated in place to the sum), or of ``x``.

    Args:
        x: [num_rows, hidden], last dim contiguous.
        residual: None, or [num_rows, hidden] of x's dtype; becomes x + residual.
        weight: [hidden].
        eps: the norm's epsilon.
    Returns:
        [num_rows, hidden] in x's dtype.
    """
    _check_device(x)
    if x.dim() != 2 or x.stride(-1) != 1 or weight.shape != (x.shape[1],):
        raise ValueError(f"x must be [rows, hidden] with a contiguous last dim and weight [hidden], got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.stride(-1) != 1):
        raise ValueError(f"residual must match x {tuple(x.shape)}, got {tuple(residual.shape)}")
    out = torch.empty_like(x)
    num_rows, hidden = x.shape
    if num_rows == 0:
        return out
    block = triton.next_power_of_2(hidden)
    rows = _rows_per_program(num_rows, block, x.device)
    res = residual if residual is not None else x
    _add_rms_norm_kernel[(triton.cdiv(num_rows, rows),)](
        x, res, weight, out, num_rows, x.stride(0), res.stride(0), out.stride(0), eps,
        HIDDEN=hidden, BLOCK=block, ROWS=rows, HAS_RES=residual is not None,
        num_warps=(8 if block >= 4096 else 4) if x.device.type == "cuda" else 1)
    return out


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain-torch RMSNorm over the last dim (computed in x's dtype, fp32 at least)."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.to(y.dtype)).to(x.dtype)


# ------------------------------------------------------------------------------------------ RoPE
def rope_inv_freq(head_dim: int, rope_theta: float, rope_scaling: dict | None = None) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2] (float64), with the "linear" and "llama3" scalings of
    Hugging Face's ``_compute_*_parameters``; other scaling types keep the base frequencies."""
    inv = 1.0 / rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    kind = (rope_scaling or {}).get("rope_type") or (rope_scaling or {}).get("type")
    if kind == "linear":
        inv = inv / float(rope_scaling["factor"])
    elif kind == "llama3":
        factor = float(rope_scaling["factor"])
        low, high = float(rope_scaling["low_freq_factor"]), float(rope_scaling["high_freq_factor"])
        old_len = float(rope_scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old_len / wavelen - low) / (high - low)
        mid = (1 - smooth) * inv / factor + smooth * inv
        inv = torch.where(wavelen > old_len / low, inv / factor, torch.where(wavelen < old_len / high, inv, mid))
    return inv


def rope_cos_sin(head_dim: int, rope_theta: float, rope_scaling: dict | None, max_positions: int,
                 dtype: torch.dtype = torch.float32, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [max_positions, head_dim / 2] of ``position * inv_freq``."""
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float64),
                         rope_inv_freq(head_dim, rope_theta, rope_scaling))
    return angles.cos().to(dtype=dtype, device=device), angles.sin().to(dtype=dtype, device=device)


@triton.jit
def _rope_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, num_tokens, stride_tok,
                 NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_E: tl.constexpr, TOKENS: tl.constexpr):
    tok = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    tok_ok = tok < num_tokens
    pos = tl.load(pos_ptr + tok, mask=tok_ok, other=0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    head = e // HALF
    i = e % HALF
    mask = tok_ok[:, None] & (e < NUM_HEADS * HALF)[None, :]
    offs = tok.to(tl.int64)[:, None] * stride_tok + (head * (2 * HALF) + i)[None, :]
    x1 = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + offs + HALF, mask=mask, other=0.0).to(tl.float32)
    cs = pos[:, None] * HALF + i[None, :]
    c = tl.load(cos_ptr + cs, mask=mask, other=1.0)
    s = tl.load(sin_ptr + cs, mask=mask, other=0.0)
    tl.store(x_ptr + offs, (x1 * c - x2 * s).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(x_ptr + offs + HALF, (x2 * c + x1 * s).to(x_ptr.dtype.element_ty), mask=mask)


def rope_(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
          num_heads: int) -> torch.Tensor:
    """Rotate the first ``num_heads`` heads of each row of ``x`` in place (the query and key heads
    of the fused QKV output: they come first and are adjacent).

    Args:
        x: [num_tokens, >= num_heads * head_dim], last dim contiguous.
        positions: int32/int64 [num_tokens], each < len(cos).
        cos, sin: float32 [max_positions, head_dim / 2] (``rope_cos_sin``).
        num_heads: heads to rotate (num_attention_heads + num_kv_heads).
    Returns:
        x.
    """
    _check_device(x)
    half = cos.shape[1]
    if x.dim() != 2 or x.stride(-1) != 1 or x.shape[1] < num_heads * 2 * half:
        raise ValueError(f"x must be [tokens, >= {num_heads} heads x {2 * half}] with a contiguous last dim, "
                         f"got {tuple(x.shape)}")
    if positions.shape != (x.shape[0],) or cos.dtype != torch.float32 or sin.shape != cos.shape:
        raise ValueError("positions must be [num_tokens] and cos/sin float32 [max_positions, head_dim/2]")
    num_tokens = x.shape[0]
    if num_tokens == 0:
        return x
    block_e = triton.next_power_of_2(num_heads * half)
    tokens = _rows_per_program(num_tokens, block_e, x.device)
    _rope_kernel[(triton.cdiv(num_tokens, tokens),)](
        x, positions, cos, sin, num_tokens, x.stride(0), NUM_HEADS=num_heads, HALF=half,
        BLOCK_E=block_e, TOKENS=tokens, num_warps=4 if x.device.type == "cuda" else 1)
    return x


def rope_reference(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Plain-torch rotation of x [num_tokens, heads, head_dim] (a new tensor, x's dtype)."""
    half = x.shape[-1] // 2
    c = cos[positions.long()].to(x.dtype)[:, None, :]
    s = sin[positions.long()].to(x.dtype)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


# ------------------------------------------------------------------------------------------ MLP
@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, num_rows, stride_x, stride_out, WIDTH: tl.constexpr,
                         BLOCK: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows < num_rows)[:, None] & (cols < WIDTH)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    g = tl.load(x_ptr + r64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + r64 * stride_x + WIDTH + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + r64 * stride_out + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :w]) * x[:, w:]`` for x [num_rows, 2w] (the fused gate/up output)."""
    _check_device(x)
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(-1) != 1:
        raise ValueError(f"x must be [rows, 2 * width] with a contiguous last dim, got {tuple(x.shape)}")
    num_rows, width = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_rows, width), dtype=x.dtype, device=x.device)
    if num_rows == 0:
        return out
    if x.device.type == "cuda":
        block, rows = 1024, 4
    else:
        block = triton.next_power_of_2(width)
        rows = _rows_per_program(num_rows, block, x.device)
    _silu_and_mul_kernel[(triton.cdiv(num_rows, rows), triton.cdiv(width, block))](
        x, out, num_rows, x.stride(0), out.stride(0), WIDTH=width, BLOCK=block, ROWS=rows,
        num_warps=4 if x.device.type == "cuda" else 1)
    return out
