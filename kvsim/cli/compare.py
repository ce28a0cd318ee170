"""``kvsim compare``: one workload through several allocators, side by side.

    kvsim compare WORKLOAD --allocators paged,max,pow2,oracle --num-blocks 4096 [--json out.json]

Every allocator gets the same usable memory and the same scheduler settings (the flags are
``kvsim replay``'s, kvsim.cli.options); the table shows the time-averaged memory breakdown, batch
size, preemptions, throughput and latency percentiles.
"""
from __future__ import annotations

from kvsim.cli.replay import add_replay_args, run_one
from kvsim.errors import InputError
from kvsim.simulator.config import ALLOCATORS

# (label, getter) rows of the table
ROWS = (
    ("requests finished", lambda s: s["requests_finished"]),
    ("requests rejected", lambda s: s["requests_rejected"]),
    ("simulated time (s)", lambda s: s["simulated_duration_s"]),
    ("mean running", lambda s: s["mean_running"]),
    ("max running", lambda s: s["max_running"]),
    ("token states", lambda s: s["memory_breakdown"]["token_states"]),
    ("reservation", lambda s: s["memory_breakdown"]["reservation"]),
    ("internal frag.", lambda s: s["memory_breakdown"]["internal_fragmentation"]),
    ("external frag.", lambda s: s["memory_breakdown"]["external_fragmentation"]),
    ("cached", lambda s: s["memory_breakdown"]["cached"]),
    ("free", lambda s: s["memory_breakdown"]["free"]),
    ("prefix hit rate", lambda s: s["prefix_hit_rate"]),
    ("preemptions", lambda s: s["num_preemptions"]),
    ("output tok/s", lambda s: s["output_throughput_tokens_per_s"]),
    ("TTFT p50 (s)", lambda s: s["ttft_s"]["p50"]),
    ("TTFT p99 (s)", lambda s: s["ttft_s"]["p99"]),
    ("TPOT p50 (s)", lambda s: s["tpot_s"]["p50"]),
    ("E2E p50 (s)", lambda s: s["e2e_s"]["p50"]),
    ("E2E p99 (s)", lambda s: s["e2e_s"]["p99"]),
    ("wall clock (s)", lambda s: s["wall_clock_s"]),
)


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


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
    return str(value)


# rows added when a column ran with offload tiers ("-" for the others)
OFFLOAD_ROWS = (
    ("CPU hit tokens", lambda s: s["offload"]["hit_tokens"]["cpu"] if "offload" in s else None),
    ("GPU + CPU hit rate",
     lambda s: s["offload"]["combined_hit_rate"] if "offload" in s else None),
)


def format_table(summaries: dict[str, dict]) -> str:
    """Plain-text table: one column per allocator."""
    names = list(summaries)
    rows = ROWS + (OFFLOAD_ROWS if any("offload" in s for s in summaries.values()) else ())
    width = max(len(label) for label, _ in rows)
    cols = [[_fmt(get(summaries[n])) for _, get in rows] for n in names]
    col_w = [max(len(n), *(len(v) for v in c)) for n, c in zip(names, cols)]
    lines = [" " * width + "  " + "  ".join(n.rjust(w) for n, w in zip(names, col_w))]
    for i, (label, _) in enumerate(rows):
        lines.append(label.ljust(width) + "  " +
                     "  ".join(c[i].rjust(w) for c, w in zip(cols, col_w)))
    return "\n".join(lines)


def register(subparsers) -> None:
    """Add ``kvsim compare``."""
    p = subparsers.add_parser(
        "compare", help="one workload through several allocators, side by side",
        description="Replay one workload through several allocators with the same memory and "
                    "scheduler settings and print one table (and JSON).")
    add_replay_args(p, allocator=False)
    p.add_argument("--allocators", default=",".join(ALLOCATORS),
                   help=f"comma-separated (default {','.join(ALLOCATORS)})")
    p.add_argument("--json", help="write {allocator: summary} here")
    p.set_defaults(func=run)


def run(args) -> int:
    from kvsim.simulator.result import json_text, prepare_output

    names = parse_allocators(args.allocators)
    if args.json:
        prepare_output(args.json)
    summaries = {name: run_one(args, name, record_requests=False, offload=name == "paged").summary
                 for name in names}
    print(format_table(summaries))
    if args.cpu_offload_gib and any(name != "paged" for name in names):
        print("offload tiers sit below the paged pool: the contiguous columns run without them")
    if args.json:
        with open(args.json, "w") as f:
            f.write(json_text(summaries))
    return 0
