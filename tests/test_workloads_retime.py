"""One meaning of --rate everywhere, --rate-scale that keeps a trace's pattern, and read errors.

workloads.load_at_rate (workloads.retime) is what replay, compare, validate, workload, capacity
and plan call; the CLI checks below run the same source through several commands.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from kvsim import workloads
from kvsim.cli import main
from kvsim.errors import InputError
from kvsim.planner.sweep import load_requests

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "workloads"


def _timed_trace(path: Path, n: int = 60) -> Path:
    """A generic CSV with bursts: 5 requests 10 ms apart, then 4 s of nothing."""
    rows = [f"{(i // 5) * 4 + (i % 5) * 0.01:.3f},{100 + i},{10 + i % 7}" for i in range(n)]
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    return path


def _arrivals(source, **kw) -> np.ndarray:
    return np.array([r.arrival_s for r in workloads.load_at_rate(str(source), **kw)])


def test_rate_scale_keeps_a_traces_own_arrival_pattern(tmp_path):
    trace = _timed_trace(tmp_path / "t.csv")
    own = _arrivals(trace)
    doubled = _arrivals(trace, rate_scale=2.0)
    np.testing.assert_allclose(doubled, own / 2)            # every gap halved, bursts kept
    lengths = [r.prompt_tokens for r in workloads.load_at_rate(str(trace), rate_scale=2.0)]
    assert lengths == [r.prompt_tokens for r in workloads.load(str(trace))]
    # --rate: the same pattern at a mean rate of 10 requests/s (requests over the span)
    at10 = _arrivals(trace, rate=10.0)
    assert len(at10) / (at10[-1] - at10[0]) == pytest.approx(10.0)
    np.testing.assert_allclose(np.diff(at10) / np.diff(at10).max(), np.diff(own) / np.diff(own).max())
    # both: the rate, then the factor
    np.testing.assert_allclose(_arrivals(trace, rate=10.0, rate_scale=4.0), at10 / 4)
    # the cut by max_requests comes first: the rate is that of the requests replayed
    head = _arrivals(trace, rate=10.0, max_requests=12)
    assert len(head) == 12 and 12 / (head[-1] - head[0]) == pytest.approx(10.0)


def test_rate_means_the_same_for_specs_and_traces_without_timestamps():
    spec = "sharegpt:rate=2,n=50,seed=3"
    np.testing.assert_allclose(_arrivals(spec, rate_scale=2.0), _arrivals(spec) / 2)
    np.testing.assert_allclose(_arrivals(spec, rate=4.0), _arrivals(spec) / 2)  # rate= replaced
    # a spec with turns: conversations per second scale, think time does not
    conv = "sharegpt:rate=1,turns=uniform(2,3),think_s=30,n=40,seed=0"
    assert _arrivals(conv, rate_scale=4.0)[-1] < _arrivals(conv)[-1]
    lengths = FIX / "sharegpt.csv"   # no timestamps: Poisson at the rate, times the factor
    np.testing.assert_allclose(_arrivals(lengths, rate=2.0, rate_scale=2.0), _arrivals(lengths, rate=4.0))
    with pytest.raises(InputError, match="no timestamps, so no rate of its own to scale") as err:
        list(workloads.load_at_rate(str(lengths), rate_scale=2.0))
    assert err.value.field == "rate_scale"
    with pytest.raises(InputError, match="must be > 0"):
        workloads.load_at_rate(str(lengths), rate_scale=0.0)


def test_every_command_reads_the_same_requests_at_a_rate(tmp_path, capsys):
    """replay (its request table), plan's points and `kvsim workload` see the same arrivals."""
    trace = _timed_trace(tmp_path / "t.csv", n=20)
    req = tmp_path / "req.csv"
    assert main(["replay", str(trace), "--rate-scale", "3", "--num-blocks", "400", "--step-s", "0.01",
                 "--requests", str(req), "--quiet"]) == 0
    import pandas as pd

    replayed = pd.read_csv(req).sort_values("request_id")["arrival_s"].to_numpy()
    planned = np.array([r.arrival_s for r in load_requests(str(trace), rate_scale=3.0)])
    np.testing.assert_allclose(replayed, planned, atol=1e-9)
    capsys.readouterr()
    assert main(["workload", str(trace), "--rate-scale", "3", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["duration_s"] == pytest.approx(planned[-1])
    # a timestamped trace with --rate was refused by replay before; now it is re-timed
    assert main(["replay", str(FIX / "azure.csv"), "--rate", "1", "--num-blocks", "400",
                 "--step-s", "0.01", "--quiet"]) == 0


def test_plan_sweeps_rate_scale(capsys):
    assert main(["plan", "sharegpt:rate=4,n=80,seed=0", "--max-model-len", "4096",
                 "--sweep", "rate_scale=1,2,4", "--quiet"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()[1:4]]
    assert [r[1] for r in rows] == ["1.0", "2.0", "4.0"]


def test_a_corrupt_compressed_trace_is_one_line_with_file_and_line(tmp_path, capsys):
    lines = b"".join(b'{"timestamp": %d, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n' % i
                     for i in range(20000))
    data = gzip.compress(lines)
    bad_header = tmp_path / "header.jsonl.gz"   # corrupt deflate data from the start
    raw = bytearray(data)
    for i in range(20, 60):
        raw[i] ^= 0x55
    bad_header.write_bytes(bytes(raw))
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(data[:len(data) // 2])
    crc = tmp_path / "crc.jsonl.gz"
    raw = bytearray(data)
    raw[-6] ^= 1
    crc.write_bytes(bytes(raw))
    for path, line, what in ((bad_header, 1, "corrupt compressed data"),
                             (truncated, None, "compressed stream ends early"),
                             (crc, 20001, "corrupt compressed data (CRC check failed")):
        with pytest.raises(InputError) as err:
            list(workloads.load(path))
        assert err.value.file == str(path) and what in err.value.message
        assert err.value.line == line if line else err.value.line > 1
        assert main(["workload", str(path)]) == 2
        msg = capsys.readouterr().err
        assert msg.count("\n") == 1 and msg.startswith(f"kvsim: error: {path}:")


def test_an_empty_spec_is_a_clear_error(capsys):
    for text in ("", "   "):
        with pytest.raises(InputError, match="empty workload: give a trace file or a synthetic spec"):
            workloads.load(text)
        assert main(["replay", text, "--num-blocks", "100"]) == 2
        assert "no such file" not in capsys.readouterr().err


def test_count_requests_for_progress_bars(tmp_path):
    assert workloads.count_requests("sharegpt:rate=2,n=77") == 77
    assert workloads.count_requests("sharegpt:rate=2,duration_s=5") is None
    assert workloads.count_requests(str(FIX / "azure.csv")) == len(list(workloads.load(FIX / "azure.csv")))
    assert workloads.count_requests(str(FIX / "mooncake.jsonl")) == len(list(workloads.load(FIX / "mooncake.jsonl")))
    assert workloads.count_requests(str(FIX / "azure.csv"), max_requests=2) == 2
    assert workloads.count_requests(str(tmp_path / "missing.csv")) is None
