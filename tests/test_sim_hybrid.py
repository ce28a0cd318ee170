"""Hybrid models in the simulator: KV-cache groups (HybridScheduler over GroupedPagedAllocator),
their configuration, and what a replay reports per group. Decision fidelity against vLLM's
hybrid coordinator is tests/test_fidelity_golden.py's hybrid_* cases."""
from __future__ import annotations

import pytest

from kvsim import cli
from kvsim.errors import InputError
from kvsim.planner.engine_setup import build_engine
from kvsim.simulator import EngineConfig, FixedStepCost, Simulation, simulate
from kvsim.simulator.config import format_kv_groups, parse_kv_groups
from kvsim.simulator.engine import make_allocator
from kvsim.simulator.hybrid_scheduler import HybridScheduler
from kvsim.workloads import Request


def _cfg(groups: str, **kw) -> EngineConfig:
    base = dict(num_blocks=200, block_size=4, null_block=True, max_num_seqs=8,
                max_num_batched_tokens=40, max_model_len=512,
                kv_cache_groups=parse_kv_groups(groups))
    base.update(kw)
    return EngineConfig(**base)


def _run(sched, steps: int, t0: int = 0) -> list:
    outs = []
    for t in range(t0, t0 + steps):
        out = sched.schedule(t, t)
        outs.append([(s.req.request_id, n) for s, n in out.entries])
        sched.finish_step(out, t + 1, t)
        sched.allocator.check_invariants()
    return outs


def test_kv_groups_spelling_round_trips_and_bad_entries_are_input_errors():
    groups = parse_kv_groups("sliding:128, full,mamba,mamba_ckpt:64,mamba_ckpt")
    assert [g.kind for g in groups] == ["sliding_window", "full_attention", "mamba", "mamba",
                                        "mamba"]
    assert [g.mamba_checkpoint_alignment for g in groups[2:]] == [None, 64, 1]
    assert format_kv_groups(groups) == "sliding:128,full,mamba,mamba_ckpt:64,mamba_ckpt:1"
    for bad, match in (("full,window:3", "entry 2"), ("sliding", "needs a window"),
                       ("full:3", "takes no argument"), ("sliding:0", "integer >= 1"),
                       ("mamba_ckpt:x", "not an integer")):
        with pytest.raises(InputError, match=match):
            parse_kv_groups(bad)
    with pytest.raises(InputError, match="paged allocator"):
        EngineConfig(allocator="max", capacity_tokens=64, kv_cache_groups=groups)


def test_sliding_window_frees_blocks_behind_it_while_the_request_runs():
    cfg = _cfg("sliding:8,full")
    sched = HybridScheduler(cfg, make_allocator(cfg))
    sched.add_request(Request(0, 0.0, 10, 60), 0)
    _run(sched, 40)
    sliding, full = sched.allocator.block_tables(sched.running[0].seq_id)
    computed = sched.running[0].num_computed_tokens
    assert computed == 10 + 39
    assert len(full) == -(-computed // 4) and 0 not in full       # full attention keeps all
    assert len(sliding) == len(full) and sliding[:8] == [0] * 8   # released positions: null
    assert sum(1 for b in sliding if b) <= -(-(8 - 1 + 1) // 4) + 1
    # the released blocks went back to the pool: both groups draw from it
    used = sched.allocator.num_used_blocks
    assert used == sum(1 for b in sliding if b) + len(full)


def test_skipped_decodes_decide_exactly_as_telling_every_decode(monkeypatch):
    """A decode ``decode_changes_state`` rules out is not told to the allocator: the steps, the
    preemptions and every block table are as if every decode had called allocate_slots."""
    def replay(skip: bool):
        cfg = _cfg("sliding:6,mamba,full", num_blocks=60, block_size=4)
        alloc = make_allocator(cfg)
        if not skip:
            monkeypatch.setattr(alloc, "decode_changes_state", lambda *a: True)
        sched = HybridScheduler(cfg, alloc)
        for i in range(12):
            sched.add_request(Request(i, 0.0, 9 + 5 * (i % 4), 30 + 7 * (i % 3)), 0)
        steps = _run(sched, 150)
        tables = {s.req.request_id: alloc.block_tables(s.seq_id) for s in sched.running}
        return steps, sched.num_preemptions, tables

    skipped, told = replay(True), replay(False)
    assert skipped[1] > 0                  # the pool is small enough to preempt
    assert skipped == told


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("groups", ["sliding:6,mamba,full", "sliding:9,full", "mamba_ckpt,full"])
def test_skipped_calls_decide_and_account_exactly_as_making_every_call(groups, asynchronous,
                                                                      monkeypatch):
    """A decode that changes nothing skips allocate_slots and (async) a processed output that
    caches nothing skips cache_blocks: the steps, every request, and the pool's memory breakdown
    over time (token states against the blocks' unfilled tails) are as if every call had been
    made."""
    from kvsim.allocator.grouped import GroupedPagedAllocator
    from kvsim.simulator import FixedStepCost, simulate

    cfg = _cfg(groups, num_blocks=70, block_size=4, async_scheduling=asynchronous)
    requests = [Request(i, 0.3 * i, 9 + 5 * (i % 4), 30 + 7 * (i % 3)) for i in range(16)]
    calls = []
    real = GroupedPagedAllocator.allocate_slots

    def counted(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    def run():
        calls.clear()
        steps = simulate(requests, cfg, FixedStepCost(1.0), record_steps=True)
        samples = simulate(requests, cfg, FixedStepCost(0.25), sample_interval_s=0.25)
        return (steps.requests.to_csv(), steps.timeseries.to_csv(), samples.timeseries.to_csv(),
                len(calls), steps.summary["num_preemptions"])

    monkeypatch.setattr(GroupedPagedAllocator, "allocate_slots", counted)
    skipped = run()
    monkeypatch.setattr(GroupedPagedAllocator, "decode_changes_state", lambda *a, **k: True)
    monkeypatch.setattr(GroupedPagedAllocator, "caches_more", lambda *a, **k: True)
    told = run()
    assert skipped[:3] == told[:3]
    assert skipped[3] < told[3]            # calls were skipped
    assert skipped[4] > 0                  # the pool is small enough to preempt


def test_mamba_align_mode_cuts_prefill_chunks_at_block_boundaries():
    cfg = _cfg("mamba,full", block_size=16, max_num_batched_tokens=40)
    sched = HybridScheduler(cfg, make_allocator(cfg))
    sched.add_request(Request(0, 0.0, 100, 3), 0)
    steps = _run(sched, 4)
    # budget 40: chunks end on 16-token boundaries (32, then 64), then the prompt's last
    # cacheable boundary 96 (its state is cached), then the tail
    assert [n for ((_, n),) in steps] == [32, 32, 32, 4]
    cfg = _cfg("mamba,full", block_size=16, max_num_batched_tokens=40,
               enable_prefix_caching=False)
    sched = HybridScheduler(cfg, make_allocator(cfg))
    sched.add_request(Request(0, 0.0, 100, 3), 0)
    assert [n for ((_, n),) in _run(sched, 3)] == [40, 40, 20]   # "none" mode: no cut


def test_replay_reports_each_group_and_the_snapshot_maps_blocks_to_groups():
    cfg = _cfg("sliding:8,full", num_blocks=120, max_num_seqs=16)
    reqs = [Request(i, 0.1 * i, 20 + (7 * i) % 50, 10 + (5 * i) % 40) for i in range(40)]
    sim = Simulation(reqs, cfg, FixedStepCost(0.01), snapshot_times_s=[1.0])
    res = sim.run()
    s = res.summary
    assert list(s).index("kv_cache_groups") == list(s).index("memory_breakdown") + 1
    groups = s["kv_cache_groups"]
    assert [g["name"] for g in groups] == ["sliding:8", "full"]
    # a window of 8 holds far less than full attention
    assert groups[0]["token_states"] < groups[1]["token_states"]
    assert groups[0]["max_blocks"] < groups[1]["max_blocks"]
    assert s["config"]["engine"]["kv_cache_groups"] == "sliding:8,full"
    snap = res.snapshots[0][-1]
    assert snap.group_names == ("sliding:8", "full")
    held = snap.block_group[snap.block_group >= 0]
    assert set(held.tolist()) <= {0, 1}
    # the per-group split plus free and null slots is the pool, at any moment
    alloc = sim.replicas[0].allocator
    bd = alloc.group_breakdown()
    total = sum(sum(g.values()) for g in bd)
    free = alloc.breakdown()["free"]
    assert total + free + cfg.block_size == cfg.num_blocks * cfg.block_size


def test_full_attention_summary_has_no_group_key():
    cfg = EngineConfig(num_blocks=100, block_size=4, null_block=True)
    res = simulate([Request(0, 0.0, 10, 5)], cfg, FixedStepCost(0.01))
    assert "kv_cache_groups" not in res.summary
    assert "kv_cache_groups" not in res.summary["config"]["engine"]


def test_a_hybrid_preset_brings_its_groups_and_vllm_block_size():
    setup = build_engine(model="gpt-oss-120b", gpu="h200", max_model_len=32768)
    assert format_kv_groups(setup.config.kv_cache_groups) == "sliding:128,full"
    assert setup.capacity.kv_groups[0]["num_layers"] == 18
    flat = build_engine(model="gpt-oss-120b", gpu="h200", max_model_len=32768,
                        disable_hybrid_kv_cache_manager=True)
    assert flat.config.kv_cache_groups == ()
    # one full-attention group of 36 layers: half the blocks of two groups of 18
    assert flat.capacity.num_gpu_blocks * 2 == pytest.approx(setup.capacity.num_gpu_blocks, abs=1)
    mla = build_engine(model="DeepSeek-V3", gpu="h200", tensor_parallel_size=8,
                       max_model_len=32768)
    assert mla.config.kv_cache_groups == () and mla.config.block_size == 64
    nemotron = build_engine(model="Nemotron-H-8B", gpu="h100", max_model_len=8192)
    assert nemotron.config.block_size == 1040 and len(nemotron.config.kv_cache_groups) == 7
    with pytest.raises(InputError, match="pool given in blocks"):
        build_engine(model="gpt-oss-120b", gpu="h200", kv_cache_groups="sliding:128,full")


def test_groups_take_vllms_default_scheduling_mode():
    # vLLM on a GPU runs AsyncScheduler for a hybrid model too (simulator/modes.py)
    hybrid = build_engine(model="gpt-oss-120b", gpu="h200", max_model_len=32768)
    flat = build_engine(model="gpt-oss-120b", gpu="h200", max_model_len=32768,
                        disable_hybrid_kv_cache_manager=True)
    assert hybrid.config.is_grouped and hybrid.config.async_scheduling and flat.config.async_scheduling
    sync = build_engine(model="gpt-oss-120b", gpu="h200", max_model_len=32768, async_scheduling=False)
    assert "async_scheduling" not in sync.config.as_dict()
    # the step clock stays synchronous (the caller chooses), as without groups
    assert not build_engine(num_gpu_blocks=500, kv_cache_groups="sliding:128,full",
                            step_s=1.0).config.async_scheduling
    with pytest.raises(InputError, match="v0 policy \\+ grouped KV manager: not a vLLM mode"):
        build_engine(model="gpt-oss-120b", gpu="h200", max_model_len=32768, scheduler="v0")


def test_a_mamba_hybrids_block_size_need_not_be_a_power_of_two(capsys):
    # vLLM aligns a Mamba hybrid's attention blocks to its state (Nemotron-H: 1040 tokens)
    from kvsim.cli import main
    argv = ["replay", "random:n=6,isl=300,osl=20,seed=1", "--num-blocks", "60", "--quiet",
            "--kv-groups", "mamba_ckpt,full", "--step-clock"]
    assert main([*argv, "--block-size", "1040"]) == 0
    assert main(["replay", "random:n=6,isl=300,osl=20,seed=1", "--num-blocks", "60",
                 "--block-size", "1040", "--quiet"]) == 2
    assert "power of two" in capsys.readouterr().err


def test_weight_dtype_reprices_the_weights():
    fp8 = build_engine(model="DeepSeek-V3", gpu="h200", tensor_parallel_size=8,
                       max_model_len=32768).capacity
    assert fp8.weight_bytes / 2**30 == pytest.approx(78.37, abs=0.01)
    with pytest.raises(InputError, match="156.2. GiB per GPU at tp=8"):
        build_engine(model="DeepSeek-V3", gpu="h200", tensor_parallel_size=8,
                     max_model_len=32768, weight_dtype="bf16")
    int4 = build_engine(model="Llama-3.1-70B", gpu="h100", weight_dtype="int4",
                        max_model_len=8192).capacity
    assert int4.weight_bytes < 0.3 * 70.55e9 * 2


def test_parallel_sampling_with_groups_is_an_input_error():
    cfg = _cfg("sliding:8,full")
    sched = HybridScheduler(cfg, make_allocator(cfg))
    with pytest.raises(InputError, match="parallel sampling"):
        sched.add_request(Request(0, 0.0, 10, 5, n=2), 0)


def test_cli_bad_kv_groups_is_one_line(capsys, tmp_path):
    rc = cli.main(["replay", "sharegpt:n=3", "--num-blocks", "100", "--kv-groups",
                   "full,slidng:8", "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "entry 2" in err and len(err.splitlines()) == 1


def test_validate_runs_the_windowed_kernel_on_a_simulated_sliding_pool(capsys, tmp_path):
    """`kvsim validate --kv-groups`: the sliding group's tables, NULL below the window, through
    the unified kernel with the window, against dense attention with the window mask."""
    import json
    import os
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        import sys
        if "kvsim.kernels.attention" in sys.modules:
            pytest.skip("kernels already imported without the Triton interpreter")
    out = tmp_path / "v.json"
    rc = cli.main(["validate", "sharegpt:rate=2,n=30,seed=0", "--at", "25", "--num-blocks", "500",
                   "--kv-groups", "sliding:40,full", "--device", "cpu", "--max-seqs", "3",
                   "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "PASS" in text and "sliding window 40" in text
    report = json.loads(out.read_text())
    assert report["sliding_window"] == 40 and report["passed"]
    assert any(c["num_tokens"] > 40 + 16 for c in report["checks"])   # windows did slide
    rc = cli.main(["validate", "sharegpt:rate=2,n=30,seed=0", "--at", "25", "--num-blocks", "500",
                   "--kv-groups", "mamba,full", "--group", "0", "--device", "cpu"])
    assert rc == 2 and "holds states" in capsys.readouterr().err


def test_a_hybrid_model_on_a_pool_given_in_blocks_keeps_its_groups():
    setup = build_engine(model="Gemma-3-27B", num_gpu_blocks=3000, step_s=0.01)
    assert len(setup.config.kv_cache_groups) == 7 and setup.capacity is None
    mla = build_engine(model="DeepSeek-V3", num_gpu_blocks=300, tensor_parallel_size=8,
                       step_s=0.01)
    assert mla.config.kv_cache_groups == () and mla.config.block_size == 64
    explicit = build_engine(model="gpt-oss-120b", num_gpu_blocks=500, step_s=0.01,
                            kv_cache_groups="sliding:64,full")
    assert format_kv_groups(explicit.config.kv_cache_groups) == "sliding:64,full"
