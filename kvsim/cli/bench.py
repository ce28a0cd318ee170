"""``kvsim bench``: a workload replayed as ``vllm bench serve`` measures it, under its names.

    kvsim bench 'random:isl=1024,osl=128,n=640,concurrency=64' --model Llama-3.1-8B --gpu h200 \\
        [--goodput ttft:500 tpot:50] [--metric-percentiles 50,90,99] [--result-json kvsim.json] \\
        [--compare vllm.json]

Every replay flag applies (pool, scheduler, step time, ``--max-concurrency``). The run's figures
are vllm bench serve's (simulator.serve_metrics: its formulas and result-JSON keys), printed as
its "Serving Benchmark Result" table; ``--result-json`` writes them under its names, so that a
prediction diffs against a measured run. ``--compare F`` reads a ``vllm bench serve
--save-result`` JSON and prints both side by side with the error of each metric (kvsim against
the measured run; the measured file's own percentiles are computed too).
"""
from __future__ import annotations

import json
import math
import re
import sys

from kvsim.cli import options
from kvsim.errors import InputError, json_problem

# the table's rows: (result key, label), as vllm bench serve prints them
HEADLINE = (("completed", "Successful requests:"), ("failed", "Failed requests:"),
            ("duration", "Benchmark duration (s):"), ("total_input_tokens", "Total input tokens:"),
            ("total_output_tokens", "Total generated tokens:"),
            ("request_throughput", "Request throughput (req/s):"),
            ("request_goodput", "Request goodput (req/s):"),
            ("output_throughput", "Output token throughput (tok/s):"),
            ("max_output_tokens_per_s", "Peak output token throughput (tok/s):"),
            ("max_concurrent_requests", "Peak concurrent requests:"),
            ("total_token_throughput", "Total token throughput (tok/s):"))
SECTIONS = (("ttft", "TTFT", "Time to First Token"), ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
            ("itl", "ITL", "Inter-token Latency"), ("e2el", "E2EL", "End-to-end Latency"),
            ("client_queue_time", "Client Queue Time", "Client-side Queueing"),
            ("e2el_including_client_queue", "E2EL incl. Client Queue", "Queue-inclusive End-to-end Latency"))
# what --compare sets side by side, besides each section's mean, median and percentiles
COMPARED = ("duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
            "request_goodput", "output_throughput", "total_token_throughput")
_PCT = re.compile(r"^p(\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")


def register(subparsers) -> None:
    """Add ``kvsim bench``."""
    from kvsim.cli.replay import add_replay_args

    p = subparsers.add_parser(
        "bench", help="replay a workload and report vllm bench serve's metrics",
        description="Replay a workload (a random: spec for vllm bench serve's random dataset, any "
                    "trace or spec with --max-concurrency) and report vllm bench serve's metrics under "
                    "its names; compare them with a measured vllm bench serve result JSON.")
    add_replay_args(p)
    g = p.add_argument_group("benchmark metrics (vllm bench serve's)")
    g.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="SLOs for request goodput, as vllm bench serve's: ttft:MS tpot:MS e2el:MS")
    g.add_argument("--metric-percentiles", default="90,99", metavar="P1,P2",
                   help="percentiles of TTFT, TPOT, ITL and E2EL to report (default %(default)s; "
                        "median and mean always)")
    g.add_argument("--result-json", metavar="F", help="write the metrics under vllm bench serve's result keys")
    g.add_argument("--compare", metavar="F",
                   help="a vllm bench serve result JSON (--save-result) to set beside kvsim's, with the "
                        "error of each metric")
    p.set_defaults(func=run)


def read_result_json(path: str) -> dict:
    """A vllm bench serve result JSON; InputError naming the file (and line) when it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror or err})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"not JSON: {json_problem(err)}", file=path, line=err.lineno) from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object of vllm bench serve's result keys")
    known = [k for k in data if k in COMPARED or _PCT.match(k) or k.startswith(("mean_", "median_"))]
    if not known:
        raise InputError(f"{path}: no vllm bench serve metric in it (such as request_throughput, mean_ttft_ms)")
    for key in known:
        value = data[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise InputError(f"{path}: {key} is not a number: {value!r}", field=key)
    return data


def _request_rate(args) -> float:
    """The configured send rate (inf: all at once), as vllm bench serve's --request-rate."""
    from kvsim.workloads import workload_from_spec
    from kvsim.workloads.source import is_spec

    if args.rate is not None:
        return float(args.rate)
    if is_spec(args.workload, args.format):
        return float(getattr(workload_from_spec(args.workload).arrival, "rate", math.nan))
    return math.nan     # a trace's own times


def run(args) -> int:
    from kvsim.cli.outputs import write_files
    from kvsim.cli.replay import overload_message, run_one
    from kvsim.simulator.result import json_text, prepare_output
    from kvsim.simulator.serve_metrics import parse_goodput, parse_percentiles, serve_metrics

    try:
        goodput = parse_goodput(args.goodput or [])
        percentiles = parse_percentiles(args.metric_percentiles)
    except ValueError as err:
        raise InputError(str(err)) from None
    measured = read_result_json(args.compare) if args.compare else None
    if measured is not None:   # the measured run's own percentiles, to set beside
        percentiles = sorted(set(percentiles) | {float(m.group(1)) for m in map(_PCT.match, measured) if m})
    if args.result_json:
        prepare_output(args.result_json)
    limit = options.max_concurrency(args)
    rate = _request_rate(args)
    result = run_one(args, args.allocator, record_token_times=True)
    metrics = serve_metrics(result.requests, result.token_times, percentiles=percentiles,
                            goodput=goodput or None, max_concurrency=limit, request_rate=rate)
    metrics.update({"backend": "kvsim", "num_prompts": len(result.requests),
                    "request_rate": rate if not math.isnan(rate) else None,
                    "max_concurrency": limit, "kvsim": result.summary["config"]})
    print(f"clock: {result.summary['config']['clock']}")
    print(format_result(metrics, percentiles, limit, rate))
    if measured is not None:
        print(format_compare(metrics, measured, args.compare))
    message = overload_message(result.summary, result.timeseries)
    if message:
        print(f"kvsim: warning: {message}", file=sys.stderr)
    if args.result_json:
        write_files([(args.result_json, lambda: _write(args.result_json, json_text(metrics)))])
    return 0


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")


def format_result(m: dict, percentiles, max_concurrency, rate) -> str:
    """vllm bench serve's "Serving Benchmark Result" table of the metrics ``m``."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]
    for key, label in HEADLINE:
        if key == "failed" and m.get("failed") is not None:
            lines.append(f"{label:<40} {m[key]:<10}")
            if max_concurrency is not None:
                lines.append(f"{'Maximum request concurrency:':<40} {max_concurrency:<10}")
            if not (math.isnan(rate) or math.isinf(rate)):
                lines.append(f"{'Request rate configured (RPS):':<40} {rate:<10.2f}")
            continue
        value = m.get(key)
        if value is None:
            continue
        lines.append(f"{label:<40} {value:<10}" if isinstance(value, int) else f"{label:<40} {value:<10.2f}")
    from kvsim.simulator.serve_metrics import percentile_key
    for name, short, header in SECTIONS:
        if f"mean_{name}_ms" not in m:
            continue
        lines.append("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        lines.append(f"{f'Mean {short} (ms):':<40} {m[f'mean_{name}_ms']:<10.2f}")
        lines.append(f"{f'Median {short} (ms):':<40} {m[f'median_{name}_ms']:<10.2f}")
        for p in percentiles:
            key = percentile_key(p)
            lines.append(f"{f'{key.upper()} {short} (ms):':<40} {m[f'{key}_{name}_ms']:<10.2f}")
    lines.append("=" * 50)
    return "\n".join(lines)


def compared_keys(kvsim: dict, measured: dict) -> list[str]:
    """The metrics both results have, in the table's order."""
    keys = [k for k in COMPARED if k in kvsim and k in measured]
    for name, _, _ in SECTIONS[:4]:
        for key in sorted((k for k in measured if k.endswith(f"_{name}_ms") and not k.startswith("std_")),
                          key=lambda k: (not k.startswith("mean_"), not k.startswith("median_"),
                                         float(_PCT.match(k).group(1)) if _PCT.match(k) else 0)):
            if key in kvsim:
                keys.append(key)
    return keys


def format_compare(kvsim: dict, measured: dict, path: str) -> str:
    """kvsim's metrics beside the measured run's, with kvsim's error of each (percent)."""
    rows = [f"{'metric':<28} {'kvsim':>12} {'measured':>12} {'error':>9}"]
    for key in compared_keys(kvsim, measured):
        ours, theirs = kvsim[key], measured[key]
        if ours is None or theirs is None:
            continue
        err = f"{100 * (ours - theirs) / theirs:+.1f} %" if theirs else "n/a"
        rows.append(f"{key:<28} {ours:>12.2f} {theirs:>12.2f} {err:>9}")
    if len(rows) == 1:
        rows.append("(no metric in common)")
    return f"kvsim against {path} (error = (kvsim - measured) / measured)\n" + "\n".join(rows)
