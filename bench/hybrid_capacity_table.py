"""The capacity table of every hybrid preset: kvsim's numbers next to vLLM 0.33's own.

kvsim: ``planner.capacity.compute_capacity`` for the preset on the GPU (what `kvsim capacity
--model P --gpu G` prints). vLLM: its KV-cache planning functions (bench/vllm_kv_capacity.py, run
on CPU in the oracle's venv) at the KV memory kvsim computes, as recorded in
tests/fixtures/vllm_kv_capacity.json (``python tests/capacity_cases.py`` regenerates it; with
--live they are run now). Prints a Markdown table (docs/PLANNER.md) and exits 1 on any
difference.

    python bench/hybrid_capacity_table.py [--live]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from capacity_cases import (GOLDEN, PRESET_CASES, preset_capacity, preset_cases,  # noqa: E402
                            report_plan, vllm_plans)

KIND = {"full_attention": "full", "sliding_window": "sliding", "mla_attention": "MLA",
        "mamba": "Mamba"}


def groups_text(plan: dict) -> str:
    """``sliding x18: 36,864 B/token + full x18: 36,864 B/token`` (equal groups merged)."""
    parts: list[list] = []
    for g in plan["groups"]:
        per_token = g["group_page_bytes"] / g["block_size"]
        label = KIND[g["kind"]]
        what = "state" if g["kind"] == "mamba" else f"{per_token:,.0f} B/token"
        key = (label, len(g["layers"]), what)
        if parts and parts[-1][0] == key:
            parts[-1][1] += 1
        else:
            parts.append([key, 1])
    return " + ".join(f"{n} x {label}({layers} layers, {what})" if n > 1 else
                      f"{label}({layers} layers, {what})"
                      for (label, layers, what), n in parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--live", action="store_true", help="run vLLM's functions now")
    a = ap.parse_args(argv)
    cases = preset_cases()
    if a.live:
        from test_allocator_vs_vllm import vllm_python
        python = vllm_python()
        if python is None:
            sys.exit("no interpreter with vLLM ($KVSIM_VLLM_PYTHON or ../oracle-venv)")
        wanted = vllm_plans(python, cases)
    else:
        recorded = {json.dumps(r["case"], sort_keys=True): r["vllm"]
                    for r in json.loads(GOLDEN.read_text())}
        wanted = [recorded[json.dumps(c, sort_keys=True)] for c in cases]
    print("| preset | GPU | tp | max_model_len | prefix caching | KV memory (GiB) | block | "
          "num_gpu_blocks kvsim / vLLM | groups (bytes per token per group) | "
          "max concurrency kvsim / vLLM | same |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | --- |")
    differ = 0
    for spec, case, want in zip(PRESET_CASES, cases, wanted):
        r = preset_capacity(*spec)
        got = report_plan(r)
        same = got == want
        differ += not same
        name = spec[0] + (" (every layer full)" if spec[5] else "")
        print(f"| {name} | {spec[1]} | {spec[2]} | {spec[3]:,} | {'on' if spec[4] else 'off'} | "
              f"{r.available_kv_bytes / 2**30:.2f} | {r.block_size} | "
              f"{got['num_gpu_blocks']:,} / {want['num_gpu_blocks']:,} | {groups_text(got)} | "
              f"{got['max_concurrency']:.2f} / {want['max_concurrency']:.2f} | "
              f"{'yes' if same else 'NO'} |")
    print(f"\n{len(cases) - differ}/{len(cases)} identical (num_gpu_blocks, block size, every "
          f"group's layers, page and bytes per token, max concurrency)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
