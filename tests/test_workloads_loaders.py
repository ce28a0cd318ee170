"""Trace loaders on tiny hand-written fixtures: every format, every bad-input case, tolerances."""
import gzip
import math
import shutil
import tracemalloc
from pathlib import Path

import pytest

from kvsim.workloads.keys import SegmentKeys
from kvsim.workloads import InputError, load, sniff_format
from kvsim.workloads.loaders import parse_datetime_ticks
from kvsim.workloads.stats import PrefixReuse

FIX = Path(__file__).parent / "fixtures" / "workloads"
BAD = FIX / "bad"


def test_mooncake_segments_arrivals_and_ties():
    reqs = list(load(FIX / "mooncake.jsonl"))
    assert [r.request_id for r in reqs] == [0, 1, 2, 3]
    assert [r.arrival_s for r in reqs] == [0.0, 0.0, 3.0, 6.0]  # ms -> s, ties keep file order
    assert [r.prompt_tokens for r in reqs] == [1100, 1300, 600, 1536]
    assert reqs[1].segments == ((0, 512), (1, 512), (3, 276))  # last id covers a partial block
    assert all(r.num_shareable_tokens == r.prompt_tokens for r in reqs)
    # requests 0 and 1 share ids 0, 1 (1024 tokens): 64 blocks of 16, then they differ
    k0, k1 = reqs[0].block_keys(16), reqs[1].block_keys(16)
    assert list(k0[:64]) == list(k1[:64]) and k0[64] != k1[64]


def test_mooncake_prefix_reuse_by_hand():
    # req1 reuses ids 0,1 (1024 tokens); req2 id 0 (512); req3 ids 0,1 and the 276 tokens of
    # id 3 that req1 had: 1300 -> 81 full blocks of 16 = 1296 tokens
    reuse = PrefixReuse(16)
    hits = [reuse.add(r) for r in load(FIX / "mooncake.jsonl")]
    assert hits == [0, 1024, 512, 1296]
    assert reuse.num_prompt_tokens == 4536


def test_azure_keeps_seven_fraction_digits_and_order():
    reqs = list(load(FIX / "azure.csv"))
    assert sniff_format(str(FIX / "azure.csv")) == "azure"
    assert reqs[1].arrival_s == pytest.approx(1e-7)  # 100 ns after the first: kept, ordered
    assert reqs[1].arrival_s > reqs[0].arrival_s
    assert reqs[2].arrival_s == pytest.approx(0.3194100)
    assert reqs[3].arrival_s == pytest.approx(13.81941)  # fewer fraction digits are fine
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs][0] == (374, 44)
    assert all(r.segments == () and r.num_shareable_tokens == 0 for r in reqs)


def test_datetime_ticks():
    t = parse_datetime_ticks("2023-11-16 18:15:46.6805900", file="f", line=1, field="T")
    assert parse_datetime_ticks("2023-11-16T18:15:46.68059", file="f", line=1, field="T") == t
    assert parse_datetime_ticks("2023-11-17 00:00:00", file="f", line=1, field="T") > t


def test_sharegpt_poisson_arrivals_need_rate_and_follow_seed():
    with pytest.raises(InputError, match="rate"):
        list(load(FIX / "sharegpt.csv"))
    a = list(load(FIX / "sharegpt.csv", rate=2.0, seed=1))
    b = list(load(FIX / "sharegpt.csv", rate=2.0, seed=1))
    c = list(load(FIX / "sharegpt.csv", rate=2.0, seed=2))
    assert a == b and a != c
    assert a[0].arrival_s == 0.0 and a[1].arrival_s < a[2].arrival_s
    assert [(r.prompt_tokens, r.output_tokens) for r in a] == [(74, 918), (290, 905), (1, 2)]
    # the same arrival stream as a synthetic workload of that rate and seed
    synthetic = load("synthetic:prompt=5,output=5,rate=2,n=3", seed=1)
    assert [r.arrival_s for r in a] == [r.arrival_s for r in synthetic]


def test_vllm_oracle_groups_steps_and_ids():
    reqs = list(load(FIX / "vllm_oracle.csv"))
    assert [r.arrival_step for r in reqs] == [0, 0, 3, 7, 9]
    assert [r.arrival_s for r in reqs] == [0.0, 0.0, 3.0, 7.0, 9.0]
    assert [r.num_shareable_tokens for r in reqs] == [512, 0, 512, 300, 32]
    g0 = reqs[0].segments[0][0]
    assert reqs[0].segments == ((g0, 512), (reqs[0].segments[1][0], 88))
    assert reqs[1].segments == ()
    assert reqs[3].segments == ((g0, 300),)  # prefix clipped to the prompt, nothing unique
    assert reqs[4].segments[0][0] != g0
    # vLLM semantics: the 32 full blocks of the 512-token group prefix are the same keys
    k0, k2 = reqs[0].block_keys(16), reqs[2].block_keys(16)
    assert list(k0[:32]) == list(k2[:32]) and k0[32] != k2[32]
    ids = [r.request_id for r in load(FIX / "vllm_oracle_ids.csv")]
    assert ids == [7, 1, 100]  # blank request_id: the row index, as the oracle does


def test_generic_mapping_csv_and_jsonl():
    reqs = list(load(FIX / "generic.csv",
                     format="generic:arrival=ts_ms,prompt=in,output=out,time_unit=ms"))
    assert [r.arrival_s for r in reqs] == [0.0, 0.25, 0.25]
    assert [r.prompt_tokens for r in reqs] == [12, 7, 99]
    mapping = "generic:arrival=arrival_step,prompt=prompt_tokens,output=output_tokens,id=request_id"
    ids = load(FIX / "vllm_oracle_ids.csv", format=mapping)
    with pytest.raises(InputError) as err:  # a blank id is not an integer
        list(ids)
    assert (err.value.line, err.value.field) == (3, "request_id")
    js = list(load(FIX / "generic.jsonl"))  # default mapping, sniffed; extra keys ignored
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in js] == [
        (0.0, 10, 2), (0.5, 20, 4)]
    no_arrival = list(load(FIX / "generic_noarrival.csv", rate=1.0))
    assert [r.prompt_tokens for r in no_arrival] == [5, 7] and no_arrival[0].arrival_s == 0.0
    with pytest.raises(InputError, match="time_unit"):
        load(FIX / "generic.csv", format="generic:arrival=ts_ms,prompt=in,output=out,"
                                         "time_unit=weeks")
    with pytest.raises(InputError, match="'colour'"):
        load(FIX / "generic.csv", format="generic:colour=red")
    with pytest.raises(InputError) as err:
        list(load(FIX / "generic.csv", format="generic:arrival=when,prompt=in,output=out"))
    assert err.value.field == "when" and err.value.line == 1


def test_tolerances_bom_crlf_blank_lines_gzip(tmp_path):
    reqs = list(load(FIX / "azure_bom_crlf.csv"))
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [(374, 44), (5, 6)]
    assert reqs[1].arrival_s == pytest.approx(1.0)
    gz = tmp_path / "trace.jsonl.gz"
    with open(FIX / "mooncake.jsonl", "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert list(load(gz)) == list(load(FIX / "mooncake.jsonl"))


@pytest.mark.parametrize("name, line, field, text", [
    ("azure_missing_column.csv", 1, "GeneratedTokens", "missing column"),
    ("azure_extra_column.csv", 1, "Model", "unexpected column"),
    ("azure_extra_field.csv", 3, None, "expected 3 fields"),
    ("azure_non_numeric.csv", 2, "ContextTokens", "not a number"),
    ("azure_negative.csv", 3, "GeneratedTokens", "negative"),
    ("azure_zero_prompt.csv", 2, "ContextTokens", "zero-length"),
    ("azure_backwards.csv", 4, "TIMESTAMP", "backwards"),
    ("azure_bad_timestamp.csv", 2, "TIMESTAMP", "month must be in 1..12"),
    ("azure_truncated.csv", 3, None, "truncated"),
    ("azure_header_only.csv", None, None, "no requests"),
    ("sharegpt_nan.csv", 3, "num_prefill_tokens", "not a finite number"),
    ("sharegpt_fraction.csv", 2, "num_prefill_tokens", "expected an integer"),
    ("sharegpt_total_mismatch.csv", 2, "num_total_tokens", "993 != "),
    ("mooncake_hash_len.jsonl", 2, "hash_ids", "expected ceil(1025/512) = 3"),
    ("mooncake_missing_key.jsonl", 1, "output_length", "missing key"),
    ("mooncake_extra_key.jsonl", 1, "chat_id", "unexpected key"),
    ("mooncake_nan.jsonl", 1, "timestamp", "not a finite number"),
    ("mooncake_backwards.jsonl", 2, "timestamp", "backwards"),
    ("mooncake_truncated.jsonl", 2, None, "truncated last line"),
    ("mooncake_hash_type.jsonl", 1, "hash_ids", "list of integers"),
    ("oracle_duplicate_id.csv", 3, "request_id", "duplicate"),
    ("generic_missing_mapped.jsonl", 2, "output_tokens", "missing key"),
    ("not_utf8.csv", 3, None, "not UTF-8"),
    ("unknown_format.csv", 1, None, "unrecognised trace format"),
    ("empty.csv", None, None, "empty file"),
    ("blank_lines_only.jsonl", None, None, "empty file"),
    ("binary.csv", None, None, "binary file"),
])
def test_bad_input_is_a_located_input_error(name, line, field, text):
    path = BAD / name
    kwargs = {"rate": 1.0} if name.startswith("sharegpt") else {}
    with pytest.raises(InputError) as err:
        list(load(path, **kwargs))
    e = err.value
    assert text in str(e)
    assert e.file == str(path) and e.line == line and e.field == field
    assert "\n" not in str(e)  # one line for the CLI
    assert str(e).startswith(str(path))


def test_format_override_and_unknown_format():
    with pytest.raises(InputError, match="unknown format 'parquet'"):
        load(FIX / "azure.csv", format="parquet")
    # forcing the wrong format fails on the schema instead of loading garbage
    with pytest.raises(InputError) as err:
        list(load(FIX / "azure.csv", format="sharegpt", rate=1.0))
    assert err.value.field == "num_prefill_tokens"
    with pytest.raises(InputError, match="own timestamps"):
        load(FIX / "azure.csv", rate=3.0)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load(tmp_path / "nope.csv")
    with pytest.raises(InputError, match="directory"):
        load(tmp_path, format="azure")


def test_cuts_stop_reading_early():
    # the bad row is past the cut: it is never read, so there is no error
    reqs = list(load(BAD / "azure_negative.csv", max_requests=1))
    assert len(reqs) == 1
    reqs = list(load(BAD / "mooncake_backwards.jsonl", max_requests=1))
    assert len(reqs) == 1
    assert [r.request_id for r in load(FIX / "mooncake.jsonl", time_window_s=3.0)] == [0, 1]
    assert len(list(load(FIX / "mooncake.jsonl", time_window_s=3.0001))) == 3
    with pytest.raises(InputError, match="max_requests"):
        load(FIX / "mooncake.jsonl", max_requests=0)
    with pytest.raises(InputError, match="time_window_s"):
        load(FIX / "mooncake.jsonl", time_window_s=-1)


def _streaming_peak_bytes(path: Path, num_rows: int) -> int:
    # long lines (an ignored 200-character column) so that both files exceed the read buffer
    with open(path, "w") as f:
        f.write("arrival_s,prompt_tokens,output_tokens,note\n")
        f.write(f"1.5,374,44,{'x' * 200}\n" * num_rows)
    tracemalloc.start()
    count = sum(1 for _ in load(path))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == num_rows
    return peak


def test_big_file_is_streamed(tmp_path):
    # memory while iterating does not grow with the file: 6x the rows, about the same peak
    small = _streaming_peak_bytes(tmp_path / "small.csv", 1_000)
    big = _streaming_peak_bytes(tmp_path / "big.csv", 6_000)
    assert big < small + 16_384, (small, big)
    assert big < 6_000 * 200 / 4


def test_mooncake_keys_are_segment_keys_with_output():
    r = next(load(FIX / "mooncake.jsonl"))
    keys = r.block_keys(16)
    assert isinstance(keys, SegmentKeys)
    assert len(keys) == (1100 + 20) // 16 and keys.num_shareable_blocks == 1100 // 16
    assert math.isclose(keys.num_tokens, 1120)


def test_generic_datetime_column():
    reqs = list(load(FIX / "generic_datetime.csv",
                     format="generic:arrival=when,prompt=p,output=o,time_unit=datetime"))
    assert [r.arrival_s for r in reqs] == [0.0, pytest.approx(0.75)]


def test_malformed_text_past_the_sniffed_head(tmp_path):
    quote = tmp_path / "quote.csv"  # an unterminated quote runs to the end of the file
    quote.write_text('TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,"5,6\n')
    with pytest.raises(InputError, match="bad CSV: unexpected end of data") as err:
        list(load(quote))
    assert err.value.line == 2
    nul = tmp_path / "nul.csv"  # a NUL after the first 64 KiB is caught by the parser
    head = b"arrival_s,prompt_tokens,output_tokens\n" + b"1,2,3\n" * 12_000
    nul.write_bytes(head + b"4,\x005,6\n")
    with pytest.raises(InputError) as err:
        list(load(nul))
    assert err.value.line == 12_002
    arr = tmp_path / "array.jsonl"
    arr.write_text('\n\n{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n[1, 2]\n')
    with pytest.raises(InputError, match="expected a JSON object") as err:
        list(load(arr))
    assert err.value.line == 4
    huge = tmp_path / "huge.jsonl"  # an integer beyond float range
    huge.write_text('{"timestamp": 1%s, "input_length": 1, "output_length": 1, "hash_ids": [0]}\n'
                    % ("0" * 400))
    with pytest.raises(InputError, match="not a number") as err:
        list(load(huge))
    assert (err.value.line, err.value.field) == (1, "timestamp")
    bad_first = tmp_path / "bad_first.jsonl"
    bad_first.write_text('\n{"input_length": 1,\n')
    with pytest.raises(InputError, match="does not parse") as err:
        load(bad_first)
    assert err.value.line == 2


def test_a_json_error_is_a_whole_sentence(tmp_path):
    """Python's message stops at "Invalid control character at" (its position follows in another
    form); the line says what and where, and how to fix a raw tab (issue 29 item 13)."""
    from kvsim import workloads

    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 1, "input_length": 5, "output_length": 3, "hash_ids": [1]}\n'
                    '{"timestamp": 2, "input_length": "a\tb"}\n')
    with pytest.raises(InputError) as err:
        list(workloads.load(str(path)))
    assert str(err.value) == (f"{path}:2: invalid JSON: invalid control character at column 36: a raw "
                              "control character (a tab or line break) inside a string; write it as \\t or \\n")
