"""How long a closed-loop concurrency sweep takes: 9 concurrencies x 3 configurations, as
InferenceMAX draws them (throughput per GPU against interactivity), in parallel processes.

    python bench/concurrency_sweep.py [--jobs 2] [--repeats 3] [--isl 1024 --osl 1024 --n 640]

Runs ``kvsim plan 'random:isl=..,osl=..,n=..' --model Llama-3.1-8B --sweep gpu=A100-80GB,H100-80GB-SXM,H200
--sweep concurrency=1,2,...,256 --jobs J`` as a subprocess (the whole command, start-up included)
and prints each run's wall time, then the Pareto front of the last run.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONCURRENCIES = "1,2,4,8,16,32,64,128,256"
GPUS = "A100-80GB,H100-80GB-SXM,H200"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--isl", type=int, default=1024)
    ap.add_argument("--osl", type=int, default=1024)
    ap.add_argument("--n", type=int, default=640)
    a = ap.parse_args(argv)
    kvsim = Path(sys.executable).with_name("kvsim")
    spec = f"random:isl={a.isl},osl={a.osl},n={a.n},seed=0"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan"
        cmd = [str(kvsim), "plan", spec, "--model", "Llama-3.1-8B", "--sweep", f"gpu={GPUS}",
               "--sweep", f"concurrency={CONCURRENCIES}", "--jobs", str(a.jobs), "--quiet", "--out", str(out)]
        print(f"machine: {os.cpu_count()} CPUs; {' '.join(cmd[1:])}")
        for i in range(a.repeats):
            t0 = time.perf_counter()
            run = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if run.returncode != 0:
                print(run.stderr, file=sys.stderr)
                return run.returncode
            print(f"run {i + 1}: 27 points in {wall:.1f} s wall")
        import pandas as pd

        df = pd.read_csv(out / "results.csv")
        front = df[df["pareto"]].sort_values("interactivity")
        print("Pareto front (gpu, concurrency, interactivity tok/s/user, output tok/s per GPU):")
        for row in front.itertuples():
            print(f"  {row.gpu:<14} {row.concurrency:>4} {row.interactivity:8.1f} {row.output_throughput_per_gpu:9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
