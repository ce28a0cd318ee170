"""How close is the roofline step cost to a real GPU? Times a random-weight model of a preset's shape.

Builds a decoder with the preset's exact layer shapes (random bf16 weights: timing does not depend
on the values), then times on the GPU:
  - the achievable memory bandwidth (a large device-to-device copy) and dense BF16 matmul rate;
  - decode steps (one token per sequence, B sequences over C tokens of dense KV cache each, the
    whole step captured in a CUDA graph as vLLM does) and prefill steps (one prompt of T tokens);
and prints, per step, the measured time next to ``planner.roofline.RooflineCost`` (overhead 0).

    python bench/roofline_gpu.py [--model Llama-3.1-8B] [--gpu H200] [--out results.json]

Needs a CUDA GPU and torch. Attention is torch's scaled_dot_product_attention over dense
per-sequence caches, not vLLM's paged kernels, so it is a floor on what the roofline should
predict rather than a vLLM measurement.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kvsim.planner.presets import get_gpu, get_model  # noqa: E402
from kvsim.planner.roofline import RooflineCost  # noqa: E402


def time_cuda(fn, repeat: int = 20, warmup: int = 3) -> float:
    """Median seconds of fn() over `repeat` runs, timed with CUDA events (executor_gpu's timer)."""
    from executor_gpu import cuda_median_s   # bench/ is this script's directory, first on sys.path
    return cuda_median_s(fn, repeat=repeat, warmup=warmup)


def achieved_bandwidth_bytes_per_s() -> float:
    src = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = time_cuda(lambda: dst.copy_(src))
    return 2 * src.numel() / seconds  # read + write


def achieved_bf16_flops_per_s(n: int = 8192) -> float:
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    seconds = time_cuda(lambda: a @ b)
    return 2 * n**3 / seconds


class Decoder:
    """Random-weight Llama-style decoder of a ModelSpec's shape (GQA attention, gated MLP)."""

    def __init__(self, spec):
        self.s = spec
        h, i, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
        nq, nkv = spec.num_attention_heads, spec.num_kv_heads
        mk = lambda *shape: torch.randn(*shape, dtype=torch.bfloat16, device="cuda") * 0.02  # noqa: E731
        self.layers = [dict(qkv=mk(h, (nq + 2 * nkv) * hd), o=mk(nq * hd, h), gate_up=mk(h, 2 * i),
                            down=mk(i, h)) for _ in range(spec.num_layers)]
        self.embed = mk(spec.vocab_size, h)
        self.lm_head = mk(h, spec.vocab_size)

    def forward(self, x, caches, ctx: int, new: int):
        """x: [B, new, H]; caches[l] = (k, v) of [B, nkv, >= ctx, hd]; the new tokens end at ctx."""
        s = self.s
        b = x.shape[0]
        nq, nkv, hd = s.num_attention_heads, s.num_kv_heads, s.head_dim
        for layer, (kc, vc) in zip(self.layers, caches):
            y = F.rms_norm(x, (s.hidden_size,))
            q, k, v = (y @ layer["qkv"]).split([nq * hd, nkv * hd, nkv * hd], dim=-1)
            q = q.view(b, new, nq, hd).transpose(1, 2)
            kc[:, :, ctx - new:ctx] = k.view(b, new, nkv, hd).transpose(1, 2)
            vc[:, :, ctx - new:ctx] = v.view(b, new, nkv, hd).transpose(1, 2)
            if new == 1:  # decode: each KV head's query group as a short query, no KV expansion
                a = F.scaled_dot_product_attention(q.reshape(b, nkv, nq // nkv, hd), kc[:, :, :ctx],
                                                   vc[:, :, :ctx]).reshape(b, nq, 1, hd)
            else:
                a = F.scaled_dot_product_attention(q, kc[:, :, :ctx], vc[:, :, :ctx], is_causal=True,
                                                   enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(b, new, nq * hd) @ layer["o"]
            g, u = (F.rms_norm(x, (s.hidden_size,)) @ layer["gate_up"]).chunk(2, dim=-1)
            x = x + (F.silu(g) * u) @ layer["down"]
        return F.rms_norm(x[:, -1], (s.hidden_size,)) @ self.lm_head


def batch(num_seqs, new_tokens, context):
    """The simulator's StepBatch of num_seqs sequences each adding new_tokens ending at context,
    counted as its scheduler counts (attn_token_pairs = new tokens x context, not the causal
    triangle: the roofline here must be the one the simulator would price the step with)."""
    from kvsim.simulator.cost import StepBatch
    decode = new_tokens == 1
    return StepBatch(num_seqs, 0 if decode else num_seqs * new_tokens, num_seqs if decode else 0,
                     num_seqs * new_tokens, num_seqs * context, num_seqs * new_tokens * context)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Llama-3.1-8B")
    parser.add_argument("--gpu", default="H200", help="GPU preset the roofline uses")
    parser.add_argument("--kv-budget-gib", type=float, default=80.0, help="largest KV cache to allocate")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()
    spec, gpu = get_model(args.model), get_gpu(args.gpu)
    roof = RooflineCost(spec, gpu, step_overhead_s=0.0)
    torch.manual_seed(0)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "model": spec.name,
              "gpu_preset": gpu.name,
              "datasheet_bandwidth_bytes_per_s": gpu.memory_bandwidth_bytes_per_s,
              "datasheet_bf16_flops_per_s": gpu.bf16_flops_per_s}
    result["achieved_bandwidth_bytes_per_s"] = achieved_bandwidth_bytes_per_s()
    result["achieved_bf16_flops_per_s"] = achieved_bf16_flops_per_s()
    print(f"{result['device']}: copy {result['achieved_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s "
          f"(datasheet {gpu.memory_bandwidth_bytes_per_s / 1e12:.2f}), bf16 matmul "
          f"{result['achieved_bf16_flops_per_s'] / 1e12:.0f} TFLOPS (datasheet {gpu.bf16_flops_per_s / 1e12:.0f})")
    torch.cuda.empty_cache()

    model = Decoder(spec)
    rows = []
    kv_per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2
    cases = [("decode", b, 1, c) for b in (1, 8, 32, 128, 256) for c in (512, 2048, 8192)]
    cases += [("prefill", 1, t, t) for t in (256, 1024, 4096, 8192)]
    print(f"{'kind':<8}{'seqs':>6}{'new':>6}{'context':>9}{'measured ms':>13}{'roofline ms':>13}{'ratio':>7}")
    for kind, b, new, ctx in cases:
        if b * ctx * kv_per_token > args.kv_budget_gib * 2**30:
            continue
        caches = [(torch.zeros(b, spec.num_kv_heads, ctx, spec.head_dim, dtype=torch.bfloat16, device="cuda"),
                   torch.zeros(b, spec.num_kv_heads, ctx, spec.head_dim, dtype=torch.bfloat16, device="cuda"))
                  for _ in range(spec.num_layers)]
        x = torch.randn(b, new, spec.hidden_size, dtype=torch.bfloat16, device="cuda")
        with torch.inference_mode():
            if kind == "decode":  # one CUDA graph per step, as vLLM replays decode batches
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    model.forward(x, caches, ctx, new)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    model.forward(x, caches, ctx, new)
                step = graph.replay
            else:
                step = lambda: model.forward(x, caches, ctx, new)  # noqa: E731
            measured = time_cuda(step, repeat=10)
        predicted = roof.step_time_s(batch(b, new, ctx))
        rows.append(dict(kind=kind, num_seqs=b, new_tokens=new, context_tokens=ctx,
                         measured_s=measured, roofline_s=predicted))
        print(f"{kind:<8}{b:>6}{new:>6}{ctx:>9}{measured * 1e3:>13.3f}{predicted * 1e3:>13.3f}"
              f"{measured / predicted:>7.2f}")
        caches = x = None   # free before the next case's allocation
        torch.cuda.empty_cache()
    result["steps"] = rows
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
