"""``kvsim compare``: one workload through several allocators, side by side.

    kvsim compare WORKLOAD --allocators paged,max,pow2,oracle --num-blocks 4096 [--json out.json]
    kvsim compare TRACE --allocators paged --prefix-caching on,off     # what prefix caching saves

Every allocator gets the same usable memory and the same scheduler settings (the flags are
``kvsim replay``'s, kvsim.cli.options), the scheduling mode included: ``--async-scheduling`` or,
left out, vLLM's default for its paged engine (async when the step time comes from the GPU) for
every column, so that a column differs from another by its allocator only; the table shows the time-averaged memory breakdown, batch
size, preemptions, throughput and latency percentiles, and which runs are overloaded
(simulator.overload: their latencies measure the queue).
"""
from __future__ import annotations

from pathlib import Path

from kvsim.cli import options
from kvsim.cli.replay import add_replay_args, run_one
from kvsim.cli.table import format_table
from kvsim.errors import InputError
from kvsim.simulator.config import ALLOCATORS

PREFIX_CACHING = {"on": True, "off": False}


def parse_allocators(text: str) -> list[str]:
    """``--allocators paged,max`` as a list (known names, each once)."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise InputError("--allocators: give at least one of " + ",".join(ALLOCATORS))
    for name in names:
        if name not in ALLOCATORS:
            raise InputError(f"--allocators: unknown allocator {name!r} (choose from "
                             f"{','.join(ALLOCATORS)})")
    if len(set(names)) != len(names):
        raise InputError(f"--allocators: {text!r} names an allocator twice")
    return names


def parse_prefix_caching(text: str | None) -> list[bool] | None:
    """``--prefix-caching on,off`` as [True, False] (None when not given)."""
    if text is None:
        return None
    values = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [v for v in values if v not in PREFIX_CACHING]
    if not values or bad or len(set(values)) != len(values):
        raise InputError(f"--prefix-caching: expected on, off or on,off, got {text!r}")
    return [PREFIX_CACHING[v] for v in values]


def columns(allocators: list[str], prefix_caching: list[bool] | None) -> list[tuple[str, str, bool | None]]:
    """(label, allocator, prefix caching or None for the flags' setting) per table column.

    Prefix caching is a paged-pool feature: only the paged allocator gets one column per setting.
    """
    if prefix_caching is None:
        return [(name, name, None) for name in allocators]
    if "paged" not in allocators:
        raise InputError("--prefix-caching compares the paged allocator with and without it; "
                         "add paged to --allocators")
    out = []
    for name in allocators:
        if name == "paged":
            out += [(f"paged (prefix {'on' if on else 'off'})", name, on) for on in prefix_caching]
        else:
            out.append((name, name, None))
    return out


def prefix_savings(on: dict, off: dict) -> str:
    """What prefix caching saves, from the summaries of the same run with it on and off."""
    def change(key_on, key_off, what, unit=""):
        if key_on is None or key_off is None or not key_off:
            return None
        return f"{what} {key_off:.4g}{unit} -> {key_on:.4g}{unit} ({100 * (key_on / key_off - 1):+.1f}%)"

    computed_on, computed_off = on["computed_prompt_tokens"], off["computed_prompt_tokens"]
    saved = computed_off - computed_on
    parts = [f"prefix caching saves {saved:,} of {computed_off:,} prompt tokens computed "
             f"({100 * saved / computed_off if computed_off else 0:.1f}%; hit rate "
             f"{100 * on['prefix_hit_rate']:.1f}%)"]
    for item in (change(on["output_throughput_tokens_per_s"], off["output_throughput_tokens_per_s"],
                        "output tok/s"),
                 change(on["ttft_s"]["p50"], off["ttft_s"]["p50"], "TTFT p50", " s"),
                 change(on["mean_running"], off["mean_running"], "mean running")):
        if item:
            parts.append(item)
    return "; ".join(parts)


def register(subparsers) -> None:
    """Add ``kvsim compare``."""
    p = subparsers.add_parser(
        "compare", help="one workload through several allocators, side by side",
        description="Replay one workload through several allocators with the same memory and "
                    "scheduler settings and print one table (and JSON).")
    add_replay_args(p, allocator=False)
    p.add_argument("--allocators", default=",".join(ALLOCATORS),
                   help=f"comma-separated (default {','.join(ALLOCATORS)})")
    p.add_argument("--prefix-caching", metavar="on,off",
                   help="paged allocator with prefix caching on and off side by side "
                        "(what prefix caching saves)")
    p.add_argument("--json", help="write {column: summary} here")
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    from kvsim.cli.outputs import write_files
    from kvsim.cli.replay import overload_message
    from kvsim.planner.engine_setup import build_engine
    from kvsim.simulator.result import json_text, prepare_output

    names = parse_allocators(args.allocators)
    prefix = parse_prefix_caching(args.prefix_caching)
    if prefix is not None and args.no_prefix_caching:
        raise InputError("give --prefix-caching or --no-prefix-caching, not both")
    cols = columns(names, prefix)
    if args.async_scheduling is None:
        # one mode for every column: the paged engine's default (synchronous with offload
        # tiers, which kvsim runs on the synchronous scheduler only: simulator/modes.py)
        tiers = any(name == "paged" and on is not False for _, name, on in cols)
        probe = {} if tiers else dict.fromkeys(options.OFFLOAD_FLAGS)
        if tiers and prefix is not None:
            probe["enable_prefix_caching"] = True
        args.async_scheduling = build_engine(**options.engine_kwargs(
            args, allocator="paged", **probe)).config.async_scheduling
    if args.json:
        prepare_output(args.json)
    summaries, overloaded = {}, {}
    warned = False     # the pool's warnings once, with the first paged column
    for label, name, on in cols:
        # offload tiers sit below a paged pool with prefix caching
        result = run_one(args, name, record_requests=False, enable_prefix_caching=on,
                         offload=name == "paged" and on is not False,
                         warn=name == "paged" and not warned)
        warned = warned or name == "paged"
        summaries[label] = result.summary
        message = overload_message(result.summary, result.timeseries, label)
        overloaded[label] = message is not None
        if message:
            print(f"kvsim: warning: {message}", file=sys.stderr)
    print(format_table(summaries, overloaded))
    if args.cpu_offload_gib and len(cols) > 1:
        print("offload tiers sit below the paged pool with prefix caching: the other columns run "
              "without them")
    if prefix == [True, False] or prefix == [False, True]:
        print(prefix_savings(summaries["paged (prefix on)"], summaries["paged (prefix off)"]))
    if args.json:
        write_files([(args.json, lambda: Path(args.json).write_text(json_text(summaries)))])
    return 0
