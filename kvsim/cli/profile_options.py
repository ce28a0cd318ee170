"""Which engine of ``kvsim profile`` takes each option (kvsim's own executor or real vLLM), and its
default there: one table for both (kvsim.cli.profile, kvsim.cli.profile_vllm)."""
from __future__ import annotations

from kvsim.errors import InputError

# which engine takes each option, and its default there (None: none, or one worked out later);
# an option given to the other engine is an error, one left unset takes its engine's default
ENGINE_OPTIONS = {
    "max_num_seqs": {"kvsim": 256, "vllm": None}, "max_model_len": {"kvsim": None, "vllm": 10240},
    "max_num_batched_tokens": {"kvsim": 8192}, "block_size": {"kvsim": 16}, "num_blocks": {"kvsim": None},
    "repeat": {"kvsim": 7}, "seed": {"kvsim": 0}, "time_budget_s": {"kvsim": None}, "device": {"kvsim": "cuda"},
    "from_runs": {"vllm": None}, "runs": {"vllm": None}, "vllm_python": {"vllm": None},
    "quantization": {"vllm": None}, "kv_cache_dtype": {"vllm": None}, "gpu_memory_utilization": {"vllm": 0.9},
    "grid": {"vllm": "fine"}, "measure_async_off": {"vllm": False},
}
WRONG_ENGINE = {"kvsim": "is an option of --engine vllm",
                "vllm": "is an option of kvsim's own executor (--engine kvsim); real vLLM runs with its own"}


def settle_options(args, engine: str) -> None:
    """Refuse an option of the other engine (one line, InputError); give the unset ones ``engine``'s
    defaults."""
    for opt, engines in ENGINE_OPTIONS.items():
        if engine not in engines:
            if getattr(args, opt) is not None:
                raise InputError(f"--{opt.replace('_', '-')} {WRONG_ENGINE[engine]}", field=opt)
        elif getattr(args, opt) is None:
            setattr(args, opt, engines[engine])
