"""Same outputs, byte for byte: run a fixed set of `kvsim` commands and compare two runs of it.

A refactoring (or a speed change) must leave every output file unchanged. This script runs the
configurations below with one `kvsim` executable and writes each case's files under OUT/<case>/;
`--compare A B` then diffs two such folders file by file. The summary's `wall_clock_s` (the one
field that measures the run itself) and the seconds that commands print are masked.

    python bench/same_outputs.py run OUT [--kvsim "python -m kvsim.cli"] [--cases SUBSTR ...]
    python bench/same_outputs.py compare OUT_A OUT_B

Cases that need ../shared/traces are skipped (with a line) when it is absent.
"""
from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
AZURE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
SHAREGPT_FILE = TRACES / "sharegpt_lengths" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
MOONCAKE = TRACES / "mooncake" / "conversation_trace.jsonl"
ORACLE_TRACE = ROOT / "tests" / "fixtures" / "workloads" / "vllm_oracle.csv"

SHAREGPT = "sharegpt:rate=4,n=600,seed=3"
TIGHT = ["--num-blocks", "300", "--max-model-len", "4096"]
# vLLM's synchronous scheduler: the cases below were recorded before async scheduling became the
# default for replays whose step time comes from the GPU (roofline, cost table); they keep it
SYNC = ["--no-async-scheduling"]
# name -> (arguments after `kvsim`; "{out}" is the case folder), traces it needs
REPLAY_OUTS = ["--out", "{out}/result.json", "--requests", "{out}/requests.csv",
               "--timeseries", "{out}/ts.csv", "--quiet", *SYNC]
ASYNC_OUTS = [a for a in REPLAY_OUTS if a not in SYNC]
CASES: dict[str, tuple[list[str], tuple[Path, ...]]] = {
    "azure-excerpt": (["replay", str(AZURE), "--max-requests", "3000", *REPLAY_OUTS], (AZURE,)),
    "azure-tight-pool": (["replay", str(AZURE), "--max-requests", "1500", "--num-blocks", "500",
                          "--max-model-len", "16384", *REPLAY_OUTS], (AZURE,)),
    "mooncake-excerpt": (["replay", str(MOONCAKE), "--max-requests", "1500",
                          "--max-model-len", "32768", *REPLAY_OUTS], (MOONCAKE,)),
    "mooncake-preempt": (["replay", str(MOONCAKE), "--max-requests", "600", "--num-blocks", "4000",
                          "--max-model-len", "32768", *REPLAY_OUTS], (MOONCAKE,)),
    "preempt-heavy": (["replay", SHAREGPT, *TIGHT, *REPLAY_OUTS], ()),
    "preempt-no-pc": (["replay", SHAREGPT, *TIGHT, "--no-prefix-caching", *REPLAY_OUTS], ()),
    "prefill-threshold": (["replay", SHAREGPT, *TIGHT, "--long-prefill-token-threshold", "128",
                           "--max-num-batched-tokens", "1024", *REPLAY_OUTS], ()),
    "watermark": (["replay", SHAREGPT, *TIGHT, "--watermark", "0.05", *REPLAY_OUTS], ()),
    "first-chunk-admission": (["replay", SHAREGPT, *TIGHT, "--no-full-prompt-admission",
                               *REPLAY_OUTS], ()),
    "conversations": (["replay", "sharegpt:rate=1,system=512,turns=uniform(1,6),think_s=30,n=300,"
                       "seed=1", "--num-blocks", "1200", *REPLAY_OUTS], ()),
    "parallel-sampling": (["replay", "alpaca:rate=5,samples=4,n=300,seed=0", "--num-blocks", "900",
                           *REPLAY_OUTS], ()),
    "beams": (["replay", "alpaca:rate=3,beam=4,n=150,seed=0", "--num-blocks", "900",
               *REPLAY_OUTS], ()),
    "max": (["replay", SHAREGPT, "--allocator", "max", *TIGHT, *REPLAY_OUTS], ()),
    "pow2": (["replay", SHAREGPT, "--allocator", "pow2", *TIGHT, *REPLAY_OUTS], ()),
    "oracle": (["replay", SHAREGPT, "--allocator", "oracle", *TIGHT, *REPLAY_OUTS], ()),
    "first-fit": (["replay", SHAREGPT, "--allocator", "max", "--placement", "first-fit", *TIGHT,
                   *REPLAY_OUTS], ()),
    "replicas-rr": (["replay", SHAREGPT, "--replicas", "3", "--num-blocks", "200",
                     "--max-model-len", "4096", *REPLAY_OUTS], ()),
    "replicas-least-loaded": (["replay", SHAREGPT, "--replicas", "3", "--router", "least-loaded",
                               "--num-blocks", "200", "--max-model-len", "4096", *REPLAY_OUTS], ()),
    "replicas-affinity": (["replay", "sharegpt:rate=2,system=256,turns=uniform(1,4),think_s=10,"
                           "n=300,seed=2", "--replicas", "2", "--router", "prefix-affinity",
                           "--num-blocks", "600", *REPLAY_OUTS], ()),
    "step-clock": (["replay", str(ORACLE_TRACE), "--format", "vllm-oracle", "--step-clock",
                    "--num-blocks", "64", "--max-num-seqs", "8", "--max-num-batched-tokens", "256",
                    "--max-model-len", "2048", *REPLAY_OUTS], ()),
    "step-s": (["replay", SHAREGPT, "--step-s", "0.03", *TIGHT, *REPLAY_OUTS], ()),
    "snapshots": (["replay", SHAREGPT, *TIGHT, "--snapshot-times-s", "20,60", *REPLAY_OUTS], ()),
    "no-decode-batching": (["replay", SHAREGPT, *TIGHT, "--no-decode-batching", *REPLAY_OUTS], ()),
    "model-gpu": (["replay", SHAREGPT, "--model", "Llama-3.1-70B", "--gpu", "H100-80GB-SXM",
                   "--tp", "4", "--gpu-memory-utilization", "0.5", "--max-model-len", "8192",
                   *REPLAY_OUTS], ()),
    "compare": (["compare", SHAREGPT, "--allocators", "paged,max,pow2,oracle", "--kv-tokens",
                 "6000", "--max-model-len", "2048", "--json", "{out}/compare.json", "--quiet",
                 *SYNC], ()),
    "capacity": (["capacity", "--model", "Llama-3.1-8B", "--gpu", "h100", "--max-model-len",
                  "8192", "--json"], ()),
    "capacity-workload": (["capacity", "--model", "Llama-3.1-8B", "--gpu", "h100",
                           "sharegpt:rate=2,n=200,seed=0", "--json", *SYNC], ()),
    "workload-stats": (["workload", "sharegpt:rate=1,system=512,turns=uniform(1,6),n=400,seed=0",
                        "--json"], ()),
    "workload-azure": (["workload", str(AZURE), "--json"], (AZURE,)),
    "sharegpt-file": (["replay", str(SHAREGPT_FILE), "--rate", "3", "--max-requests", "800",
                       "--num-blocks", "1500", *REPLAY_OUTS], (SHAREGPT_FILE,)),
    "validate": (["validate", "sharegpt:rate=2,n=40,seed=0", "--at", "30", "--num-blocks", "400",
                  "--device", "cpu", "--json", "{out}/validate.json"], ()),
    "plan": (["plan", "sharegpt:rate=3,n=300,seed=0", "--sweep", "block_size=16,32",
              "--sweep", "gpu_memory_utilization=0.3,0.5", "--slo", "ttft_p99<5",
              "--out", "{out}/plan", "--quiet", *SYNC], ()),
    "reproduce-quick": (["reproduce", "vllm-paper", "--quick", "--out", "{out}/repro", "--quiet"],
                        ()),
    # issue 19: one meaning of the rate (a trace keeps its pattern), what prefix caching saves
    "rate-scale": (["replay", str(AZURE), "--max-requests", "1500", "--rate-scale", "2",
                    *REPLAY_OUTS], (AZURE,)),
    "compare-prefix-caching": (["compare", "sharegpt:rate=1,system=512,turns=uniform(1,6),think_s=30,"
                                "n=300,seed=1", "--allocators", "paged,max", "--prefix-caching", "on,off",
                                "--num-blocks", "1200", "--json", "{out}/compare.json", "--quiet",
                                 *SYNC], ()),
    # added with async scheduling and the v0 scheduler (issue 16)
    "async-default": (["replay", SHAREGPT, *TIGHT, *ASYNC_OUTS], ()),
    "async-step-clock": (["replay", str(ORACLE_TRACE), "--format", "vllm-oracle", "--step-clock",
                          "--async-scheduling", "--num-blocks", "64", "--max-num-seqs", "8",
                          "--max-num-batched-tokens", "256", "--max-model-len", "2048",
                          *ASYNC_OUTS], ()),
    "async-mooncake": (["replay", str(MOONCAKE), "--max-requests", "600", "--num-blocks", "4000",
                        "--max-model-len", "32768", *ASYNC_OUTS], (MOONCAKE,)),
    "v0": (["replay", SHAREGPT, "--scheduler", "v0", *TIGHT, *REPLAY_OUTS], ()),
    "v0-model-gpu": (["replay", SHAREGPT, "--scheduler", "v0", "--model", "Llama-3.1-8B",
                      "--gpu", "A100-40GB", "--max-model-len", "4096", *REPLAY_OUTS], ()),
    "plan-async": (["plan", "sharegpt:rate=3,n=300,seed=0", "--sweep", "async_scheduling=true,false",
                    "--sweep", "scheduler=v1,v0", "--max-model-len", "4096", "--out", "{out}/plan",
                    "--quiet"], ()),
    # issue 17: hybrid models (KV-cache groups: windows free blocks, Mamba state, per-group rows)
    "hybrid-sliding": (["replay", SHAREGPT, *TIGHT, "--kv-groups", "sliding:128,full",
                        *REPLAY_OUTS], ()),
    "hybrid-mamba": (["replay", SHAREGPT, *TIGHT, "--kv-groups", "mamba_ckpt,mamba_ckpt,full",
                      *REPLAY_OUTS], ()),
    "hybrid-gpt-oss-azure": (["replay", str(AZURE), "--max-requests", "1500", "--model",
                              "gpt-oss-120b", "--gpu", "h100", "--rate-scale", "8",
                              *REPLAY_OUTS], (AZURE,)),
    "capacity-hybrid": (["capacity", "--model", "Gemma-3-27B", "--gpu", "h200", "--json",
                         *SYNC], ()),
    # issue 27: async scheduling over KV-cache groups (vLLM's default for a hybrid model)
    "hybrid-async-gpt-oss-azure": (["replay", str(AZURE), "--max-requests", "1500", "--model",
                                    "gpt-oss-120b", "--gpu", "h100", "--rate-scale", "8",
                                    *ASYNC_OUTS], (AZURE,)),
    "hybrid-async-mamba": (["replay", SHAREGPT, *TIGHT, "--kv-groups", "mamba_ckpt,mamba_ckpt,full",
                            "--async-scheduling", *ASYNC_OUTS], ()),
    # issue 18: CPU + disk offload tiers below a tight pool, and the one-pass hit-rate curves
    "offload-cpu-disk": (["replay", "sharegpt:rate=2,system=512,turns=uniform(1,6),think_s=20,n=300,"
                          "seed=4", "--num-blocks", "600", "--cpu-offload-gib", "1",
                          "--disk-offload-gib", "4", "--disk-bandwidth-gbps", "5",
                          "--disk-latency-ms", "1", *REPLAY_OUTS], ()),
    "cache-curve": (["cache-curve", "sharegpt:rate=2,system=512,turns=uniform(1,6),n=400,seed=4",
                     "--model", "Llama-3.1-8B", "--gpu", "h100", "--min-sizes", "12",
                     "--cpu-offload-gib", "2", "--target-hit-rate", "0.4",
                     "--csv", "{out}/curve.csv", "--html", "{out}/curve.html"], ()),
}
# what differs between two runs of the same command by design
_MASKS = [
    (re.compile(rb'"wall_clock_s": [0-9.eE+-]+'), b'"wall_clock_s": X'),
    (re.compile(rb"wall_clock_s,[0-9.eE+-]+"), b"wall_clock_s,X"),
    (re.compile(rb"wall [0-9.]+ s"), b"wall X s"),
    (re.compile(rb"in [0-9.]+ s\b"), b"in X s"),
    (re.compile(rb"[0-9.]+ ?(?:wall-)?s wall"), b"X s wall"),
    (re.compile(rb"(wall clock \(s\)) .*"), rb"\1 X"),
]
# files that time the run itself
_TIMINGS = {"timings.csv"}


def mask(data: bytes, root: Path) -> bytes:
    data = data.replace(str(root).encode(), b"{OUT}")
    for pattern, repl in _MASKS:
        data = pattern.sub(repl, data)
    return data


def run(out: Path, kvsim: list[str], only: list[str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for name, (argv, needs) in CASES.items():
        if only and not any(s in name for s in only):
            continue
        missing = [p for p in needs if not p.exists()]
        if missing:
            print(f"{name}: skipped ({missing[0]} absent)")
            continue
        case = out / name
        case.mkdir(exist_ok=True)
        cmd = kvsim + [a.replace("{out}", str(case)) for a in argv]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, cwd=ROOT)
        (case / "stdout.txt").write_bytes(proc.stdout)
        (case / "rc.txt").write_text(f"{proc.returncode}\n")
        status = "ok" if proc.returncode == 0 else f"rc={proc.returncode}: " + \
            proc.stderr.decode(errors="replace").strip().splitlines()[-1:][0][:200]
        print(f"{name}: {status} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


def compare(a: Path, b: Path) -> int:
    # only the cases both runs have (a run of some --cases is compared with a full one)
    cases = {p.name for p in a.iterdir() if p.is_dir()} & {p.name for p in b.iterdir() if p.is_dir()}
    files_a = {p.relative_to(a) for c in cases for p in (a / c).rglob("*") if p.is_file()}
    files_b = {p.relative_to(b) for c in cases for p in (b / c).rglob("*") if p.is_file()}
    bad = 0
    for rel in sorted(files_a ^ files_b):
        print(f"only in {'A' if rel in files_a else 'B'}: {rel}")
        bad += 1
    for rel in sorted(files_a & files_b):
        if rel.name in _TIMINGS:
            continue
        da, db = mask((a / rel).read_bytes(), a), mask((b / rel).read_bytes(), b)
        if da != db:
            print(f"DIFFERENT: {rel}")
            bad += 1
    print(f"{len(cases)} cases, {len(files_a | files_b)} files: "
          + (f"{bad} differ" if bad else "all identical"))
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--kvsim", default=f"{sys.executable} -m kvsim.cli",
                   help="the command that runs kvsim (default: this python's kvsim.cli)")
    r.add_argument("--cases", nargs="*", default=[], help="only cases whose name contains one")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.cmd == "run":
        return run(args.out, shlex.split(args.kvsim), args.cases)
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
