"""``kvsim profile``: time a grid of step shapes on the GPU and write a measured cost table.

    kvsim profile (--model M | --hf-config config.json) --out table.csv [--max-num-seqs 256]
        [--max-num-batched-tokens 8192] [--max-model-len L] [--block-size 16] [--num-blocks N]
        [--repeat 7] [--seed 0] [--device cuda|cpu]
    kvsim profile --engine vllm ...     (real vLLM's own steps: kvsim.cli.profile_vllm)

The step executor (kernels.executor: random bf16 weights of the model's shape, a paged KV pool,
CUDA graphs for decode) runs every point of ``kernels.profile.default_grid`` within the limits,
and the table (``# gpu/date/versions/model/executor/command`` lines, then one row per step shape)
is what ``--cost-table`` reads (simulator.cost_table.StepShapeCost). ``--device cpu`` runs the
kernels in Triton's interpreter (tests; the times are not a GPU's).
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from kvsim.cli.argtypes import Parser
from kvsim.cli.outputs import check_output
from kvsim.cli.profile_options import settle_options
from kvsim.errors import InputError

GIB = 2**30


def register(sub) -> None:
    p = sub.add_parser("profile", help="time step shapes on the GPU and write a measured cost table",
                       description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=run)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=("kvsim", "vllm"), default="kvsim",
                   help="whose steps are timed: kvsim's own executor (default) or real vLLM's, in its own "
                        "Python (--vllm-python)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", help="model preset (default Llama-3.1-8B)")
    which.add_argument("--hf-config", metavar="FILE", help="a Hugging Face config.json (llama, mistral, qwen2, qwen3)")
    p.add_argument("--out", required=True, metavar="CSV", help="the cost table to write")
    p.add_argument("--max-num-seqs", type=_positive, help="default 256 (vllm: vllm serve's for the GPU)")
    p.add_argument("--max-num-batched-tokens", type=_positive, help="default 8192")
    p.add_argument("--max-model-len", type=_positive,
                   help="default: the model's, at most 32768 (vllm: 10240, the plans' longest request and more)")
    p.add_argument("--block-size", type=_positive, help="default 16")
    p.add_argument("--num-blocks", type=_positive, help="KV pool blocks (default: what the grid needs, "
                                                        "within the GPU's free memory)")
    p.add_argument("--repeat", type=_positive, help="timed runs per step shape, the median kept (default 7)")
    p.add_argument("--seed", type=int, help="default 0")
    p.add_argument("--time-budget-s", type=_positive, metavar="S",
                   help="stop measuring new shapes after S seconds (the table says how many it has)")
    p.add_argument("--device", choices=("cuda", "cpu"),
                   help="cpu: Triton interpreter, for tests (not a GPU's times; default cuda)")
    p.add_argument("--quiet", action="store_true")
    real = p.add_argument_group("real vLLM (--engine vllm; kvsim.cli.profile_vllm)")
    real.add_argument("--from-runs", metavar="DIR",
                      help="no GPU: the table from runs already served (RUNS/NAME, as bench/results/vllm_h100/ENGINE)")
    real.add_argument("--runs", metavar="DIR", help="where the engines' runs go (default: TABLE.runs beside --out)")
    real.add_argument("--vllm-python", metavar="PY", help="the Python with vLLM installed (default $KVSIM_VLLM_PYTHON)")
    real.add_argument("--quantization", help="vLLM's --quantization (fp8: fp8 weights)")
    real.add_argument("--kv-cache-dtype", help="vLLM's --kv-cache-dtype (fp8)")
    real.add_argument("--gpu-memory-utilization", type=_fraction, help="vLLM's (default 0.9)")
    real.add_argument("--grid", choices=("fine", "small", "large"),
                      help="the step shapes (bench/vllm_gpu/plans.py; default fine)")
    real.add_argument("--measure-async-off", action="store_true", default=None,
                      help="also serve waves with async scheduling off: the table's '# async off:' line")


def run(args, command: str | None = None) -> int:
    if args.engine == "vllm":
        from kvsim.cli import profile_vllm
        return profile_vllm.run(args)
    settle_options(args, "kvsim")
    check_output(args.out)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")   # before the kernels are imported
    from kvsim.cli.execute import decoder_shape, require_cuda
    shape = decoder_shape(args.model, args.hf_config)
    if args.device == "cuda":
        require_cuda("kvsim profile")
    import torch

    from kvsim.kernels.executor import StepExecutor, cudagraph_capture_sizes, memory_estimate_bytes
    from kvsim.kernels.profile import default_grid, profile_grid, provenance, write_table

    max_model_len = args.max_model_len or 32768
    limits = dict(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                  max_model_len=max_model_len, block_size=args.block_size)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    grid = default_grid(cudagraph_capture_sizes(args.max_num_seqs), num_blocks=1 << 40, **limits)
    num_blocks = args.num_blocks or max(pt.num_blocks(args.block_size) for pt in grid)
    if args.num_blocks is None and args.device == "cuda":
        # at most what fits beside the weights and activations (2 GiB left for graphs and slack)
        fixed = memory_estimate_bytes(shape, 0, args.block_size, args.max_num_batched_tokens,
                                      args.max_num_seqs, dtype)
        per_block = args.block_size * shape.kv_bytes_per_token(dtype)
        free = torch.cuda.mem_get_info()[0] - sum(fixed.values()) - 2 * GIB
        num_blocks = max(1, min(num_blocks, free // per_block))
    grid = [pt for pt in grid if pt.num_blocks(args.block_size) <= num_blocks]
    if not grid:
        raise InputError(f"no step shape of the grid fits {num_blocks} KV blocks", field="num_blocks")
    try:
        ex = StepExecutor(shape, num_blocks=num_blocks, block_size=args.block_size,
                          max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                          max_model_len=max_model_len, dtype=dtype, device=args.device, seed=args.seed)
    except ValueError as err:   # the model and pool do not fit the GPU (numbers in the message)
        raise InputError(str(err), field="num_blocks") from None

    def progress(done, total, row):
        if not args.quiet and (done % 20 == 0 or done == total):
            print(f"  {done}/{total} step shapes ({row['kind']}, {row['num_scheduled_tokens']} tokens: "
                  f"{row['step_s'] * 1e3:.2f} ms)", file=sys.stderr, flush=True)

    # decode and mixed shapes interleaved, so that a time budget cuts both alike
    decode = [pt for pt in grid if pt.kind == "decode"]
    mixed = [pt for pt in grid if pt.kind != "decode"]
    order = [pt for pair in zip(decode, mixed) for pt in pair]
    order += decode[len(mixed):] + mixed[len(decode):]
    rows = profile_grid(ex, order, repeat=args.repeat, seed=args.seed, progress=progress,
                        time_budget_s=args.time_budget_s)
    if command is None:
        command = "kvsim " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    header = provenance(ex, command, args.repeat)
    header["grid"] = f"{len(rows)} of {len(order)} step shapes of kernels.profile.default_grid" + \
        (" (time budget reached)" if len(rows) < len(order) else "")
    from kvsim.cli.outputs import write_files
    try:
        write_files([(args.out, lambda: write_table(args.out, rows, header))])
    except InputError:   # minutes of GPU time are not lost: the table goes to the terminal
        write_table("/dev/stdout", rows, header)
        raise
    if not args.quiet:
        print(f"wrote {args.out}: {len(rows)} step shapes of {shape.name} on {ex.device} "
              f"({num_blocks} KV blocks)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run as ``python -m kvsim.cli.profile`` (the same errors and exit codes as ``kvsim profile``)."""
    parser = Parser(prog="kvsim profile", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    try:
        return run(args, "kvsim profile " + " ".join(shlex.quote(a) for a in argv))
    except InputError as err:
        print(f"kvsim: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
