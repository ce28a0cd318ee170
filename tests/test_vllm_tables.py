"""``--cost-table vllm``: the shipped table of real vLLM's steps for the run's setup
(planner.vllm_tables)."""
from __future__ import annotations

import json
import re

import pytest

from kvsim.cli import main
from kvsim.errors import InputError
from kvsim.planner.vllm_tables import TABLES_DIR, measured_tables, vllm_table_for
from kvsim.simulator.cost_table import measured_dtype

H100 = "H100-80GB-SXM"


def _setup(**over):
    kw = dict(model="Llama-3.1-8B", gpu=H100, tp=1, kv_dtype="auto", weights="dtype",
              async_scheduling=True)
    kw.update(over)
    return kw


def test_each_measured_setup_finds_a_table_that_fits_it_and_the_finest_grid_wins():
    for path, provenance, _ in measured_tables():
        dtype = measured_dtype(provenance)
        gpu = "H100-80GB-SXM" if "H100" in provenance["gpu"] else "H200"
        fp8 = dtype == "fp8"
        found = vllm_table_for(**_setup(model=provenance["model"], gpu=gpu, kv_dtype="fp8" if fp8 else "auto",
                                        weights="fp8" if fp8 else "dtype"))
        assert found.name.endswith(path.name.rsplit("_", 1)[1])      # the same GPU
        assert found.name.split("-fine")[0].split("_")[0] == path.name.split("-fine")[0].split("_")[0]
    # two tables of Llama-3.1-8B bf16 on the H100: the fine grid's (every graph size) is taken
    assert vllm_table_for(**_setup()) == TABLES_DIR / "llama8b-bf16-fine_H100.csv"
    assert vllm_table_for(**_setup(weights="fp8", kv_dtype="fp8")) == TABLES_DIR / "llama8b-fp8-fine_H100.csv"
    assert vllm_table_for(**_setup(gpu="H200")) == TABLES_DIR / "llama8b-bf16_H200.csv"
    # a model named with its hub owner is the same model
    assert vllm_table_for(**_setup(model="Qwen/Qwen3-32B", gpu="H200")) == TABLES_DIR / "qwen3-32b_H200.csv"


@pytest.mark.parametrize("over, words", [
    (dict(model="Llama-3.1-70B"), ["Llama-3.1-70B (unquantized weights, KV auto, TP 1) on H100-80GB-SXM"]),
    (dict(gpu="A100-80GB"), ["on A100-80GB"]),
    (dict(tp=2), ["TP 2"]),
    (dict(kv_dtype="fp8"), ["KV fp8"]),                       # fp8 KV beside bf16 weights: not measured
    # fp8 has no async-off run beside its tables (bf16 has: the next test)
    (dict(weights="fp8", kv_dtype="fp8", async_scheduling=False), ["async scheduling off"]),
])
def test_a_setup_nobody_measured_is_one_line_naming_it_and_what_was(over, words):
    with pytest.raises(InputError) as err:
        vllm_table_for(**_setup(**over))
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text
    assert "measured: " in text and "Llama-3.1-8B fp8 on NVIDIA H100 80GB HBM3" in text


def test_the_cli_runs_the_table_it_names_and_refuses_an_unmeasured_setup(tmp_path, capsys):
    base = ["replay", "random:isl=256,osl=16,n=12,concurrency=4", "--gpu", "h100", "--quiet"]
    outputs = []
    for table in ("vllm", str(TABLES_DIR / "llama8b-bf16-fine_H100.csv")):
        out = tmp_path / f"{len(outputs)}.json"
        assert main(base + ["--cost-table", table, "--out", str(out)]) == 0
        summary = json.loads(out.read_text())
        assert "llama8b-bf16-fine_H100.csv" in summary["config"]["clock"]
        summary.pop("wall_clock_s")
        summary["config"].pop("cost_table", None)
        outputs.append(json.dumps(summary, sort_keys=True))
    assert outputs[0] == outputs[1]          # the same run as the table given by its path
    capsys.readouterr()
    assert main(base + ["--cost-table", "vllm", "--model", "Qwen2.5-7B"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no table of real vLLM's steps for Qwen2.5-7B" in err


def test_the_scheduling_mode_must_match_both_ways():
    """A table measured with async scheduling on is no clock for a synchronous run, nor one
    measured with it off for an asynchronous run; a table that does not say fits either."""
    from kvsim.simulator.cost_table import provenance_mismatches
    on, off = ({"executor": f"vllm, dtype bfloat16, async scheduling {v}"} for v in (True, False))
    assert provenance_mismatches(on, async_scheduling=True) == provenance_mismatches(off, async_scheduling=False) == []
    assert provenance_mismatches(on, async_scheduling=False) == \
        ["async scheduling off (the table measured it on, and not what async scheduling hides)"]
    # ... unless the table also measured what a step costs more with it off
    assert provenance_mismatches({**on, "async off": "+0.001 s per step (a run)"}, async_scheduling=False) == []
    assert provenance_mismatches(off, async_scheduling=True)[0].startswith("async scheduling on")
    assert provenance_mismatches({"executor": "kvsim"}, async_scheduling=True) == []


def test_async_off_on_a_table_measured_with_it_on_adds_what_it_hid_to_every_step():
    """Llama-3.1-8B bf16 and Qwen3-30B-A3B on the H100 have the wave plan served with async
    scheduling off beside their tables (the tables' '# async off:' line): a synchronous run takes
    the same table, every step (and every step of a decode run) costs that much more, and the
    clock line says so; a table without the line is refused for it."""
    from kvsim.planner.engine_setup import build_engine
    from kvsim.simulator.cost import StepBatch
    from kvsim.simulator.cost_table import load_cost_table

    table = TABLES_DIR / "llama8b-bf16-fine_H100.csv"
    assert vllm_table_for(**_setup(async_scheduling=False)) == table
    hidden, per_seq, source = load_cost_table(table).async_off
    assert 0.0005 < hidden < 0.002 and 0 < per_seq < 1e-4 and "llama8b-bf16-noasync-wave" in source
    setups = {a: build_engine(model="Llama-3.1-8B", gpu=H100, cost_table="vllm", async_scheduling=a) for a in (True, False)}
    decode = StepBatch(8, 0, 8, 8, 8 * 1000, 8 * 1000, 1000)
    prefill = StepBatch(1, 3000, 0, 3000, 3000, 3000 * 1500, 3000)
    for batch in (decode, prefill):      # a fixed part, and one for each request in the step
        on, off = (setups[a].cost.step_time_s(batch) for a in (True, False))
        assert off - on == pytest.approx(hidden + per_seq * batch.num_seqs, abs=1e-12)
    on, off = (setups[a].cost.run_time_s(decode, 50) for a in (True, False))
    assert off - on == pytest.approx(50 * (hidden + 8 * per_seq), rel=1e-9)
    assert setups[True].config.async_scheduling and not setups[False].config.async_scheduling
    clock = setups[False].cost.describe()
    assert "llama8b-bf16-fine_H100.csv" in clock and f"async scheduling off: +{hidden * 1e3:.2f} ms a step " \
        f"+{per_seq * 1e6:.1f} us a request in it" in clock
    assert "async scheduling off" not in setups[True].cost.describe()
    with pytest.raises(InputError, match="async scheduling off"):
        build_engine(model="Llama-3.1-8B", gpu=H100, weight_dtype="fp8", kv_cache_dtype="fp8",
                     cost_table=str(TABLES_DIR / "llama8b-fp8-fine_H100.csv"), async_scheduling=False)


def test_a_bad_async_off_line_is_one_error_naming_the_table(tmp_path):
    from kvsim.simulator.cost_table import load_cost_table

    text = (TABLES_DIR / "llama8b-bf16_H100.csv").read_text()
    bad = tmp_path / "t.csv"
    for wrong in (text.replace("# async off: +", "# async off: -"), text.replace(" s per sequence", " per seq")):
        bad.write_text(wrong)
        with pytest.raises(InputError) as err:
            load_cost_table(bad)
        assert "'# async off:'" in str(err.value) and "t.csv" in str(err.value) and "\n" not in str(err.value)
    # the per-sequence part may be left out: nothing per request
    bad.write_text(re.sub(r" \+\S+ s per sequence", "", text))
    assert load_cost_table(bad).async_off[1] == 0.0


def test_every_model_real_vllm_was_measured_serving_is_a_preset_whose_default_clock_is_its_table():
    """Qwen3-30B-A3B and Qwen3-32B are presets (their config.json bundled), so `--model NAME`
    alone reaches their measured tables, as Llama-3.1-8B, Llama-3.1-70B and gpt-oss do."""
    from kvsim.planner.engine_setup import build_engine
    from kvsim.planner.presets import get_model
    from kvsim.simulator.cost_table import StepShapeCost

    models = {provenance["model"] for _, provenance, _ in measured_tables()}
    assert {"Qwen3-30B-A3B", "Qwen3-32B"} <= models
    for model in models:
        spec = get_model(model)
        assert spec.name == model
        gpu = "H200" if model == "Llama-3.1-70B" else "h100"      # Llama-3.1-70B fp8: the H200's alone
        quant = dict(weight_dtype="fp8", kv_cache_dtype="fp8") if model == "Llama-3.1-70B" else {}
        cost = build_engine(model=model, gpu=gpu, max_model_len=8192, **quant).cost
        while not isinstance(cost, StepShapeCost) and hasattr(cost, "inner"):
            cost = cost.inner       # a table with its host's '# eager launch:' line floors its eager steps
        assert isinstance(cost, StepShapeCost) and cost.provenance["model"] == model, model
    assert get_model("Qwen/Qwen3-30B-A3B").name == "Qwen3-30B-A3B" and get_model("qwen3-32b").name == "Qwen3-32B"
    assert get_model("Qwen3-30B-A3B").num_layers == 48 and get_model("Qwen3-32B").num_layers == 64
