"""planner.held_out: every clock line ends with how close that clock came to real vLLM on runs it
was not fitted to (tables/vllm/held_out.json, written by bench/vllm_compare.py --held-out-json),
or says it was not measured; the shipped figures are the ones vllm_compare computes today and the
ones docs/ACCURACY.md gives."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from kvsim.planner.engine_setup import build_engine
from kvsim.planner.held_out import HELD_OUT_PATH, KEY_FIELDS, clock_key, held_out_note, held_out_rows
from kvsim.simulator.cost import clock_source

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = json.loads(HELD_OUT_PATH.read_text())


def _row(**over):
    key = clock_key(table="t_H100.csv", measured_on="H100-80GB-SXM", gpu="H100-80GB-SXM", model="M", moe=False,
                    weights="dtype", kv_dtype="auto", tp=1, async_scheduling=True)
    return {**key, "engine": "m", "vllm_gpu": "H100", "points": 11, "tpot_pct": 1.25, "ttft_pct": 5.0,
            "e2e_pct": 2.0, "e2e_signed_pct": -2.0, **over}


def test_a_measured_clock_gives_its_own_figures():
    rows = (_row(), _row(clock="roofline", table=None, measured_on=None, tpot_pct=9.0))
    note = held_out_note({k: rows[0][k] for k in KEY_FIELDS}, rows)
    assert "11 closed loops of M on the H100: TPOT 1.2 %, TTFT 5.0 %, E2E 2.0 %" in note
    roof = held_out_note({k: rows[1][k] for k in KEY_FIELDS}, rows)
    assert "TPOT 9.0 %" in roof and "first-use compile" not in roof
    calm = _row(stall_free={"points": 10, "tpot_pct": 1.0, "ttft_pct": 3.0, "e2e_pct": 1.5, "e2e_signed_pct": 0.5})
    note = held_out_note({k: calm[k] for k in KEY_FIELDS}, (calm,))
    assert "TTFT 5.0 %" in note and "no first-use compile delayed (a fresh engine" in note and "TTFT 3.0 %" in note
    # one field off (async scheduling, TP, the KV dtype, another table): not that clock's figures
    for field, value in (("async_scheduling", False), ("tp", 2), ("kv_dtype", "fp8"), ("table", "u_H100.csv")):
        other = held_out_note({**{k: rows[0][k] for k in KEY_FIELDS}, field: value}, rows)
        assert "closed loops of M" not in other and "not measured" in other


def test_a_clock_measured_on_compile_free_engines_also_gives_their_figures():
    """A model whose fresh engines compile kernels inside the loops (gpt-oss) and that was also
    served by engines with nothing left to compile (vllm_compare --compile-free): the clock line
    gives both, the warmed engines' after the fresh ones'; the shipped gpt-oss-20b H100 default
    clock says it, and its warmed figures are closer on every metric."""
    warm = {"points": 12, "tpot_pct": 2.25, "ttft_pct": 19.7, "e2e_pct": 3.6, "e2e_signed_pct": -3.4, "runs": ["r"]}
    row = _row(ttft_pct=40.1, compile_free=warm)
    note = held_out_note({k: row[k] for k in KEY_FIELDS}, (row,))
    assert note.index("TTFT 40.1 %") < note.index("compiled every kernel before the loops") < note.index("TTFT 19.7 %")
    assert "(12 loops): TPOT 2.2 %, TTFT 19.7 %, E2E 3.6 %" in note
    assert "compiled every kernel" not in held_out_note({k: row[k] for k in KEY_FIELDS}, (_row(),))
    setup = build_engine(model="gpt-oss-20b", gpu="h100", max_model_len=8192)
    shipped = next(r for r in held_out_rows() if all(r[k] == setup.clock[k] for k in KEY_FIELDS))
    line = clock_source(setup.cost)
    assert "compiled every kernel before the loops" in line
    assert f"TTFT {shipped['compile_free']['ttft_pct']:.1f} %" in line
    assert all(shipped["compile_free"][f] < shipped[f] for f in ("tpot_pct", "ttft_pct", "e2e_pct"))


def test_an_unmeasured_clock_says_so_with_its_kinds_range():
    rows = (_row(clock="roofline", table=None, measured_on=None, tpot_pct=1.0, ttft_pct=4.0, e2e_pct=2.0),
            _row(clock="roofline", table=None, measured_on=None, model="N", tpot_pct=3.0, ttft_pct=8.0, e2e_pct=2.0),
            _row(clock="roofline", table=None, measured_on=None, model="E", moe=True, tpot_pct=30.0),
            _row(gpu="H200", tpot_pct=7.0))     # a table carried from the H100 to the H200
    roofline = clock_key(table=None, measured_on=None, gpu="A100-80GB", model="X", moe=False, weights="dtype",
                         kv_dtype="auto", tp=1, async_scheduling=True)
    note = held_out_note(roofline, rows)
    # the dense engines' roofline range, not the MoE one's
    assert "not measured" in note and "2 dense" in note and "TPOT 1.0-3.0 %, TTFT 4.0-8.0 %, E2E 2.0 %" in note
    assert "MoE" in held_out_note({**roofline, "moe": True}, rows)
    carried = {**roofline, "clock": "table", "table": "t_H100.csv", "measured_on": "H100-80GB-SXM"}
    note = held_out_note(carried, rows)
    assert "carried" in note and "TPOT 7.0 %" in note
    assert held_out_note(roofline, ()) is None      # nothing measured (installed without the file)


def test_the_default_clock_names_its_table_and_ends_with_its_figures():
    setup = build_engine(model="Qwen3-30B-A3B", gpu="h100", max_model_len=8192)
    assert setup.clock["table"] == "qwen3-30b-a3b-fine_H100.csv" and setup.clock["moe"]
    row = next(r for r in held_out_rows() if all(r[k] == setup.clock[k] for k in KEY_FIELDS))
    line = clock_source(setup.cost)
    assert line.startswith("measured table") and line.endswith("docs/ACCURACY.md)")
    assert f"TTFT {row['ttft_pct']:.1f} %" in line and "on the H100" in line
    # the shipped table's model is shared by every run of the process: the note is on a copy
    from kvsim.planner.vllm_tables import TABLES_DIR, shipped_cost
    assert getattr(shipped_cost(TABLES_DIR / setup.clock["table"]), "held_out_note", None) is None
    roofline = build_engine(model="Qwen3-30B-A3B", gpu="h100", max_model_len=8192, cost_table="roofline")
    assert roofline.clock["clock"] == "roofline"
    line = clock_source(roofline.cost)
    assert "held out against real vLLM 0.23.0 on 11 closed loops" in line and "Azure conversation trace" in line


@pytest.mark.parametrize("change", [dict(step_time_scale=1.2), dict(flops_efficiency=1.0),
                                    dict(step_overhead_s=0.004), dict(step_s=0.01), dict(eager_launch_s=0.05)])
def test_a_clock_the_user_changed_gets_no_figures(change):
    setup = build_engine(model="Qwen3-30B-A3B", gpu="h100", max_model_len=8192, **change)
    assert setup.clock is None and "held out" not in clock_source(setup.cost)


def test_a_fresh_engines_clock_has_figures_of_its_own():
    """--first-use-compiles prices a freshly started engine: its own rows (vllm_compare
    --first-use-compiles), not the warmed server's."""
    warm = build_engine(model="gpt-oss-120b", gpu="h100", max_model_len=8192)
    fresh = build_engine(model="gpt-oss-120b", gpu="h100", max_model_len=8192, first_use_compiles=True)
    assert fresh.clock == {**warm.clock, "first_use_compiles": True}
    rows = {r["first_use_compiles"]: r for r in held_out_rows()
            if r["table"] == warm.clock["table"] and r["vllm_gpu"] == "H100"}
    line = clock_source(fresh.cost)
    assert "freshly started engine" in line and f"TTFT {rows[True]['ttft_pct']:.1f} %" in line
    assert f"TTFT {rows[False]['ttft_pct']:.1f} %" in clock_source(warm.cost)
    assert rows[True]["ttft_pct"] < rows[False]["ttft_pct"]     # its compiles priced: closer to the fresh runs
    # the roofline prices no compiles: a first-use roofline is an error before any note
    with pytest.raises(Exception, match="first-use compiles"):
        build_engine(model="gpt-oss-120b", gpu="h100", max_model_len=8192, first_use_compiles=True,
                     cost_table="roofline")


def test_a_table_of_ones_own_gets_no_figures(tmp_path):
    mine = tmp_path / "qwen3-30b-a3b-fine_H100.csv"      # the shipped table's name, not the shipped table
    shutil.copy(ROOT / "tables" / "vllm" / mine.name, mine)
    setup = build_engine(model="Qwen3-30B-A3B", gpu="h100", max_model_len=8192, cost_table=str(mine))
    assert setup.clock is None and "held out" not in clock_source(setup.cost)
    shipped = build_engine(model="Qwen3-30B-A3B", gpu="h100", max_model_len=8192)
    assert "held out" in clock_source(shipped.cost)       # the shared table was not changed


def test_every_shipped_row_is_a_clock_kvsim_runs():
    from bench.vllm_compare import engine_setup

    for row in SHIPPED["rows"]:
        if row["measured_on"] not in (None, row["gpu"]):
            continue        # vllm_compare's carried-* clocks: the default's rule on a GPU without a table
        folder = ROOT / row["runs"]
        meta = json.loads((folder / "meta.json").read_text())
        clock = "default" if row["clock"] == "table" else "roofline"
        key = engine_setup(row["engine"], meta, clock, row["vllm_gpu"],
                           **({"first_use_compiles": True} if row["first_use_compiles"] else {})).clock
        if row["clock"] == "table" and key["table"] != row["table"]:
            continue        # a table that is not the default (vllm-grid beside vllm-fine)
        assert {k: row[k] for k in KEY_FIELDS} == key, row["engine"]


@pytest.mark.parametrize("gpu,engines,clocks,passes", [
    ("H100", ["qwen3-32b", "llama8b-bf16-noasync"], "default,roofline,carried-h200", [["--traces"], ["--stall-free"]]),
    ("H200", ["llama70b-fp8", "gpt-oss-20b"], "default,roofline", [["--traces"], ["--stall-free"]]),
    ("H100", ["qwen3-32b"], "default", [["--first-use-compiles", "--seeds", "5", "--traces"]]),
])
def test_the_shipped_figures_are_what_vllm_compare_computes_today(tmp_path, gpu, engines, clocks, passes):
    """The file is current: rewritten for some engines, their rows are the shipped ones (the whole
    file: python bench/vllm_compare.py --gpu H100 --clocks default,roofline,carried-h200 --traces
    --held-out-json tables/vllm/held_out.json, then --stall-free in place of --traces, and both with
    --gpu H200 and carried-h100)."""
    from bench.vllm_compare import main

    out = tmp_path / "held_out.json"
    for flags in passes:
        assert main(["--gpu", gpu, "--engines", *engines, "--clocks", clocks, *flags, "--held-out-json", str(out)]) == 0
    fresh = json.loads(out.read_text())["rows"]
    shipped = [r for r in SHIPPED["rows"] if r["vllm_gpu"] == gpu and r["engine"] in engines]
    assert {r["engine"] for r in fresh} == set(engines)
    for row in fresh:       # the shipped rows hold these (and the clocks not asked for here)
        assert row in shipped, (row["engine"], row["clock"], row["table"])
    assert all("azure_conv" in r for r in fresh)     # every one of these engines served the excerpt
    # gpt-oss's fresh engine compiles inside its loops: the requests no compile delayed are closer
    assert all(r["first_use_compiles"] == (passes[0][0] == "--first-use-compiles") for r in fresh)
    calm = [r for r in fresh if "stall_free" in r]
    assert [r["engine"] for r in calm] == (["gpt-oss-20b"] * 2 if gpu == "H200" else [])
    assert all(r["stall_free"]["ttft_pct"] < r["ttft_pct"] for r in calm)


def test_the_shipped_compile_free_figures_are_what_vllm_compare_computes_today(tmp_path, capsys):
    """vllm_compare --compile-free adds to a model's rows the figures over its compile-free engines'
    loops (both servings); they are the shipped ones; without the model's own rows written first it
    is an error, and --compile-free without --held-out-json a usage error."""
    from bench.vllm_compare import main

    out = tmp_path / "held_out.json"
    assert main(["--gpu", "H100", "--engines", "gpt-oss-20b", "--clocks", "default", "--held-out-json", str(out)]) == 0
    warm = ["--gpu", "H100", "--engines", "gpt-oss-20b-keysof", "gpt-oss-20b-keysof2", "gpt-oss-20b-keys2",
            "gpt-oss-20b-cached2",
            "--clocks", "default",
            "--compile-free", "--held-out-json", str(out)]
    assert main(warm) == 0
    doc = json.loads(out.read_text())
    # the engines named in another order: the same file
    assert main(warm[:3] + list(reversed(warm[3:7])) + warm[7:]) == 0
    assert json.loads(out.read_text()) == doc
    (row,) = doc["rows"]
    assert doc["compile_free"] == SHIPPED["compile_free"]          # the file says what the figures are
    assert main(["--gpu", "H100", "--engines", "qwen3-32b", "--clocks", "default", "--held-out-json", str(out)]) == 0
    assert json.loads(out.read_text())["compile_free"] == SHIPPED["compile_free"]   # kept by a later write
    shipped = next(r for r in SHIPPED["rows"] if all(r[k] == row[k] for k in KEY_FIELDS) and r["vllm_gpu"] == "H100")
    assert row["compile_free"] == shipped["compile_free"] and row["compile_free"]["points"] == 28
    assert row["compile_free"]["runs"] == [f"bench/results/vllm_h100/gpt-oss-20b-{k}" for k in ("keysof", "keysof2",
                                                                                              "keys2", "cached2")]
    out.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit, match="no row of gpt-oss-20b on the H100 under its default clock to add the "
                                         "compile-free figures to"):
        main(warm)
    with pytest.raises(SystemExit) as exc:
        main(warm[:-2])
    assert exc.value.code == 2 and "--compile-free adds to --held-out-json" in capsys.readouterr().err


def _accuracy_rows():
    """The headline table of docs/ACCURACY.md: (GPU, table cell, async off, default figures, roofline
    figures, the Azure excerpt's signed figures under the default clock)."""
    text = (ROOT / "docs" / "ACCURACY.md").read_text()
    section = text.split("## kvsim's default clock against real vLLM", 1)[1]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or not cells[1].startswith("H") or not re.match(r"[\d.]+ %", cells[3]):
            continue
        default = [float(c.removesuffix(" %")) for c in cells[3:6]]
        roofline = [float(x) for x in cells[6].removesuffix(" %").split(" / ")]
        azure = [float(x) for x in cells[7].removesuffix(" %").split(" / ")]
        yield cells[1], cells[2].split()[0], "async off" in cells[0], default, roofline, azure


def test_the_accuracy_tables_figures_are_the_shipped_ones():
    seen = 0
    for gpu, table, async_off, default, roofline, azure in _accuracy_rows():
        rows = [r for r in SHIPPED["rows"] if r["vllm_gpu"] == gpu and r["async_scheduling"] != async_off
                and not r["first_use_compiles"]]
        own = next(r for r in rows if r["table"] == table + ".csv")
        roof = next(r for r in rows if r["clock"] == "roofline" and r["engine"] == own["engine"])
        assert [own["tpot_pct"], own["ttft_pct"], own["e2e_pct"]] == pytest.approx(default, abs=0.051), (gpu, table)
        assert [roof["tpot_pct"], roof["ttft_pct"], roof["e2e_pct"]] == pytest.approx(roofline, abs=0.051), \
            (gpu, table)
        trace = own["azure_conv"]
        assert [trace["ttft_pct"], trace["tpot_pct"], trace["e2e_pct"]] == pytest.approx(azure, abs=0.051), (gpu, table)
        seen += 1
    assert seen >= 16


def test_result_json_keeps_the_clocks_figures(tmp_path):
    """kvsim bench --result-json (and replay's summary): config.clock_held_out holds the clock's
    own figures where it was measured; a clock nobody measured has no such key."""
    from kvsim.cli import main

    out = tmp_path / "r.json"
    assert main(["bench", "random:isl=512,osl=16,n=8,concurrency=4", "--model", "Qwen3-30B-A3B", "--gpu", "h100",
                 "--result-json", str(out)]) == 0
    config = json.loads(out.read_text())["kvsim"]
    row = next(r for r in held_out_rows() if r["table"] == "qwen3-30b-a3b-fine_H100.csv" and r["vllm_gpu"] == "H100"
               and r["async_scheduling"])
    assert config["clock_held_out"]["ttft_pct"] == row["ttft_pct"] and config["clock_held_out"]["points"] == 11
    assert config["clock"].endswith("(docs/ACCURACY.md)")
    other = tmp_path / "o.json"
    assert main(["bench", "random:isl=512,osl=16,n=8,concurrency=4", "--model", "Mistral-7B-v0.3", "--gpu", "h100",
                 "--result-json", str(other)]) == 0
    config = json.loads(other.read_text())["kvsim"]
    assert "clock_held_out" not in config and "not measured against real vLLM" in config["clock"]
