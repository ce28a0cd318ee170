"""Prefix-reuse statistics against brute-force block keys, and `kvsim workload` end to end."""
import json
import re
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings, strategies as st

from kvsim.workloads import Request
from kvsim.cli.workload import register
from kvsim.workloads.stats import PrefixReuse

FIX = Path(__file__).parent / "fixtures" / "workloads"
ROOT = Path(__file__).resolve().parent.parent


def _brute_force_hits(requests, block_size):
    """The definition: a set of every full block key of every earlier prompt+output."""
    cached, hits = set(), []
    for r in requests:
        keys = r.block_keys(block_size)
        h = 0
        while h < (r.prompt_tokens - 1) // block_size and keys[h] in cached:
            h += 1
        hits.append(h * block_size)
        cached.update(keys)
    return hits


_segment = st.tuples(st.integers(0, 3), st.integers(1, 40))  # few ids: many collisions


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(_segment, max_size=5), st.integers(1, 30),
                          st.sampled_from([None, 0, 1])), min_size=1, max_size=8),
       st.sampled_from([1, 4, 16]))
def test_segment_trie_equals_block_key_set(specs, block_size):
    requests = []
    for i, (segments, unique_tokens, out_id) in enumerate(specs):
        segments = tuple(segments) + ((100 + i, unique_tokens),)  # at least one token
        prompt = sum(n for _, n in segments)
        requests.append(Request(i, 0.0, prompt, 5, segments=segments, output_segment_id=out_id,
                                num_shareable_tokens=prompt))
    reuse = PrefixReuse(block_size)
    assert [reuse.add(r) for r in requests] == _brute_force_hits(requests, block_size)


def _kvsim(*args):
    return subprocess.run([sys.executable, "-m", "kvsim.cli", *args], capture_output=True, text=True,
                          cwd=ROOT)


def test_cli_prints_stats_and_json():
    out = _kvsim("workload", str(FIX / "mooncake.jsonl"), "--json")
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)
    assert stats["num_requests"] == 4 and stats["duration_s"] == 6.0
    assert stats["prefix_hit_fraction"] == (1024 + 512 + 1296) / 4536
    text = _kvsim("workload", "alpaca:rate=4,n=50,system=32", "--block-size", "8")
    assert text.returncode == 0, text.stderr
    assert re.search(r"^requests\s+50$", text.stdout, re.M), text.stdout
    assert "block 8" in text.stdout


def test_cli_errors_are_one_line_exit_2():
    for args in (["workload", str(FIX / "bad" / "azure_negative.csv")],
                 ["workload", "sharegpt:rate=1,colour=red"],
                 ["workload", str(FIX / "bad" / "binary.csv")],
                 ["workload", str(FIX / "sharegpt.csv")]):
        out = _kvsim(*args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvsim: error: "), out.stderr
        assert "Traceback" not in out.stderr


def test_register_adds_the_subcommand():
    import argparse
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["workload", "x", "--max-requests", "3", "--time-window", "2"])
    assert (args.max_requests, args.time_window, args.block_size) == (3, 2.0, 16)
