"""simulator.first_use: a fresh engine's first-use Triton compiles, by the rules the harness's timed
compiles show (every model's slot mapping: a step's token count equal to 1, divisible by 16 or
neither; gpt-oss's MoE routing: an eager step's tokens rounded up to 32, and divisible by 16 or
not; gpt-oss's expert matmuls: their block size, rows and blocks), each checked against every
compile of that kernel in the measured fresh engines, and as the engine adds them."""
from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import pytest

from kvsim.simulator import simulate
from kvsim.simulator.config import EngineConfig
from kvsim.simulator.cost import FixedStepCost, WrappedCost
from kvsim.simulator.first_use import (EXPERT_MATMUL_COMPILE_S, ROUTING_COMPILE_S, ROUTING_SORT_COMPILE_S,
                                       SLOT_MAPPING_COMPILE_S, EagerKernelCompiles, FirstUseCompiles, RoutingCompiles,
                                       SlotMappingCompiles, expert_matmul_compiles, expert_matmul_keys, routing_key,
                                       routing_sort_compiles, routing_sort_keys, slot_mapping_key, vllm_capture_sizes)
from kvsim.workloads import Request

RUNS = Path(__file__).resolve().parent.parent / "bench" / "results" / "vllm_h100"


def test_the_key_is_the_tokens_rounded_up_to_32_and_their_divisibility_by_16():
    assert routing_key(7168) == (7168, True) and routing_key(7169) == (7200, False)
    assert routing_key(1030) == (1056, False) and routing_key(1088) == (1088, True)
    compiles = FirstUseCompiles((RoutingCompiles(graph_tokens=1024, compile_s=0.7),))
    seen = compiles.at_start(8192)
    assert compiles.stall_s(seen, 8192) == 0.0                    # vLLM's profile run compiled it
    assert compiles.stall_s(seen, 1024) == 0.0                    # on a CUDA graph
    assert compiles.stall_s(seen, 2049) == 0.7 and compiles.stall_s(seen, 2050) == 0.0   # same key
    assert compiles.stall_s(seen, 2048) == 0.7                    # 2,048 divides by 16: another key
    later = compiles.having_run([2049, 500, 3000])
    assert later.at_start(8192) == {("routing", k) for k in ((8192, True), (2080, False), (3008, False))}


def test_the_slot_mapping_compiles_once_for_one_token_and_once_for_a_multiple_of_16_and_adds_up():
    """Every step runs the slot mapping (on a CUDA graph or not): its first step of one token and
    its first of a multiple of 16 each compile once; the third key compiles at start-up. Beside
    the routing, a step pays both kernels' new keys."""
    assert [slot_mapping_key(m) for m in (1, 2, 15, 16, 1024, 1025)] == ["1", "other", "other", "16", "16", "other"]
    both = FirstUseCompiles((SlotMappingCompiles(compile_s=0.1), RoutingCompiles(graph_tokens=512, compile_s=0.7)))
    seen = both.at_start(8192)
    assert [both.stall_s(seen, m) for m in (3, 7, 16, 32, 1)] == [0.0, 0.0, 0.1, 0.0, 0.1]
    assert both.stall_s(seen, 2048) == pytest.approx(0.7)        # '16' ran; a new routing key
    assert both.stall_s(FirstUseCompiles(both.rules).at_start(8192), 2048) == pytest.approx(0.8)
    assert both.having_run([1]).stall_s(both.having_run([1]).at_start(8192), 1) == 0.0


def _jit(folder: Path, kernel: str) -> list[dict]:
    """The probe's timed compiles of ``kernel`` in one workload (jit.csv): each with its argument
    names mapped to their specialisation, and its seconds."""
    out = []
    with open(folder / "jit.csv") as f:
        for row in csv.DictReader(f):
            if row["kernel"] == kernel:
                spec = dict(zip(row["arg_names"].split(","), ast.literal_eval(row["key"][:row["key"].index("]") + 1])))
                out.append({"spec": spec, "s": float(row["t1_s"]) - float(row["t0_s"])})
    return out


def _in_order(root: Path):
    """An engine's workloads (name, folder) in the order it served them."""
    meta = json.loads((root / "meta.json").read_text())
    return meta, [(name, root / name) for name, _ in sorted(meta["workloads"].items(), key=lambda kv: kv[1]["t0_monotonic"])]


def _warmed(meta: dict, compiles: FirstUseCompiles) -> set:
    """The keys an engine had compiled when its first workload began: start-up's and its warm-up's
    (meta.json's ``warmup_steps``, where recorded)."""
    seen = compiles.at_start(meta["engine_core"]["max_num_batched_tokens"])
    for m in meta.get("warmup_steps", []):
        compiles.stall_s(seen, m)
    return seen


FRESH = ["gpt-oss-20b-jit", "gpt-oss-120b-jit", "qwen3-30b-a3b-rerun", "qwen3-30b-a3b-rerun2", "qwen3-30b-a3b-rerun3"]


@pytest.mark.parametrize("engine", FRESH)
def test_the_rule_predicts_every_slot_mapping_compile_of_the_fresh_engines(engine):
    """Every step's token count (steps.csv) against the slot mapping's compiles the probe timed
    (jit.csv: its num_tokens argument specialised as constexpr 1, 'D' for a multiple of 16, or
    neither), in the engine's order, from start-up's key."""
    root = RUNS / engine
    if not (root / "meta.json").exists():
        pytest.skip("no measured runs here")
    meta, workloads = _in_order(root)
    compiles = FirstUseCompiles((SlotMappingCompiles(),))
    seen = _warmed(meta, compiles)
    total = 0
    for name, folder in workloads:
        with open(folder / "steps.csv") as f:
            predicted = [slot_mapping_key(m) for m in (int(r["num_scheduled_tokens"]) for r in csv.DictReader(f))
                         if compiles.stall_s(seen, m)]
        measured = [{("constexpr", 1): "1", ("i32", "D"): "16"}.get(tuple(c["spec"]["num_tokens"]), "other")
                    for c in _jit(folder, "_compute_slot_mapping_kernel")]
        assert sorted(predicted) == sorted(measured), name
        total += len(measured)
    assert total == 2       # each engine met both keys


@pytest.mark.parametrize("model, engines", [("gpt-oss-20b", ["gpt-oss-20b-jit", "gpt-oss-20b-cached"]),
                                           ("gpt-oss-120b", ["gpt-oss-120b-jit"])])
def test_the_routings_price_is_its_models_mean_over_its_timed_compiles(model, engines):
    """A new key's seconds: _topk_forward's mean plus _sum_bitmatrix_rows's over the engines' compiles."""
    if not all((RUNS / e / "meta.json").exists() for e in engines):
        pytest.skip("no measured runs here")
    folders = [folder for e in engines for _, folder in _in_order(RUNS / e)[1]]
    means = [sum(s := [c["s"] for f in folders for c in _jit(f, k)]) / len(s)
             for k in ("_topk_forward", "_sum_bitmatrix_rows")]
    assert ROUTING_COMPILE_S[model] == pytest.approx(sum(means), abs=5e-4)


def test_the_slot_mappings_price_is_the_mean_of_the_fresh_engines_compiles():
    seconds = [c["s"] for e in FRESH if (RUNS / e / "meta.json").exists()
               for _, folder in _in_order(RUNS / e)[1] for c in _jit(folder, "_compute_slot_mapping_kernel")]
    if len(seconds) < 10:
        pytest.skip("no measured runs here")
    assert SLOT_MAPPING_COMPILE_S == pytest.approx(sum(seconds) / len(seconds), abs=5e-4)


@pytest.mark.parametrize("engine", ["gpt-oss-20b-jit", "gpt-oss-20b-cached", "gpt-oss-120b-jit"])
def test_the_rule_predicts_every_routing_compile_of_the_measured_engines(engine):
    """Every workload's eager steps (their token counts, steps.csv) against the routing compiles the
    probe timed (jit.csv's _topk_forward: the key's bitmatrix stride and the token count's
    specialisation), in the engine's order, from vLLM's profile run's key."""
    root = RUNS / engine
    if not (root / "meta.json").exists():
        pytest.skip("no measured runs here")
    meta, workloads = _in_order(root)
    compiles = FirstUseCompiles((RoutingCompiles(graph_tokens=1024),))
    seen = _warmed(meta, compiles)
    total = 0
    for name, folder in workloads:
        predicted = []
        with open(folder / "steps.csv") as f:
            for row in csv.DictReader(f):
                m = int(row["num_scheduled_tokens"])
                if compiles.stall_s(seen, m):
                    predicted.append(routing_key(m))
        measured = [(c["spec"]["stride_rn"][1], c["spec"]["n_rows"][1] == "D") for c in _jit(folder, "_topk_forward")]
        assert sorted(predicted) == sorted(measured), name
        total += len(measured)
    assert total >= 14


def test_the_expert_matmuls_keys_are_their_block_size_rows_and_blocks():
    """gpt-oss-20b (32 experts, top-4) and -120b (128): the keys of the compiles the probe timed
    (BLOCK_M, the rows' and grid_m's Triton keys), BLOCK_M's steps at 32 and 64 tokens an expert,
    and vLLM's capture sizes as the engines logged them."""
    assert expert_matmul_keys(1045, 32, 4) == {"up": (128, "other", "16"), "down": (128, "other", "16")}
    assert expert_matmul_keys(4201, 32, 4) == {"up": (128, "other", "other"), "down": (128, "other", "other")}
    assert expert_matmul_keys(2048, 128, 4) == {"up": (64, "16", "other"), "down": (64, "16", "other")}
    assert expert_matmul_keys(1087, 128, 4)["up"] == (64, "other", "other")
    assert expert_matmul_keys(3118, 128, 4)["down"] == (128, "other", "16")
    assert [expert_matmul_keys(n, 128, 4)["up"][0] for n in (1055, 1056, 2079, 2080)] == [32, 64, 64, 128]
    # one token: 4 rows, 4 blocks
    assert expert_matmul_keys(1, 32, 4) == {"up": (16, "1", "other"), "down": (16, "other", "other")}
    for engine in ("gpt-oss-20b-jit", "gpt-oss-120b-jit"):
        if (RUNS / engine / "meta.json").exists():
            logged = json.loads((RUNS / engine / "meta.json").read_text())["engine_core"]["cudagraph_capture_sizes"]
            assert vllm_capture_sizes(max(logged)) == logged


def test_start_up_compiles_every_captured_size_so_a_step_pays_only_its_new_kernels():
    """Graphs to 64 tokens, 32 experts, top-4, a profile run of 256 tokens: a step of 100 tokens
    (BLOCK_M 16) is eager, but both its keys are captured sizes' (2 tokens: 8 rows and blocks, not
    multiples of 16; 64 tokens: 256 rows, 46 blocks). 200 tokens (BLOCK_M 32, 800 rows, 56 blocks)
    pays its up projection's key alone (its down projection's is the profile run's); 201 (804
    rows) its down projection's alone."""
    up, down = (EagerKernelCompiles("expert_matmul", k, lambda n: expert_matmul_keys(n, 32, 4), 64, s, "test", "test")
                for k, s in (("up", 1.0), ("down", 0.5)))
    compiles = FirstUseCompiles((up, down))
    seen = compiles.at_start(256)
    assert ("expert_matmul_down", (32, "16", "other")) in seen
    assert compiles.stall_s(seen, 256) == 0.0 and compiles.stall_s(seen, 64) == 0.0
    assert compiles.stall_s(seen, 100) == 0.0
    assert compiles.stall_s(seen, 200) == 1.0 and compiles.stall_s(seen, 200) == 0.0
    assert compiles.stall_s(seen, 201) == 0.5
    assert FirstUseCompiles((up, down)).stall_s(set(), 201) == 1.5       # an engine that compiled nothing
    rules = expert_matmul_compiles(1024, "gpt-oss-9b", 32, 4)
    assert [r.compile_s for r in rules] == [EXPERT_MATMUL_COMPILE_S["gpt-oss-20b"][k] for k in ("up", "down")]
    assert "extrapolated to gpt-oss-9b" in rules[0].describe()


def _matmul_compiles(folder: Path) -> list[tuple]:
    """The expert matmuls' compiles the probe timed in one workload, as (rule name, key)."""
    out = []
    for c in _jit(folder, "define_kernel.<locals>._empty_fn"):
        spec = c["spec"]
        if "NRows" not in spec:
            continue                     # another kernel triton_kernels specialises the same way
        up = spec["ACTIVATION_REDUCTION_N"][1] == 2      # the gate/up projection's fused SwiGLU
        rows = {("constexpr", 1): "1", ("i32", "D"): "16"}
        out.append((f"expert_matmul_{'up' if up else 'down'}",
                    (spec["BLOCK_M"][1], rows.get(tuple(spec["NRows"]), "other"),
                     rows.get(tuple(spec["grid_m"]), "other"))))
    return out


# each eager kernel family: its rules, the probe's timed compiles of it, and how many each engine's
# measured loops hold (the expert matmuls': 10; the token sort's: -cached's one)
FAMILIES = {"expert_matmul": (expert_matmul_compiles, lambda f: _matmul_compiles(f),
                              {"gpt-oss-20b-jit": 2, "gpt-oss-20b-cached": 2, "gpt-oss-120b-jit": 6}),
            "routing_sort": (routing_sort_compiles, lambda f: _sort_compiles(f),
                             {"gpt-oss-20b-jit": 0, "gpt-oss-20b-cached": 1, "gpt-oss-120b-jit": 0})}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("engine, experts", [("gpt-oss-20b-jit", 32), ("gpt-oss-20b-cached", 32),
                                             ("gpt-oss-120b-jit", 128)])
def test_the_rule_predicts_every_eager_kernel_compile_of_the_measured_engines(engine, experts, family):
    """Every workload's eager steps (steps.csv) against the expert matmuls' (or the routing's token
    sort's) compiles the probe timed (jit.csv), in the engine's order, from start-up's keys and the
    warm-up's: the keys, each kernel's, exactly. gpt-oss-120b-jit predates ``warmup_steps``: there
    every timed compile is predicted, and each key predicted beyond them is one a warm-up step could
    have compiled (its 8 prompts of 600 tokens, some of them in a step, beside the decodes of those
    before)."""
    rules, timed, count = FAMILIES[family]
    root = RUNS / engine
    if not (root / "meta.json").exists():
        pytest.skip("no measured runs here")
    meta, workloads = _in_order(root)
    compiles = FirstUseCompiles(rules(1024, "gpt-oss", experts, 4))
    seen = _warmed(meta, compiles)
    warmup_could = {k for p in range(1, 9) for d in range(9 - p) for k in compiles.keys(600 * p + d)}
    total = 0
    for name, folder in workloads:
        with open(folder / "steps.csv") as f:
            predicted = [k for row in csv.DictReader(f) for k in compiles.keys(int(row["num_scheduled_tokens"]))
                         if k not in seen and not seen.add(k)]
        measured = timed(folder)
        if "warmup_steps" in meta:
            assert sorted(predicted) == sorted(measured), name
        else:
            assert set(measured) <= set(predicted) and set(predicted) - set(measured) <= warmup_could, name
        total += len(measured)
    assert total == count[engine]


@pytest.mark.parametrize("model, engines", [("gpt-oss-20b", ["gpt-oss-20b-jit", "gpt-oss-20b-cached"]),
                                           ("gpt-oss-120b", ["gpt-oss-120b-jit"])])
def test_the_expert_matmuls_price_is_each_kernels_mean_over_its_models_timed_compiles(model, engines):
    if not all((RUNS / e / "meta.json").exists() for e in engines):
        pytest.skip("no measured runs here")
    seconds = {"up": [], "down": []}
    for e in engines:
        for _, folder in _in_order(RUNS / e)[1]:
            for c in _jit(folder, "define_kernel.<locals>._empty_fn"):
                if "NRows" in c["spec"]:
                    seconds["up" if c["spec"]["ACTIVATION_REDUCTION_N"][1] == 2 else "down"].append(c["s"])
    for kernel, s in seconds.items():
        assert EXPERT_MATMUL_COMPILE_S[model][kernel] == pytest.approx(sum(s) / len(s), abs=5e-4), kernel


def _compiling():
    """10 ms steps, an engine that compiles its routing on first use (1 s a key, graphs to 64 tokens)."""
    cost = WrappedCost(FixedStepCost(0.01))
    cost.first_use_compiles = FirstUseCompiles((RoutingCompiles(graph_tokens=64, compile_s=1.0),))
    return cost


def test_the_engine_adds_a_compile_to_the_first_step_of_each_new_key_per_replica():
    """Three prompts of 100 tokens, one after another (each step eager: over 64 tokens): the first
    pays the compile, the others (the same key) do not; with two replicas each compiles its own."""
    cfg = EngineConfig(num_blocks=64, block_size=16, null_block=True, max_num_seqs=4, max_num_batched_tokens=256,
                       max_model_len=1024)
    reqs = [Request(request_id=i, arrival_s=5.0 * i, prompt_tokens=100, output_tokens=2) for i in range(4)]
    ttft = simulate(iter(reqs), cfg, _compiling()).requests.set_index("request_id")["ttft_s"]
    plain = simulate(iter(reqs), cfg, FixedStepCost(0.01)).requests.set_index("request_id")["ttft_s"]
    assert ttft[0] == pytest.approx(plain[0] + 1.0)
    assert all(ttft[i] == pytest.approx(plain[i]) for i in (1, 2, 3))
    two = simulate(iter(reqs), cfg, _compiling(), replicas=2).requests.set_index("request_id")["ttft_s"]
    assert sorted(round(t - p, 6) for t, p in zip(two, plain)) == [0.0, 0.0, 1.0, 1.0]


def test_the_flag_prices_a_fresh_engine_on_real_vllms_table_and_refuses_another_clock(capsys):
    """kvsim replay --first-use-compiles: gpt-oss-20b on its H100 table says both kernels on the clock
    line and its eager steps pay; Llama-3.1-8B on its table pays the slot mapping's alone (its first
    request's TTFT grows by the two keys its first steps meet); the roofline, or kvsim's own
    executor's table, is a one-line error."""
    from kvsim.cli import main

    def run(argv):
        assert main(argv) == 0
        return capsys.readouterr().out

    def ttft_p50(text):
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("TTFT p50")))

    spec = "random:isl=1024,osl=16,n=32,concurrency=16,seed=1"
    argv = ["replay", "--model", "gpt-oss-20b", "--gpu", "h100", spec, "--quiet"]
    plain, fresh = run(argv), run([*argv, "--first-use-compiles"])
    # (the plain line's held-out note names first-use compiles too: those its measured runs paid)
    assert "MoE routing's" in fresh and "slot mapping's" in fresh and "first-use compiles (a fresh engine)" not in plain
    assert "first-use compiles (a fresh engine)" in fresh
    assert "expert matmul (up)" in fresh and "expert matmul (down)" in fresh and "32 experts, top-4" in fresh
    line = next(x for x in fresh.splitlines() if x.startswith("first-use compiles: "))
    assert "routing" in line and "slot_mapping" in line and "first-use compiles:" not in plain
    assert ttft_p50(fresh) > ttft_p50(plain) + ROUTING_COMPILE_S["gpt-oss-20b"] - 0.2

    lone = "random:isl=1000,osl=4,n=2,concurrency=1,seed=1"      # 1,000 tokens: 'other'; then 1: a new key
    argv = ["replay", "--model", "Llama-3.1-8B", "--gpu", "h100", lone, "--quiet"]
    plain, fresh = run(argv), run([*argv, "--first-use-compiles"])
    assert "MoE routing" not in fresh and "slot mapping's" in fresh

    def figure(text, name):
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))

    assert figure(fresh, "TTFT p50") == figure(plain, "TTFT p50")     # its prompt's key: start-up's
    assert figure(fresh, "simulated time") == pytest.approx(figure(plain, "simulated time") + SLOT_MAPPING_COMPILE_S,
                                                            abs=2e-3)   # its first decode step compiles
    for other in (["--model", "Llama-3.1-8B", "--gpu", "h100", "--cost-table", "roofline"],
                  ["--model", "Llama-3.1-8B", "--gpu", "h200", "--cost-table", "tables/Llama-3.1-8B_H200.csv"]):
        assert main(["replay", *other, spec, "--quiet", "--first-use-compiles"]) == 2
        err = capsys.readouterr().err
        assert "first_use_compiles" in err and len(err.strip().splitlines()) == 1


def test_tritons_hook_witnessed_every_compile_the_probe_timed():
    """qwen3-30b-a3b-rerun3 (the first run with jit_hooks.csv): in every workload the post-compile
    hook saw the same kernels as the _do_compile wrapper timed, each ending with it."""
    root = RUNS / "qwen3-30b-a3b-rerun3"
    if not (root / "meta.json").exists():
        pytest.skip("no measured runs here")
    for _, folder in _in_order(root)[1]:
        with open(folder / "jit.csv") as f:
            timed = sorted((r["kernel"], round(float(r["t1_s"]), 3)) for r in csv.DictReader(f))
        with open(folder / "jit_hooks.csv") as f:
            seen = sorted((r["kernel"], round(float(r["t_s"]), 3)) for r in csv.DictReader(f))
        assert seen == timed, folder.name


def _sort_compiles(folder: Path) -> list[tuple]:
    """The routing's token sort's compiles the probe timed in one workload, as (rule name, key)."""
    rows = {("constexpr", 1): "1", ("i32", "D"): "16"}
    key = lambda spec, *args: tuple(rows.get(tuple(spec[a]), "other") for a in args)    # noqa: E731
    return ([("routing_sort_memset", key(c["spec"], "size", "shape_pm", "stride_pn", "blocks1a"))
             for c in _jit(folder, "_combined_routing_memset")]
            + [("routing_sort_compute", key(c["spec"], "n_tokens", "stride_pn"))
               for c in _jit(folder, "_combined_routing_compute")])


def test_the_routing_sorts_keys_and_price():
    """The sort's keys at the steps that compiled it in gpt-oss-20b-keys (1,055: nothing a multiple
    of 16; 1,439: the partial histogram's stride 48; 1,535: also its 48 rows); its price, each
    kernel's mean over gpt-oss-20b's timed compiles."""
    assert routing_sort_keys(1055, 32, 4) == {"memset": ("other",) * 4, "compute": ("other", "other")}
    assert routing_sort_keys(1439, 32, 4) == {"memset": ("other", "other", "16", "other"), "compute": ("other", "16")}
    assert routing_sort_keys(1535, 32, 4)["memset"] == ("other", "16", "16", "other")
    assert routing_sort_keys(8192, 32, 4)["memset"] == ("16", "16", "16", "other")      # the profile run's
    folders = [f for e in ("gpt-oss-20b-cached",) if (RUNS / e / "meta.json").exists() for _, f in _in_order(RUNS / e)[1]]
    folders += [RUNS / "gpt-oss-20b-keys" / "warmup"] if (RUNS / "gpt-oss-20b-keys" / "meta.json").exists() else []
    if len(folders) < 9:
        pytest.skip("no measured runs here")
    for kernel, name in (("memset", "_combined_routing_memset"), ("compute", "_combined_routing_compute")):
        seconds = [c["s"] for f in folders for c in _jit(f, name)]
        assert ROUTING_SORT_COMPILE_S["gpt-oss-20b"][kernel] == pytest.approx(sum(seconds) / len(seconds), abs=5e-4)


def test_the_keys_warm_up_compiled_each_routing_and_expert_matmul_key_the_rules_name():
    """gpt-oss-20b-keys (harness.py --warmup-eager-keys on an H100, cut by the call's limit at the
    6,720-token prompt): over its 381 steps, from start-up's keys, the rules name exactly the
    routing and expert-matmul compiles the probe timed, key by key: 356 routing keys (one a prompt)
    and 4 expert-matmul ones, and the routing's token sort's 4 (3 of its memset, 1 of its compute)."""
    root = RUNS / "gpt-oss-20b-keys"
    if not (root / "meta.json").exists():
        pytest.skip("no measured runs here")
    meta = json.loads((root / "meta.json").read_text())
    folder = root / "warmup"
    compiles = FirstUseCompiles((RoutingCompiles(graph_tokens=1024), *expert_matmul_compiles(1024, "gpt-oss", 32, 4),
                                 *routing_sort_compiles(1024, "gpt-oss", 32, 4)))
    seen = compiles.at_start(meta["engine_core"]["max_num_batched_tokens"])
    with open(folder / "steps.csv") as f:
        steps = [int(r["num_scheduled_tokens"]) for r in csv.DictReader(f)]
    assert steps == meta["warmup_steps"]
    predicted = [k for n in steps for k in compiles.keys(n) if k not in seen and not seen.add(k)]
    routing = [("routing", (c["spec"]["stride_rn"][1], c["spec"]["n_rows"][1] == "D"))
               for c in _jit(folder, "_topk_forward")]
    assert len(routing) == len(_jit(folder, "_sum_bitmatrix_rows")) == 356
    measured = routing + _matmul_compiles(folder) + _sort_compiles(folder)
    assert sorted(predicted) == sorted(measured) and len(measured) == 364


def test_the_summary_tallies_each_kernels_compiles_and_seconds(tmp_path):
    """--first-use-compiles: the summary's first_use_compiles adds up the compiles priced, per
    kernel at its price (a kernel's seconds = its compiles x its price), over the replicas; the
    compiles' seconds are what the run took longer (one replica, a closed loop of one request at a
    time: every stall delays the run's end); without the flag the summary has no such key."""
    from kvsim.cli import main

    spec = "random:isl=3000,osl=4,n=6,concurrency=1,seed=3"
    argv = ["replay", "--model", "gpt-oss-20b", "--gpu", "h100", spec, "--quiet"]
    outs = {}
    for name, extra in (("plain", []), ("fresh", ["--first-use-compiles"])):
        outs[name] = json.loads(Path(tmp_path / f"{name}.json").read_text()) \
            if main([*argv, *extra, "--out", str(tmp_path / f"{name}.json")]) == 0 else None
    assert "first_use_compiles" not in outs["plain"]
    c = outs["fresh"]["first_use_compiles"]
    prices = {"routing": ROUTING_COMPILE_S["gpt-oss-20b"], "slot_mapping": SLOT_MAPPING_COMPILE_S,
              **{f"expert_matmul_{k}": s for k, s in EXPERT_MATMUL_COMPILE_S["gpt-oss-20b"].items()},
              **{f"routing_sort_{k}": s for k, s in ROUTING_SORT_COMPILE_S["gpt-oss-20b"].items()}}
    assert c["by_kernel"]["routing"]["compiles"] >= 1
    for kernel, entry in c["by_kernel"].items():
        assert entry["seconds"] == pytest.approx(entry["compiles"] * prices[kernel])
    assert c["compiles"] == sum(e["compiles"] for e in c["by_kernel"].values())
    grew = outs["fresh"]["simulated_duration_s"] - outs["plain"]["simulated_duration_s"]
    assert grew == pytest.approx(c["seconds"], abs=0.05)
    two = tmp_path / "two.json"
    assert main([*argv, "--first-use-compiles", "--replicas", "2", "--out", str(two)]) == 0
    assert json.loads(two.read_text())["first_use_compiles"]["compiles"] > c["compiles"]    # each replica its own
