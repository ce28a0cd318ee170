"""The tensor-parallel all-reduce of a step, modelled from published figures (issue 24).

Under tensor parallelism every transformer layer ends its attention and its MLP (or MoE) with an
all-reduce of the step's activations across the ranks: ``2 x num_layers`` all-reduces a step,
each of ``num_scheduled_tokens x hidden_size x activation bytes``. kvsim cannot measure them on
one GPU (the multi-GPU issue will); the time of one is modelled from published measurements:

* up to 1 MiB, vLLM's own custom all-reduce on 8 x H100 SXM (NVSwitch), as timed in sglang's
  pull request #2904 (github.com/sgl-project/sglang/pull/2904, "vllm" table, without CUDA
  graphs): at tp 2 / 4 / 8, 512 B take 9.5 / 9.1 / 10.1 us and 1 MiB 26.6 / 40.2 / 45.0 us;
  the time is the line through those two points;
* above 1 MiB, NCCL's ring at its bus bandwidth: ``2 (tp - 1) / tp x bytes / busbw``, busbw
  460 GB/s for 8 x H100 SXM (nccl-tests' large-message figure, 460-480 GB/s; e.g.
  docs.alayanew.com's NCCL-tests reference table), continuing the 1 MiB point.

The H200 has the H100's NVLink 4 and takes its figures. The others are extrapolated, and the clock
says so: A100 (NVLink 3: half the bandwidth, nccl-tests 230-250 GB/s), L40S and L4 (PCIe only,
no NVLink: busbw ~40 GB/s, the custom all-reduce off beyond two GPUs: NCCL's line from a 20 us
latency), MI300X (Infinity Fabric: the H100's figures, not checked). A GPU outside the presets
has no link figures: its roofline leaves the all-reduce out and says so. Overlap with compute,
fused all-reduce + norm kernels and pipeline parallelism are not modelled.
"""
from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class AllReduceLink:
    """One GPU's all-reduce figures: per tp, the time of a 512 B and a 1 MiB all-reduce, and
    the bus bandwidth beyond 1 MiB."""

    name: str
    small_s: dict[int, tuple[float, float]]    # tp -> (512 B, 1 MiB) seconds
    bus_bytes_per_s: float
    source: str                                # "published" or how it was extrapolated

    def seconds(self, num_bytes: float, tp: int) -> float:
        """One all-reduce of ``num_bytes`` (per rank) over ``tp`` ranks."""
        if tp <= 1 or num_bytes <= 0:
            return 0.0
        t512, t1m = self._points(tp)
        if num_bytes <= MIB:
            return t512 + (t1m - t512) * max(num_bytes - 512, 0) / (MIB - 512)
        return t1m + 2 * (tp - 1) / tp * (num_bytes - MIB) / self.bus_bytes_per_s

    def _points(self, tp: int) -> tuple[float, float]:
        if tp in self.small_s:
            return self.small_s[tp]
        # between or beyond the published sizes: the nearest one no larger (the largest above 8)
        known = max((k for k in self.small_s if k <= tp), default=min(self.small_s))
        return self.small_s[known]


_H100_SMALL = {2: (9.5e-6, 26.6e-6), 4: (9.1e-6, 40.2e-6), 8: (10.1e-6, 45.0e-6)}
_H100 = AllReduceLink("NVLink 4 (H100 SXM)", _H100_SMALL, 460e9, "published")


def _scaled(name: str, bandwidth: float, source: str, latency_s: float | None = None) -> AllReduceLink:
    """The H100's figures at another bandwidth (the 1 MiB point's transfer part scaled), or a
    link with NCCL's line alone from ``latency_s``."""
    if latency_s is not None:
        small = {tp: (latency_s, latency_s + 2 * (tp - 1) / tp * MIB / bandwidth) for tp in _H100_SMALL}
    else:
        ratio = _H100.bus_bytes_per_s / bandwidth
        small = {tp: (a, a + (b - a) * ratio) for tp, (a, b) in _H100_SMALL.items()}
    return AllReduceLink(name, small, bandwidth, source)


LINKS: dict[str, AllReduceLink] = {
    "H100-80GB-SXM": _H100,
    "H200": _H100,
    "A100-40GB": _scaled("NVLink 3 (A100)", 240e9, "extrapolated: the H100's at NVLink 3's bandwidth"),
    "A100-80GB": _scaled("NVLink 3 (A100)", 240e9, "extrapolated: the H100's at NVLink 3's bandwidth"),
    "L40S": _scaled("PCIe 4.0 (L40S)", 40e9, "extrapolated: NCCL over PCIe, no NVLink", latency_s=20e-6),
    "L4": _scaled("PCIe 4.0 (L4)", 40e9, "extrapolated: NCCL over PCIe, no NVLink", latency_s=20e-6),
    "MI300X": AllReduceLink("Infinity Fabric (MI300X)", _H100_SMALL, 460e9,
                            "extrapolated: the H100's figures, not checked"),
}


def allreduce_link(gpu_name: str) -> AllReduceLink | None:
    """The all-reduce figures of a GPU preset (None: a GPU without figures)."""
    return LINKS.get(gpu_name)
