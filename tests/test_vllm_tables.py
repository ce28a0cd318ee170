"""``--cost-table vllm``: the shipped table of real vLLM's steps for the run's setup
(planner.vllm_tables)."""
from __future__ import annotations

import json

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
    (dict(weights="dtype", kv_dtype="auto", async_scheduling=False), ["async scheduling off"]),
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
    assert provenance_mismatches(on, async_scheduling=False) == ["async scheduling off (the table measured it on)"]
    assert provenance_mismatches(off, async_scheduling=True)[0].startswith("async scheduling on")
    assert provenance_mismatches({"executor": "kvsim"}, async_scheduling=True) == []
