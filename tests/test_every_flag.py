"""Every flag of `kvsim replay` refuses a bad value the same way (issue 27): exit 2, an error on
stderr that names the flag or its field, no traceback, no output file. argparse's own errors are
two lines (the short usage and the error, issue 29 item 10); a value checked later is one line."""
from __future__ import annotations

import argparse

import pytest

from kvsim.cli import build_parser, main

SPEC = "sharegpt:rate=2,n=5,seed=0"
POOL = ["--num-blocks", "200", "--step-s", "0.01", "--quiet"]

# flag -> (a bad value, the text the error must hold, extra flags the case needs)
BAD = {
    "--format": ("parquet9", "parquet9", ()),
    "--max-requests": ("0", "--max-requests", ()),
    "--rate": ("0", "--rate", ()),
    "--rate-scale": ("-2", "--rate-scale", ()),
    "--max-concurrency": ("0", "--max-concurrency", ()),
    "--seed": ("x", "--seed", ()),
    "--model": ("gpt-5", "gpt-5", ()),
    "--hf-config": ("{tmp}/missing/config.json", "missing/config.json", ()),
    "--gpu": ("tpu-v9", "tpu-v9", ()),
    "--gpu-memory-gib": ("0", "--gpu-memory-gib", ()),
    "--gpu-bandwidth-gbps": ("-1", "--gpu-bandwidth-gbps", ()),
    "--gpu-tflops": ("0", "--gpu-tflops", ()),
    "--gpu-fp8-tflops": ("0", "--gpu-fp8-tflops", ()),
    "--tensor-parallel-size": ("0", "--tensor-parallel-size", ()),
    "--kv-cache-dtype": ("int3", "--kv-cache-dtype", ()),
    "--weight-dtype": ("int3", "--weight-dtype", ()),
    "--gpu-memory-utilization": ("1.5", "--gpu-memory-utilization", ()),
    "--non-kv-gib": ("-1", "--non-kv-gib", ()),
    "--block-size": ("24", "block size", ()),
    "--num-blocks": ("0", "--num-blocks", ()),
    "--kv-tokens": ("0", "--kv-tokens", ()),
    "--kv-groups": ("window:3", "kv_groups", ()),
    "--allocator": ("slab", "--allocator", ()),
    "--placement": ("best-fit", "--placement", ()),
    "--scheduler": ("v2", "--scheduler", ()),
    "--max-num-seqs": ("0", "--max-num-seqs", ()),
    "--max-num-batched-tokens": ("0", "--max-num-batched-tokens", ()),
    "--max-model-len": ("1", "max_model_len", ()),
    "--long-prefill-token-threshold": ("-1", "--long-prefill-token-threshold", ()),
    "--watermark": ("1.5", "watermark", ()),
    "--step-s": ("0", "--step-s", ()),
    "--cost-table": ("{tmp}/missing.csv", "missing.csv", ()),
    "--bandwidth-efficiency": ("1.5", "--bandwidth-efficiency", ()),
    "--flops-efficiency": ("0", "--flops-efficiency", ()),
    "--eager-launch-ms": ("0", "--eager-launch-ms", ()),
    "--step-overhead-ms": ("-1", "--step-overhead-ms", ()),
    "--replicas": ("0", "--replicas", ()),
    "--router": ("random", "--router", ()),
    "--cpu-offload-gib": ("-4", "--cpu-offload-gib", ()),
    "--offload-bandwidth-gbps": ("0", "--offload-bandwidth-gbps", ("--cpu-offload-gib", "4")),
    "--disk-offload-gib": ("100", "--disk-offload-gib", ()),
    "--disk-bandwidth-gbps": ("0", "--disk-bandwidth-gbps",
                              ("--cpu-offload-gib", "4", "--disk-offload-gib", "8")),
    "--disk-latency-ms": ("-1", "--disk-latency-ms",
                          ("--cpu-offload-gib", "4", "--disk-offload-gib", "8",
                           "--disk-bandwidth-gbps", "3")),
    "--sample-interval-s": ("0", "--sample-interval-s", ()),
    "--snapshot-times-s": ("-1", "snapshot", ()),
    "--execute": ("tpu", "--execute", ()),
    # a folder that cannot be made: its parent is a file
    "--out": ("{tmp}/a_file/r.json", "a_file", ()),
    "--timeseries": ("{tmp}/a_file/ts.csv", "a_file", ()),
    "--requests": ("{tmp}/a_file/rq.csv", "a_file", ()),
}


def value_flags(command: str) -> set[str]:
    """Every flag of ``command`` that takes a value (the parser's own list)."""
    top = build_parser(command)
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return {a.option_strings[-1] for a in sub.choices[command]._actions
            if a.option_strings and a.nargs != 0 and a.option_strings[-1] != "--help"}


def assert_refused(argv: list[str], flag: str, named: str, capsys) -> None:
    """``kvsim ARGV`` exits 2 with an error naming ``named``: argparse's two lines or one."""
    try:
        code = main(argv)
    except SystemExit as exit_:            # argparse: a usage error
        code = exit_.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, (flag, code, err)
    assert 1 <= len(err) <= 2 and "Traceback" not in "\n".join(err), err
    assert "error" in err[-1] and named in err[-1], (flag, err)


def test_the_table_covers_every_flag_that_takes_a_value():
    assert value_flags("replay") == set(BAD)


@pytest.mark.parametrize("flag", sorted(BAD))
def test_a_bad_value_is_exit_2_and_an_error_naming_it(flag, tmp_path, capsys):
    value, named, extra = BAD[flag]
    value = value.format(tmp=tmp_path)
    (tmp_path / "a_file").write_text("x")
    workload = SPEC
    if flag == "--format":       # a format is a file's
        workload = str(tmp_path / "t.csv")
        (tmp_path / "t.csv").write_text("arrival_time_s,prompt_tokens,output_tokens\n0,10,5\n")
    argv = ["replay", workload, *POOL, *extra]
    if flag in ("--num-blocks", "--step-s", "--cost-table"):    # replace or drop POOL's own
        i = argv.index(flag if flag != "--cost-table" else "--step-s")
        del argv[i:i + 2]
    if flag == "--kv-tokens":
        i = argv.index("--num-blocks")
        del argv[i:i + 2]
    if flag not in ("--out",):
        argv += ["--out", str(tmp_path / "r.json")]
    argv += [flag, value]
    assert_refused(argv, flag, named, capsys)
    assert not (tmp_path / "r.json").exists()


# the flags a command has beside replay's (the shared ones are checked above): command ->
# {flag: (a bad value, the text the error must hold)}
OWN = {
    "capacity": {"--concurrency-tokens": ("0", "--concurrency-tokens")},
    "compare": {"--allocators": ("paged,slab", "slab"), "--prefix-caching": ("on,maybe", "maybe"),
                "--json": ("{tmp}/a_file/c.json", "a_file")},
    "bench": {"--goodput": ("itl:5", "itl"), "--metric-percentiles": ("101", "101"),
              "--result-json": ("{tmp}/a_file/r.json", "a_file"),
              "--compare": ("{tmp}/missing.json", "missing.json")},
}


@pytest.mark.parametrize("command", sorted(OWN))
def test_the_tables_cover_each_commands_own_flags(command):
    assert value_flags(command) - value_flags("replay") == set(OWN[command])


@pytest.mark.parametrize("command,flag", [(c, f) for c in sorted(OWN) for f in sorted(OWN[c])])
def test_a_commands_own_flag_refuses_a_bad_value(command, flag, tmp_path, capsys):
    value, named = OWN[command][flag]
    (tmp_path / "a_file").write_text("x")
    argv = [command] + ([] if command == "capacity" else [SPEC, *POOL]) + [flag, value.format(tmp=tmp_path)]
    assert_refused(argv, flag, named, capsys)
