"""kvsim replay / compare (through their register() modules) and the cost models."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from kvsim.cli import main
from kvsim.errors import InputError
from kvsim.simulator.cost import FixedStepCost, StepBatch, TableCost, summed_run_time_s

ORACLE_TRACE = ("arrival_step,prompt_tokens,output_tokens,prefix_group,prefix_len\n"
                "0,40,5,g,32\n0,50,4,g,32\n2,30,6,,\n3,45,3,g,32\n")


def _main(argv: list[str]) -> int:
    """The ``kvsim`` router itself (InputError -> exit 2; any other exception propagates)."""
    return main(argv)


def test_replay_fidelity_form_writes_oracle_columns(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(ORACLE_TRACE)
    out, req, steps = tmp_path / "r.json", tmp_path / "req.csv", tmp_path / "steps.csv"
    rc = _main(["replay", str(trace), "--format", "vllm-oracle", "--step-clock", "--allocator",
                "paged", "--block-size", "16", "--num-blocks", "40", "--max-num-seqs", "8",
                "--max-num-batched-tokens", "64", "--max-model-len", "256", "--out", str(out),
                "--requests", str(req), "--timeseries", str(steps), "--quiet"])
    assert rc == 0
    summary = json.loads(out.read_text())
    assert summary["requests_finished"] == 4 and summary["config"]["step_clock"]
    r = pd.read_csv(req)
    for col in ("request_id", "first_sched_step", "first_token_step", "finish_step",
                "num_preemptions", "cached_tokens_first"):
        assert col in r.columns
    # request 1 shares 32 tokens (2 full blocks) with request 0, admitted in the same step:
    # vLLM caches blocks when they are scheduled, so it hits both
    assert r.set_index("request_id").loc[1, "cached_tokens_first"] == 32
    s = pd.read_csv(steps)
    assert s["sched_tokens"].max() <= 64 and s["step"].iloc[0] == 0
    assert s["pc_hits"].sum() == summary["prefix_hit_tokens"] > 0


def test_compare_table_and_json(tmp_path, capsys):
    out = tmp_path / "c.json"
    rc = _main(["compare", "sharegpt:rate=5,n=30,seed=2", "--allocators", "paged,max",
                "--num-blocks", "400", "--max-model-len", "4096", "--step-s", "0.02",
                "--json", str(out), "--quiet"])
    assert rc == 0
    table = capsys.readouterr().out
    assert "paged" in table and "max" in table and "internal frag." in table
    data = json.loads(out.read_text())
    assert set(data) == {"paged", "max"}
    assert data["max"]["memory_breakdown"]["internal_fragmentation"] > \
        data["paged"]["memory_breakdown"]["internal_fragmentation"]


@pytest.mark.parametrize("flags,mode", [
    ([], "v1 async"),                                       # roofline: vLLM on a GPU
    (["--no-async-scheduling"], "v1 sync"),
    (["--step-clock"], "v1 sync"),                          # the step clock: the flag chooses
    (["--step-clock", "--async-scheduling"], "v1 async"),
    (["--scheduler", "v0"], "v0"),
])
def test_replay_records_the_scheduling_mode(tmp_path, flags, mode):
    out = tmp_path / "r.json"
    assert _main(["replay", "sharegpt:rate=4,n=30,seed=1", "--num-blocks", "200",
                  "--max-model-len", "2048", *flags, "--out", str(out), "--quiet"]) == 0
    engine = json.loads(out.read_text())["config"]["engine"]
    assert engine.get("async_scheduling", False) is (mode == "v1 async")
    assert engine.get("scheduler", "v1") == mode[:2]
    # a synchronous v1 result keeps the keys it had before the modes existed
    assert ("async_scheduling" in engine or "scheduler" in engine) is (mode != "v1 sync")


def test_compare_runs_every_column_in_one_scheduling_mode(tmp_path, capsys):
    """vLLM's default for its paged engine (async on a GPU) applies to the contiguous columns
    too, so that the columns differ by their allocator only; the table names the mode."""
    out = tmp_path / "c.json"
    base = ["compare", "sharegpt:rate=5,n=30,seed=2", "--allocators", "paged,max",
            "--num-blocks", "400", "--max-model-len", "4096", "--json", str(out), "--quiet"]
    for flags, is_async in (([], True), (["--no-async-scheduling"], False),
                            (["--step-s", "0.02"], False), (["--step-s", "0.02", "--async-scheduling"], True)):
        assert _main(base + flags) == 0
        table = capsys.readouterr().out
        data = json.loads(out.read_text())
        assert [data[c]["config"]["engine"].get("async_scheduling", False) for c in data] == \
            [is_async, is_async], flags
        first = table.splitlines()[1].split()
        assert (first == ["scheduling", "v1", "async", "v1", "async"]) is is_async, table
        assert table.count("scheduling") == int(is_async)


def test_the_scheduler_flags_refuse_what_vllm_v0_cannot_do(tmp_path, capsys):
    base = ["replay", "sharegpt:rate=4,n=10,seed=1", "--num-blocks", "200", "--max-model-len",
            "2048", "--scheduler", "v0", "--out", str(tmp_path / "o.json"), "--quiet"]
    for flags, match in ((["--async-scheduling"], "no async scheduling"),
                         (["--allocator", "max"], "contiguous KV manager"),
                         (["--max-num-batched-tokens", "1024"], "smaller than max_model_len"),
                         (["--long-prefill-token-threshold", "64"], "does not chunk")):
        assert _main(base + flags) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and match in err[0], err
    assert not (tmp_path / "o.json").exists()
    with pytest.raises(SystemExit):
        _main(base[:-5] + ["--scheduler", "v2"])


@pytest.mark.parametrize("argv", [
    ["replay", "sharegpt:n=5,rate=1", "--out", "x.json", "--num-blocks", "50", "--allocator", "x"],
    ["replay", "sharegpt:n=5,rate=1", "--out", "x.json", "--num-blocks", "0"],
    ["replay", "sharegpt:n=5,rate=1", "--num-blocks", "50", "--rate-scale", "0"],
])
def test_usage_errors_exit_2(argv):
    with pytest.raises(SystemExit) as exc:
        _main(argv)
    assert exc.value.code == 2


def test_input_errors_exit_2(tmp_path):
    bad_table = tmp_path / "cost.csv"
    bad_table.write_text("num_scheduled_tokens,step_s\n16,0.01\n32,abc\n")
    base = ["replay", "sharegpt:n=5,rate=1,seed=0", "--out", str(tmp_path / "o.json"), "--quiet"]
    assert _main(base + ["--num-blocks", "100", "--cost-table", str(bad_table)]) == 2
    assert _main(base + ["--num-blocks", "100", "--step-s", "0.01",
                         "--timeseries", str(tmp_path / "ts.txt")]) == 2
    assert _main(["compare", "sharegpt:n=5,rate=1", "--allocators", "paged,slab",
                  "--num-blocks", "100", "--step-s", "0.01"]) == 2
    assert _main(base + ["--num-blocks", "100", "--step-s", "0.01", "--watermark", "2"]) == 2
    assert not (tmp_path / "o.json").exists()


def test_table_cost_interpolates_and_reports_bad_rows(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("num_scheduled_tokens,kv_read_tokens,step_s\n"
                    "1,0,0.010\n1,1000,0.012\n100,0,0.020\n100,1000,0.022\n")
    cost = TableCost(str(path))
    assert cost.kv_coeff_s == pytest.approx(2e-6)
    assert cost.step_time_s(StepBatch(num_scheduled_tokens=50, kv_read_tokens=500)) == \
        pytest.approx(0.010 + 0.010 * 49 / 99 + 0.001)
    batch = StepBatch(num_seqs=4, num_decode_tokens=4, num_scheduled_tokens=4,
                      kv_read_tokens=400, attn_token_pairs=400)
    assert cost.run_time_s(batch, 7) == pytest.approx(summed_run_time_s(cost, batch, 7))
    path.write_text("num_scheduled_tokens,step_s\n1,0.01\n2,-1\n")
    with pytest.raises(InputError) as err:
        TableCost(str(path))
    assert err.value.line == 3 and err.value.field == "step_s"
    path.write_text("tokens,step_s\n1,0.01\n")
    with pytest.raises(InputError, match="num_scheduled_tokens"):
        TableCost(str(path))


def test_fixed_step_cost():
    cost = FixedStepCost(0.5)
    assert cost.run_time_s(StepBatch(num_seqs=3), 4) == 2.0
    with pytest.raises(InputError):
        FixedStepCost(0)


def test_outputs_are_checked_before_the_run_and_directories_created(tmp_path, capsys):
    spec = "sharegpt:rate=2,n=20,seed=0"
    out = tmp_path / "new" / "dir" / "r.json"
    assert main(["replay", spec, "--allocator", "paged", "--num-blocks", "500", "--quiet",
                 "--out", str(out), "--requests", str(tmp_path / "x" / "req.csv")]) == 0
    assert out.is_file() and (tmp_path / "x" / "req.csv").is_file()
    capsys.readouterr()     # (a warning: 499 usable blocks cannot hold max_model_len 8,192)
    # a directory where a file is expected fails at once, in one line, before simulating
    assert main(["replay", spec, "--allocator", "paged", "--num-blocks", "500", "--quiet",
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a directory" in err and len(err.strip().splitlines()) == 1
    assert main(["replay", spec, "--allocator", "paged", "--num-blocks", "500", "--quiet",
                 "--out", str(out), "--timeseries", str(tmp_path / "ts.txt")]) == 2
    assert "unknown file type" in capsys.readouterr().err


def test_replay_help_imports_no_heavy_package():
    """`kvsim replay --help` starts without numpy, pandas, simpy, torch, plotly or streamlit
    (issue 20: under 0.3 s); a fresh interpreter, since other tests import them."""
    import subprocess
    import sys
    code = ("import io, contextlib, sys\n"
            "from kvsim.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            "        main(['replay', '--help'])\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print(','.join(m for m in ('numpy', 'pandas', 'simpy', 'torch', 'plotly',\n"
            "                          'streamlit') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd="/")
    assert out.stdout.strip() == ""


def test_a_pool_vllm_would_not_start_with_max_model_len_is_a_warning_before_the_work(capsys):
    """vLLM 0.33 refuses to start when the pool (less its null block) cannot hold one request
    of max_model_len tokens, also with num_gpu_blocks_override: kvsim runs it (its tests and
    the oracle's cases use such pools) but says so first, with the largest max_model_len that
    would start; a pool of exactly enough blocks says nothing, nor does compare say it twice."""
    from kvsim.simulator.config import EngineConfig
    from kvsim.simulator.footprint import max_model_len_warning

    spec = "sharegpt:rate=4,n=6,seed=1"
    assert _main(["replay", spec, "--num-blocks", "64", "--max-model-len", "2048", "--quiet"]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if "max_model_len" in ln]
    assert err == ["kvsim: warning: max_model_len 2048 needs 128 blocks of 16 tokens and the pool has 63 "
                   "usable: vLLM 0.33 would refuse to start this engine (the largest max_model_len it "
                   "starts with here is 1008); kvsim runs it and rejects the requests that would "
                   "outgrow the pool"]
    assert _main(["replay", spec, "--num-blocks", "129", "--max-model-len", "2048", "--quiet"]) == 0
    assert "max_model_len" not in capsys.readouterr().err
    assert _main(["compare", spec, "--num-blocks", "64", "--max-model-len", "2048"]) == 0
    assert capsys.readouterr().err.count("would refuse to start") == 1
    # without a null block all 128 are usable; the contiguous baselines are not vLLM's pool
    assert max_model_len_warning(EngineConfig(num_blocks=128, block_size=16, max_model_len=2048)) is None
    assert max_model_len_warning(EngineConfig(num_blocks=127, block_size=16, max_model_len=2048))
    assert max_model_len_warning(EngineConfig(allocator="max", capacity_tokens=1000,
                                              max_model_len=2048)) is None


def test_replay_into_a_pipe_shows_no_progress_bar():
    """The bar is for a terminal: into a pipe or a file, stderr has no carriage-return noise and
    the output starts with the clock line."""
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-m", "kvsim.cli", "replay", "--model", "Llama-3.1-8B",
                          "random:isl=256,osl=16,n=8,rate=4,seed=1"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "\r" not in out.stderr and "req/s" not in out.stderr
    assert out.stdout.startswith("clock: ")
