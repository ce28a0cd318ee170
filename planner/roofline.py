"""Roofline step-cost model: a step takes as long as the slower of moving its bytes and doing its FLOPs.

Implements the simulator's ``CostModel`` protocol (``simulator.cost``) from a ModelSpec
and a GpuSpec, per tensor-parallel rank (all ranks work in parallel on equal shares)::

    bytes  = weights_read_bytes(num_scheduled_tokens) / tp
             + (kv_read_tokens + num_scheduled_tokens) * kv_bytes_per_token
             (read the cached context, write the new tokens' K/V)
    flops  = 2 * active_params / tp * num_scheduled_tokens
             + attn_flops_per_token_pair / tp * attn_token_pairs   (4 * layers * heads * head_dim)
    time_s = max(bytes / bandwidth, flops / peak) + allreduce_s + step_overhead_s
    allreduce_s = 2 * num_layers * t(num_scheduled_tokens * hidden_size * activation bytes, tp)
                  (tp > 1: planner.allreduce's time of one all-reduce, from published figures)

Weights are the bytes as served (a checkpoint's fp8 / MXFP4 / int4 quantization; fp8 weights use
the GPU's fp8 peak). With per-layer shapes, KV bytes per token count the attention layers only (a
sliding window's context read as if kept: an upper bound); Mamba state reads are not modelled.
The all-reduces are not overlapped with compute. ``bandwidth_efficiency`` / ``flops_efficiency``
scale the datasheet's peaks (1 here); ``build_engine`` passes, unless told otherwise, the FLOP/s
share real vLLM's prefill steps reached for the model's weights (``measured_flops_efficiency``).
With measured ``DecodeShares`` (``build_engine``'s default roofline: ``measured_decode``, real
vLLM's decode steps on the GPU) the memory side is ``(weights_read - input_embedding) /
(bandwidth x weights share) + KV bytes / (bandwidth x kv share)`` (an untied input embedding is
looked up, not streamed) and the fixed part ``num_layers x layer_s`` a step, in place of
``bandwidth_efficiency`` and ``step_overhead_s``.
Not modelled: activation traffic, kernel efficiency by shape (a measured ``TableCost`` has it).

``weights_read_bytes(n)`` is every weight as served, but of an MoE model's routed experts only the
share that a step of n tokens is expected to touch, each token routed to k of E experts uniformly
(``ParamBreakdown.experts_touched_fraction``: 1 - (1 - k / E) ** n; one decode token of
Qwen3-30B-A3B reads 8 of its 128 experts a layer, a step of 64 tokens 98.4 % of them). With
tensor parallelism every rank holds a slice of every expert, so the share holds per rank. A
model without its weights by kind (a bare ModelSpec) reads all of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kvsim.errors import InputError
from kvsim.planner.allreduce import allreduce_link
from kvsim.planner.capacity import kv_bytes_per_token
from kvsim.planner.specs import GpuSpec, ModelSpec, dtype_bytes

# per-step CPU work of a serving engine (scheduling, input preparation, sampling, launch); vLLM v1
# spends on the order of milliseconds per step. Calibrate with a measured table where it matters.
DEFAULT_STEP_OVERHEAD_S = 0.002

# The share of the datasheet's FLOP/s that real vLLM 0.23.0's prefill steps reach, by the weights'
# compute path (``weight_class``): fitted to the mixed (prefill) rows of every shipped table of
# real vLLM's grid steps, tables/vllm/ENGINE_H100.csv and ENGINE_H200.csv, with the rest of the
# roofline as it is (bench/roofline_efficiency.py prints the fit; tests check these against it).
# Measured on the H100 and H200 (one compute die); on any other GPU the same share is assumed.
MEASURED_FLOPS_EFFICIENCY = {"bf16": 0.76, "fp8": 0.62, "bf16-moe": 0.58, "mxfp4-moe": 0.79}
# ... and the time a layer that a step with prompt tokens pays beyond a decode step: vLLM runs such a
# step on piecewise CUDA graphs, its attention outside them (a decode step is one full graph), which
# shows in short prompts (Llama-3.1-8B bf16 on the H100: 64-128 tokens 8.6-9.0 ms against 6.6 ms a
# decode step). Fitted with the share above (the pair that best prices the class's mixed rows);
# the MoE classes' short rows are priced off by their dummy weights' routing either way and fit 0.
MEASURED_MIXED_LAYER_S = {"bf16": 63e-6, "fp8": 112e-6, "bf16-moe": 0.0, "mxfp4-moe": 0.0}
MEASURED_FLOPS_GPUS = ("H100-80GB-SXM", "H200")
# what each class was measured on (real vLLM 0.23.0, dummy weights)
MEASURED_FLOPS_ENGINES = {"bf16": "Llama-3.1-8B, Qwen3-32B", "fp8": "Llama-3.1-8B fp8, Llama-3.1-70B fp8",
                          "bf16-moe": "Qwen3-30B-A3B", "mxfp4-moe": "gpt-oss-20b, gpt-oss-120b"}


@dataclass(frozen=True)
class DecodeShares:
    """The memory side and the fixed cost of a step as real vLLM's decode steps show them: the
    shares of the datasheet bandwidth that its weight reads (``weights``) and its KV reads and
    writes (``kv``) reach, and a fixed latency per layer (``layer_s``: the graph's kernel launches
    and synchronisation, the step's CPU work that async scheduling does not hide); ``source`` says
    where they were measured."""

    weights: float
    kv: float
    layer_s: float
    source: str


# Fitted per GPU to the decode rows (CUDA-graph steps, 1-256 sequences, 512-4,096 tokens of
# context) of the shipped tables of real vLLM 0.23.0's dense engines (Llama-3.1-8B bf16 and fp8,
# Qwen3-32B, on the H200 also Llama-3.1-70B fp8): least squares of the relative error of
# weights / (bandwidth x weights) + KV / (bandwidth x kv) + layers x layer_s, each table weighing
# the same (bench/roofline_efficiency.py prints the fit and each engine's error with it fitted
# without that engine; tests check these against it). An untied input embedding is not streamed
# (a step looks up its tokens' rows). On any other GPU the H100's shares are assumed.
MEASURED_DECODE = {
    "H100-80GB-SXM": DecodeShares(0.95, 0.66, 58e-6, "real vLLM 0.23.0's decode steps on the H100"),
    "H200": DecodeShares(0.87, 0.56, 52e-6, "real vLLM 0.23.0's decode steps on the H200"),
}


def measured_decode(gpu: GpuSpec) -> DecodeShares:
    """The measured decode shares of ``gpu`` (MEASURED_DECODE), else the H100's, said extrapolated."""
    shares = MEASURED_DECODE.get(gpu.name)
    if shares is not None:
        return shares
    h100 = MEASURED_DECODE["H100-80GB-SXM"]
    return DecodeShares(h100.weights, h100.kv, h100.layer_s, f"{h100.source}, extrapolated to {gpu.name}")


def weight_class(model: ModelSpec) -> str:
    """The compute path of a model's GEMMs, as MEASURED_FLOPS_EFFICIENCY keys it: ``mxfp4-moe``
    (MXFP4 experts), ``fp8`` (fp8 weights, dense or MoE), ``bf16-moe`` (16-bit routed experts),
    else ``bf16`` (16-bit dense; integer-quantized weights, dequantized to 16-bit GEMMs, too)."""
    weights = model.weights
    method = weights.format.method if weights is not None else "dtype"
    moe = weights is not None and weights.breakdown.num_experts > 0
    if method == "mxfp4":
        return "mxfp4-moe"
    if method == "fp8" or dtype_bytes(model.dtype) == 1:
        return "fp8"
    return "bf16-moe" if moe else "bf16"


def measured_mixed_layer_s(model: ModelSpec) -> float:
    """The measured time a layer that a step with prompt tokens pays beyond a decode step, for the
    model's weights (MEASURED_MIXED_LAYER_S)."""
    return MEASURED_MIXED_LAYER_S[weight_class(model)]


def measured_flops_efficiency(model: ModelSpec, gpu: GpuSpec) -> tuple[float, str]:
    """(the measured share of the datasheet FLOP/s for the model's weights, what it says of
    itself): MEASURED_FLOPS_EFFICIENCY; on a GPU other than the ones measured, extrapolated."""
    cls = weight_class(model)
    where = "measured" if gpu.name in MEASURED_FLOPS_GPUS else "extrapolated from the H100 and H200"
    return MEASURED_FLOPS_EFFICIENCY[cls], (f"real vLLM 0.23.0's {cls} prefill steps ({MEASURED_FLOPS_ENGINES[cls]}; "
                                            f"{where})")


def input_embedding_bytes(model: ModelSpec) -> float:
    """The bytes of a model's input embedding table where an output projection of its own is
    streamed instead (untied: a step only looks up its tokens' rows); 0 when tied (the output
    projection reads it) or without the weights by kind."""
    weights = model.weights
    if weights is None or not weights.breakdown.total["lm_head"]:
        return 0.0
    return float(weights.breakdown.total["embedding"] * weights.format.dtype_bytes)


class RooflineCost:
    """Step duration from a roofline of (model, GPU, tp); see the module docstring.

    Args:
        model, gpu: the specs.
        tp: tensor-parallel size.
        kv_dtype: KV-cache dtype ("auto" = model dtype; "fp8" halves KV traffic).
        step_overhead_s: fixed time added to every step.
        bandwidth_efficiency, flops_efficiency: achievable fractions of the datasheet peaks, (0, 1].
        flops_source: where flops_efficiency comes from (``measured_flops_efficiency``'s text),
            for the clock line; "" for a given one.
        decode: measured DecodeShares (``measured_decode``): the weight and KV bytes at their own
            shares of the bandwidth (an untied input embedding not streamed) and ``num_layers x
            layer_s`` a step, in place of bandwidth_efficiency and step_overhead_s.
        mixed_layer_s: a time a layer that a step with prompt tokens pays beyond a decode step
            (``measured_mixed_layer_s``: its attention outside the CUDA graph).
        frontend: (in_s, in_s per prompt token, out_s, source): a request's way in to the engine
            and a token's way out to the client (vLLM's frontend: CPU and IPC, no GPU work), as a
            measured table's ``# frontend:`` line gives them (``frontend_s``, which the engine
            adds outside the steps); None: no way in or out.
    """

    def __init__(self, model: ModelSpec, gpu: GpuSpec, *, tp: int = 1, kv_dtype: str = "auto",
                 step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S, bandwidth_efficiency: float = 1.0,
                 flops_efficiency: float = 1.0, flops_source: str = "", decode: DecodeShares | None = None,
                 frontend: tuple[float, float, float, str] | None = None, mixed_layer_s: float = 0.0):
        if step_overhead_s < 0:
            raise InputError(f"step_overhead_s must be >= 0, got {step_overhead_s}")
        for name, value in (("bandwidth_efficiency", bandwidth_efficiency),
                            ("flops_efficiency", flops_efficiency)):
            if not 0 < value <= 1:
                raise InputError(f"{name} must be in (0, 1], got {value}")
        self.model, self.gpu, self.tp = model, gpu, tp
        self.decode = decode
        self.step_overhead_s = step_overhead_s if decode is None else model.num_layers * decode.layer_s
        self.weight_bytes = math.ceil(model.weight_bytes / tp)
        # MoE: the routed experts are read in the share a step's tokens touch
        weights = model.weights
        self._moe_weights = weights if weights is not None and weights.breakdown.num_experts else None
        self._last_weights = (None, float(self.weight_bytes))
        self.kv_bytes_per_token = kv_bytes_per_token(model, kv_dtype, tp)
        self.flops_per_token = 2.0 * model.active_params / tp
        self.attn_flops_per_pair = model.attn_flops_per_token_pair / tp
        self.bandwidth_bytes_per_s = gpu.memory_bandwidth_bytes_per_s * (
            bandwidth_efficiency if decode is None else decode.weights)
        self.kv_bandwidth_bytes_per_s = gpu.memory_bandwidth_bytes_per_s * (
            bandwidth_efficiency if decode is None else decode.kv)
        # with measured decode shares an untied input embedding is looked up, not streamed
        self.embedding_bytes = input_embedding_bytes(model) / tp if decode is not None else 0.0
        # fp8 checkpoints (DeepSeek's) run fp8 GEMMs: the GPU's fp8 peak
        fmt = getattr(model.weights, "format", None)
        compute_dtype = "fp8" if fmt is not None and fmt.method == "fp8" else model.dtype
        self.peak_flops_per_s = gpu.peak_flops_per_s(compute_dtype) * flops_efficiency
        self.flops_efficiency = flops_efficiency
        self.flops_source = flops_source
        self._last_lines = (None, None)
        # tensor parallelism: two all-reduces a layer of each token's activations
        self.allreduce = allreduce_link(gpu.name) if tp > 1 else None
        self.allreduce_bytes_per_token = model.hidden_size * max(2, dtype_bytes(model.dtype))
        self._last_allreduce = (None, 0.0)
        if mixed_layer_s < 0:
            raise InputError(f"mixed_layer_s must be >= 0, got {mixed_layer_s}")
        self.mixed_layer_s = mixed_layer_s
        self.mixed_step_s = model.num_layers * mixed_layer_s   # beyond a decode step's fixed part
        self.frontend_s = tuple(frontend[:3]) if frontend is not None else (0.0, 0.0, 0.0)
        self.frontend_source = frontend[3] if frontend is not None else ""

    def describe(self) -> str:
        """The clock's source: the roofline, its model and GPU, and the peaks it assumes."""
        share = self.bandwidth_bytes_per_s / self.gpu.memory_bandwidth_bytes_per_s
        if self.decode is None:
            memory = f"{self.bandwidth_bytes_per_s / 1e12:.2f} TB/s"
            shares = f"{share:.0%} and {self.flops_efficiency:.0%} of the datasheet"
            fixed = f"{self.step_overhead_s * 1e3:g} ms a step"
        else:
            memory = (f"{self.bandwidth_bytes_per_s / 1e12:.2f} TB/s for weights, "
                      f"{self.kv_bandwidth_bytes_per_s / 1e12:.2f} for KV")
            shares = (f"{share:.0%}, {self.decode.kv:.0%} and {self.flops_efficiency:.0%} of the datasheet; "
                      f"the bandwidth shares of {self.decode.source}")
            fixed = f"{self.decode.layer_s * 1e6:g} us a layer, {self.step_overhead_s * 1e3:.2f} ms a step"
        if self.mixed_layer_s:
            fixed += (f", a step with prompt tokens {self.mixed_layer_s * 1e6:g} us a layer more "
                      f"({self.mixed_step_s * 1e3:.2f} ms: its attention outside the CUDA graph)")
        return (f"roofline of {self.model.name} on {self.gpu.name} (tp {self.tp}): "
                f"{memory} and {self.peak_flops_per_s / 1e12:.0f} TFLOP/s ({shares}), {fixed}"
                f"{'; the FLOP/s share of ' + self.flops_source if self.flops_source else ''}"
                f"{self._describe_allreduce()}{self._describe_routing()}{self._describe_frontend()}"
                f"; not measured: --cost-table for a measured clock")

    def _describe_frontend(self) -> str:
        if not self.frontend_source:
            return ""
        way_in, per_token, way_out = self.frontend_s
        return (f"; a request's way in {way_in * 1e3:.2f} ms + {per_token * 1e6:.2f} us a prompt token and a "
                f"token's way out {way_out * 1e3:.2f} ms ({self.frontend_source})")

    def _describe_routing(self) -> str:
        if self._moe_weights is None:
            return ""
        routing = self._moe_weights.breakdown
        return (f", routed experts read as a step's tokens touch them ({routing.num_experts_per_tok} "
                f"of {routing.num_experts} each, routed uniformly)")

    def _describe_allreduce(self) -> str:
        if self.tp <= 1:
            return ""
        if self.allreduce is None:
            return f", no all-reduce time (no link figures for {self.gpu.name})"
        return (f", {2 * self.model.num_layers} all-reduces a step over {self.allreduce.name} "
                f"({self.allreduce.source} figures, not measured)")

    def allreduce_s(self, num_tokens: int) -> float:
        """The step's all-reduce time (0 at tp 1 or without link figures)."""
        if self.allreduce is None or num_tokens <= 0:
            return 0.0
        if self._last_allreduce[0] == num_tokens:
            return self._last_allreduce[1]
        t = 2 * self.model.num_layers * self.allreduce.seconds(num_tokens * self.allreduce_bytes_per_token,
                                                                self.tp)
        self._last_allreduce = (num_tokens, t)
        return t

    def weights_read_bytes(self, num_tokens: int) -> float:
        """Weight bytes one rank reads in a step of ``num_tokens`` tokens (see the module
        docstring)."""
        if self._moe_weights is None:
            return float(self.weight_bytes)
        if self._last_weights[0] == num_tokens:
            return self._last_weights[1]
        read = self._moe_weights.step_bytes(num_tokens) / self.tp
        self._last_weights = (num_tokens, read)
        return read

    def __repr__(self) -> str:
        return (f"RooflineCost({self.model.name}, {self.gpu.name}, tp={self.tp}, "
                f"overhead={self.step_overhead_s}s)")

    def _lines(self, batch) -> tuple[float, float, float, float]:
        """Memory and compute time of the batch and their growth per decode step (seconds).
        The last batch's lines are kept: a simulator prices one run several times."""
        cached = self._last_lines
        if cached[0] is batch:
            return cached[1]
        scheduled = batch.num_scheduled_tokens
        mem0 = (self.weights_read_bytes(scheduled) - self.embedding_bytes) / self.bandwidth_bytes_per_s \
            + (batch.kv_read_tokens + scheduled) * self.kv_bytes_per_token / self.kv_bandwidth_bytes_per_s
        comp0 = (self.flops_per_token * scheduled + self.attn_flops_per_pair * batch.attn_token_pairs) \
            / self.peak_flops_per_s
        # one decode step later every sequence's context is one token longer: each reads one more
        # token of KV and its (single) new token attends to one more position
        mem_slope = batch.num_seqs * self.kv_bytes_per_token / self.kv_bandwidth_bytes_per_s
        comp_slope = batch.num_seqs * self.attn_flops_per_pair / self.peak_flops_per_s
        lines = (mem0, mem_slope, comp0, comp_slope)
        self._last_lines = (batch, lines)
        return lines

    def step_time_s(self, batch) -> float:
        """Duration of one step (0 for a step that schedules no tokens)."""
        if batch.num_scheduled_tokens <= 0:
            return 0.0
        mem0, _, comp0, _ = self._lines(batch)
        fixed = self.step_overhead_s + (self.mixed_step_s if batch.num_prefill_tokens else 0.0)
        if self.allreduce is None:
            return max(mem0, comp0) + fixed
        return max(mem0, comp0) + self.allreduce_s(batch.num_scheduled_tokens) + fixed

    def run_time_s(self, batch, num_steps: int) -> float:
        """Total duration of num_steps decode steps, step j having every context j tokens longer.

        Closed form: each step's time is the max of two lines in j; sum each line arithmetically
        over the range of j where it is the larger one.
        """
        if num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {num_steps}")
        if num_steps == 0 or batch.num_scheduled_tokens <= 0:
            return 0.0
        a, b, c, d = self._lines(batch)
        last = num_steps - 1
        if b == d:  # parallel lines: one dominates throughout
            total = _line_sum(a, b, 0, last) if a >= c else _line_sum(c, d, 0, last)
        else:
            cross = (c - a) / (b - d)  # memory line >= compute line for j >= cross when b > d
            if b > d:
                split = min(max(math.ceil(cross), 0), num_steps)  # first j where memory dominates
                total = _line_sum(c, d, 0, split - 1) + _line_sum(a, b, split, last)
            else:
                split = min(max(math.floor(cross) + 1, 0), num_steps)  # first j where compute dominates
                total = _line_sum(a, b, 0, split - 1) + _line_sum(c, d, split, last)
        return total + num_steps * (self.step_overhead_s + self.allreduce_s(batch.num_scheduled_tokens))


def _line_sum(intercept: float, slope: float, lo: int, hi: int) -> float:
    """Sum of intercept + slope * j over j = lo..hi (0 for an empty range)."""
    if hi < lo:
        return 0.0
    n = hi - lo + 1
    return n * intercept + slope * (lo + hi) * n / 2.0
