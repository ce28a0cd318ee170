"""``kvsim replay``: replay a workload (trace file or synthetic spec) through the simulator.

    kvsim replay WORKLOAD --allocator paged --num-blocks 4096 [--out result.json] \\
        [--timeseries ts.parquet] [--requests req.csv]
    kvsim replay TRACE.csv --format vllm-oracle --step-clock --allocator paged --block-size 16 \\
        --num-blocks 1500 --max-num-seqs 128 --max-num-batched-tokens 2048 --max-model-len 8192 \\
        --out result.json --requests req.csv --timeseries steps.csv

Pool size: ``--num-blocks N`` is vLLM's num_gpu_blocks (block 0 is the null block, N-1 usable;
contiguous allocators get the same usable memory, (N-1)*block_size slots), ``--kv-tokens N`` the
usable KV slots, or by default vLLM's own formula for ``--model`` on ``--gpu``
(``--gpu-memory-utilization``, planner.capacity). Step time: ``--step-clock`` (one step = one time
unit, vLLM's step index; time series one row per step with the vLLM oracle's column names),
``--step-s S`` (fixed), ``--cost-table CSV`` (measured, simulator.cost.TableCost) or, by default,
the planner's roofline of ``--model`` on ``--gpu``. planner.engine_setup.build_engine turns the
flags into the EngineConfig and the cost model.
"""
from __future__ import annotations

import argparse
import sys

from kvsim.cli import options
from kvsim.errors import InputError


def add_replay_args(p: argparse.ArgumentParser, *, allocator: bool = True, execute: bool = False) -> None:
    """Everything a replay takes (shared by ``replay``, ``compare`` and ``validate WORKLOAD``)."""
    options.add_workload_args(p)
    options.add_model_gpu_args(p)
    options.add_pool_args(p)
    options.add_scheduler_args(p, batch_defaults=None, allocator=allocator)
    options.add_step_time_args(p)
    options.add_serving_args(p)
    options.add_offload_args(p)
    g = p.add_argument_group("recording")
    g.add_argument("--sample-interval-s", type=options.positive_float, metavar="S",
                   help="time-series period (default 1 s)")
    g.add_argument("--snapshot-times-s", default="", metavar="T1,T2",
                   help="comma-separated times of pool snapshots (kept in memory only)")
    g.add_argument("--no-decode-batching", action="store_true",
                   help="schedule every step in detail (slow; for checking)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    if execute:
        g = p.add_argument_group("hardware in the loop")
        g.add_argument("--execute", choices=("cuda", "cpu"),
                       help="run every scheduled step on the step executor (random weights of --model or "
                            "--hf-config, a pool of --num-blocks) and take its measured time as the "
                            "step's; the step cost model's prediction is recorded beside (cpu: the Triton "
                            "interpreter, for tests)")


def snapshot_times(text: str) -> list[float]:
    """``--snapshot-times-s`` as seconds (each >= 0)."""
    times = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            value = float(part)
        except ValueError:
            raise InputError(f"--snapshot-times-s: not a number: {part!r}") from None
        if not value >= 0:
            raise InputError(f"--snapshot-times-s: times must be >= 0, got {part}")
        times.append(value)
    return times


def run_one(args, allocator: str, record_requests: bool = True,
            enable_prefix_caching: bool | None = None, offload: bool = True,
            record_token_times: bool = False, warn: bool = True):
    """Simulate the flags' workload with one allocator (planner.service.simulate_settings);
    returns the Result.

    Args:
        enable_prefix_caching: overrides ``--no-prefix-caching`` when given (``compare``).
        offload: honour the offload-tier flags (``compare`` runs its contiguous columns, and
            the paged one without prefix caching, without them).
        warn: print the engine's warnings (a pool vLLM would not start) on stderr first.
    """
    from kvsim.planner.engine_setup import EngineSettings
    from kvsim.planner.service import RunSettings, simulate_settings

    overrides = {} if enable_prefix_caching is None else {"enable_prefix_caching": enable_prefix_caching}
    if not offload:
        overrides.update(dict.fromkeys(options.OFFLOAD_FLAGS))
    engine = EngineSettings(**options.engine_kwargs(args, allocator=allocator, **overrides))
    settings = RunSettings(
        args.workload, engine, format=args.format, max_requests=args.max_requests,
        rate=args.rate, rate_scale=args.rate_scale, seed=args.seed, replicas=args.replicas,
        router=args.router, sample_interval_s=args.sample_interval_s,
        snapshot_times_s=tuple(snapshot_times(args.snapshot_times_s)),
        record_steps=args.step_clock, batch_decode_steps=not args.no_decode_batching,
        record_requests=record_requests, record_token_times=record_token_times,
        max_concurrency=options.max_concurrency(args))
    wrap = None
    if not args.quiet:   # the bar counts arrivals against the workload's size, when known
        from kvsim import workloads

        total = workloads.count_requests(args.workload, format=args.format,
                                         max_requests=args.max_requests)
        wrap = lambda requests: _progress(requests, total)  # noqa: E731
    execute = None
    if getattr(args, "execute", None):
        from kvsim.cli.execute import in_the_loop

        execute = lambda setup, requests: in_the_loop(args, setup, requests)  # noqa: E731
    say = (lambda text: print(f"kvsim: warning: {text}", file=sys.stderr)) if warn else None
    return simulate_settings(settings, wrap_requests=wrap, in_the_loop=execute, warn=say)


def _progress(requests, total: int | None):
    """A tqdm bar on stderr over the requests as the simulation pulls them (total and ETA when
    the workload's size is known); on a terminal only (``disable=None``): redirected to a file or
    a pipe, its carriage returns would be noise in front of the clock line."""
    from tqdm import tqdm

    return tqdm(requests, total=total, unit="req", desc="replay", file=sys.stderr, mininterval=0.5,
                leave=False, disable=None)


def overload_message(summary: dict, timeseries, label: str = "") -> str | None:
    """The overload warning for one run (simulator.overload), or None."""
    from kvsim.simulator.overload import overload_warning

    return overload_warning(summary, timeseries, label)


def format_summary(summary: dict) -> str:
    """The summary as ``kvsim compare``'s table (one column), printed with or without --out."""
    from kvsim.cli.table import format_table

    return format_table({"replay": summary})


def register(subparsers) -> None:
    """Add ``kvsim replay``."""
    p = subparsers.add_parser(
        "replay", help="replay a workload through one allocator",
        description="Replay a trace or synthetic workload through the vLLM-faithful scheduler "
                    "and one allocator; write the summary (JSON), time series and requests.")
    add_replay_args(p, execute=True)
    g = p.add_argument_group("outputs (checked before the run; the summary is printed either way)")
    g.add_argument("--out", help="summary JSON (stable keys)")
    g.add_argument("--timeseries", help="time series (.parquet or .csv)")
    g.add_argument("--requests", help="per-request table (.csv or .parquet)")
    p.set_defaults(func=run)


def run(args) -> int:
    from kvsim.cli.outputs import write_files
    from kvsim.simulator.result import prepare_output

    # check every output before the run: minutes of simulation must not be lost at the end
    if args.out:
        prepare_output(args.out)
    for path in (args.timeseries, args.requests):
        if path:
            prepare_output(path, (".csv", ".parquet"))
    try:
        result = run_one(args, args.allocator, record_requests=bool(args.requests))
    except KeyboardInterrupt as stop:   # Ctrl-C: the summary of what was simulated, then exit 130
        partial = getattr(stop, "partial_result", None)
        if partial is not None:
            s = partial.summary
            print(f"interrupted at {s['simulated_duration_s']:.3f} simulated s: the summary so far "
                  f"({s['requests_finished']} requests finished, {s['requests_unfinished']} unfinished; "
                  "no file written)")
            print(format_summary(s))
        raise
    s = result.summary
    print(f"clock: {s['config']['clock']}")
    print(f"{s['requests_finished']} requests finished ({s['requests_rejected']} rejected) in "
          f"{s['simulated_duration_s']:.3f} simulated s, {s['num_steps']} steps, "
          f"{s['num_preemptions']} preemptions, prefix hit rate {s['prefix_hit_rate']:.3f}, "
          f"wall {s['wall_clock_s']:.2f} s" + (f" -> {args.out}" if args.out else ""))
    if "offload" in s:
        o = s["offload"]
        print(f"offload: {', '.join(f'{k} hit {v:,} tokens' for k, v in o['hit_tokens'].items())}"
              f", connector hit rate {o['hit_rate']:.3f} (of the prompt tokens the GPU missed), "
              f"GPU + CPU hit rate "
              f"{o['combined_hit_rate']:.3f}, loaded "
              f"{sum(o['loaded_bytes'].values()) / 2**30:.1f} GiB, stored "
              f"{sum(o['stored_bytes'].values()) / 2**30:.1f} GiB")
    if "first_use_compiles" in s:
        c = s["first_use_compiles"]
        print(f"first-use compiles: {c['compiles']} priced, {c['seconds']:.2f} s of compiling ("
              + ", ".join(f"{k} {v['compiles']} ({v['seconds']:.2f} s)" for k, v in c["by_kernel"].items())
              + ")")
    print(format_summary(s))
    if s["requests_rejected"]:
        print(f"kvsim: warning: {s['requests_rejected']} requests could never fit "
              "(prompt >= max_model_len, or larger than the pool); see --requests 'rejected'",
              file=sys.stderr)
    message = overload_message(s, result.timeseries)
    if message:
        print(f"kvsim: warning: {message}", file=sys.stderr)
    write_files([(path, write) for path, write in (
        (args.out, lambda: result.write_json(args.out)),
        (args.timeseries, lambda: result.write_timeseries(args.timeseries)),
        (args.requests, lambda: result.write_requests(args.requests))) if path])
    return 0
