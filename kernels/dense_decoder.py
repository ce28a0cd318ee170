"""The same decoder in plain torch over contiguous KV: the step executor's reference and its baseline.

Each sequence owns one row of a contiguous cache ``[num_layers, rows, num_kv_heads, max_model_len,
head_dim]`` (the contiguous, Orca-style layout: a request's K/V at positions 0..n-1 of its row), so
attention is torch's ``scaled_dot_product_attention`` on contiguous tensors:

* decode sequences (one new token) are batched into one SDPA over their rows, masked past each
  sequence's length (a plain slice when they hold rows 0..B-1);
* each prefill chunk is one SDPA of its new tokens over its row, causal from its offset.

Everything else is the executor's arithmetic in plain torch (RMSNorm, RoPE, SiLU, ``F.linear``).
Run in float64 on the CPU it is the dense reference the executor's logits must equal (tests); run in
bf16 on the GPU it is the plain-torch speed baseline for mixed steps (bench/executor_gpu.py).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from kvsim.kernels.decoder import DecoderShape, DecoderWeights
from kvsim.kernels.layers import rms_norm_reference, rope_cos_sin, rope_reference


class DenseDecoder:
    """Plain-torch decoder with one contiguous KV row per sequence (module docstring).

    Args:
        shape, weights: the model (the executor's weights, converted as needed).
        max_num_seqs: cache rows.
        max_model_len: positions per row.
    """

    def __init__(self, shape: DecoderShape, weights: DecoderWeights, *, max_num_seqs: int, max_model_len: int):
        self.shape, self.weights = shape, weights
        dtype, device = weights.embed.dtype, weights.embed.device
        self.k_cache = torch.zeros(shape.num_layers, max_num_seqs, shape.num_kv_heads, max_model_len,
                                   shape.head_dim, dtype=dtype, device=device)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.cos, self.sin = rope_cos_sin(shape.head_dim, shape.rope_theta, shape.rope_scaling, max_model_len,
                                          dtype=torch.float64 if dtype == torch.float64 else torch.float32,
                                          device=device)

    def step(self, rows, token_ids, positions, query_start_loc) -> torch.Tensor:
        """Compute one step: sequence i (cache row ``rows[i]``) adds tokens
        ``token_ids[qsl[i]:qsl[i+1]]`` at ``positions[...]`` (consecutive, ending at its new length).

        Returns:
            logits [num_seqs, vocab] of each sequence's last new token.
        """
        s, w = self.shape, self.weights
        device = w.embed.device
        nq, nkv, hd, eps = s.num_attention_heads, s.num_kv_heads, s.head_dim, s.rms_norm_eps
        qsl = [int(v) for v in query_start_loc]
        rows = [int(r) for r in rows]
        ids = torch.as_tensor(np.asarray(token_ids), device=device).long()
        pos = torch.as_tensor(np.asarray(positions), device=device).long()
        num_tokens = ids.shape[0]
        seq_of_token = torch.repeat_interleave(torch.arange(len(rows), device=device),
                                               torch.as_tensor(np.diff(qsl), device=device))
        row_of_token = torch.as_tensor(rows, device=device)[seq_of_token]
        lens = [int(pos[qsl[i + 1] - 1]) + 1 for i in range(len(rows))]
        decode = [i for i in range(len(rows)) if qsl[i + 1] - qsl[i] == 1]
        prefill = [i for i in range(len(rows)) if qsl[i + 1] - qsl[i] > 1]
        dec_rows = [rows[i] for i in decode]
        dec_tok = torch.as_tensor([qsl[i] for i in decode], device=device, dtype=torch.long)
        dec_lens = torch.as_tensor([lens[i] for i in decode], device=device)
        dec_max = max((lens[i] for i in decode), default=0)
        contiguous_rows = dec_rows == list(range(len(dec_rows)))
        key_pos = torch.arange(dec_max, device=device)
        dec_mask = key_pos[None, :] < dec_lens[:, None]
        if s.sliding_window is not None:
            dec_mask &= key_pos[None, :] >= dec_lens[:, None] - s.sliding_window

        x = F.embedding(ids, w.embed)
        for layer, lw in enumerate(w.layers):
            h = rms_norm_reference(x, lw.input_norm, eps)
            qkv = F.linear(h, lw.qkv, lw.qkv_bias)
            q = qkv[:, :nq * hd].reshape(num_tokens, nq, hd)
            k = qkv[:, nq * hd:(nq + nkv) * hd].reshape(num_tokens, nkv, hd)
            v = qkv[:, (nq + nkv) * hd:].reshape(num_tokens, nkv, hd)
            if s.qk_norm:
                q, k = rms_norm_reference(q, lw.q_norm, eps), rms_norm_reference(k, lw.k_norm, eps)
            q, k = rope_reference(q, pos, self.cos, self.sin), rope_reference(k, pos, self.cos, self.sin)
            kc, vc = self.k_cache[layer], self.v_cache[layer]
            kc[row_of_token, :, pos] = k
            vc[row_of_token, :, pos] = v
            attn = torch.empty_like(q)
            if decode:
                if contiguous_rows:
                    kd, vd = kc[:len(dec_rows), :, :dec_max], vc[:len(dec_rows), :, :dec_max]
                else:
                    kd, vd = kc[dec_rows, :, :dec_max], vc[dec_rows, :, :dec_max]
                o = F.scaled_dot_product_attention(q[dec_tok][:, :, None], kd, vd, attn_mask=dec_mask[:, None, None],
                                                   enable_gqa=True)
                attn[dec_tok] = o[:, :, 0]
            for i in prefill:
                lo, hi, n = qsl[i], qsl[i + 1], lens[i]
                qi = q[lo:hi].transpose(0, 1)[None]
                ki, vi = kc[rows[i], :, :n][None], vc[rows[i], :, :n][None]
                if n == hi - lo and s.sliding_window is None:
                    o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, enable_gqa=True)
                else:
                    qp = torch.arange(n - (hi - lo), n, device=device)
                    kp = torch.arange(n, device=device)
                    mask = kp[None, :] <= qp[:, None]
                    if s.sliding_window is not None:
                        mask &= kp[None, :] > qp[:, None] - s.sliding_window
                    o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, enable_gqa=True)
                attn[lo:hi] = o[0].transpose(0, 1)
            x = x + F.linear(attn.reshape(num_tokens, nq * hd), lw.o)
            h = rms_norm_reference(x, lw.post_norm, eps)
            gate, up = F.linear(h, lw.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, lw.down)
        last = torch.as_tensor([q_end - 1 for q_end in qsl[1:]], device=device)
        return F.linear(rms_norm_reference(x[last], w.final_norm, eps), w.lm_head)
