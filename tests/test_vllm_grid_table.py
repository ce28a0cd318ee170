"""Cost tables from real vLLM's own steps (bench/vllm_gpu/grid_table.py, issue 24): the shipped
tables are what the script makes of the committed grid runs, their rows are vLLM's padded
decode batches and its prefills, and async attribution artefacts are dropped."""
from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

from kvsim.errors import InputError
from kvsim.planner.engine_setup import build_engine
from kvsim.simulator.cost_table import StepShapeCost, read_table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "vllm_h200"
# every shipped table, each from the runs of its GPU (tables/vllm/ENGINE_GPU.csv)
TABLES = sorted((ROOT / "tables" / "vllm").glob("*_H[0-9]00.csv"))
spec = importlib.util.spec_from_file_location("grid_table", ROOT / "bench" / "vllm_gpu" / "grid_table.py")
grid_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grid_table)


@pytest.mark.parametrize("table", TABLES, ids=lambda p: p.stem)
def test_a_shipped_table_is_what_the_script_makes_of_its_grid_run(table, tmp_path):
    engine, gpu = table.stem.rsplit("_", 1)
    out = tmp_path / table.name
    results = ROOT / "bench" / "results" / f"vllm_{gpu.lower()}"
    assert grid_table.main([str(results / engine), "--out", str(out)]) == 0
    assert out.read_bytes() == table.read_bytes()
    cost = StepShapeCost(table)        # kvsim reads it as a measured table
    assert cost.graph_sizes and cost.provenance["model"]


def test_rows_are_vllms_padded_decodes_and_its_prefills_without_the_artefacts():
    meta = json.loads((RESULTS / "llama8b-bf16" / "meta.json").read_text())
    sizes = meta["engine_core"]["cudagraph_capture_sizes"]
    steps = RESULTS / "llama8b-bf16" / "grid" / "steps.csv"
    rows, dropped = grid_table.grid_rows(steps, sizes)
    with open(steps, newline="") as f:
        raw = list(csv.DictReader(f))
    assert len(rows) + dropped == len(raw) and 0 < dropped < len(raw) // 3 + 10
    for r in rows:
        if r["kind"] == "decode":
            assert r["graph"] == 1 and r["padded_num_seqs"] in sizes and r["padded_num_seqs"] >= r["num_seqs"]
            assert r["num_prefill_tokens"] == 0
    # the pair of the module docstring: a 512-token prefill carrying a 7,680-token one's time
    kept = {(r["num_seqs"], r["num_prefill_tokens"], r["step_s"]) for r in rows}
    assert (1, 512, "0.195135232") not in kept and not any(n == 16 and p == 7680 for n, p, _ in kept)
    assert (1, 512, "0.015460736") in kept


def test_a_vllm_table_is_refused_for_another_model():
    table = ROOT / "tables" / "vllm" / "llama8b-bf16_H200.csv"
    build_engine(model="Llama-3.1-8B", gpu="H200", cost_table=str(table))
    with pytest.raises(InputError, match="model Qwen2.5-7B"):
        build_engine(model="Qwen2.5-7B", gpu="H200", cost_table=str(table))


def test_knots_are_a_power_of_two_range_apart_at_least_half_a_range():
    """One knot per power-of-two range of the mixed steps' token counts, at its median; a range
    whose median sits next to the previous knot (64-token lone prompts, then 65-token steps of a
    prompt beside one decode) gives none: two knots a token apart let f swing between them."""
    def mixed(*counts):
        return [{"kind": "mixed", "num_scheduled_tokens": n} for n in counts]
    decode = [{"kind": "decode", "num_scheduled_tokens": 3}]
    assert grid_table.knots(decode + mixed(64, 64, 65, 65, 66, 256, 512, 8192)) == [64, 256, 512, 8192]
    assert grid_table.knots(mixed(64, 100, 100, 256)) == [64, 100, 256]    # 1.56x apart: both
    assert grid_table.knots(mixed(512)) == [1, 512]                         # one range: f from 1


def test_a_lone_prompt_slower_than_the_fastest_of_its_length_is_dropped():
    """The H100 fine grid sent each decode batch's prompts one by one: a 256-token prompt ran
    once in 27 ms and 13 times in 67-1,247 ms (the engine waiting for the harness)."""
    steps = ROOT / "bench" / "results" / "vllm_h100" / "qwen3-30b-a3b-fine" / "grid" / "steps.csv"
    rows, _ = grid_table.grid_rows(steps)
    lone = [float(r["step_s"]) for r in rows
            if r["num_seqs"] == 1 and r["num_decode_tokens"] == 0 and r["num_prefill_tokens"] == 256]
    assert lone and max(lone) <= 1.6 * min(lone) and min(lone) < 0.03


def test_an_idle_runs_lone_prompts_give_the_tables_idle_start(tmp_path):
    """Beside ENGINE-idle/idle-prefill (plans.py --size idle), the table takes the run's prefill
    steps as rows and marks every step that started an idle engine (``idle_before``); without
    such a run the table is the grid's alone, without the column. Here the lone prompts take the
    grid table's price + 7.5 ms (+- 1 ms): StepShapeCost fits that as c_idle; they were sent 1 ms
    + 0.25 us per prompt token before their steps and seen 0.9 ms after: the '# frontend:' line."""
    import gzip

    engine = tmp_path / "llama8b-fp8-fine"
    engine.mkdir()
    src = ROOT / "bench" / "results" / "vllm_h100" / "llama8b-fp8-fine"
    (engine / "meta.json").write_bytes((src / "meta.json").read_bytes())
    (engine / "grid").mkdir()
    (engine / "grid" / "steps.csv").write_bytes((src / "grid" / "steps.csv").read_bytes())
    plain = tmp_path / "plain.csv"
    assert grid_table.main([str(engine), "--out", str(plain)]) == 0
    header = next(ln for ln in plain.read_text().splitlines() if not ln.startswith("#"))
    assert not header.endswith("idle_before")       # no idle run: the grid alone, without the column
    model = StepShapeCost(plain)
    assert model.idle_start_s == 0.0
    idle = tmp_path / "llama8b-fp8-idle" / "idle-prefill"
    idle.mkdir(parents=True)
    from kvsim.simulator.cost import StepBatch
    header = ("num_seqs,num_prefill_seqs,num_prefill_tokens,num_decode_tokens,num_scheduled_tokens,kv_read_tokens,"
              "attn_token_pairs,max_context_tokens,step_s,sched_cpu_s,update_cpu_s,t_done_s")
    steps, reqs = [header], []
    for i, p in enumerate([64, 256, 512, 1024, 2048, 4096] * 3):
        t0, pairs = i * 0.25, p * (p + 1) // 2
        step = model.step_time_s(StepBatch(1, p, 0, p, p, pairs, p)) + 0.0075 + (0.001, -0.001, 0.0)[i % 3]
        decode = model.step_time_s(StepBatch(1, 0, 1, 1, p + 1, p + 1, p + 1))
        steps.append(f"1,1,{p},0,{p},{p},{pairs},{p},{step},0,0,{t0 + step}")
        steps.append(f"1,0,0,1,1,{p + 1},{p + 1},{p + 1},{decode},0,0,{t0 + step + decode}")
        # sent 1 ms + 0.25 us per prompt token before its step, its first token 0.9 ms after it
        sent = t0 - 0.001 - 2.5e-7 * p
        reqs.append({"arrival_s": sent, "sent_s": sent, "first_token_s": t0 + step + 0.0009, "prompt_tokens": p,
                     "output_tokens": 2})
    (idle / "steps.csv").write_text("\n".join(steps) + "\n")
    with gzip.open(idle / "requests.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in reqs)
    out = tmp_path / "idle.csv"
    assert grid_table.main([str(engine), "--out", str(out)]) == 0
    with_idle = StepShapeCost(out)
    _, _, rows = read_table(out)
    marked = [r for _, r in rows if r["idle_before"] == "1"]
    assert len(marked) >= 18 and all(r["kind"] == "mixed" for r in marked)
    assert sum(r["num_seqs"] == "1" and r["idle_before"] == "1" for _, r in rows[-18:]) == 18   # the run's prompts
    assert 0.005 < with_idle.idle_start_s < 0.010
    assert "llama8b-fp8-idle/idle-prefill" in with_idle.provenance["source"]
    way_in, per_token, way_out = with_idle.frontend_s     # the '# frontend:' line, read back
    assert abs(way_in - 0.001) < 2e-6 and abs(per_token - 2.5e-7) < 1e-9 and abs(way_out - 0.0009) < 2e-6
    assert with_idle.idle_start_min_wait_s == 0.0           # no hot run: c_idle after any wait

    # the hot plan beside them (ENGINE-hot/hot-ISL): lone prompts 2 ms after the last step cost
    # the grid's price (the first of each loop starts an idle engine: 7.5 ms more)
    for p in (64, 512, 2048):
        run = tmp_path / "llama8b-fp8-hot" / f"hot-{p}"
        run.mkdir(parents=True)
        lines, t, pairs = [header], 100.0 + p, p * (p + 1) // 2
        for i in range(6):
            step = model.step_time_s(StepBatch(1, p, 0, p, p, pairs, p)) + (0.0075 if i == 0 else 0.0)
            decode = model.step_time_s(StepBatch(1, 0, 1, 1, p + 1, p + 1, p + 1))
            t += (1.0 if i == 0 else 0.002) + step
            lines.append(f"1,1,{p},0,{p},{p},{pairs},{p},{step},0,0,{t}")
            t += decode
            lines.append(f"1,0,0,1,1,{p + 1},{p + 1},{p + 1},{decode},0,0,{t}")
        (run / "steps.csv").write_text("\n".join(lines) + "\n")
    hot_table = tmp_path / "hot.csv"
    assert grid_table.main([str(engine), "--out", str(hot_table)]) == 0
    with_hot = StepShapeCost(hot_table)
    num_before = len(read_table(out)[2])
    hot_rows = [r for _, r in read_table(hot_table)[2][num_before:]]
    warm = [r for r in hot_rows if r["idle_before"] == "0"]     # 2 ms after the last step: not idle
    assert len(warm) == 15 and {r["num_prefill_tokens"] for r in warm} == {"64", "512", "2048"}
    assert all(r["idle_before"] == "1" for r in hot_rows if r not in warm)   # each loop's first
    assert with_hot.idle_start_min_wait_s == grid_table.HOT_IDLE_GAP_S
    assert 0.005 < with_hot.idle_start_s < 0.010
    assert "llama8b-fp8-hot/hot-64" in with_hot.provenance["source"]
    assert f"after {grid_table.HOT_IDLE_GAP_S * 1e3:g} ms idle" in with_hot.describe()


def test_the_async_off_line_is_a_line_in_the_batch_size_through_back_to_back_steps_over_the_table(tmp_path):
    """An async-off wave run's back-to-back steps of 4 requests each took the table's price plus
    1.5 ms (one 3 ms): over them alone the line is 1.5 ms a step and nothing per sequence; a step
    scheduled long after the one before it (an idle engine) and the warm-up's steps are not counted.
    With the async-off run's largest closed loop (steps of 64 requests, 1.5 + 60 x 0.05 ms) beside
    it the line runs through both: 1.3 ms + 0.05 ms a sequence."""
    from kvsim.simulator.cost import StepBatch

    table = ROOT / "tables" / "vllm" / "llama8b-bf16_H100.csv"
    price = StepShapeCost(table).step_time_s
    header = "num_seqs,num_prefill_seqs,num_prefill_tokens,num_decode_tokens,num_scheduled_tokens,kv_read_tokens," \
             "attn_token_pairs,max_context_tokens,step_s,sched_cpu_s,update_cpu_s,t_done_s,t_sched_s"

    def served(folder, n, extras):
        folder.mkdir(parents=True)
        lines, done = [header], 1.0
        for i, extra in enumerate(extras):
            ctx = 800 + i
            step = price(StepBatch(n, 0, n, n, n * ctx, n * ctx, ctx)) + extra
            sched = done + (0.05 if i == 3 else 0.0003)      # the fourth step starts an idle engine
            done = max(done, sched) + step - 0.0003 * (i != 3)
            lines.append(f"{n},0,0,{n},{n},{n * ctx},{n * ctx},{ctx},{step},0.0001,0.0001,{done},{sched}")
        (folder / "steps.csv").write_text("\n".join(lines) + "\n")

    engine = tmp_path / "llama8b-bf16-fine"
    assert grid_table.noasync_runs(engine) == []
    served(tmp_path / "llama8b-bf16-noasync-wave" / "wave-768-x4-o16", 4, [0.0015] * 4 + [0.003] + [0.0015] * 2)
    served(tmp_path / "llama8b-bf16-noasync-wave" / "wave-warmup", 4, [0.5] * 5)
    (tmp_path / "llama8b-bf16-noasync-wave" / "meta.json").write_text("{}")
    waves = grid_table.noasync_runs(engine)
    assert [w.name for w in waves] == ["wave-768-x4-o16"]
    per_step, per_seq, steps = grid_table.async_off_fit(table, waves)
    assert steps == 5 and per_step == pytest.approx(0.0015, abs=1e-9) and per_seq == 0.0
    served(tmp_path / "llama8b-bf16-noasync" / "cl-1024-128-c64", 64, [0.0045] * 7)
    served(tmp_path / "llama8b-bf16-noasync" / "cl-1024-128-c16", 16, [0.1] * 7)      # held out: not read
    runs = grid_table.noasync_runs(engine)
    assert [r.name for r in runs] == ["wave-768-x4-o16", "cl-1024-128-c64"]
    per_step, per_seq, steps = grid_table.async_off_fit(table, runs)
    assert steps == 10 and per_step == pytest.approx(0.0013, abs=1e-9) and per_seq == pytest.approx(5e-5, abs=1e-10)


def test_the_first_step_line_spans_the_cutoff_of_each_burst_at_an_idle_engine(tmp_path):
    """grid_table.burst_cutoffs: per burst (requests sent within 5 ms) that reached an idle engine,
    the first step's prompts say the cutoff lies between the last send it took and the first it
    did not; a burst taken whole spans one later gap past its last send; a burst the token budget
    cut, or one that met a busy engine, is left out. The shipped tables carry the line."""
    import gzip

    run = tmp_path / "grid"
    run.mkdir()
    sends = {0: [0.0, 0.0004, 0.0006, 0.0008],          # first step takes 2
             1: [1.0, 1.0005, 1.0007],                   # taken whole
             2: [2.0, 2.0004, 2.0006],                   # the budget: 1 of 3 x 5,000 tokens
             3: [3.0, 3.0004]}                           # sent while a step ran
    prompts = {0: 100, 1: 100, 2: 5000, 3: 100}
    reqs = [{"sent_s": t, "prompt_tokens": prompts[b]} for b, ts in sends.items() for t in ts]
    with gzip.open(run / "requests.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in reqs))
    # steps: (t_done, step_s, prefill seqs, seqs); one ran from 2.99 to 3.01
    steps = [(0.02, 0.019, 2, 2), (0.04, 0.01, 2, 4), (1.02, 0.019, 3, 3), (2.02, 0.019, 1, 1),
             (3.01, 0.02, 0, 1), (3.03, 0.01, 2, 3)]
    with open(run / "steps.csv", "w") as f:
        f.write("t_done_s,step_s,num_prefill_seqs,num_seqs\n")
        f.writelines(f"{a},{b},{c},{d}\n" for a, b, c, d in steps)
    first_gap, gap, spans = grid_table.burst_cutoffs(run, 8192)
    assert first_gap == pytest.approx(0.00045) and gap == pytest.approx(0.0002)
    assert spans == [pytest.approx((0.0004, 0.0006)), pytest.approx((0.0007, 0.0009))]
    for table in TABLES:
        line = next(ln for ln in table.read_text().splitlines() if ln.startswith("# first step:"))
        assert "bursts of the grid at an idle engine" in line and StepShapeCost(table).first_step is not None


def test_a_fine_grid_after_a_keys_warm_up_finds_its_engines_other_runs():
    """ENGINE-finekeys (device_run.sh: the fine grid after a keys warm-up) is ENGINE's grid as
    ENGINE-fine is: its idle, hot and async-off runs are ENGINE's."""
    runs = ROOT / "bench" / "results" / "vllm_h100"
    for name in ("gpt-oss-20b-finekeys", "gpt-oss-20b-fine", "gpt-oss-20b"):
        assert grid_table.engine_base(runs / name) == "gpt-oss-20b"
        assert grid_table.idle_run(runs / name) == runs / "gpt-oss-20b-idle" / "idle-prefill-again"
        assert [r.parent.name for r in grid_table.hot_runs(runs / name)] == ["gpt-oss-20b-hot"] * 5
    assert grid_table.noasync_runs(runs / "qwen3-30b-a3b-finekeys") == grid_table.noasync_runs(runs / "qwen3-30b-a3b-fine")
    assert grid_table.noasync_runs(runs / "qwen3-30b-a3b-fine")
