"""Everything the dashboard pages compute, cached; pages only lay out widgets and figures.

A *scenario* (workload + two allocator configurations + pool size) is simulated once per
configuration with ``simulator.simulate``; the result is kept as a :class:`Run` of plain data
(summary dict, DataFrames, pool snapshots at evenly spaced frame times) so Streamlit can cache it.
Backends are imported lazily: a page whose backend branch has not landed shows what is missing
instead of failing.
"""
from __future__ import annotations

import hashlib
import importlib
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACES = ROOT.parent / "shared" / "traces"
TRACE_SUFFIXES = (".csv", ".jsonl", ".json", ".txt")
MAX_UPLOAD_MB = 20  # uploads are parsed by the trace loaders only: never executed or unpickled
ALLOCATORS = ("paged", "max", "pow2", "oracle")
ALLOCATOR_LABELS = {"paged": "paged (vLLM blocks)", "max": "contiguous, reserve max_model_len",
                    "pow2": "contiguous, reserve next power of two",
                    "oracle": "contiguous, reserve true length (oracle)"}
# one line per allocator for newcomers (shown under each pool)
ALLOCATOR_NOTES = {
    "paged": "Blocks of block_size tokens are taken one at a time as a request grows, anywhere "
             "in the pool; full prompt blocks with the same content are shared.",
    "max": "Each admitted request gets one contiguous extent of max_model_len tokens up front, "
           "however short it turns out to be.",
    "pow2": "Each admitted request gets one contiguous extent of its final length rounded up "
            "to a power of two.",
    "oracle": "Each admitted request gets one contiguous extent of exactly its final length "
              "(an oracle that knows the output length: the best a contiguous scheme can do).",
}
# widget keys whose values must survive page switches (Streamlit drops the state of widgets that a
# run does not draw; re-assigning a key makes it plain session state, see keep_widget_state)
PERSISTENT_PREFIX = "k_"
TICK_S = 0.5  # playback timer period (seconds of wall time per tick)


def keep_widget_state() -> None:
    """Keep every ``k_*`` widget's value across page switches."""
    for key in list(st.session_state.keys()):
        if str(key).startswith(PERSISTENT_PREFIX):
            st.session_state[key] = st.session_state[key]


def backend(module: str, *names: str):
    """``module`` if it imports and has every attribute in ``names``; None while its branch has
    not landed (pages then show st.info instead of failing)."""
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    return mod if all(hasattr(mod, n) for n in names) else None


def defaults(**values) -> None:
    """Seed widget values once; widgets are then drawn without a default (Streamlit warns when a
    widget gets both a default and a value through session state)."""
    for key, value in values.items():
        st.session_state.setdefault(key, value)


# ---------------------------------------------------------------- workloads
def shared_trace_files() -> list[str]:
    """Trace files under ../shared/traces (relative names), empty when the folder is absent."""
    if not SHARED_TRACES.is_dir():
        return []
    return sorted(str(p.relative_to(SHARED_TRACES)) for p in SHARED_TRACES.rglob("*")
                  if p.is_file() and p.suffix in TRACE_SUFFIXES)


@dataclass(frozen=True)
class Workload:
    """Where requests come from: ``kind`` "builtin" (spec string), "shared" (file under
    ../shared/traces) or "upload" (content digest of a file in the upload store)."""
    kind: str
    ref: str
    max_requests: int = 200
    rate: float = 2.0  # arrivals/s for traces without timestamps (ShareGPT lengths, plain CSV)


def workload_source(workload: Workload) -> str:
    """What workloads.load (and the planner's sweeps) read for this workload."""
    return str(SHARED_TRACES / workload.ref) if workload.kind == "shared" else workload.ref


_UPLOADS = Path(tempfile.gettempdir()) / "kvsim-uploads"


def store_upload(name: str, data: bytes, max_requests: int = 200,
                 rate: float = 2.0) -> Workload | str:
    """Keep an uploaded trace on disk under its digest so cached loaders can reopen it.

    Returns:
        the Workload, or a one-line error (too large, empty, wrong suffix).
    """
    suffix = Path(name).suffix.lower()
    if suffix not in TRACE_SUFFIXES:
        return f"{name}: unsupported file type {suffix or '(none)'}; use {', '.join(TRACE_SUFFIXES)}"
    if len(data) > MAX_UPLOAD_MB * 2**20:
        return f"{name}: {len(data) / 2**20:.1f} MB is over the {MAX_UPLOAD_MB} MB upload limit"
    if not data.strip():
        return f"{name}: the file is empty"
    digest = hashlib.sha256(data).hexdigest()[:16]
    _UPLOADS.mkdir(parents=True, exist_ok=True)
    # keep the user's file name (loaders name it in their errors) inside a per-digest folder
    path = _UPLOADS / digest / Path(name).name
    path.parent.mkdir(exist_ok=True)
    if not path.exists():
        path.write_bytes(data)
    return Workload("upload", str(path), max_requests, rate)


def user_message(err: Exception, workload: Workload) -> str:
    """The error for the user: an upload is named by its file name, not its storage path."""
    text = str(err)
    if workload.kind == "upload":
        text = text.replace(str(Path(workload.ref).parent) + "/", "")
    return text


def needs_rate(workload: Workload) -> bool:
    """Whether the trace has no timestamps, so arrivals are generated at ``workload.rate``."""
    workloads = importlib.import_module("kvsim.workloads")
    try:
        next(iter(workloads.load(workload_source(workload), max_requests=1)), None)
    except workloads.InputError as err:
        if err.field == "rate":
            return True
        raise
    return False


@st.cache_data(max_entries=8, show_spinner="Loading requests…")
def load_requests(workload: Workload) -> list:
    """The workload's requests (at most ``max_requests``); raises the loader's InputError."""
    workloads = importlib.import_module("kvsim.workloads")
    rate = workload.rate if needs_rate(workload) else None
    return list(workloads.load(workload_source(workload), max_requests=workload.max_requests,
                               rate=rate))


# ---------------------------------------------------------------- simulation
@dataclass(frozen=True)
class Scenario:
    """One comparison: a workload run on two allocator configurations of the same pool size."""
    workload: Workload
    allocators: tuple[str, str] = ("paged", "max")
    placement: str = "buddy"
    block_size: int = 16
    capacity_tokens: int = 8192
    max_model_len: int = 4096
    enable_prefix_caching: bool = True
    step_s: float = 0.025
    num_frames: int = 100


@dataclass
class Run:
    """One configuration's simulation, as plain data."""
    allocator: str
    summary: dict
    timeseries: pd.DataFrame
    requests: pd.DataFrame
    frame_times_s: np.ndarray
    snapshots: list = field(default_factory=list)  # one per frame time
    end_s: float = 0.0  # when its last request finished
    summary_json: str = "{}"  # the simulator's own JSON of the summary (NaN written as null)


def engine_config(scenario: Scenario, allocator: str):
    """The simulator's EngineConfig for one side of the scenario."""
    simulator = importlib.import_module("kvsim.simulator")
    size = ({"num_blocks": scenario.capacity_tokens // scenario.block_size}
            if allocator == "paged" else {"capacity_tokens": scenario.capacity_tokens})
    return simulator.EngineConfig(
        allocator=allocator, placement=scenario.placement, block_size=scenario.block_size,
        max_model_len=scenario.max_model_len, enable_prefix_caching=scenario.enable_prefix_caching,
        **size)


def frame_times(end_s: float, num_frames: int) -> np.ndarray:
    """Evenly spaced snapshot times from 0 to ``end_s`` inclusive."""
    if num_frames < 2:
        raise ValueError(f"num_frames must be >= 2, got {num_frames}")
    return np.linspace(0.0, max(end_s, 1e-9), num_frames)


# most snapshot cells kept per scenario (both sides, all frames): a contiguous pool has one cell
# per token, so a 256k-token pool gets fewer frames than the default one (memory stays < ~150 MB)
SNAPSHOT_CELL_BUDGET = 6_000_000
MIN_FRAMES = 20


def num_frames_for(scenario: Scenario) -> int:
    """Frames to snapshot: the scenario's wish, fewer when the pools are huge."""
    cells = sum(scenario.capacity_tokens // (scenario.block_size if a == "paged" else 1)
                for a in scenario.allocators)
    return max(MIN_FRAMES, min(scenario.num_frames, SNAPSHOT_CELL_BUDGET // max(cells, 1)))


# cache_resource, not cache_data: the runs are large and read-only, and cache_data would unpickle
# a copy of every snapshot on each rerun (each playback tick)
@st.cache_resource(max_entries=4, show_spinner="Simulating…")
def run_scenario(scenario: Scenario) -> tuple[Run, Run]:
    """Simulate both configurations; returns one Run per side (cached per scenario; read-only).

    Both sides are snapshotted at the same times (from 0 to the later of the two ends), so the
    time scrubber moves both pools through the same moment.
    """
    simulator = importlib.import_module("kvsim.simulator")
    cost = importlib.import_module("kvsim.simulator.cost").FixedStepCost(scenario.step_s)
    requests = load_requests(scenario.workload)
    configs = [engine_config(scenario, a) for a in scenario.allocators]
    # a first pass finds when each run ends; the second takes the snapshots
    ends_s = [float(simulator.simulate(requests, config, cost, record_requests=False)
                    .summary["simulated_duration_s"])
              for config in configs]
    times = frame_times(max(ends_s), num_frames_for(scenario))
    runs = []
    for allocator, config, end_s in zip(scenario.allocators, configs, ends_s):
        # one more snapshot at the run's end: the faster side shows its final pool from then on
        result = simulator.simulate(requests, config, cost,
                                    snapshot_times_s=tuple(sorted({*times.tolist(), end_s})))
        taken_s = np.array([t for t, _, _ in result.snapshots])
        pick = np.clip(np.searchsorted(taken_s, times, side="right") - 1, 0, len(taken_s) - 1)
        snaps = [result.snapshots[i][2] for i in pick]
        runs.append(Run(allocator=allocator, summary=dict(result.summary),
                        timeseries=result.timeseries, requests=result.requests,
                        frame_times_s=times, snapshots=snaps, end_s=end_s,
                        summary_json=result.summary_json()))
    return runs[0], runs[1]


# ---------------------------------------------------------------- playback
def default_frame(num_frames: int) -> int:
    """The frame a page opens on: a little way in, while both pools are busy."""
    return num_frames // 10


def next_frame(frame: int, num_frames: int, frames_per_tick: int) -> tuple[int, bool]:
    """Advance playback; returns the new frame and whether playback should keep going."""
    nxt = min(frame + max(frames_per_tick, 1), num_frames - 1)
    return nxt, nxt < num_frames - 1


# Playback state in session state: "k_frame" (the scrubber's frame), "live_playing",
# "k_speed" (frames per tick). The functions take the state mapping so tests can pass a dict.
def clamp_frame(num_frames: int, state=None) -> None:
    """Keep the frame inside a run that may have fewer frames than the last one."""
    state = st.session_state if state is None else state
    if state.get("k_frame", 0) >= num_frames:
        state["k_frame"] = num_frames - 1


def toggle_play(num_frames: int, state=None) -> None:
    """Play / pause; playing from the last frame starts again from the first."""
    state = st.session_state if state is None else state
    if not state.get("live_playing") and state.get("k_frame", 0) >= num_frames - 1:
        state["k_frame"] = 0
    state["live_playing"] = not state.get("live_playing")


def step(num_frames: int, state=None) -> None:
    """Pause and move one frame on."""
    state = st.session_state if state is None else state
    state["live_playing"] = False
    state["k_frame"] = next_frame(state.get("k_frame", 0), num_frames, 1)[0]


def tick(num_frames: int, state=None) -> bool:
    """One timer tick while playing: advance by the speed; returns True when playback ended."""
    state = st.session_state if state is None else state
    if not state.get("live_playing"):
        return False
    state["k_frame"], more = next_frame(state.get("k_frame", 0), num_frames,
                                        state.get("k_speed", 1))
    if not more:
        state["live_playing"] = False
    return not more


def sample_at(ts: pd.DataFrame, t_s: float, time_col: str = "time_s") -> pd.Series:
    """The last timeseries sample at or before ``t_s`` (the first one before any sample)."""
    if ts.empty:
        raise ValueError("the timeseries is empty")
    i = int(np.searchsorted(ts[time_col].to_numpy(), t_s, side="right")) - 1
    return ts.iloc[max(i, 0)]


def upto(ts: pd.DataFrame, t_s: float, time_col: str = "time_s") -> pd.DataFrame:
    """Samples up to ``t_s`` (the live strip grows as playback advances)."""
    return ts[ts[time_col] <= t_s]


def fmt_duration(t_s: float) -> str:
    """Simulated time for labels: 0.0 s, 12.3 s, 4 min 05 s."""
    if t_s < 60:
        return f"{t_s:.1f} s"
    m = math.floor(t_s / 60)
    return f"{m} min {t_s - 60 * m:04.1f} s"


@st.cache_data(max_entries=64, show_spinner=False)
def pool_figure(scenario: Scenario, side: int, frame: int):
    """The pool heatmap of one side at one frame (cached: scrubbing back costs nothing)."""
    from kvsim.viz.pool import pool_heatmap
    run = run_scenario(scenario)[side]
    frame = min(frame, len(run.snapshots) - 1)
    t_s = float(run.frame_times_s[frame])
    done = " (all requests done)" if t_s > run.end_s else ""
    title = f"{ALLOCATOR_LABELS[run.allocator]} · t = {fmt_duration(t_s)}{done}"
    # both pools at the paged block granularity (a contiguous snapshot has one cell per token)
    return pool_heatmap(run.snapshots[frame], title=title, height=430,
                        tile_tokens=scenario.block_size)


# per-request latency columns of Result.requests shown as CDFs (column -> title)
LATENCY_COLUMNS = {"ttft_s": "Time to first token", "tpot_s": "Time per output token",
                   "e2e_s": "End-to-end latency"}


# headline summary metrics compared as bars (dotted summary key -> title)
HEADLINE = {"request_throughput_per_s": "requests / s", "mean_running": "mean running",
            "ttft_s.p90": "TTFT p90 (s)", "mean_kv_usage": "mean KV usage",
            "num_preemptions": "preemptions"}


def run_label(i: int, run: Run) -> str:
    """How a run is named in tables and legends: its side and allocator."""
    return f"{'left' if i == 0 else 'right'}: {ALLOCATOR_LABELS[run.allocator]}"


def flat_summaries(runs) -> dict[str, dict]:
    """run label -> summary flattened to dotted keys (``ttft_s.p90``)."""
    from kvsim.planner.sweep import flatten
    return {run_label(i, r): flatten(r.summary) for i, r in enumerate(runs)}


def summary_table(runs) -> pd.DataFrame:
    """The runs' summaries side by side: one row per (dotted) metric, one text column per run."""
    def text(v) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    return pd.DataFrame({label: {k: text(v) for k, v in flat.items()}
                         for label, flat in flat_summaries(runs).items()})


def prefix_frame(runs) -> pd.DataFrame:
    """Cumulative prefix-cache hit rate of each run over time (one column per run label).

    The timeseries counters are cumulative tokens, so hit rate so far = hits / queried.
    """
    frames = []
    for i, run in enumerate(runs):
        ts = run.timeseries
        rate = ts["prefix_hit_tokens"] / ts["prefix_query_tokens"].where(
            ts["prefix_query_tokens"] > 0)
        frames.append(pd.DataFrame({"time_s": ts["time_s"], run_label(i, run): rate})
                      .set_index("time_s"))
    return pd.concat(frames, axis=1).sort_index().reset_index()


# ---------------------------------------------------------------- capacity planner
SWEEPS = {  # parameter -> (label, values)
    "tp": ("tensor parallel size", (1, 2, 4, 8)),
    "gpu_memory_utilization": ("gpu_memory_utilization", (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)),
    "block_size": ("block size (tokens)", (8, 16, 32, 64, 128)),
    "kv_dtype": ("KV dtype", ("auto", "fp8")),
    "max_model_len": ("max_model_len (tokens)", (2048, 4096, 8192, 16384, 32768, 65536, 131072)),
}
SWEEP_COLUMNS = {"num_gpu_blocks": "KV blocks per GPU", "kv_cache_tokens": "KV tokens per GPU",
                 "max_concurrency": "max_model_len requests at once"}


def capacity(model_name: str, gpu_name: str, **kwargs) -> dict:
    """planner's CapacityReport as a dict; raises ValueError for impossible configurations."""
    from kvsim.planner.capacity import compute_capacity
    from kvsim.planner.presets import get_gpu, get_model
    return compute_capacity(get_model(model_name), get_gpu(gpu_name), **kwargs).to_dict()


@st.cache_data(max_entries=32, show_spinner=False)
def capacity_sweep(model_name: str, gpu_name: str, param: str, base: tuple) -> pd.DataFrame:
    """Capacity over the values of one parameter, others fixed (``base``: sorted kwargs items).

    Returns:
        one row per value: the value, num_gpu_blocks, kv_cache_tokens, max_concurrency (NaN
        where the configuration is impossible) and the error message there (None elsewhere),
        the table viz.plan_figures.sweep_metric_figure draws.
    """
    rows = []
    for value in SWEEPS[param][1]:
        kwargs = dict(base)
        kwargs[param] = value
        try:
            rep = capacity(model_name, gpu_name, **kwargs)
            rows.append({param: value, **{c: rep[c] for c in SWEEP_COLUMNS}, "error": None})
        except ValueError as err:
            rows.append({param: value, **{c: np.nan for c in SWEEP_COLUMNS}, "error": str(err)})
    return pd.DataFrame(rows)


# simulated what-if: parameter -> (label, values); every point replays the workload on the GPU's
# real pool (vLLM's num_gpu_blocks) with the planner's roofline step cost
SIM_SWEEPS = {
    "rate": ("arrival rate (requests/s)", (1.0, 2.0, 4.0, 8.0, 16.0)),
    "gpu_memory_utilization": ("gpu_memory_utilization", (0.5, 0.7, 0.9)),
    "block_size": ("block size (tokens)", (8, 16, 32, 64)),
    "max_num_seqs": ("max_num_seqs", (8, 32, 128, 256)),
}
SIM_SWEEP_METRICS = {"request_throughput_per_s": "requests / s", "ttft_s.p99": "TTFT p99 (s)",
                     "num_preemptions": "preemptions", "mean_running": "mean running"}


@st.cache_data(max_entries=16, show_spinner="Simulating the sweep…")
def simulated_sweep(workload: Workload, allocators: tuple[str, ...], param: str,
                    base: tuple) -> pd.DataFrame:
    """Replay the workload at every value of ``param`` for each allocator (planner.sweep).

    Args:
        workload: the requests.
        allocators: EngineConfig allocators compared.
        param: a key of SIM_SWEEPS.
        base: sorted PlanBase keyword items (model, gpu, tp, kv_dtype, ...).
    Returns:
        one row per (allocator, value): the sweep's row (capacity figures, flattened summary,
        ``error`` None or the reason the point is impossible).
    """
    from kvsim.planner.sweep import PlanBase, expand_grid, run_sweep
    plan = PlanBase(workload=workload_source(workload), max_requests=workload.max_requests,
                    rate=workload.rate if needs_rate(workload) else None, **dict(base))
    # max_num_seqs is an engine setting: planner.sweep routes it to EngineConfig per point
    axes = {"allocator": list(dict.fromkeys(allocators)), param: list(SIM_SWEEPS[param][1])}
    return pd.DataFrame(run_sweep(expand_grid(axes), plan))


# ---------------------------------------------------------------- kernel validation
KERNEL_DTYPES = ("float32", "float16", "bfloat16")


def kernel_device() -> str:
    """"cuda" when a GPU is visible; otherwise "cpu", run by the Triton interpreter.

    TRITON_INTERPRET must be set before kernels/ is first imported (triton.jit reads it when a
    kernel is defined), so every kernel import of the dashboard goes through here.
    """
    import os

    import torch
    if torch.cuda.is_available():
        return "cuda"
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return "cpu"


def kernel_bridge():
    """kvsim.kernels.bridge once the kern branch has landed (None before), imported for kernel_device."""
    kernel_device()
    return backend("kvsim.kernels.bridge", "validate_snapshot")


@st.cache_data(max_entries=16, show_spinner="Running the Triton kernels…")
def kernel_check(scenario: Scenario, side: int, frame: int, layout: str, dtype: str,
                 max_seqs: int, split_kv: bool) -> tuple[pd.DataFrame, dict]:
    """Validate one snapshot's block tables with kernels.bridge.validate_snapshot.

    Returns:
        (one row per sequence: seq_id, num_tokens, num_blocks, num_shared_blocks, max_abs_err,
        max_rel_err, bitwise_equal, passed; the report's settings and verdict as a dict).
    """
    import dataclasses

    import torch
    device = kernel_device()
    bridge = importlib.import_module("kvsim.kernels.bridge")
    snap = run_scenario(scenario)[side].snapshots[frame]
    report = bridge.validate_snapshot(snap, layout=layout, dtype=getattr(torch, dtype),
                                      device=device, max_seqs=max_seqs,
                                      partition_size=64 if split_kv else None)
    checks = pd.DataFrame([dataclasses.asdict(c) for c in report.checks],
                          columns=[f.name for f in dataclasses.fields(bridge.SequenceCheck)])
    info = {k: v for k, v in dataclasses.asdict(report).items() if k != "checks"}
    info["passed"] = report.passed
    return checks, info
