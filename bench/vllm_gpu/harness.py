"""Real vLLM as the ground truth: replay kvsim workloads through vLLM's AsyncLLM on a GPU.

One process serves one engine (a model, a dtype, engine settings) and runs a plan of workloads
on it, one after another, with the prefix cache reset between them::

    python bench/vllm_gpu/harness.py --model-dir bench/vllm_gpu/configs/Llama-3.1-8B \
        --name llama8b-bf16 --plan plan.json --out OUT/llama8b-bf16 [--quantization fp8 ...]

Weights are dummy (``load_format="dummy"``) from the folder's config.json; prompts are token
ids; every request produces exactly its output length (``ignore_eos`` and ``min_tokens``), so
nothing is downloaded and the work is the workload's. The engine is built with ``vllm serve``'s
defaults (usage context OPENAI_API_SERVER: max_num_seqs, max_num_batched_tokens, async
scheduling as the server resolves them).

What a run leaves under ``--out``:

* ``meta.json``: versions, GPU, the resolved engine settings (the engine core's own, from the
  probe), start-up figures (from vLLM's log: KV cache memory and tokens, CUDA-graph memory,
  compile and capture time, time to ready), the monotonic<->wall clock pair, the host (CPU model,
  CPUs, load average and a single-thread speed probe, before the plan and after: ``host_info``),
  the token counts of the warm-up's steps (``warmup_steps``: what it compiled, simulator.first_use;
  ``warmup/`` holds its steps.csv, jit.csv and jit_hooks.csv, also of a run stopped in its warm-up);
* ``<workload>/requests.jsonl``: per request the arrival, send, first-token, every token's and
  finish times (seconds from the workload's start, front-end process), prompt and output tokens;
* ``<workload>/steps.csv``: per engine step, measured in the engine core by the probe plugin
  (``kvsim_vllm_probe``), kvsim's StepBatch fields and ``step_s`` (``jit_s``: the Triton JIT
  compiles within it); ``<workload>/jit.csv``: every Triton JIT compile of the engine core while
  the workload ran (kernel, start, end, specialisation key, the kernel's argument names in order);
  ``<workload>/jit_hooks.csv``: each compile's end as Triton's post-compile hook saw it (kernel, t_s);
* ``gpu.csv``: the SM clock and power draw every 500 ms (nvidia-smi), ``vllm.log``.

Plan entries (``plan.json``: a list), each with a unique ``name``:

* ``{"kind": "closed", "isl": 1024, "osl": 128, "n": 64, "concurrency": 16, "isl_range": 0.0,
  "osl_range": 0.0, "seed": 0}``: closed loop, ``vllm bench serve --max-concurrency`` style: all
  requests due at t=0, at most ``concurrency`` in flight, the next sent as one finishes;
* ``{"kind": "trace", "requests": [[arrival_s, prompt_tokens, output_tokens, [hash_ids]], ...],
  "block_tokens": 512, "max_concurrency": null}``: open loop at the arrival times; hash ids (one
  per ``block_tokens`` of prompt, Mooncake's format) make identical leading token ids, so vLLM's
  prefix cache sees the trace's sharing;
* ``{"kind": "grid", "decode": [[batch, context, output], ...], "prefill": [prompt, ...],
  "mixed": [[decodes, context, prompt], ...]}``: the controlled step shapes of ``kvsim profile
  --engine vllm``: each decode point sends ``batch`` requests of ``context`` prompt tokens at once
  and waits for all; each prefill point one request with 2 output tokens; each mixed point
  ``decodes`` requests of ``context`` tokens (48 output tokens), then, once all of them have their
  first token, one of ``prompt`` tokens, whose chunks share steps with their decodes.
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

STEP_COLUMNS = ("num_seqs", "num_prefill_seqs", "num_prefill_tokens", "num_decode_tokens",
                "num_scheduled_tokens", "kv_read_tokens", "attn_token_pairs", "max_context_tokens",
                "step_s", "sched_cpu_s", "update_cpu_s", "t_done_s", "t_sched_s", "jit_s",
                "num_prefill_seqs_with_context")
JIT_COLUMNS = ("kernel", "t0_s", "t1_s", "key", "arg_names")


# ---------------------------------------------------------------- prompts (pure, tested on CPU)
def random_ids(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    """n token ids away from the special tokens at both ends of the vocabulary."""
    lo, hi = min(1000, vocab_size // 4), max(vocab_size - 1000, vocab_size * 3 // 4)
    return [rng.randrange(lo, hi) for _ in range(n)]


def hashed_prompt(hash_ids: list[int], prompt_tokens: int, block_tokens: int, vocab_size: int,
                  seed: int) -> list[int]:
    """Token ids whose every block of ``block_tokens`` is a function of its hash id alone: two
    prompts that share leading hash ids share those leading tokens (the trace's prefix)."""
    ids: list[int] = []
    for h in hash_ids:
        if len(ids) >= prompt_tokens:
            break
        ids.extend(random_ids(random.Random(f"{seed}:{h}"), block_tokens, vocab_size))
    if len(ids) < prompt_tokens:  # a trace line with fewer hash ids than its length needs
        ids.extend(random_ids(random.Random(f"{seed}:tail:{len(hash_ids)}"), prompt_tokens - len(ids),
                              vocab_size))
    return ids[:prompt_tokens]


def closed_loop_lengths(spec: dict) -> list[tuple[int, int]]:
    """(prompt, output) lengths of a closed-loop spec, sampled as vllm bench serve's random
    dataset samples them: uniform integers in [len * (1 - range), len * (1 + range)]."""
    rng = random.Random(spec.get("seed", 0))
    out = []
    for _ in range(spec["n"]):
        lengths = []
        for key in ("isl", "osl"):
            mean, width = spec[key], spec.get(f"{key}_range", 0.0)
            lo, hi = max(1, int(mean * (1 - width))), max(1, int(mean * (1 + width)))
            lengths.append(rng.randint(lo, hi))
        out.append((lengths[0], lengths[1]))
    return out


# a mixed grid point's decodes run this many tokens: past the late prompt's prefill (8,192 tokens
# in at most 8 chunks beside them) with tokens to spare
MIXED_DECODE_TOKENS = 48


def build_requests(entry: dict, vocab_size: int) -> list[dict]:
    """The request list of one plan entry: arrival_s (None: as soon as a slot frees), token ids,
    output tokens, and the phase (grid points run one after another)."""
    seed = entry.get("seed", 0)
    kind = entry["kind"]
    reqs = []
    if kind == "closed":
        rng = random.Random(f"{seed}:ids")
        for i, (p, o) in enumerate(closed_loop_lengths(entry)):
            reqs.append({"arrival_s": 0.0, "ids": random_ids(rng, p, vocab_size), "output_tokens": o,
                         "phase": 0})
    elif kind == "trace":
        block = entry.get("block_tokens", 512)
        rng = random.Random(f"{seed}:ids")
        for row in entry["requests"]:
            arrival, p, o = float(row[0]), int(row[1]), int(row[2])
            hashes = row[3] if len(row) > 3 else None
            ids = hashed_prompt(hashes, p, block, vocab_size, seed) if hashes else \
                random_ids(rng, p, vocab_size)
            reqs.append({"arrival_s": arrival, "ids": ids, "output_tokens": o, "phase": 0})
    elif kind == "grid":
        rng = random.Random(f"{seed}:ids")
        phase = 0
        for batch, context, output in entry.get("decode", []):
            for _ in range(batch):
                reqs.append({"arrival_s": 0.0, "ids": random_ids(rng, context, vocab_size),
                             "output_tokens": output, "phase": phase})
            phase += 1
        for prompt in entry.get("prefill", []):
            reqs.append({"arrival_s": 0.0, "ids": random_ids(rng, prompt, vocab_size),
                         "output_tokens": 2, "phase": phase})
            phase += 1
        # a prompt's chunks beside running decodes: the decodes first, the prompt once every one
        # of them has its first token (run_workload), so its prefill shares steps with them
        for decodes, context, prompt in entry.get("mixed", []):
            for _ in range(decodes):
                reqs.append({"arrival_s": 0.0, "ids": random_ids(rng, context, vocab_size),
                             "output_tokens": MIXED_DECODE_TOKENS, "phase": phase})
            reqs.append({"arrival_s": 0.0, "ids": random_ids(rng, prompt, vocab_size),
                         "output_tokens": 2, "phase": phase, "late": True})
            phase += 1
    else:
        raise ValueError(f"plan entry {entry.get('name')!r}: unknown kind {kind!r}")
    for i, r in enumerate(reqs):
        r["request_id"] = f"{entry['name']}-{i}"
    return reqs


def warmup_lengths_entries(max_tokens: int = 8192, per_octave: int = 4) -> list[dict]:
    """A warm-up beyond vLLM's own (``--warmup-lengths``): lone prompts of 16 to ``max_tokens``
    tokens, ``per_octave`` lengths per doubling, one at a time and then 8 at a time. Kernels that
    pick their tiles by the step's token count (gpt-oss's MXFP4 MoE and its routing, Triton) are
    compiled on their first use, 0.6-1.3 s each on the H100; vLLM's start-up runs only its CUDA-graph
    sizes and the largest step, so a measured run would pay the rest inside its steps."""
    lengths, k = [], 0
    while (n := int(round(16 * 2 ** (k / per_octave)))) <= max_tokens:
        lengths.append(n)
        k += 1
    reqs = [[0.0, n, 2] for n in lengths]
    # each its own prompts (seeds 6 and 13): the same ones again would be prefix-cache hits
    return [{"name": f"warmup-lengths-c{c}", "kind": "trace", "seed": 5 + c, "max_concurrency": c,
             "requests": reqs} for c in (1, 8)]


# ---------------------------------------------------------------- steps (pure, tested on CPU)
def step_rows(lines: list[dict], t0: float, t1: float) -> list[dict]:
    """The probe's step records whose tokens came back in [t0, t1], as kvsim StepBatch rows.

    ``step_s`` is the step's share of the engine's time: from the later of the previous step's
    return and this step's scheduling, to this step's return (back-to-back steps: the time
    between their returns; after an idle engine: scheduling, input preparation and the GPU).
    ``t_sched_s`` is when the step was scheduled, ``t_done_s`` when its output came back (from
    ``t0``): under async scheduling step k + 1 is scheduled when step k's launch returns, and step
    k's output is taken only after step k + 1's launch returns. ``jit_s``: the seconds of Triton
    JIT compiles (the probe's ``jit`` lines) within the step's share of the engine's time.
    ``num_prefill_seqs_with_context``: the prefills that had context before the step (a chunk
    carried over from the step before, or a prefix-cache hit): gpt-oss-120b's 8,192-token grid
    steps with one took 142-146 ms, those without 104-120 ms (docs/ACCURACY.md)."""
    recs = sorted((r for r in lines if "reqs" in r), key=lambda r: r["done_t"])
    jits = [(j["t0"], j["t1"]) for j in lines if "jit" in j]
    rows, prev_done = [], None
    for r in recs:
        start = r["sched_t0"] if prev_done is None else max(prev_done, r["sched_t0"])
        prev_done = r["done_t"]
        if not t0 <= r["done_t"] <= t1:
            continue
        row = dict.fromkeys(STEP_COLUMNS, 0)
        for new, ctx, kind in r["reqs"]:
            row["num_seqs"] += 1
            row["num_scheduled_tokens"] += new
            row["kv_read_tokens"] += ctx
            row["attn_token_pairs"] += new * ctx
            row["max_context_tokens"] = max(row["max_context_tokens"], ctx)
            if kind == "d":
                row["num_decode_tokens"] += 1
            else:
                row["num_prefill_seqs"] += 1
                row["num_prefill_tokens"] += new
                row["num_prefill_seqs_with_context"] += ctx > new
        row["step_s"] = r["done_t"] - start
        row["sched_cpu_s"] = r["sched_t1"] - r["sched_t0"]
        row["update_cpu_s"] = r["upd_t1"] - r["done_t"]
        row["t_done_s"] = r["done_t"] - t0
        row["t_sched_s"] = r["sched_t0"] - t0
        row["jit_s"] = sum((max(0.0, min(b, r["done_t"]) - max(a, start)) for a, b in jits), 0.0)
        rows.append(row)
    return rows


def jit_rows(lines: list[dict], t0: float, t1: float) -> list[dict]:
    """The probe's Triton JIT compiles that began in [t0, t1], in order, times from ``t0``."""
    return [{"kernel": j["jit"], "t0_s": j["t0"] - t0, "t1_s": j["t1"] - t0, "key": j["key"],
             "arg_names": j.get("args", "")}
            for j in sorted((j for j in lines if "jit" in j), key=lambda j: j["t0"]) if t0 <= j["t0"] <= t1]


def write_window(folder: Path, lines: list[dict], t0: float, t1: float) -> list[dict]:
    """A workload's (or the warm-up's) steps.csv, jit.csv and jit_hooks.csv: the probe's lines in
    [t0, t1]; returns the step rows."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = step_rows(lines, t0, t1)
    write_csv(folder / "steps.csv", rows, STEP_COLUMNS)
    write_csv(folder / "jit.csv", jit_rows(lines, t0, t1), JIT_COLUMNS)
    write_csv(folder / "jit_hooks.csv", jit_hook_rows(lines, t0, t1), ("kernel", "t_s"))
    return rows


def eager_keys_entry(graph_tokens: int, max_tokens: int, of: list[int] | None = None) -> dict:
    """A warm-up over every eager step's first-use compile (``--warmup-eager-keys``): one lone
    prompt (one token out) of each length whose step meets a key of its own in gpt-oss's MoE routing
    and expert matmuls (simulator.first_use: the tokens rounded up to 32, and divisible by 16 or
    not), from the largest CUDA graph to ``max_tokens``, one at a time: each 32-token band's top
    (cut at ``max_tokens``) and the length just below it. ``of`` (``--warmup-eager-keys-of``): only
    these steps' token counts instead, each once (the eager steps earlier runs of the same plan met,
    plans.py --eager-steps-of: gpt-oss-120b's 448 keys take ~1.8 s each to compile, more than one
    10-minute device call holds)."""
    up32 = lambda n: -(-n // 32) * 32       # noqa: E731
    if of is not None:
        lengths = sorted({int(n) for n in of if graph_tokens < int(n) <= max_tokens})
    else:
        lengths = sorted({n for b in range(up32(graph_tokens + 1), up32(max_tokens) + 1, 32)
                          for n in (min(b, max_tokens), min(b, max_tokens) - 1) if n > max(graph_tokens, b - 32)})
    return {"name": "warmup-eager-keys", "kind": "trace", "seed": 4, "max_concurrency": 1,
            "requests": [[0.0, n, 1] for n in lengths]}


def eager_keys_chunks(entry: dict, size: int = 16) -> list[dict]:
    """``entry`` (eager_keys_entry) in parts of ``size`` prompts, served one after another until
    ``--warmup-eager-keys-s`` runs out; each part its own seed, so that no prompt shares a prefix
    with another's (the prefix cache would shorten its step)."""
    rows = entry["requests"]
    return [{**entry, "name": f"{entry['name']}-{i}", "seed": entry["seed"] + 1000 * i, "requests": rows[j:j + size]}
            for i, j in enumerate(range(0, len(rows), size))]


def jit_hook_rows(lines: list[dict], t0: float, t1: float) -> list[dict]:
    """Triton's post-compile hook's witnesses (the probe's ``jit_hook`` lines) in [t0, t1], times
    from ``t0``: each compile's end, also of a kernel the ``_do_compile`` wrapper did not time."""
    return [{"kernel": j["jit_hook"], "t_s": j["t"] - t0}
            for j in sorted((j for j in lines if "jit_hook" in j), key=lambda j: j["t"]) if t0 <= j["t"] <= t1]


def cpu_probe_ms(rounds: int = 5, n: int = 200_000) -> float:
    """A single-thread speed probe of the host: the median milliseconds of a fixed pure-Python loop.
    Meant to tell hosts whose eager launches are slower apart (Python on one core); it did not:
    it read 18-25 ms on H100 hosts whose Qwen3-30B-A3B eager steps launched in 48 ms and in 77 ms
    (docs/ACCURACY.md). The steps' own ``t_sched_s`` gaps measure the launch."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        acc = 0
        for i in range(n):
            acc += i * i % 7
        times.append(time.perf_counter() - t0)
    return round(1e3 * sorted(times)[len(times) // 2], 3)


def host_info() -> dict:
    """The host the engine runs on: CPU model, logical CPUs (all and this process's), load average
    and the speed probe (cpu_probe_ms)."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu_model": model, "cpus": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "cpu_probe_ms": cpu_probe_ms()}


def write_csv(path: Path, rows: list[dict], columns) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({k: (f"{v:.9f}" if isinstance(v, float) else v) for k, v in row.items()})


LOG_PATTERNS = {
    "available_kv_cache_gib": r"Available KV cache memory: ([\d.]+) GiB",
    "gpu_kv_cache_tokens": r"GPU KV cache size: ([\d,]+) tokens",
    "max_concurrency_x": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
    "cuda_graph_capture_s": r"Graph capturing finished in ([\d.]+) secs",
    "cuda_graph_gib": r"Graph capturing finished in [\d.]+ secs, took ([\d.]+) GiB",
    "torch_compile_s": r"torch.compile takes ([\d.]+) s in total",
    "model_loading_gib": r"Model loading took ([\d.]+) GiB",
    "init_engine_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
    "attention_backend": r"Using (\w+) (?:attention )?backend",
}


def parse_log(text: str) -> dict:
    """vLLM's start-up figures from its log (the last match of each)."""
    out = {}
    for key, pat in LOG_PATTERNS.items():
        found = re.findall(pat, text)
        if found:
            v = found[-1].replace(",", "")
            try:
                out[key] = float(v) if "." in v else int(v)
            except ValueError:
                out[key] = v
    return out


# ---------------------------------------------------------------- the GPU side
async def _run_request(engine, req: dict, t0: float, params_cls, kind_delta, rec: list, on_first=None):
    from vllm.inputs import TokensPrompt  # noqa: F401  (imported for its side effects on old versions)

    sp = params_cls(max_tokens=req["output_tokens"], min_tokens=req["output_tokens"], ignore_eos=True,
                    detokenize=False, output_kind=kind_delta, temperature=0.0)
    sent = time.monotonic()
    times = []
    async for out in engine.generate({"prompt_token_ids": req["ids"]}, sp, req["request_id"]):
        now = time.monotonic()
        n = sum(len(c.token_ids) for c in out.outputs)
        if n and not times and on_first is not None:
            on_first()
        times.extend([now - t0] * n)
    rec.append({"request_id": req["request_id"], "arrival_s": req["arrival_s"], "sent_s": sent - t0,
                "first_token_s": times[0] if times else None, "token_times_s": times,
                "finish_s": time.monotonic() - t0, "prompt_tokens": len(req["ids"]),
                "output_tokens": req["output_tokens"], "phase": req["phase"]})


async def run_workload(engine, entry: dict, reqs: list[dict], params_cls, kind_delta) -> list[dict]:
    rec: list[dict] = []
    t0 = time.monotonic()
    if entry["kind"] == "closed":
        queue = list(reqs)

        async def worker():
            while queue:
                await _run_request(engine, queue.pop(0), t0, params_cls, kind_delta, rec)

        await asyncio.gather(*(worker() for _ in range(entry["concurrency"])))
    elif entry["kind"] == "grid":
        for phase in sorted({r["phase"] for r in reqs}):
            early = [r for r in reqs if r["phase"] == phase and not r.get("late")]
            late = [r for r in reqs if r["phase"] == phase and r.get("late")]
            ready = asyncio.Event()
            pending = [len(early)]
            if not early:
                ready.set()

            def first_token():
                pending[0] -= 1
                if pending[0] == 0:
                    ready.set()

            async def after_ready(r):
                await ready.wait()
                await _run_request(engine, r, t0, params_cls, kind_delta, rec)

            await asyncio.gather(*(_run_request(engine, r, t0, params_cls, kind_delta, rec, first_token)
                                   for r in early), *(after_ready(r) for r in late))
    else:
        limit = entry.get("max_concurrency")
        sem = asyncio.Semaphore(limit) if limit else None

        async def one(r):
            await asyncio.sleep(max(0.0, r["arrival_s"] - (time.monotonic() - t0)))
            if sem is None:
                await _run_request(engine, r, t0, params_cls, kind_delta, rec)
            else:
                async with sem:
                    await _run_request(engine, r, t0, params_cls, kind_delta, rec)

        await asyncio.gather(*(one(r) for r in reqs))
    return rec


def start_gpu_sampler(path: Path):
    try:
        return subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu",
             "--format=csv,noheader,nounits", "-lms", "500"], stdout=open(path, "w"),
            stderr=subprocess.DEVNULL)
    except OSError:
        return None


async def main_async(args) -> None:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    out = Path(args.out)
    plan = json.loads(Path(args.plan).read_text())
    cfg = json.loads((Path(args.model_dir) / "config.json").read_text())
    vocab = int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size"))
    kwargs = dict(model=str(Path(args.model_dir).resolve()), load_format="dummy", skip_tokenizer_init=True,
                  dtype=args.dtype, max_model_len=args.max_model_len, seed=0,
                  gpu_memory_utilization=args.gpu_memory_utilization,
                  enable_prefix_caching=not args.no_prefix_caching, disable_log_stats=False)
    if args.quantization:
        kwargs["quantization"] = args.quantization
    if args.kv_cache_dtype:
        kwargs["kv_cache_dtype"] = args.kv_cache_dtype
    if args.attention_backend:
        kwargs["attention_backend"] = args.attention_backend
    if args.no_async:
        kwargs["async_scheduling"] = False
    if args.max_num_seqs:
        kwargs["max_num_seqs"] = args.max_num_seqs
    t_start = time.monotonic()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs),
                                       usage_context=UsageContext.OPENAI_API_SERVER)
    ready_s = time.monotonic() - t_start
    meta = {"name": args.name, "engine_args": kwargs, "ready_s": ready_s,
            "clock_pair": {"monotonic": time.monotonic(), "wall": time.time()}, "workloads": {},
            "host": host_info()}
    # warm-up: every batch path once, outside the measured workloads
    warm = {"name": "warmup", "kind": "closed", "isl": 600, "osl": 24, "n": 8, "concurrency": 8}
    meta["warmup"] = {"t0_monotonic": time.monotonic()}
    (out / "meta.partial.json").write_text(json.dumps(meta, indent=1))    # a warm-up cut short keeps its steps
    await run_workload(engine, warm, build_requests(warm, vocab), SamplingParams, RequestOutputKind.DELTA)
    for entry in warmup_lengths_entries() if args.warmup_lengths else []:
        t0 = time.monotonic()
        await run_workload(engine, entry, build_requests(entry, vocab), SamplingParams, RequestOutputKind.DELTA)
        print(f"[harness] {args.name} {entry['name']}: {len(entry['requests'])} prompts in "
              f"{time.monotonic() - t0:.1f} s (not recorded)", flush=True)
    meta["warmup_lengths"] = bool(args.warmup_lengths)
    if args.warmup_eager_keys:
        cfg = engine.vllm_config
        listed = json.loads(Path(args.warmup_eager_keys_of).read_text()) if args.warmup_eager_keys_of else None
        of = listed["eager_steps"] if listed else None
        entry = eager_keys_entry(max(cfg.compilation_config.cudagraph_capture_sizes or [0]),
                                 cfg.scheduler_config.max_num_batched_tokens, of)
        t0, served = time.monotonic(), 0
        for part in eager_keys_chunks(entry):
            if args.warmup_eager_keys_s is not None and time.monotonic() - t0 > args.warmup_eager_keys_s:
                break           # the plan is served on what is compiled by then (meta.json's warmup_steps)
            await run_workload(engine, part, build_requests(part, vocab), SamplingParams, RequestOutputKind.DELTA)
            served += len(part["requests"])
        meta["warmup_eager_keys_served"] = served
        if listed:
            meta["warmup_eager_keys_of"] = listed.get("source", [])
        print(f"[harness] {args.name} {entry['name']}: {served} of {len(entry['requests'])} prompts in "
              f"{time.monotonic() - t0:.1f} s (not recorded)", flush=True)
    meta["warmup_eager_keys"] = bool(args.warmup_eager_keys)
    meta["warmup"]["t1_monotonic"] = time.monotonic()
    for entry in plan:
        await engine.reset_prefix_cache()
        reqs = build_requests(entry, vocab)
        t0 = time.monotonic()
        rec = await run_workload(engine, entry, reqs, SamplingParams, RequestOutputKind.DELTA)
        t1 = time.monotonic()
        wdir = out / entry["name"]
        wdir.mkdir(parents=True, exist_ok=True)
        rec.sort(key=lambda r: int(r["request_id"].rsplit("-", 1)[1]))
        with open(wdir / "requests.jsonl", "w") as f:
            for r in rec:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
        spec = {k: v for k, v in entry.items() if k != "requests"}
        meta["workloads"][entry["name"]] = {"t0_monotonic": t0, "t1_monotonic": t1, "spec": spec,
                                            "num_requests": len(reqs)}
        (wdir / "workload.json").write_text(json.dumps(entry))
        print(f"[harness] {args.name} {entry['name']}: {len(reqs)} requests in {t1 - t0:.1f} s", flush=True)
        (out / "meta.partial.json").write_text(json.dumps(meta, indent=1))
    engine.shutdown()
    (out / "meta.partial.json").write_text(json.dumps(meta, indent=1))


def finish(out: Path) -> None:
    """Turn the probe's log and vLLM's log into steps.csv per workload and meta.json."""
    meta = json.loads((out / "meta.partial.json").read_text())
    lines = []
    raw = out / "steps.raw.jsonl"
    if raw.exists():
        for line in raw.read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut by the engine's exit
    meta.setdefault("host", {})["after"] = host_info()      # the same, once the plan was served
    engine_meta = next((l["meta"] for l in lines if "meta" in l), {})
    meta["engine_core"] = engine_meta
    log = out / "vllm.log"
    meta["startup"] = parse_log(log.read_text(errors="replace")) if log.exists() else {}
    if "warmup" in meta:         # what the warm-up ran (and compiled): simulator.first_use's engine state
        w = meta["warmup"]       # no end: the run was stopped in its warm-up, every step is the warm-up's
        rows = write_window(out / "warmup", lines, w["t0_monotonic"], w.get("t1_monotonic", math.inf))
        meta["warmup_steps"] = [r["num_scheduled_tokens"] for r in rows]
    for name, w in meta["workloads"].items():
        w["num_steps"] = len(write_window(out / name, lines, w["t0_monotonic"], w["t1_monotonic"]))
    try:
        import torch
        import vllm
        meta["versions"] = {"vllm": vllm.__version__, "torch": torch.__version__,
                            "cuda": torch.version.cuda, "python": sys.version.split()[0],
                            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    except Exception as err:  # noqa: BLE001 - provenance is best effort off the GPU machine
        meta["versions"] = {"error": repr(err)}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    (out / "meta.partial.json").unlink()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--quantization")
    p.add_argument("--kv-cache-dtype")
    p.add_argument("--attention-backend", default="FLASH_ATTN")
    p.add_argument("--max-model-len", type=int, default=10240)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--no-async", action="store_true")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--warmup-eager-keys", action="store_true",
                   help="before the plan, serve one prompt of each eager step's first-use compile key "
                        "(eager_keys_entry); its steps are the warm-up's (warmup/, meta.json's warmup_steps)")
    p.add_argument("--warmup-eager-keys-of", metavar="FILE",
                   help="with --warmup-eager-keys: only the eager steps' token counts this file lists "
                        "(plans.py --eager-steps-of), each once")
    p.add_argument("--warmup-eager-keys-s", type=float, default=None, metavar="S",
                   help="stop the eager-keys warm-up after the part that passes S seconds, and serve the plan")
    p.add_argument("--warmup-lengths", action="store_true",
                   help="before the plan, serve prompts of 16-8,192 tokens (warmup_lengths_entries), unrecorded")
    p.add_argument("--finish-only", action="store_true", help="only post-process an existing --out")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.finish_only:
        os.environ["KVSIM_STEP_LOG"] = str((out / "steps.raw.jsonl").resolve())
        sampler = start_gpu_sampler(out / "gpu.csv")
        try:
            asyncio.run(main_async(args))
        finally:
            if sampler is not None:
                sampler.terminate()
    finish(out)


if __name__ == "__main__":
    main()
