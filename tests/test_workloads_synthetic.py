"""Synthetic generators: determinism, the paper's means, arrivals, sharing, the spec grammar."""
import dataclasses

import numpy as np
import pytest

from kvsim.workloads import DEFAULT_WORKLOAD, InputError, load
from kvsim.workloads.spec import parse_spec
from kvsim.workloads.stats import PrefixReuse, workload_stats
from kvsim.workloads.synthetic import (PRESETS, Gamma, LengthModel, LogNormal, Poisson, Uniform,
                                 arrival_times, pair_means, preset_lengths)


def _rng(seed=0):
    return np.random.Generator(np.random.PCG64(seed))


def test_same_seed_same_requests_other_seed_other_requests():
    spec = "sharegpt:rate=3,n=400,system=64,system_frac=0.5,turns=uniform(1,5),think_s=4"
    a, b = list(load(spec, seed=7)), list(load(spec, seed=7))
    assert a == b
    assert repr(a) == repr(b)  # byte-identical
    assert list(load(spec, seed=8)) != a
    assert list(load(spec + ",seed=7")) == a  # the spec's seed= is the same seed


@pytest.mark.parametrize("name", ["sharegpt", "alpaca"])
def test_preset_means_match_the_vllm_paper(name):
    prompt_mean, _, output_mean, _, max_len = PRESETS[name]
    model = preset_lengths(name)
    exact_p, exact_o = pair_means(model)  # calibration: exact after rounding and redrawing
    assert exact_p == pytest.approx(prompt_mean, rel=1e-6)
    assert exact_o == pytest.approx(output_mean, rel=1e-6)
    p, o = model.sample(_rng(3), 400_000)
    assert p.mean() == pytest.approx(prompt_mean, rel=0.01)
    assert o.mean() == pytest.approx(output_mean, rel=0.01)
    assert (p + o).max() <= max_len and p.min() >= 1 and o.min() >= 1


def test_pair_means_agree_with_sampling_for_other_shapes():
    model = LengthModel(LogNormal(300, 1.5), LogNormal(900, 0.8), 1024)
    exact_p, exact_o = pair_means(model)
    p, o = model.sample(_rng(1), 200_000)
    assert p.mean() == pytest.approx(exact_p, rel=0.01)
    assert o.mean() == pytest.approx(exact_o, rel=0.01)
    assert exact_p < 300  # redrawing long pairs pulls the mean down


def test_poisson_and_gamma_arrivals():
    for process, cv in ((Poisson(4.0), 1.0), (Gamma(4.0, 3.0), 3.0)):
        it = arrival_times(process, _rng(5))
        times = np.array([next(it) for _ in range(50_000)])
        gaps = np.diff(times)
        assert times[0] == 0.0
        assert gaps.mean() == pytest.approx(0.25, rel=0.05)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_spec_distributions_and_duration():
    reqs = list(load("synthetic:prompt=uniform(10,20),output=fixed(7),rate=50,duration_s=10"))
    assert all(10 <= r.prompt_tokens <= 20 and r.output_tokens == 7 for r in reqs)
    assert all(r.arrival_s < 10 for r in reqs) and 400 < len(reqs) < 600
    assert all(r.segments == () and r.num_shareable_tokens == 0 for r in reqs)
    reqs = list(load("synthetic:prompt=lognormal(mean=500,sigma=0.6),output=40,rate=5,n=3000,"
                     "arrival=gamma(cv=2)"))
    assert np.mean([r.prompt_tokens for r in reqs]) == pytest.approx(500, rel=0.03)


def test_system_prompt_is_one_shared_segment():
    reqs = list(load("alpaca:rate=10,n=200,system=100,system_frac=0.5", seed=1))
    with_sys = [r for r in reqs if r.num_shareable_tokens == 100]
    without = [r for r in reqs if r.num_shareable_tokens == 0]
    assert len(with_sys) + len(without) == 200 and 60 < len(with_sys) < 140
    sys_id = with_sys[0].segments[0]
    assert all(r.segments[0] == sys_id and r.prompt_tokens == 100 + r.segments[1][1]
               for r in with_sys)
    assert all(r.segments == () for r in without)
    # every request behind the prompt after the first hits its 6 full blocks (96 tokens)
    reuse = PrefixReuse(16)
    hits = [reuse.add(r) for r in with_sys]
    assert hits[0] == 0 and all(h == 96 for h in hits[1:])


def test_multi_turn_prompt_contains_the_whole_conversation():
    reqs = list(load("sharegpt:rate=0.5,n=300,turns=4,think_s=10", seed=2))
    by_conv = {}
    for r in reqs:
        by_conv.setdefault(r.conversation_id, []).append(r)
    multi = [turns for turns in by_conv.values() if len(turns) > 1]
    assert multi
    for turns in multi:
        assert [r.turn for r in turns] == list(range(len(turns)))
        for prev, cur in zip(turns, turns[1:]):
            history = prev.segments + ((prev.output_segment(), prev.output_tokens),)
            assert cur.segments[:len(history)] == history  # earlier prompt AND output
            assert cur.prompt_tokens > prev.prompt_tokens + prev.output_tokens
            assert cur.arrival_s >= prev.arrival_s
            assert prev.num_shareable_tokens == prev.prompt_tokens + prev.output_tokens
            assert cur.prompt_tokens + cur.output_tokens <= 2048
        if len(turns) == 4:  # complete (the n= cut may end a conversation early)
            last = turns[-1]
            assert last.num_shareable_tokens == last.prompt_tokens - last.segments[-1][1]
        # a later turn's keys start with every full block of the earlier turn's prompt+output
        k0, k1 = turns[0].block_keys(16), turns[1].block_keys(16)
        n0 = len(k0)
        assert list(k1[:n0]) == list(k0)
    assert any(len(turns) == 4 for turns in multi)
    assert [r.arrival_s for r in reqs] == sorted(r.arrival_s for r in reqs)
    assert [r.request_id for r in reqs] == list(range(300))


def test_sharing_does_not_change_the_arrivals_of_single_requests():
    plain = [r.arrival_s for r in load("sharegpt:rate=2,n=100", seed=4)]
    shared = [r.arrival_s for r in load("sharegpt:rate=2,n=100,system=300", seed=4)]
    assert plain == shared


def test_parallel_sampling_and_beam():
    reqs = list(load("alpaca:rate=5,n=20,samples=4"))
    r = reqs[0]
    assert r.n == 4 and r.num_shareable_tokens == r.prompt_tokens  # siblings hold the prompt
    keys = [r.block_keys(1, sample=j) for j in range(4)]
    p = r.prompt_tokens
    assert len({tuple(k[:p]) for k in keys}) == 1  # same prompt
    assert len({k[p] for k in keys}) == 4          # different outputs
    with pytest.raises(ValueError, match="sample 4"):
        r.block_keys(16, sample=4)
    assert next(load("alpaca:rate=5,n=2,beam=3")).beam_width == 3
    with pytest.raises(InputError, match="not both"):
        load("alpaca:rate=5,n=2,beam=3,samples=2")


def test_replayed_arrivals(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,5,5\n1.5,5,5\n1.5,5,5\n4,5,5\n")
    reqs = list(load(f"synthetic:prompt=fixed(9),output=3,arrival=replay({trace})"))
    assert [r.arrival_s for r in reqs] == [0.0, 1.5, 1.5, 4.0]
    assert all(r.prompt_tokens == 9 for r in reqs)
    assert len(list(load(f"sharegpt:n=2,arrival=replay({trace})"))) == 2
    with pytest.raises(InputError, match="own arrival times"):
        load(f"sharegpt:arrival=replay({trace})", rate=3.0)


def test_default_workload_shows_sharing():
    stats = workload_stats(load(DEFAULT_WORKLOAD))
    assert stats["num_requests"] == 300
    assert stats["num_conversations"] < 300
    assert stats["prefix_hit_fraction"] > 0.3


@pytest.mark.parametrize("spec, field, text", [
    ("sharegpt:rate=2,colour=red", "colour", "unknown key for 'sharegpt'"),
    ("sharegpt:n=10", "rate", "needs rate="),
    ("sharegpt:rate=0,n=10", "rate", "must be > 0"),
    ("sharegpt:rate=x", "rate", "expected a number"),
    ("sharegpt:rate=nan", "rate", "finite"),
    ("sharegpt:rate=1,n=0", "n", "must be >= 1"),
    ("sharegpt:rate=1,n=2.5", "n", "expected an integer"),
    ("synthetic:rate=1,output=5", "prompt", "need prompt= and output="),
    ("synthetic:rate=1,prompt=zipf(2),output=5", "prompt", "unknown distribution zipf()"),
    ("synthetic:rate=1,prompt=uniform(5),output=5", "prompt", "needs high"),
    ("synthetic:rate=1,prompt=uniform(9,5),output=5", "prompt", "low <= high"),
    ("synthetic:rate=1,prompt=uniform(1,1e30),output=5", "prompt", "expected an integer"),
    ("synthetic:rate=1,prompt=uniform(1,10000000000000),output=5", "prompt", "high <= "),
    ("synthetic:rate=1,prompt=lognormal(5,1,2),output=5", "prompt", "at most 2 arguments"),
    ("synthetic:rate=1,prompt=lognormal(mean=5,sd=1),output=5", "prompt", "no argument 'sd'"),
    ("synthetic:rate=1,prompt=2000,output=100,max_len=1024", "max_len", "exceed max_len 1024"),
    ("sharegpt:rate=1,arrival=weibull", "arrival", "unknown arrival process"),
    ("sharegpt:rate=1,arrival=gamma(cv=0)", "arrival", "must be > 0"),
    ("sharegpt:rate=1,arrival=replay(a.csv)", "rate", "own arrival times"),
    ("sharegpt:rate=1,rate=2", "rate", "given twice"),
    ("sharegpt:rate=1,system_frac=0.5", "system_frac", "no effect without system="),
    ("sharegpt:rate=1,think_s=5", "think_s", "no effect without turns="),
    ("sharegpt:rate=1,system=10,system_frac=1.5", None, "fraction <= 1"),
    ("sharegpt:rate=1,n=(3", None, "unbalanced"),
    ("sharegpt:rate=1,n", None, "has no '='"),
    ("sharegpt:rate=1,,n=3", None, "empty parameter"),
    ("zipfian:rate=1", None, "unknown workload 'zipfian'"),
])
def test_spec_errors_name_the_key(spec, field, text):
    with pytest.raises(InputError) as err:
        list(load(spec))
    assert text in str(err.value)
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_spec_grammar():
    s = parse_spec(" synthetic : prompt = lognormal(500, sigma=0.6) , output=fixed(128),"
                   "arrival=replay(/a b/c,d.csv)")
    assert s.name == "synthetic" and list(s.params) == ["prompt", "output", "arrival"]
    ln = s.params["prompt"]
    assert (ln.name, ln.args, ln.kwargs) == ("lognormal", ("500",), (("sigma", "0.6"),))
    assert s.params["arrival"].inner == "/a b/c,d.csv"  # a path keeps its commas
    assert parse_spec("sharegpt").params == {}


def test_request_validates_its_fields():
    from kvsim.workloads import Request
    with pytest.raises(ValueError, match="segments cover 5"):
        Request(0, 0.0, 6, 1, segments=((1, 5),))
    with pytest.raises(ValueError, match=">= 1"):
        Request(0, 0.0, 0, 1)
    r = Request(3, 0.0, 40, 8)
    assert dataclasses.fields(r) and not hasattr(r, "__dict__")  # slotted
    # unique content: no two requests share a key, even with equal lengths
    assert set(r.block_keys(8)).isdisjoint(Request(4, 0.0, 40, 8).block_keys(8))


def test_uniform_bounds_inclusive():
    x = Uniform(3, 5).sample(_rng(), 10_000)
    assert set(x.tolist()) == {3, 4, 5}


def test_request_memory_does_not_grow_with_tokens():
    import tracemalloc
    from kvsim.workloads import Request
    tracemalloc.start()
    r = Request(0, 0.0, 10**9, 10**6, segments=((1, 10**9 - 5), (2, 5)),
                num_shareable_tokens=10**9)
    keys = r.block_keys(16)
    last = keys[len(keys) - 1]  # any key is computed on demand
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(keys) == (10**9 + 10**6) // 16 and isinstance(last, int)
    assert peak < 10_000, peak
