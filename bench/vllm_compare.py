"""kvsim's clock against real vLLM on a GPU: the closed-loop runs of bench/results/vllm_h200/ (or _h100/).

    python bench/vllm_compare.py [--gpu H200|H100] [--engines llama8b-bf16 ...] [--clocks roofline,table]
                                 [--traces] [--csv out.csv]

For every closed-loop point a real-vLLM run measured (``cl-ISL-OSL-cC``: ``vllm bench serve
--max-concurrency C`` style, bench/vllm_gpu/harness.py), kvsim replays the same workload
(``random:isl=ISL,osl=OSL,n=N,concurrency=C``) on the engine vLLM resolved (its num_gpu_blocks,
max_num_seqs, max_num_batched_tokens, block size, async scheduling; the model's config.json from
bench/vllm_gpu/configs/) and computes vllm bench serve's figures for both sides
(simulator.serve_metrics's formulas): mean TTFT, median TPOT, mean E2E. Clocks: ``default``
(kvsim's default: the shipped real-vLLM table that fits the engine, else the roofline),
``roofline`` (planner.roofline as kvsim's default runs it: the datasheet's bandwidth, real
vLLM's measured FLOP/s share for the weights), ``datasheet`` (the roofline at the datasheet's
peaks, ``--flops-efficiency 1``), ``carried-h100`` / ``carried-h200`` (the
engine's table of the other GPU carried to this one: the default clock's rule for a GPU without a
table, planner.engine_setup.carried), ``table`` (the shipped H200 cost
table of kvsim's executor, Llama-3.1-8B bf16 only), ``vllm-grid`` (the engine's own table from
real vLLM's steps of its ``grid`` workload, tables/vllm/ENGINE_GPU.csv, bench/vllm_gpu/grid_table.py)
and ``vllm-fine`` (the same from the engine's ``fine`` grid run, ENGINE-fine_GPU.csv, where one was
made). Each GPU's runs are priced with that GPU's preset and tables. Nothing here is fitted to these
runs. An engine's idle-plan run (``ENGINE-idle``: C = 1 closed loops of 8 requests), burst-plan
run (``ENGINE-burst``: closed loops ``burst-ISL-xC`` whose C prompts go out together) and wave-plan
run (``ENGINE-wave``: ``wave-ISL-xC-oOSL``, the same waves after decode phases of OSL tokens) are
priced with the engine's settings and tables.
"""
from __future__ import annotations

import argparse
import copy
import csv
import gzip
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "vllm_h200"
# --gpu -> (the runs' folder, kvsim's GPU preset)
GPUS = {"H200": (RESULTS, "H200"), "H100": (ROOT / "bench" / "results" / "vllm_h100", "H100")}
CONFIGS = ROOT / "bench" / "vllm_gpu" / "configs"
TABLE = ROOT / "tables" / "Llama-3.1-8B_H200.csv"
# each engine's table from real vLLM's own grid steps (bench/vllm_gpu/grid_table.py): fitted on
# the grid workload alone, the closed-loop and trace runs held out
GRID_TABLES = ROOT / "tables" / "vllm"
# engine -> (config folder, weight dtype, kv dtype) as bench/vllm_gpu/device_run.sh served it
ENGINES = {
    "llama8b-bf16": ("Llama-3.1-8B", "auto", "auto"),
    "llama8b-fp8": ("Llama-3.1-8B", "fp8", "fp8"),
    "qwen3-30b-a3b": ("Qwen3-30B-A3B", "auto", "auto"),
    "gpt-oss-20b": ("gpt-oss-20b", "auto", "auto"),
    "qwen3-32b": ("Qwen3-32B", "auto", "auto"),
    "llama70b-fp8": ("Llama-3.1-70B", "fp8", "fp8"),
    "gpt-oss-120b": ("gpt-oss-120b", "auto", "auto"),
}


# the runs beside an engine's own, by their folder's suffix: its idle-, burst- and wave-plan runs (the
# wave plan also with async scheduling off), its workloads served twice (plans.py --again,
# without or with a warm-up, or timing each Triton compile: -jit, then in a second engine that
# finds them in Triton's disk cache: -cached) and its held-out closed loops served again in a
# fresh engine (plans.py --rounds: -rerun, and -rerun2, -rerun3 for more engines; -keys2, -cached2
# likewise; -keysof: after a warm-up over the eager steps earlier runs of the plan met, -keysof2
# the same in a second engine); a longer suffix before the one it ends with
RUN_KINDS = ("-idle", "-twice", "-warm", "-keysof2", "-keysof", "-keys2", "-keys", "-burst", "-noasync-wave", "-wave", "-noasync", "-rerun2",
             "-rerun3", "-rerun", "-jit", "-cached2", "-cached")


def base_engine(engine: str) -> str:
    """The engine an idle-, burst- or wave-plan run or a twice-served one served (``llama8b-fp8-idle``,
    ``gpt-oss-20b-twice``: llama8b-fp8's and gpt-oss-20b's settings and tables)."""
    return next((engine.removesuffix(k) for k in RUN_KINDS if engine.endswith(k)), engine)


AGAIN = "-again"
# the closed-loop points' names: plans.py's cl-ISL-OSL-cC (and the idle plan's -nN), the burst
# plan's burst-ISL-xC (C prompts sent together, OSL 2), the wave plan's wave-ISL-xC-oOSL (its
# warm-up, a fresh engine's first steps, is not compared)
CLOSED_LOOPS = ("cl-", "burst-", "wave-")
WARMUP = "wave-warmup"


def point_key(name: str) -> tuple:
    """Closed-loop points in order of ISL, OSL, C (and n), each workload's second serving
    (plans.py --again: NAME-again) after every first one."""
    again = name.endswith(AGAIN)
    return again, [int(x.lstrip("cnxo")) for x in name.removesuffix(AGAIN).split("-")[1:]]


def serving(point: str) -> str:
    """'again' for a workload served a second time in its engine (kernels compiled on first use
    are compiled by then), '' for a first serving."""
    return "again" if point.endswith(AGAIN) else ""


# a stall: a step of STALL_S or more that took STALL_RATIO times its price or more (gpt-oss's
# first-use Triton compiles: 0.6-2.4 s a step; Llama-3.1-70B fp8's 8,192-token prefills take 1 s,
# at their price)
STALL_S, STALL_RATIO = 0.4, 3.0


def stall_free(folder: Path, cost) -> set[int]:
    """The requests of a measured closed loop (their index) whose time to first token overlaps no
    stall (a step of STALL_S or more, STALL_RATIO x its price under ``cost`` or more):
    ``--stall-free``, kvsim's clock apart from first-use compiles, which it does not model (a stall
    delays the requests waiting on it, and through them the rest of the loop)."""
    from dataclasses import fields

    from kvsim.simulator.cost import StepBatch

    names = [f.name for f in fields(StepBatch)]
    stalls = []
    with open(folder / "steps.csv") as f:
        for r in csv.DictReader(f):
            step = float(r["step_s"])
            if step >= STALL_S and step >= STALL_RATIO * cost.step_time_s(
                    StepBatch(**{k: int(r.get(k) or 0) for k in names})):
                stalls.append((float(r["t_done_s"]) - step, float(r["t_done_s"])))
    keep = set()
    with gzip.open(folder / "requests.jsonl.gz", "rt") as f:
        for line in f:
            r = json.loads(line)
            if not any(a < r["first_token_s"] and b > r["sent_s"] for a, b in stalls):
                keep.add(int(r["request_id"].rsplit("-", 1)[1]))
    return keep


def measured(folder: Path, keep: set[int] | None = None) -> dict:
    """vllm bench serve's figures of one measured run (TTFT and E2E from the send); ``keep``: of
    these requests only (by index)."""
    ttft, tpot, e2e = [], [], []
    with gzip.open(folder / "requests.jsonl.gz", "rt") as f:
        for line in f:
            r = json.loads(line)
            if keep is not None and int(r["request_id"].rsplit("-", 1)[1]) not in keep:
                continue
            t, lat = r["first_token_s"] - r["sent_s"], r["finish_s"] - r["sent_s"]
            ttft.append(t)
            e2e.append(lat)
            if r["output_tokens"] > 1:
                tpot.append((lat - t) / (r["output_tokens"] - 1))
    return {"mean_ttft_ms": 1000 * np.mean(ttft), "median_tpot_ms": 1000 * np.median(tpot or [0]),
            "mean_e2el_ms": 1000 * np.mean(e2e), "completed": len(e2e)}


def engine_core(meta: dict, engine: str, gpu: str) -> dict:
    """The engine core's settings as the run's probe logged them; for a run from before the probe
    logged them (the H200's llama8b-bf16-noasync: an empty ``engine_core``), its base engine's on
    the same GPU with this run's own pool (vLLM's logged KV cache tokens over the block size) and
    scheduling mode (its engine arguments)."""
    core = meta.get("engine_core") or {}
    if "num_gpu_blocks" in core:
        return core
    base = json.loads((GPUS[gpu][0] / base_engine(engine) / "meta.json").read_text())["engine_core"]
    return {**base, "num_gpu_blocks": meta["startup"]["gpu_kv_cache_tokens"] // base["block_size"],
            "async_scheduling": meta["engine_args"]["async_scheduling"]}


def trace_requests(folder: Path) -> list:
    """A trace excerpt's requests as vLLM was sent them (arrival, prompt and output tokens from
    the measured records; the harness's prompts share nothing), for an open-loop replay."""
    from kvsim.workloads import Request

    with gzip.open(folder / "requests.jsonl.gz", "rt") as f:
        recs = sorted((json.loads(line) for line in f), key=lambda r: r["arrival_s"])
    return [Request(i, r["arrival_s"], r["prompt_tokens"], r["output_tokens"]) for i, r in enumerate(recs)]


def simulated(engine: str, spec: dict, meta: dict, clock: str, requests: list | None = None,
              gpu: str = "H200", seeds: int = 1, keep: set[int] | None = None,
              ran: list[int] | None = None, compiled: list[set] | None = None, **extra) -> dict:
    """kvsim's metrics of one point under one clock: with ``seeds`` > 1 the mean of each over the
    engine seeds 0 .. seeds - 1 (a measured table splits a burst at an idle engine by a seeded
    draw, so a closed loop's start is a draw; the workload stays the same); ``keep``: over these
    requests only (by index; the whole loop is simulated). ``ran``, ``compiled``: first-use
    compiles priced, the engine starting with the keys of these token counts and, per seed, these
    keys (kvsim's own replays of the engine's earlier workloads); ``compiled`` is updated with what
    each seed's replay compiled. ``extra``: more of build_engine's settings."""
    runs = [_simulated(engine, spec, meta, clock, requests, gpu, seed, keep, ran,
                       compiled[seed] if compiled is not None else None, **extra) for seed in range(seeds)]
    return {k: (float(np.mean([r[k] for r in runs])) if k != "completed" else runs[0][k]) for k in runs[0]}


def engine_order(folder: Path) -> list[str]:
    """An engine's workloads in the order it served them (meta.json's start times)."""
    meta = json.loads((folder / "meta.json").read_text())
    return [name for name, _ in sorted(meta["workloads"].items(), key=lambda kv: kv[1]["t0_monotonic"])]


def own_launch_s(folder: Path) -> float | None:
    """An engine's own launch of a step on no CUDA graph (``--own-launch``): the median over its
    workloads of grid_table.eager_launch_gaps (the gap between such a step's scheduling and the
    next step's); None for a run from before the probe recorded ``t_sched_s``."""
    from kvsim.cli.profile_vllm import bench_module

    gaps_of = bench_module("grid_table").run_launch_gaps
    meta = json.loads((folder / "meta.json").read_text())
    graph = max(meta.get("engine_core", {}).get("cudagraph_capture_sizes") or [512])
    gaps = []
    for name in engine_order(folder):
        if (folder / name / "steps.csv").exists():
            more = gaps_of(folder / name, graph)
            if more is None:
                return None
            gaps += more
    return float(np.median(gaps)) if gaps else None


def ran_before(folder: Path, replayed: set[str] = frozenset()) -> list[int]:
    """The token counts of every step its engine ran before this workload (the harness's warm-up,
    meta.json's ``warmup_steps`` where the run recorded them, then the earlier workloads'
    steps.csv, meta.json's order): what the engine had compiled by then (simulator.first_use);
    ``replayed``: leave out these workloads (kvsim replayed them: its own keys stand in)."""
    order = engine_order(folder.parent)
    out = list(json.loads((folder.parent / "meta.json").read_text()).get("warmup_steps", []))
    for name in order[:order.index(folder.name)]:
        if name not in replayed and (folder.parent / name / "steps.csv").exists():
            with open(folder.parent / name / "steps.csv") as f:
                out += [int(r["num_scheduled_tokens"]) for r in csv.DictReader(f)]
    return out


def _simulated(engine: str, spec: dict, meta: dict, clock: str, requests: list | None, gpu: str,
               seed: int, keep: set[int] | None = None, ran: list[int] | None = None,
               compiled: set | None = None, **extra) -> dict:
    from kvsim import workloads
    from kvsim.simulator.engine import Simulation
    from kvsim.simulator.serve_metrics import serve_metrics

    setup = None
    if ran is not None:   # --first-use-compiles where the clock prices them (kvsim --first-use-compiles)
        from kvsim.errors import InputError
        from kvsim.simulator.first_use import FirstUseCompiles

        try:
            fresh = engine_setup(engine, meta, clock, gpu, first_use_compiles=True, **extra)
        except InputError:
            pass                # another model's table, or the roofline: none priced
        else:                   # the engine as it was, with what its earlier workloads compiled
            cost = copy.copy(fresh.cost)
            before = cost.first_use_compiles.having_run(ran)
            cost.first_use_compiles = FirstUseCompiles(before.rules, before.compiled | (compiled or set()))
            setup = replace(fresh, cost=cost)
    if setup is None:
        setup = engine_setup(engine, meta, clock, gpu, **extra)
    if requests is None:   # a closed-loop point
        text = (f"random:isl={spec['isl']},osl={spec['osl']},n={spec['n']},concurrency={spec['concurrency']},"
                f"seed={spec['seed']}")
        w = workloads.workload_from_spec(text)
        limit = w.max_concurrency
    else:                  # a trace excerpt at its arrival times
        w, limit = requests, None
    sim = Simulation(iter(w), setup.config, setup.cost, max_concurrency=limit, record_token_times=True, seed=seed)
    res = sim.run()
    if compiled is not None:     # what this replay's engine compiled, for the next workload's
        compiled.update(*(rep.compiled or () for rep in sim.replicas))
    if keep is not None:
        res.requests = res.requests[res.requests["request_id"].isin(keep)]
    m = serve_metrics(res.requests, res.token_times, percentiles=[50])
    return {"mean_ttft_ms": m["mean_ttft_ms"], "median_tpot_ms": _median_tpot(res.requests),
            "mean_e2el_ms": m["mean_e2el_ms"], "completed": m["completed"]}


def engine_setup(engine: str, meta: dict, clock: str, gpu: str, **extra):
    """build_engine's setup of a measured engine (its settings as the run logged them) under
    ``clock`` (``extra``: more of build_engine's settings)."""
    from kvsim.planner.engine_setup import build_engine
    from kvsim.planner.presets import load_hf_config

    config, weight_dtype, kv_dtype = ENGINES[base_engine(engine)]
    core = engine_core(meta, engine, gpu)
    kwargs = dict(model=load_hf_config(str(CONFIGS / config / "config.json"), name=config), gpu=GPUS[gpu][1],
                  weight_dtype=weight_dtype, kv_cache_dtype=kv_dtype,
                  num_gpu_blocks=core["num_gpu_blocks"], block_size=core["block_size"],
                  max_model_len=meta["engine_args"]["max_model_len"], max_num_seqs=core["max_num_seqs"],
                  max_num_batched_tokens=core["max_num_batched_tokens"],
                  cost_table=clock_table(engine, clock, gpu), **extra)
    if clock == "datasheet":
        kwargs["flops_efficiency"] = 1.0
    setup = build_engine(async_scheduling=core["async_scheduling"], **kwargs)
    if clock.startswith("carried-"):     # the engine's table of another GPU, carried by the rooflines' ratio
        setup = carried_setup(setup, engine, clock.removeprefix("carried-").upper())
    return setup


def carried_setup(setup, engine: str, source_gpu: str):
    """``setup`` with its clock replaced by the engine's table measured on ``source_gpu`` carried to
    this run's GPU (planner.engine_setup.carried, the default clock's rule for an unmeasured GPU)."""
    from dataclasses import replace

    from kvsim.planner.engine_setup import carried
    from kvsim.planner.presets import get_gpu
    from kvsim.simulator.cost_table import load_cost_table

    table = grid_table(engine, "vllm-fine", source_gpu)
    table = table if table.exists() else grid_table(engine, "vllm-grid", source_gpu)
    kv = ENGINES[base_engine(engine)][2]
    source = get_gpu(source_gpu.lower())
    clock = {**setup.clock, "clock": "table", "table": table.name, "measured_on": source.name} \
        if setup.clock is not None else None
    return replace(setup, cost=carried(load_cost_table(table), setup.model, source, setup.gpu, kv_dtype=kv),
                   clock=clock)


# a clock from any table (``file:tables/mine.csv``: one a user made with kvsim profile --engine vllm)
FILE_CLOCK = "file:"


def clock_table(engine: str, clock: str, gpu: str) -> str | None:
    """build_engine's cost_table for a clock: the roofline by name, kvsim's default (None: the
    shipped real-vLLM table that fits the engine, else the roofline), or a table."""
    if clock.startswith("carried-"):
        return "roofline"       # replaced by the carried table (carried())
    if clock in ("roofline", "datasheet", "default"):
        return None if clock == "default" else "roofline"
    if clock.startswith(FILE_CLOCK):
        return clock.removeprefix(FILE_CLOCK)
    return str(TABLE) if clock == "table" else str(grid_table(engine, clock, gpu))


def grid_table(engine: str, clock: str, gpu: str) -> Path | None:
    """The engine's table of real vLLM's steps for ``vllm-grid`` / ``vllm-fine`` (None: another
    clock)."""
    suffix = {"vllm-grid": "", "vllm-fine": "-fine"}.get(clock)
    return None if suffix is None else GRID_TABLES / f"{base_engine(engine)}{suffix}_{gpu}.csv"


def fitted_points() -> set[str]:
    """The real-vLLM workloads (folders relative to the repository) that a shipped table's
    ``# async off:`` line was fitted on (grid_table.py's ASYNC_OFF_FIT_POINTS of an engine's
    async-off run): the summary leaves them out, as not held out."""
    out = set()
    for table in GRID_TABLES.glob("*.csv"):
        with open(table) as f:
            for line in f:
                if not line.startswith("#"):
                    break
                if line.startswith("# async off:"):
                    out.update(w.rstrip(",") for w in line.split() if w.startswith("bench/results/"))
    return out


def _median_tpot(requests) -> float:
    ok = requests[(~requests["rejected"]) & (requests["num_output"] > 1)]
    return 1000 * float(np.median(ok["tpot_s"])) if len(ok) else 0.0


METRICS = ("mean_ttft_ms", "median_tpot_ms", "mean_e2el_ms")


def engine_figures(rows: list[dict], engine: str | tuple, clock: str, again: str | None = "") -> dict | None:
    """An engine's figures under ``clock`` over its held-out closed loops (its first serving, or
    ``again``: its second, None: both; the points a table was fitted on left out; ``engine`` a tuple:
    over the loops of these engines together): the median |error| of the median TPOT, the mean
    |error| of the mean TTFT and of the mean E2E, the mean signed E2E error, in per cent, and the
    number of points; None where it has none."""
    engines = engine if isinstance(engine, tuple) else (engine,)
    mine = [r for r in rows if r["engine"] in engines and r["point"].startswith(CLOSED_LOOPS)
            and (again is None or serving(r["point"]) == again) and not r["fitted"]]
    if not mine or f"{clock}_mean_ttft_ms_err" not in mine[0]:
        return None
    return {"points": len(mine),
            "tpot_pct": 100 * float(np.median([abs(r[f"{clock}_median_tpot_ms_err"]) for r in mine])),
            "ttft_pct": 100 * float(np.mean([abs(r[f"{clock}_mean_ttft_ms_err"]) for r in mine])),
            "e2e_pct": 100 * float(np.mean([abs(r[f"{clock}_mean_e2el_ms_err"]) for r in mine])),
            "e2e_signed_pct": 100 * float(np.mean([r[f"{clock}_mean_e2el_ms_err"] for r in mine]))}


# the engines whose figures a user's clock line gives (planner.held_out): each model's own runs as
# served, with async scheduling on or off; the other run kinds (idle, burst, wave plans, fresh
# engines served again) are diagnoses
HELD_OUT_KINDS = ("", "-noasync")
# engines that had compiled every kernel their loops meet before serving them (a keys warm-up, or
# Triton's disk cache of an earlier engine on the machine): with --compile-free, their loops (both
# servings) give their model's rows the figures of a warmed server's, kvsim's default clock's own
# premise (gpt-oss's fresh engines compile Triton kernels inside the measured loops)
COMPILE_FREE_KINDS = ("-keysof", "-keysof2", "-keys2", "-cached2")
COMPILE_FREE_NOTE = ("with --compile-free: the same figures over the loops (both servings) of engines that had compiled "
                     "every kernel before them (" + ", ".join(COMPILE_FREE_KINDS) + " runs)")


def _written_row(path: Path, rows: list[dict], gpu: str, engine: str, key: dict, clock: str, what: str,
                 flag: str) -> dict:
    """The row of held_out's file ``path`` (its ``rows``) of ``engine`` on ``gpu`` under the clock
    ``key`` (EngineSetup.clock; ``clock``, as --clocks named it), to add ``flag``'s ``what`` figures
    to; exits naming the command to run first where there is none."""
    from kvsim.planner.held_out import KEY_FIELDS

    old = next((r for r in rows if r["vllm_gpu"] == gpu and r["engine"] == engine
                and all(r[k] == key[k] for k in KEY_FIELDS)), None)
    if old is None:
        raise SystemExit(f"{path}: no row of {engine} on the {gpu} under its {clock} clock to add the "
                         f"{what} figures to: write the whole loops' first (without {flag})")
    return old


def write_compile_free(path: Path, rows: list[dict], engines: list[str], clocks: list[str], gpu: str) -> None:
    """Add to planner.held_out's file ``path`` the figures over the loops of ``gpu``'s
    COMPILE_FREE_KINDS engines (both servings, every such engine of a model together) under each
    clock, as ``compile_free`` (with their runs) of the row of the same clock (EngineSetup.clock)
    of their model's engine; a clock with no such row is an error (write the whole loops' first)."""
    from kvsim.planner.held_out import FIGURES, KEY_FIELDS

    doc = json.loads(path.read_text())
    by_base: dict[str, list[str]] = {}
    for engine in engines:
        if engine.removeprefix(base_engine(engine)) in COMPILE_FREE_KINDS:
            by_base.setdefault(base_engine(engine), []).append(engine)
    for row in doc["rows"]:
        if row["vllm_gpu"] == gpu and row["engine"] in by_base:
            row.pop("compile_free", None)
    added = 0
    for base, mine in sorted(by_base.items()):
        # the runs in COMPILE_FREE_KINDS' order, whatever order --engines named them in
        mine.sort(key=lambda e: COMPILE_FREE_KINDS.index(e.removeprefix(base)))
        meta = json.loads((GPUS[gpu][0] / mine[0] / "meta.json").read_text())
        for clock in clocks:
            fig = engine_figures(rows, tuple(mine), clock, again=None)
            key = engine_setup(mine[0], meta, clock, gpu).clock if fig is not None else None
            if key is None:
                continue
            old = _written_row(path, doc.get("rows", []), gpu, base, key, clock, "compile-free", "--compile-free")
            old["compile_free"] = {**{k: round(fig[k], 1) if isinstance(fig[k], float) else fig[k]
                                      for k in ("points", *FIGURES)},
                                   "runs": [str((GPUS[gpu][0] / e).relative_to(ROOT)) for e in mine]}
            added += 1
    doc["compile_free"] = COMPILE_FREE_NOTE
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"added the compile-free figures of {added} clocks of the {gpu} runs to {path}")


def write_held_out(path: Path, rows: list[dict], engines: list[str], clocks: list[str], gpu: str,
                   stall_free: bool = False, first_use: bool = False) -> None:
    """Write the figures of ``gpu``'s runs into planner.held_out's file ``path``: per engine of
    HELD_OUT_KINDS and clock that kvsim runs as it was measured (EngineSetup.clock: the default
    clock, the roofline, a shipped table, one carried from the other GPU; not the datasheet's
    peaks nor a file of the user's), keyed by that clock. The rows of the other GPU's runs are kept;
    two clocks that are one (the default and the table it takes) give one row. ``stall_free``
    (rows of --stall-free): the figures over the requests no stall delayed go into the rows
    already written, as their ``stall_free`` where they differ from the whole loops'. ``first_use``
    (rows of --first-use-compiles): the clocks that price a fresh engine's compiles (real vLLM's
    tables; not the roofline nor a carried table), rows of their own beside the others."""
    from kvsim.planner.held_out import FIGURES, KEY_FIELDS

    doc = json.loads(path.read_text()) if path.is_file() else {}
    mine, seen = [], set()
    for engine in engines:
        if engine.removeprefix(base_engine(engine)) not in HELD_OUT_KINDS:
            continue
        meta = json.loads((GPUS[gpu][0] / engine / "meta.json").read_text())
        for clock in clocks:
            fig = engine_figures(rows, engine, clock)
            if fig is None or (first_use and (clock.startswith("carried-") or clock_table(engine, clock, gpu)
                                              == "roofline")):
                continue    # the roofline and a carried table price no compiles
            key = engine_setup(engine, meta, clock, gpu, **({"first_use_compiles": True} if first_use else {})).clock
            if key is not None and clock.startswith("carried-") and not key["async_scheduling"]:
                continue    # carried without the async-off line no table of the other GPU has: not kvsim's clock
            if key is None or tuple(key[k] for k in KEY_FIELDS) in seen:
                continue
            seen.add(tuple(key[k] for k in KEY_FIELDS))
            trace = next((r for r in rows if r["engine"] == engine and r["point"] == "azure-conv"
                          and f"{clock}_mean_ttft_ms_err" in r), None)
            mine.append({**key, "engine": engine, "vllm_gpu": gpu,
                         "runs": str((GPUS[gpu][0] / engine).relative_to(ROOT)),
                         **{k: round(v, 1) if isinstance(v, float) else v for k, v in fig.items()},
                         # --traces: the Azure excerpt at its arrival times, signed errors
                         **({"azure_conv": {f"{m}_pct": round(100 * trace[f"{clock}_{k}_err"], 1)
                                            for m, k in (("ttft", "mean_ttft_ms"), ("tpot", "median_tpot_ms"),
                                                         ("e2e", "mean_e2el_ms"))}} if trace else {})})
    if stall_free:
        rows_out = doc.get("rows", [])
        for new in mine:
            old = _written_row(path, rows_out, gpu, new["engine"], new, new["clock"], "stall-free", "--stall-free")
            figures = {k: new[k] for k in ("points", *FIGURES)}
            old.pop("stall_free", None)
            if figures != {k: old[k] for k in figures}:
                old["stall_free"] = figures
        doc["stall_free"] = ("with --stall-free: the same figures over the requests whose time to first token "
                             "overlaps no first-use compile stall, where they differ")
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"added the stall-free figures of {len(mine)} clocks of the {gpu} runs to {path}")
        return
    kept = [r for r in doc.get("rows", []) if r["vllm_gpu"] != gpu or r["first_use_compiles"] != first_use]
    doc = {"against": "real vLLM 0.23.0 (bench/results/vllm_h100/, vllm_h200/)",
           "figures": "over each engine's held-out closed loops: the median |error| of the median TPOT, the mean "
                      "|error| of the mean TTFT and of the mean E2E, in per cent (vllm bench serve's figures)",
           "azure_conv": "with --traces: the Azure conversation trace's first 40 s at its arrival times, the signed "
                         "error of the mean TTFT, the median TPOT and the mean E2E, in per cent",
           "stall_free": "with --stall-free: the same figures over the requests whose time to first token overlaps "
                         "no first-use compile stall, where they differ",
           "compile_free": COMPILE_FREE_NOTE,
           "first_use_compiles": "rows of --first-use-compiles --seeds 5: kvsim --first-use-compiles, a fresh "
                                 "engine's compiles priced, each workload replayed from the keys its engine had run",
           "command": "python bench/vllm_compare.py --gpu H100 --clocks default,roofline,carried-h200 --traces "
                      "--held-out-json tables/vllm/held_out.json, then the same with --stall-free instead of "
                      "--traces, then --clocks default --first-use-compiles --seeds 5 --traces; all three again "
                      "with --gpu H200 and carried-h100; then, for each GPU, the first with --compile-free in "
                      "place of --traces",
           "rows": sorted(kept + mine, key=lambda r: (r["vllm_gpu"], r["engine"], r["first_use_compiles"],
                                                      r["clock"], r["table"] or ""))}
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(mine)} clocks of the {gpu} runs to {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", choices=sorted(GPUS), default="H200", help="whose runs (default H200)")
    ap.add_argument("--engines", nargs="*", help="default: every engine measured on --gpu")
    ap.add_argument("--clocks", default="roofline,table",
                    help="comma-separated: default, roofline, datasheet, table, vllm-grid, vllm-fine, "
                         "carried-h100, carried-h200, or file:PATH (a cost table of your own, such as "
                         "kvsim profile --engine vllm writes; its model and GPU must match the engine's)")
    ap.add_argument("--csv", help="write every point's figures here")
    ap.add_argument("--held-out-json", metavar="PATH",
                    help="write each engine's figures per clock into this file (planner.held_out's: "
                         "tables/vllm/held_out.json, the figures every clock line ends with), this GPU's rows "
                         "replaced; without --engines, each model's own runs (async scheduling on and off)")
    ap.add_argument("--traces", action="store_true",
                    help="also the Azure trace excerpt of each engine, at its arrival times (held out); the "
                         "summary then lists it on its own")
    ap.add_argument("--stall-free", action="store_true",
                    help=f"each closed loop's figures over the requests whose time to first token overlaps no "
                         f"stall (a step of {STALL_S} s or more at {STALL_RATIO:g}x its default-clock price or "
                         "more: first-use compiles, which kvsim does not model), on both sides; the loop itself "
                         "is replayed whole")
    ap.add_argument("--compile-free", action="store_true",
                    help="with --held-out-json: the engines that had compiled every kernel before their loops "
                         f"({', '.join(COMPILE_FREE_KINDS)} runs), their figures added to their model's rows as "
                         "compile_free (without --engines, every such engine of the GPU)")
    ap.add_argument("--first-use-compiles", action="store_true",
                    help="each replay pays the first-use compiles its clock prices (kvsim --first-use-compiles: "
                         "real vLLM's table), in the engine's order, its engine starting with what kvsim's replays "
                         "of the earlier workloads compiled and the keys of the measured steps of those it does "
                         "not replay (the grid)")
    ap.add_argument("--own-launch", action="store_true",
                    help="a diagnostic, not held out: each engine's eager steps priced at least at that engine's own "
                         "launch (own_launch_s: measured on the run itself; kvsim --eager-launch-ms), where its "
                         "steps.csv has t_sched_s")
    ap.add_argument("--seeds", type=int, default=1,
                    help="kvsim's figures as the mean over engine seeds 0 .. N-1 (a burst at an idle engine is "
                         "split by a seeded draw; default 1: seed 0)")
    a = ap.parse_args(argv)
    if a.seeds < 1:
        ap.error(f"--seeds must be >= 1, got {a.seeds}")
    clocks = [c for c in a.clocks.split(",") if c]
    for clock in clocks:
        if clock.startswith(FILE_CLOCK) and not Path(clock.removeprefix(FILE_CLOCK)).is_file():
            ap.error(f"--clocks {clock}: no such file")
    results = GPUS[a.gpu][0]
    if a.compile_free and (not a.held_out_json or a.stall_free or a.first_use_compiles):
        ap.error("--compile-free adds to --held-out-json's rows, without --stall-free or --first-use-compiles")
    # --held-out-json: the engines it writes
    kinds = (COMPILE_FREE_KINDS if a.compile_free else HELD_OUT_KINDS) if a.held_out_json else RUN_KINDS
    # --compile-free: only the compile-free runs (their model's own rows are written already)
    a.engines = a.engines or [e for b in ENGINES for e in ([] if a.compile_free else [b]) + [b + k for k in kinds if k]
                              if (results / e / "meta.json").exists()
                              and json.loads((results / e / "meta.json").read_text())["workloads"]]
    rows, fitted = [], fitted_points()
    for engine in a.engines:
        folder = results / engine
        meta = json.loads((folder / "meta.json").read_text())
        # --stall-free: a stall is priced against the engine's default clock (one setup an engine)
        stall_cost = engine_setup(engine, meta, "default", a.gpu).cost if a.stall_free else None
        launch = own_launch_s(folder) if a.own_launch else None
        extra = {"eager_launch_s": launch} if launch is not None else {}
        if a.own_launch:
            print(f"{engine}: own eager launch " + (f"{1e3 * launch:.1f} ms" if launch is not None else
                                                     "not measured (no t_sched_s): none applied"))
        points = sorted((p for pattern in CLOSED_LOOPS for p in folder.glob(pattern + "*")
                         if p.name != WARMUP), key=lambda p: point_key(p.name))
        if a.traces:
            points += [folder / t for t in ("azure-conv", "azure-conv" + AGAIN) if (folder / t).is_dir()]
        # --first-use-compiles: the workloads in the engine's order, each replay's engine starting
        # with what kvsim's replays of the earlier ones compiled (per clock and seed), and the
        # measured token counts of those kvsim does not replay (the grid)
        replayed, chains = set(), {}
        if a.first_use_compiles:
            order = engine_order(folder)
            points.sort(key=lambda p: order.index(p.name))
        for point in points:
            spec = json.loads((point / "workload.json").read_text())
            reqs = trace_requests(point) if spec["kind"] == "trace" else None
            keep = stall_free(point, stall_cost) \
                if a.stall_free and reqs is None else None
            if keep is not None and not keep:
                continue        # every request waited on a stall: nothing to compare
            real = measured(point, keep)
            row = {"engine": engine, "point": point.name, **{f"vllm_{k}": real[k] for k in METRICS},
                   "vllm_completed": real["completed"]}
            for clock in clocks:
                if clock == "table" and (engine != "llama8b-bf16" or a.gpu != "H200"):
                    continue
                table = grid_table(engine, clock, a.gpu)
                if table is not None and not table.exists():
                    continue
                source = clock.removeprefix("carried-").upper()
                if clock.startswith("carried-") and not any(
                        grid_table(engine, c, source).exists() for c in ("vllm-fine", "vllm-grid")):
                    continue        # no table of that GPU to carry (Llama-3.1-70B: the H200's alone)
                ran = chain = None
                if a.first_use_compiles:
                    ran = ran_before(point, replayed)
                    chain = chains.setdefault(clock, [set() for _ in range(a.seeds)])
                sim = simulated(engine, spec, meta, clock, reqs, a.gpu, a.seeds, keep, ran, chain,
                                **(extra if clock_table(engine, clock, a.gpu) != "roofline" else {}))
                assert sim["completed"] == real["completed"], (engine, point.name, clock)
                for k in METRICS:
                    row[f"{clock}_{k}"] = sim[k]
                    row[f"{clock}_{k}_err"] = (sim[k] - real[k]) / real[k]
            replayed.add(point.name)
            row["fitted"] = str(point.relative_to(ROOT)) in fitted
            rows.append(row)
            print(f"{engine:<14} {point.name:<18} " + "  ".join(
                f"{k.split('_')[1]} vllm {row[f'vllm_{k}']:8.1f}" + "".join(
                    f" {c} {100 * row[f'{c}_{k}_err']:+6.1f}%" for c in clocks if f"{c}_{k}_err" in row)
                for k in METRICS) + ("  (fitted)" if row["fitted"] else ""), flush=True)
    print("\nper engine and clock, over its closed-loop points (those a table was fitted on left out): median "
          f"|error| of median TPOT, mean |error| of mean TTFT and of mean E2E (kvsim against real vLLM 0.23.0, {a.gpu})")
    for engine, again in ((e, s) for e in a.engines for s in ("", "again")):
        label = f"{engine} {again}".strip()
        for clock in clocks:
            fig = engine_figures(rows, engine, clock, again)
            if fig is not None:
                print(f"  {label:<14} {clock:<9} TPOT {fig['tpot_pct']:5.1f} %  TTFT {fig['ttft_pct']:5.1f} %  "
                      f"E2E {fig['e2e_pct']:5.1f} % (signed {fig['e2e_signed_pct']:+.1f} %)  {fig['points']} points")
    if a.held_out_json and a.compile_free:
        write_compile_free(Path(a.held_out_json), rows, a.engines, clocks, a.gpu)
    elif a.held_out_json:
        write_held_out(Path(a.held_out_json), rows, a.engines, clocks, a.gpu, a.stall_free, a.first_use_compiles)
    if a.traces:
        print("\nthe Azure trace excerpt at its arrival times (first 40 s, open loop): error of mean TTFT, "
              "median TPOT, mean E2E")
        for r in (r for r in rows if r["point"].startswith("azure-conv")):
            print(f"  {(r['engine'] + ' ' + serving(r['point'])).strip():<14} " + "  ".join(
                f"{c} {100 * r[f'{c}_mean_ttft_ms_err']:+6.1f} / {100 * r[f'{c}_median_tpot_ms_err']:+6.1f} / "
                f"{100 * r[f'{c}_mean_e2el_ms_err']:+6.1f} %" for c in clocks if f"{c}_mean_ttft_ms_err" in r))
    if a.csv:
        import pandas as pd

        pd.DataFrame(rows).to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
