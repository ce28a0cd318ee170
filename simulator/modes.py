"""The declared table of scheduling modes: which policy x KV manager x features vLLM 0.33 allows,
and which of them kvsim runs, with the scheduler that runs each.

A mode has three parts (``Mode``):

* the **policy** that decides tokens and admissions: ``v1`` (vLLM 0.33's ``Scheduler``) or
  ``v0`` (vLLM 0.2-0.5 with chunked prefill off, scheduler_v0.py);
* the **KV manager**: ``paged`` (one full-attention group, vLLM's ``KVCacheManager``),
  ``grouped`` (KV-cache groups of a hybrid model, vLLM's ``HybridKVCacheCoordinator``) or
  ``contiguous`` (the vLLM paper's reservation baselines: not vLLM);
* the **features** layered on them: ``async`` (vLLM's ``AsyncScheduler``, two batches in flight)
  and ``offload`` (the ``OffloadingConnector``'s CPU / disk tiers).

``MODES`` lists every combination once, with what vLLM 0.33 says of it (``vllm``: allowed, or
why not) and what kvsim does (``runs``: the scheduler's name, or None). ``check_mode`` is the one
place a combination is accepted or refused: ``EngineConfig`` calls it for its own settings before
any work, ``build_engine`` and the offload scheduler again with the tiers. A refusal is one
``InputError`` line naming the combination and this table (docs/SIMULATOR.md prints it,
``table_markdown``). This module is light (no simpy, no numpy), as config.py is.

vLLM 0.33's rules, from its source: ``VllmConfig`` turns async scheduling on for generation on a
GPU and refuses it only with pipeline parallelism or some speculative methods (none modelled), so
async goes with KV-cache groups and with KV connectors; the ``OffloadingConnector`` supports the
hybrid KV-cache manager (``SupportsHMA``). vLLM v0 had none of async scheduling, KV-cache groups
or the offloading connector.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from kvsim.errors import InputError

POLICIES = ("v1", "v0")
KV_MANAGERS = ("paged", "grouped", "contiguous")
FEATURES = ("async", "offload")     # in the order they are layered on the scheduler
ALLOWED = "yes"

_NOT_V0 = "no: vLLM v0 had no {}"
_CONTIGUOUS = "no: the vLLM paper's reservation baseline"
# What kvsim offers instead of a combination vLLM allows but kvsim does not run yet
_INSTEAD = {
    "async": "--no-async-scheduling",
    "offload": "no --cpu-offload-gib",
    "grouped": "--disable-hybrid-kv-cache-manager",
}


@dataclass(frozen=True)
class Mode:
    """One combination: a policy, a KV manager and the features on them (a subset of
    ``FEATURES``, kept in that order)."""

    policy: str
    kv: str
    features: tuple[str, ...] = ()

    def __str__(self) -> str:
        return " + ".join((f"{self.policy} policy", f"{self.kv} KV manager", *self.features))


@dataclass(frozen=True)
class ModeSupport:
    """A row of the table: what vLLM 0.33 says (``ALLOWED`` or why not) and the scheduler kvsim
    runs it with (simulator class name; None: not modelled)."""

    vllm: str
    runs: str | None


def _support(policy: str, kv: str, features: tuple[str, ...]) -> ModeSupport:
    if kv == "contiguous":
        # the paper's baselines, run with the paged engine's scheduling mode (kvsim compare)
        runs = {(): "Scheduler", ("async",): "AsyncScheduler"}.get(features)
        return ModeSupport(_CONTIGUOUS, runs if policy == "v1" else None)
    if policy == "v0":
        missing = [name for name, on in (("async scheduling", "async" in features),
                                          ("KV-cache groups", kv == "grouped"),
                                          ("offloading connector", "offload" in features)) if on]
        if missing:
            return ModeSupport(_NOT_V0.format(", ".join(missing)), None)
        return ModeSupport(ALLOWED, "V0Scheduler")
    runs = {(): "Scheduler", ("async",): "AsyncScheduler", ("offload",): "OffloadScheduler",
            ("async", "offload"): "AsyncOffloadScheduler"}
    if kv == "grouped":
        runs = {(): "HybridScheduler", ("async",): "AsyncHybridScheduler",
                ("offload",): "HybridOffloadScheduler",
                ("async", "offload"): "AsyncHybridOffloadScheduler"}
    return ModeSupport(ALLOWED, runs.get(features))


def _all_feature_sets() -> list[tuple[str, ...]]:
    return [tuple(f for f, on in zip(FEATURES, flags) if on)
            for flags in product((False, True), repeat=len(FEATURES))]


# every combination, in a fixed order: policy, KV manager, features (none first)
MODES: dict[Mode, ModeSupport] = {
    Mode(policy, kv, features): _support(policy, kv, features)
    for policy, kv, features in product(POLICIES, KV_MANAGERS, _all_feature_sets())}


def mode_of(config, offload: bool = False) -> Mode:
    """The combination an EngineConfig (and offload tiers or not) asks for."""
    kv = "grouped" if config.kv_cache_groups else "paged" if config.allocator == "paged" \
        else "contiguous"
    features = tuple(f for f, on in (("async", config.async_scheduling), ("offload", offload))
                     if on)
    return Mode(config.scheduler, kv, features)


def check_mode(config, offload: bool = False) -> str:
    """The scheduler that runs this configuration's combination (a name of ``MODES``' ``runs``).

    Raises:
        InputError: one line naming the combination, whether vLLM 0.33 allows it, what to use
            instead, and this table.
    """
    mode = mode_of(config, offload)
    row = MODES[mode]
    if row.runs is not None:
        return row.runs
    if row.vllm == ALLOWED:
        parts = [p for p in mode.features if p in _INSTEAD] + (["grouped"] if mode.kv == "grouped"
                                                              else [])
        instead = " or ".join(_INSTEAD[p] for p in parts)
        why = f"vLLM 0.33 runs it, kvsim does not model it yet: use {instead}"
    elif mode.kv == "contiguous":
        why = "kvsim runs the contiguous baselines (not vLLM) with the v1 policy, without offload"
    else:
        why = f"not a vLLM mode ({row.vllm.removeprefix('no: ')})"
    raise InputError(f"{mode}: {why} (the modes table: docs/SIMULATOR.md)",
                     field="--cpu-offload-gib" if offload else None)


def table_markdown() -> str:
    """``MODES`` as a Markdown table (docs/SIMULATOR.md holds it; a test keeps them equal)."""
    lines = ["| policy | KV manager | features | vLLM 0.33 | kvsim runs it with |",
             "| --- | --- | --- | --- | --- |"]
    for mode, row in MODES.items():
        lines.append(f"| {mode.policy} | {mode.kv} | {', '.join(mode.features) or '-'} | "
                     f"{row.vllm} | {row.runs or 'not modelled'} |")
    return "\n".join(lines)
