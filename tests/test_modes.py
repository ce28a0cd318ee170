"""The declared table of modes (simulator/modes.py): every combination of policy, KV manager and
features either runs, with the scheduler the table names, or is one InputError line naming it."""
from pathlib import Path

import pytest

from kvsim.cli import main
from kvsim.errors import InputError
from kvsim.simulator import EngineConfig, FixedStepCost, simulate
from kvsim.simulator.config import parse_kv_groups
from kvsim.simulator.engine import SCHEDULERS, Simulation
from kvsim.simulator.modes import ALLOWED, FEATURES, KV_MANAGERS, MODES, POLICIES, Mode, check_mode, \
    table_markdown
from kvsim.simulator.offload import TierConfig
from kvsim.workloads import Request

ROOT = Path(__file__).resolve().parent.parent
CPU = (TierConfig("cpu", 64, 1_000_000, 1e9),)


def config_of(mode: Mode) -> dict:
    """EngineConfig's settings for a mode."""
    kw = dict(scheduler=mode.policy, async_scheduling="async" in mode.features,
              max_model_len=256, max_num_batched_tokens=256, max_num_seqs=8)
    if mode.kv == "contiguous":
        return dict(kw, allocator="max", capacity_tokens=64 * 16)
    kw.update(num_blocks=64)
    if mode.kv == "grouped":
        kw.update(kv_cache_groups=parse_kv_groups("sliding:32,full"), null_block=True)
    return kw


def build(mode: Mode):
    config = EngineConfig(**config_of(mode))
    check_mode(config, offload="offload" in mode.features)
    return config


def test_the_table_covers_every_combination_once():
    feature_sets = {m.features for m in MODES}
    assert len(MODES) == len(POLICIES) * len(KV_MANAGERS) * 2 ** len(FEATURES) == 24
    assert len(feature_sets) == 4 and all(list(f) == sorted(f, key=FEATURES.index) for f in feature_sets)
    assert all(row.runs in SCHEDULERS for row in MODES.values() if row.runs)
    # what kvsim runs, vLLM runs, except the paper's contiguous baseline
    assert all(row.vllm == ALLOWED or m.kv == "contiguous" for m, row in MODES.items() if row.runs)


def test_the_docs_print_the_table():
    text = (ROOT / "docs" / "SIMULATOR.md").read_text()
    start = text.index("<!-- modes table: generated")
    block = text[text.index("\n", start) + 1:text.index("<!-- end of modes table -->")]
    assert block.strip() == table_markdown()


@pytest.mark.parametrize("mode", [m for m, row in MODES.items() if row.runs],
                         ids=lambda m: str(m).replace(" ", ""))
def test_a_mode_kvsim_runs_runs_on_the_scheduler_the_table_names(mode):
    config = build(mode)
    offload = CPU if "offload" in mode.features else ()
    requests = [Request(i, i * 0.5, 40 + 7 * i, 12) for i in range(6)]
    sim = Simulation(requests, config, FixedStepCost(1.0), offload=offload)
    assert type(sim.replicas[0].sched).__name__ == MODES[mode].runs
    result = sim.run()
    assert result.summary["requests_finished"] == 6


@pytest.mark.parametrize("mode", [m for m, row in MODES.items() if not row.runs],
                         ids=lambda m: str(m).replace(" ", ""))
def test_a_mode_kvsim_does_not_run_is_one_line_naming_it(mode):
    with pytest.raises(InputError) as err:
        build(mode)
    text = str(err.value)
    # EngineConfig holds no tiers: it refuses the combination without them first, if it must
    named = Mode(mode.policy, mode.kv, tuple(f for f in mode.features if f != "offload"))
    if MODES[named].runs:
        named = mode
    assert "\n" not in text and f"{named}:" in text and "docs/SIMULATOR.md" in text
    if MODES[named].vllm == ALLOWED:      # vLLM has it: say what kvsim offers instead
        assert "vLLM 0.33 runs it, kvsim does not model it yet: use " in text
    if mode.features == ("offload",):
        # EngineConfig holds no tiers: the simulator refuses the mode when they are given
        with pytest.raises(InputError, match="docs/SIMULATOR.md"):
            simulate([], EngineConfig(**config_of(mode)), FixedStepCost(1.0), offload=CPU)


@pytest.mark.parametrize("argv", [
    ["--scheduler", "v0", "--async-scheduling", "--max-model-len", "2048"],
    ["--allocator", "max", "--cpu-offload-gib", "1"],
    ["--scheduler", "v0", "--kv-groups", "sliding:128,full", "--max-model-len", "2048"],
])
def test_the_cli_says_one_line_and_exits_2(argv, capsys):
    assert main(["replay", "random:n=4,isl=64,osl=8", "--num-blocks", "200", "--quiet",
                 *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "docs/SIMULATOR.md" in err[0] and "KV manager" in err[0], err
