"""``simulate_settings``: one simulation as a user asks for it, for every caller (the ``kvsim``
commands, the dashboard), with no command line in between.

    settings = RunSettings("sharegpt:rate=4,n=200", EngineSettings(model="Llama-3.1-8B", gpu="h100"))
    result = simulate_settings(settings)

The order is the contract's (docs/ARCHITECTURE.md, errors): the engine is built (every setting
checked, build_engine), every size the run would hold is checked against the memory there is
(the pool, snapshots, the workload's n= and samples=: simulator.footprint), and only then is the
workload read and simulated.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvsim.planner.engine_setup import EngineSettings, EngineSetup, build_engine


@dataclass(frozen=True)
class RunSettings:
    """One simulation's settings (the defaults are ``kvsim replay``'s).

    workload: a trace file or a synthetic spec (workloads.load).
    engine: the engine's settings (EngineSettings, vLLM's names).
    format, max_requests: how to read the workload (workloads.load).
    rate, rate_scale: its arrival rate (workloads.load_at_rate: one meaning everywhere).
    seed: the workload's seed where it has none, and the engine's (beam reselection).
    replicas, router: engine replicas behind a router.
    sample_interval_s: time-series period (None: the simulator's, 1 s).
    snapshot_times_s: when to take PoolSnapshots of every replica.
    record_steps: one row per step (the step clock's fidelity form).
    batch_decode_steps: apply runs of identical decode steps at once.
    record_requests: keep the per-request table.
    record_token_times: keep when every step's tokens came out.
    max_concurrency: a client's limit on requests in flight (None: open loop).
    """

    workload: str
    engine: EngineSettings = field(default_factory=EngineSettings)
    format: str | None = None
    max_requests: int | None = None
    rate: float | None = None
    rate_scale: float | None = None
    seed: int = 0
    replicas: int = 1
    router: str = "round-robin"
    sample_interval_s: float | None = None
    snapshot_times_s: tuple[float, ...] = ()
    record_steps: bool = False
    batch_decode_steps: bool = True
    record_requests: bool = True
    record_token_times: bool = False
    max_concurrency: int | None = None


def simulate_settings(settings: RunSettings, *,
                      wrap_requests: Callable[[Iterable], Iterable] | None = None,
                      in_the_loop: Callable[[EngineSetup, Iterable], tuple] | None = None,
                      warn: Callable[[str], None] | None = None):
    """Build the engine, check every size, read the workload and simulate it.

    Args:
        settings: the run.
        wrap_requests: wraps the request iterator (a progress bar).
        in_the_loop: (setup, requests) -> (cost model, requests): hardware in the loop
            (kvsim.cli.execute), whose executor the simulator must not import.
        warn: called with a warning's text before the work (a pool that vLLM would refuse to
            start with this max_model_len, simulator.footprint.max_model_len_warning).
    Returns:
        The simulator's Result.
    Raises:
        InputError: any setting, size or workload the run cannot take (one line).
    """
    from kvsim import workloads
    from kvsim.simulator import simulate
    from kvsim.simulator.footprint import WorkloadSize, check_simulation, max_model_len_warning

    s = settings
    setup = build_engine(s.engine)
    # every size (pool, snapshots, the spec's n= and samples=) before anything is allocated
    check_simulation(setup.config, replicas=s.replicas, num_snapshots=len(s.snapshot_times_s),
                     sample_interval_s=s.sample_interval_s, record_requests=s.record_requests,
                     workload=WorkloadSize(**workloads.workload_size(
                         s.workload, format=s.format, max_requests=s.max_requests)),
                     offload=setup.offload)
    requests = workloads.load_at_rate(s.workload, format=s.format, rate=s.rate,
                                      rate_scale=s.rate_scale, max_requests=s.max_requests,
                                      seed=s.seed)
    note = max_model_len_warning(setup.config)
    if note and warn is not None:
        requests = _warn_once_read(requests, note, warn)
    if wrap_requests is not None:
        requests = wrap_requests(requests)
    cost = setup.cost
    if in_the_loop is not None:
        cost, requests = in_the_loop(setup, requests)
    return simulate(requests, setup.config, cost, replicas=s.replicas, router=s.router,
                    sample_interval_s=s.sample_interval_s, snapshot_times_s=s.snapshot_times_s,
                    seed=s.seed, record_steps=s.record_steps,
                    batch_decode_steps=s.batch_decode_steps, record_requests=s.record_requests,
                    offload=setup.offload, max_concurrency=s.max_concurrency,
                    record_token_times=s.record_token_times)


def _warn_once_read(requests: Iterable, note: str, warn: Callable[[str], None]):
    """``requests``, with ``warn(note)`` once its first request is read: a workload that cannot
    be read is its one error line, without a warning before it."""
    it = iter(requests)
    first = next(it, None)
    warn(note)
    if first is not None:
        yield first
        yield from it
