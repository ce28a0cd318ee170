"""Arrival processes and the seeded random streams every generated workload draws from.

Shared by the synthetic generator (``workloads.synthetic``) and the trace loaders, which give
Poisson arrivals to traces without timestamps (ShareGPT length files). Draws are buffered in
chunks of ``CHUNK`` (vectorised), so generation is fast and identical for any chunking.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

CHUNK = 4096  # draws per vectorised call


class Buffered:
    """Scalars from a vectorised sampler, drawn ``CHUNK`` at a time."""

    def __init__(self, draw: Callable[[int], np.ndarray]):
        self._draw = draw
        self._buf: list = []
        self._i = 0

    def next(self):
        if self._i == len(self._buf):
            self._buf = self._draw(CHUNK).tolist()
            self._i = 0
        self._i += 1
        return self._buf[self._i - 1]


@dataclass(frozen=True)
class Poisson:
    """Exponential inter-arrival gaps, ``rate`` per second."""

    rate: float

    def __post_init__(self):
        # callers check the user's rate first (spec keys, loader arguments): this guards the API
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")

    def gaps(self, rng: np.random.Generator) -> Buffered:
        return Buffered(lambda k: rng.exponential(1 / self.rate, k))


@dataclass(frozen=True)
class Gamma:
    """Gamma inter-arrival gaps with mean ``1/rate`` and coefficient of variation ``cv``."""

    rate: float
    cv: float

    def __post_init__(self):
        if not self.rate > 0 or not self.cv > 0:
            raise ValueError(f"rate and cv must be > 0, got rate={self.rate}, cv={self.cv}")

    def gaps(self, rng: np.random.Generator) -> Buffered:
        shape = 1 / self.cv ** 2
        return Buffered(lambda k: rng.gamma(shape, 1 / (self.rate * shape), k))


@dataclass(frozen=True)
class ServeArrivals:
    """Arrivals as ``vllm bench serve`` sends its ``num_requests`` requests.

    ``rate`` inf (its default): every request at 0. Otherwise gamma gaps of shape
    ``burstiness`` and mean ``1/rate`` (burstiness 1: Poisson; < 1 burstier; inf: constant
    gaps), summed from the first request's own gap and then scaled so that the last request is
    sent at ``num_requests / rate`` (vllm bench serve does so to steady the throughput it
    reports across seeds).
    """

    rate: float
    burstiness: float
    num_requests: int

    def __post_init__(self):
        if not self.rate > 0 or not self.burstiness > 0 or self.num_requests < 1:
            raise ValueError(f"rate and burstiness must be > 0 and num_requests >= 1, got rate={self.rate}, "
                             f"burstiness={self.burstiness}, num_requests={self.num_requests}")

    def times(self, rng: np.random.Generator) -> Iterator[float]:
        n = self.num_requests
        if self.rate == float("inf"):
            yield from (0.0 for _ in range(n))
            return
        if self.burstiness == float("inf"):
            gaps = np.full(n, 1.0 / self.rate)
        else:
            gaps = rng.gamma(self.burstiness, 1.0 / (self.rate * self.burstiness), n)
        times = np.cumsum(gaps)
        if times[-1] > 0:
            times *= (n / self.rate) / times[-1]
        yield from times.tolist()


def seed_streams(seed: int) -> list[np.random.Generator]:
    """The independent random streams of a workload: arrivals, lengths, turns, system
    prompt choice, think time (in that order)."""
    return [np.random.Generator(np.random.PCG64(s))
            for s in np.random.SeedSequence(seed).spawn(5)]


def arrival_times(process: Poisson | Gamma, rng: np.random.Generator) -> Iterator[float]:
    """Arrival times of a renewal process; the first request arrives at 0."""
    gaps = process.gaps(rng)
    t = 0.0
    while True:
        yield t
        t += gaps.next()
