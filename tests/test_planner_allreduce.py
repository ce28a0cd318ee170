"""The tensor-parallel all-reduce (planner/allreduce.py) and the roofline's use of it: the
published figures reproduced, the model's shape beyond them, and a step's time at tp > 1."""
from __future__ import annotations

import math

import pytest

from kvsim.planner.allreduce import LINKS, MIB, allreduce_link
from kvsim.planner.presets import custom_gpu, get_gpu, get_model
from kvsim.planner.roofline import RooflineCost
from kvsim.simulator.cost import StepBatch, summed_run_time_s

H100 = LINKS["H100-80GB-SXM"]


@pytest.mark.parametrize("tp, small, one_mib", [(2, 9.5e-6, 26.6e-6), (4, 9.1e-6, 40.2e-6), (8, 10.1e-6, 45.0e-6)])
def test_the_published_h100_points_are_the_models(tp, small, one_mib):
    assert H100.seconds(512, tp) == pytest.approx(small, rel=1e-12)
    assert H100.seconds(MIB, tp) == pytest.approx(one_mib, rel=1e-12)


def test_beyond_1_mib_the_ring_runs_at_the_bus_bandwidth():
    for tp in (2, 4, 8):
        sizes = [2 ** k for k in range(6, 30)]
        times = [H100.seconds(n, tp) for n in sizes]
        assert times == sorted(times)                                  # never faster for more
        assert H100.seconds(MIB + 1, tp) == pytest.approx(H100.seconds(MIB, tp), rel=1e-6)   # continuous
        big = H100.seconds(2 ** 30, tp) - H100.seconds(2 ** 29, tp)
        assert big == pytest.approx(2 * (tp - 1) / tp * 2 ** 29 / 460e9, rel=1e-12)
    assert H100.seconds(MIB, 1) == 0.0 and H100.seconds(0, 8) == 0.0
    assert H100.seconds(MIB, 16) == H100.seconds(MIB, 8) and H100.seconds(MIB, 3) == H100.seconds(MIB, 2)


def test_other_gpus_are_extrapolated_and_say_so():
    assert allreduce_link("H200") is H100 and H100.source == "published"
    a100, l40s = allreduce_link("A100-80GB"), allreduce_link("L40S")
    assert "extrapolated" in a100.source and "extrapolated" in l40s.source
    for tp in (2, 4, 8):   # a slower link: slower at every size past the latency
        assert H100.seconds(64 * MIB, tp) < a100.seconds(64 * MIB, tp) < l40s.seconds(64 * MIB, tp)
    assert allreduce_link("custom") is None


def step(tokens: int, prefill: bool) -> StepBatch:
    if prefill:
        return StepBatch(num_seqs=1, num_prefill_tokens=tokens, num_scheduled_tokens=tokens,
                         kv_read_tokens=tokens, attn_token_pairs=tokens * (tokens + 1) // 2)
    return StepBatch(num_seqs=tokens, num_decode_tokens=tokens, num_scheduled_tokens=tokens,
                     kv_read_tokens=tokens * 2000, attn_token_pairs=tokens * 2000)


def test_a_tp_step_pays_two_all_reduces_a_layer():
    m, g = get_model("Llama-3.1-70B"), get_gpu("h100")
    for tp in (2, 4, 8):
        cost = RooflineCost(m, g, tp=tp)
        for batch in (step(64, False), step(8192, True)):
            mem0, _, comp0, _ = cost._lines(batch)
            per = batch.num_scheduled_tokens * m.hidden_size * 2        # bf16 activations
            expect = max(mem0, comp0) + 2 * m.num_layers * H100.seconds(per, tp) + cost.step_overhead_s
            assert cost.step_time_s(batch) == pytest.approx(expect, rel=1e-12)
    assert RooflineCost(m, g, tp=1).allreduce_s(8192) == 0.0
    # more ranks: less of everything else, more all-reduce time for the same tokens
    ar = [RooflineCost(m, g, tp=tp).allreduce_s(64) for tp in (2, 4, 8)]
    assert ar == sorted(ar) and ar[0] > 0
    assert "published figures, not measured" in RooflineCost(m, g, tp=8).describe()
    assert "extrapolated" in RooflineCost(m, get_gpu("a100-80"), tp=8).describe()
    assert "no all-reduce time" in RooflineCost(m, custom_gpu(80, 3350, 989), tp=8).describe()
    assert "all-reduce" not in RooflineCost(m, g).describe()


@pytest.mark.parametrize("steps", [1, 300])
def test_a_tp_decode_run_is_its_steps_summed(steps):
    cost = RooflineCost(get_model("Llama-3.1-70B"), get_gpu("h100"), tp=4)
    b = step(64, False)
    assert cost.run_time_s(b, steps) == pytest.approx(summed_run_time_s(cost, b, steps), rel=1e-9)
    assert math.isfinite(cost.run_time_s(b, steps))
