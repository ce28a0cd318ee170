"""Real vLLM's prefill steps that start an idle engine against a cost table's price (issue 24).

A step starts an idle engine when the step before it ended more than ``--gap-ms`` before it
began (the probe's ``t_done_s - step_s``): nothing was in flight, so async scheduling hid none
of its CPU work. For each kind (idle start or not), the median of measured - priced over the
run's steps with prompt tokens, and the slowest steps of the run (``--slow-s``):

    python bench/vllm_idle_steps.py bench/results/vllm_h100/llama8b-fp8/azure-conv \\
        tables/vllm/llama8b-fp8-fine_H100.csv
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.vllm_gpu.grid_table import IDLE_GAP_S, starts_idle  # noqa: E402
from kvsim.simulator.cost import StepBatch  # noqa: E402
from kvsim.simulator.cost_table import load_cost_table  # noqa: E402

FIELDS = ("num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_scheduled_tokens", "kv_read_tokens",
          "attn_token_pairs", "max_context_tokens")


def idle_residuals(run: Path, table: Path, gap_s: float) -> dict[bool, list[float]]:
    """measured - priced (seconds) of the run's steps with prompt tokens, by idle start (an idle
    start priced with the table's c_idle, as the engine adds it)."""
    model = load_cost_table(table)
    out: dict[bool, list[float]] = {True: [], False: []}
    prev_done = None
    with open(run / "steps.csv", newline="") as f:
        for r in csv.DictReader(f):
            done, step = float(r["t_done_s"]), float(r["step_s"])
            idle = starts_idle(prev_done, done, step, gap_s)
            prev_done = done
            if int(r["num_prefill_tokens"]) == 0:
                continue
            batch = StepBatch(**{k: int(r.get(k) or 0) for k in FIELDS})   # the engine's price of it:
            out[idle].append(step - model.step_time_s(batch) - (model.idle_start_s if idle else 0.0))
    return out


def slow_steps(run: Path, slow_s: float) -> list[tuple[int, int, float]]:
    """(index, scheduled tokens, seconds) of the run's steps longer than ``slow_s``."""
    with open(run / "steps.csv", newline="") as f:
        return [(i, int(r["num_scheduled_tokens"]), float(r["step_s"]))
                for i, r in enumerate(csv.DictReader(f)) if float(r["step_s"]) > slow_s]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run folder of bench/results/vllm_*/ENGINE/ (its steps.csv)")
    ap.add_argument("table", type=Path, help="the cost table to price its steps with")
    ap.add_argument("--gap-ms", type=float, default=IDLE_GAP_S * 1e3,
                    help="an idle engine: this long between steps (default: grid_table.py's rule)")
    ap.add_argument("--slow-s", type=float, default=0.3, help="list the steps longer than this")
    a = ap.parse_args(argv)
    res = idle_residuals(a.run, a.table, a.gap_ms / 1e3)
    for idle in (True, False):
        d = np.array(res[idle]) * 1e3
        if len(d):
            print(f"{'idle start' if idle else 'in flight '}: {len(d):5d} prefill steps, measured - priced "
                  f"median {np.median(d):+.2f} ms (p25 {np.percentile(d, 25):+.2f}, p75 {np.percentile(d, 75):+.2f})")
    slow = slow_steps(a.run, a.slow_s)
    print(f"steps over {a.slow_s:g} s: {len(slow)}, {sum(s for *_, s in slow):.1f} s "
          + " ".join(f"#{i}:{n}tok:{s:.2f}s" for i, n, s in slow[:8]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
