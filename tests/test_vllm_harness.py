"""The real-vLLM harness's grid driver (bench/vllm_gpu/harness.py) on a fake engine: a mixed
point's prompt is sent only once every decode of its phase has its first token, so that its
chunks share steps with their decodes; phases run one after another."""
from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("vllm_harness", ROOT / "bench" / "vllm_gpu" / "harness.py")
harness = importlib.util.module_from_spec(spec)
spec.loader.exec_module(harness)


class FakeEngine:
    """One token per request per tick; records (event, request_id) in order."""

    def __init__(self):
        self.log = []

    async def generate(self, prompt, params, request_id):
        self.log.append(("sent", request_id))
        for i in range(params.kw["max_tokens"]):
            await asyncio.sleep(0)
            if i == 0:
                self.log.append(("first", request_id))
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[7])])


class Params:
    def __init__(self, **kw):
        self.kw = kw


def test_a_mixed_points_prompt_follows_its_decodes_first_tokens(monkeypatch):
    import sys
    import types

    # the driver imports vllm.inputs (for its side effects on old versions): a stand-in here
    fake = types.ModuleType("vllm")
    fake.inputs = types.ModuleType("vllm.inputs")
    fake.inputs.TokensPrompt = dict
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.inputs", fake.inputs)
    entry = {"name": "grid", "kind": "grid", "decode": [[2, 16, 3]], "prefill": [32],
             "mixed": [[3, 16, 64]], "seed": 1}
    reqs = harness.build_requests(entry, vocab_size=32000)
    assert [r["phase"] for r in reqs] == [0, 0, 1, 2, 2, 2, 2]
    late = [r for r in reqs if r.get("late")]
    assert len(late) == 1 and len(late[0]["ids"]) == 64 and late[0]["output_tokens"] == 2
    assert all(r["output_tokens"] == harness.MIXED_DECODE_TOKENS for r in reqs[3:6])
    engine = FakeEngine()
    rec = asyncio.run(harness.run_workload(engine, entry, reqs, Params, None))
    assert len(rec) == len(reqs)
    log = engine.log
    sent = {rid: log.index(("sent", rid)) for _, rid in log if _ == "sent"}
    first = {rid: log.index(("first", rid)) for _, rid in log if _ == "first"}
    prompt = late[0]["request_id"]
    decodes = [r["request_id"] for r in reqs[3:6]]
    assert all(first[d] < sent[prompt] for d in decodes)           # after every first token
    assert sent[prompt] < max(log.index(("first", d)) for d in decodes) + 5   # and at once
    # phases in order: the prefill point's request is sent after the decode point's finished
    assert sent[reqs[2]["request_id"]] > first[reqs[1]["request_id"]]


def test_the_lengths_warm_up_covers_every_prompt_length_band_to_the_step_budget():
    c1, c8 = harness.warmup_lengths_entries(max_tokens=8192, per_octave=4)
    lengths = [p for _, p, _ in c1["requests"]]
    assert lengths[0] == 16 and lengths[-1] == 8192 and lengths == sorted(set(lengths))
    ratios = [b / a for a, b in zip(lengths, lengths[1:])]
    assert all(abs(r - 2 ** 0.25) < 0.05 for r in ratios)          # 4 a doubling, no gap wider
    assert (c1["max_concurrency"], c8["max_concurrency"]) == (1, 8) and c8["requests"] == c1["requests"]
    built = harness.build_requests(c8, vocab_size=32000)
    assert [len(r["ids"]) for r in built] == lengths and all(r["output_tokens"] == 2 for r in built)
    # eight at a time are other prompts than the lone ones (not prefix-cache hits of them)
    lone = harness.build_requests(c1, vocab_size=32000)
    assert all(a["ids"][:16] != b["ids"][:16] for a, b in zip(lone, built))
    assert [p for _, p, _ in harness.warmup_lengths_entries(1000, 1)[0]["requests"]] == [16, 32, 64, 128, 256, 512]


def test_step_rows_keep_when_each_step_was_scheduled_and_share_the_engine_time_between_returns():
    """Async scheduling: step 2 is scheduled (t = 45 ms) before step 1's output comes back (91 ms,
    after step 2's launch returned); step 2 returns at 93 ms. The rows keep both schedule times
    and give step 2 the time between the two returns, step 1 its time from its schedule; a step
    outside the window is left out."""
    t0 = 100.0
    lines = [{"meta": {"async_scheduling": True}},
             {"sched_t0": t0 + 0.045, "sched_t1": t0 + 0.0453, "done_t": t0 + 0.093, "upd_t1": t0 + 0.0931,
              "reqs": [[768, 1536, "p"], [1, 769, "d"], [1, 769, "d"], [1, 769, "d"]]},
             {"sched_t0": t0 + 0.0, "sched_t1": t0 + 0.0003, "done_t": t0 + 0.091, "upd_t1": t0 + 0.0911,
              "reqs": [[768, 768, "p"], [768, 768, "p"], [768, 768, "p"]]},
             {"sched_t0": t0 + 5.0, "sched_t1": t0 + 5.001, "done_t": t0 + 5.01, "upd_t1": t0 + 5.011,
              "reqs": [[1, 800, "d"]]}]
    rows = harness.step_rows(lines, t0, t0 + 1.0)
    assert [r["num_prefill_seqs"] for r in rows] == [3, 1]
    assert [round(r["t_sched_s"], 6) for r in rows] == [0.0, 0.045]
    assert [round(r["t_done_s"], 6) for r in rows] == [0.091, 0.093]
    assert [round(r["step_s"], 6) for r in rows] == [0.091, 0.002]
    assert rows[1]["num_decode_tokens"] == 3 and rows[1]["attn_token_pairs"] == 768 * 1536 + 3 * 769
    # step 2's prompt is a chunk carried over (768 tokens in the cache before it); step 1's are whole
    assert [r["num_prefill_seqs_with_context"] for r in rows] == [0, 1]
    assert round(rows[0]["sched_cpu_s"], 6) == 0.0003


def test_triton_compiles_are_logged_and_counted_in_the_steps_they_stall(tmp_path, monkeypatch):
    """The probe wraps JITFunction._do_compile: each compile (also one that raises) leaves a
    ``jit`` line with its kernel, start, end and key, once per class; the harness gives each step
    the compile seconds inside its share of the engine's time (a 0.6 s compile from 1.2 to 1.8 s
    within a step from 1.0 to 2.0 s; half of a second one) and lists each workload's compiles."""
    import json

    import pytest

    spec = importlib.util.spec_from_file_location("vllm_probe", ROOT / "bench" / "vllm_gpu" / "kvsim_vllm_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    log = tmp_path / "steps.raw.jsonl"
    monkeypatch.setenv("KVSIM_STEP_LOG", str(log))

    class Kernel:                            # a JITFunction's shape: .fn, ._do_compile(key, ...)
        fn = SimpleNamespace(__qualname__="_matmul_ogs")
        arg_names = ["X", "M"]

        def _do_compile(self, key, signature, *rest):
            if key == "bad":
                raise RuntimeError("ptxas")
            return f"compiled {key}"

    assert probe.time_compiles(Kernel) and not probe.time_compiles(Kernel)    # once
    assert not probe.time_compiles(SimpleNamespace)                           # nothing to wrap
    assert Kernel()._do_compile("(16, 'i32', 'D')", {}) == "compiled (16, 'i32', 'D')"
    with pytest.raises(RuntimeError):
        Kernel()._do_compile("bad", {})
    probe._state["file"].flush()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(j["jit"], j["key"]) for j in lines] == [("_matmul_ogs", "(16, 'i32', 'D')"), ("_matmul_ogs", "bad")]
    assert {j["args"] for j in lines} == {"X,M"}          # what each place in the key is
    assert all(j["t1"] >= j["t0"] for j in lines)

    t0 = 100.0
    lines = [{"sched_t0": t0 + 1.0, "sched_t1": t0 + 1.001, "done_t": t0 + 2.0, "upd_t1": t0 + 2.001,
              "reqs": [[512, 512, "p"]]},
             {"sched_t0": t0 + 2.0, "sched_t1": t0 + 2.001, "done_t": t0 + 2.01, "upd_t1": t0 + 2.011,
              "reqs": [[1, 513, "d"]]},
             {"jit": "_topk_forward", "t0": t0 + 1.2, "t1": t0 + 1.8, "key": "k1"},
             {"jit": "_matmul_ogs", "t0": t0 + 1.9, "t1": t0 + 2.1, "key": "k2", "args": "X,M"},
             {"jit": "_warmup", "t0": t0 - 5.0, "t1": t0 - 4.0, "key": "k0"}]
    rows = harness.step_rows(lines, t0, t0 + 3.0)
    assert [round(r["jit_s"], 9) for r in rows] == [0.7, 0.01]
    jit = harness.jit_rows(lines, t0, t0 + 3.0)
    assert [(j["kernel"], round(j["t0_s"], 9), round(j["t1_s"], 9), j["arg_names"]) for j in jit] == \
        [("_topk_forward", 1.2, 1.8, ""), ("_matmul_ogs", 1.9, 2.1, "X,M")]


def test_the_host_is_recorded_with_a_speed_probe_that_measures(monkeypatch):
    """meta.json's host: what an eager step's launch time depends on (one core's speed). The probe
    reads the loop's median time: a loop that takes twice as long reads twice the milliseconds."""
    info = harness.host_info()
    assert {"cpu_model", "cpus", "cpus_usable", "loadavg", "cpu_probe_ms"} <= set(info)
    assert info["cpus"] >= 1 and info["cpu_probe_ms"] > 0

    def probe_with_loops_of(seconds):
        ticks = iter(range(1000))
        monkeypatch.setattr(harness.time, "perf_counter", lambda: seconds * next(ticks))
        return harness.cpu_probe_ms(rounds=3, n=10)
    assert probe_with_loops_of(0.010) == 10.0 and probe_with_loops_of(0.020) == 20.0


def test_tritons_post_compile_hook_is_a_second_witness(tmp_path, monkeypatch):
    """The probe chains a hook onto Triton's jit_post_compile_hook (keeping one set before it):
    each compile's end leaves a ``jit_hook`` line; the harness lists a workload's in jit_hooks.csv
    order with times from its start. No such knob: nothing chained."""
    import json

    spec = importlib.util.spec_from_file_location("vllm_probe2", ROOT / "bench" / "vllm_gpu" / "kvsim_vllm_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    log = tmp_path / "steps.raw.jsonl"
    monkeypatch.setenv("KVSIM_STEP_LOG", str(log))
    seen = []
    knobs = SimpleNamespace(runtime=SimpleNamespace(jit_post_compile_hook=lambda **kw: seen.append(kw["key"])))
    assert probe.witness_compiles(knobs) and not probe.witness_compiles(SimpleNamespace())
    knobs.runtime.jit_post_compile_hook(fn=SimpleNamespace(name="fused_moe_kernel"), key="k1")
    assert seen == ["k1"]                                   # the hook set before still runs
    probe._state["file"].flush()
    (line,) = [json.loads(x) for x in log.read_text().splitlines()]
    assert line["jit_hook"] == "fused_moe_kernel"
    rows = harness.jit_hook_rows([line, {"jit_hook": "early", "t": line["t"] - 10}], line["t"] - 1, line["t"] + 1)
    assert [(r["kernel"], round(r["t_s"], 6)) for r in rows] == [("fused_moe_kernel", 1.0)]


def test_the_engine_cores_triton_disk_cache_is_recorded(tmp_path, monkeypatch):
    """The probe's meta line names the folder the engine core's Triton keeps compiled kernels in
    and how many it held: whether a second engine on the machine could load the first one's
    compiles (gpt-oss-20b-cached paid them all again). TRITON_CACHE_DIR moves the folder."""
    spec = importlib.util.spec_from_file_location("vllm_probe3", ROOT / "bench" / "vllm_gpu" / "kvsim_vllm_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    cache = tmp_path / "triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    assert probe.triton_cache() == {"dir": str(cache), "entries": None}       # no folder yet
    for name in ("a1", "b2", "c3"):
        (cache / name).mkdir(parents=True)
    (cache / "stray.txt").write_text("")
    assert probe.triton_cache() == {"dir": str(cache), "entries": 3}
    sched = SimpleNamespace(vllm_config=None, scheduler_config=None, kv_cache_config=None)
    assert probe._meta(sched)["triton_cache"]["entries"] == 3


def test_finish_records_the_warm_ups_steps_apart_from_the_workloads(tmp_path):
    """meta.json's ``warmup_steps``: the token counts of the steps that came back in the warm-up's
    window, in order (what it compiled: simulator.first_use); a workload's steps stay its own."""
    import json

    t0 = 50.0
    step = lambda t, reqs: {"sched_t0": t, "sched_t1": t + 1e-4, "done_t": t + 0.05, "upd_t1": t + 0.0501, "reqs": reqs}
    lines = [{"meta": {"async_scheduling": True}},
             step(t0, [[600, 600, "p"]]), step(t0 + 0.1, [[600, 600, "p"]] * 7 + [[1, 601, "d"]]),
             step(t0 + 0.2, [[1, 602, "d"]] * 8), step(t0 + 10.0, [[1024, 1024, "p"]])]
    (tmp_path / "steps.raw.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    meta = {"warmup": {"t0_monotonic": t0 - 0.01, "t1_monotonic": t0 + 1.0},
            "workloads": {"cl": {"t0_monotonic": t0 + 9.0, "t1_monotonic": t0 + 11.0}}}
    (tmp_path / "meta.partial.json").write_text(json.dumps(meta))
    (tmp_path / "cl").mkdir()
    harness.finish(tmp_path)
    done = json.loads((tmp_path / "meta.json").read_text())
    assert done["warmup_steps"] == [600, 4201, 8]
    assert done["workloads"]["cl"]["num_steps"] == 1
    assert (tmp_path / "warmup" / "steps.csv").read_text().count("\n") == 4      # a header and its 3 steps
    # stopped in its warm-up (the harness writes meta.partial.json before it): every step is the warm-up's
    (tmp_path / "meta.partial.json").write_text(json.dumps({"warmup": {"t0_monotonic": t0 - 0.01}, "workloads": {}}))
    harness.finish(tmp_path)
    assert json.loads((tmp_path / "meta.json").read_text())["warmup_steps"] == [600, 4201, 8, 1024]


def test_the_eager_keys_warm_up_meets_every_routing_key_once():
    """--warmup-eager-keys: one lone prompt a key of gpt-oss's MoE routing (simulator.first_use) over
    every eager step's token count, largest CUDA graph to the step budget; nothing on a graph."""
    from kvsim.simulator.first_use import routing_key

    entry = harness.eager_keys_entry(1024, 8192)
    lengths = [r[1] for r in entry["requests"]]
    assert entry["max_concurrency"] == 1 and all(r[2] == 1 for r in entry["requests"])
    every = {routing_key(n) for n in range(1025, 8193)}
    assert {routing_key(n) for n in lengths} == every and len(lengths) == len(every) == 448
    assert min(lengths) > 1024 and max(lengths) == 8192
    small = [r[1] for r in harness.eager_keys_entry(512, 2000)["requests"]]
    assert {routing_key(n) for n in small} == {routing_key(n) for n in range(513, 2001)}


def test_the_eager_keys_warm_up_is_served_in_parts_that_share_no_prefix():
    """--warmup-eager-keys-s: the warm-up in parts of 16 prompts (the harness stops between parts
    when the time is spent); together the parts are the whole warm-up, in order, and no two of
    their prompts share a first block (each part its own seed: a prefix-cache hit would shorten a
    step, and meet another key)."""
    entry = harness.eager_keys_entry(1024, 8192)
    parts = harness.eager_keys_chunks(entry)
    assert [r for p in parts for r in p["requests"]] == entry["requests"] and len(parts) == 28
    firsts = [tuple(r["ids"][:16]) for p in parts for r in harness.build_requests(p, 200_000)]
    assert len(firsts) == 448 and len(set(firsts)) == 448
