"""``kvsim workload``: statistics of a trace file or synthetic spec (and a check that it loads)."""
from __future__ import annotations

import argparse
import json

from kvsim.cli.argtypes import add_rate_args, positive_float, positive_int
from kvsim.workloads.loaders import FORMATS


def register(subparsers) -> None:
    """Add the ``workload`` subcommand to the ``kvsim`` parser."""
    p = subparsers.add_parser(
        "workload", help="load a trace or synthetic spec and print its statistics",
        description="Load a trace file (format sniffed from content) or a synthetic spec such "
                    "as 'sharegpt:rate=2,n=1000,seed=0' and print count, duration, rate, "
                    "length percentiles, shareable tokens and ideal prefix reuse.")
    p.add_argument("source", help="trace file or spec (sharegpt:..., alpaca:..., synthetic:...)")
    p.add_argument("--format", default=None,
                   help=f"trace format ({', '.join(FORMATS)}, generic:arrival=COL,...); "
                        "default: sniffed")
    p.add_argument("--max-requests", type=positive_int, default=None, help="stop after N requests")
    p.add_argument("--time-window", type=positive_float, default=None, metavar="SECONDS",
                   help="keep requests arriving in [0, SECONDS)")
    add_rate_args(p)
    p.add_argument("--seed", type=int, default=0, help="seed of generated arrivals/lengths")
    p.add_argument("--block-size", type=positive_int, default=16,
                   help="block size of the prefix-reuse figure (tokens, default 16)")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the statistics; InputError propagates to the CLI (one line, exit 2)."""
    from kvsim.workloads import load_at_rate
    from kvsim.workloads.stats import workload_stats

    requests = load_at_rate(args.source, format=args.format, rate=args.rate,
                            rate_scale=args.rate_scale, max_requests=args.max_requests,
                            time_window_s=args.time_window, seed=args.seed)
    stats = workload_stats(requests, block_size=args.block_size)
    if args.json:
        print(json.dumps({"source": args.source, **stats}, sort_keys=True))
        return 0
    rate = f"{stats['rate_per_s']:.3f} req/s" if stats["rate_per_s"] is not None else "n/a"
    conv = f" in {stats['num_conversations']} conversations" if stats["num_conversations"] else ""
    lines = [
        ("workload", args.source),
        ("requests", f"{stats['num_requests']}{conv}"),
        ("duration", f"{stats['duration_s']:.1f} s (mean rate {rate})"),
    ]
    for name in ("prompt", "output"):
        lines.append((f"{name} tokens",
                      f"mean {stats[f'{name}_mean_tokens']:.1f}  p50 "
                      f"{stats[f'{name}_p50_tokens']:.0f}  p99 {stats[f'{name}_p99_tokens']:.0f}"
                      f"  max {stats[f'{name}_max_tokens']}"))
    lines.append(("shareable", f"{100 * stats['shareable_fraction']:.1f}% of prompt+output "
                               "tokens"))
    lines.append(("prefix reuse", f"{100 * stats['prefix_hit_fraction']:.1f}% of prompt tokens "
                                  f"(unlimited cache, block {stats['block_size']})"))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key:<{width}}  {value}")
    print(SHARING_NOTE)
    return 0


# what the two sharing figures mean (printed under them; docs/WORKLOADS.md says the same)
SHARING_NOTE = (
    "shareable: tokens the source marks as content another request may hold (a shared system\n"
    "  prompt, a conversation's history, Mooncake's hash ids, a request's own samples), counted\n"
    "  per request: an upper bound that ignores block boundaries and arrival order.\n"
    "prefix reuse: the prompt tokens an unlimited prefix cache would hit, replaying in arrival\n"
    "  order: whole blocks of block_size only, only content an earlier request already computed,\n"
    "  the last prompt token always recomputed (vLLM). The most prefix caching can save; a real\n"
    "  pool evicts, so `kvsim compare WORKLOAD --allocators paged --prefix-caching on,off` says\n"
    "  what it saves on a given pool.")
