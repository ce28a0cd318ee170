"""``kvsim profile --engine vllm``: real vLLM's own steps over controlled step shapes, into a cost table.

    kvsim profile --engine vllm (--model M | --hf-config config.json) --out table.csv
        [--runs DIR] [--vllm-python PY] [--quantization fp8] [--kv-cache-dtype fp8]
        [--max-model-len 10240] [--max-num-seqs N] [--gpu-memory-utilization 0.9]
        [--grid fine|small|large] [--measure-async-off]
    kvsim profile --engine vllm --from-runs DIR --out table.csv

vLLM runs in its own Python (``--vllm-python``, default ``$KVSIM_VLLM_PYTHON``: vLLM pins its own
torch), with dummy weights from the model's config.json and token-id prompts, so nothing is
downloaded. Engines start one after another, each serving one plan of bench/vllm_gpu/plans.py
through bench/vllm_gpu/harness.py, whose probe plugin logs every step the engine core runs:

* ``NAME``: the grid (``--grid``, default ``fine``): decode batches of every CUDA-graph size,
  lone prefills of 128 to 8,192 tokens, prompts chunked beside decodes. The table's rows.
* ``NAME-idle``: lone prompts at an idle engine, served twice (the second serving is read: a
  kernel compiled on its first use is not a step's price): the ``# frontend:`` line and c_idle.
* ``NAME-hot``: lone prompts 2-3 ms after the last request, served twice: a lone prompt's own
  price, and the ``# idle wait:`` line.
* ``NAME-noasync-wave`` (``--measure-async-off``): waves of prompts and a closed loop of 64 with
  async scheduling off: the table's ``# async off:`` line, which lets a run with async scheduling
  off use the table.

The runs stay under ``--runs`` (default: beside ``--out``, ``TABLE.runs/``), laid out as
bench/results/vllm_GPU/ holds the shipped ones; ``--from-runs RUNS/NAME`` builds the table from
such a folder without a GPU (the shipped tables are what it makes of bench/results/). A run that
finished is kept and not served again when the same command runs again, also after Ctrl-C.
bench/vllm_gpu/grid_table.py fits nothing: it writes the rows, and ``--cost-table table.csv``
fits kvsim's step model to them (simulator.cost_table.StepShapeCost).
"""
from __future__ import annotations

import contextlib
import gzip
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kvsim.cli.outputs import check_output
from kvsim.cli.profile_options import settle_options
from kvsim.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
VLLM_GPU = ROOT / "bench" / "vllm_gpu"
# the plans' folder under --runs, and the model's config.json folder the engines load
PLANS, MODEL = "plans", "model"
# a model this large (all weights, or those a token reads) takes the large plans: its lone
# 4,096-token prefill outlasts the idle plan's default gaps (Qwen3-32B: 0.41 s on an H100)
LARGE_PARAMS, LARGE_ACTIVE_PARAMS = 30e9, 5e9
LARGE_IDLE_GAPS_S = (0.6, 1.2)


class EngineFailed(RuntimeError):
    """A vLLM engine stopped before it served its plan (its log says why)."""


@dataclass(frozen=True)
class Engine:
    """One engine start: its run folder's name, the plan it serves and the harness flags beside
    the common ones."""
    name: str
    plan: str
    flags: tuple[str, ...] = ()


def bench_module(name: str):
    """A script of bench/vllm_gpu/ as a module (they live beside the package, in the checkout)."""
    path = VLLM_GPU / f"{name}.py"
    if not path.is_file():
        raise InputError(f"kvsim profile --engine vllm needs the kvsim checkout's {path.relative_to(ROOT)} "
                         f"(not in an installed package)")
    spec = importlib.util.spec_from_file_location(f"kvsim_vllm_gpu_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def slug(text: str) -> str:
    """A run folder's name from a model name (``Qwen3-30B-A3B`` -> ``qwen3-30b-a3b``)."""
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "model"


def model_config(model: str | None, hf_config: str | None) -> tuple[str, Path, object]:
    """(name, config.json, kvsim's ModelSpec) of ``--model`` (a preset with a config.json bundled
    for vLLM's dummy weights) or ``--hf-config`` (any config.json vLLM can load)."""
    from kvsim.planner.presets import get_model, load_hf_config

    if hf_config is not None:
        path = Path(hf_config)
        if not path.is_file():
            raise InputError("no such file", file=hf_config)
        spec = load_hf_config(path, force=True)
        return spec.name, path, spec
    name = model or "Llama-3.1-8B"
    spec = get_model(name)
    for folder in (VLLM_GPU / "configs", ROOT / "planner" / "hf_configs"):
        path = folder / spec.name / "config.json"
        if path.is_file():
            return spec.name, path, spec
    raise InputError(f"{spec.name}: no config.json bundled for vLLM's dummy weights; give the model's "
                     f"own with --hf-config", field="model")


def is_large(spec) -> bool:
    return spec.num_params > LARGE_PARAMS and spec.active_params > LARGE_ACTIVE_PARAMS


def engines(name: str, measure_async_off: bool) -> list[Engine]:
    """The engine starts of a profile, in order (module doc)."""
    out = [Engine(name, "grid"), Engine(f"{name}-idle", "idle"), Engine(f"{name}-hot", "hot")]
    if measure_async_off:
        out.append(Engine(f"{name}-noasync-wave", "wave", ("--no-async",)))
    return out


def write_plans(folder: Path, grid: str, large: bool, max_model_len: int) -> None:
    """plans/{grid,idle,hot,wave}.json: the grid alone of its size, the idle plan's lone prompts
    and the hot plan, each served twice, and the wave plan with the closed loops the async-off
    line is fitted on beside the waves (grid_table.ASYNC_OFF_FIT_POINTS: a full batch)."""
    plans = bench_module("plans")
    fit_points = bench_module("grid_table").ASYNC_OFF_FIT_POINTS
    gaps = LARGE_IDLE_GAPS_S if large else plans.IDLE_GAPS_S
    chosen = {
        "grid": [e for e in plans.build_plan(grid, None, 0.0, max_model_len, False) if e["kind"] == "grid"],
        "idle": plans.served_again([e for e in plans.idle_points(gaps) if e["name"] == "idle-prefill"]),
        "hot": plans.served_again(plans.hot_points()),
        "wave": plans.wave_points() + [e for e in plans.closed_points("small") if e["name"] in fit_points],
    }
    folder.mkdir(parents=True, exist_ok=True)
    for plan, entries in chosen.items():
        (folder / f"{plan}.json").write_text(json.dumps(entries))


def vllm_python(given: str | None) -> str:
    """The Python that runs vLLM: ``--vllm-python``, else ``$KVSIM_VLLM_PYTHON``."""
    py = given or os.environ.get("KVSIM_VLLM_PYTHON")
    if not py:
        raise InputError("kvsim profile --engine vllm runs real vLLM in its own Python: give --vllm-python PY "
                         "(or set KVSIM_VLLM_PYTHON) with vLLM 0.23 or later installed", field="vllm_python")
    return py


def check_vllm(py: str) -> str:
    """What ``py`` says of vLLM, torch and the GPU ('vllm 0.23.0, torch 2.11.0, NVIDIA H100 80GB
    HBM3'); InputError where it has no vLLM or sees no CUDA GPU."""
    probe = ("import torch, vllm; print('vllm', vllm.__version__ + ', torch', torch.__version__ + ',', "
             "torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NO-GPU')")
    try:
        done = subprocess.run([py, "-c", probe], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise InputError(f"{py} does not run: {err}", field="vllm_python") from None
    said = done.stdout.strip().splitlines()
    if done.returncode != 0 or not said:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(f"{py} cannot import vLLM and torch ({last})", field="vllm_python")
    if said[-1].endswith("NO-GPU"):
        raise InputError(f"{py} sees no CUDA GPU: vLLM's steps are measured on one", field="vllm_python")
    return said[-1]


def harness_command(py: str, engine: Engine, runs: Path, model_dir: Path, args) -> list[str]:
    """The harness's command line for one engine start."""
    cmd = [py, str(VLLM_GPU / "harness.py"), "--model-dir", str(model_dir), "--name", engine.name,
           "--plan", str(runs / PLANS / f"{engine.plan}.json"), "--out", str(runs / engine.name),
           "--max-model-len", str(args.max_model_len),
           "--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    for flag, value in (("--quantization", args.quantization), ("--kv-cache-dtype", args.kv_cache_dtype),
                        ("--max-num-seqs", args.max_num_seqs)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd + list(engine.flags)


def harness_env() -> dict:
    """The harness's environment: its probe plugin importable, nothing fetched, vLLM's INFO log
    (the start-up figures meta.json takes from it)."""
    env = dict(os.environ)
    path = [str(VLLM_GPU), str(VLLM_GPU / "plugin")]
    env["PYTHONPATH"] = os.pathsep.join(path + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", VLLM_USE_FLASHINFER_SAMPLER="0",
               VLLM_LOGGING_LEVEL="INFO", VLLM_CONFIGURE_LOGGING="1", TOKENIZERS_PARALLELISM="false")
    return env


def finished(run: Path) -> bool:
    """Whether an engine's run folder holds a finished run (the harness writes meta.json last) that
    served some of its plan (one stopped in its warm-up has none)."""
    meta = run / "meta.json"
    return meta.is_file() and bool(json.loads(meta.read_text()).get("workloads"))


def pack(run: Path) -> None:
    """Each workload's requests.jsonl gzipped (no name or time in the header), as the shipped runs."""
    for plain in sorted(run.glob("*/requests.jsonl")):
        with open(plain, "rb") as src, open(plain.with_suffix(".jsonl.gz"), "wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as dst:
            shutil.copyfileobj(src, dst)
        plain.unlink()


def serve(py: str, engine: Engine, runs: Path, model_dir: Path, args, say) -> None:
    """Start one engine on its plan (its log in the run folder); a run cut short is finished from
    what it logged. EngineFailed where no run came of it."""
    run = runs / engine.name
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    cmd = harness_command(py, engine, runs, model_dir, args)
    log = run / "vllm.log"
    say(f"  {engine.name}: serving plans/{engine.plan}.json (log: {log})")
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=harness_env()).returncode
    if rc != 0 and (run / "meta.partial.json").is_file():
        with open(log, "a") as f:   # what it served before it stopped is kept
            subprocess.run(cmd + ["--finish-only"], stdout=f, stderr=subprocess.STDOUT, env=harness_env())
    if not finished(run):
        raise EngineFailed(f"{engine.name}: the vLLM engine stopped (exit {rc}) before it served its plan; "
                           f"see {log}")
    pack(run)


def build_table(engine_dir: Path, out: str, quiet: bool = False) -> None:
    """The cost table bench/vllm_gpu/grid_table.py makes of an engine's runs (its grid, with the
    idle, hot and async-off runs beside it where they are); ``quiet``: without its summary line."""
    if not (engine_dir / "grid" / "steps.csv").is_file():
        raise InputError("no grid run here (GRID/steps.csv): give the folder kvsim profile --engine vllm "
                         "wrote, RUNS/NAME", file=str(engine_dir))
    if not (engine_dir / "meta.json").is_file():
        raise InputError("no meta.json: the run did not finish", file=str(engine_dir))
    grid_table = bench_module("grid_table")
    with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
        rc = grid_table.main([str(engine_dir), "--out", out])
    if rc != 0:
        raise InputError("grid_table.py could not read these runs", file=str(engine_dir))


def run(args, say=None) -> int:
    """``kvsim profile --engine vllm`` (module doc); the table at ``args.out`` (``say``: where the
    progress lines go; none with ``--quiet``)."""
    if say is None:
        say = (lambda *_a, **_k: None) if args.quiet else print
    settle_options(args, "vllm")
    check_output(args.out)
    if args.from_runs is not None:
        build_table(Path(args.from_runs), args.out, args.quiet)
        return 0
    name, config, spec = model_config(args.model, args.hf_config)
    runs = Path(args.runs) if args.runs else Path(args.out).with_suffix(".runs")
    if runs.exists() and not runs.is_dir():
        raise InputError("is not a directory", file=str(runs))
    py = vllm_python(args.vllm_python)
    said = check_vllm(py)
    engine_name = slug(name) + (f"-{args.quantization}" if args.quantization else "")
    starts = engines(engine_name, args.measure_async_off)
    model_dir = runs / MODEL / name
    model_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(config, model_dir / "config.json")
    write_plans(runs / PLANS, args.grid, is_large(spec), args.max_model_len)
    say(f"kvsim profile --engine vllm: {name} on {said}; runs under {runs}")
    try:
        for engine in starts:
            if finished(runs / engine.name):
                say(f"  {engine.name}: served already, kept")
                continue
            serve(py, engine, runs, model_dir, args, say)
    except EngineFailed as err:   # not the user's input, not kvsim's fault: one line, exit 1
        print(f"kvsim: error: {err}; the finished runs stay under {runs}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted: the finished runs stay under {runs}; the same command goes on from there",
              file=sys.stderr)
        return 130
    build_table(runs / engine_name, args.out, args.quiet)
    return 0
