"""Loader throughput (rows/s) and Mooncake peak memory.

Usage: python bench/load_traces.py [--traces ../shared/traces] [--repeat 3]

Real traces come from ../shared/traces (skipped when absent); the vllm-oracle and generic
loaders and the synthetic generators run on inputs this script writes to a temporary folder.
Each figure is the best of ``--repeat`` runs; memory is tracemalloc's peak of Python
allocations while loading (not the process RSS).
"""
from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvsim.workloads import load  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRACES = {
    "mooncake": ("mooncake/conversation_trace.jsonl", {}),
    "azure": ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv", {}),
    "sharegpt": ("sharegpt_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
                 {"rate": 5.0}),
}


def _rows_per_s(source, repeat: int, **kwargs) -> tuple[int, float]:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = sum(1 for _ in load(source, **kwargs))
        best = min(best, time.perf_counter() - t0)
    return n, n / best


def _peak_mib(source, keep: bool) -> float:
    tracemalloc.start()
    if keep:
        held = list(load(source))
        del held
    else:
        for _ in load(source):
            pass
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2 ** 20


def _write_inputs(folder: Path, num_rows: int) -> dict[str, tuple[Path, dict]]:
    oracle = folder / "oracle.csv"
    generic = folder / "generic.jsonl"
    with open(oracle, "w") as f:
        f.write("arrival_step,prompt_tokens,output_tokens,prefix_group,prefix_len\n")
        for i in range(num_rows):
            f.write(f"{i // 3},{200 + i % 700},{1 + i % 300},{'g0' if i % 2 else ''},"
                    f"{512 if i % 2 else ''}\n")
    with open(generic, "w") as f:
        for i in range(num_rows):
            f.write(f'{{"arrival_s": {i * 0.01:.2f}, "prompt_tokens": {1 + i % 900}, '
                    f'"output_tokens": {1 + i % 400}, "user": "u{i % 97}"}}\n')
    return {"vllm-oracle": (oracle, {}), "generic (jsonl)": (generic, {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rows", type=int, default=50_000, help="rows of the written inputs")
    args = ap.parse_args()

    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"{platform.processor() or platform.platform()}")
    print(f"{'source':<34} {'rows':>8} {'rows/s':>10}")
    for fmt, (rel, kwargs) in TRACES.items():
        path = args.traces / rel
        if not path.is_file():
            print(f"{fmt:<34} {'absent':>8}")
            continue
        n, rate = _rows_per_s(path, args.repeat, **kwargs)
        print(f"{fmt:<34} {n:>8} {rate:>10,.0f}")
    with tempfile.TemporaryDirectory() as tmp:
        for fmt, (path, kwargs) in _write_inputs(Path(tmp), args.rows).items():
            n, rate = _rows_per_s(path, args.repeat, **kwargs)
            print(f"{fmt:<34} {n:>8} {rate:>10,.0f}")
    for spec in ("sharegpt:rate=5,n=100000",
                 "sharegpt:rate=1,n=100000,system=256,turns=uniform(1,6),think_s=20"):
        n, rate = _rows_per_s(spec, args.repeat)
        print(f"{spec:<34.34} {n:>8} {rate:>10,.0f}")

    mooncake = args.traces / TRACES["mooncake"][0]
    if mooncake.is_file():
        size_mib = mooncake.stat().st_size / 2 ** 20
        print(f"mooncake file {size_mib:.1f} MiB; peak Python memory: streaming "
              f"{_peak_mib(mooncake, keep=False):.2f} MiB, all requests held "
              f"{_peak_mib(mooncake, keep=True):.1f} MiB")


if __name__ == "__main__":
    main()
