"""The measurement plans of the real-vLLM runs: which workloads each engine serves, as plan.json.

    python bench/vllm_gpu/plans.py --size small --traces ../shared/traces --out plan.json

Three kinds of workload per engine (harness.py's docstring defines them):

* ``grid``: the fit set. Controlled decode batches (batch x context) and single prefills; the
  step model is fitted to these steps only.
* ``cl-ISL-OSL-cC``: closed-loop points, ``vllm bench serve --max-concurrency C`` style. Held
  out: never fitted to.
* ``azure-conv`` / ``mooncake-conv``: trace excerpts at their own arrival times. Held out.

* ``idle``: lone prompts at an idle engine (``--size idle``): the fit set of the idle-start term
  (a step that starts an idle engine hides none of its CPU work behind a step in flight), with
  C = 1 closed loops of 8 requests held out beside it.
* ``hot``: lone prompts 2-3 ms after the last request finished (``--size hot``: C = 1 closed
  loops ``hot-ISL`` of 2 output tokens at lengths the held-out loops do not use): the fit set of
  a lone prompt's own price. The idle plan's prompts all start an engine idle for 0.15-0.4 s,
  so its tables cannot tell a short prefill's price from the idle start's (Qwen3-30B-A3B on the
  H200: f(256) = 0.85 ms beside c_idle = 21 ms, where a C = 1 loop's 256-token step takes 20 ms).

* ``burst``: C prompts sent at once, BURST_WAVES times (``--size burst``: closed loops
  ``burst-ISL-xC`` of 2 output tokens, n = BURST_WAVES x C, so each wave's prompts finish and are
  sent again together): what a step of several prompts costs. The held-out closed loops' bursts
  cost Qwen3-30B-A3B up to 2.7x their table price (H200, a wave of 6 x 256 then 10 x 256 tokens
  after a decode step: 178 ms real, 66 ms priced), and the grid has no such steps to fit (its
  prefills are lone prompts or chunks of ~8k tokens).

* ``start``: one burst of C prompts at an idle engine per workload (``--size start``: closed loops
  ``start-ISL-xC-rR`` of exactly C requests of 2 output tokens, C of START_SIZES, START_REPEATS
  times each, at lengths no other plan uses): how many of a burst real vLLM's first step takes
  (every held-out closed loop starts with such a burst; the grid's bursts are 15-37 prompts, and
  kvsim's '# first step:' draw from them splits 2-prompt bursts about half the time where the
  burst plan's runs split a third). Not yet measured.

* ``wave``: the same waves of prompts after decode phases of different lengths (``--size wave``:
  closed loops ``wave-ISL-xC-oOSL``, WAVE_ISL x WAVE_C at WAVE_OSLS output tokens, WAVE_COUNT waves
  each): whether a wave costs more after a long decode phase (Qwen3-30B-A3B's held-out loop
  cl-1024-128-c4 on the H100: a wave of 4 x 1,024 tokens 196 ms after 128-token outputs). It does
  not (run 2026-12-07): a wave costs 57-58 ms taken whole and 89-105 ms when the engine's first
  step caught only part of it, after any decode phase (docs/ACCURACY.md).

``--size`` scales the plan to the model (a 70B model's prefill costs 9x an 8B's): ``small``
(<= 30B total or <= 5B active parameters), ``large`` (the rest); ``fine`` is a denser grid (every
CUDA-graph size, more prefills, prompts beside decodes) for a grid-only run (``--only grid``). The excerpts are the first
``--trace-s`` seconds of each trace, requests longer than ``--max-model-len`` left out (the plan
records every request it keeps, so kvsim replays exactly these).
"""
from __future__ import annotations

import argparse
import csv
import json
import random
from datetime import datetime
from pathlib import Path

GRID = {
    "small": {"decode": [(b, 512, 24) for b in (1, 4, 16, 32, 64, 128, 256)]
                        + [(b, 4096, 24) for b in (1, 8, 32, 64)],
              "prefill": [512, 2048, 8192]},
    "large": {"decode": [(b, 512, 24) for b in (1, 8, 32, 128)] + [(b, 4096, 24) for b in (1, 16)],
              "prefill": [2048, 8192]},
    # every CUDA-graph size to 256 at 256 tokens of context (an MoE step's time grows with the
    # experts its batch touches: no size may be priced at the next one's), the small ones at 2,048,
    # single prefills from 128 to 8,192 tokens, and prompts chunked beside running decodes
    "fine": {"decode": [(b, 256, 24) for b in (1, 2, 4, *range(8, 257, 8))]
                       + [(b, 2048, 24) for b in (1, 4, 16, 32, 64, 96, 128)],
             "prefill": [128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192],
             "mixed": [(16, 1024, 512), (16, 1024, 2048), (64, 1024, 512), (64, 1024, 2048),
                       (64, 1024, 8192), (128, 1024, 1024), (128, 1024, 4096)]},
}
# the idle plan: lone prompts of these lengths, each IDLE_REPEATS times in an interleaved order,
# IDLE_GAPS_S apart, drawn in turn by a seeded draw (the engine idle between them: 2 output
# tokens take one decode step)
IDLE_PROMPTS = (64, 256, 512, 1024, 2048, 4096)
IDLE_REPEATS = 8
IDLE_GAPS_S = (0.15, 0.4)
# the hot plan: C = 1 closed loops of HOT_REPEATS prompts of each length, 2 output tokens (one
# prefill step and one decode step a request); none of the held-out loops' 256 and 1,024
HOT_PROMPTS = (64, 128, 512, 2048, 4096)
HOT_REPEATS = 8
# the burst plan: (prompt length, prompts a wave) at lengths and sizes the held-out loops do not use
BURST_POINTS = ((128, 2), (128, 8), (512, 2), (512, 4), (512, 12), (2048, 3))
BURST_WAVES = 4
# the wave plan: one wave shape (a length the held-out loops do not use) after decode phases of
# these many output tokens
WAVE_ISL, WAVE_C, WAVE_OSLS, WAVE_COUNT = 768, 4, (2, 16, 64, 256), 4
# the start plan: one burst of C prompts at an idle engine per workload (a closed loop of exactly
# C requests of 2 output tokens), START_REPEATS times per (length, C), at lengths no other plan
# uses: how many of a burst the engine's first step takes (the '# first step:' line's fit set
# beside the grid's bursts, which are larger: 15-37 prompts)
START_PROMPTS = (192, 640, 1536)
START_SIZES = (2, 3, 4, 6, 8, 12, 16)
START_REPEATS = 6
# (isl, osl, concurrencies): the first pair is the full sweep
SWEEPS = {
    "small": [(1024, 128, (1, 4, 16, 64, 128)), (4096, 128, (1, 16, 64)), (256, 512, (1, 16, 128))],
    "large": [(1024, 128, (1, 4, 16, 64, 128)), (4096, 128, (1, 16)), (256, 512, (1, 32))],
}


def closed_points(size: str) -> list[dict]:
    out = []
    for isl, osl, concs in SWEEPS.get(size, ()):
        for c in concs:
            out.append({"name": f"cl-{isl}-{osl}-c{c}", "kind": "closed", "isl": isl, "osl": osl,
                        "n": max(2, 2 * c), "concurrency": c, "isl_range": 0.0, "osl_range": 0.0,
                        "seed": c})
    return out


def idle_points(gaps_s: tuple[float, ...] = IDLE_GAPS_S) -> list[dict]:
    """The idle plan: lone prompts spaced apart (a trace workload), then C = 1 closed loops.
    ``gaps_s`` must exceed the model's longest lone prefill (Qwen3-32B's 4,096 tokens: 0.41 s on
    an H100, so ``--idle-gaps 0.6,1.2`` for the large models)."""
    rng, reqs, t = random.Random(4), [], 0.0
    for _ in range(IDLE_REPEATS):
        for p in rng.sample(IDLE_PROMPTS, len(IDLE_PROMPTS)):
            reqs.append([round(t, 6), p, 2])
            t += rng.choice(gaps_s)
    out = [{"name": "idle-prefill", "kind": "trace", "seed": 4, "requests": reqs}]
    for isl, osl in ((1024, 128), (256, 512)):
        out.append({"name": f"cl-{isl}-{osl}-c1-n8", "kind": "closed", "isl": isl, "osl": osl, "n": 8,
                    "concurrency": 1, "isl_range": 0.0, "osl_range": 0.0, "seed": 11})
    return out


def hot_points() -> list[dict]:
    """The hot plan: per length, a C = 1 closed loop of 2-token outputs (each prompt sent when
    the last one finished: its step starts 2-3 ms after the engine's last one)."""
    return [{"name": f"hot-{isl}", "kind": "closed", "isl": isl, "osl": 2, "n": HOT_REPEATS,
             "concurrency": 1, "isl_range": 0.0, "osl_range": 0.0, "seed": 12}
            for isl in HOT_PROMPTS]


def burst_points() -> list[dict]:
    """The burst plan: per (length, prompts a wave), a closed loop of 2-token outputs whose C
    prompts go out together BURST_WAVES times (a wave's requests finish in the same step)."""
    return [{"name": f"burst-{isl}-x{c}", "kind": "closed", "isl": isl, "osl": 2, "n": BURST_WAVES * c,
             "concurrency": c, "isl_range": 0.0, "osl_range": 0.0, "seed": 13}
            for isl, c in BURST_POINTS]


def wave_points() -> list[dict]:
    """The wave plan: closed loops of WAVE_C prompts of WAVE_ISL tokens sent together WAVE_COUNT
    times, at each output length of WAVE_OSLS (the decode phase before the next wave), after a
    warm-up."""
    points = [{"name": f"wave-{WAVE_ISL}-x{WAVE_C}-o{osl}", "kind": "closed", "isl": WAVE_ISL, "osl": osl,
               "n": WAVE_COUNT * WAVE_C, "concurrency": WAVE_C, "isl_range": 0.0, "osl_range": 0.0, "seed": 14}
              for osl in WAVE_OSLS]
    # first, the first point once more: a fresh engine's first steps pay first-use costs
    # (Qwen3-30B-A3B's first two 128-token steps 128 and 277 ms, later ones 27 ms)
    return [dict(points[0], name="wave-warmup", seed=15), *points]


def start_points() -> list[dict]:
    """The start plan: per prompt length, burst size and repeat, one workload that sends C prompts
    at once to an idle engine (the harness resets the prefix cache between workloads) and ends
    when they have their 2 tokens; the repeats interleave so that no size runs back to back."""
    return [{"name": f"start-{isl}-x{c}-r{r}", "kind": "closed", "isl": isl, "osl": 2, "n": c,
             "concurrency": c, "isl_range": 0.0, "osl_range": 0.0, "seed": 16 + r}
            for r in range(START_REPEATS) for isl in START_PROMPTS for c in START_SIZES]


def azure_excerpt(path: Path, seconds: float, max_model_len: int) -> list[list]:
    rows, first = [], None
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            t = datetime.fromisoformat(rec["TIMESTAMP"][:26]).timestamp()
            first = t if first is None else first
            if t - first > seconds:
                break
            p, o = int(rec["ContextTokens"]), int(rec["GeneratedTokens"])
            if p + o <= max_model_len and o >= 1:
                rows.append([round(t - first, 6), p, o])
    return rows


def mooncake_excerpt(path: Path, seconds: float, max_model_len: int) -> list[list]:
    rows = []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            t = rec["timestamp"] / 1000.0
            if t > seconds:
                break
            p, o = rec["input_length"], rec["output_length"]
            if p + o <= max_model_len and o >= 1:
                rows.append([t, p, o, rec["hash_ids"]])
    return rows


def build_plan(size: str, traces: Path | None, trace_s: float, max_model_len: int,
               mooncake: bool, idle_gaps_s: tuple[float, ...] = IDLE_GAPS_S) -> list[dict]:
    if size == "idle":
        return idle_points(idle_gaps_s)
    if size == "hot":
        return hot_points()
    if size == "burst":
        return burst_points()
    if size == "wave":
        return wave_points()
    if size == "start":
        return start_points()
    grid = GRID[size]
    plan = [{"name": "grid", "kind": "grid", "decode": [list(d) for d in grid["decode"]],
             "prefill": grid["prefill"], "mixed": [list(m) for m in grid.get("mixed", [])], "seed": 1}]
    plan += closed_points(size)
    if traces is not None:
        azure = traces / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
        if azure.exists():
            plan.append({"name": "azure-conv", "kind": "trace", "seed": 2,
                         "source": "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
                         "requests": azure_excerpt(azure, trace_s, max_model_len)})
        moon = traces / "mooncake" / "conversation_trace.jsonl"
        if mooncake and moon.exists():
            plan.append({"name": "mooncake-conv", "kind": "trace", "seed": 3, "block_tokens": 512,
                         "source": "mooncake/conversation_trace.jsonl",
                         "requests": mooncake_excerpt(moon, trace_s / 2, max_model_len)})
    return plan


def in_rounds(plan: list[dict], rounds: int) -> list[dict]:
    """The plan's closed loops ``cl-ISL-OSL-cC`` with ``rounds`` x C requests each (every client
    sends ``rounds`` in turn), named ``cl-ISL-OSL-cC-nN``; the other workloads as they are. More
    rounds a point: a wave's cost is measured more than twice (the 2C points' are), so one slow
    wave weighs less in its mean TTFT."""
    return [dict(e, n=rounds * e["concurrency"], name=f"{e['name']}-n{rounds * e['concurrency']}")
            if e["name"].startswith("cl-") and e["kind"] == "closed" else e for e in plan]


def served_again(plan: list[dict]) -> list[dict]:
    """The plan, then each of its workloads again (same requests, same seed) named NAME-again."""
    return plan + [dict(e, name=f"{e['name']}-again") for e in plan if e["kind"] != "grid"]


def eager_steps_of(runs: list[Path]) -> dict:
    """The token counts of the steps on no CUDA graph (more tokens than the engine's largest
    graph, its meta.json's ``engine_core.cudagraph_capture_sizes``) that these workload folders'
    steps.csv hold, each once, sorted: what a keys warm-up limited to them (harness.py
    --warmup-eager-keys-of) compiles, so that a replay of the same plan meets few keys of its own.
    A folder without steps.csv, or whose engine has no meta.json, is an error (a typo would warm
    nothing: ValueError)."""
    counts, source = set(), []
    for run in runs:
        meta_path = run.parent / "meta.json"
        if not (run / "steps.csv").is_file() or not meta_path.is_file():
            raise ValueError(f"--eager-steps-of {run}: no steps.csv in it or no meta.json beside it")
        meta = json.loads(meta_path.read_text())
        graph = max(meta.get("engine_core", {}).get("cudagraph_capture_sizes") or [0])
        with open(run / "steps.csv") as f:
            counts |= {n for n in (int(r["num_scheduled_tokens"]) for r in csv.DictReader(f)) if n > graph}
        source.append(f"{run.parent.name}/{run.name}")
    return {"eager_steps": sorted(counts), "source": source}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", choices=sorted(GRID) + ["idle", "hot", "burst", "wave", "start"])
    p.add_argument("--traces", type=Path)
    p.add_argument("--trace-s", type=float, default=40.0)
    p.add_argument("--max-model-len", type=int, default=10240)
    p.add_argument("--mooncake", action="store_true")
    p.add_argument("--only", help="comma-separated workload names to keep")
    p.add_argument("--idle-gaps", default=",".join(map(str, IDLE_GAPS_S)),
                   help="--size idle: seconds between lone prompts, drawn in turn (more than the longest prefill)")
    p.add_argument("--again", action="store_true",
                   help="serve every workload a second time, as NAME-again, in the same engine: what a "
                        "kernel compiled on its first use (vLLM's 'Triton kernel JIT compilation during "
                        "inference') costs shows as the difference")
    p.add_argument("--rounds", type=int, help="closed loops of this many requests a client (n = ROUNDS x C), "
                                              "named cl-ISL-OSL-cC-nN (in_rounds)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--eager-steps-of", nargs="+", type=Path, metavar="RUN",
                   help="instead of a plan: the token counts of the steps on no CUDA graph that these runs "
                        "(an engine's workload folders, bench/results/...) served, as the list harness.py "
                        "--warmup-eager-keys-of serves, one lone prompt each (eager_steps_of)")
    a = p.parse_args()
    if a.eager_steps_of:
        try:
            steps = eager_steps_of(a.eager_steps_of)
        except ValueError as err:
            p.error(str(err))
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(steps))
        print(f"{a.out}: {len(steps['eager_steps'])} eager step sizes of {len(steps['source'])} runs")
        return
    if a.size is None:
        p.error("--size is required (or --eager-steps-of)")
    plan = build_plan(a.size, a.traces, a.trace_s, a.max_model_len, a.mooncake,
                      tuple(float(g) for g in a.idle_gaps.split(",")))
    if a.only:
        keep = set(a.only.split(","))
        plan = [e for e in plan if e["name"] in keep]
    if a.rounds:
        plan = in_rounds(plan, a.rounds)
    if a.again:
        plan = served_again(plan)
    a.out.parent.mkdir(parents=True, exist_ok=True)      # .vllm_plans/ in a fresh checkout
    a.out.write_text(json.dumps(plan))
    print(f"{a.out}: {len(plan)} workloads, "
          f"{sum(len(e.get('requests', [])) or e.get('n', 0) for e in plan)} requests")


if __name__ == "__main__":
    main()
