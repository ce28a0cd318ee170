"""The offload flags on replay / compare / plan and ``kvsim cache-curve``, through the router."""
import json

import pandas as pd
import pytest

from kvsim.cli import main

SPEC = "sharegpt:rate=4,n=80,seed=1,system=512,system_frac=0.8,turns=uniform(1,4),think_s=5"
POOL = ["--num-blocks", "400", "--max-num-seqs", "32", "--max-num-batched-tokens", "2048",
        "--quiet"]


def test_replay_with_a_cpu_tier_reports_it(tmp_path, capsys):
    out, ts = tmp_path / "r.json", tmp_path / "ts.csv"
    assert main(["replay", SPEC, *POOL, "--cpu-offload-gib", "2", "--out", str(out),
                 "--timeseries", str(ts)]) == 0
    s = json.loads(out.read_text())
    tier = s["offload"]["tiers"][0]
    # 2 GiB of Llama-3.1-8B blocks (2 MiB each), over the H100's PCIe 5.0 link
    assert (tier["name"], tier["num_chunks"], tier["bandwidth_gbps"]) == ("cpu", 1024, 63.0)
    assert s["offload"]["hit_tokens"]["cpu"] > 0
    assert s["offload"]["combined_hit_rate"] > s["prefix_hit_rate"]
    frame = pd.read_csv(ts)
    assert {"cpu_used_chunks", "cpu_hit_tokens", "cpu_loaded_bytes", "cpu_stored_bytes",
            "loading_requests"} <= set(frame.columns)
    assert frame["cpu_used_chunks"].max() <= 1024 and frame["cpu_stored_bytes"].is_monotonic_increasing
    out = capsys.readouterr().out
    assert "offload: cpu hit" in out
    # the connector's rate is over the tokens the GPU missed, and the line says so (issue 29 item 13)
    assert f"connector hit rate {s['offload']['hit_rate']:.3f} (of the prompt tokens the GPU missed)" in out
    base = tmp_path / "base.json"
    assert main(["replay", SPEC, *POOL, "--out", str(base)]) == 0
    assert "offload" not in json.loads(base.read_text())


def test_compare_runs_the_paged_column_with_the_tier(tmp_path, capsys):
    assert main(["compare", SPEC, *POOL, "--allocators", "paged,max", "--cpu-offload-gib", "2",
                 "--json", str(tmp_path / "c.json")]) == 0
    printed = capsys.readouterr().out
    assert "CPU hit tokens" in printed and "the other columns run without them" in printed
    both = json.loads((tmp_path / "c.json").read_text())
    assert "offload" in both["paged"] and "offload" not in both["max"]


def test_plan_sweeps_the_cpu_tier(tmp_path):
    assert main(["plan", SPEC, "--gpu", "h100", "--gpu-memory-utilization", "0.235",
                 "--max-model-len", "8192", "--sweep", "cpu_offload_gib=0,2", "--jobs", "1",
                 "--out", str(tmp_path / "p"), "--quiet"]) == 0
    rows = pd.read_csv(tmp_path / "p" / "results.csv")
    assert rows["cpu_offload_gib"].tolist() == [0, 2]
    assert pd.isna(rows.loc[0, "offload.hit_tokens.cpu"]) and rows.loc[1, "offload.hit_tokens.cpu"] > 0
    assert rows.loc[1, "computed_prompt_tokens"] < rows.loc[0, "computed_prompt_tokens"]


def test_cache_curve_writes_the_table_and_the_figure(tmp_path, capsys):
    csv, html = tmp_path / "c.csv", tmp_path / "c.html"
    argv = ["cache-curve", SPEC, "--block-size", "16", "--model", "Llama-3.1-8B", "--gpu", "h100",
            "--min-sizes", "10", "--csv", str(csv), "--html", str(html), "--cpu-offload-gib", "4",
            "--target-hit-rate", "0.5"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "GPU pool (Llama-3.1-8B on 1 x H100-80GB-SXM): 28,872 blocks" in printed
    assert "CPU tier (4 GiB, 2,048 chunks)" in printed
    assert "50.0%" in printed                      # the planner's answer for the target
    table = pd.read_csv(csv)
    assert {"cache_blocks", "cache_gib", "lru_hit_rate", "min_hit_rate",
            "cpu_tier_hit_rate"} <= set(table.columns)
    assert 28872 in set(table["cache_blocks"]) and 2048 in set(table["cache_blocks"])
    assert table["lru_hit_rate"].is_monotonic_increasing
    page = html.read_text()
    assert "GPU pool (Llama-3.1-8B" in page and "MIN (offline optimum)" in page
    # the same workload gives the same bytes: the figure carries a fixed div id, no UUID
    assert 'id="kvsim-cache-curve"' in page
    again = [tmp_path / "again.csv", tmp_path / "again.html"]
    assert main([a.replace(str(csv), str(again[0])).replace(str(html), str(again[1])) for a in argv]) == 0
    assert again[0].read_bytes() == csv.read_bytes() and again[1].read_bytes() == html.read_bytes()


@pytest.mark.shared
def test_cache_curve_of_the_mooncake_trace_marks_an_h100(shared_traces, capsys):
    trace = shared_traces / "mooncake" / "conversation_trace.jsonl"
    assert main(["cache-curve", str(trace), "--block-size", "16", "--min-sizes", "0"]) == 0
    printed = capsys.readouterr().out
    assert "12,031 requests" in printed and "LRU hit rate 0.0448" in printed


def test_a_cpu_tier_counts_in_the_memory_check_before_the_run(tmp_path, monkeypatch, capsys):
    """The tier's bookkeeping joins the pool's and the requests' (simulator.footprint): with
    memory for 2 GiB of chunks alone, the pool and the tier together are refused, in one line."""
    import kvsim.simulator as simulator
    from kvsim.simulator import footprint

    limit = 1024 * footprint.BYTES_PER_TIER_CHUNK     # 2 GiB of Llama-3.1-8B: 1,024 chunks
    monkeypatch.setattr(footprint, "available_memory_bytes", lambda: limit)
    out = tmp_path / "r.json"
    assert main(["replay", SPEC, *POOL, "--out", str(out)]) == 0      # without the tier it fits
    capsys.readouterr()
    monkeypatch.setattr(simulator, "simulate", lambda *a, **k: pytest.fail("the run started"))
    assert main(["replay", SPEC, *POOL, "--cpu-offload-gib", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a cpu tier of 1,024 chunks" in err and "offload tiers" in err


def test_a_model_folder_sizes_the_pool_and_the_chunks(tmp_path, capsys):
    """--hf-config FOLDER (its config.json) is the model of cache-curve's pool and CPU tier, and
    of replay's tier chunks: 2 KiB of KV a token, 32 KiB a block."""
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024,
         "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
         "vocab_size": 1000}))
    assert main(["cache-curve", SPEC, "--hf-config", str(folder), "--gpu", "l4", "--min-sizes",
                 "0", "--max-model-len", "2048", "--cpu-offload-gib", "1"]) == 0
    printed = capsys.readouterr().out
    assert "GPU pool (tiny-llama on 1 x L4)" in printed and "1 GiB, 32,768 chunks" in printed
    out = tmp_path / "r.json"
    assert main(["replay", SPEC, *POOL, "--hf-config", str(folder), "--cpu-offload-gib", "1",
                 "--offload-bandwidth-gbps", "25", "--out", str(out)]) == 0
    tier = json.loads(out.read_text())["offload"]["tiers"][0]
    assert (tier["num_chunks"], tier["bandwidth_gbps"]) == (32768, 25.0)


def test_offload_tiers_follow_vllms_async_default(tmp_path, capsys):
    # the roofline's default is async (vLLM on a GPU), with tiers too (AsyncOffloadScheduler);
    # --no-async-scheduling gives the synchronous OffloadScheduler
    out = tmp_path / "r.json"
    assert main(["replay", SPEC, *POOL, "--cpu-offload-gib", "2", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["engine"]["async_scheduling"] is True
    sync = tmp_path / "sync.json"
    assert main(["replay", SPEC, *POOL, "--cpu-offload-gib", "2", "--no-async-scheduling",
                 "--out", str(sync)]) == 0
    assert not json.loads(sync.read_text())["config"]["engine"].get("async_scheduling")
    capsys.readouterr()
    # KV-cache groups with a tier: async too (AsyncHybridOffloadScheduler), sync when asked
    for flag, want in (([], True), (["--no-async-scheduling"], None)):
        groups = tmp_path / "groups.json"
        assert main(["replay", SPEC, *POOL, "--cpu-offload-gib", "2", "--kv-groups",
                     "sliding:128,full", *flag, "--out", str(groups)]) == 0
        assert json.loads(groups.read_text())["config"]["engine"].get("async_scheduling") == want
    capsys.readouterr()
    for extra in (["--scheduler", "v0", "--max-model-len", "2048"],):
        assert main(["replay", SPEC, *POOL, "--cpu-offload-gib", "2", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        # the declared modes table refuses them (simulator/modes.py)
        assert len(err) == 1 and "--cpu-offload-gib" in err[0] and "docs/SIMULATOR.md" in err[0], err


def test_compare_with_a_tier_runs_every_column_in_one_scheduling_mode(tmp_path):
    for flag, want in (([], True), (["--no-async-scheduling"], None)):
        assert main(["compare", SPEC, *POOL, "--allocators", "paged,max", "--cpu-offload-gib",
                     "2", *flag, "--json", str(tmp_path / "c.json")]) == 0
        both = json.loads((tmp_path / "c.json").read_text())
        assert [s["config"]["engine"].get("async_scheduling") or None
                for s in both.values()] == [want, want]


def test_a_hybrid_models_cpu_chunk_is_one_groups_block(tmp_path):
    # vLLM's CPU slot is the worker's KV bytes per block: with KV-cache groups one group's
    # block (gpt-oss-20b: 12 sliding-window and 12 full-attention layers, half the model's
    # block), for a dense model the whole block
    from kvsim.planner.presets import get_model
    from kvsim.planner.tiers import block_bytes

    for model, groups in (("gpt-oss-20b", 2), ("Llama-3.1-8B", 1)):
        out = tmp_path / f"{model}.json"
        assert main(["replay", "random:n=6,isl=300,osl=8", "--model", model, "--gpu", "H100",
                     "--cpu-offload-gib", "1", "--quiet", "--out", str(out)]) == 0
        result = json.loads(out.read_text())
        tier = result["offload"]["tiers"][0]
        whole, _ = block_bytes(get_model(model), "auto", 1, 16)
        assert tier["chunk_bytes"] * groups == whole
        assert tier["num_chunks"] == 2**30 // tier["chunk_bytes"]
        assert bool(result["config"]["engine"].get("kv_cache_groups")) == (groups > 1)


# a CPU tier of a few chunks and a disk behind it: prefixes come back from disk (promotions)
DISK = ["--num-blocks", "200", "--max-num-seqs", "32", "--max-num-batched-tokens", "2048",
        "--max-model-len", "3000", "--cpu-offload-gib", "0.02", "--disk-offload-gib", "0.5",
        "--disk-bandwidth-gbps", "2", "--quiet"]
SPEC_150 = SPEC.replace("n=80", "n=150")


@pytest.mark.parametrize("mode", [[], ["--no-async-scheduling"]])
def test_one_full_attention_group_with_a_disk_tier_is_the_one_group_connector(mode, tmp_path):
    # the grouped connector (KV-cache groups: keys per group, lookups, promotions from disk,
    # stores written through) over one full-attention group makes the one-group connector's
    # decisions, at the same times, with the same tier totals
    runs = {}
    for name, groups in (("one", []), ("grouped", ["--kv-groups", "full"])):
        out, req = tmp_path / f"{name}.json", tmp_path / f"{name}.csv"
        assert main(["replay", SPEC_150, *DISK, *mode, *groups, "--out", str(out),
                     "--requests", str(req)]) == 0
        runs[name] = (req.read_text(), json.loads(out.read_text())["offload"])
    (one_requests, one), (grouped_requests, grouped) = runs["one"], runs["grouped"]
    assert one["hit_tokens"]["disk"] > 0            # the disk served hits
    assert grouped_requests == one_requests
    for key in ("hit_tokens", "loaded_bytes", "stored_bytes", "query_tokens", "num_loads"):
        assert grouped[key] == one[key], key


@pytest.mark.parametrize("groups", ["sliding:128,full", "mamba_ckpt,full"])
def test_groups_with_a_disk_tier_promote_and_write_through(groups, tmp_path):
    out = tmp_path / "r.json"
    assert main(["replay", SPEC_150, *DISK, "--kv-groups", groups, "--no-async-scheduling",
                 "--out", str(out)]) == 0
    offload = json.loads(out.read_text())["offload"]
    assert offload["hit_tokens"]["disk"] > 0 and offload["loaded_bytes"]["disk"] > 0
    # every CPU store is written through, unless the disk has the chunk already
    assert 0 < offload["stored_bytes"]["disk"] <= offload["stored_bytes"]["cpu"]
