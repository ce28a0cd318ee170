"""SimPy serving simulator: vLLM v1 scheduler over kvsim allocators, cost models, recording.

``simulate(requests, config, cost_model, ...) -> Result`` runs a workload to the end;
``Simulation`` does the same step by step (``run_until``, ``snapshot``, ``state``) for live views.
"""
from kvsim.simulator.config import EngineConfig
from kvsim.simulator.cost import CostModel, FixedStepCost, StepBatch, TableCost
from kvsim.simulator.engine import ROUTERS, Simulation, make_allocator, simulate
from kvsim.simulator.result import SUMMARY_KEYS, Result

__all__ = ["CostModel", "EngineConfig", "FixedStepCost", "ROUTERS", "Result", "SUMMARY_KEYS",
           "Simulation", "StepBatch", "TableCost", "make_allocator", "simulate"]
