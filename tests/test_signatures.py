"""Honest overrides (issue 27): a scheduler's or a pool's method that overrides its base keeps the
base's parameters (names, kinds, defaults, annotations) and returns what the base's annotation
says (or a narrower member of it), so that the engine and the mixins call every policy and
feature the same way."""
import ast
import inspect
from pathlib import Path

import pytest

from kvsim.allocator.block_pool import BlockPool
from kvsim.allocator.grouped import _GroupCountingPool
from kvsim.allocator.group_managers import MANAGER_OF_KIND
from kvsim.simulator.async_scheduling import AsyncScheduler
from kvsim.simulator.batch_hooks import BatchQueue, SyncBatches
from kvsim.simulator.engine import SCHEDULERS
from kvsim.simulator.modes import MODES
from kvsim.simulator.transfer_hooks import ConnectorHooks


def overrides(cls) -> list[tuple[str, type]]:
    """(method name, the nearest base that defines it) for each method ``cls`` overrides."""
    out = []
    for name, fn in vars(cls).items():
        if name.startswith("__") or not inspect.isfunction(fn):
            continue
        base = next((b for b in cls.__mro__[1:] if name in vars(b)), None)
        if base is not None and inspect.isfunction(vars(base)[name]):
            out.append((name, base))
    return out


CLASSES = sorted({k for cls in [*SCHEDULERS.values(), _GroupCountingPool, *MANAGER_OF_KIND.values(),
                              ConnectorHooks]
                  for k in cls.__mro__ if k.__module__.startswith("kvsim")},
                 key=lambda k: (k.__module__, k.__qualname__))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda k: k.__qualname__)
def test_an_override_keeps_its_bases_signature(cls):
    for name, base in overrides(cls):
        mine, theirs = inspect.signature(vars(cls)[name]), inspect.signature(vars(base)[name])
        where = f"{cls.__qualname__}.{name}{mine} overrides {base.__qualname__}.{name}{theirs}"
        assert mine.parameters == theirs.parameters, where
        returns = str(theirs.return_annotation).split(" | ")
        assert mine.return_annotation == theirs.return_annotation or \
            set(str(mine.return_annotation).split(" | ")) < set(returns), where


def test_the_check_sees_the_overrides_it_guards():
    names = {name for cls in CLASSES for name, _ in overrides(cls)}
    # the admission rule, the slot growth, the frees and the pool's queue hooks are overridden
    assert {"_admission", "_admit", "_grow", "_free", "schedule", "free", "touch"} <= names
    assert any(cls is _GroupCountingPool for cls in CLASSES) and BlockPool in CLASSES


def test_the_engine_loop_reaches_the_connector_only_through_its_hooks():
    """engine.py builds a replica's connector and hands it to the scheduler and the transfer
    hooks; the loop itself calls hooks (simulator/transfer_hooks.py) and never the connector,
    whose moments it would otherwise have to know per mode."""
    import kvsim.simulator.engine as engine

    used = _loop_attributes(engine)
    assert not {u for u in used if u.startswith(("rep.offload", "conn."))}, used
    hook_calls = {u.split(".", 2)[-1] for u in used if u.startswith(("rep.io.", "io."))}
    assert hook_calls and hook_calls <= {n for n in dir(ConnectorHooks) if not n.startswith("_")}


def _loop_attributes(engine) -> set[str]:
    """Every ``name.attr`` / ``a.b.attr`` that engine.py's Simulation (the loop) reads or calls."""
    tree = ast.parse(Path(engine.__file__).read_text())
    loop = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Simulation")
    return {f"{ast.unparse(n.value)}.{n.attr}" for n in ast.walk(loop)
            if isinstance(n, ast.Attribute) and isinstance(n.value, (ast.Name, ast.Attribute))}


def test_the_engine_loop_reaches_the_batch_in_flight_only_through_its_hooks():
    """Async scheduling's batch in flight (what finished in it, when it is freed) is the batch
    hooks' business (simulator/batch_hooks.py): the loop never reads the scheduler's in-flight
    state nor calls its async-only methods."""
    import kvsim.simulator.engine as engine

    used = _loop_attributes(engine)
    in_flight = {"done_in_flight", "retire_done", "defers_retire"}
    assert not {u for u in used if u.rsplit(".", 1)[-1] in in_flight}, used
    hook_calls = {u.split(".", 2)[-1] for u in used if u.startswith("rep.batch.")}
    assert hook_calls and hook_calls <= {n for n in dir(BatchQueue) if not n.startswith("_")}


def test_the_batch_queue_goes_with_every_async_scheduler_and_only_with_them():
    """``batch_hooks`` picks the queue from the config's async_scheduling; the scheduler the modes
    table names must then be an AsyncScheduler (whose retire_done the queue calls), and the
    synchronous ones must not be (their finished requests would never be freed)."""
    assert issubclass(BatchQueue, SyncBatches)
    for mode, row in MODES.items():
        if row.runs is not None:
            assert ("async" in mode.features) == issubclass(SCHEDULERS[row.runs], AsyncScheduler), mode
