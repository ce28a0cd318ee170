"""What-if sweeps: a cartesian grid of configurations, one simulated replay per point.

    axes = parse_sweep(["block_size=8,16,32", "gpu=h100,h200"])
    points = expand_grid(axes)                       # deterministic order: last key varies fastest
    rows = run_sweep(points, base, jobs=4)           # local processes; rows in grid order
    table = results_table(rows, parse_slo("ttft_p99<2,preemptions=0"))

Each point turns model + GPU + settings into vLLM's num_gpu_blocks (planner.capacity), an
EngineConfig and a cost model (the roofline unless a fixed step time or a table is given) through
``planner.engine_setup.build_engine``, loads the workload (``rate`` re-times it, ``rate_scale``
multiplies its own rate: ``workloads.retime``), and calls
``simulator.simulate``. A point whose configuration is impossible (an InputError: weights larger
than the GPU, tp not dividing the heads) becomes a row with an ``error`` column instead of
stopping the sweep; any other exception is a bug and stops it.

Cost of a point (to name the cheapest one meeting the SLO): ``num_gpus * price_rank`` where
num_gpus = tp * replicas and price_rank is the GPU's ordinal price (planner/presets.py).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from kvsim.errors import InputError
from kvsim.planner.capacity import DEFAULT_GPU_MEMORY_UTILIZATION
from kvsim.planner.engine_setup import DEFAULT_GPU, DEFAULT_MODEL, build_engine
from kvsim.planner.presets import load_hf_config
from kvsim.planner.roofline import DEFAULT_STEP_OVERHEAD_S
from kvsim.planner.slo import Constraint, meets, resolve_metric
from kvsim.planner.specs import GIB, GpuSpec
from kvsim.simulator.overload import overload_reasons


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {text!r}")


# sweepable keys and how to read their values
SWEEP_KEYS: dict[str, Callable[[str], object]] = {
    "model": str, "gpu": str, "tp": int, "kv_dtype": str, "gpu_memory_utilization": float,
    "block_size": int, "max_model_len": int, "non_kv_gib": float,
    "rate": float, "rate_scale": float, "max_requests": int,
    "allocator": str, "placement": str, "max_num_seqs": int, "max_num_batched_tokens": int,
    "enable_prefix_caching": _parse_bool, "long_prefill_token_threshold": int,
    "watermark": float, "full_prompt_admission": _parse_bool,
    "scheduler": str, "async_scheduling": _parse_bool,
    "replicas": int, "router": str, "seed": int, "step_overhead_s": float,
    "bandwidth_efficiency": float, "flops_efficiency": float,
    "cpu_offload_gib": float, "offload_bandwidth_gbps": float, "disk_offload_gib": float,
    # a client's limit on requests in flight (vllm bench serve's --max-concurrency; a random:
    # spec's concurrency=): the closed-loop sweeps of throughput against interactivity
    "concurrency": int,
}
# engine keys (EngineConfig's names, which sweep columns and PlanBase.engine use) -> the names of
# planner.engine_setup.build_engine (vLLM's)
ENGINE_KEYS = {"placement": "placement", "max_num_seqs": "max_num_seqs",
               "max_num_batched_tokens": "max_num_batched_tokens",
               "enable_prefix_caching": "enable_prefix_caching",
               "long_prefill_token_threshold": "long_prefill_token_threshold",
               "watermark": "watermark", "full_prompt_admission": "scheduler_reserve_full_isl",
               "scheduler": "scheduler", "async_scheduling": "async_scheduling"}


def parse_sweep(specs: Iterable[str]) -> dict[str, list]:
    """``["block_size=8,16", "gpu=h100,h200"]`` -> ``{"block_size": [8, 16], "gpu": ["h100", "h200"]}``.

    Raises:
        InputError: malformed spec, unknown key (lists the known ones), repeated key, bad value.
    """
    axes: dict[str, list] = {}
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise InputError(f"expected KEY=V1,V2,..., got {spec!r}", field="sweep")
        if key not in SWEEP_KEYS:
            raise InputError(f"unknown key {key!r}; sweepable: {', '.join(SWEEP_KEYS)}", field="sweep")
        if key in axes:
            raise InputError(f"key {key!r} given twice", field="sweep")
        parsed = []
        for text in values.split(","):
            if not text.strip():
                raise InputError(f"{key}: empty value in {values!r}", field="sweep")
            try:
                parsed.append(SWEEP_KEYS[key](text.strip()))
            except ValueError:
                raise InputError(f"{key}: cannot read {text.strip()!r} as {SWEEP_KEYS[key].__name__}",
                                 field="sweep") from None
        axes[key] = parsed
    return axes


def expand_grid(axes: Mapping[str, Sequence]) -> list[dict]:
    """The cartesian product of the axes as a list of dicts, in a fixed order (the first key
    varies slowest). No axes: one empty point (the base configuration)."""
    keys = list(axes)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(axes[k] for k in keys))]


@dataclass(frozen=True)
class PlanBase:
    """What every point shares; a point's values override the matching fields.

    ``model`` is a preset name, or the model's name when ``hf_config`` (a config.json) is set; ``gpu`` a preset name, or
    ``custom_gpu`` a GpuSpec built from flags.
    """

    workload: str
    model: str = DEFAULT_MODEL
    hf_config: str | None = None
    gpu: str = DEFAULT_GPU
    custom_gpu: GpuSpec | None = None
    tp: int = 1
    kv_dtype: str = "auto"
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    block_size: int | None = None       # None: vLLM's for the model (build_engine)
    weight_dtype: str = "auto"
    disable_hybrid_kv_cache_manager: bool = False
    max_model_len: int | None = None
    non_kv_gib: float | None = None
    rate: float | None = None           # requests/s (workloads.retime: one meaning everywhere)
    rate_scale: float | None = None     # times the workload's own rate (keeps its arrival pattern)
    max_requests: int | None = None
    allocator: str = "paged"
    replicas: int = 1
    router: str = "round-robin"
    seed: int = 0
    step_s: float | None = None         # a fixed step time instead of the roofline (1.0: step clock)
    cost_table: str | None = None       # a measured step-time table instead of the roofline
    force_cost_table: bool = False      # use it although measured for another setup
    force_hf_config: bool = False       # size an hf_config of a model_type kvsim does not know
    step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S
    bandwidth_efficiency: float = 1.0   # roofline: achievable fractions of the datasheet peaks
    flops_efficiency: float | None = None   # None: real vLLM's measured share for the weights
    engine: Mapping = field(default_factory=dict)  # further EngineConfig fields (max_num_seqs, ...)
    # offload tiers (planner.engine_setup; 0 / None: none)
    cpu_offload_gib: float | None = None
    offload_bandwidth_gbps: float | None = None
    disk_offload_gib: float | None = None
    disk_bandwidth_gbps: float | None = None
    disk_latency_ms: float | None = None
    max_concurrency: int | None = None   # the client's limit (None: the spec's concurrency=, or open loop)


def load_requests(workload: str, *, rate: float | None = None, rate_scale: float | None = None,
                  max_requests: int | None = None, seed: int = 0) -> list:
    """The workload's requests at ``rate`` requests/s and/or ``rate_scale`` times its own rate
    (``workloads.load_at_rate``: the one meaning of both in every command)."""
    from kvsim import workloads
    from kvsim.simulator.footprint import WorkloadSize, check_requests_in_memory

    # held in a list: a spec's n= is checked against the memory first
    check_requests_in_memory(WorkloadSize(**workloads.workload_size(workload, max_requests=max_requests)))
    return list(workloads.load_at_rate(workload, rate=rate, rate_scale=rate_scale,
                                       max_requests=max_requests, seed=seed))


def _default_simulate(*args, **kwargs):
    from kvsim.simulator import simulate

    return simulate(*args, **kwargs)


def flatten(mapping: Mapping, prefix: str = "") -> dict:
    """Nested dicts -> one level with dotted keys; only scalars are kept."""
    out = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[name] = value
    return out


@dataclass(frozen=True)
class PointTask:
    index: int
    params: Mapping
    base: PlanBase
    simulate: Callable | None = None  # None: simulator.simulate (a picklable module-level function)


def evaluate_point(task: PointTask) -> dict:
    """Run one grid point; returns its row (grid values, capacity figures, flattened summary).

    An impossible configuration (an InputError: weights larger than the GPU, tp not dividing the
    heads, ...) is recorded in the row's ``error`` column; any other exception is a bug and
    propagates.
    """
    base = dataclasses.replace(task.base, **{k: v for k, v in task.params.items()
                                             if k in {f.name for f in dataclasses.fields(PlanBase)}})
    engine = {**base.engine, **{k: v for k, v in task.params.items() if k in ENGINE_KEYS}}
    row: dict = {"point": task.index, **task.params}
    try:
        unknown = sorted(set(engine) - set(ENGINE_KEYS))
        if unknown:
            raise InputError(f"{unknown[0]!r} is not a simulator.EngineConfig field", field="sweep")
        setup = build_engine(
            model=(load_hf_config(base.hf_config, name=base.model, force=base.force_hf_config)
                   if base.hf_config else base.model),
            gpu=base.custom_gpu if (base.custom_gpu is not None and "gpu" not in task.params)
            else base.gpu,
            tensor_parallel_size=base.tp, kv_cache_dtype=base.kv_dtype,
            weight_dtype=base.weight_dtype,
            disable_hybrid_kv_cache_manager=base.disable_hybrid_kv_cache_manager,
            gpu_memory_utilization=base.gpu_memory_utilization, block_size=base.block_size,
            max_model_len=base.max_model_len,
            non_kv_bytes=None if base.non_kv_gib is None else int(base.non_kv_gib * GIB),
            allocator=base.allocator, step_s=base.step_s, cost_table=base.cost_table,
            force_cost_table=base.force_cost_table,
            step_overhead_s=base.step_overhead_s, bandwidth_efficiency=base.bandwidth_efficiency,
            flops_efficiency=base.flops_efficiency, cpu_offload_gib=base.cpu_offload_gib,
            offload_bandwidth_gbps=base.offload_bandwidth_gbps,
            disk_offload_gib=base.disk_offload_gib, disk_bandwidth_gbps=base.disk_bandwidth_gbps,
            disk_latency_ms=base.disk_latency_ms,
            **{ENGINE_KEYS[k]: v for k, v in engine.items()})
        report, gpu = setup.capacity, setup.gpu
        num_gpus = base.tp * base.replicas
        row.update(model_name=setup.model.name, gpu_name=gpu.name, num_gpus=num_gpus,
                   cost=num_gpus * gpu.price_rank, num_gpu_blocks=report.num_gpu_blocks,
                   kv_cache_tokens=report.kv_cache_tokens, kv_bytes_per_token=report.kv_bytes_per_token,
                   max_concurrency=round(report.max_concurrency, 6))
        requests = load_requests(base.workload, rate=base.rate, rate_scale=base.rate_scale,
                                 max_requests=base.max_requests, seed=base.seed)
        simulate = task.simulate or _default_simulate
        tiers = {"offload": setup.offload} if setup.offload else {}
        limit = _max_concurrency(base, task.params)
        result = simulate(requests, setup.config, setup.cost, replicas=base.replicas,
                          router=base.router, seed=base.seed, max_concurrency=limit,
                          record_token_times=True, **tiers)
        row.update(flatten(result.summary))
        row.update(bench_columns(result, limit, num_gpus))
        # the queue grows without bound: latencies measure the queue (simulator.overload)
        row["overloaded"] = bool(overload_reasons(result.summary, getattr(result, "timeseries", None)))
        row["error"] = None
    except InputError as err:  # impossible point: keep the row, say why
        row["error"] = str(err)
    return row


# vllm bench serve's figures kept in a sweep's rows (simulator.serve_metrics; the SLO terms and
# the Pareto front read them): its names, in ms and per second
BENCH_PERCENTILES = (50.0, 90.0, 99.0)


def _max_concurrency(base: PlanBase, params: Mapping) -> int | None:
    """A point's client limit: its ``concurrency``, the base's, or the workload spec's."""
    if params.get("concurrency") is not None:
        return int(params["concurrency"])
    if base.max_concurrency is not None:
        return base.max_concurrency
    from kvsim.workloads.source import spec_concurrency

    return spec_concurrency(base.workload)


def bench_columns(result, max_concurrency: int | None, num_gpus: int) -> dict:
    """A replay's vllm bench serve metrics as row columns, plus what InferenceMAX plots:
    ``output_throughput_per_gpu`` (output tokens/s per GPU) and ``interactivity`` (tokens/s per
    user: 1000 / mean TPOT in ms). Empty for a result without token times."""
    token_times = getattr(result, "token_times", None)
    if token_times is None:
        return {}
    from kvsim.simulator.serve_metrics import serve_metrics

    m = serve_metrics(result.requests, token_times, percentiles=BENCH_PERCENTILES,
                      max_concurrency=max_concurrency)
    out = {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    out["output_throughput_per_gpu"] = m["output_throughput"] / num_gpus
    out["interactivity"] = 1000.0 / m["mean_tpot_ms"] if m["mean_tpot_ms"] > 0 else math.nan
    return out


def mark_pareto(rows: list[dict], x: str = "interactivity", y: str = "output_throughput_per_gpu") -> list[dict]:
    """Add ``pareto``: whether no other point has both at least its ``x`` and its ``y``, one of
    them more (InferenceMAX's front of throughput per GPU against interactivity). Rows with an
    error or without the two figures are off the front."""
    def figures(row):
        a, b = row.get(x), row.get(y)
        if row.get("error") is not None or a is None or b is None or math.isnan(a) or math.isnan(b):
            return None
        return a, b
    pts = [figures(r) for r in rows]
    out = []
    for row, p in zip(rows, pts):
        on = p is not None and not any(q is not None and q[0] >= p[0] and q[1] >= p[1] and q != p for q in pts)
        out.append({**row, "pareto": on})
    return out


def _run_local(tasks: list, jobs: int, progress: bool, fn: Callable, on_row: Callable) -> dict[int, dict]:
    from tqdm import tqdm

    rows_by_index: dict[int, dict] = {}

    def finished(task, row):
        rows_by_index[task.index] = row
        on_row(task, row)
        bar.update()

    bar = tqdm(total=len(tasks), desc="sweep", unit="point", disable=not progress)
    try:
        if jobs <= 1:
            for task in tasks:
                finished(task, fn(task))
            return rows_by_index
        from concurrent.futures import as_completed

        pool = ProcessPoolExecutor(max_workers=jobs)
        try:
            futures = {pool.submit(fn, t): t for t in tasks}
            for fut in as_completed(futures):
                finished(futures[fut], fut.result())
        except BaseException:   # Ctrl-C: the points not started are dropped, not waited for
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return rows_by_index
    finally:
        bar.close()


def _run_ray(tasks: list, address: str | None, progress: bool, fn: Callable, on_row: Callable) -> dict[int, dict]:
    try:
        import ray
    except ImportError:
        raise InputError("--backend ray needs Ray, which is an optional extra: "
                         "pip install 'kvsim[ray]' (or pip install 'ray[default]')") from None
    from tqdm import tqdm

    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(fn)
    refs = [remote.remote(t) for t in tasks]
    task_of = {ref: t for ref, t in zip(refs, tasks)}
    rows_by_index: dict[int, dict] = {}
    pending = list(refs)
    with tqdm(total=len(tasks), desc="sweep (ray)", unit="point", disable=not progress) as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                task = task_of[ref]
                rows_by_index[task.index] = ray.get(ref)
                on_row(task, rows_by_index[task.index])
                bar.update()
    return rows_by_index


def run_sweep(points: Sequence[Mapping], base: PlanBase, *, jobs: int = 1, backend: str = "local",
              address: str | None = None, progress: bool = False,
              simulate: Callable | None = None, done: Mapping[int, dict] | None = None,
              on_row: Callable | None = None) -> list[dict]:
    """Evaluate every grid point; rows come back in grid order whatever the backend.

    Args:
        points: from expand_grid.
        base: shared configuration.
        jobs: local worker processes (1: in this process).
        backend: "local" or "ray" (``address``: a Ray cluster; None starts a local one).
        progress: show a tqdm bar on stderr.
        simulate: replacement for simulator.simulate (must be picklable for jobs > 1).
        done, on_row: as run_tasks (the rows of points already finished; called as each finishes).
    Returns:
        One dict per point.
    """
    tasks = [PointTask(i, dict(p), base, simulate) for i, p in enumerate(points)]
    return run_tasks(tasks, evaluate_point, jobs=jobs, backend=backend, address=address, progress=progress,
                     done=done, on_row=on_row)


def run_tasks(tasks: Sequence, fn: Callable, *, jobs: int = 1, backend: str = "local",
              address: str | None = None, progress: bool = False, done: Mapping[int, dict] | None = None,
              on_row: Callable | None = None) -> list[dict]:
    """``fn`` (picklable) of every task (each with an ``index`` and ``params``), in local processes
    or on Ray; the rows in the tasks' order.

    Args:
        done: rows of tasks already finished (a resumed sweep, planner.sweep_journal), by index:
            those tasks are not run again.
        on_row: called in this process with (task, row) as each task finishes, whatever the
            backend (the journal writes it), so that an interruption loses no finished row.
    """
    if jobs < 1:
        raise InputError(f"jobs must be >= 1, got {jobs}")
    if backend not in ("local", "ray"):
        raise InputError(f"backend must be 'local' or 'ray', got {backend!r}")
    done = dict(done or {})
    todo = [t for t in tasks if t.index not in done]
    on_row = on_row or (lambda task, row: None)
    if todo:
        done.update(_run_local(todo, jobs, progress, fn, on_row) if backend == "local"
                    else _run_ray(todo, address, progress, fn, on_row))
    return [done[t.index] for t in tasks]  # grid order, whatever finished first


def clock_lines(rows: Iterable[Mapping], label: Callable[[Mapping], str] | None = None) -> list[str]:
    """Which clock priced a sweep's points (their ``config.clock``): ``clock: LINE`` when every
    point ran the same one, else ``clock (points A, B): LINE`` per clock, each point named by
    ``label`` (default: its number; the first 20, then ``...``). Points without one (impossible
    configurations) are left out."""
    label = label or (lambda row: str(row["point"]))
    by_clock: dict[str, list[str]] = {}
    for row in rows:
        clock = row.get("config.clock")
        if isinstance(clock, str):
            by_clock.setdefault(clock, []).append(label(row))
    if len(by_clock) == 1:
        return [f"clock: {next(iter(by_clock))}"]
    return [f"clock (point{'s' if len(names) > 1 else ''} {', '.join(names[:20])}{', ...' if len(names) > 20 else ''}): "
            f"{clock}" for clock, names in by_clock.items()]


def mark_slo(rows: list[dict], constraints: tuple[Constraint, ...]) -> list[dict]:
    """Add ``meets_slo`` to each row (False for rows with an error)."""
    out = []
    for row in rows:
        ok = row.get("error") is None and meets(row, constraints) if constraints else row.get("error") is None
        out.append({**row, "meets_slo": bool(ok)})
    return out


def cheapest(rows: Sequence[Mapping], constraints: tuple[Constraint, ...] = ()) -> dict | None:
    """The cheapest row meeting the SLO: lowest cost (num_gpus * price_rank), then lowest p99 TTFT
    if the rows have one, then grid order. None when no row qualifies."""
    ok = [r for r in rows if r.get("meets_slo", r.get("error") is None)]
    if not ok:
        return None

    def ttft(row) -> float:
        try:
            value = resolve_metric(row, "ttft_p99")
        except InputError:
            return 0.0
        return math.inf if math.isnan(value) else value

    return dict(min(ok, key=lambda r: (r["cost"], ttft(r), r["point"])))
