"""The vLLM oracle (../shared/tools/vllm_oracle/oracle.py) driven as a closed loop: a client with
at most C requests in flight, as ``vllm bench serve --max-concurrency C`` sends them.

Same arguments and outputs as oracle.py, plus ``--max-concurrency C``. The trace's
``arrival_step`` is when the client means to send each request; requests go in trace order, the
first C when due, the k-th (k >= C) when due and when the (k - C + 1)-th request has finished:
a request whose last token came from step s frees its slot for the step after, s + 1 (with async
scheduling that step is already scheduled when s's output is processed, so the new request
enters at s + 2, as in vLLM's engine core). The oracle's own loop adds a request before the first
``schedule()`` whose step is at or after its ``arrival_step``; here that value is the send step,
known once the finish it waits for has happened (until then, never). The oracle's
``requests.csv`` then holds the send step as ``arrival_step``. vLLM itself is not touched.

Run under the oracle venv, e.g.

    ../oracle-venv/bin/python bench/closed_loop_oracle.py --max-concurrency 8 \\
        --trace t.csv --out-dir out --num-gpu-blocks 2000
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.hybrid_oracle import load_oracle  # noqa: E402

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)   # keep bench/ (which holds a kernels.py) off the path vLLM imports from

NEVER = 1 << 60


def closed_loop_reader(oracle, concurrency: int):
    """A replacement for oracle.read_trace whose requests' arrival_step is their send step."""
    plain_read = oracle.read_trace

    class ClosedLoopReq(oracle.TraceReq):
        """A trace request whose ``arrival_step`` is when the client sends it."""

        def __init__(self, base, position: int, everyone: list):
            fields = {f: getattr(base, f) for f in oracle.TraceReq.__dataclass_fields__}
            self._due = fields.pop("arrival_step")
            self._position = position
            self._everyone = everyone
            super().__init__(arrival_step=self._due, **fields)

        @property
        def arrival_step(self) -> int:
            k = self._position - concurrency       # the (k+1)-th finish frees its slot
            if k < 0:
                return self._due
            done = sorted(r.finish_step for r in self._everyone if r.finish_step >= 0)
            return max(self._due, done[k] + 1) if len(done) > k else NEVER

        @arrival_step.setter
        def arrival_step(self, value) -> None:   # the dataclass __init__ sets it
            pass

    def read(path: str):
        trace = plain_read(path)
        if [r.arrival_step for r in trace] != sorted(r.arrival_step for r in trace):
            sys.exit(f"trace {path}: a closed loop sends in trace order; sort it by arrival_step")
        everyone: list = []
        everyone.extend(ClosedLoopReq(r, i, everyone) for i, r in enumerate(trace))
        return everyone

    return read


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--max-concurrency", type=int, required=True)
    ours, rest = parser.parse_known_args(argv)
    if ours.max_concurrency < 1:
        sys.exit("--max-concurrency must be >= 1")
    oracle = load_oracle()
    oracle.read_trace = closed_loop_reader(oracle, ours.max_concurrency)
    return oracle.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
