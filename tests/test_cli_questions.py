"""Questions that should take one command: what prefix caching saves, how many requests of a trace
fit, is the run overloaded, and which model a config.json is."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from kvsim import workloads
from kvsim.cli import main
from kvsim.cli.options import hf_config_source
from kvsim.simulator.overload import overload_reasons, overload_warning

CONV = "sharegpt:rate=1,system=512,turns=uniform(1,6),think_s=30,n=150,seed=1"
TINY_LLAMA = {"_name_or_path": "acme/tiny-llama", "architectures": ["LlamaForCausalLM"],
              "hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 16,
              "num_hidden_layers": 8, "num_key_value_heads": 4, "vocab_size": 32000,
              "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


def test_compare_prefix_caching_on_and_off(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["compare", CONV, "--allocators", "paged,max", "--prefix-caching", "on,off",
                 "--num-blocks", "1200", "--step-s", "0.01", "--json", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    header = text.splitlines()[0].split()
    assert header == ["paged", "(prefix", "on)", "paged", "(prefix", "off)", "max"]
    data = json.loads(out.read_text())
    on, off = data["paged (prefix on)"], data["paged (prefix off)"]
    assert on["config"]["engine"]["enable_prefix_caching"] and not off["config"]["engine"]["enable_prefix_caching"]
    saved = off["computed_prompt_tokens"] - on["computed_prompt_tokens"]
    assert saved > 0 and off["prefix_hit_rate"] == 0 < on["prefix_hit_rate"]
    line = next(l for l in text.splitlines() if l.startswith("prefix caching saves"))
    assert f"saves {saved:,} of {off['computed_prompt_tokens']:,} prompt tokens" in line
    # shares of the pool as percentages
    row = next(l for l in text.splitlines() if l.startswith("token states"))
    assert row.count("%") == 3
    for bad in (["--prefix-caching", "maybe"], ["--prefix-caching", "on", "--allocators", "max"],
                ["--prefix-caching", "on,off", "--no-prefix-caching"]):
        assert main(["compare", CONV, "--num-blocks", "1200", *bad, "--quiet"]) == 2
        assert capsys.readouterr().err.count("\n") == 1


def test_workload_explains_shareable_against_prefix_reuse(capsys):
    assert main(["workload", CONV]) == 0
    out = capsys.readouterr().out
    assert "shareable: tokens the source marks" in out and "prefix reuse: the prompt tokens" in out
    assert "--prefix-caching on,off" in out


def test_capacity_of_a_trace_leads_with_its_own_lengths(capsys):
    spec = "sharegpt:rate=2,n=200,seed=0"
    assert main(["capacity", "--model", "Llama-3.1-8B", "--gpu", "h100", spec, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    lengths = np.array([r.prompt_tokens + r.output_tokens for r in workloads.load(spec)])
    blocks = data["capacity"]["num_gpu_blocks"]
    at = data["trace_concurrency"]
    assert at["num_requests"] == 200
    for name, value in (("mean", lengths.mean()), ("p50", np.percentile(lengths, 50)),
                        ("p99", np.percentile(lengths, 99))):
        tokens = math.ceil(value)
        assert at[name]["tokens"] == tokens
        assert at[name]["concurrency"] == pytest.approx(blocks / math.ceil(tokens / 16), rel=1e-6)
    assert at["mean"]["concurrency"] > at["p99"]["concurrency"] > data["capacity"]["max_concurrency"]
    assert main(["capacity", "--model", "Llama-3.1-8B", "--gpu", "h100", spec]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{spec}: how many of its 200 requests fit in the KV cache at once")
    assert lines[2].startswith("  at the mean length") and lines[3].startswith("  at the p50")
    assert any(line.startswith("Maximum concurrency for 131,072 tokens") for line in lines)


def test_an_overloaded_run_is_flagged_and_a_light_one_is_not(tmp_path, capsys):
    heavy = ["replay", "sharegpt:rate=50,n=400,seed=0", "--num-blocks", "200", "--step-s", "0.02",
             "--timeseries", str(tmp_path / "h.csv"), "--out", str(tmp_path / "h.json"), "--quiet"]
    assert main(heavy) == 0
    err = capsys.readouterr().err
    assert "overloaded: p50 TTFT" in err and "the waiting queue grows through the run" in err
    summary = json.loads((tmp_path / "h.json").read_text())
    ts = pd.read_csv(tmp_path / "h.csv")
    assert len(overload_reasons(summary, ts)) == 2
    light = ["replay", "sharegpt:rate=0.5,n=40,seed=0", "--num-blocks", "2000", "--step-s", "0.02",
             "--timeseries", str(tmp_path / "l.csv"), "--out", str(tmp_path / "l.json"), "--quiet"]
    assert main(light) == 0
    assert "overloaded" not in capsys.readouterr().err
    assert overload_warning(json.loads((tmp_path / "l.json").read_text()),
                            pd.read_csv(tmp_path / "l.csv")) is None
    # compare marks the overloaded columns; plan has a column
    assert main(["compare", "sharegpt:rate=50,n=200,seed=0", "--allocators", "paged,max",
                 "--num-blocks", "400", "--max-model-len", "2048", "--step-s", "0.02", "--quiet"]) == 0
    row = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("overloaded"))
    assert row.split()[1:] == ["yes", "yes"]
    assert main(["plan", "sharegpt:rate=50,n=300,seed=0", "--max-model-len", "4096", "--step-s", "0.05",
                 "--gpu-memory-utilization", "0.25", "--out", str(tmp_path / "p"), "--quiet"]) == 0
    assert pd.read_csv(tmp_path / "p" / "results.csv")["overloaded"].tolist() == [True]


def test_an_hf_config_is_named_by_its_model_and_read_from_a_folder(tmp_path, capsys):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    assert hf_config_source(str(folder)) == (str(folder / "config.json"), "acme/tiny-llama")
    for path in (folder, folder / "config.json"):
        assert main(["capacity", "--hf-config", str(path)]) == 0
        assert capsys.readouterr().out.startswith("model acme/tiny-llama on 1 x")
    del TINY_LLAMA["_name_or_path"]
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    assert hf_config_source(str(folder))[1] == "LlamaForCausalLM"
    assert main(["plan", "sharegpt:rate=2,n=20,seed=0", "--hf-config", str(folder), "--quiet",
                 "--max-model-len", "4096", "--out", str(tmp_path / "p")]) == 0
    capsys.readouterr()
    assert pd.read_csv(tmp_path / "p" / "results.csv")["model_name"].tolist() == ["LlamaForCausalLM"]
    (tmp_path / "empty").mkdir()
    assert main(["capacity", "--hf-config", str(tmp_path / "empty")]) == 2   # a folder without one
    assert "config.json" in capsys.readouterr().err
