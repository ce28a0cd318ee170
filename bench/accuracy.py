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
import contextlib
import io
import json
import sys
import tarfile
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


def cmd_hil(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [w for w in WORKLOADS if not args.only or w[0] in args.only]
    engine, device = ENGINE, "cuda"
    if args.dry_run:   # the same code path on the CPU: a tiny model, a small pool, few requests
        engine, device = DRY_ENGINE + ["--hf-config", args.dry_run], "cpu"
        names = [(n, spec, ["--max-requests", "4"]) for n, spec, _ in names]
    for name, spec, extra in names:
        argv = ["replay", workload_arg(spec, args.traces), *engine, *extra, "--execute", device,
                "--out", str(out / f"{name}.json"), "--timeseries", str(out / f"{name}_steps.csv"),
                "--requests", str(out / f"{name}_requests.csv")]
        print("kvsim " + " ".join(argv), flush=True)
        if "--quiet" not in argv:
            argv.append("--quiet")
        kvsim(argv)
        summary = json.loads((out / f"{name}.json").read_text())
        print(f"  {name}: {summary['num_steps']} steps, {summary['simulated_duration_s']:.1f} s simulated, "
              f"wall {summary['wall_clock_s']:.1f} s", flush=True)
        # packed after every workload: a run cut short still brings back the finished ones
        with tarfile.open(out / "hil.tar.gz", "w:gz") as tar:
            for path in sorted(out.iterdir()):
                if path.name != "hil.tar.gz":
                    tar.add(path, arcname=path.name)
    return 0


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


def cmd_analyse(args) -> int:
    import numpy as np
    import pandas as pd

    from kvsim.planner.presets import get_gpu, get_model
    from kvsim.planner.roofline import RooflineCost
    from kvsim.simulator.cost import StepBatch
    from kvsim.simulator.cost_table import load_cost_table
    dirs = [Path(d) for d in args.hil]
    for d in dirs:
        if (d / "hil.tar.gz").exists() and not any(d.glob("*_steps.csv")):
            with tarfile.open(d / "hil.tar.gz") as tar:
                tar.extractall(d, filter="data")
    table = load_cost_table(args.table)
    roofline = RooflineCost(get_model("Llama-3.1-8B"), get_gpu("H200"))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    models = {"calibrated (table)": ["--cost-table", args.table], "roofline (default)": []}
    step_rows, req_rows, all_steps = [], [], {m: [] for m in models}
    for name, spec, extra in WORKLOADS:
        found = [d for d in dirs if (d / f"{name}_steps.csv").exists()]
        if not found:
            print(f"{name}: no hardware-in-the-loop run in {', '.join(map(str, dirs))}, skipped", file=sys.stderr)
            continue
        hil = found[0]
        steps = pd.read_csv(hil / f"{name}_steps.csv")
        stalls = stall_steps(steps["measured_step_s"])
        clean = steps[~stalls]
        batches = [StepBatch(int(r.sched_reqs), int(r.prefill_tokens), int(r.decode_reqs), int(r.sched_tokens),
                             int(r.kv_read_tokens), int(r.attn_token_pairs)) for r in clean.itertuples()]
        measured = clean["measured_step_s"].to_numpy()
        preds = {"calibrated (table)": [table.step_time_s(b) for b in batches],
                 "roofline (default)": [roofline.step_time_s(b) for b in batches]}
        req_path = hil / f"{name}_requests.csv"
        hil_req = pd.read_csv(req_path).set_index("request_id") if req_path.exists() else None
        for model, flags in models.items():
            err = _errors(preds[model], measured)
            all_steps[model].append(err)
            step_rows.append((f"{name} ({hil.name})", model, f"{len(err)} (+{int(stalls.sum())} stalls)", _stats(err)))
            if hil_req is None:
                req_rows.append([f"{name} ({hil.name})", model, "-", "no request table"] + [""] * 5)
                continue
            if stalls.any():
                req_rows.append([f"{name} ({hil.name})", model, "-", *(["not compared: the run's clock holds "
                                 f"{int(stalls.sum())} compile stalls"] + [""] * 5)])
                continue
            sim_path = work / f"{name}_{model.split()[0]}_requests.csv"
            with contextlib.redirect_stdout(io.StringIO()):
                kvsim(["replay", workload_arg(spec, args.traces), *ENGINE, *extra, *flags, "--quiet",
                       "--out", str(work / f"{name}_{model.split()[0]}.json"), "--requests", str(sim_path)])
            sim = pd.read_csv(sim_path).set_index("request_id")
            both = hil_req.join(sim, rsuffix="_sim", how="inner")
            cells = [f"{name} ({hil.name})", model, len(both)]
            for metric in ("ttft_s", "tpot_s", "e2e_s"):
                pair = both[[metric, metric + "_sim"]].dropna()
                cells.append(_stats(_errors(pair[metric + "_sim"], pair[metric])))
                cells.append(f"{100 * abs(pair[metric + '_sim'].mean() / pair[metric].mean() - 1):.1f} %")
            req_rows.append(cells)
    lines = ["### Step time: |predicted / measured - 1|, median / p90", "",
             "| workload (run) | model | steps | median / p90 |", "| --- | --- | ---: | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in step_rows]
    for model, errs in all_steps.items():
        if errs:
            pooled = np.concatenate(errs)
            lines.append(f"| **all** | {model} | {len(pooled)} | **{_stats(pooled)}** |")
    lines += ["", "### Per request: |simulated / measured - 1|, median / p90 (and the error of the mean)", "",
              "| workload (run) | model | requests | TTFT | mean TTFT | TPOT | mean TPOT | E2E | mean E2E |",
              "| --- | --- | ---: | --- | ---: | --- | ---: | --- | ---: |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in req_rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    return 0


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
    p.add_argument("--dry-run", metavar="CONFIG_JSON", help="CPU check: this tiny config.json, 6 requests each")
    p = sub.add_parser("analyse")
    p.add_argument("--hil", required=True, nargs="+", help="run folders, the first holding a workload wins")
    p.add_argument("--table", required=True)
    p.add_argument("--traces")
    p.add_argument("--work", default="runs/accuracy")
    p.add_argument("--md")
    args = parser.parse_args()
    return {"excerpts": cmd_excerpts, "hil": cmd_hil, "analyse": cmd_analyse}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
