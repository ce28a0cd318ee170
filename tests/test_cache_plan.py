"""Cache sizing from curves (planner.cache_plan, planner.tiers) and the curve figure."""
import math

import numpy as np
import pytest

from kvsim.allocator.block_stream import block_stream
from kvsim.allocator.cache_curve import lru_curve
from kvsim.errors import InputError
from kvsim.planner.cache_plan import curve_table, plan_cache
from kvsim.planner.tiers import GIB, TierSpec, build_tiers, host_link_gbps
from kvsim.viz.cache_curve import cache_curve_figure
from kvsim.workloads import Request


def _conversations(n=60, seed=1):
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        if reqs and rng.random() < 0.6:
            base = reqs[int(rng.integers(len(reqs)))]
            segments = base.segments + ((base.output_segment(), base.output_tokens),)
        else:
            segments = ((0, 200),)
        segments += ((1000 + i, int(rng.integers(10, 300))),)
        prompt, output = sum(k for _, k in segments), int(rng.integers(5, 100))
        reqs.append(Request(i, float(i), prompt, output, segments=segments,
                            num_shareable_tokens=prompt + output))
    return reqs


def test_curve_table_rows_and_min_points():
    reqs = _conversations()
    stream = block_stream(reqs, 16)
    curve = lru_curve(stream)
    table = curve_table(stream, curve, bytes_per_block=2 << 20, num_min_sizes=12,
                        extra_sizes=[77])
    assert table["cache_blocks"].is_monotonic_increasing and 77 in set(table["cache_blocks"])
    assert np.allclose(table["cache_gib"], table["cache_blocks"] * 2 / 1024)
    assert (np.diff(table["lru_hit_rate"]) >= 0).all()
    opt = table.dropna(subset=["min_hit_rate"])
    assert 10 <= len(opt) <= 13 and 77 in set(opt["cache_blocks"])
    assert (opt["min_hit_rate"] >= opt["lru_hit_rate"] - 1e-12).all()
    assert table["lru_hit_rate"].iloc[-1] == pytest.approx(
        curve.hit_rate(curve.max_useful_blocks))


def test_plan_says_when_the_gpu_suffices_and_how_much_cpu_otherwise():
    reqs = _conversations()
    gpu = lru_curve(block_stream(reqs, 16))
    cpu = lru_curve(block_stream(reqs, 16, prompt_only=True), free_queue=False)
    best = float(gpu.hit_rate(gpu.max_useful_blocks))
    small = plan_cache(gpu, cpu, best * 0.2, gpu_blocks=gpu.max_useful_blocks, chunk_bytes=1 << 20)
    assert small.cpu_chunks == 0 and "GPU pool alone" in small.describe()
    target = float(cpu.hit_rate(cpu.max_useful_blocks)) * 0.9
    plan = plan_cache(gpu, cpu, target, gpu_blocks=4, chunk_bytes=1 << 20,
                      min_stream=block_stream(reqs, 16))
    assert plan.cpu_chunks == cpu.smallest_size_for(target) > 0
    assert plan.cpu_offload_gib == math.ceil(plan.cpu_chunks / 1024 * 100) / 100
    assert "--cpu-offload-gib" in plan.describe()
    assert plan.min_needed_blocks <= plan.needed_blocks          # MIN needs no more than LRU
    none = plan_cache(gpu, cpu, 0.999, gpu_blocks=4, chunk_bytes=1 << 20)
    assert not none.reachable and "no cache reaches" in none.describe()


def test_tier_sizes_follow_vllm_and_bad_flags_are_one_line_errors():
    tier = TierSpec("cpu", 64, 63.0)
    assert tier.chunk_bytes(2 << 20) == 2 << 20 and tier.num_chunks(2 << 20) == 64 * 512
    assert tier.chunk_bytes(1000, tp=2) == 4096          # page-aligned, over both ranks
    assert host_link_gbps("H100-80GB-SXM") == 63.0 and host_link_gbps("custom") is None
    tiers = build_tiers(gpu_name="H100-80GB-SXM", bytes_per_block=2 << 20, cpu_offload_gib=64,
                        disk_offload_gib=1024, disk_bandwidth_gbps=5, disk_latency_ms=0.1)
    assert [t.name for t in tiers] == ["cpu", "disk"] and tiers[1].latency_s == 1e-4
    assert build_tiers(gpu_name="L4", bytes_per_block=1) == ()
    bad = [dict(cpu_offload_gib=-1), dict(cpu_offload_gib=float("nan")),
           dict(cpu_offload_gib=64, offload_bandwidth_gbps=0),
           dict(cpu_offload_gib=0.001),                       # less than one 2 MiB chunk
           dict(cpu_offload_gib=1 << 20),                     # 2**29 chunks: no memory for it
           dict(disk_offload_gib=10, disk_bandwidth_gbps=5),  # disk without a CPU tier
           dict(cpu_offload_gib=8, disk_offload_gib=10),      # disk without its bandwidth
           dict(cpu_offload_gib=8, disk_latency_ms=2),
           dict(cpu_offload_gib=8, disk_offload_gib=10, disk_bandwidth_gbps=1,
                disk_latency_ms=-1)]
    for flags in bad:
        with pytest.raises(InputError) as err:
            build_tiers(gpu_name="H100-80GB-SXM", bytes_per_block=2 << 20,
                        memory_limit_bytes=8 * GIB, **flags)
        assert "\n" not in str(err.value) and err.value.field.startswith("--"), flags
    with pytest.raises(InputError, match="--offload-bandwidth-gbps"):
        build_tiers(gpu_name="my-gpu", bytes_per_block=2 << 20, cpu_offload_gib=8)


def test_curve_figure_marks_sizes_and_draws_min_points():
    reqs = _conversations(30)
    stream = block_stream(reqs, 16)
    table = curve_table(stream, lru_curve(stream), bytes_per_block=2 << 20, num_min_sizes=8)
    fig = cache_curve_figure(table, x="cache_gib", marks={"GPU pool": 0.05, "GPU + CPU": 0.2})
    assert [t.name for t in fig.data] == ["LRU", "MIN (offline optimum)"]
    assert len(fig.data[1].x) == table["min_hit_rate"].notna().sum()
    assert [s.x0 for s in fig.layout.shapes] == [0.05, 0.2]
    assert fig.layout.xaxis.type == "log"
    assert cache_curve_figure(table.drop(columns="min_hit_rate"), x="cache_blocks").data[0].name \
        == "LRU"
    # issue 29 item 6: a log axis takes an annotation's x as log10 of the value; given the value,
    # the labels sat at 1e-1.3 and 1e-0.7... of a 1e56-1e64 axis
    assert [a.x for a in fig.layout.annotations] == pytest.approx([math.log10(0.05), math.log10(0.2)])


def test_curve_figure_draws_the_cpu_tier_curve_it_was_given():
    reqs = _conversations(30)
    stream = block_stream(reqs, 16)
    table = curve_table(stream, lru_curve(stream), bytes_per_block=2 << 20, num_min_sizes=0)
    cpu = lru_curve(block_stream(reqs, 16, prompt_only=True), free_queue=False)
    table["cpu_tier_hit_rate"] = cpu.hit_rate(table["cache_blocks"].to_numpy())
    fig = cache_curve_figure(table, x="cache_gib")
    tier = [t for t in fig.data if t.name.startswith("CPU tier")]
    assert len(tier) == 1 and list(tier[0].y) == list(table.loc[table["cache_gib"] > 0, "cpu_tier_hit_rate"])
