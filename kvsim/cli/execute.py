"""What ``kvsim profile`` and ``kvsim replay --execute cuda`` share: the model the step executor runs
(a preset's or a config.json's shape) and the executor built for it.

torch and the kernels are imported only inside the functions: ``kvsim --help`` stays light.
"""
from __future__ import annotations

import json
from pathlib import Path

from kvsim.errors import InputError, json_problem

# the model types the step executor runs (dense decoders); a preset's config.json fields,
# RoPE included, are planner.presets.PRESET_CONFIGS'
EXECUTOR_MODEL_TYPES = ("llama", "qwen2", "mistral")


def decoder_shape(model: str | None, hf_config: str | None):
    """The DecoderShape of a preset (``--model``) or of a config.json (``--hf-config``).

    Raises:
        InputError: an unknown preset, a preset or config the executor cannot run (MoE, MLA, OPT),
            unreadable JSON or a bad field (file and field named).
    """
    from kvsim.kernels.decoder import DecoderShape
    if hf_config is not None:
        path = str(hf_config)
        try:
            cfg = json.loads(Path(path).read_text())
        except json.JSONDecodeError as err:
            raise InputError(f"invalid JSON: {json_problem(err)}", file=path, line=err.lineno) from None
        except UnicodeDecodeError as err:
            raise InputError(f"not UTF-8 text ({err.reason})", file=path) from None
        except OSError as err:
            raise InputError(f"cannot read: {err.strerror}", file=path) from None
        if not isinstance(cfg, dict):
            raise InputError("expected a JSON object", file=path)
        try:
            return DecoderShape.from_hf_config(cfg, name=Path(path).resolve().parent.name or "custom")
        except ValueError as err:
            field, _, message = str(err).partition(": ")
            raise InputError(message or field, file=path, field=field if message else None) from None
    from kvsim.planner.presets import PRESET_CONFIGS, get_model
    spec = get_model(model or "Llama-3.1-8B")
    runnable = [name for name, cfg in PRESET_CONFIGS.items()
                if cfg["model_type"] in EXECUTOR_MODEL_TYPES]
    if spec.name not in runnable:
        raise InputError(f"the step executor runs dense Llama/Qwen/Mistral decoders ({', '.join(runnable)}, "
                         f"or --hf-config of such a model); {spec.name} is not one", field="model")
    cfg = {"head_dim": spec.head_dim, **PRESET_CONFIGS[spec.name]}
    shape = DecoderShape.from_hf_config(cfg, name=spec.name)
    assert shape.num_params == spec.num_params, (shape.num_params, spec.num_params)
    return shape


def require_cuda(flag: str) -> None:
    """InputError unless torch sees a CUDA GPU (the executor times on one)."""
    import torch
    if not torch.cuda.is_available():
        raise InputError(f"{flag} needs a CUDA GPU and torch sees none")


# the executor of the last `--execute` run of this process, reused by the next run of the same
# model, pool and limits (bench/accuracy.py replays several workloads in one process): weights,
# pool and captured graphs are built once. The pool's contents do not matter to the timing.
_EXECUTORS: dict = {}


def in_the_loop(args, setup, requests):
    """``replay --execute``: the InTheLoopCost that runs each scheduled step on the step executor
    (the model of ``--model``/``--hf-config``, a pool of the simulated pool's blocks, the engine's
    limits) with the setup's cost model recorded beside as the prediction; and the requests,
    checked to be single-sample as they stream in.

    Raises:
        InputError: another allocator than paged, replicas or tensor parallelism, no CUDA GPU, a
            model the executor cannot run, a pool that does not fit the GPU, or (while streaming) a
            request with parallel samples or beams.
    """
    import os
    device = args.execute
    config = setup.config
    if config.allocator != "paged":
        raise InputError(f"--execute runs the paged allocator's block tables, got --allocator {config.allocator}",
                         field="execute")
    if args.replicas != 1 or args.tp != 1:
        raise InputError(f"--execute runs one replica at tensor parallel 1, got {args.replicas} replicas and "
                         f"--tp {args.tp}", field="execute")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")   # before the kernels are imported
    shape = decoder_shape(None if args.hf_config else args.model, args.hf_config)
    if device == "cuda":
        require_cuda("--execute cuda")
    import torch

    from kvsim.kernels.executor import StepExecutor, build_step
    from kvsim.simulator.in_the_loop import InTheLoopCost
    key = (shape, config.pool_blocks, config.block_size, config.max_num_seqs, config.max_num_batched_tokens,
           config.max_model_len, device, args.seed)
    ex = _EXECUTORS.get(key)
    if ex is None:
        _EXECUTORS.clear()     # one executor (its pool takes the GPU) per process
        import gc
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        try:
            ex = StepExecutor(shape, num_blocks=config.pool_blocks, block_size=config.block_size,
                              max_num_seqs=config.max_num_seqs,
                              max_num_batched_tokens=config.max_num_batched_tokens,
                              max_model_len=config.max_model_len,
                              dtype=torch.bfloat16 if device == "cuda" else torch.float32, device=device,
                              seed=args.seed)
        except ValueError as err:   # the pool or model does not fit the GPU (numbers in the message)
            raise InputError(str(err), field="num_blocks") from None
        _EXECUTORS[key] = ex
    vocab = shape.vocab_size

    def execute(step) -> float:
        return ex.execute(build_step(step.block_tables, step.num_computed_tokens, step.num_new_tokens,
                                     step.block_size, vocab)).time_s

    def single_sample(reqs):
        for req in reqs:
            if req.n > 1 or req.beam_width > 1:
                raise InputError(f"request {req.request_id} has n={req.n}, beam_width={req.beam_width}: hardware "
                                 "in the loop runs single-sample requests (forks copy blocks the executor "
                                 "does not copy)", field="execute")
            yield req
    return InTheLoopCost(execute, predictor=setup.cost), single_sample(requests)
