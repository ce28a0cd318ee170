"""Azure conversation trace as whole processes: `kvsim replay` against Vidur 0.0.26 (issue 20).

Both run as separate processes, alternately, round after round, timed from outside (wall
seconds and the child's CPU seconds, imports and output writing included).

Vidur is no dependency of kvsim and none of its code is here. To include it, install it in a
throwaway venv outside the repository and pass its Python::

    python3 -m venv /tmp/vidur-venv
    /tmp/vidur-venv/bin/pip install torch==2.13.0      # from the local wheel cache
    /tmp/vidur-venv/bin/pip install vidur==0.0.26
    python bench/peer_speed.py --vidur-python /tmp/vidur-venv/bin/python --rounds 3

Without ``--vidur-python`` (or when that Python has no vidur) only kvsim runs.

What runs for Vidur (its own CLI, ``vidur.main``, under its Python):
* the trace converted to Vidur's trace-replay CSV (Date, Time = seconds since the first request,
  PromptTokenCount, CompletionTokenCount; written once, before the timed runs), replayed with
  scale factors 1 and max_tokens = kvsim's max_model_len;
* Llama-3-8B (Vidur's name: meta-llama/Llama-3-8B) on one H100 (``h100``, TP 1, PP 1), Vidur's vLLM replica scheduler with
  batch_size_cap 256 (kvsim's max_num_seqs) and max_tokens_in_batch 16384: that scheduler
  (vLLM v0's, no chunked prefill) never schedules a prompt longer than its token budget, and
  the trace has one 14,050-token prompt, so the budget is max_model_len, as vLLM v0 required
  without chunked prefill (kvsim: 8192 with chunked prefill, vLLM v1's default); block size 16 and kvsim's num_gpu_blocks, Vidur's default prefix
  caching (off: the trace has no content ids) and metrics (chrome trace and plots off);
* its random-forest execution-time predictor needs profiling data from the Hugging Face hub,
  which this machine cannot reach. ``_load_predictions_from_hf`` is therefore replaced by tables
  with the same keys (num_tokens; (batch_size, kv_cache_size); (kv_cache_size, chunk)) whose
  values are an analytic roofline per layer and operation (H100: 989 TFLOPS bf16, 3.35 TB/s),
  computed when a key is first read. Every other part of Vidur (events, scheduler, memory
  planner, metrics) runs unchanged; its per-batch cost is its usual dictionary look-ups.

    python bench/peer_speed.py [--vidur-python PY] [--rounds N] [--kvsim PATH]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
MAX_MODEL_LEN, MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS = 16384, 256, 8192
KVSIM_GPU = "H100-80GB-SXM"


# ---- Vidur child (runs under Vidur's Python; imports nothing of kvsim) ---------------------
def _vidur_child(trace_csv: str, out_dir: str, num_blocks: int) -> None:
    from vidur.execution_time_predictor.sklearn_execution_time_predictor import \
        SklearnExecutionTimePredictor
    from vidur import main as vidur_main

    def analytic_tables(self):
        m = self._model_config
        hidden, layers_ffn = m.embedding_dim, m.mlp_hidden_dim
        head_dim = hidden // m.num_q_heads
        q_dim, kv_dim = m.num_q_heads * head_dim, m.num_kv_heads * head_dim
        flops_per_s, bytes_per_s, elt = 989e12, 3.35e12, 2

        def ms(flops, nbytes):
            return max(flops / flops_per_s, nbytes / bytes_per_s) * 1e3

        def linear(k, n):
            return lambda t: ms(2 * t * k * n, elt * (k * n + t * (k + n)))

        def elementwise(width, passes):
            return lambda t: ms(t * width, elt * t * width * passes)

        per_tokens = {
            "attn_pre_proj": linear(hidden, q_dim + 2 * kv_dim),
            "attn_post_proj": linear(q_dim, hidden),
            "mlp_up_proj": linear(hidden, 2 * layers_ffn),
            "mlp_down_proj": linear(layers_ffn, hidden),
            "mlp_act": elementwise(layers_ffn, 3),
            "input_layernorm": elementwise(hidden, 2),
            "post_attention_layernorm": elementwise(hidden, 2),
            "add": elementwise(hidden, 3),
            "attn_rope": elementwise(q_dim + kv_dim, 2),
            "attn_kv_cache_save": elementwise(2 * kv_dim, 2),
        }

        class Table(dict):
            def __init__(self, fn):
                super().__init__()
                self.fn = fn

            def __missing__(self, key):
                value = self[key] = self.fn(*key)
                return value

        tables = {name: Table(fn) for name, fn in per_tokens.items()}
        tables["attn_decode"] = Table(lambda b, kv: ms(
            4 * b * kv * q_dim, elt * 2 * b * kv * kv_dim))
        tables["attn_prefill"] = Table(lambda kv, chunk: ms(
            4 * chunk * (kv + chunk / 2) * q_dim, elt * 2 * (kv + chunk) * kv_dim))
        return tables

    SklearnExecutionTimePredictor._load_predictions_from_hf = analytic_tables
    sys.argv = ["vidur", "--replica_config_model_name", "meta-llama/Llama-3-8B",
                "--replica_config_device", "h100", "--replica_config_network_device", "h100_dgx",
                "--replica_config_tensor_parallel_size", "1",
                "--replica_config_num_pipeline_stages", "1",
                "--cluster_config_num_replicas", "1",
                "--cache_config_block_size", "16", "--cache_config_num_blocks", str(num_blocks),
                "--replica_scheduler_config_type", "vllm",
                "--vllm_scheduler_config_batch_size_cap", str(MAX_NUM_SEQS),
                "--vllm_scheduler_config_max_tokens_in_batch", str(MAX_MODEL_LEN),
                "--request_generator_config_type", "trace_replay",
                "--trace_request_generator_config_trace_file", trace_csv,
                "--trace_request_generator_config_date", "2023-11-16",
                "--trace_request_generator_config_max_tokens", str(MAX_MODEL_LEN),
                "--trace_request_generator_config_prefill_scale_factor", "1",
                "--trace_request_generator_config_decode_scale_factor", "1",
                "--trace_request_generator_config_time_scale_factor", "1",
                "--random_forrest_execution_time_predictor_config_prediction_max_tokens_per_request",
                str(MAX_MODEL_LEN),
                "--random_forrest_execution_time_predictor_config_prediction_max_prefill_chunk_size",
                str(MAX_NUM_BATCHED_TOKENS),
                "--random_forrest_execution_time_predictor_config_prediction_max_batch_size",
                str(MAX_NUM_SEQS),
                "--random_forrest_execution_time_predictor_config_cache_dir",
                os.path.join(out_dir, "cache"),
                "--no-metrics_config_enable_chrome_trace", "--no-metrics_config_store_plots",
                "--metrics_config_output_dir", out_dir]
    vidur_main.main()


# ---- parent ----------------------------------------------------------------------------------
def _vidur_trace(path: Path) -> None:
    """The Azure CSV in Vidur's trace-replay format (one date; seconds since the first row)."""
    from datetime import datetime
    with open(TRACE, newline="") as f, open(path, "w", newline="") as out:
        rows = csv.DictReader(f)
        w = csv.writer(out)
        w.writerow(["Date", "Time", "PromptTokenCount", "CompletionTokenCount"])
        t0 = None
        for row in rows:
            t = datetime.fromisoformat(row["TIMESTAMP"][:26])
            t0 = t0 or t
            w.writerow(["2023-11-16", f"{(t - t0).total_seconds():.6f}", row["ContextTokens"],
                        row["GeneratedTokens"]])


def _timed(cmd: list[str]) -> tuple[float, float, str]:
    """Run a process; (wall s, its CPU s, stderr tail)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        raise RuntimeError(f"{cmd[0]} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out.stderr[-400:]


def _has_vidur(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import vidur"], capture_output=True)
    return probe.returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vidur-python", help="a Python that has vidur 0.0.26 (see the docstring)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kvsim", default=str(Path(sys.executable).parent / "kvsim"),
                    help="the kvsim entry script (default: beside this Python)")
    ap.add_argument("--vidur-child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vidur_child:
        _vidur_child(args.vidur_child[0], args.vidur_child[1], int(args.vidur_child[2]))
        return 0
    if not TRACE.exists():
        print(f"skipped: {TRACE} is absent")
        return 0
    vidur = args.vidur_python if args.vidur_python and _has_vidur(args.vidur_python) else None
    if args.vidur_python and not vidur:
        print(f"Vidur skipped: {args.vidur_python} cannot import vidur")
    work = Path(tempfile.mkdtemp(prefix="peer_speed_"))
    kvsim_cmd = [args.kvsim, "replay", str(TRACE), "--model", "Llama-3.1-8B", "--gpu", KVSIM_GPU,
                 "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS),
                 "--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS), "--quiet",
                 "--out", str(work / "kvsim.json")]
    times: dict[str, list[tuple[float, float]]] = {"kvsim": [], "vidur": []}
    num_blocks = None
    for r in range(args.rounds):
        wall, cpu, _ = _timed(kvsim_cmd)
        times["kvsim"].append((wall, cpu))
        summary = json.loads((work / "kvsim.json").read_text())
        print(f"round {r} kvsim: {wall:.2f} s wall, {cpu:.2f} s CPU "
              f"({summary['requests_finished']} finished, {summary['num_steps']} steps)",
              flush=True)
        if vidur:
            if num_blocks is None:
                num_blocks = summary["config"]["engine"]["num_blocks"]
                _vidur_trace(work / "vidur_trace.csv")
            wall, cpu, tail = _timed([vidur, __file__, "--vidur-child",
                                      str(work / "vidur_trace.csv"), str(work / "vidur"),
                                      str(num_blocks)])
            times["vidur"].append((wall, cpu))
            ended = [line for line in tail.splitlines() if "Simulation ended" in line]
            print(f"round {r} vidur: {wall:.2f} s wall, {cpu:.2f} s CPU "
                  f"({ended[-1].strip() if ended else 'no end line'})", flush=True)
    print(f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
          f"(load {os.getloadavg()[0]:.1f}), Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| process | wall s per round | CPU s per round |")
    print("| --- | --- | --- |")
    for name, rows in times.items():
        if rows:
            print(f"| {name} | {', '.join(f'{w:.2f}' for w, _ in rows)} | "
                  f"{', '.join(f'{c:.2f}' for _, c in rows)} |")
    if times["vidur"]:
        k, v = times["kvsim"], times["vidur"]
        print(f"Vidur / kvsim, best of {args.rounds}: wall {min(w for w, _ in v) / min(w for w, _ in k):.1f}x, "
              f"CPU {min(c for _, c in v) / min(c for _, c in k):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
