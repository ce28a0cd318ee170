"""A cost table from real vLLM's own steps: the ``grid`` workload of a bench/results/vllm_h200 engine.

    python bench/vllm_gpu/grid_table.py bench/results/vllm_h200/llama8b-bf16 --out tables/vllm/llama8b-bf16_H200.csv

The harness's ``grid`` workload (bench/vllm_gpu/plans.py) drives vLLM through controlled decode
batches (1 to 256 sequences at 512 and 4,096 tokens of context) and prefills (512 to 8,192
tokens), and its probe records every step the engine core ran: the batch (prefill and decode
tokens, KV read, attention pairs) and ``step_s``, the step's share of the engine's time (from the
later of the previous step's result and this step's schedule to this step's result: with async
scheduling, what the step adds to the engine's cadence, its CPU work overlapped or not). Every
grid step becomes one row of kvsim's step-shape table (``simulator.cost_table.StepShapeCost``):
decode-only steps as CUDA-graph rows padded to vLLM's capture sizes, the others as mixed rows.
Nothing of the closed-loop or trace runs is read: those stay held out (bench/vllm_compare.py
``--clocks vllm-grid``).

Where the engine also ran the idle plan (``ENGINE-idle/idle-prefill``, plans.py ``--size idle``:
48 lone prompts of 64 to 4,096 tokens at an idle engine), its prefill steps are rows too, its
prompts give the ``# frontend:`` line (a request's way in, send -> its step's start, a line in the
prompt's length; a token's way out, step end -> client), and
every row says whether its step started an idle engine (``idle_before``: the step before it ended
more than IDLE_GAP_S before it began). Such a step hides none of its CPU work (async scheduling
overlaps it only with a step in flight): StepShapeCost fits that as its own term, c_idle, which
the engine adds to the first step after an idle wait, instead of letting lone prompts' prices
bend f (the grid's lone prefills all start an idle engine).

Where the engine also served the wave plan with async scheduling off (``ENGINE-noasync-wave``),
the table gets an ``# async off:`` line: what each back-to-back step of that run (and of the
largest closed loop of ``ENGINE-noasync``, where it ran) took from one result to the next beyond
the table's price (the CPU work async scheduling overlaps with the GPU), as a line in the step's
batch size. kvsim adds it to every step of a run with async scheduling off, which the table then
fits (simulator.cost.SyncCost).

Prefill steps whose ``step_s`` is outside ``BAND`` times what they should take (a one-sequence
decode step plus their tokens at the grid's median rate per token) are dropped and counted in the provenance: under async scheduling a step's
result can come back with another's, and its share is then near zero while a neighbour (one or
two steps away) carries both (in the Llama-3.1-8B grid: a 512-token prefill at 195 ms beside a
7,680-token one at 3.8 ms). Decode-only steps are 5-14 ms with no such pairs and are all kept.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
# vLLM 0.23's CUDA-graph capture sizes for max_num_seqs 1024 (compilation config: 1, 2, 4, then
# steps of 8 to 256, of 16 to 512), when the run's meta.json does not list them: a decode batch
# runs the graph of the next size up
CAPTURE_SIZES = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))
# a prefill step outside this band around its tokens' time at the grid's own median rate per
# token is an attribution artefact of async scheduling (module docstring)
BAND = (0.6, 1.6)
# a decode graph size at a KV length (a power-of-two range) is kept where the grid held its batch
# for this many steps (its controlled batches run 24); the few steps of a batch in passing (a
# request finishing, the next arriving) have nearly one KV length, so their line's slope is noise
# (Qwen3-30B-A3B, size 96: -64 s + 1.3 ms per token): such a batch is priced by the next size up
MIN_DECODE_STEPS = 8
# a step that began this long after the previous one ended started an idle engine
IDLE_GAP_S = 0.0005
# ... where the hot plan measured lone prompts 2-3 ms after the last request (ENGINE-hot): those
# are not idle starts (they cost what they cost at once: Llama-3.1-8B bf16 on the H200, 256 tokens
# 9.3 ms against 12-16 ms after 0.1-0.4 s idle), and the table's '# idle wait:' line tells the
# engine to add c_idle only after waits this long
HOT_IDLE_GAP_S = 0.010
# a step scheduled this soon after the previous one's result came back followed it back to back
# (the async-off run's steps: their periods, result to result, are what the engine's cadence is)
BACK_TO_BACK_S = 0.002
COLUMNS = ("kind", "num_seqs", "num_prefill_seqs", "num_prefill_tokens", "num_decode_tokens",
           "num_scheduled_tokens", "kv_read_tokens", "attn_token_pairs", "max_context_tokens",
           "padded_num_seqs", "graph", "step_s", "step_s_min", "step_s_max", "repeats", "idle_before")


def starts_idle(prev_done_s: float | None, done_s: float, step_s: float, gap_s: float = IDLE_GAP_S) -> bool:
    """Whether a step started an idle engine: the step before it (done at ``prev_done_s``; None:
    none) ended more than ``gap_s`` before this one began, so nothing was in flight."""
    return prev_done_s is None or done_s - step_s - prev_done_s > gap_s


def padded(num_seqs: int, sizes=CAPTURE_SIZES) -> int | None:
    """The capture size a decode batch of ``num_seqs`` runs at; None above the largest (eager)."""
    return next((s for s in sizes if s >= num_seqs), None)


def grid_rows(steps_csv: Path, sizes=CAPTURE_SIZES, gap_s: float = IDLE_GAP_S) -> tuple[list[dict], int]:
    """The table's rows from the probe's step records, and how many artefacts were dropped
    (``gap_s``: the wait that makes a step an idle start)."""
    with open(steps_csv, newline="") as f:
        steps = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    # a prefill step's expected time for the artefact band: the grid's one-sequence decode step
    # (the fixed cost of any step) plus its tokens at the grid's median rate per token beyond it
    single = [s["step_s"] for s in steps if s["num_prefill_tokens"] == 0 and s["num_seqs"] == 1]
    base = float(np.median(single)) if single else 0.0
    big = [s for s in steps if s["num_prefill_tokens"] >= 512]
    per_token = float(np.median([max(s["step_s"] - base, 0.0) / s["num_scheduled_tokens"] for s in big])) \
        if big else 0.0
    # a lone prompt (one sequence, no decode) of a length the grid ran several times: the fastest
    # is the engine's time; one slower than BAND[1] x it waited for the CPU (the harness sending
    # a decode batch's prompts one by one: Qwen3-30B-A3B on the H100, 256 tokens in 27 ms once
    # and 67-1,247 ms as a batch's prompts)
    fastest: dict[float, float] = {}
    for s in steps:
        if s["num_seqs"] == 1 and s["num_decode_tokens"] == 0 and s["step_s"] > 0:
            n = s["num_prefill_tokens"]
            fastest[n] = min(fastest.get(n, s["step_s"]), s["step_s"])
    rows, dropped, prev_done = [], 0, None
    for s in steps:
        idle = starts_idle(prev_done, s["t_done_s"], s["step_s"], gap_s)
        prev_done = s["t_done_s"]
        if s["num_scheduled_tokens"] < 1 or s["step_s"] <= 0:
            dropped += 1
            continue
        ratio = s["step_s"] / (base + per_token * s["num_scheduled_tokens"]) if per_token else 1.0
        if s["num_prefill_tokens"] >= 512 and not BAND[0] <= ratio <= BAND[1]:
            dropped += 1
            continue
        if s["num_seqs"] == 1 and s["num_decode_tokens"] == 0 \
                and s["step_s"] > BAND[1] * fastest[s["num_prefill_tokens"]]:
            dropped += 1
            continue
        n = int(s["num_seqs"])
        decode = s["num_prefill_tokens"] == 0
        size = padded(n, sizes) if decode else None
        rows.append({
            "kind": "decode" if decode else "mixed", "num_seqs": n, "num_prefill_seqs": int(s["num_prefill_seqs"]),
            "num_prefill_tokens": int(s["num_prefill_tokens"]), "num_decode_tokens": int(s["num_decode_tokens"]),
            "num_scheduled_tokens": int(s["num_scheduled_tokens"]), "kv_read_tokens": int(s["kv_read_tokens"]),
            "attn_token_pairs": int(s["attn_token_pairs"]), "max_context_tokens": int(s["max_context_tokens"]),
            "padded_num_seqs": size or n, "graph": int(size is not None), "step_s": f"{s['step_s']:.9f}",
            "step_s_min": f"{s['step_s']:.9f}", "step_s_max": f"{s['step_s']:.9f}", "repeats": 1,
            "idle_before": int(idle and not decode)})
    # a decode batch's neighbours: the same graph size at about the same KV length (a size the grid
    # ran at 512 and at 4,096 tokens of context has two such groups, 3x apart in time)
    groups: dict[tuple[int, int], list[float]] = {}

    def group(r: dict) -> tuple[int, int]:
        return r["padded_num_seqs"], int(r["kv_read_tokens"]).bit_length()

    for r in rows:
        if r["kind"] == "decode":
            groups.setdefault(group(r), []).append(float(r["step_s"]))
    median = {g: float(np.median(v)) for g, v in groups.items()}

    def keep(r: dict) -> bool:
        if r["kind"] != "decode":
            return True
        g = group(r)   # held long enough, and not a step carrying another's time
        return len(groups[g]) >= MIN_DECODE_STEPS and BAND[0] <= float(r["step_s"]) / median[g] <= BAND[1]

    kept = [r for r in rows if keep(r)]
    return kept, dropped + len(rows) - len(kept)


# the least ratio of one knot to the one before it
MIN_KNOT_RATIO = 1.5


def knots(rows: list[dict]) -> list[int]:
    """f's knots for StepShapeCost (its ``# knots:`` line): one per power-of-two range of the
    mixed steps' token counts, at the range's median count. vLLM's steps give hundreds of distinct,
    noisy counts (8,171, 8,173, ... tokens); a knot at each let f swing between neighbours and
    extrapolate below the smallest one to nothing (Qwen3-30B-A3B: a 256-token prefill at 0 s)."""
    counts: dict[int, list[int]] = {}
    for r in rows:
        if r["kind"] == "mixed":
            n = r["num_scheduled_tokens"]
            counts.setdefault(int(n - 1).bit_length(), []).append(n)   # (2^k, 2^(k+1)]
    out: list[int] = []
    for knot in sorted({int(np.median(v)) for v in counts.values()}):
        if not out or knot >= MIN_KNOT_RATIO * out[-1]:
            out.append(knot)    # two knots a few tokens apart (64 and 65) let f swing between them
    return out if len(out) >= 2 else [1, *out]


# requests the harness sent within this long of the first make one burst
BURST_WINDOW_S = 0.005


def burst_cutoffs(run: Path, max_num_batched_tokens: int) -> tuple[float, float, list[tuple[float, float]]]:
    """How an idle engine's first step takes a burst (requests sent together: the grid's decode
    points send their batch at once): (the client's first gap between two sends, its later gaps
    (medians, s), per burst the span of the cutoff: the first step took the requests sent up to
    ``lo`` after the first and not the one sent at ``hi``). vLLM's engine core schedules as soon as
    it wakes on the first request and takes what has reached it; the rest join the step scheduled
    next. A burst whose first step is all it had (``hi`` unknown) spans one later gap beyond its
    last send; one whose next prompt would not have fitted the token budget, or that reached a
    busy engine, says nothing and is left out."""
    with open(run / "steps.csv", newline="") as f:
        steps = [(float(r["t_done_s"]) - float(r["step_s"]), float(r["t_done_s"]), int(r["num_prefill_seqs"]),
                  int(r["num_seqs"])) for r in csv.DictReader(f)]
    with gzip.open(run / "requests.jsonl.gz", "rt") as f:
        reqs = sorted((json.loads(line) for line in f), key=lambda r: r["sent_s"])
    bursts, i = [], 0
    while i < len(reqs):
        j = i
        while j + 1 < len(reqs) and reqs[j + 1]["sent_s"] - reqs[i]["sent_s"] < BURST_WINDOW_S:
            j += 1
        burst, i = reqs[i:j + 1], j + 1
        first = burst[0]["sent_s"]
        nxt = next((s for s in steps if s[1] > first), None)
        if len(burst) < 2 or nxt is None or any(a < first < b for a, b, _, _ in steps) or nxt[2] != nxt[3]:
            continue                         # one request, no step after it, or a busy engine
        taken = nxt[2]
        if taken < len(burst) and sum(r["prompt_tokens"] for r in burst[:taken + 1]) > max_num_batched_tokens:
            continue                         # the budget, not the race, ended the first step
        bursts.append(([r["sent_s"] - first for r in burst], taken))
    gaps = [b[0][1] for b in bursts]
    later = [y - x for b in bursts for x, y in zip(b[0][1:], b[0][2:])]
    first_gap = float(np.median(gaps)) if gaps else 0.0
    later_gap = float(np.median(later)) if later else first_gap
    spans = [(sent[taken - 1], sent[taken] if taken < len(sent) else sent[-1] + later_gap) for sent, taken in bursts]
    return first_gap, later_gap, spans


# an eager step's launch is read from steps of at most this many tokens (a larger one, a chunk
# beside many decodes, carries more sequences' CPU work)
LAUNCH_MAX_TOKENS = 4096


def eager_launch_gaps(rows: list[dict], graph_tokens: int, compiles=()) -> list[float]:
    """The launches of the steps on no CUDA graph that a steps.csv (with the probe's ``t_sched_s``)
    shows: under async scheduling vLLM schedules the next step as soon as this one is launched, so
    the gap between the two schedulings is this step's launch; only where the next step was
    scheduled before this one ended (not after an idle wait) and no compile (``compiles``: jit.csv's
    (t0_s, t1_s)) fell between them. None of them for a steps.csv without ``t_sched_s``."""
    if not rows or "t_sched_s" not in rows[0]:
        return []
    gaps = []
    for a, b in zip(rows, rows[1:]):
        t0, t1 = float(a["t_sched_s"]), float(b["t_sched_s"])
        if graph_tokens < int(a["num_scheduled_tokens"]) <= LAUNCH_MAX_TOKENS and t1 < float(a["t_done_s"]) \
                and not any(c0 < t1 and c1 > t0 for c0, c1 in compiles):
            gaps.append(t1 - t0)
    return gaps


def run_launch_gaps(run: Path, graph_tokens: int) -> list[float] | None:
    """eager_launch_gaps of one workload's folder (its steps.csv and jit.csv); None where its
    steps.csv has no ``t_sched_s`` (a run from before the probe recorded it)."""
    with open(run / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    if rows and "t_sched_s" not in rows[0]:
        return None
    compiles = []
    if (run / "jit.csv").is_file():
        with open(run / "jit.csv") as f:
            compiles = [(float(r["t0_s"]), float(r["t1_s"])) for r in csv.DictReader(f)]
    return eager_launch_gaps(rows, graph_tokens, compiles)


# a grid run's folder suffixes: the fine grid (-fine), or the fine grid after a keys warm-up
# (-finekeys, device_run.sh ENGINE-finekeys), beside the engine's other runs
GRID_SUFFIXES = ("-finekeys", "-fine")


def engine_base(engine: Path) -> str:
    """The engine's name without its grid run's suffix (``llama8b-fp8-fine`` -> ``llama8b-fp8``)."""
    return next((engine.name.removesuffix(k) for k in GRID_SUFFIXES if engine.name.endswith(k)), engine.name)


def idle_run(engine: Path) -> Path | None:
    """The idle-plan run beside an engine's folder (``llama8b-fp8-fine`` -> ``llama8b-fp8-idle``):
    its second serving where the plan served it twice (plans.py --again: gpt-oss's first serving
    compiles kernels inside its steps, 0.6 s a lone prompt's mean TTFT against 30 ms the second
    time), else its only one."""
    base = engine.parent / f"{engine_base(engine)}-idle"
    return next((run for run in (base / "idle-prefill-again", base / "idle-prefill")
                 if (run / "steps.csv").is_file()), None)


def hot_runs(engine: Path) -> list[Path]:
    """The hot plan's workloads beside an engine's folder (``ENGINE-hot/hot-ISL``, plans.py
    --size hot), each its second serving where the plan served it twice."""
    base = engine.parent / f"{engine_base(engine)}-hot"
    runs = []
    for first in sorted(base.glob("hot-*[0-9]"), key=lambda p: int(p.name.removeprefix("hot-"))):
        run = next((r for r in (first.with_name(first.name + "-again"), first) if (r / "steps.csv").is_file()), None)
        runs += [run] if run is not None else []
    return runs


# the closed loops of an engine's held-out async-off run (``ENGINE-noasync``) that the line is
# fitted on as well: the largest batch; the others and its trace excerpt stay held out
ASYNC_OFF_FIT_POINTS = ("cl-1024-128-c64",)


def noasync_runs(engine: Path) -> list[Path]:
    """The async-off workloads an engine's ``# async off:`` line is fitted on, beside its folder
    (``qwen3-30b-a3b-fine`` -> ``qwen3-30b-a3b-noasync-wave``'s waves, its warm-up left out, and
    ASYNC_OFF_FIT_POINTS of ``qwen3-30b-a3b-noasync``); none without the wave run."""
    base = engine.parent / engine_base(engine)
    wave = base.with_name(base.name + "-noasync-wave")
    if not (wave / "meta.json").is_file():
        return []
    closed = [base.with_name(base.name + "-noasync") / p for p in ASYNC_OFF_FIT_POINTS]
    return [w for w in sorted(wave.glob("*/")) if not w.name.endswith("warmup") and (w / "steps.csv").is_file()] \
        + [c for c in closed if (c / "steps.csv").is_file()]


def async_off_fit(table: Path, runs: list[Path]) -> tuple[float, float, int]:
    """What a step costs more with async scheduling off than ``table`` (measured with it on)
    prices it, as a line in the step's batch size: (s per step, s per sequence, steps). Each of the
    async-off ``runs``' back-to-back steps gives its period (its result after the one before it)
    less the table's price; the line is the least-squares one through the medians of each batch size
    (num_seqs), weighted by their steps (a slope below 0 is 0, and the line the median). The CPU
    work async scheduling overlaps with the GPU shows in every such period: input preparation, the
    output's processing and hand-off, part of it per request."""
    from kvsim.simulator.cost import StepBatch
    from kvsim.simulator.cost_table import load_cost_table

    cost = load_cost_table(table)
    extra: dict[int, list[float]] = {}
    for run in runs:
        prev = None
        with open(run / "steps.csv", newline="") as f:
            for r in csv.DictReader(f):
                done = float(r["t_done_s"])
                if prev is not None and float(r["t_sched_s"]) - prev <= BACK_TO_BACK_S:
                    batch = StepBatch(int(r["num_seqs"]), int(r["num_prefill_tokens"]), int(r["num_decode_tokens"]),
                                      int(r["num_scheduled_tokens"]), int(r["kv_read_tokens"]),
                                      int(r["attn_token_pairs"]), int(r["max_context_tokens"]))
                    extra.setdefault(batch.num_seqs, []).append(done - prev - cost.step_time_s(batch))
                prev = done
    steps = sum(map(len, extra.values()))
    sizes = np.array(sorted(extra), dtype=float)
    medians = np.array([np.median(extra[n]) for n in sorted(extra)])
    weights = np.array([len(extra[n]) for n in sorted(extra)], dtype=float)
    if len(sizes) > 1:
        slope, intercept = np.polyfit(sizes, medians, 1, w=np.sqrt(weights))
        if slope > 0:
            return float(intercept), float(slope), steps
    return float(np.median(np.concatenate([np.asarray(v) for v in extra.values()]))), 0.0, steps


def frontend(run: Path) -> tuple[float, float, float, int]:
    """(in_s, in_s per prompt token, out_s, prompts) of an idle run's lone prompts (sent while no
    step ran): the way in is the send to the start of the prompt's step (the first lone prefill of
    its length that starts after it), a line in the prompt's length through the medians of each
    length; the way out is the step's end to the first token at the client, the median."""
    with open(run / "steps.csv", newline="") as f:
        every = [(float(r["t_done_s"]) - float(r["step_s"]), float(r["t_done_s"]), int(r["num_prefill_tokens"]),
                  r["num_seqs"]) for r in csv.DictReader(f)]
    steps = [s for s in every if s[3] == "1" and s[2] > 0]
    busy = [(s[0], s[1]) for s in every]
    with gzip.open(run / "requests.jsonl.gz", "rt") as f:
        reqs = [json.loads(line) for line in f]
    ins: dict[int, list[float]] = {}
    outs = []
    for r in reqs:
        step = next((s for s in steps if s[2] == r["prompt_tokens"] and s[0] >= r["sent_s"]), None)
        if step is None or step[1] > r["first_token_s"] or any(a <= r["sent_s"] <= b for a, b in busy):
            continue      # sent while a step ran (a long prompt before it), or not a step of its own
        ins.setdefault(r["prompt_tokens"], []).append(step[0] - r["sent_s"])
        outs.append(r["first_token_s"] - step[1])
    lengths = sorted(ins)
    slope, level = np.polyfit(lengths, [float(np.median(ins[p])) for p in lengths], 1)
    return max(float(level), 0.0), max(float(slope), 0.0), float(np.median(outs)), len(outs)


def _from_root(folder: Path) -> str:
    """The folder as the repository names it (the same table from any working directory)."""
    try:
        return folder.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return folder.resolve().as_posix()


def provenance(folder: Path, meta: dict, num_rows: int, dropped: int, knot_tokens: list[int],
               idle: Path | None = None, hot: list[Path] = (),
               async_off: tuple[float, float, int, list[Path]] | None = None,
               first_step: tuple[float, float, list[tuple[float, float]]] | None = None,
               graph_tokens: int | None = None, launch: tuple[float, int] | None = None) -> list[str]:
    """The table's ``#`` lines: what kvsim's table readers and ``mismatches`` look for
    (``async_off``: seconds per step and per sequence, steps, and the async-off workloads they were
    measured on; ``first_step``: burst_cutoffs' figures; ``graph_tokens``: the largest CUDA graph)."""
    args, core = meta.get("engine_args", {}), meta.get("engine_core", {})
    way = frontend(idle) if idle else None
    versions = meta.get("versions", {})
    kv = args.get("kv_cache_dtype") or "auto"
    wall = meta.get("clock_pair", {}).get("wall")
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(wall)) if wall else "unknown"
    return [
        "# kvsim cost table: real vLLM's own steps (bench/vllm_gpu/grid_table.py over the harness's grid workload)",
        f"# gpu: {versions.get('gpu', 'NVIDIA H200')}",   # the runs before 2026-12-05 were all on one H200
        f"# date: {date}",
        f"# versions: {', '.join(f'{k} {v}' for k, v in sorted(versions.items())) or 'unknown'}",
        f"# model: {Path(str(args.get('model', folder.name))).name}",
        f"# executor: vllm, dtype {kv if kv != 'auto' else args.get('dtype', 'auto')}, block_size "
        f"{core.get('block_size')}, num_gpu_blocks {core.get('num_gpu_blocks')}, max_num_seqs {core.get('max_num_seqs')}, "
        f"max_num_batched_tokens {core.get('max_num_batched_tokens')}, async scheduling {core.get('async_scheduling')}",
        f"# timing: the probe's step_s (the step's share of the engine's time, async scheduling as served); "
        f"{num_rows} grid steps, {dropped} dropped (prefills outside {BAND[0]}-{BAND[1]}x a one-sequence step "
        f"plus their tokens at the grid's median rate: async attribution artefacts; decode batches held under {MIN_DECODE_STEPS} steps, or "
        f"outside {BAND[0]}-{BAND[1]}x the median of their size at their KV length)",
        f"# knots: {','.join(map(str, knot_tokens))}",
        *([f"# frontend: in_s {way[0]:.6f} + {way[1]:.3e} per prompt token, out_s {way[2]:.6f} (over {way[3]} "
           f"lone prompts of {_from_root(idle)}: send -> step start, step end -> first token at the client)"]
          if idle else []),
        *([f"# idle wait: {HOT_IDLE_GAP_S} s (c_idle after an idle wait this long or longer; lone prompts "
           f"{HOT_IDLE_GAP_S * 1e3:g} ms or less after the last step are rows of their own price: "
           f"{_from_root(hot[0].parent)})"] if hot else []),
        *([f"# async off: +{async_off[0]:.6f} s per step +{async_off[1]:.3e} s per sequence (a line in the "
           f"batch size through {async_off[2]} back-to-back steps of "
           f"{' and '.join(dict.fromkeys(_from_root(r.parent if r.parent.name.endswith('-wave') else r) for r in async_off[3]))}, served with async scheduling off: result to "
           f"result, less this table's price)"] if async_off else []),
        *([f"# first step: sends {first_step[0]:.6f} s then {first_step[1]:.6f} s apart, cutoffs "
           f"{' '.join(f'{lo:.6f}-{hi:.6f}' for lo, hi in first_step[2])} s after the first send "
           f"({len(first_step[2])} bursts of the grid at an idle engine); graphs to {graph_tokens} tokens"]
          if first_step and first_step[2] else []),
        *([f"# eager launch: {launch[0]:.6f} s (this host's launch of a step on no CUDA graph: the median gap "
           f"between such a step's scheduling and the next step's over {launch[1]} steps of the grid of at most "
           f"{LAUNCH_MAX_TOKENS} tokens)"] if launch else []),
        f"# source: {_from_root(folder)}/grid" + (f" and {_from_root(idle)}" if idle else "")
        + "".join(f" and {_from_root(run)}" for run in hot)
        + " (held out: every closed-loop and trace run of the same engine)",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine", type=Path, help="a bench/results/vllm_GPU/ENGINE folder with a grid run")
    ap.add_argument("--out", type=Path, required=True, help="the cost table (CSV)")
    a = ap.parse_args(argv)
    steps = a.engine / "grid" / "steps.csv"
    if not steps.is_file():
        print(f"grid_table: {steps} does not exist", file=sys.stderr)
        return 2
    meta = json.loads((a.engine / "meta.json").read_text())
    sizes = meta.get("engine_core", {}).get("cudagraph_capture_sizes") or CAPTURE_SIZES
    hot = hot_runs(a.engine)
    gap = HOT_IDLE_GAP_S if hot else IDLE_GAP_S
    rows, dropped = grid_rows(steps, sizes, gap)
    idle = idle_run(a.engine)
    if idle is not None:   # the idle plan's lone prompts (its decode steps are the grid's business)
        more, more_dropped = grid_rows(idle / "steps.csv", sizes, gap)
        rows += [r for r in more if r["kind"] == "mixed"]
        dropped += more_dropped
    for run in hot:        # the hot plan's lone prompts, the same
        more, more_dropped = grid_rows(run / "steps.csv", sizes, gap)
        rows += [r for r in more if r["kind"] == "mixed"]
        dropped += more_dropped
    a.out.parent.mkdir(parents=True, exist_ok=True)

    core = meta.get("engine_core", {})
    first_step = burst_cutoffs(a.engine / "grid", int(core.get("max_num_batched_tokens") or 8192)) \
        if (a.engine / "grid" / "requests.jsonl.gz").is_file() else None    # (no requests: no bursts)

    gaps = run_launch_gaps(a.engine / "grid", max(sizes)) or []
    launch = (statistics.median(gaps), len(gaps)) if gaps else None

    def write(async_off=None):
        with open(a.out, "w", newline="") as f:
            f.write("\n".join(provenance(a.engine, meta, len(rows), dropped, knots(rows), idle, hot,
                                         async_off, first_step, max(sizes), launch)) + "\n")
            # the idle-start column where the idle plan measured lone prompts cleanly; the grid's own
            # idle starts alone are too few and carry the harness's waits (a decode point's prompts
            # sent one by one: Llama-3.1-8B bf16 H100, a lone 4,096-token prompt at 98.6-133.8 ms)
            columns = COLUMNS if idle is not None else COLUMNS[:-1]
            w = csv.DictWriter(f, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)

    write()
    sync = noasync_runs(a.engine) if meta.get("engine_core", {}).get("async_scheduling") else []
    if sync:    # priced by the table just written, then the table again with the line
        write((*async_off_fit(a.out, sync), sync))
    print(f"{a.out}: {len(rows)} rows from {steps}{f' and {idle}' if idle else ''}"
          f"{''.join(f' and {run}' for run in hot)} ({dropped} dropped)"
          + (f"; async off from {', '.join(map(str, sync))}" if sync else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
