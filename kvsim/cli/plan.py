"""``kvsim plan``: what-if sweeps over serving configurations, one simulated replay per point.

    kvsim plan ../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv \
        --sweep block_size=8,16,32,64 --sweep gpu_memory_utilization=0.8,0.9 \
        --slo "ttft_p99<2,preemptions=0" --out plan-out --jobs 2

Writes results.csv / results.parquet / results.json (grid order, deterministic for a seed),
timings.csv (wall-clock columns, which are not), plan.json (sweep, SLO, cheapest point) and
report.html (plotly charts) under --out.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from kvsim.cli import options
from kvsim.errors import InputError

FORMATS = ("csv", "parquet", "json")
# columns shown on the terminal when present (after the swept keys)
_SHOWN = ("num_gpu_blocks", "max_concurrency", "mean_running", "max_running", "preemptions",
          "ttft_p99", "throughput", "combined_hit_rate")
# with a concurrency axis: vllm bench serve's figures and InferenceMAX's two axes
_SHOWN_BENCH = ("request_throughput", "output_throughput_per_gpu", "interactivity", "p99_ttft_ms",
                "p99_tpot_ms", "pareto")


def plan_base(args):
    """The sweep's base configuration (planner.sweep.PlanBase) from the flags of ``plan`` (and of
    ``capacity``, whose replay is a one-point sweep)."""
    from kvsim.planner.sweep import PlanBase

    gpu = options.gpu_from_args(args)
    engine = {k: v for k, v in (("max_num_seqs", args.max_num_seqs),
                                ("max_num_batched_tokens", args.max_num_batched_tokens)) if v is not None}
    engine.update(enable_prefix_caching=not args.no_prefix_caching, placement=args.placement,
                  long_prefill_token_threshold=args.long_prefill_token_threshold,
                  full_prompt_admission=not args.no_full_prompt_admission, watermark=args.watermark)
    # the scheduling mode only when chosen: the default follows vLLM (build_engine)
    if args.scheduler != "v1":
        engine["scheduler"] = args.scheduler
    if args.async_scheduling is not None:
        engine["async_scheduling"] = args.async_scheduling
    hf_config, model = (options.hf_config_source(args.hf_config) if args.hf_config
                        else (None, args.model))
    if hf_config:   # checked (and its notes printed) once here, not in every point
        options.model_from_args(args)
    return PlanBase(workload=args.workload, model=model, hf_config=hf_config,
                    gpu=gpu if isinstance(gpu, str) else gpu.name,
                    custom_gpu=None if isinstance(gpu, str) else gpu, tp=args.tp,
                    kv_dtype=args.kv_dtype, gpu_memory_utilization=args.gpu_memory_utilization,
                    block_size=args.block_size, max_model_len=args.max_model_len,
                    weight_dtype=args.weight_dtype,
                    disable_hybrid_kv_cache_manager=args.disable_hybrid_kv_cache_manager,
                    non_kv_gib=args.non_kv_gib, rate=args.rate, rate_scale=args.rate_scale,
                    max_requests=args.max_requests,
                    allocator=args.allocator, replicas=args.replicas, router=args.router,
                    seed=args.seed, step_s=options.step_s_from_args(args), cost_table=args.cost_table,
                    force_cost_table=args.force_cost_table, force_hf_config=args.force_hf_config,
                    engine=engine, max_concurrency=getattr(args, "max_concurrency", None),
                    **options.roofline_kwargs(args), **options.offload_kwargs(args))


def _terminal_table(df, swept: list[str], has_slo: bool, search=None):
    import pandas as pd

    from kvsim.planner.slo import resolve_metric

    cols = {"point": df["point"]}
    for key in swept:
        cols[key] = df[key]
    shown = _SHOWN if "concurrency" not in swept else \
        ("num_gpu_blocks", "preemptions") + _SHOWN_BENCH
    if search is not None:   # the answer, then the figures its SLO names
        shown = ("max_rate", "next_rate", "search_status", *dict.fromkeys(c.metric for c in search),
                 "request_throughput", "output_throughput_per_gpu")
    for name in shown:
        if name in ("pareto", "search_status"):
            if name in df:
                cols[name] = df[name]
            continue
        values = []
        for row in df.to_dict("records"):
            try:
                values.append(resolve_metric(row, name))
            except InputError:
                values.append(None)
        if any(v is not None for v in values):
            cols[name] = values
    for extra in ("meets_slo", "error") if has_slo else ("error",):
        if extra in df and df[extra].notna().any():
            cols[extra] = df[extra]
    return pd.DataFrame(cols)


def _figures(df, swept: list[str], best: dict | None, has_slo: bool) -> list:
    import pandas as pd

    from kvsim.viz.plan_figures import slo_scatter_figure, sweep_metric_figure

    ok = df[df["error"].isna()]
    if ok.empty:
        return []
    numeric = [k for k in swept if pd.api.types.is_numeric_dtype(ok[k])]
    x = numeric[0] if numeric else (swept[0] if swept else "point")
    group = [k for k in swept if k != x]
    figs = []
    for name in ("max_concurrency", "mean_running", "preemptions", "ttft_p99", "throughput"):
        col = next((c for c in ([name] + [a for a in _aliases(name)]) if c in ok.columns), None)
        if col is not None and ok[col].notna().any():
            figs.append(sweep_metric_figure(ok, x, col, group))
    if "concurrency" in swept and "interactivity" in ok.columns:
        from kvsim.viz.plan_figures import pareto_figure

        figs.insert(0, pareto_figure(ok, group_by=[k for k in swept if k != "concurrency"]))
    ttft = next((c for c in _aliases("ttft_p99") if c in ok.columns), None)
    if has_slo and ttft is not None:
        figs.append(slo_scatter_figure(df, "cost", ttft, None if best is None else best["point"]))
    return figs


def _aliases(name: str) -> tuple[str, ...]:
    from kvsim.planner.slo import METRIC_ALIASES

    return METRIC_ALIASES.get(name, (name,))


def run(args) -> int:
    from kvsim.planner.slo import parse_slo
    from kvsim.planner.sweep import parse_sweep
    from kvsim.planner.sweep_journal import NAME
    from kvsim.simulator.result import prepare_output_dir

    if args.address is not None and args.backend != "ray":
        raise InputError("--address is a Ray cluster's: give it with --backend ray", field="--address")
    axes = parse_sweep(args.sweep or [])
    constraints = parse_slo(args.slo) if args.slo else ()
    search = parse_slo(args.max_rate_under) if args.max_rate_under else None
    if search is not None and ("rate" in axes or "rate_scale" in axes):
        raise InputError("--max-rate-under searches the rate: do not sweep rate or rate_scale too")
    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise InputError(f"unknown format(s) {', '.join(bad)}; choose from {', '.join(FORMATS)}", field="format")
    out_names = [f"results.{f}" for f in formats] + ["timings.csv", "plan.json", "report.html", NAME]
    if args.resume and not args.out:
        raise InputError("--resume needs --out (the folder of the interrupted plan)")
    created = bool(args.out) and not os.path.exists(args.out)
    if args.out:  # checked before the sweep: its minutes must not be lost at the end
        prepare_output_dir(args.out, names=tuple(out_names))
    try:
        return _run(args, axes, constraints, search, formats)
    except InputError:
        # no result was written (every point impossible, no Ray...): leave no folder behind
        if created and set(os.listdir(args.out)) <= {NAME}:
            shutil.rmtree(args.out, ignore_errors=True)
        raise


def _run(args, axes, constraints, search, formats) -> int:
    import pandas as pd

    from kvsim.cli.outputs import write_files
    from kvsim.planner.rate_search import STEP, run_rate_search
    from kvsim.planner.sweep import (cheapest, clock_lines, expand_grid, load_requests, mark_pareto, mark_slo,
                                     run_sweep)
    from kvsim.planner.sweep_journal import SweepJournal, fingerprint
    from kvsim.simulator.footprint import WorkloadSize, check_requests_in_memory
    from kvsim.workloads import workload_size

    base = plan_base(args)
    # a bad trace or spec, or one too large to hold, fails here, once, rather than in every point
    check_requests_in_memory(WorkloadSize(**workload_size(base.workload, max_requests=base.max_requests)))
    load_requests(base.workload, rate=axes.get("rate", [base.rate])[0],
                  rate_scale=axes.get("rate_scale", [base.rate_scale])[0], max_requests=1, seed=base.seed)

    points = expand_grid(axes)
    journal = SweepJournal(args.out, fingerprint(base, axes, search)) if args.out else None
    done = journal.load(points) if args.resume else {}
    if journal:
        journal.start(done, points)
    if done:
        print(f"resumed: {len(done)} of {len(points)} points from {journal.path}", file=sys.stderr)
    how = dict(jobs=args.jobs, backend=args.backend, address=args.address,
               progress=not args.quiet and sys.stderr.isatty(), done=done,
               on_row=(lambda task, row: journal.add(task.index, task.params, row)) if journal else None)
    try:
        rows = run_sweep(points, base, **how) if search is None else run_rate_search(points, base, search, **how)
    except KeyboardInterrupt:
        if journal:
            print(f"kvsim: interrupted; {journal.num_points} of {len(points)} points finished are kept in {journal.path}: "
                  "the same command with --resume runs the rest", file=sys.stderr)
        raise
    if rows and all(r.get("error") for r in rows):
        raise InputError(f"every point is impossible; point 0: {rows[0]['error']}")
    if "concurrency" in axes:
        rows = mark_pareto(rows)
    slo_error = None
    try:
        rows = mark_slo(rows, constraints)
    except InputError as err:  # unknown metric: still print and write what was computed, then report
        slo_error = err
    best = cheapest(rows, constraints) if slo_error is None else None

    df = pd.DataFrame(rows)
    if "error" not in df:
        df["error"] = None
    wall = [c for c in df.columns if "wall" in c]
    results = df.drop(columns=wall)
    swept = list(axes)
    # the table first: whatever happens to the files below, the sweep's result is on the terminal
    with pd.option_context("display.max_rows", 500, "display.width", 200, "display.max_columns", 50):
        print(_terminal_table(df, swept, bool(constraints), search).to_string(index=False))
    for line in clock_lines(df.to_dict("records")):
        print(line)
    if search is not None:
        print(f"max_rate: the highest rate (requests/s) meeting {args.max_rate_under}, its replay's figures "
              f"beside; at next_rate ({(STEP - 1) * 100:.0f} % above) the SLO is missed")
    num_failed = int(df["error"].notna().sum())
    if num_failed:
        print(f"{num_failed} of {len(df)} points are impossible configurations (see the error column)")
    if "overloaded" in df and df["overloaded"].fillna(False).astype(bool).any():
        points_over = df.loc[df["overloaded"].fillna(False).astype(bool), "point"].tolist()
        print(f"kvsim: warning: {len(points_over)} of {len(df)} points are overloaded (points "
              f"{', '.join(map(str, points_over[:20]))}{', ...' if len(points_over) > 20 else ''}): "
              "their queues grow through the run, so their latencies measure the queue "
              "(column overloaded, simulator.overload)", file=sys.stderr)
    if constraints and slo_error is None:
        if best is None:
            print(f"no point meets the SLO {args.slo}")
        else:
            print(f"cheapest meeting the SLO: point {best['point']} "
                  + ", ".join(f"{k}={best[k]}" for k in swept) + f" (cost {best['cost']})")
    if args.out:
        write_files(_output_writes(Path(args.out), formats, df, results, wall, axes, constraints,
                                   best, swept, args.workload, search))
        # every point is in the results now: the journal (wall times, finishing order) goes, so
        # that the folder is the same bytes for a seed
        journal.path.unlink(missing_ok=True)
        print(f"wrote {args.out}/: " + ", ".join([f"results.{f}" for f in formats] + ["plan.json", "report.html"]))
    if slo_error is not None:
        raise slo_error
    return 0


def _output_writes(out: Path, formats, df, results, wall, axes, constraints, best, swept, workload, search=None):
    """(path, write) for every file of --out (kvsim.cli.outputs.write_files runs them)."""
    from kvsim.viz.plan_figures import report_html

    writes = []
    if "csv" in formats:
        writes.append((out / "results.csv", lambda: results.to_csv(out / "results.csv", index=False)))
    if "parquet" in formats:
        writes.append((out / "results.parquet",
                       lambda: results.to_parquet(out / "results.parquet", index=False)))
    if "json" in formats:
        writes.append((out / "results.json", lambda: (out / "results.json").write_text(
            results.to_json(orient="records", indent=1) + "\n")))
    if wall:
        writes.append((out / "timings.csv",
                       lambda: df[["point", *wall]].to_csv(out / "timings.csv", index=False)))
    # wall-clock figures live in timings.csv only: plan.json is byte-identical for a seed
    cheapest_row = None if best is None else {k: v for k, v in best.items() if k not in wall}
    meta = {"workload": workload, "sweep": axes, "slo": [str(c) for c in constraints],
            "max_rate_under": None if search is None else [str(c) for c in search],
            "cost": "num_gpus * price_rank (planner/presets.py)", "cheapest": cheapest_row}
    writes.append((out / "plan.json", lambda: (out / "plan.json").write_text(
        json.dumps(meta, indent=1, sort_keys=True, default=str) + "\n")))
    notes = [f"workload: {workload}", f"sweep: {axes}",
             f"SLO: {', '.join(str(c) for c in constraints) or 'none'}"]
    if constraints:
        notes.append("cheapest meeting the SLO (cost = GPUs x price rank): " + (
            "none" if best is None else
            f"point {best['point']} " + json.dumps({k: best[k] for k in swept}, default=str)))
    figures = _figures(df, swept, best, bool(constraints))
    writes.append((out / "report.html", lambda: (out / "report.html").write_text(
        report_html("kvsim plan", figures, results, notes))))
    return writes


def register(subparsers) -> None:
    """Add ``kvsim plan``."""
    p = subparsers.add_parser(
        "plan", help="what-if sweep: one simulated replay per configuration, SLO check",
        description="Sweep a cartesian grid of configurations over a workload, one replay per point; "
                    "mark the points meeting an SLO and name the cheapest (cost = GPUs x price rank).")
    options.add_workload_args(p, trace_format=False)
    g = p.add_argument_group("sweep")
    g.add_argument("--sweep", action="append", metavar="KEY=V1,V2",
                   help="a grid axis (repeatable); keys: block_size, gpu_memory_utilization, gpu, model, tp, "
                        "kv_dtype, rate, rate_scale, max_num_seqs, max_num_batched_tokens, allocator, "
                        "replicas, ...")
    g.add_argument("--slo", help='e.g. "ttft_p99<2,preemptions=0" (seconds; "500ms" works too)')
    g.add_argument("--max-rate-under", metavar="SLO",
                   help='search each point\'s highest arrival rate meeting this SLO, e.g. '
                        '"p99_ttft_ms<=500,p99_tpot_ms<=50" (vllm bench serve\'s metric names; bisection on '
                        'replays; the replay at the answer is the row, and 5 %% above it misses)')
    g.add_argument("--out", metavar="DIR", help="write results, plan.json and report.html here; each "
                   "point is kept in DIR/points.jsonl as it finishes")
    g.add_argument("--resume", action="store_true",
                   help="run only the points not yet in --out's points.jsonl (an interrupted plan, "
                        "the same command)")
    g.add_argument("--format", default="csv,parquet,json", help="results formats (default %(default)s)")
    g.add_argument("--backend", choices=("local", "ray"), default="local")
    g.add_argument("--address", help="Ray cluster address (backend ray); default: a local Ray")
    g.add_argument("--jobs", type=options.positive_int, default=1,
                   help="local worker processes (default 1)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    options.add_model_gpu_args(p)
    options.add_pool_args(p, explicit_size=False)
    options.add_scheduler_args(p, batch_defaults=None)
    options.add_step_time_args(p)
    options.add_serving_args(p)
    options.add_offload_args(p)
    p.set_defaults(func=run)
