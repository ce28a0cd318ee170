"""First-use Triton compiles of real vLLM: what a freshly started engine pays on its first steps.

A Triton kernel compiles once for each specialisation of its arguments, the first time a step
needs it, inside that step. These of vLLM 0.23.0's kernels compile in the steps of a fresh engine
(each compile timed by the harness's probe, ``jit.csv`` of bench/results/vllm_h100/):

* ``_compute_slot_mapping_kernel`` (the input preparation of every step, every model: outside
  any CUDA graph), specialised by the step's token count as Triton does an integer: equal to 1,
  divisible by 16, or neither. The third compiles at start-up; a fresh engine's first step of
  one token and its first of a multiple of 16 tokens each compile one (0.14 s on the mean).
* gpt-oss's MXFP4 MoE routing (vLLM's 'TRITON' Mxfp4 MoE backend on Hopper: triton_kernels'
  ``_topk_forward`` and ``_sum_bitmatrix_rows``), whose bitmatrix stride (the step's tokens
  rounded up to 32) is a compile-time constant beside the token count's divisibility by 16. A step
  on a CUDA graph replays kernels captured at start-up; an eager step (more tokens than the largest
  graph) whose key the engine has not run compiles both (on the mean 0.73 s on gpt-oss-20b, 1.49 s
  on gpt-oss-120b). vLLM's start-up profile run at ``max_num_batched_tokens`` compiles that one key.

* gpt-oss's two expert matmuls (triton_kernels' ``matmul_ogs``: the gate/up projection with its
  fused SwiGLU, then the down projection), on the same eager steps. Their specialisation is a
  function of the step's tokens n, E experts and top-k k (vLLM 0.23.0's bundled triton_kernels,
  ``make_default_opt_flags_nvidia`` and ``RoutingData.n_blocks``): BLOCK_M = the next power of two
  of n*k // E, clamped to 16-128 (a constant of the kernel); grid_m = cdiv(n*k - E + 1, BLOCK_M) +
  E - 1 blocks; and Triton's specialisation (1, a multiple of 16, or neither) of the up
  projection's rows (n), the down projection's rows (n*k) and grid_m. vLLM's start-up compiles
  the keys of every CUDA-graph size it captures and of its profile run; a new key costs 0.5-1.7 s
  a kernel.
* gpt-oss's routing's token sort (triton_kernels' SortTokens: ``_combined_routing_memset`` and
  ``_combined_routing_compute``), on the same eager steps, specialised by Triton's keys of sizes
  that follow from the step's tokens (routing_sort_keys); rarer (4 compiles in gpt-oss-20b-keys'
  358 eager steps), 0.27-1.13 s.

The rules predict every compile of these kernels in the fresh engines measured (tests/
test_first_use.py reads them): the routing's 47 of gpt-oss-20b-jit, -cached and gpt-oss-120b-jit,
the expert matmuls' 10 and the token sort's 1 of the same engines (after what the harness's warm-up
compiled, where its steps were recorded: ``warmup_steps`` of meta.json), all 364 of the routing's,
the expert matmuls' and the token sort's in gpt-oss-20b-keys' 381 steps, and the slot mapping's of gpt-oss-20b-jit,
gpt-oss-120b-jit and three Qwen3-30B-A3B reruns. Not modelled: a compile Triton finds in its disk
cache (a second engine on the same machine: gpt-oss-20b-cached's slot mapping), any kernel another
vLLM version or GPU may add; nor what else a fresh Qwen3-30B-A3B engine's first eager step pays
(0.3-0.6 s beyond its price and the slot mapping's compiles, no Triton compile among it: the
harness's warm-up had compiled the ``fused_moe_kernel`` keys vLLM's monitor reports, as
qwen3-30b-a3b-rerun3's probe log shows). The H100's seconds carry to the other GPUs (compile
time is CPU work, not the GPU's): extrapolated.
"""
from __future__ import annotations

# seconds a new routing key costs, by model: _topk_forward + _sum_bitmatrix_rows on the mean over
# the timed compiles (one H100 80GB HBM3, 2026-12-07): gpt-oss-20b's 29 of gpt-oss-20b-jit and
# -cached (0.577 + 0.148 s), gpt-oss-120b's 18 of gpt-oss-120b-jit (1.332 + 0.161 s: 128 experts
# against 32). Another MXFP4 MoE model takes gpt-oss-20b's, extrapolated.
ROUTING_COMPILE_S = {"gpt-oss-20b": 0.725, "gpt-oss-120b": 1.493}
ROUTING_MEASURED_ON = "H100"
# seconds a new slot-mapping key costs: the mean of its 10 compiles in the five fresh engines
# gpt-oss-20b-jit, gpt-oss-120b-jit, qwen3-30b-a3b-rerun, -rerun2 and -rerun3 (H100, 2026-12-07)
SLOT_MAPPING_COMPILE_S = 0.1425
SLOT_MAPPING_MEASURED_ON = "gpt-oss-20b, gpt-oss-120b and Qwen3-30B-A3B, H100"


# seconds a new key of each expert matmul costs, by model: the mean over the timed compiles (one
# H100 80GB HBM3, 2026-12-07): gpt-oss-20b's of gpt-oss-20b-jit and -cached (2 a kernel),
# gpt-oss-120b's of gpt-oss-120b-jit (3 a kernel). Another MXFP4 MoE model takes gpt-oss-20b's,
# extrapolated.
EXPERT_MATMUL_COMPILE_S = {"gpt-oss-20b": {"up": 1.469, "down": 1.440},
                           "gpt-oss-120b": {"up": 1.153, "down": 1.121}}
# seconds a new key of the routing's token sort costs: gpt-oss-20b's mean over the timed compiles of
# gpt-oss-20b-cached and -keys (H100, 2026-12-07: 4 of the memset, 1 of the compute); gpt-oss-120b
# and any other MXFP4 MoE model take them, extrapolated.
ROUTING_SORT_COMPILE_S = {"gpt-oss-20b": {"memset": 0.289, "compute": 1.128}}


def triton_int_key(value: int) -> str:
    """Triton's specialisation of an integer argument: '1', '16' (divisible by 16) or 'other'."""
    return "1" if value == 1 else "16" if value % 16 == 0 else "other"


def vllm_capture_sizes(largest: int) -> list[int]:
    """vLLM's CUDA-graph capture sizes up to its largest: 1, 2, 4, every 8 to 248, every 16 from
    256 (the engines' logged ``cudagraph_capture_sizes``)."""
    return [s for s in [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, largest + 1, 16)) if s <= largest]


def expert_matmul_keys(num_tokens: int, num_experts: int, top_k: int) -> dict[str, tuple]:
    """What gpt-oss's two expert matmuls are compiled for at a step of ``num_tokens`` (module
    docstring): per kernel ('up', 'down'), BLOCK_M and the Triton keys of its rows and grid_m."""
    rows = num_tokens * top_k
    block_m = max(16, min(1 << (max(1, rows // num_experts) - 1).bit_length(), 128))
    grid_m = rows if rows <= num_experts else -(-(rows - num_experts + 1) // block_m) + num_experts - 1
    return {"up": (block_m, triton_int_key(num_tokens), triton_int_key(grid_m)),
            "down": (block_m, triton_int_key(rows), triton_int_key(grid_m))}


def routing_sort_keys(num_tokens: int, num_experts: int, top_k: int) -> dict[str, tuple]:
    """What the routing's token sort (triton_kernels' SortTokens: ``_combined_routing_memset`` and
    ``_combined_routing_compute``) is compiled for at a step of ``num_tokens`` (module docstring):
    the Triton keys of the memset's size (2 x tokens x top-k), of the partial histogram's rows
    (tokens / 32) and stride (4 x tokens / 128) and of its first blocks (4 x the tiles / 512, + 5),
    and of the compute's token count and that stride."""
    gates = num_tokens * top_k
    tiles = gates if gates <= num_experts else num_experts - 1 - ((num_experts - gates - 1) // 16)
    stride = 4 * -(-num_tokens // 128)
    return {"memset": (triton_int_key(2 * gates), triton_int_key(-(-num_tokens // 32)), triton_int_key(stride),
                       triton_int_key(4 * -(-tiles // 512) + 5)),
            "compute": (triton_int_key(num_tokens), triton_int_key(stride))}


def routing_key(num_tokens: int) -> tuple[int, bool]:
    """What the routing kernels are compiled for: the tokens rounded up to 32 (the bitmatrix's
    stride, a constant of the kernel) and whether they divide by 16 (Triton's specialisation)."""
    return -(-num_tokens // 32) * 32, num_tokens % 16 == 0


def slot_mapping_key(num_tokens: int) -> str:
    """Triton's specialisation of the slot-mapping kernel's token count."""
    return triton_int_key(num_tokens)


class SlotMappingCompiles:
    """The slot-mapping kernel's rule: every step runs it; 'other' is compiled at start-up."""

    name = "slot_mapping"

    def __init__(self, compile_s: float = SLOT_MAPPING_COMPILE_S, measured_on: str = SLOT_MAPPING_MEASURED_ON):
        self.compile_s = compile_s
        self.measured_on = measured_on

    def key(self, num_tokens: int):
        return slot_mapping_key(num_tokens)

    def start_keys(self, max_num_batched_tokens: int) -> set:
        return {"other"}

    def describe(self) -> str:
        return (f"{self.compile_s:.3g} s of the slot mapping's at the first step of 1 token and the first of a "
                f"multiple of 16 (measured on {self.measured_on})")


class RoutingCompiles:
    """The MXFP4 MoE routing's rule: ``graph_tokens``, the largest CUDA graph (a step of more
    tokens runs eager); ``compile_s`` per new key."""

    name = "routing"

    def __init__(self, graph_tokens: int, compile_s: float = ROUTING_COMPILE_S["gpt-oss-20b"],
                 measured_on: str = f"gpt-oss-20b, {ROUTING_MEASURED_ON}"):
        self.graph_tokens = graph_tokens
        self.compile_s = compile_s
        self.measured_on = measured_on

    def key(self, num_tokens: int):
        """None for a step on a CUDA graph (nothing compiles)."""
        return routing_key(num_tokens) if num_tokens > self.graph_tokens else None

    def start_keys(self, max_num_batched_tokens: int) -> set:
        return {routing_key(max_num_batched_tokens)}     # vLLM's profile run

    def describe(self) -> str:
        return (f"{self.compile_s:.3g} s of the MoE routing's at an eager step (over {self.graph_tokens} tokens) "
                f"whose token count, rounded up to 32, the engine has not run (measured on {self.measured_on})")


def routing_compiles(graph_tokens: int, model: str | None) -> RoutingCompiles:
    """The routing's rule for an MXFP4 MoE ``model`` (its seconds: _priced)."""
    return RoutingCompiles(graph_tokens, *_priced(ROUTING_COMPILE_S, model))


class EagerKernelCompiles:
    """One MXFP4 MoE kernel's rule whose key is a function of an eager step's tokens
    (``keys_of(num_tokens)[kernel]``: expert_matmul_keys, routing_sort_keys): ``graph_tokens``, the
    largest CUDA graph (a step of more tokens runs eager); ``compile_s`` per new key; ``what``
    names the kernel and its key for describe."""

    def __init__(self, family: str, kernel: str, keys_of, graph_tokens: int, compile_s: float, measured_on: str,
                 what: str):
        self.kernel = kernel
        self.name = f"{family}_{kernel}"
        self.keys_of = keys_of
        self.graph_tokens = graph_tokens
        self.compile_s = compile_s
        self.measured_on = measured_on
        self.what = what

    def key(self, num_tokens: int):
        """None for a step on a CUDA graph (nothing compiles)."""
        return self.keys_of(num_tokens)[self.kernel] if num_tokens > self.graph_tokens else None

    def start_keys(self, max_num_batched_tokens: int) -> set:
        """Every captured graph's key and vLLM's profile run's."""
        return {self.keys_of(n)[self.kernel] for n in vllm_capture_sizes(self.graph_tokens) + [max_num_batched_tokens]}

    def describe(self) -> str:
        return f"{self.compile_s:.3g} s of {self.what} the engine has not run (measured on {self.measured_on})"


def _priced(table: dict, model: str | None) -> tuple[dict, str]:
    """A model's measured seconds from ``table`` and where they were measured; gpt-oss-20b's,
    said extrapolated, for another model."""
    if model in table:
        return table[model], f"{model}, {ROUTING_MEASURED_ON}"
    return table["gpt-oss-20b"], f"gpt-oss-20b, {ROUTING_MEASURED_ON}; extrapolated to {model}"


def expert_matmul_compiles(graph_tokens: int, model: str | None, num_experts: int, top_k: int) -> tuple:
    """Both expert matmuls' rules for an MXFP4 MoE ``model``."""
    seconds, on = _priced(EXPERT_MATMUL_COMPILE_S, model)
    return tuple(EagerKernelCompiles(
        "expert_matmul", k, lambda n: expert_matmul_keys(n, num_experts, top_k), graph_tokens, seconds[k], on,
        f"the expert matmul ({k}) at an eager step whose block size, rows and blocks (by {num_experts} experts, "
        f"top-{top_k})") for k in ("up", "down"))


def routing_sort_compiles(graph_tokens: int, model: str | None, num_experts: int, top_k: int) -> tuple:
    """The routing's token sort's two kernels' rules for an MXFP4 MoE ``model``."""
    seconds, on = _priced(ROUTING_SORT_COMPILE_S, model)
    return tuple(EagerKernelCompiles(
        "routing_sort", k, lambda n: routing_sort_keys(n, num_experts, top_k), graph_tokens, seconds[k], on,
        f"the routing's token sort ({k}) at an eager step whose sizes (by {num_experts} experts, top-{top_k})")
        for k in ("memset", "compute"))


class FirstUseCompiles:
    """The first-use compiles of one engine kind: its kernels' rules, and ``compiled``: the keys
    (kernel name, key) an engine that served other work first had run."""

    def __init__(self, rules: tuple, compiled: frozenset = frozenset()):
        self.rules = tuple(rules)
        self.compiled = frozenset(compiled)
        self._compile_s = {r.name: r.compile_s for r in self.rules}

    def keys(self, num_tokens: int) -> list:
        """The (kernel, key) pairs a step of ``num_tokens`` needs compiled."""
        return [(r.name, k) for r in self.rules if (k := r.key(num_tokens)) is not None]

    def having_run(self, num_tokens) -> "FirstUseCompiles":
        """The same engine after it ran steps of these token counts (bench/vllm_compare.py replays
        a workload in the state its engine was in)."""
        return FirstUseCompiles(self.rules, self.compiled | {k for m in num_tokens for k in self.keys(m)})

    def at_start(self, max_num_batched_tokens: int) -> set:
        """The keys a replica starts with compiled: start-up's (and ``compiled``)."""
        return {(r.name, k) for r in self.rules for k in r.start_keys(max_num_batched_tokens)} | self.compiled

    def compiles(self, compiled: set, num_tokens: int) -> bool:
        """Whether a step of ``num_tokens`` meets a key not in ``compiled``."""
        return any(key not in compiled for key in self.keys(num_tokens))

    def stall_s(self, compiled: set, num_tokens: int, tally: dict | None = None) -> float:
        """Seconds a step of ``num_tokens`` spends compiling, given the replica's ``compiled`` keys
        (updated); ``tally``: each kernel's [compiles, seconds] so far (updated)."""
        stall = 0.0
        for key in self.keys(num_tokens):
            if key not in compiled:
                compiled.add(key)
                seconds = self._compile_s[key[0]]
                stall += seconds
                if tally is not None:
                    count = tally.setdefault(key[0], [0, 0.0])
                    count[0] += 1
                    count[1] += seconds
        return stall

    def describe(self) -> str:
        return "first-use compiles (a fresh engine): " + "; ".join(r.describe() for r in self.rules)


def compiles_summary(tallies: list[dict]) -> dict:
    """The summary's ``first_use_compiles``: the replicas' tallies (FirstUseCompiles.stall_s) added
    up, each kernel's compiles and seconds and their totals (seconds summed over replicas)."""
    by_kernel: dict = {}
    for tally in tallies:
        for name, (count, seconds) in tally.items():
            entry = by_kernel.setdefault(name, {"compiles": 0, "seconds": 0.0})
            entry["compiles"] += count
            entry["seconds"] += seconds
    by_kernel = {k: {"compiles": v["compiles"], "seconds": round(v["seconds"], 6)}
                 for k, v in sorted(by_kernel.items())}
    return {"compiles": sum(v["compiles"] for v in by_kernel.values()),
            "seconds": round(sum(v["seconds"] for v in by_kernel.values()), 6), "by_kernel": by_kernel}
