"""How close is the simulated clock to a real GPU? Hardware-in-the-loop runs against the cost models.

    # on the GPU machine (kvsim installed): the hardware-in-the-loop runs, packed into one file
    python bench/accuracy.py hil --traces DIR --out DIR
    # on any machine: the same workloads simulated with the measured table and with the roofline,
    # compared with the hardware-in-the-loop runs, step by step and request by request
    python bench/accuracy.py analyse --hil DIR --table TABLE.csv [--traces DIR] [--md OUT.md]
    # trace excerpts to carry to the GPU machine (never committed)
    python bench/accuracy.py excerpts --traces ../shared/traces --out DIR

Workloads (none was used to build the table, which is a grid of synthetic step shapes): synthetic
ShareGPT at two loads, the head of the Azure conversation trace, the head of the Mooncake
conversation trace (prefix hits). Engine: Llama-3.1-8B on an H200, vLLM's pool formula at
gpu_memory_utilization 0.88 (the executor's pool has as many blocks), 256 sequences, 8192 tokens.

Errors: per step |predicted / measured - 1| over every step of the hardware-in-the-loop run (the
models priced on each step's StepBatch); per request |simulated / measured - 1| of TTFT, TPOT and
E2E, the simulation being a separate replay of the same workload on the model's clock.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import time
from pathlib import Path

WORKLOADS = [  # name, workload (``{traces}`` = the excerpts folder), extra replay flags
    ("sharegpt-rate4", "sharegpt:rate=4,n=60,seed=11", []),
    ("sharegpt-rate16", "sharegpt:rate=16,n=160,seed=12", []),
    ("azure-conv", "{traces}/azure_conv_head.csv", ["--max-requests", "80"]),
    ("mooncake", "{traces}/mooncake_conv_head.jsonl", ["--max-requests", "40"]),
]
EXCERPTS = {"azure_conv_head.csv": ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv", 1 + 150),
            "mooncake_conv_head.jsonl": ("mooncake/conversation_trace.jsonl", 80)}
DRY_ENGINE = ["--num-blocks", "3000", "--max-num-seqs", "16", "--max-num-batched-tokens", "256",
              "--max-model-len", "131072", "--quiet"]
ENGINE = ["--model", "Llama-3.1-8B", "--gpu", "H200", "--gpu-memory-utilization", "0.88",
          "--max-num-seqs", "256", "--max-num-batched-tokens", "8192", "--max-model-len", "131072"]


def kvsim(argv: list[str]) -> None:
    from kvsim.cli import main
    code = main(argv)
    if code:
        raise SystemExit(f"kvsim {' '.join(argv)} exited {code}")


def workload_arg(spec: str, traces: str | None) -> str:
    if "{traces}" in spec:
        if traces is None:
            raise SystemExit("--traces is needed for the trace excerpts")
        return spec.format(traces=traces)
    return spec


def cmd_excerpts(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, (src, lines) in EXCERPTS.items():
        with open(Path(args.traces) / src) as f:
            head = [next(f) for _ in range(lines)]
        (out / name).write_text("".join(head))
        print(f"{out / name}: {lines} lines")
    return 0


# wall seconds per request of each workload's latest H200 run (2026-12-01, no compile stalls): the
# deadline scales the workloads marked scalable to the time that is left and skips the others
# that would not end before it
WALL_S_PER_REQUEST = {"sharegpt-rate4": 1.4, "sharegpt-rate16": 0.43, "azure-conv": 1.4, "mooncake": 1.12}
SCALABLE = {"mooncake": 16}     # name -> the fewest requests worth running
STARTED = time.monotonic()


def _pack(out: Path, name: str, files: list[Path]) -> None:
    """``out/name.tar.gz`` of ``files``, written under another name first and renamed: a command
    killed at its time limit leaves whole archives only."""
    tmp = out / f".{name}.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for path in files:
            tar.add(path, arcname=path.name)
    os.replace(tmp, out / f"{name}.tar.gz")


def _max_requests(name: str, extra: list[str], deadline_s: float | None, reserve_s: float,
                  slowdown: float) -> list[str] | None:
    """The workload's flags with --max-requests cut to what fits before the deadline (None: skip)."""
    if deadline_s is None:
        return extra
    left = deadline_s - (time.monotonic() - STARTED) - reserve_s
    fit = int(left / (WALL_S_PER_REQUEST[name] * slowdown))
    if name not in SCALABLE:
        return extra if fit >= _num_requests(name) else None
    n = int(extra[extra.index("--max-requests") + 1])
    if fit < SCALABLE[name]:
        return None
    i = extra.index("--max-requests") + 1
    return extra[:i] + [str(min(n, fit))] + extra[i + 1:]


def _num_requests(name: str) -> int:
    spec, extra = next((spec, extra) for n, spec, extra in WORKLOADS if n == name)
    if "--max-requests" in extra:
        return int(extra[extra.index("--max-requests") + 1])
    return int(spec.split("n=")[1].split(",")[0])


def cmd_hil(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or out / "work")
    work.mkdir(parents=True, exist_ok=True)
    names = [w for w in WORKLOADS if not args.only or w[0] in args.only]
    names.sort(key=lambda w: args.only.index(w[0]) if args.only else 0)   # --only gives the order
    engine, device = ENGINE, "cuda"
    if args.dry_run:   # the same code path on the CPU: a tiny model, a small pool, few requests
        engine, device = DRY_ENGINE + ["--hf-config", args.dry_run], "cpu"
        names = [(n, spec, ["--max-requests", "2"]) for n, spec, _ in names]
    reserve_s = args.context_grid_s if args.context_grid_s and not args.grid_first else 0.0
    expected = actual = 0.0
    for name, spec, extra in names:
        slowdown = max(1.0, actual / expected) if expected else 1.0
        flags = _max_requests(name, extra, args.deadline_s, reserve_s, slowdown)
        if flags is None:
            print(f"  {name}: skipped, too little time left before the deadline", flush=True)
            continue
        files = [work / f"{name}.json", work / f"{name}_steps.csv", work / f"{name}_requests.csv"]
        argv = ["replay", workload_arg(spec, args.traces), *engine, *flags, "--execute", device,
                "--out", str(files[0]), "--timeseries", str(files[1]), "--requests", str(files[2])]
        print("kvsim " + " ".join(argv), flush=True)
        if "--quiet" not in argv:
            argv.append("--quiet")
        started = time.monotonic()
        try:
            kvsim(argv)
        except (Exception, SystemExit):   # the next workloads and the grid still run
            import traceback
            traceback.print_exc()
            continue
        wall = time.monotonic() - started
        summary = json.loads(files[0].read_text())
        n = summary["requests_arrived"]
        expected += WALL_S_PER_REQUEST[name] * n
        actual += wall
        print(f"  {name}: {n} requests, {summary['num_steps']} steps, {summary['simulated_duration_s']:.1f} s "
              f"simulated, wall {wall:.1f} s (engine {summary['wall_clock_s']:.1f} s); "
              f"{time.monotonic() - STARTED:.0f} s since start", flush=True)
        # packed after every workload: a run cut short still brings back the finished ones
        _pack(out, name, files)
        if args.grid_first and args.context_grid_s:     # on the first run's executor, then the rest
            context_grid_table(out / "context_grid.csv", args.context_grid_s, dry=bool(args.dry_run),
                               skip=args.grid_skip)
            args.context_grid_s = 0.0
    if args.context_grid_s:
        context_grid_table(out / "context_grid.csv", args.context_grid_s if args.deadline_s is None else
                           args.deadline_s - (time.monotonic() - STARTED) - 5, dry=bool(args.dry_run),
                           skip=args.grid_skip)
    return 0


def _measured_shapes(table: str | None) -> set:
    """(kind, num_seqs, num_scheduled_tokens, kv_read_tokens, max_context_tokens) of a table's rows."""
    if table is None:
        return set()
    from kvsim.simulator.cost_table import read_table
    _, _, rows = read_table(table)
    return {(r["kind"], int(r["num_seqs"]), int(r["num_scheduled_tokens"]), int(r["kv_read_tokens"]),
             int(r.get("max_context_tokens") or 0)) for _, r in rows}


def _shape(pt) -> tuple:
    t = pt.totals()
    return (pt.kind, t["num_seqs"], t["num_scheduled_tokens"], t["kv_read_tokens"], t["max_context_tokens"])


def check_points():
    """Shapes the floor model was not fitted to, timed to check it (not added to the table):
    uniform long contexts under a wave, and several long sequences among short ones."""
    from kvsim.kernels.profile import GridPoint
    points = [GridPoint(num_decode_seqs=b, decode_context_tokens=long) for b in (2, 4, 8, 16) for long in (8192, 32768)]
    points += [GridPoint(num_decode_seqs=b, decode_context_tokens=512, long_context_tokens=long, num_long_seqs=k)
               for b, long, k in ((32, 4096, 8), (32, 16384, 8), (128, 4096, 32), (128, 16384, 32), (8, 32768, 2))]
    return points


def context_grid_table(path: Path, budget_s: float, dry: bool, skip: str | None = None) -> None:
    """``kernels.profile.context_grid`` (long and unequal contexts) timed on the executor of the
    runs above (the same pool, limits and graphs), within ``budget_s``, leaving out the shapes
    ``skip`` (a table) measured, then ``check_points``; each row is appended to
    ``path``.partial.csv as it is measured, the table (with provenance) written at the end."""
    import csv

    from kvsim.cli.execute import _EXECUTORS
    from kvsim.kernels.profile import COLUMNS, GridPoint, context_grid, profile_grid, provenance, write_table
    if not _EXECUTORS:
        print("  context grid: no executor (no workload ran)", flush=True)
        return
    ex = next(iter(_EXECUTORS.values()))
    limits = dict(max_num_seqs=ex.max_num_seqs, max_num_batched_tokens=ex.max_num_batched_tokens,
                  max_model_len=ex.max_model_len, num_blocks=ex.num_blocks - 1, block_size=ex.block_size)
    # uniform decodes the shipped table measured (at max_model_len 32768): the same executor as the runs?
    points = [GridPoint(num_decode_seqs=b, decode_context_tokens=1024) for b in (8, 64, 256)]
    done = _measured_shapes(skip)
    points += [pt for pt in context_grid(**limits) if _shape(pt) not in done] + check_points()
    if dry:   # the CPU check: the first decode and mixed points of the engine's grid, contexts / 64
        import dataclasses
        grid = [pt for pt in context_grid(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=131072,
                                          num_blocks=1 << 30, block_size=16)]
        picked = [pt for pt in grid if pt.kind == "decode"][:2] + [pt for pt in grid if pt.kind == "mixed"][:1]
        points = [dataclasses.replace(pt, num_decode_seqs=min(pt.num_decode_seqs, ex.max_num_seqs - 1),
                                      decode_context_tokens=pt.decode_context_tokens // 64,
                                      long_context_tokens=pt.long_context_tokens // 64,
                                      prefill_tokens=pt.prefill_tokens // 64, prefix_tokens=pt.prefix_tokens // 64)
                  for pt in picked]
    partial = path.with_suffix(".partial.csv")
    with open(partial, "w", newline="") as f:
        csv.writer(f).writerow(COLUMNS)

    def progress(done, total, row):
        with open(partial, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore").writerow(row)
        if done % 10 == 0 or done == total:
            print(f"  context grid {done}/{total} ({time.monotonic() - STARTED:.0f} s since start)", flush=True)
    rows = profile_grid(ex, points, repeat=5, seed=1, progress=progress, time_budget_s=max(budget_s, 1.0))
    header = provenance(ex, "python bench/accuracy.py hil --context-grid-s ...", 5)
    header["grid"] = (f"{len(rows)} of {len(points)} step shapes of kernels.profile.context_grid (+3 uniform "
                      "decodes), on the executor of the hardware-in-the-loop runs")
    write_table(path, rows, header)
    print(f"  context grid: {len(rows)} of {len(points)} shapes -> {path}", flush=True)


def _errors(pred, meas):
    import numpy as np
    pred, meas = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    ok = meas > 0
    return np.abs(pred[ok] / meas[ok] - 1.0)


def _stats(err) -> str:
    import numpy as np
    if len(err) == 0:
        return "-"
    return f"{100 * np.median(err):.1f} % / {100 * np.percentile(err, 90):.1f} %"


STALL_EXCESS_S = 1.5   # a step this much slower than its neighbours' median compiled a kernel


def stall_steps(measured):
    """Steps whose time holds a just-in-time compile (runs made before the executor re-timed such
    steps): more than STALL_EXCESS_S over the median of the 10 steps around them."""
    import numpy as np
    import pandas as pd
    m = pd.Series(np.asarray(measured, dtype=float))
    local = m.rolling(11, center=True, min_periods=1).median()
    return (m - local > STALL_EXCESS_S).to_numpy()


STEP_COLUMNS_KEPT = ("step", "sched_reqs", "sched_tokens", "prefill_tokens", "decode_reqs", "kv_read_tokens",
                     "attn_token_pairs", "max_context_tokens", "measured_step_s", "predicted_step_s", "step_start_s")
REQUEST_COLUMNS_KEPT = ("request_id", "ttft_s", "tpot_s", "e2e_s")   # no lengths: those are the trace's


def cmd_keep(args) -> int:
    """Copy runs' series into the results folder, trimmed to what ``analyse`` reads (the request
    tables without prompt and output lengths, which belong to the traces)."""
    import pandas as pd
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for d in map(Path, args.hil):
        _unpack(d)
        for path in sorted(d.glob("*_steps.csv")) + sorted(d.glob("*_requests.csv")):
            frame = pd.read_csv(path)
            cols = STEP_COLUMNS_KEPT if path.name.endswith("_steps.csv") else REQUEST_COLUMNS_KEPT
            frame[[c for c in cols if c in frame.columns]].to_csv(out / path.name, index=False)
            print(f"{out / path.name}: {len(frame)} rows")
        for path in d.glob("*.json"):
            summary = json.loads(path.read_text())
            keep = {k: summary[k] for k in ("requests_arrived", "num_steps", "simulated_duration_s", "wall_clock_s")}
            (out / path.name).write_text(json.dumps(keep, indent=1) + "\n")
    return 0


def _unpack(d: Path) -> None:
    for archive in d.glob("*.tar.gz"):     # hil.tar.gz of older runs, else one per workload
        with tarfile.open(archive) as tar:
            tar.extractall(d, filter="data")


def _replay_args(spec: str, extra: list[str], traces: str | None):
    from kvsim.cli import build_parser
    return build_parser("replay").parse_args(["replay", workload_arg(spec, traces), *ENGINE, *extra, "--out", "unused"])


def _simulate(args, cost, *, record_steps: bool = False):
    """The workload of ``args`` on the engine of ``args`` with ``cost`` as its clock."""
    from kvsim import workloads
    from kvsim.cli import options
    from kvsim.planner.engine_setup import build_engine
    from kvsim.simulator import simulate
    setup = build_engine(**options.engine_kwargs(args))
    requests = workloads.load(args.workload, format=args.format, max_requests=args.max_requests, rate=args.rate,
                              seed=args.seed)
    return simulate(requests, setup.config, cost if cost is not None else setup.cost, seed=args.seed,
                    record_steps=record_steps)


def retrace(args, steps):
    """The hardware-in-the-loop run's schedule again, every step lasting what it measured: the
    simulator's decisions depend only on the durations, so this is the same run (checked step by
    step), and its series has what the recorded one may lack (``max_context_tokens``)."""
    from kvsim.simulator.in_the_loop import InTheLoopCost
    measured = steps["measured_step_s"].to_numpy()
    frame = _simulate(args, InTheLoopCost(lambda step: float(measured[step.step_index])), record_steps=True).timeseries
    for col in ("sched_tokens", "kv_read_tokens", "attn_token_pairs"):
        if len(frame) != len(steps) or (frame[col].to_numpy() != steps[col].to_numpy()).any():
            raise SystemExit(f"the retrace of {args.workload} does not schedule as the run did ({col})")
    return frame


def _kind(frame):
    import numpy as np
    decode = frame["sched_tokens"].to_numpy() == frame["sched_reqs"].to_numpy()
    return np.where(decode, "decode", np.where(frame["sched_tokens"].to_numpy() <= 512, "mixed<=512", "mixed>512"))


def cmd_analyse(args) -> int:
    import numpy as np
    import pandas as pd

    from kvsim.planner.presets import get_gpu, get_model
    from kvsim.planner.roofline import RooflineCost
    from kvsim.simulator.cost import ScaledCost, StepBatch
    from kvsim.simulator.cost_table import load_cost_table
    dirs = [Path(d) for d in args.hil]
    for d in dirs:
        _unpack(d)
    models = {"roofline (default)": RooflineCost(get_model("Llama-3.1-8B"), get_gpu("H200"))}
    for item in args.table:
        label, _, path = item.rpartition("=")
        models[f"calibrated ({label or Path(path).stem})"] = load_cost_table(path)
    last = list(models)[-1]
    report = {"workloads": {}}
    step_rows, kind_rows, req_rows, pooled = [], [], [], {m: [] for m in models}
    for name, spec, extra in WORKLOADS:
        found = [d for d in dirs if (d / f"{name}_steps.csv").exists()]
        if not found:
            print(f"{name}: no hardware-in-the-loop run in {', '.join(map(str, dirs))}, skipped", file=sys.stderr)
            continue
        hil = found[0]
        label = f"{name} ({hil.name})"
        summary_path = hil / f"{name}.json"
        if summary_path.exists():    # a run cut to the time left ran fewer requests
            n = json.loads(summary_path.read_text())["requests_arrived"]
            extra = [*extra[:extra.index("--max-requests") + 1], str(n)] if "--max-requests" in extra else extra
        rargs = _replay_args(spec, extra, args.traces)
        steps = pd.read_csv(hil / f"{name}_steps.csv")
        if "max_context_tokens" not in steps.columns:
            steps["max_context_tokens"] = retrace(rargs, steps)["max_context_tokens"].to_numpy()
        stalls = stall_steps(steps["measured_step_s"])
        clean = steps[~stalls]
        batches = [StepBatch(int(r.sched_reqs), int(r.prefill_tokens), int(r.decode_reqs), int(r.sched_tokens),
                             int(r.kv_read_tokens), int(r.attn_token_pairs), int(r.max_context_tokens))
                   for r in clean.itertuples()]
        measured = clean["measured_step_s"].to_numpy()
        kinds = _kind(clean)
        entry = report["workloads"][label] = {"steps": int(len(clean)), "stalls": int(stalls.sum()), "models": {}}
        req_path = hil / f"{name}_requests.csv"
        hil_req = pd.read_csv(req_path).set_index("request_id") if req_path.exists() else None
        sims = {}
        for model, cost in models.items():
            pred = np.array([cost.step_time_s(b) for b in batches])
            signed = pred / measured - 1
            err = np.abs(signed)
            pooled[model].append(err)
            e = entry["models"][model] = {"step_median": float(np.median(err)), "step_p90": float(np.percentile(err, 90))}
            step_rows.append((label, model, f"{len(err)} (+{int(stalls.sum())} stalls)", _stats(err)))
            cells = []
            for kind in ("decode", "mixed<=512", "mixed>512"):
                sel = kinds == kind
                cells.append(f"{sel.sum()}: {100 * np.median(signed[sel]):+.1f} %, {_stats(err[sel])}" if sel.any() else "-")
            kind_rows.append((label, model, *cells))
            if hil_req is None:
                req_rows.append([label, model, "-", "no request table"] + [""] * 5)
                continue
            if stalls.any():
                req_rows.append([label, model, "-", f"not compared: the run's clock holds {int(stalls.sum())} compile "
                                 "stalls"] + [""] * 5)
                continue
            sims[model] = _simulate(rargs, cost).requests.set_index("request_id")
            req_rows.append([label, model, *_request_cells(hil_req, sims[model], e)])
        if sims:   # how far a 1 % faster clock moves requests: the noise floor of per-request errors
            scaled = _simulate(rargs, ScaledCost(models[last], 1.01)).requests.set_index("request_id")
            e = entry["sensitivity"] = {}
            req_rows.append([label, f"{last} x1.01 vs itself", *_request_cells(sims[last], scaled, e)])
    lines = ["### Step time: |predicted / measured - 1|, median / p90", "",
             "| workload (run) | model | steps | median / p90 |", "| --- | --- | ---: | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in step_rows]
    for model, errs in pooled.items():
        if errs:
            allerr = np.concatenate(errs)
            report.setdefault("all", {})[model] = {"steps": int(len(allerr)), "step_median": float(np.median(allerr)),
                                                   "step_p90": float(np.percentile(allerr, 90))}
            lines.append(f"| **all** | {model} | {len(allerr)} | **{_stats(allerr)}** |")
    lines += ["", "### By kind of step: count: signed median of predicted / measured - 1, |error| median / p90", "",
              "| workload (run) | model | decode-only | mixed <= 512 tokens | mixed > 512 tokens |",
              "| --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(row) + " |" for row in kind_rows]
    lines += ["", "### Per request: |simulated / measured - 1|, median / p90 (and the error of the mean)", "",
              "| workload (run) | model | requests | TTFT | mean TTFT | TPOT | mean TPOT | E2E | mean E2E |",
              "| --- | --- | ---: | --- | ---: | --- | ---: | --- | ---: |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in req_rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return 0


def _request_cells(truth, sim, into: dict) -> list:
    """Per-request cells (count, then median / p90 and mean error of TTFT, TPOT, E2E) of ``sim``
    against ``truth`` (request tables indexed by request id); figures also go to ``into``."""
    import numpy as np
    both = truth.merge(sim, left_index=True, right_index=True, suffixes=("", "_sim"))
    cells = [len(both)]
    for metric in ("ttft_s", "tpot_s", "e2e_s"):
        pair = both[[metric, metric + "_sim"]].dropna()
        err = _errors(pair[metric + "_sim"], pair[metric])
        mean = abs(pair[metric + "_sim"].mean() / pair[metric].mean() - 1)
        into[metric] = {"median": float(np.median(err)), "p90": float(np.percentile(err, 90)), "mean": float(mean)}
        cells += [_stats(err), f"{100 * mean:.1f} %"]
    return cells


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("excerpts")
    p.add_argument("--traces", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("hil")
    p.add_argument("--traces")
    p.add_argument("--out", required=True)
    p.add_argument("--only", nargs="*", help="workload names (default: all)")
    p.add_argument("--dry-run", metavar="CONFIG_JSON", help="CPU check: this tiny config.json, 2 requests each")
    p.add_argument("--work", help="where the replays write (default OUT/work); OUT gets one archive per workload")
    p.add_argument("--deadline-s", type=float, help="wall seconds from start: scalable workloads are cut to fit")
    p.add_argument("--context-grid-s", type=float, default=0.0,
                   help="then time kernels.profile.context_grid on the same executor (seconds kept for it)")
    p.add_argument("--grid-first", action="store_true", help="time the grid after the first workload, not the last")
    p.add_argument("--grid-skip", metavar="TABLE", help="leave out the grid shapes this table measured")
    p = sub.add_parser("analyse")
    p.add_argument("--hil", required=True, nargs="+", help="run folders, the first holding a workload wins")
    p.add_argument("--table", required=True, nargs="+", metavar="[LABEL=]TABLE",
                   help="measured tables, each a calibrated model (the last one's sensitivity is shown)")
    p.add_argument("--traces")
    p.add_argument("--md")
    p.add_argument("--json", help="every figure as JSON")
    p = sub.add_parser("keep", help="runs' series, trimmed, into the results folder")
    p.add_argument("--hil", required=True, nargs="+")
    p.add_argument("--out", required=True)
    args = parser.parse_args()
    return {"excerpts": cmd_excerpts, "hil": cmd_hil, "analyse": cmd_analyse, "keep": cmd_keep}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
