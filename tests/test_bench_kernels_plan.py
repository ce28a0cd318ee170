"""The GPU run plan (bench/kernels_h200_plan.json) and bench/kernels.py's --plan: device time is
scarce, so a plan whose indices or variant names no longer match the benchmark's lists must fail
here, on CPU, not on the device."""
import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "bench" / "kernels_h200_plan.json"
PLANS = sorted((ROOT / "bench").glob("kernels_h200_plan*.json"))  # the whole run and the confirm run


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_kernels_under_test", ROOT / "bench" / "kernels.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules[spec.name]


def _args(plan=PLAN, **given):
    names = ("decode_points", "mixed_points", "mixed_variants", "prefill_points", "prefill_variants",
             "correctness_cases", "shares")
    return argparse.Namespace(plan=plan, **{n: given.get(n) for n in names})


def test_plans_found():
    assert PLAN in PLANS and len(PLANS) >= 2


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
def test_committed_plan_matches_the_benchmark(bench, path):
    plan = json.loads(path.read_text())
    for key, points in (("mixed_points", bench.MIXED_POINTS), ("prefill_points", bench.PREFILL_POINTS),
                        ("correctness_cases", bench.CORRECTNESS_CASES)):
        assert all(0 <= i < len(points) for i in plan[key]), key
    grid = set(bench.decode_grid())
    assert all(tuple(p) in grid for p in plan["decode_points"])  # the points of earlier runs, comparable
    assert set(plan["shares"]) == {"correctness", "eager", "mixed", "prefill", "decode"}
    args = _args(plan=path)
    bench.apply_plan(args, plan)  # raises on unknown variants
    assert args.decode_points.split(",")[0] == ":".join(map(str, plan["decode_points"][0]))
    assert args.mixed_points == ",".join(map(str, plan["mixed_points"]))
    assert args.prefill_variants == ",".join(plan["prefill_variants"])
    assert dict(x.split("=") for x in args.shares.split(",")) == {k: str(v) for k, v in plan["shares"].items()}


def test_command_line_wins_over_plan_and_defaults_fill_the_rest(bench):
    args = _args(mixed_points="1")
    bench.apply_plan(args, {"mixed_points": [3, 4], "prefill_points": [2]})
    assert args.mixed_points == "1" and args.prefill_points == "2"
    assert args.mixed_variants == "rows64" and args.prefill_variants == "" and args.shares == ""
    assert args.decode_points is None and args.correctness_cases is None


@pytest.mark.parametrize("plan", [{"decode_point": [[1, 512, 16, 1]]}, {"prefill_variants": ["w9"]}])
def test_plan_mistakes_stop_before_the_run(bench, plan):
    with pytest.raises(SystemExit):
        bench.apply_plan(_args(), plan)
