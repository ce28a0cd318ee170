"""First-use Triton compiles of vLLM's MXFP4 MoE routing: what a fresh gpt-oss engine pays.

vLLM 0.23.0 serves gpt-oss (MXFP4 experts) on Hopper with its 'TRITON' Mxfp4 MoE backend, whose
routing kernels (triton_kernels' ``_topk_forward`` and ``_sum_bitmatrix_rows``) take the token
count's bitmatrix stride as a compile-time constant: the step's tokens rounded up to 32, beside
Triton's own specialisation of the token count (divisible by 16 or not). A step on a CUDA graph
replays kernels captured at start-up; an eager step (more tokens than the largest graph) whose
key (tokens rounded up to 32, divisible by 16) the engine has not run before compiles both
kernels first, inside the step (0.73 s on an H100). vLLM's start-up profile run at
``max_num_batched_tokens`` compiles that one key.

The rule predicted every routing compile of two fresh H100 engines exactly (29 of 29:
bench/results/vllm_h100/gpt-oss-20b-jit and -cached, each compile timed by the harness's probe,
``jit.csv``), and the steps of 0.4 s or more of the earlier gpt-oss-20b runs (0-13 a workload)
within one a workload. Not modelled: the expert matmuls' own first compiles (two kernels of 1.2-1.7 s,
once an engine, at its first eager steps with decodes beside prompts), and any compile of a
kernel another vLLM version or GPU may add. The H100's seconds carry to the other GPUs and to
gpt-oss-120b as measured on gpt-oss-20b (compile time is CPU work, not the GPU's): extrapolated.
"""
from __future__ import annotations

# seconds a new key costs: _topk_forward (mean 0.577 s) + _sum_bitmatrix_rows (0.148 s) over the
# 29 compiles of gpt-oss-20b-jit and -cached (one H100 80GB HBM3, 2026-12-07)
ROUTING_COMPILE_S = 0.725
MEASURED_ON = "gpt-oss-20b, H100"


def routing_key(num_tokens: int) -> tuple[int, bool]:
    """What the routing kernels are compiled for: the tokens rounded up to 32 (the bitmatrix's
    stride, a constant of the kernel) and whether they divide by 16 (Triton's specialisation)."""
    return -(-num_tokens // 32) * 32, num_tokens % 16 == 0


class RoutingCompiles:
    """The first-use compiles of one engine kind: ``graph_tokens``, the largest CUDA graph (a step
    of more tokens runs eager); ``compile_s`` per new key."""

    def __init__(self, graph_tokens: int, compile_s: float = ROUTING_COMPILE_S, measured_on: str = MEASURED_ON,
                 compiled: frozenset = frozenset()):
        self.graph_tokens = graph_tokens
        self.compile_s = compile_s
        self.measured_on = measured_on
        self.compiled = frozenset(compiled)

    def having_run(self, num_tokens) -> "RoutingCompiles":
        """The same engine after it ran steps of these token counts (an engine that served other
        work first: bench/vllm_compare.py replays a workload in the state its engine was in)."""
        keys = {routing_key(m) for m in num_tokens if m > self.graph_tokens}
        return RoutingCompiles(self.graph_tokens, self.compile_s, self.measured_on, self.compiled | keys)

    def at_start(self, max_num_batched_tokens: int) -> set:
        """The keys a replica starts with compiled: vLLM's profile run's (and ``compiled``)."""
        return {routing_key(max_num_batched_tokens), *self.compiled}

    def stall_s(self, compiled: set, num_tokens: int) -> float:
        """Seconds a step of ``num_tokens`` spends compiling, given the replica's ``compiled`` keys
        (updated)."""
        if num_tokens <= self.graph_tokens:
            return 0.0
        key = routing_key(num_tokens)
        if key in compiled:
            return 0.0
        compiled.add(key)
        return self.compile_s

    def describe(self) -> str:
        return (f"first-use compiles of the MoE routing: {self.compile_s:.3g} s at an eager step (over "
                f"{self.graph_tokens} tokens) whose token count, rounded up to 32, the engine has not run "
                f"(measured on {self.measured_on})")
