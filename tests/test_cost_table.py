"""Measured cost tables (simulator.cost_table): the fitted step-shape model recovers the function a
table was made from, prices runs in closed form, and bad tables fail with file, line and column."""
import math

import pytest

from kvsim.errors import InputError
from kvsim.simulator.cost import StepBatch, TableCost, summed_run_time_s
from kvsim.simulator.cost_table import StepShapeCost, load_cost_table, read_table

HEADER = ("kind,num_seqs,num_prefill_seqs,num_prefill_tokens,num_decode_tokens,num_scheduled_tokens,"
          "kv_read_tokens,attn_token_pairs,padded_num_seqs,graph,step_s,step_s_min,step_s_max,repeats")
SIZES = [1, 2, 4, 8, 16, 24, 32]


def decode_truth(size, kv):
    return 0.004 + 2e-5 * size + (3e-9 if size > 8 else 5e-9) * kv


def eager_truth(tokens, pairs, kv, seqs):
    f = 0.005 + 2e-5 * tokens if tokens < 512 else 0.01524 + 1e-5 * (tokens - 512)
    return f + 4e-12 * pairs + 2e-9 * kv + 1e-5 * seqs


def row(kind, seqs, prefill, decode, kv, pairs, padded, graph, step_s):
    tokens = prefill + decode
    pseqs = seqs - decode
    return f"{kind},{seqs},{pseqs},{prefill},{decode},{tokens},{kv},{pairs},{padded},{graph},{step_s!r},{step_s},{step_s},3"


def make_table(tmp_path, extra_lines=(), header=HEADER):
    lines = ["# gpu: Test GPU", "# date: 2026-12-01", "# model: tiny", header]
    for s in SIZES:
        for ctx in (256, 1024, 3072):
            lines.append(row("decode", s, 0, s, s * ctx, s * ctx, s, 1, decode_truth(s, s * ctx)))
    for t in (16, 64, 256, 512, 1024, 2048):
        for prefix, n_prompts, n_dec in ((0, 1, 0), (2048, 1, 0), (0, 4, 0), (0, 1, 8)):
            new = t // n_prompts - (n_dec if n_prompts == 1 else 0)
            pairs = n_prompts * new * (prefix + new) + n_dec * 512
            kv = n_prompts * (prefix + new) + n_dec * 512
            seqs = n_prompts + n_dec
            lines.append(row("mixed", seqs, n_prompts * new, n_dec, kv, pairs, seqs, 0,
                             eager_truth(t, pairs, kv, seqs)))
    lines += list(extra_lines)
    path = tmp_path / "table.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_fit_recovers_the_table_function(tmp_path):
    model = load_cost_table(make_table(tmp_path))
    assert isinstance(model, StepShapeCost)
    assert model.provenance == {"gpu": "Test GPU", "date": "2026-12-01", "model": "tiny"}
    assert model.graph_sizes == SIZES
    # decode: exact at measured sizes; a batch between sizes is priced at the size it pads to
    assert math.isclose(model.step_time_s(StepBatch(16, 0, 16, 16, 9000, 9000)), decode_truth(16, 9000), rel_tol=1e-9)
    assert math.isclose(model.step_time_s(StepBatch(10, 0, 10, 10, 5000, 5000)), decode_truth(16, 5000), rel_tol=1e-9)
    # eager: a shape the grid did not measure (prefix 700, 3 prompts at 1024 tokens)
    pairs, kv = 3 * 341 * (700 + 341), 3 * (700 + 341)
    got = model.step_time_s(StepBatch(3, 1023, 0, 1023, kv, pairs))
    assert math.isclose(got, eager_truth(1023, pairs, kv, 3), rel_tol=2e-3)
    # decode above the largest graph runs eagerly
    big = StepBatch(40, 0, 40, 40, 40 * 100, 40 * 100)
    assert math.isclose(model.step_time_s(big), eager_truth(40, 4000, 4000, 40), rel_tol=1e-3)
    assert model.step_time_s(StepBatch()) == 0.0


@pytest.mark.parametrize("batch", [StepBatch(8, 0, 8, 8, 8 * 700, 8 * 700), StepBatch(40, 0, 40, 40, 40 * 90, 40 * 90)])
def test_run_time_is_the_sum_of_its_steps(tmp_path, batch):
    model = StepShapeCost(make_table(tmp_path))
    assert math.isclose(model.run_time_s(batch, 37), summed_run_time_s(model, batch, 37), rel_tol=1e-9)
    assert model.run_time_s(batch, 0) == 0.0


def test_old_tables_keep_table_cost(tmp_path):
    path = tmp_path / "old.csv"
    path.write_text("num_scheduled_tokens,step_s\n1,0.01\n512,0.02\n")
    assert isinstance(load_cost_table(path), TableCost)


@pytest.mark.parametrize("extra, header, where", [
    (["mixed,1,1,10,0,10,10,100,1,0,abc,1,1,3"], HEADER, (":50:", "step_s", "not a number")),
    (["decode,1,0,0,1,1,5,5,1,1,-0.1,1,1,3"], HEADER, (":50:", "step_s", "positive")),
    (["prefill,1,1,10,0,10,10,100,1,0,0.1,1,1,3"], HEADER, (":50:", "kind")),
    (["mixed,1,1"], HEADER, (":50:", "3 values")),
    ([], HEADER.replace("attn_token_pairs", "pairs"), (":4:", "attn_token_pairs", "missing column")),
    (["mixed,0,0,0,0,0,0,0,0,0,0.1,1,1,3"], HEADER, (":50:", "num_scheduled_tokens")),
])
def test_bad_tables_name_line_and_column(tmp_path, extra, header, where):
    path = make_table(tmp_path, extra, header)
    with pytest.raises(InputError) as info:
        load_cost_table(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    for part in where:
        assert part in message


def test_empty_and_header_only_tables(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("# gpu: x\n")
    with pytest.raises(InputError, match="no header"):
        read_table(path)
    path.write_text(HEADER + "\n")
    with pytest.raises(InputError, match="no data rows"):
        read_table(path)
    path.write_text(HEADER + "\n" + row("decode", 1, 0, 1, 10, 10, 1, 1, 0.01) + "\n")
    with pytest.raises(InputError, match="no mixed"):
        StepShapeCost(path)


def test_skewed_decode_rows_do_not_bend_the_decode_lines(tmp_path):
    header = HEADER.replace("attn_token_pairs,", "attn_token_pairs,max_context_tokens,")

    def with_max(line, longest):
        parts = line.split(",")
        return ",".join(parts[:8] + [str(longest)] + parts[8:])
    lines = make_table(tmp_path).read_text().splitlines()
    body = [with_max(x, int(x.split(",")[6]) // int(x.split(",")[1])) for x in lines[4:]]
    # 24 sequences: 23 at 512 tokens and one at 16384, much slower than the line of uniform batches
    skew = with_max(row("decode", 24, 0, 24, 23 * 512 + 16384, 23 * 512 + 16384, 24, 1, 0.05), 16384)
    path = tmp_path / "skew.csv"
    path.write_text("\n".join(lines[:3] + [header] + body + [skew]) + "\n")
    model = StepShapeCost(path)
    assert math.isclose(model.step_time_s(StepBatch(24, 0, 24, 24, 9000, 9000)), decode_truth(24, 9000), rel_tol=1e-9)
