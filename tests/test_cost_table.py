"""Measured cost tables (simulator.cost_table): the fitted step-shape model recovers the function a
table was made from, prices runs in closed form, and bad tables fail with file, line and column."""
import json
import math
from pathlib import Path

import pytest

from kvsim.errors import InputError
from kvsim.simulator.cost import StepBatch, TableCost, summed_run_time_s
from kvsim.simulator.cost_table import MIN_TAIL_TOKENS, StepShapeCost, _tail_tokens, load_cost_table, read_table

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


FLOOR_HEADER = HEADER.replace("attn_token_pairs,", "attn_token_pairs,max_context_tokens,")


def floor_truth(size, longest):
    """The measured floor of one long sequence among 512-token ones: bucket 4096 rises with the
    longest context; the split buckets above it are level (empty programs of every sequence)."""
    if longest <= 4096:
        return 1e-7 * size * (longest - 512) / 24
    return 2e-6 * size * (1 << (longest - 1).bit_length()) / 4096


def floor_table(tmp_path, buckets_line="# context buckets: powers of two from 4096 tokens", extra=()):
    """make_table's rows with max_context_tokens, plus rows of one long context among short ones."""
    def with_max(line, longest):
        parts = line.split(",")
        return ",".join(parts[:8] + [str(longest)] + parts[8:])
    lines = make_table(tmp_path).read_text().splitlines()
    body = [with_max(x, int(x.split(",")[6]) // int(x.split(",")[1])) for x in lines[4:]]
    skewed = []
    for size, longest in ((24, 2048), (24, 4096), (32, 2048), (32, 4096), (8, 16384), (24, 16384)):
        kv = (size - 1) * 512 + longest
        t = decode_truth(size, 0) + floor_truth(size, longest)
        skewed.append(with_max(row("decode", size, 0, size, kv, kv, size, 1, t), longest))
    path = tmp_path / "floor.csv"
    path.write_text("\n".join(lines[:3] + ([buckets_line] if buckets_line else []) + [FLOOR_HEADER] + body
                              + skewed + list(extra)) + "\n")
    return path


def test_the_longest_context_sets_a_floor_under_decode_steps(tmp_path):
    model = StepShapeCost(floor_table(tmp_path))
    assert model.uses_max_context_tokens and model.min_bucket_tokens == 4096
    a, b = model.decode_lines[SIZES.index(24)]

    def decode(size, kv, longest):
        return model.step_time_s(StepBatch(size, 0, size, size, kv, kv, longest))
    kv = 23 * 512 + 3000
    # between the bucket's rows: linear in the longest context, above the bandwidth line here
    assert math.isclose(decode(24, kv, 3000), a + floor_truth(24, 3000), rel_tol=1e-9)
    assert decode(24, kv, 3000) > decode_truth(24, kv) * 1.03
    # no longest context (a model the engine does not track it for), or one no longer than the
    # others' (equal contexts): the line of uniform batches
    assert math.isclose(decode(24, kv, 0), decode_truth(24, kv), rel_tol=1e-9)
    assert math.isclose(decode(24, 24 * 400, 400), decode_truth(24, 24 * 400), rel_tol=1e-9)
    # a split bucket is level; a size between two measured ones is interpolated in the size
    assert math.isclose(decode(24, 23 * 512 + 9000, 9000), a + floor_truth(24, 16384), rel_tol=1e-9)
    a16 = model.decode_lines[SIZES.index(16)][0]
    want16 = (floor_truth(8, 16384) + floor_truth(24, 16384)) / 2
    assert math.isclose(decode(16, 15 * 512 + 12000, 12000), a16 + want16, rel_tol=1e-9)
    # bucket 8192 has no rows: it borrows the nearest split bucket's, at its top
    assert math.isclose(decode(24, 23 * 512 + 6000, 6000), a + floor_truth(24, 16384), rel_tol=1e-9)
    # under the bandwidth line the floor does not count
    assert math.isclose(decode(24, 24 * 1000, 1000), a + b * 24 * 1000, rel_tol=1e-9)
    assert floor_truth(24, 1000) > 0
    plain = StepShapeCost(floor_table(tmp_path), context_floor=False)
    assert not plain.uses_max_context_tokens
    assert math.isclose(plain.step_time_s(StepBatch(24, 0, 24, 24, kv, kv, 3000)), decode_truth(24, kv), rel_tol=1e-9)


@pytest.mark.parametrize("size, longest, others, steps", [
    (24, 1000, 512, 5000),     # rises into the bucket's rows, crosses into the split buckets
    (24, 3900, 300, 800),      # the floor's line meets the bandwidth line inside the run
    (16, 4000, 2000, 20000),   # interpolated sizes, three buckets
    (3, 500, 100, 300),        # a size without floor rows: the line alone
])
def test_a_floored_decode_run_is_the_sum_of_its_steps(tmp_path, size, longest, others, steps):
    model = StepShapeCost(floor_table(tmp_path))
    kv = longest + (size - 1) * others
    batch = StepBatch(size, 0, size, size, kv, kv, longest)
    assert math.isclose(model.run_time_s(batch, steps), summed_run_time_s(model, batch, steps), rel_tol=1e-9)


def test_floor_rows_need_their_line_and_a_bucket_line(tmp_path):
    with pytest.raises(InputError) as info:
        StepShapeCost(floor_table(tmp_path, "# context buckets: powers of two"))
    assert "context buckets" in str(info.value) and "\n" not in str(info.value)
    # without the line, skewed rows are left out of the lines and price nothing
    assert not StepShapeCost(floor_table(tmp_path, None)).uses_max_context_tokens
    kv = 39 * 512 + 4096
    lonely = ",".join(row("decode", 40, 0, 40, kv, kv, 40, 1, 0.02).split(",")[:8] + ["4096"]
                      + row("decode", 40, 0, 40, kv, kv, 40, 1, 0.02).split(",")[8:])
    with pytest.raises(InputError) as info:
        StepShapeCost(floor_table(tmp_path, extra=[lonely]))
    assert "padded_num_seqs" in str(info.value) and ":57:" in str(info.value)


def test_a_long_context_beside_a_chunk_is_a_tail_of_eager_steps(tmp_path):
    # eager rows with their longest context: a long decode beside a chunk costs c_tail per token
    # of its context beyond what the chunk's tokens attend to; a chunk after a long prefix none
    def with_max(line, longest):
        parts = line.split(",")
        return ",".join(parts[:8] + [str(longest)] + parts[8:])
    lines = make_table(tmp_path).read_text().splitlines()
    body = []
    for x in lines[4:]:
        parts = x.split(",")
        seqs, kv, prefill, decodes = int(parts[1]), int(parts[6]), int(parts[3]), int(parts[4])
        # make_table: one prompt beside 512-token decodes, or equal prompts, or uniform decodes
        longest = max(prefill, 512) if parts[0] == "mixed" and decodes else kv // seqs
        body.append(with_max(x, longest))
    tails = []
    for t in (512, 1024, 2048):
        for ctx in (8192, 32768):
            new = t - 1
            pairs, kv = new * new + ctx, new + ctx
            truth = eager_truth(t, pairs, kv, 2) + 5e-7 * (ctx - pairs / t)
            tails.append(with_max(row("mixed", 2, new, 1, kv, pairs, 2, 0, truth), ctx))
    path = tmp_path / "tail.csv"
    path.write_text("\n".join(lines[:3] + [FLOOR_HEADER] + body + tails) + "\n")
    model = StepShapeCost(path)
    assert model.uses_max_context_tokens and math.isclose(model.c_tail, 5e-7, rel_tol=0.05)
    assert model.negligible_terms == []
    new, ctx = 1535, 20000
    pairs, kv = new * new + ctx, new + ctx
    got = model.step_time_s(StepBatch(2, new, 1, 1536, kv, pairs, ctx))
    want = eager_truth(1536, pairs, kv, 2) + 5e-7 * (ctx - pairs / 1536)
    assert math.isclose(got, want, rel_tol=0.02)
    assert got > model.step_time_s(StepBatch(2, new, 1, 1536, kv, pairs, 0)) * 1.1   # untracked: no tail
    # a chunk after a long prefix: every token attends to the prefix, no tail
    pairs = 1024 * (20000 + 1024)
    assert model.step_time_s(StepBatch(1, 1024, 0, 1024, 21024, pairs, 21024)) == \
        model.step_time_s(StepBatch(1, 1024, 0, 1024, 21024, pairs, 0))
    # the tables without longest contexts keep the three terms
    assert StepShapeCost(make_table(tmp_path)).c_tail == 0.0


def test_tails_of_a_few_tokens_fit_no_tail_term(tmp_path):
    # real vLLM's grids: the longest context is a decode a token past its prompt, so tails are a few
    # tokens; they cannot tell a tail's cost per token, and one odd row would set it (Llama-3.1-70B
    # fp8 on the H200: 0.78 ms a token from one 50-token tail, a 4k-token tail priced at 3 s)
    lines = make_table(tmp_path).read_text().splitlines()
    body = [",".join(x.split(",")[:8] + ["0"] + x.split(",")[8:]) for x in lines[4:]]
    tails = []
    for t in (512, 1024, 2048, 4096):
        for prompt in (t - 1, t - 8):
            ctx = prompt + 1
            pairs, kv = prompt * prompt + (t - prompt) * ctx, prompt + (t - prompt) * ctx
            parts = row("mixed", 1 + t - prompt, prompt, t - prompt, kv, pairs, 2, 0,
                        eager_truth(t, pairs, kv, 1 + t - prompt)).split(",")
            tails.append(",".join(parts[:8] + [str(ctx)] + parts[8:]))
    odd = row("mixed", 2, 512, 64, 576, 512 * 512 + 64 * 64, 2, 0, eager_truth(576, 266240, 576, 2) + 0.04)
    tails.append(",".join(odd.split(",")[:8] + ["512"] + odd.split(",")[8:]))
    assert all(0 < _tail_tokens(int(x.split(",")[8]), int(x.split(",")[7]), int(x.split(",")[5])) < 512
               for x in tails)
    path = tmp_path / "short_tails.csv"
    path.write_text("\n".join(lines[:3] + [FLOOR_HEADER] + body + tails) + "\n")
    model = StepShapeCost(path)
    assert model.c_tail == 0.0 and not model.uses_max_context_tokens
    new, ctx = 1535, 4096
    pairs, kv = new * new + ctx, new + ctx
    assert model.step_time_s(StepBatch(2, new, 1, 1536, kv, pairs, ctx)) < 2 * eager_truth(1536, pairs, kv, 2)


def _perturbed(path, rel, out):
    """The table at ``path`` with every step_s times (1 +- rel), the sign alternating by row."""
    lines = path.read_text().splitlines()
    head = next(i for i, x in enumerate(lines) if not x.startswith("#"))
    col = lines[head].split(",").index("step_s")
    body = []
    for i, x in enumerate(lines[head + 1:]):
        parts = x.split(",")
        parts[col] = repr(float(parts[col]) * (1 + (rel if i % 2 else -rel)))
        body.append(",".join(parts))
    out.write_text("\n".join(lines[:head + 1] + body) + "\n")
    return out


def test_a_term_of_rounding_noise_is_zero_and_named(tmp_path):
    # the table's eager rows carry longest contexts whose tails (some of MIN_TAIL_TOKENS or more,
    # so c_tail is fitted) the data do not price: least squares leaves c_tail at rounding noise
    # (1e-20 on some BLAS), which is not a term
    untailed = []
    for t in (512, 1024, 2048, 4096):
        new, ctx = t - 1, 8192
        pairs, kv = new * new + ctx, new + ctx
        parts = row("mixed", 2, new, 1, kv, pairs, 2, 0, eager_truth(t, pairs, kv, 2)).split(",")
        untailed.append(",".join(parts[:8] + [str(ctx)] + parts[8:]))
    assert all(_tail_tokens(ctx, int(x.split(",")[7]), int(x.split(",")[5])) >= MIN_TAIL_TOKENS for x in untailed)
    model = StepShapeCost(floor_table(tmp_path, None, extra=untailed))
    assert model.c_tail == 0.0 and model.negligible_terms == ["c_tail"]
    assert not model.uses_max_context_tokens and "negligible=c_tail" in repr(model)
    # the terms the data have stay (their share of some step is far above the tolerance; the tail
    # table's c_tail: test_a_long_context_beside_a_chunk_is_a_tail_of_eager_steps)
    assert all(c > 0 for c in model.coef)
    # TableCost's KV slope alike: a table whose steps do not depend on the KV read has none
    flat = tmp_path / "flat.csv"
    flat.write_text("num_scheduled_tokens,step_s,kv_read_tokens\n"
                    + "".join(f"{n},{0.01 + n * 1e-6!r},{kv}\n" for n in (16, 64) for kv in (0, 1000, 5000)))
    assert TableCost(flat).kv_coeff_s == 0.0


@pytest.mark.parametrize("make", [lambda p: floor_table(p, None), lambda p: make_table(p)])
def test_a_table_perturbed_by_1e_12_gives_the_same_model_and_replay(tmp_path, make):
    """What a model uses and what it replays do not hang on the last bits of its fit (BLAS
    kernels, numpy's version): the same table with its times moved by 1e-12 relative gives the
    same terms and the same replay output, byte for byte."""
    from kvsim.cli import main
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    table = make(tmp_path)
    same = _perturbed(table, 0.0, tmp_path / "a" / "cost.csv")
    moved = _perturbed(table, 1e-12, tmp_path / "b" / "cost.csv")
    assert same.read_text() != moved.read_text()
    models = [StepShapeCost(p) for p in (same, moved)]
    assert models[0].uses_max_context_tokens == models[1].uses_max_context_tokens
    assert models[0].negligible_terms == models[1].negligible_terms
    assert models[0].c_tail == models[1].c_tail == 0.0
    outputs = []
    for side in ("a", "b"):
        d = tmp_path / side
        assert main(["replay", "sharegpt:n=60,rate=8,seed=3", "--num-blocks", "300", "--block-size", "16",
                     "--cost-table", str(d / "cost.csv"), "--force-cost-table", "--out", str(d / "summary.json"),
                     "--requests", str(d / "requests.csv"), "--timeseries", str(d / "steps.csv"), "--quiet"]) == 0
        summary = json.loads((d / "summary.json").read_text())
        summary.pop("wall_clock_s")
        summary["config"].pop("cost_table", None)
        assert str(d / "cost.csv") in summary["config"].pop("clock")    # the clock names its table
        outputs.append((json.dumps(summary, sort_keys=True), (d / "requests.csv").read_bytes(),
                        (d / "steps.csv").read_bytes()))
    assert outputs[0] == outputs[1]


def test_a_table_measured_for_another_setup_is_an_error_unless_forced(tmp_path, capsys):
    """The shipped H200 table with another model, with the pool sized for another GPU, at TP 2 or
    with an fp8 KV cache: one line naming each difference, exit 2; --force-cost-table runs it."""
    from pathlib import Path

    from kvsim.cli import main

    table = str(Path(__file__).resolve().parent.parent / "tables" / "Llama-3.1-8B_H200.csv")
    base = ["replay", "random:isl=64,osl=8,n=10", "--quiet", "--cost-table", table]
    for extra, words in ((["--num-blocks", "500", "--model", "Qwen2.5-7B"], ["model Qwen2.5-7B"]),
                         (["--gpu", "h100"], ["GPU H100-80GB-SXM", "NVIDIA H200"]),
                         (["--gpu", "h200", "--tp", "2", "--kv-dtype", "fp8"],
                          ["tensor parallel size 2", "KV dtype fp8"]),
                         (["--gpu", "h200", "--weight-dtype", "fp8"], ["fp8 weights"])):
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--force-cost-table" in err
        assert all(w in err for w in words), err
        assert main(base + extra + ["--force-cost-table"]) == 0
        capsys.readouterr()
    # the setup it was measured for, and a pool given in blocks (no GPU sizes it), run
    assert main(base + ["--gpu", "h200"]) == 0
    assert main(base + ["--num-blocks", "500", "--gpu", "h100"]) == 0
    model = StepShapeCost(table)
    assert model.mismatches(model="Llama-3.1-8B", gpu="H200") == []
    assert model.mismatches(gpu="A100-80GB") and model.mismatches(model="Llama-3.1-70B")
    # real vLLM's fp8 table (--quantization fp8) is not unquantized weights' clock, nor the reverse;
    # a checkpoint's own format (gpt-oss's MXFP4) is what a bf16-dtype table measured
    fp8 = StepShapeCost(Path(__file__).resolve().parent.parent / "tables" / "vllm" / "llama8b-fp8_H100.csv")
    assert fp8.mismatches(weights="fp8", kv_dtype="fp8") == []
    assert fp8.mismatches(weights="dtype") == ["KV dtype auto (the table's is fp8)",
                                               "unquantized weights (the table's dtype is fp8)"]
    assert model.mismatches(weights="fp8") == ["fp8 weights (the table's dtype is bfloat16)"]
    assert model.mismatches(weights="mxfp4") == model.mismatches(weights="dtype") == []


VLLM_TABLES = sorted((Path(__file__).resolve().parent.parent / "tables" / "vllm").glob("*.csv"))


@pytest.mark.parametrize("path", VLLM_TABLES, ids=lambda p: p.stem)
def test_the_eager_token_curve_never_falls(path):
    # f (the eager steps' time by scheduled tokens) is fitted with the KV, pair and sequence terms
    # at once; left free, real vLLM's noisy rows let those terms absorb f, down to 0 s for a lone
    # 1,024-token prompt of Qwen3-30B-A3B (priced below a 512-token one). f is non-decreasing and
    # >= 0, so a longer lone prompt never costs less than a shorter one
    model = StepShapeCost(path)
    assert model.knots_s[0] >= 0 and all(b >= a for a, b in zip(model.knots_s, model.knots_s[1:]))

    def lone_prompt(n):
        return model.step_time_s(StepBatch(num_seqs=1, num_prefill_tokens=n, num_scheduled_tokens=n,
                                           kv_read_tokens=n, attn_token_pairs=n * n, max_context_tokens=n))
    times = [lone_prompt(n) for n in (128, 256, 512, 1024, 2048, 4096, 8192)]
    assert times[0] > 0 and all(b >= a for a, b in zip(times, times[1:]))


def test_a_graph_size_measured_at_one_context_borrows_its_kv_slope():
    # real vLLM's fine grid runs 2 sequences only at 256 tokens of context: their rows cannot tell
    # the KV slope (least squares gave 16 ms for two 2,000-token decodes, against 4.4 ms measured
    # on the Azure excerpt). The size takes its slope between the sizes measured at 256 and 2,048
    # tokens (1 and 4), and its own level, so it prices between them at any context
    model = StepShapeCost(Path(__file__).resolve().parent.parent / "tables" / "vllm" / "llama8b-fp8-fine_H100.csv")
    sizes = model.graph_sizes
    (a1, b1), (a2, b2), (a4, b4) = (model.decode_lines[sizes.index(s)] for s in (1, 2, 4))
    assert min(b1, b4) <= b2 <= max(b1, b4)

    def decode(n, context):
        return model.step_time_s(StepBatch(n, 0, n, n, n * context, n * context, context))
    for context in (300, 2000, 6000):
        assert decode(1, context) * 0.95 <= decode(2, context) <= decode(4, context) * 1.05, context


def test_a_step_that_starts_an_idle_engine_costs_the_tables_idle_start(tmp_path):
    """An ``idle_before`` column marks steps that started an idle engine: their extra cost is
    fitted as c_idle (here lone prompts at their truth + 8 ms) and not put in a batch's price; the
    engine adds it to the first step after an idle wait. A lone request finishes exactly that
    much later, each of two lone requests does, and a request that arrives while another runs
    adds nothing of its own (it moves with the run it joins)."""
    from kvsim.simulator import EngineConfig, simulate
    from kvsim.workloads import Request
    plain = StepShapeCost(make_table(tmp_path))
    (tmp_path / "idle").mkdir()
    path = make_table(tmp_path / "idle")
    lines = path.read_text().splitlines()
    head = lines.index(HEADER)
    idle_rows = [row("mixed", 1, t, 0, t, t * t, 1, 0, eager_truth(t, t * t, t, 1) + 0.008) + ",1"
                 for t in (16, 64, 256, 512, 1024, 2048, 16, 1024)]   # MIN_IDLE_ROWS of them
    path.write_text("\n".join(lines[:head] + [HEADER + ",idle_before"] + [ln + ",0" for ln in lines[head + 1:]]
                              + idle_rows) + "\n")
    idle = StepShapeCost(path)
    assert plain.idle_start_s == 0.0 and idle.idle_start_s == pytest.approx(0.008, rel=1e-6)
    few = tmp_path / "few.csv"     # under MIN_IDLE_ROWS marked steps: no term (one would take a row's residual)
    few.write_text("\n".join(path.read_text().splitlines()[:-5]) + "\n")
    assert StepShapeCost(few).idle_start_s == 0.0
    b = StepBatch(1, 1024, 0, 1024, 1024, 1024 * 1024, 0)
    assert idle.step_time_s(b) == pytest.approx(plain.step_time_s(b), rel=1e-6)   # not in the price
    assert "+8.00 ms" in idle.describe() and "idle" not in plain.describe()
    cfg = EngineConfig(num_blocks=900, block_size=16, max_num_seqs=32, max_num_batched_tokens=1024,
                       max_model_len=4096, async_scheduling=True)

    def finish(reqs):
        res = [simulate(reqs, cfg, m).requests.set_index("request_id") for m in (plain, idle)]
        return (res[1]["finish_s"] - res[0]["finish_s"]).round(6).tolist()

    assert finish([Request(0, 0.0, 300, 20)]) == [0.008]
    assert finish([Request(0, 0.0, 300, 20), Request(1, 5.0, 300, 20)]) == [0.008, 0.008]
    first, second = finish([Request(0, 0.0, 300, 20), Request(1, 0.05, 300, 20)])
    assert abs(first - 0.008) < 0.002 and -0.002 < second < 0.010   # steps moved, no second term
    path.write_text(path.read_text().replace(",1\n", ",2\n", 1))
    with pytest.raises(InputError, match="idle_before"):
        StepShapeCost(path)


def test_a_tables_frontend_delays_each_request_on_its_way_in_and_out(tmp_path):
    """'# frontend: in_s A + B per prompt token, out_s C': a request reaches the scheduler A + B x
    its prompt after it is sent, and the client sees each token C after its step: a lone request's
    TTFT and E2E grow by exactly A + B x prompt + C; under a concurrency limit the next request is
    sent C after the one before it finished."""
    from kvsim.simulator import EngineConfig, simulate
    from kvsim.workloads import Request
    plain = StepShapeCost(make_table(tmp_path))
    (tmp_path / "f").mkdir()
    path = make_table(tmp_path / "f")
    path.write_text("# frontend: in_s 0.001 + 2e-06 per prompt token, out_s 0.0005 (test)\n" + path.read_text())
    way = StepShapeCost(path)
    assert way.frontend_s == (0.001, 2e-06, 0.0005) and "way in 1.00 ms" in way.describe()
    cfg = EngineConfig(num_blocks=900, block_size=16, max_num_seqs=32, max_num_batched_tokens=1024,
                       max_model_len=4096, async_scheduling=True)
    reqs = [Request(0, 0.0, 300, 20), Request(1, 5.0, 300, 20)]
    a, b = (simulate(reqs, cfg, m).requests.set_index("request_id") for m in (plain, way))
    extra = 0.001 + 2e-06 * 300 + 0.0005
    assert ((b["ttft_s"] - a["ttft_s"]).round(9) == extra).all() and ((b["e2e_s"] - a["e2e_s"]).round(9) == extra).all()
    assert (b["arrival_s"] == a["arrival_s"]).all()                  # measured from the send, as a client does
    closed = [Request(i, 0.0, 300, 20) for i in range(2)]
    a, b = (simulate(closed, cfg, m, max_concurrency=1).requests.set_index("request_id") for m in (plain, way))
    assert round(b.loc[1, "arrival_s"] - (b.loc[0, "finish_s"]), 9) == 0.0        # sent when the client saw it
    assert round(b.loc[1, "arrival_s"] - a.loc[1, "arrival_s"], 9) == round(extra, 9)
    for bad in ("in_s 1 + 2", "in_s -1 + 0 per prompt token, out_s 0"):
        path.write_text(f"# frontend: {bad}\n" + "\n".join(path.read_text().splitlines()[1:]) + "\n")
        with pytest.raises(InputError, match="frontend"):
            StepShapeCost(path)


def test_a_tables_idle_wait_line_is_read_and_a_bad_one_named(tmp_path):
    """'# idle wait: S s (...)': the shortest idle wait after which a step pays c_idle (grid_table
    writes it with a hot run); none: after any wait; anything else: one InputError line."""
    path = make_table(tmp_path)
    body = path.read_text()
    assert StepShapeCost(path).idle_start_min_wait_s == 0.0
    path.write_text("# idle wait: 0.01 s (test)\n" + body)
    assert StepShapeCost(path).idle_start_min_wait_s == 0.01
    for bad in ("soon", "-0.01 s", "nan s (x)", "0.01"):
        path.write_text(f"# idle wait: {bad}\n" + body)
        with pytest.raises(InputError, match="idle wait"):
            StepShapeCost(path)


def test_one_artefact_row_does_not_bend_the_eager_curve(tmp_path, monkeypatch):
    # under async scheduling a step's result can come back with its neighbour's, and the row then
    # carries a fraction of its time (Qwen3-30B-A3B on the H100: 890 tokens over 256 sequences at
    # 11.6 ms beside lone 1,024-token prompts at 45.6 ms). Least squares in relative error gave
    # that one row more weight than eight clean ones; the robust fit prices the clean rows
    clean = load_cost_table(make_table(tmp_path))
    batch = StepBatch(1, 1024, 0, 1024, 1024, 1024 * 1024)
    truth = eager_truth(1024, 1024 * 1024, 1024, 1)
    assert math.isclose(clean.step_time_s(batch), truth, rel_tol=2e-3)
    pairs, kv = 768 * 1000 + 256 * 512, 768 + 256 * 512
    artefact = row("mixed", 257, 768, 256, kv, pairs, 257, 0, eager_truth(1024, pairs, kv, 257) / 4)
    (tmp_path / "a").mkdir()
    hit = load_cost_table(make_table(tmp_path / "a", [artefact]))
    assert math.isclose(hit.step_time_s(batch), truth, rel_tol=0.02)
    # least squares alone (no reweighting) would not: the row pulls the 1,024-token price down;
    # a table its fit prices within ROBUST_REL_ERR everywhere keeps that fit to the last bit
    from kvsim.simulator import cost_table
    monkeypatch.setattr(cost_table, "ROBUST_MAX_ROUNDS", 0)
    plain, plain_clean = StepShapeCost(tmp_path / "a" / "table.csv"), StepShapeCost(make_table(tmp_path))
    assert plain.step_time_s(batch) < 0.9 * truth
    assert (list(plain_clean.knots_s), list(plain_clean.coef)) == (list(clean.knots_s), list(clean.coef))


def test_a_tables_first_step_line_is_read_and_a_bad_one_named(tmp_path):
    """'# first step: sends A s then B s apart, cutoffs LO-HI ... s after the first send (...);
    graphs to N tokens' (grid_table.burst_cutoffs): FirstStep, whose draw takes the requests sent
    within the drawn cutoff; the clock line says so. A table without it takes bursts whole."""
    import random

    from kvsim.simulator.cost_table import FirstStep

    assert StepShapeCost(make_table(tmp_path)).first_step is None
    (tmp_path / "f").mkdir()
    path = make_table(tmp_path / "f")
    body = path.read_text()
    path.write_text("# first step: sends 0.0004 s then 0.0002 s apart, cutoffs 0.000500-0.000500 "
                    "0.000000-0.000100 s after the first send (2 bursts of the grid at an idle engine); "
                    "graphs to 512 tokens\n" + body)
    cost = StepShapeCost(path)
    assert cost.first_step == FirstStep(0.0004, 0.0002, ((0.0005, 0.0005), (0.0, 0.0001)), 512)
    assert "first step takes a burst's requests sent within a cutoff drawn from 2 measured bursts" in cost.describe()
    one = FirstStep(0.0004, 0.0002, ((0.0007, 0.0007),), 512)      # sends at 0, 0.4, 0.6, 0.8 ms
    assert [one.taken(k, random.Random(0)) for k in (1, 2, 3, 4, 9)] == [1, 2, 3, 3, 3]
    draws = [cost.first_step.taken(4, random.Random(seed)) for seed in range(40)]
    assert set(draws) == {1, 2}                                       # one span each: 0.1 or 0.5 ms
    for bad in ("sends 0.0004 s then 0.0002 s apart, cutoffs 0.0005-0.0001 s after the first send (x); graphs to 512 tokens",
                "sends -1 s then 0.0002 s apart, cutoffs 0-0.1 s after the first send (x); graphs to 512 tokens",
                "sends 0.0004 s then 0.0002 s apart; graphs to 512 tokens"):
        path.write_text(f"# first step: {bad}\n" + body)
        with pytest.raises(InputError, match="first step"):
            StepShapeCost(path)


def test_a_decode_batch_that_pads_to_a_capture_size_the_grid_skipped_is_interpolated(tmp_path):
    """Real vLLM's table (its '# first step:' line names the largest CUDA graph): a decode batch
    pads to vLLM's next capture size (1, 2, 4, every 8 ...); where the grid skipped that size, its
    line is interpolated in the size between the measured sizes around it, not the next measured
    size's (gpt-oss-120b's large grid measured 1, 8, 16, 32, 128: 64 sequences were priced as 128).
    A measured size keeps its own line, a batch past the largest measured size stays eager, and a
    table without the line (kvsim's own executor measures every size) pads to the next measured."""
    sizes = (1, 8, 32)
    line = lambda s, kv: 0.004 + 1e-4 * s + 2e-9 * kv                               # noqa: E731
    rows = [row("decode", s, 0, s, s * ctx, s * ctx, s, 1, line(s, s * ctx)) for s in sizes for ctx in (256, 1024, 3072)]
    rows += [row("mixed", 1, t, 0, t, t * t, 1, 0, 0.005 + 2e-5 * t) for t in (64, 512, 2048)]
    body = "\n".join([HEADER, *rows]) + "\n"
    first = ("# first step: sends 0.0004 s then 0.0002 s apart, cutoffs 0.000500-0.000500 s after the first "
             "send (1 bursts of the grid at an idle engine); graphs to 64 tokens\n")
    (tmp_path / "plain.csv").write_text(body)
    (tmp_path / "vllm.csv").write_text(first + body)
    plain, vllm = StepShapeCost(tmp_path / "plain.csv"), StepShapeCost(tmp_path / "vllm.csv")

    def decode(n, ctx=1024):
        return StepBatch(num_seqs=n, num_decode_tokens=n, num_scheduled_tokens=n, kv_read_tokens=n * ctx,
                         attn_token_pairs=n * ctx)

    # 20 sequences pad to 24, two thirds of the way from 8 to 32
    w = (24 - 8) / (32 - 8)
    a = (1 - w) * (0.004 + 1e-4 * 8) + w * (0.004 + 1e-4 * 32)
    assert vllm.step_time_s(decode(20)) == pytest.approx(a + 2e-9 * 20 * 1024, rel=1e-6)
    assert plain.step_time_s(decode(20)) == pytest.approx(line(32, 20 * 1024), rel=1e-6)   # padded to 32's line
    for n in (1, 8, 32):            # measured sizes: their own lines, with the line or without
        assert vllm.step_time_s(decode(n)) == pytest.approx(plain.step_time_s(decode(n)), rel=1e-12)
    assert vllm.step_time_s(decode(2)) < plain.step_time_s(decode(2)) == pytest.approx(line(8, 2 * 1024), rel=1e-6)
    assert vllm.step_time_s(decode(40)) == plain.step_time_s(decode(40))               # past 32: eager, both
    assert vllm.graph_sizes == [1, 2, 4, 8, 16, 24, 32] and plain.graph_sizes == [1, 8, 32]
    run = vllm.run_time_s(decode(20), 5)
    assert run == pytest.approx(sum(vllm.step_time_s(decode(20, 1024 + j)) for j in range(5)), rel=1e-9)
