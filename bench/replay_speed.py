"""Replay speed: wall time, simulated requests per wall-second and peak memory of `simulate`.

Cases (each in its own subprocess, so peak RSS is the case's own):
  azure-conv      ../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv (19,366 requests)
  mooncake-conv   ../shared/traces/mooncake/conversation_trace.jsonl (12,031 requests)
  mooncake-conv-nopc  the same replay with prefix caching off (issue 20: prefix caching on
                  should cost at most 2x this)
  sharegpt-10k / -100k / -1m   synthetic ShareGPT-like requests (workloads spec)
  azure-conv-gpt-oss(-full)    the Azure trace on gpt-oss-120b / one H100: KV-cache groups
                               (sliding window + full), and every layer full (not by default)
Setup (planner.engine_setup.build_engine, as `kvsim replay`): paged allocator, prefix caching on,
vLLM's num_gpu_blocks for Llama-3.1-8B on one A100-80GB, roofline step times, max_num_seqs 256,
max_num_batched_tokens 8192, one replica, time series sampled every 10 s, per-request table
off (only the latencies for the summary's percentiles are kept, as `kvsim replay` without
--requests).

    python bench/replay_speed.py [--cases azure-conv,sharegpt-10k] [--profile CASE | --sample CASE]
        [--modes sync,async --repeat 3]
    python bench/replay_speed.py --against OTHER/.venv/bin/python --rounds 3 [--cases ...]

``--modes`` replays every case in each scheduling mode (``sync``: vLLM's synchronous
Scheduler, the default; ``async``: AsyncScheduler with two batches in flight), alternating the
modes run by run (``--repeat`` rounds) so that the machine's load hits both alike; the table then
gives each mode's median wall time and the async / sync ratio.

Prints one line per case and a Markdown table. ``--against`` runs every case alternately under
this checkout's Python and another checkout's (its venv's editable kvsim: the code before a
change), round after round, and prints both CPU times side by side with a check that the two
summaries are equal. Issue 20's targets: mooncake-conv at most 2x mooncake-conv-nopc,
sharegpt-1m under 90 s with flat memory. Targets (issue 8, one core): azure-conv < 1 s,
sharegpt-1m < 2 min, peak memory not growing with trace length beyond recorded samples.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TRACES = ROOT.parent / "shared" / "traces"
CASES = {
    "azure-conv": str(TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"),
    "mooncake-conv": str(TRACES / "mooncake" / "conversation_trace.jsonl"),
    "mooncake-conv-nopc": str(TRACES / "mooncake" / "conversation_trace.jsonl"),
    "sharegpt-10k": "sharegpt:rate=20,n=10000,seed=0",
    "sharegpt-100k": "sharegpt:rate=20,n=100000,seed=0",
    "sharegpt-1m": "sharegpt:rate=20,n=1000000,seed=0",
    # a hybrid model (KV-cache groups: HybridScheduler), and the same with every layer full
    "azure-conv-gpt-oss": str(TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"),
    "azure-conv-gpt-oss-full": str(TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"),
}
DEFAULT_CASES = [c for c in CASES if "gpt-oss" not in c]
MODEL, GPU = "Llama-3.1-8B", "A100-80GB"
NO_PREFIX_CACHING = "-nopc"   # case-name suffix: the same replay with prefix caching off
# cases on another model: gpt-oss-120b (18 sliding-window + 18 full layers) on one H100
CASE_SETUP = {
    "azure-conv-gpt-oss": dict(model="gpt-oss-120b", gpu="H100-80GB-SXM", max_model_len=131072),
    "azure-conv-gpt-oss-full": dict(model="gpt-oss-120b", gpu="H100-80GB-SXM",
                                    max_model_len=131072, disable_hybrid_kv_cache_manager=True),
}


def run_case(name: str, profile: bool = False, mode: str = "sync") -> dict:
    from kvsim import workloads
    from kvsim.planner.engine_setup import build_engine
    from kvsim.simulator import simulate

    max_model_len = 32768 if name.startswith("mooncake") else 16384
    setup = build_engine(**{"model": MODEL, "gpu": GPU, "max_model_len": max_model_len,
                            **CASE_SETUP.get(name, {})},
                         max_num_seqs=256, max_num_batched_tokens=8192,
                         enable_prefix_caching=not name.endswith(NO_PREFIX_CACHING),
                         async_scheduling=mode == "async", cost_table="roofline")   # its figures' clock
    config, cost, report = setup.config, setup.cost, setup.capacity
    requests = workloads.load(CASES[name])
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    if profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        result = prof.runcall(simulate, requests, config, cost, sample_interval_s=10.0,
                                 record_requests=False)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    else:
        result = simulate(requests, config, cost, sample_interval_s=10.0, record_requests=False)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    s = result.summary
    return {"case": name, "mode": mode, "requests": s["requests_arrived"], "finished": s["requests_finished"],
            "rejected": s["requests_rejected"], "steps": s["num_steps"],
            "simulated_s": s["simulated_duration_s"], "mean_running": s["mean_running"],
            "preemptions": s["num_preemptions"], "prefix_hit_rate": s["prefix_hit_rate"],
            "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "requests_per_wall_s": round(s["requests_arrived"] / wall, 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "num_gpu_blocks": report.num_gpu_blocks,
            "kvsim_root": str(Path(sys.modules["kvsim.simulator"].__file__).parent.parent)}


def sample_case(name: str, interval_s: float = 0.0002, top: int = 40) -> None:
    """Run one case under a SIGPROF sampling profiler; print, per function, the share of samples
    in which it is on the stack (inclusive) and on top (self). Unlike cProfile it does not
    inflate the cost of small functions, so the shares are those of a normal run."""
    import collections
    import signal
    on_stack, on_top, count = collections.Counter(), collections.Counter(), [0]

    def handler(_sig, frame):
        count[0] += 1
        on_top[(frame.f_code.co_filename, frame.f_code.co_name)] += 1
        seen = set()
        while frame is not None:
            key = (frame.f_code.co_filename, frame.f_code.co_name)
            if key not in seen:
                seen.add(key)
                on_stack[key] += 1
            frame = frame.f_back

    import kvsim.planner.engine_setup  # noqa: F401  (imported before sampling: run_case's own
    import kvsim.simulator.engine  # noqa: F401   imports are then free, the shares the replay's)
    from kvsim import workloads  # noqa: F401
    signal.signal(signal.SIGPROF, handler)
    signal.setitimer(signal.ITIMER_PROF, interval_s, interval_s)
    try:
        row = run_case(name)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
    print(json.dumps(row))
    total = max(1, count[0])
    print(f"{count[0]} samples; inclusive % | self % | function")
    for key, n in on_stack.most_common(top):
        where = os.path.relpath(key[0], ROOT) if key[0].startswith(str(ROOT)) else \
            os.path.basename(key[0])
        print(f"{100 * n / total:6.1f} | {100 * on_top[key] / total:5.1f} | {where}:{key[1]}")


def _run_child(python: str, name: str, mode: str = "sync") -> dict | str:
    """One case in its own process under ``python``: its row, or the error text."""
    out = subprocess.run([python, __file__, "--one", name, "--mode", mode], capture_output=True, text=True)
    if out.returncode:
        return out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _machine_line() -> str:
    return (f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
            f"(load {os.getloadavg()[0]:.1f}), Python {platform.python_version()}, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


_TIMINGS = ("wall_s", "cpu_s", "requests_per_wall_s", "peak_rss_mib", "kvsim_root")


def compare_against(other_python: str, names: list[str], rounds: int, modes: tuple = ("sync",)) -> int:
    """Run every case in every mode alternately under the other Python and this one, ``rounds``
    times."""
    cases = [(n, m) for n in names for m in modes]
    runs: dict[tuple, dict[str, list]] = {c: {"old": [], "new": []} for c in cases}
    for r in range(rounds):
        for name, mode in cases:
            for side, python in (("old", other_python), ("new", sys.executable)):
                row = _run_child(python, name, mode)
                if isinstance(row, str):
                    print(f"{name} {mode} ({side}): failed\n{row}")
                    return 1
                runs[name, mode][side].append(row)
                print(json.dumps({"round": r, "side": side, "mode": mode, **row}), flush=True)
    print("\n" + _machine_line())
    print("| case | mode | old CPU s | new CPU s | old / new (min) | old peak RSS MiB | new peak RSS MiB "
          "| summaries equal |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | --- |")
    for name, mode in cases:
        old, new = runs[name, mode]["old"], runs[name, mode]["new"]
        same = all({k: v for k, v in o.items() if k not in _TIMINGS} ==
                   {k: v for k, v in n.items() if k not in _TIMINGS} for o, n in zip(old, new))
        old_cpu, new_cpu = [o["cpu_s"] for o in old], [n["cpu_s"] for n in new]
        print(f"| {name} | {mode} | {', '.join(f'{c:.2f}' for c in old_cpu)} | "
              f"{', '.join(f'{c:.2f}' for c in new_cpu)} | {min(old_cpu) / min(new_cpu):.2f}x | "
              f"{max(o['peak_rss_mib'] for o in old):.0f} | "
              f"{max(n['peak_rss_mib'] for n in new):.0f} | {'yes' if same else 'NO'} |")
    return 0


def _absent(name: str) -> bool:
    """A trace case whose file is not there (../shared/traces missing)."""
    return ":" not in CASES[name] and not os.path.exists(CASES[name])


MODES = ("sync", "async")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES),
                    help=f"comma-separated, from {', '.join(CASES)} (default: the "
                         f"full-attention ones)")
    ap.add_argument("--modes", default="sync",
                    help="comma-separated scheduling modes: sync, async (default sync; "
                         "KV-cache groups: sync only)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds; each round runs every case in every mode, alternating")
    ap.add_argument("--one", choices=CASES, help=argparse.SUPPRESS)   # child process: one case
    ap.add_argument("--mode", choices=MODES, default="sync", help=argparse.SUPPRESS)
    ap.add_argument("--profile", choices=CASES, metavar="CASE",
                    help="run one case under cProfile (stderr)")
    ap.add_argument("--sample", choices=CASES, metavar="CASE",
                    help="run one case under a sampling profiler (shares per function)")
    ap.add_argument("--against", metavar="PYTHON",
                    help="another checkout's venv Python: run each case alternately under both")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of --against (default 3)")
    args = ap.parse_args()
    modes = args.modes.split(",")
    if any(m not in MODES for m in modes) or args.repeat < 1:
        ap.error(f"--modes takes {', '.join(MODES)}; --repeat >= 1")
    single = args.sample or args.one or args.profile
    if single and _absent(single):
        ap.error(f"case {single}: {CASES[single]} is absent")
    if args.sample:
        sample_case(args.sample)
        return 0
    if single:
        print(json.dumps(run_case(single, profile=bool(args.profile), mode=args.mode)))
        return 0
    names = args.cases.split(",")
    for name in names:
        if name not in CASES:
            ap.error(f"unknown case {name!r}; choose from {', '.join(CASES)}")
    if args.against:
        return compare_against(args.against, [n for n in names if not _absent(n)], args.rounds, tuple(modes))
    rows = {}
    for _round in range(args.repeat):
        for name in names:
            if _absent(name):
                if not _round:
                    print(f"{name}: skipped ({CASES[name]} is absent)")
                continue
            for mode in modes:
                out = subprocess.run([sys.executable, __file__, "--one", name, "--mode", mode],
                                     capture_output=True, text=True)
                if out.returncode:
                    print(f"{name} ({mode}): failed\n{out.stderr[-2000:]}")
                    continue
                row = json.loads(out.stdout.strip().splitlines()[-1])
                rows.setdefault((name, mode), []).append(row)
                print(json.dumps(row), flush=True)
    print(f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
          f"(load {os.getloadavg()[0]:.1f}), Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; median of {args.repeat} "
          "run(s) per mode")
    print("| case | mode | requests | steps | simulated s | mean running | preemptions | wall s | "
          "CPU s | requests / wall s | peak RSS MiB |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (name, mode), runs in rows.items():
        r = sorted(runs, key=lambda x: x["wall_s"])[len(runs) // 2]
        print(f"| {r['case']} | {mode} | {r['requests']:,} | {r['steps']:,} | "
              f"{r['simulated_s']:.0f} | {r['mean_running']:.1f} | {r['preemptions']:,} | "
              f"{r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['requests_per_wall_s']:,.0f} | "
              f"{r['peak_rss_mib']:.0f} |")
    if len(modes) > 1:
        for name in names:
            walls = {m: sorted(x["wall_s"] for x in rows.get((name, m), [])) for m in modes}
            if all(walls.values()):
                med = {m: w[len(w) // 2] for m, w in walls.items()}
                print(f"{name}: async / sync wall time {med['async'] / med['sync']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
