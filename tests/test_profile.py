"""kernels.profile: the grid stays within the engine limits and the pool, its totals are the
simulator's StepBatch fields of the steps it runs, and a measured table reads back as a cost model."""
import numpy as np
import torch

from kvsim.kernels.decoder import DecoderShape
from kvsim.kernels.executor import StepExecutor, cudagraph_capture_sizes
from kvsim.kernels.profile import COLUMNS, GridPoint, context_grid, default_grid, point_step, profile_grid, provenance, write_table
from kvsim.simulator.cost import StepBatch
from kvsim.simulator.cost_table import SHAPE_COLUMNS, StepShapeCost


def test_default_grid_respects_limits_and_pool():
    limits = dict(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=16384, num_blocks=30000,
                  block_size=16)
    grid = default_grid(cudagraph_capture_sizes(256), **limits)
    assert len(grid) == len(set(grid)) > 150
    for pt in grid:
        ctx, new = pt.sequences()
        assert len(ctx) <= 256 and sum(new) <= 8192 and max(ctx) <= 16384
        assert pt.num_blocks(16) <= 30000
    decode_sizes = sorted({pt.num_decode_seqs for pt in grid if pt.kind == "decode"})
    assert decode_sizes == cudagraph_capture_sizes(256)
    assert any(pt.long_context_tokens for pt in grid) and any(pt.prefix_tokens == 8192 for pt in grid)
    small = default_grid(cudagraph_capture_sizes(8), max_num_seqs=8, max_num_batched_tokens=512,
                         max_model_len=1024, num_blocks=100, block_size=16)
    assert all(pt.num_blocks(16) <= 100 and pt.num_decode_seqs + pt.num_prefill_seqs <= 8 for pt in small)


def test_context_grid_measures_a_floor_at_every_bucket_within_the_pool():
    limits = dict(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=65536, block_size=16)
    grid = context_grid(num_blocks=1 << 20, **limits)
    skewed = [pt for pt in grid if pt.kind == "decode"]
    # one long sequence among short ones, at every power-of-two bucket up to max_model_len
    assert {pt.long_context_tokens for pt in skewed} == {2048, 4096, 8192, 16384, 32768, 65536}
    for pt in skewed:
        ctx, _ = pt.sequences()
        assert max(ctx) == pt.long_context_tokens and ctx.count(max(ctx)) == 1 or len(ctx) == 1
    mixed = [pt for pt in grid if pt.kind == "mixed"]
    assert {pt.prefix_tokens for pt in mixed if not pt.num_decode_seqs} == {16384, 32768}
    # long decodes beside a chunk: the longest context is a decode's
    assert {max(pt.sequences()[0]) for pt in mixed if pt.num_decode_seqs} == {16384, 32768, 65536}
    small = context_grid(num_blocks=3000, **limits)
    assert small and all(pt.num_blocks(16) <= 3000 for pt in small) and len(small) < len(grid)


def test_totals_are_the_steps_batch_fields():
    shape = DecoderShape("llama", 1, 32, 2, 1, 16, 32, 50)
    ex = StepExecutor(shape, num_blocks=300, block_size=16, max_num_seqs=64, max_num_batched_tokens=4096,
                      max_model_len=4096, dtype=torch.float32, device="cpu")
    rng = np.random.default_rng(0)
    for pt in (GridPoint(num_decode_seqs=5, decode_context_tokens=300, long_context_tokens=900),
               GridPoint(num_decode_seqs=3, decode_context_tokens=100, num_prefill_seqs=2, prefill_tokens=40,
                         prefix_tokens=64)):
        step = point_step(pt, ex, rng)
        tot = pt.totals()
        q = step.query_lens
        assert tot["num_scheduled_tokens"] == step.num_tokens and tot["num_seqs"] == step.num_seqs
        assert tot["kv_read_tokens"] == step.seq_lens.sum()
        assert tot["attn_token_pairs"] == (q * step.seq_lens).sum()
        assert tot["max_context_tokens"] == step.seq_lens.max()
        used = np.concatenate([row[:-(-n // 16)] for row, n in zip(step.block_tables, step.seq_lens)])
        assert len(set(used.tolist())) == len(used)     # fresh, distinct blocks


def test_profiled_table_reads_back(tmp_path):
    shape = DecoderShape("qwen2", 1, 32, 2, 1, 16, 32, 50, qkv_bias=True, name="tiny")
    ex = StepExecutor(shape, num_blocks=64, block_size=16, max_num_seqs=4, max_num_batched_tokens=64,
                      max_model_len=256, dtype=torch.float32, device="cpu")
    points = [GridPoint(num_decode_seqs=2, decode_context_tokens=40), GridPoint(num_prefill_seqs=1, prefill_tokens=20),
              GridPoint(num_decode_seqs=1, decode_context_tokens=9, num_prefill_seqs=1, prefill_tokens=30)]
    seen = []
    rows = profile_grid(ex, points, repeat=2, progress=lambda i, n, row: seen.append((i, n)))
    assert seen == [(1, 3), (2, 3), (3, 3)]
    assert [r["kind"] for r in rows] == ["decode", "mixed", "mixed"]
    assert all(r["step_s_min"] <= r["step_s"] <= r["step_s_max"] and r["repeats"] == 2 for r in rows)
    path = tmp_path / "t.csv"
    write_table(path, rows, provenance(ex, "kvsim profile --test", 2))
    assert set(SHAPE_COLUMNS) <= set(COLUMNS)
    model = StepShapeCost(path)
    assert model.provenance["model"] == "tiny" and "torch" in model.provenance["versions"]
    assert model.graph_sizes == []    # no CUDA graphs on the CPU: every row prices eagerly
    assert model.step_time_s(StepBatch(1, 20, 0, 20, 20, 400)) > 0


TINY_CONFIG = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64}


def run_profile(argv, capsys):
    from kvsim.cli.profile import main
    code = main(argv)
    return code, capsys.readouterr()


def test_profile_command_writes_a_table_the_simulator_reads(tmp_path, capsys):
    import json
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_CONFIG))
    out = tmp_path / "table.csv"
    code, io = run_profile(["--hf-config", str(cfg), "--out", str(out), "--device", "cpu", "--max-num-seqs", "2",
                            "--max-num-batched-tokens", "32", "--max-model-len", "128", "--repeat", "1",
                            "--quiet"], capsys)
    assert code == 0, io.err
    model = StepShapeCost(out)
    assert model.provenance["command"].startswith("kvsim profile --hf-config")
    assert '"family": "llama"' in model.provenance["shape"]
    assert model.step_time_s(StepBatch(2, 0, 2, 2, 100, 100)) > 0


def test_profile_command_rejects_bad_input_in_one_line(tmp_path, capsys):
    import json
    moe = tmp_path / "moe.json"
    moe.write_text(json.dumps({**TINY_CONFIG, "model_type": "qwen2", "num_experts": 8}))
    broken = tmp_path / "broken.json"
    broken.write_text("{\"model_type\": ")
    out = str(tmp_path / "t.csv")
    for argv, where in [(["--model", "OPT-13B", "--out", out], "OPT-13B is not one"),
                        (["--model", "Nope-1B", "--out", out], "Nope-1B"),
                        (["--hf-config", str(moe), "--out", out], "field 'num_experts'"),
                        (["--hf-config", str(broken), "--out", out], f"{broken}:1: invalid JSON"),
                        (["--out", str(tmp_path / "missing" / "t.csv")], "does not exist"),
                        (["--out", str(tmp_path)], "is a directory")]:
        code, io = run_profile(argv + ["--device", "cpu"], capsys)
        assert code == 2
        lines = io.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvsim: error:") and where in lines[0], io.err
