"""Summarise bench/kernels.py's CSV as markdown (the tables of docs/BENCHMARKS.md, "Kernels").

    python bench/kernels_report.py bench/results/kernels_h200.csv
"""
from __future__ import annotations

import csv
import math
import sys
from collections import defaultdict


def geomean(xs):
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(path: str) -> int:
    rows = [r for r in csv.DictReader(open(path)) if r["time_us"]]
    copy_tbps = float(next(r for r in rows if r["kind"] == "copy")["tbps"])
    by = defaultdict(dict)  # (batch, ctx, gqa) -> impl label -> row
    for r in rows:
        if r["kind"] == "copy":
            continue
        key = (int(r["batch"]), int(r["context_tokens"]), int(r["gqa"]))
        label = r["impl"] if r["kind"] == "dense" else f"{r['impl']}:{r['layout'] or '-'}:{r['block_size']}"
        by[key][label] = r
    ours = [r for r in rows if r["impl"] == "triton" and r["layout"] == "flat"]
    pct = [float(r["pct_copy"]) for r in ours]
    same = [float(r["pct_copy_same_bytes"]) for r in ours]
    big = [float(r["pct_copy"]) for r in ours if int(r["kv_bytes"]) >= 256 << 20]
    ratios = []
    for r in ours:
        d = by[(int(r["batch"]), int(r["context_tokens"]), int(r["gqa"]))]
        dense = [float(d[k]["time_us"]) for k in ("sdpa-cudnn", "sdpa-flash") if k in d]
        if dense:
            ratios.append(float(r["time_us"]) / min(dense))
    print(f"Copy ceiling: {copy_tbps:.3f} TB/s. Paged kernel (flat layout, dispatch rule), {len(ours)} points:")
    print(f"- geometric mean {geomean(pct):.1f}% of the copy ceiling (min {min(pct):.1f}%, "
          f"{sum(p < 70 for p in pct)} points under 70%);")
    print(f"- against a copy of the same number of bytes: geometric mean {geomean(same):.1f}% "
          f"(min {min(same):.1f}%, {sum(p < 70 for p in same)} points under 70%);")
    if big:
        print(f"- points with KV >= 256 MB ({len(big)}): geometric mean {geomean(big):.1f}%, min {min(big):.1f}%;")
    if ratios:
        print(f"- time / best dense SDPA: geometric mean {geomean(ratios):.3f}, max {max(ratios):.3f}, "
              f"{sum(x <= 1.05 for x in ratios)}/{len(ratios)} points within 5%.")
    print()
    print("| batch | context | GQA | KV MB | ours bs16 us | ours bs128 us | % copy (bs16/128) | split | cuDNN us "
          "| FA2 us | ours/best dense (bs16/128) | v1 us | gather+SDPA us | vLLM layout bs16 us | FlexAttn paged us |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in sorted(by):
        d = by[key]
        o16, o128 = d.get("triton:flat:16"), d.get("triton:flat:128")
        if o16 is None and o128 is None:
            continue

        def t(label):
            return f"{float(d[label]['time_us']):.1f}" if label in d else "-"
        best_ours = min((r for r in (o16, o128) if r), key=lambda r: float(r["time_us"]))
        dense = [float(d[k]["time_us"]) for k in ("sdpa-cudnn", "sdpa-flash") if k in d]
        ratio = "/".join(f"{float(r['time_us']) / min(dense):.2f}" if (r and dense) else "-" for r in (o16, o128))
        pct_both = "/".join(f"{float(r['pct_copy']):.0f}" if r else "-" for r in (o16, o128))
        split = best_ours["partition_size"]
        flex = d.get("flex-paged:-:128")
        flex_us = f"{float(flex['time_us']):.1f}" if flex else "-"
        print(f"| {key[0]} | {key[1]} | {key[2]} | {int(best_ours['kv_bytes']) / 1e6:.0f} | {t('triton:flat:16')} "
              f"| {t('triton:flat:128')} | {pct_both} | {split if split != '0' else 'v1'} "
              f"| {t('sdpa-cudnn')} | {t('sdpa-flash')} | {ratio} | {t('triton-v1:flat:' + best_ours['block_size'])} "
              f"| {t('gather-sdpa:-:' + best_ours['block_size'])} | {t('triton:vllm:16')} "
              f"| {flex_us} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/kernels_h200.csv"))
