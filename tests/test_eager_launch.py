"""An eager step's launch (simulator.cost.EagerLaunchCost, kvsim --eager-launch-ms): on a host whose
launch of a step on no CUDA graph takes L, such a step takes at least L; graph steps and runs keep
their price; real vLLM's table only; bench/vllm_compare.py reads each engine's own launch from its
runs' scheduling times."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.errors import InputError
from kvsim.simulator.cost import EagerLaunchCost, FixedStepCost, StepBatch

RUNS = Path(__file__).resolve().parent.parent / "bench" / "results" / "vllm_h100"


def _batch(tokens: int, seqs: int = 1) -> StepBatch:
    return StepBatch(seqs, tokens if seqs == 1 else 0, 0 if seqs == 1 else seqs, tokens, tokens, tokens, tokens)


def test_a_step_on_no_graph_takes_at_least_its_launch():
    cost = EagerLaunchCost(FixedStepCost(0.01), launch_s=0.05, graph_tokens=512, source="given")
    assert cost.step_time_s(_batch(512)) == 0.01            # on a graph: its price
    assert cost.step_time_s(_batch(513)) == 0.05            # eager, launch-bound: its launch
    slow = EagerLaunchCost(FixedStepCost(0.08), launch_s=0.05, graph_tokens=512, source="given")
    assert slow.step_time_s(_batch(4096)) == 0.08           # more GPU work than the launch: its price
    assert cost.run_time_s(_batch(600, seqs=600), 3) == pytest.approx(0.15)   # an eager decode run
    assert cost.run_time_s(_batch(64, seqs=64), 3) == pytest.approx(0.03)
    assert "at least its launch, 50.0 ms" in cost.describe()


def test_build_engine_puts_the_launch_on_real_vllms_table_only():
    from kvsim.planner.engine_setup import build_engine

    base = dict(model="Qwen3-30B-A3B", gpu="h100")
    setup = build_engine(**base, eager_launch_s=0.08)
    assert isinstance(setup.cost, EagerLaunchCost) and setup.cost.graph_tokens == 512
    assert setup.cost.first_step is not None                # what the engine asks of the table, kept
    for bad in (dict(cost_table="roofline", eager_launch_s=0.08), dict(eager_launch_s=0.0),
                dict(eager_launch_s=float("nan"))):
        with pytest.raises(InputError) as err:
            build_engine(**base, **bad)
        assert err.value.field == "eager_launch_s"


def test_the_flag_slows_launch_bound_waves_and_says_so(capsys):
    """Qwen3-30B-A3B on its H100 table, waves of four 1,024-token prompts (eager steps of about 45 ms
    priced): on an 80 ms host their first tokens come later; the clock line says the launch."""
    from kvsim.cli import main

    argv = ["replay", "--model", "Qwen3-30B-A3B", "--gpu", "h100", "random:isl=1024,osl=32,n=24,concurrency=4,seed=1",
            "--quiet"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main([*argv, "--eager-launch-ms", "80"]) == 0
    slow = capsys.readouterr().out

    def ttft_p50(text):
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("TTFT p50")))
    assert ttft_p50(slow) > ttft_p50(plain) + 0.03
    assert "at least its launch, 80.0 ms" in slow and "launch" not in plain.splitlines()[0]
    with pytest.raises(SystemExit) as err:           # a usage error, before any work
        main([*argv, "--eager-launch-ms", "0"])
    assert err.value.code == 2 and "--eager-launch-ms: must be > 0" in capsys.readouterr().err


def test_vllm_compare_reads_each_engines_own_launch():
    from bench.vllm_compare import own_launch_s

    if not (RUNS / "qwen3-30b-a3b-rerun3" / "meta.json").exists():
        pytest.skip("no measured runs here")
    slow, fast = own_launch_s(RUNS / "qwen3-30b-a3b-rerun3"), own_launch_s(RUNS / "qwen3-30b-a3b-rerun")
    assert 0.06 < slow < 0.1 and 0.04 < fast < 0.055          # two H100 hosts, one model
    assert own_launch_s(RUNS / "llama8b-bf16-burst") < 0.03   # a dense 8B launches faster
    assert 0.04 < own_launch_s(RUNS / "gpt-oss-20b-jit") < 0.07   # its routing compiles (0.7 s) left out
    assert own_launch_s(RUNS / "qwen3-30b-a3b") is None       # from before the probe's t_sched_s
    assert json.loads((RUNS / "qwen3-30b-a3b-rerun3" / "meta.json").read_text())["engine_core"]["async_scheduling"]


def test_grid_table_reads_a_hosts_launch_from_the_scheduling_gaps():
    """grid_table.eager_launch_gaps: an eager step's launch is the gap to the next step's scheduling,
    where that came before the step ended (not after an idle wait), no compile fell between them and
    the step had at most 4,096 tokens; nothing from a steps.csv without t_sched_s."""
    from kvsim.cli.profile_vllm import bench_module

    gaps = bench_module("grid_table").eager_launch_gaps

    def row(tokens, sched, done):
        return {"num_scheduled_tokens": str(tokens), "t_sched_s": str(sched), "t_done_s": str(done)}

    rows = [row(1024, 0.000, 0.110), row(3072, 0.050, 0.120),    # eager, next scheduled at 50 ms: 50 ms
            row(8, 0.115, 0.130),                                 # on a graph: not read
            row(2048, 0.300, 0.350), row(8, 0.400, 0.410),        # next scheduled after it ended: idle
            row(2048, 0.500, 0.900), row(2048, 0.560, 0.950),     # a compile between them: not read
            row(8192, 1.000, 1.200), row(8, 1.120, 1.210)]        # over 4,096 tokens: not read
    assert gaps(rows, 512, compiles=[(0.51, 0.52)]) == pytest.approx([0.05, 0.115 - 0.05])
    assert gaps([{"num_scheduled_tokens": "1024", "t_done_s": "1"}] * 2, 512) == []


def test_a_tables_eager_launch_line_is_read_and_said(tmp_path):
    """A table's '# eager launch:' line (grid_table.py writes it where the grid has t_sched_s): its
    seconds on the cost model, and the clock line says them; a bad value is a one-line error."""
    from kvsim.simulator.cost_table import load_cost_table

    shipped = Path(__file__).resolve().parent.parent / "tables" / "vllm" / "qwen3-30b-a3b-fine_H100.csv"
    lines = shipped.read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    for value, ok in (("0.048300", True), ("-1", False)):
        table = tmp_path / f"t{ok}.csv"
        table.write_text("\n".join([*lines[:head], f"# eager launch: {value} s (this host's launch ...)",
                                    *lines[head:]]) + "\n")
        if ok:
            cost = load_cost_table(table)
            assert cost.eager_launch_s == pytest.approx(0.0483)
            assert "its host launched a step on no CUDA graph in 48.3 ms" in cost.describe()
        else:
            with pytest.raises(InputError) as err:
                load_cost_table(table)
            assert "eager launch" in str(err.value)
    assert load_cost_table(shipped).eager_launch_s is None      # this grid predates t_sched_s


def test_a_tables_own_launch_floors_its_eager_steps_unless_the_user_gives_one(tmp_path):
    """A table with an '# eager launch:' line is its host's prices: build_engine floors its steps on
    no CUDA graph at that launch (source said), and the user's --eager-launch-ms replaces it; a
    table without the line keeps its prices."""
    from kvsim.planner.engine_setup import build_engine

    shipped = Path(__file__).resolve().parent.parent / "tables" / "vllm" / "qwen3-30b-a3b-fine_H100.csv"
    lines = shipped.read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    table = tmp_path / "launch.csv"
    table.write_text("\n".join([*lines[:head], "# eager launch: 0.090000 s (this host's ...)", *lines[head:]]) + "\n")
    base = dict(model="Qwen3-30B-A3B", gpu="h100")
    plain = build_engine(**base, cost_table=str(shipped)).cost
    own = build_engine(**base, cost_table=str(table)).cost
    given = build_engine(**base, cost_table=str(table), eager_launch_s=0.06).cost
    assert not isinstance(plain, EagerLaunchCost)
    assert isinstance(own, EagerLaunchCost) and own.launch_s == pytest.approx(0.09)
    assert own.describe().count("90.0 ms") == 1 and "takes at least the table's host's launch" in own.describe()
    assert given.launch_s == pytest.approx(0.06) and "given" in given.describe()
    eager, graph = _batch(2048), _batch(256)
    assert plain.step_time_s(eager) < 0.09 and own.step_time_s(eager) == pytest.approx(0.09)
    assert own.step_time_s(graph) == plain.step_time_s(graph)
    # the shipped gpt-oss-120b fine grid (2026-12-08) is the first shipped table with the line
    fine = build_engine(model="gpt-oss-120b", gpu="h100", max_model_len=8192)
    assert fine.clock["table"] == "gpt-oss-120b-fine_H100.csv" and isinstance(fine.cost, EagerLaunchCost)
    assert fine.cost.launch_s == pytest.approx(0.080013)
