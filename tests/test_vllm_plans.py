"""The real-vLLM measurement plans (bench/vllm_gpu/plans.py): the idle plan's lone prompts reach
an idle engine (each one's prefill and single decode step done well before the next arrives),
every length as often, in a seeded order, and the harness builds them as requests."""
from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"vllm_{name}", ROOT / "bench" / "vllm_gpu" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


plans = _load("plans")
harness = _load("harness")


def test_the_idle_plans_prompts_arrive_apart_every_length_as_often():
    plan = plans.build_plan("idle", None, 40.0, 10240, False)
    idle, *closed = plan
    reqs = idle["requests"]
    assert idle["kind"] == "trace" and len(reqs) == len(plans.IDLE_PROMPTS) * plans.IDLE_REPEATS
    assert Counter(p for _, p, _ in reqs) == {p: plans.IDLE_REPEATS for p in plans.IDLE_PROMPTS}
    gaps = [b[0] - a[0] for a, b in zip(reqs, reqs[1:])]
    assert min(gaps) >= min(plans.IDLE_GAPS_S) - 1e-9      # apart: a 4,096-token prefill is < 0.1 s
    assert set(round(g, 6) for g in gaps) == set(plans.IDLE_GAPS_S)   # both gaps drawn
    assert all(o == 2 for _, _, o in reqs)
    # not one fixed order: the lengths are shuffled per round, reproducibly
    rounds = [tuple(p for _, p, _ in reqs[i:i + 6]) for i in range(0, len(reqs), 6)]
    assert len(set(rounds)) > 1 and plans.build_plan("idle", None, 40.0, 10240, False) == plan
    assert [c["concurrency"] for c in closed] == [1, 1] and all(c["n"] == 8 for c in closed)
    built = harness.build_requests(idle, vocab_size=32000)
    assert [len(r["ids"]) for r in built] == [p for _, p, _ in reqs]
    assert [r["arrival_s"] for r in built] == [t for t, _, _ in reqs]


def test_the_idle_plans_gaps_can_be_widened_for_a_large_model():
    wide = plans.build_plan("idle", None, 40.0, 10240, False, (0.6, 1.2))[0]["requests"]
    gaps = {round(b[0] - a[0], 6) for a, b in zip(wide, wide[1:])}
    assert gaps == {0.6, 1.2}
    assert [p for _, p, _ in wide] == [p for _, p, _ in plans.build_plan("idle", None, 40.0, 10240, False)[0]["requests"]]


def test_a_plan_served_again_repeats_each_workload_under_its_own_name():
    plan = plans.build_plan("small", None, 40.0, 10240, False)
    again = plans.served_again(plan)
    served = [e for e in plan if e["kind"] != "grid"]
    assert again[:len(plan)] == plan and len(again) == len(plan) + len(served)
    for first, second in zip(served, again[len(plan):]):
        assert second["name"] == first["name"] + "-again"
        assert {k: v for k, v in second.items() if k != "name"} == {k: v for k, v in first.items() if k != "name"}
        built = [harness.build_requests(e, vocab_size=32000) for e in (first, second)]
        ids = [[r.pop("request_id") for r in b] for b in built]
        assert ids[1] == [f"{first['name']}-again-{i}" for i in range(len(ids[0]))]
        assert built[0] == built[1]     # the same prompts (the harness resets the prefix cache between)
    assert len({e["name"] for e in again}) == len(again)


def test_the_hot_plan_is_c1_loops_of_two_tokens_at_lengths_the_held_out_loops_do_not_use():
    plan = plans.build_plan("hot", None, 40.0, 10240, False)
    assert [w["name"] for w in plan] == [f"hot-{p}" for p in plans.HOT_PROMPTS]
    assert all(w["kind"] == "closed" and w["concurrency"] == 1 and w["osl"] == 2
               and w["n"] == plans.HOT_REPEATS and w["isl_range"] == 0.0 for w in plan)
    held_out = {w["isl"] for w in plans.idle_points() if w["kind"] == "closed"}
    assert held_out == {256, 1024} and not held_out & set(plans.HOT_PROMPTS)
    built = harness.build_requests(plan[0], vocab_size=32000)
    assert len(built) == plans.HOT_REPEATS and all(len(r["ids"]) == plans.HOT_PROMPTS[0] for r in built)


def test_the_burst_plan_sends_c_prompts_together_in_waves_at_sizes_the_held_out_loops_do_not_use():
    plan = plans.build_plan("burst", None, 40.0, 10240, False)
    assert [w["name"] for w in plan] == [f"burst-{isl}-x{c}" for isl, c in plans.BURST_POINTS]
    assert all(w["kind"] == "closed" and w["osl"] == 2 and w["n"] == plans.BURST_WAVES * w["concurrency"]
               and w["concurrency"] > 1 and w["isl_range"] == 0.0 for w in plan)
    held_out = {(w["isl"], w["concurrency"]) for w in plans.closed_points("small") + plans.closed_points("large")}
    assert not held_out & set(plans.BURST_POINTS)
    assert not {isl for isl, _ in held_out} & {isl for isl, _ in plans.BURST_POINTS}
    built = harness.build_requests(plan[1], vocab_size=32000)
    assert len(built) == plans.BURST_WAVES * 8 and all(len(r["ids"]) == 128 for r in built)
    assert all(r["arrival_s"] == 0.0 for r in built)     # a closed loop: sent as the client frees a slot


def test_the_wave_plan_sends_one_wave_shape_after_decode_phases_of_several_lengths():
    plan = plans.build_plan("wave", None, 40.0, 10240, False)
    assert plan[0]["name"] == "wave-warmup" and plan[0]["seed"] != plan[1]["seed"]
    points = plan[1:]
    assert [w["osl"] for w in points] == list(plans.WAVE_OSLS) and len(set(plans.WAVE_OSLS)) > 2
    assert all(w["kind"] == "closed" and w["isl"] == plans.WAVE_ISL and w["concurrency"] == plans.WAVE_C
               and w["n"] == plans.WAVE_COUNT * plans.WAVE_C for w in plan)
    held_out = {w["isl"] for w in plans.closed_points("small") + plans.closed_points("large")}
    assert plans.WAVE_ISL not in held_out
    built = harness.build_requests(points[-1], vocab_size=32000)
    assert len(built) == plans.WAVE_COUNT * plans.WAVE_C and all(r["output_tokens"] == plans.WAVE_OSLS[-1] for r in built)


def test_the_start_plan_sends_one_burst_a_workload_at_lengths_no_other_plan_uses():
    plan = plans.build_plan("start", None, 40.0, 10240, False)
    assert len(plan) == len(plans.START_PROMPTS) * len(plans.START_SIZES) * plans.START_REPEATS
    assert len({w["name"] for w in plan}) == len(plan)
    assert all(w["kind"] == "closed" and w["n"] == w["concurrency"] > 1 and w["osl"] == 2 for w in plan)
    assert {w["concurrency"] for w in plan} == set(plans.START_SIZES) and min(plans.START_SIZES) == 2
    # no size of one length runs back to back with itself
    assert all(a["name"].rsplit("-", 1)[0] != b["name"].rsplit("-", 1)[0] for a, b in zip(plan, plan[1:]))
    others = {w["isl"] for w in plans.closed_points("small") + plans.closed_points("large")}
    others |= {isl for isl, _ in plans.BURST_POINTS} | {plans.WAVE_ISL} | set(plans.HOT_PROMPTS) | set(plans.IDLE_PROMPTS)
    assert not others & set(plans.START_PROMPTS)
    built = harness.build_requests(plan[3], vocab_size=32000)
    assert len(built) == plan[3]["concurrency"] and all(r["arrival_s"] == 0.0 for r in built)


def test_a_plan_in_rounds_has_each_client_send_that_many_requests_under_a_name_that_says_so():
    plan = plans.build_plan("small", None, 40.0, 10240, False)
    rounds = plans.in_rounds(plan, 8)
    assert len(rounds) == len(plan)
    for before, after in zip(plan, rounds):
        if before["name"].startswith("cl-"):
            assert after["n"] == 8 * before["concurrency"] and after["name"] == f"{before['name']}-n{after['n']}"
            assert {k: v for k, v in after.items() if k not in ("n", "name")} == \
                   {k: v for k, v in before.items() if k not in ("n", "name")}
            assert len(harness.build_requests(after, vocab_size=32000)) == after["n"]
        else:
            assert after == before
    from bench.vllm_compare import base_engine, point_key
    assert base_engine("qwen3-30b-a3b-rerun") == "qwen3-30b-a3b"       # its settings and tables
    assert base_engine("gpt-oss-20b-jit") == base_engine("gpt-oss-20b-cached") == "gpt-oss-20b"
    assert point_key("cl-1024-128-c4-n32") == (False, [1024, 128, 4, 32])


def test_the_plan_is_written_into_a_folder_it_makes(tmp_path, monkeypatch, capsys):
    """plans.py --out .vllm_plans/x.json in a fresh checkout: the folder is made (it was a traceback)."""
    import json
    import sys

    out = tmp_path / "fresh" / "plans" / "burst.json"
    monkeypatch.setattr(sys, "argv", ["plans.py", "--size", "burst", "--out", str(out)])
    plans.main()
    assert json.loads(out.read_text()) and "workloads" in capsys.readouterr().out


def _engine_run(root: Path, engine: str, workload: str, counts: list[int], graph: int) -> Path:
    """A measured workload folder: its steps.csv's token counts, its engine's largest CUDA graph."""
    import json

    (root / engine).mkdir(exist_ok=True)
    (root / engine / "meta.json").write_text(json.dumps({"engine_core": {"cudagraph_capture_sizes": [1, graph]}}))
    run = root / engine / workload
    run.mkdir()
    (run / "steps.csv").write_text("num_seqs,num_scheduled_tokens,step_s\n"
                                   + "".join(f"1,{n},0.01\n" for n in counts))
    return run


def test_the_eager_steps_of_earlier_runs_are_their_steps_past_the_largest_graph_each_once(tmp_path, monkeypatch,
                                                                                              capsys):
    """plans.py --eager-steps-of RUN...: the token counts of the steps on no CUDA graph the runs
    served (each engine's own largest graph), each once and sorted, with the runs named; the
    harness's keys warm-up limited to them (--warmup-eager-keys-of) serves one lone prompt of each
    such length and nothing on a graph or past the step budget; a folder with no steps.csv is a
    one-line usage error, exit 2."""
    import json
    import sys

    import pytest

    a = _engine_run(tmp_path, "eng-a", "cl-1", [1024, 1025, 8192, 16, 3085, 3085], 1024)
    b = _engine_run(tmp_path, "eng-b", "cl-1-again", [600, 512, 2067, 1025], 512)
    steps = plans.eager_steps_of([a, b])
    assert steps == {"eager_steps": [600, 1025, 2067, 3085, 8192], "source": ["eng-a/cl-1", "eng-b/cl-1-again"]}
    out = tmp_path / "p" / "eager_steps.json"
    monkeypatch.setattr(sys, "argv", ["plans.py", "--eager-steps-of", str(a), str(b), "--out", str(out)])
    plans.main()
    assert json.loads(out.read_text()) == steps and "5 eager step sizes of 2 runs" in capsys.readouterr().out
    entry = harness.eager_keys_entry(1024, 4096, steps["eager_steps"])
    assert [r[1] for r in entry["requests"]] == [1025, 2067, 3085] and all(r[2] == 1 for r in entry["requests"])
    assert entry["max_concurrency"] == 1
    assert len(harness.eager_keys_entry(1024, 8192)["requests"]) == 448     # without: every key
    monkeypatch.setattr(sys, "argv", ["plans.py", "--eager-steps-of", str(tmp_path / "eng-a" / "typo"),
                                      "--out", str(out)])
    with pytest.raises(SystemExit) as exc:
        plans.main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "typo: no steps.csv" in err and "Traceback" not in err
    monkeypatch.setattr(sys, "argv", ["plans.py", "--out", str(out)])
    with pytest.raises(SystemExit) as exc:
        plans.main()
    assert exc.value.code == 2 and "--size is required" in capsys.readouterr().err
