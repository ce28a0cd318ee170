"""Summarise bench/kernels.py's CSV as markdown (the tables of docs/BENCHMARKS.md, "Kernels").

    python bench/kernels_report.py bench/results/kernels_h200.csv [--previous bench/results/kernels_h200_2026-11-30.csv]

Sections: prefill (ours against the best correct dense kernel), mixed batches (one launch against
the best dense prefill + the best dense decode), decode (the 100-point grid: same-bytes copy,
dense SDPA, and the previous run's kernel point by point), eager mode.
"""
from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict

DENSE_PREFILL = ("flash-varlen", "sdpa-cudnn-padded", "sdpa-flash-padded", "sdpa-cudnn-per-seq",
                 "sdpa-flash-per-seq", "flex-dense")


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def timed(rows):
    return [r for r in rows if r["time_us"]]


def ok(r):
    return r["correct"] in ("", "True")


def prefill(rows):
    by = defaultdict(dict)
    for r in timed(rows):
        if r["section"] == "prefill":
            by[(int(r["batch"]), int(r["new_tokens"]), int(r["context_tokens"]), int(r["gqa"]), int(r["block_size"]))][
                r["impl"]] = r
    print("| seqs | new tokens | context | GQA | block | ours us | ours TFLOP/s | best dense | dense us | dense TFLOP/s "
          "| ours/best | FA2 varlen us | cuDNN padded us | FA2 padded us | flex dense / paged us |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|")
    ratios = []
    for key in sorted(by, key=lambda k: (k[2] > 0, k[4], k[3], k[0], k[1])):
        d = by[key]
        if "triton" not in d:
            continue
        dense = {k: float(v["time_us"]) for k, v in d.items() if k in DENSE_PREFILL and ok(v)}
        if not dense:
            continue
        best = min(dense, key=dense.get)
        t = float(d["triton"]["time_us"])
        ratio = dense[best] / t
        ratios.append(ratio)

        def us(name):
            if name not in d:
                return "-"
            return f"{float(d[name]['time_us']):.1f}" + ("" if ok(d[name]) else " (wrong)")
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {t:.1f} | {d['triton']['tflops']} | {best} | "
              f"{dense[best]:.1f} | {d[best]['tflops']} | {ratio:.2f} | {us('flash-varlen')} | {us('sdpa-cudnn-padded')} "
              f"| {us('sdpa-flash-padded')} | {us('flex-dense')} / {us('flex-paged')} |")
    print(f"\nPrefill: ours/best dense throughput, geometric mean {geomean(ratios):.3f}, min {min(ratios):.3f} over "
          f"{len(ratios)} points (target: >= 0.8 and no point < 0.6); {sum(x < 0.6 for x in ratios)} points under 0.6.")


def mixed(rows):
    """One row per mixed point, in file order: its triton row, then its prefill:* and decode:* peers,
    then the best-prefill+best-decode baseline."""
    points, cur = [], None
    for r in timed(rows):
        if r["section"] != "mixed":
            continue
        if r["impl"] == "triton":
            cur = {"triton": r}
            points.append(cur)
        elif cur is not None:
            cur.setdefault(r["impl"], r)
    print("\n| prefill chunks (tokens over context) | decodes x context | ours us | best dense prefill + decode us | "
          "ours/two launches | ours, 64-row programs us |")
    print("|---|---|---:|---:|---:|---:|")
    ratios = []
    for d in points:
        if "best-prefill+best-decode" not in d:
            continue
        pre = next(v for k, v in d.items() if k.startswith("prefill:"))
        n_dec = int(d["triton"]["decodes"])
        t, base = float(d["triton"]["time_us"]), float(d["best-prefill+best-decode"]["time_us"])
        ratios.append(t / base)
        alt = f"{float(d['rows64']['time_us']):.1f}" if "rows64" in d else "-"
        print(f"| {pre['batch']} x {int(pre['new_tokens']) // int(pre['batch'])} over {pre['context_tokens']} | "
              f"{n_dec} x {d['triton']['decode_context'] or 0} | {t:.1f} | {base:.1f} "
              f"({d['best-prefill+best-decode']['note']}) | {t / base:.2f} | {alt} |")
    print(f"\nMixed: ours/two dense launches, geometric mean {geomean(ratios):.3f} over {len(ratios)} points "
          f"(target: < 1); {sum(x < 1 for x in ratios)} points faster.")


def decode(rows, previous):
    ours = [r for r in timed(rows) if r["section"] == "decode" and r["impl"] == "triton"]
    dense = {}
    for r in timed(rows):
        if r["section"] == "decode" and r["kind"] == "dense":
            k = (r["batch"], r["context_tokens"], r["gqa"])
            dense[k] = min(dense.get(k, 1e18), float(r["time_us"]))
    same = [float(r["pct_copy_same_bytes"]) for r in ours]
    ratios = [float(r["time_us"]) / dense[(r["batch"], r["context_tokens"], r["gqa"])] for r in ours]
    print(f"\nDecode: {len(ours)} points; geometric mean {geomean(same):.1f}% of a same-bytes copy (min {min(same):.1f}%); "
          f"time / best dense SDPA: geometric mean {geomean(ratios):.3f}, max {max(ratios):.3f}, "
          f"{sum(x <= 1.05 for x in ratios)}/{len(ratios)} within 5%.")
    if previous:
        old = {(r["batch"], r["context_tokens"], r["block_size"], r["gqa"]): float(r["time_us"])
               for r in timed(previous) if r["impl"] == "triton" and r.get("layout") == "flat"}
        old_dense = {}
        for r in timed(previous):
            if r["kind"] == "dense":
                k = (r["batch"], r["context_tokens"], r["gqa"])
                old_dense[k] = min(old_dense.get(k, 1e18), float(r["time_us"]))
        pairs = [(float(r["time_us"]) / old[k], r) for r in ours
                 if (k := (r["batch"], r["context_tokens"], r["block_size"], r["gqa"])) in old]
        dense_drift = [dense[k] / old_dense[k] for k in dense if k in old_dense]
        print(f"Against the previous run's kernel (same grid, another H200 session): ours new/old geometric mean "
              f"{geomean([p for p, _ in pairs]):.3f}; dense SDPA new/old {geomean(dense_drift):.3f} (the machines "
              "agree); points more than 5% slower:")
        print("\n| batch | context | block | GQA | split | new us | previous us | new/previous |")
        print("|---:|---:|---:|---:|---|---:|---:|---:|")
        for x, r in sorted(pairs, key=lambda p: -p[0]):
            if x > 1.05:
                split = r["partition_size"] if r["partition_size"] != "0" else "v1"
                if "separate" in r["note"]:
                    split += " (separate reduce)"
                elif "masked" in r["note"]:
                    split += " (all tiles masked)"
                print(f"| {r['batch']} | {r['context_tokens']} | {r['block_size']} | {r['gqa']} | {split} | "
                      f"{float(r['time_us']):.1f} | {old[(r['batch'], r['context_tokens'], r['block_size'], r['gqa'])]:.1f} "
                      f"| {x:.2f} |")


def eager(rows):
    by = defaultdict(dict)
    for r in timed(rows):
        if r["section"] == "eager":
            by[(r["kind"], int(r["batch"]), int(r["context_tokens"] or 0), int(r["new_tokens"] or 0))][r["impl"]] = r
    impls = ["triton", "triton-validate", "legacy", "sdpa-cudnn", "sdpa-flash", "flash-varlen", "sdpa-cudnn-padded",
             "sdpa-flash-padded"]
    print("\nEager mode, us per call: do_bench median / 200 calls back to back.\n")
    print("| kind | batch | context | new tokens | " + " | ".join(impls) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(impls))
    for key in sorted(by):
        d = by[key]
        cells = [f"{float(d[i]['time_us']):.1f} / {float(d[i]['loop_us']):.1f}" if i in d else "-" for i in impls]
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cells) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", default="bench/results/kernels_h200.csv")
    ap.add_argument("--previous", help="an earlier run's CSV (decode grid) to compare point by point")
    args = ap.parse_args()
    rows = list(csv.DictReader(open(args.csv)))
    previous = list(csv.DictReader(open(args.previous))) if args.previous else None
    copy = next((r for r in rows if r["kind"] == "copy"), None)
    if copy:
        print(f"Copy ceiling: {float(copy['tbps']):.3f} TB/s.\n")
    prefill(rows)
    mixed(rows)
    decode(rows, previous)
    eager(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
