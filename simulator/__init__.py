"""SimPy serving simulator: vLLM v1 scheduler over kvsim allocators, cost models, recording.

``simulate(requests, config, cost_model, ...) -> Result`` runs a workload to the end;
``Simulation`` does the same step by step (``run_until``, ``snapshot``, ``state``) for live views.

Names are imported lazily (PEP 562): ``kvsim.simulator.config`` (the choices and EngineConfig)
is then importable without simpy and pandas, which keeps ``kvsim --help`` fast.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "EngineConfig": "kvsim.simulator.config", "ALLOCATORS": "kvsim.simulator.config",
    "PLACEMENTS": "kvsim.simulator.config", "ROUTERS": "kvsim.simulator.config",
    "CostModel": "kvsim.simulator.cost", "FixedStepCost": "kvsim.simulator.cost",
    "ScaledCost": "kvsim.simulator.cost", "StepBatch": "kvsim.simulator.cost",
    "TableCost": "kvsim.simulator.cost",
    "Simulation": "kvsim.simulator.engine", "make_allocator": "kvsim.simulator.engine",
    "simulate": "kvsim.simulator.engine",
    "SUMMARY_KEYS": "kvsim.simulator.result", "Result": "kvsim.simulator.result",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kvsim.simulator' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
