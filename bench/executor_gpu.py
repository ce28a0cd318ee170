"""The step executor on a GPU: is it right, and is it a fast executor rather than a slow toy?

    .venv/bin/python bench/executor_gpu.py [--model Llama-3.1-8B] [--out results.json] [--dry-run]

1. Ceilings: device-to-device copy bandwidth (read + write counted) and a bf16 8192^3 matmul rate.
2. Correctness on the GPU: the model's shape cut to 4 layers, bf16 executor against the fp32
   plain-torch dense decoder on the same weights, over mixed, decode (CUDA graph) and padded steps
   on shuffled block tables.
3. Decode at batch 64 x 2048 context: graph replays against (weight bytes a step reads + KV bytes)
   at the measured copy bandwidth (issue target: within 15 %); attention alone beside it.
4. Mixed steps: the executor (eager; unified attention kernel) against the plain-torch decoder
   (SDPA on contiguous KV, same GEMMs) on the same shapes (target: at least as fast).

Every section catches its own failure and goes on; results go to --out as JSON. Needs CUDA;
``--dry-run`` runs every section on a tiny model on the CPU (Triton interpreter, shapes divided by
64) to catch mistakes before device time is spent.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

# kvsim must be installed (make's .venv, or pip install --target DIR on the GPU machine): the
# repository root on sys.path would shadow the installed kvsim.* mapping with the bare kvsim/ folder
if "--dry-run" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kvsim.kernels.decoder import DecoderShape, random_weights  # noqa: E402
from kvsim.kernels.dense_decoder import DenseDecoder  # noqa: E402
from kvsim.kernels.executor import StepExecutor, build_step, kernels_unified_attention  # noqa: E402

GIB = 2**30
# what the sections run on; --dry-run switches to the CPU and divides token counts by `div`
CFG = {"device": "cuda", "dtype": torch.bfloat16, "ref_dtype": torch.float32, "div": 1}


def cuda_median_s(fn, repeat=20, warmup=3) -> float:
    """Median seconds of fn() (CUDA events; the wall clock in a dry run)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat if CFG["device"] == "cuda" else 2):
        if CFG["device"] != "cuda":
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def free_cache() -> None:
    if CFG["device"] == "cuda":
        torch.cuda.empty_cache()


def executor(shape, **kw) -> StepExecutor:
    return StepExecutor(shape, dtype=CFG["dtype"], device=CFG["device"], **kw)


def ceilings() -> dict:
    cuda = CFG["device"] == "cuda"
    src = torch.empty(4 * GIB if cuda else 2**20, dtype=torch.uint8, device=CFG["device"]).random_()
    dst = torch.empty_like(src)
    copy_bw = 2 * src.numel() / cuda_median_s(lambda: dst.copy_(src))
    m = 8192 if cuda else 64
    a = torch.randn(m, m, dtype=CFG["dtype"], device=CFG["device"])
    b = torch.randn(m, m, dtype=CFG["dtype"], device=CFG["device"])
    flops = 2 * m**3 / cuda_median_s(lambda: a @ b)
    src = dst = a = b = None
    free_cache()
    return {"copy_bandwidth_bytes_per_s": copy_bw, "bf16_matmul_flops_per_s": flops}


def shuffled_tables(rng, lens, block_size, num_blocks):
    need = [-(-n // block_size) for n in lens]
    ids = rng.permutation(num_blocks)[:sum(need)]
    out, start = [], 0
    for k in need:
        out.append(ids[start:start + k])
        start += k
    return out


def correctness(shape: DecoderShape) -> dict:
    """bf16 executor vs fp32 dense decoder on a 4-layer cut of the model."""
    div = CFG["div"]
    small = DecoderShape(**{**shape.to_dict(), "num_layers": 4 if div == 1 else 2})
    weights = random_weights(small, CFG["dtype"], CFG["device"], seed=1)
    ex = executor(small, num_blocks=4096, block_size=16, max_num_seqs=64, max_num_batched_tokens=4096,
                  max_model_len=4096, weights=weights, pad_steps=True)
    ref = DenseDecoder(small, weights.to(CFG["ref_dtype"]), max_num_seqs=64, max_model_len=4096)
    rng = np.random.default_rng(0)
    final = [700, 1500, 40, 300, 2000, 17, 999, 64, 300]
    tables = shuffled_tables(rng, final, 16, 4096)
    computed = [0] * len(final)
    # chunked prefills beside decodes, then decode-only steps (graphs; 6 and 5 sequences -> 8)
    plan = [[(0, 512), (1, 700), (2, 40)], [(0, 188), (1, 800), (2, 1), (3, 300), (4, 500)],
            [(0, 1), (2, 1), (3, 1), (4, 1000), (5, 17), (6, 999), (7, 64)]]
    plan += [[(i, 1) for i in (0, 2, 3, 5, 6, 7)]] * 3 + [[(i, 1) for i in (0, 2, 3, 5, 6)]] * 2
    # small mixed steps: piecewise graphs (203 tokens -> 208, 102 -> 104)
    plan += [[(0, 1), (2, 1), (3, 1), (8, 200)], [(0, 1), (8, 100), (5, 1)]]
    if div > 1:
        plan = [[(i, max(1, n // div)) for i, n in sched] for sched in plan[:4]]
    out = []
    for sched in plan:
        seqs = [i for i, _ in sched]
        step = build_step([tables[i] for i in seqs], [computed[i] for i in seqs], [n for _, n in sched], 16,
                          small.vocab_size)
        got = ex.execute(step, return_logits=True)
        want = ref.step(seqs, step.token_ids, step.positions, step.query_start_loc)
        err = float((got.logits.to(want.dtype) - want).norm() / want.norm())
        agree = float((got.logits.argmax(-1) == want.argmax(-1)).float().mean())
        out.append({"num_seqs": len(seqs), "num_tokens": step.num_tokens, "graph": got.graph,
                    "padded_num_seqs": got.padded_num_seqs, "padded_num_tokens": got.padded_num_tokens, "rel_err": err, "argmax_agree": agree})
        for i, n in sched:
            computed[i] += n
    ex = ref = weights = None
    free_cache()
    return {"steps": out, "max_rel_err": max(s["rel_err"] for s in out),
            "ok": all(s["rel_err"] < 3e-2 for s in out)}


def decode_speed(ex: StepExecutor, bw: float, batch=64, context=2048) -> dict:
    from kvsim.kernels.attention import paged_attention
    shape = ex.shape
    rng = np.random.default_rng(1)
    tables = shuffled_tables(rng, [context] * batch, ex.block_size, ex.num_blocks)
    step = build_step(tables, [context - 1] * batch, [1] * batch, ex.block_size, shape.vocab_size)
    results = [ex.execute(step) for _ in range(30 if CFG["device"] == "cuda" else 3)]
    measured = statistics.median(r.time_s for r in results[2:])
    weight_bytes = shape.step_weight_bytes(ex.dtype)
    kv_bytes = batch * context * shape.kv_bytes_per_token(ex.dtype)
    floor = (weight_bytes + kv_bytes) / bw
    q = torch.randn(batch, shape.num_attention_heads, shape.head_dim, dtype=ex.dtype, device=ex.device)
    bt = torch.as_tensor(step.block_tables, dtype=torch.int32, device=ex.device)
    lens = torch.full((batch,), context, dtype=torch.int32, device=ex.device)

    def attn():   # attention alone over all layers, on the same pool
        for layer in range(shape.num_layers):
            paged_attention(q, ex.kv_cache[layer, 0], ex.kv_cache[layer, 1], bt, lens, ex.scale,
                            max_seq_len=context, validate=False)
    attn_s = cuda_median_s(attn, repeat=10)
    return {"batch": batch, "context_tokens": context, "graph": results[-1].graph,
            "measured_s": measured, "weight_bytes": weight_bytes, "kv_bytes": kv_bytes,
            "floor_s_at_copy_bw": floor, "ratio_to_floor": measured / floor,
            "within_15pct": measured <= 1.15 * floor, "attention_only_s": attn_s,
            "attention_floor_s": kv_bytes / bw}


MIXED_SHAPES = [  # (name, [(prefix, new)] prompt chunks, decode seqs, decode context)
    ("prompt 2048", [(0, 2048)], 0, 0),
    ("prompt 512 after 4096 cached + 64 decodes @1k", [(4096, 512)], 64, 1024),
    ("8 prompts x 256 + 32 decodes @2k", [(0, 256)] * 8, 32, 2048),
    ("prompt 8192", [(0, 8192)], 0, 0),
    ("chunk 256 after 1024 + 128 decodes @512", [(1024, 256)], 128, 512),
]


def mixed_speed(ex: StepExecutor) -> list[dict]:
    """Each shape on the executor, then on a plain-torch decoder whose contiguous cache holds just
    that shape's sequences (rows x longest context: the contiguous layout cannot share memory)."""
    rows = []
    rng = np.random.default_rng(2)
    div = CFG["div"]
    for name, prompts, num_dec, dec_ctx in MIXED_SHAPES:
        prompts = [(p // div, max(2, n // div)) for p, n in prompts]
        num_dec, dec_ctx = max(1, num_dec // div) if num_dec else 0, max(1, dec_ctx // div)
        lens = [dec_ctx] * num_dec + [p + n for p, n in prompts]
        new = [1] * num_dec + [n for _, n in prompts]
        tables = shuffled_tables(rng, lens, ex.block_size, ex.num_blocks)
        step = build_step(tables, [c - n for c, n in zip(lens, new)], new, ex.block_size, ex.shape.vocab_size)
        ex_times = [ex.execute(step).time_s for _ in range(8 if div == 1 else 2)][-6:]
        dense = DenseDecoder(ex.shape, ex.weights, max_num_seqs=len(lens), max_model_len=max(lens))
        dense.k_cache.normal_()
        dense.v_cache.normal_()
        seq_rows = list(range(len(lens)))   # decoders first: rows 0..B-1, a plain slice

        def dense_step():
            dense.step(seq_rows, step.token_ids, step.positions, step.query_start_loc)
        dense_s = cuda_median_s(dense_step, repeat=6, warmup=2)
        dense = None
        free_cache()
        ex_s = statistics.median(ex_times)
        rows.append({"shape": name, "num_tokens": step.num_tokens, "num_seqs": step.num_seqs,
                     "executor_s": ex_s, "plain_torch_s": dense_s, "speedup": dense_s / ex_s})
    return rows


def preset_shape(name: str) -> DecoderShape:
    from kvsim.planner.presets import get_model
    spec = get_model(name)
    family = next(f for p, f in (("Llama", "llama"), ("Qwen", "qwen2"), ("Mistral", "mistral"))
                  if spec.name.startswith(p))
    return DecoderShape(family, spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.num_kv_heads,
                        spec.head_dim, spec.intermediate_size, spec.vocab_size, rope_theta=500000.0,
                        qkv_bias=family == "qwen2", name=spec.name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Llama-3.1-8B")
    parser.add_argument("--out", default="executor_gpu.json")
    parser.add_argument("--dry-run", action="store_true", help="tiny model on the CPU (interpreter)")
    parser.add_argument("--sections", default="ceilings,correctness,decode_speed,mixed_speed",
                        help="comma-separated sections to run")
    args = parser.parse_args()
    shape = preset_shape(args.model)
    if args.dry_run:
        CFG.update(device="cpu", dtype=torch.float32, ref_dtype=torch.float64, div=64)
        shape = DecoderShape(shape.family, 2, 64, 4, 2, 16, 96, 101, name="tiny")
    import triton
    res = {"device": torch.cuda.get_device_name() if CFG["device"] == "cuda" else "cpu",
           "torch": torch.__version__, "triton": triton.__version__, "model": shape.name,
           "date": time.strftime("%Y-%m-%d"), "unified_attention": kernels_unified_attention() is not None}
    out = Path(args.out)

    def section(name, fn):
        t0 = time.time()
        try:
            res[name] = fn()
        except Exception as err:  # keep going: the device time is precious
            res[name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
            print(res[name]["traceback"], flush=True)
        res.setdefault("section_wall_s", {})[name] = round(time.time() - t0, 1)
        out.write_text(json.dumps(res, indent=1, default=str) + "\n")
        print(f"[{name}] {time.time() - t0:.1f}s", json.dumps(res[name], default=str)[:600], flush=True)

    wanted = set(args.sections.split(","))
    if "ceilings" in wanted:
        section("ceilings", ceilings)
    bw = res.get("ceilings", {}).get("copy_bandwidth_bytes_per_s", 4.27e12)
    if "correctness" in wanted:
        section("correctness", lambda: correctness(shape))
    state = {}

    def build():
        blocks = 20000 if CFG["div"] == 1 else 200
        state["ex"] = executor(shape, num_blocks=blocks, block_size=16, max_num_seqs=256,
                               max_num_batched_tokens=8192, max_model_len=16384)
        return {"num_blocks": blocks, "attention": state["ex"].attention_name}
    if wanted & {"decode_speed", "mixed_speed"}:
        section("build", build)
    if "decode_speed" in wanted:
        if CFG["div"] == 1:
            section("decode_speed", lambda: decode_speed(state["ex"], bw))
        else:
            section("decode_speed", lambda: decode_speed(state["ex"], bw, batch=4, context=64))
    if "mixed_speed" in wanted:
        section("mixed_speed", lambda: mixed_speed(state["ex"]))
    d = res.get("decode_speed", {})
    if "measured_s" in d:
        print(f"decode {d['batch']}x{d['context_tokens']}: {d['measured_s'] * 1e3:.2f} ms vs floor "
              f"{d['floor_s_at_copy_bw'] * 1e3:.2f} ms (x{d['ratio_to_floor']:.3f}); attention "
              f"{d['attention_only_s'] * 1e3:.2f} ms vs {d['attention_floor_s'] * 1e3:.2f}")
    for row in res["mixed_speed"] if isinstance(res.get("mixed_speed"), list) else []:
        print(f"{row['shape']:<48} executor {row['executor_s'] * 1e3:8.2f} ms  plain torch "
              f"{row['plain_torch_s'] * 1e3:8.2f} ms  x{row['speedup']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
