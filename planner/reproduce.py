"""Reproduce the memory results of the vLLM paper (Kwon et al., SOSP'23) from first principles.

Figures reproduced (paper sections 3, 6.1-6.3):

* Fig. 2: share of the KV memory holding token states / reservation / internal fragmentation /
  external fragmentation and other, for Orca (Max), Orca (Pow2), Orca (Oracle) and vLLM, during
  the basic-sampling experiment (OPT-13B, ShareGPT at 2 req/s).
* Fig. 13: average number of batched requests, ShareGPT at 2 req/s and Alpaca at 30 req/s.
* Fig. 15: memory saved by sharing KV blocks (parallel sampling and beam search, n = 2, 4, 6,
  Alpaca): blocks saved by sharing / blocks that would be used without sharing.

Setup (paper Table 1 and section 3): OPT-13B on one A100-40GB, 12 GiB of KV cache, 800 KiB per
token (2 x 5120 hidden x 40 layers x 2 bytes), so 15,728 token slots (983 blocks of 16); max
sequence length 2048; one-hour Poisson traces. Step times come from the roofline cost model of
planner/roofline.py for OPT-13B on an A100-40GB.

Everything the paper leaves unsaid is a named field of ``ReproConfig`` (docs/REPRODUCTION.md
explains each choice and how sensitive the figures are to it). ``run_reproduction`` runs the
experiments and returns a JSON-able dict; ``planner.reproduce_report`` compares it with the
paper and writes results.json, report.md and report.html. Same config and seed ->
byte-identical results.json.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from kvsim.allocator import MEMORY_CLASSES
from kvsim.errors import InputError
from kvsim.planner.engine_setup import build_engine

# names are shared with the figure builders (viz sits below planner)
from kvsim.viz.repro_figures import FIG2_CLASSES, REPORT_SYSTEMS, SYSTEMS, V1_SYSTEM

# ---------------------------------------------------------------------------------------------
# What the paper reports. Keys are those of results.json.
# ---------------------------------------------------------------------------------------------

# kvsim's EngineConfig.allocator name for each system
SYSTEM_ALLOCATOR = {"orca_max": "max", "orca_pow2": "pow2", "orca_oracle": "oracle", "vllm": "paged",
                    V1_SYSTEM: "paged"}

WORKLOADS = ("sharegpt", "alpaca")
FIG15_MODES = ("parallel", "beam")
FIG15_NS = (2, 4, 6)

# Fig. 2 bar labels (section 1 text: "only 20.4% - 38.2% ... token states"; vLLM 96.3%).
# None: the paper prints no figure for that bar (Oracle has no internal fragmentation, vLLM's
# bar only labels its token states).
PAPER_FIG2: dict[str, dict[str, float | None]] = {
    "orca_max": {"token_states": 20.4, "reservation": 13.3, "internal_fragmentation": 57.3,
                 "external_and_other": 8.9},
    "orca_pow2": {"token_states": 26.8, "reservation": 17.9, "internal_fragmentation": 13.6,
                  "external_and_other": 41.6},
    "orca_oracle": {"token_states": 38.2, "reservation": 25.2, "internal_fragmentation": None,
                    "external_and_other": 36.6},
    "vllm": {"token_states": 96.3, "reservation": None, "internal_fragmentation": None,
             "external_and_other": None},
}
# Fig. 13 bar labels; section 6.2 text: "vLLM processes 2.2x more requests at the same time than
# Orca (Oracle) and 4.3x more requests than Orca (Max)" (30.42 / 13.62, 30.42 / 7.00).
PAPER_FIG13: dict[str, dict[str, float]] = {
    "sharegpt": {"orca_max": 7.00, "orca_pow2": 9.81, "orca_oracle": 13.62, "vllm": 30.42},
    "alpaca": {"orca_max": 7.00, "orca_pow2": 43.24, "orca_oracle": 72.75, "vllm": 132.44},
}
# Fig. 15 (Alpaca). Section 6.3 text: "6.1% - 9.8% memory saving on parallel sampling and
# 37.6% - 55.2% on beam search" (n = 2 and n = 6); the n = 4 values are the figure's bar labels.
PAPER_FIG15: dict[str, dict[str, float]] = {
    "parallel": {"2": 6.09, "4": 8.53, "6": 9.79},
    "beam": {"2": 37.56, "4": 53.13, "6": 55.16},
}
# Section 6.3 text only (no figure): "In the same experiments with the ShareGPT dataset, we saw
# 16.2% - 30.5% memory saving on parallel sampling and 44.3% - 66.3% on beam search" (n = 2 .. 6)
PAPER_FIG15_SHAREGPT_RANGE: dict[str, tuple[float, float]] = {"parallel": (16.2, 30.5),
                                                               "beam": (44.3, 66.3)}
PAPER_WORKLOAD_MEANS = {"sharegpt": (161.31, 337.99), "alpaca": (19.31, 58.45)}  # Fig. 11
SHAPE_PREFIX = "sharegpt_output_sigma"   # sensitivity workloads: ShareGPT means, other shapes

# ---------------------------------------------------------------------------------------------
# Setup
# ---------------------------------------------------------------------------------------------

KV_BYTES_PER_TOKEN_OPT13B = 2 * 5120 * 40 * 2   # K and V x hidden x layers x fp16 = 800 KiB
KV_CACHE_BYTES_A100_40GB = 12 * 2**30           # paper Table 1: "Memory for KV cache 12 GB"
SHAREGPT_LENGTHS_FILE = Path("sharegpt_lengths") / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


@dataclass(frozen=True)
class ReproConfig:
    """Every knob of the reproduction. Defaults are the paper's setup (or kvsim's stated guess).

    Times in seconds of simulated time; lengths in tokens; rates in requests per second.
    """

    duration_s: float = 3600.0           # "we evaluate the systems with 1-hour traces"
    sharegpt_rate: float = 2.0           # Fig. 13a; Fig. 2 is "the experiment in 6.2": ShareGPT 2 req/s
    alpaca_rate: float = 30.0            # Fig. 13b
    fig15_rate: float = 10.0             # unknown in the paper (Fig. 14 sweeps rates): a mid rate
    fig15_workload: str = "alpaca"       # "when serving OPT-13B for the Alpaca trace"
    fig15_sharegpt_rate: float = 0.25    # the text's ShareGPT variant of Fig. 15 (rate not stated)
    kv_cache_bytes: int = KV_CACHE_BYTES_A100_40GB
    kv_bytes_per_token: int = KV_BYTES_PER_TOKEN_OPT13B
    block_size: int = 16
    max_model_len: int = 2048
    max_prompt_tokens: int = 1024        # vLLM's benchmark sampler of the time drops prompts > 1024
    min_tokens: int = 4                  # ... and prompts or outputs shorter than 4 tokens
    max_num_seqs: int = 256              # vLLM 0.1 default; Orca's batch cap is unknown: same cap
    max_num_batched_tokens: int = 2560   # vLLM 0.1 default (vLLM only: Orca's prompts are never split)
    watermark: float = 0.01              # vLLM 0.1.x BlockSpaceManager's admission watermark
    placement: str = "buddy"             # "We assume Orca uses the buddy allocation algorithm"
    model: str = "OPT-13B"
    gpu: str = "A100-40GB"
    step_time_scale: float = 1.0         # multiplies the roofline step time (sensitivity knob)
    sample_interval_s: float = 1.0       # time-series sampling for time averages
    snapshot_interval_s: float = 10.0    # pool snapshots for Fig. 15's sharing counts
    seed: int = 0
    sensitivity: bool = True             # also run the sensitivity checks
    sensitivity_rates: tuple[float, ...] = (1.0, 4.0)
    sensitivity_step_scales: tuple[float, ...] = (1.5, 2.0, 3.0)
    sensitivity_output_sigmas: tuple[float, ...] = (0.6, 1.4)  # kvsim's ShareGPT preset: 1.0
    sharegpt_file: str | None = None     # real ShareGPT length CSV; None: auto-detect, "" = skip

    def __post_init__(self):
        for name in ("duration_s", "sharegpt_rate", "alpaca_rate", "fig15_rate",
                     "fig15_sharegpt_rate", "kv_cache_bytes",
                     "kv_bytes_per_token", "block_size", "max_model_len", "max_num_seqs",
                     "max_num_batched_tokens", "step_time_scale", "sample_interval_s",
                     "snapshot_interval_s"):
            value = getattr(self, name)
            if not value > 0:
                raise InputError(f"ReproConfig: {name} must be > 0, got {value}")
        if self.block_size & (self.block_size - 1):
            raise InputError(f"ReproConfig: block_size must be a power of two, got {self.block_size}")
        if self.capacity_tokens < self.max_model_len:
            raise InputError(f"ReproConfig: the pool holds {self.capacity_tokens} tokens, less than "
                             f"one max-length sequence ({self.max_model_len})")
        if self.fig15_workload not in WORKLOADS:
            raise InputError(f"ReproConfig: fig15_workload must be one of {WORKLOADS}, "
                             f"got {self.fig15_workload!r}")
        if self.placement not in ("buddy", "first-fit"):
            raise InputError(f"ReproConfig: placement must be 'buddy' or 'first-fit', "
                             f"got {self.placement!r}")

    @property
    def capacity_tokens(self) -> int:
        """Token slots of the pool, rounded down to whole blocks (15,728 for the paper)."""
        slots = self.kv_cache_bytes // self.kv_bytes_per_token
        return slots // self.block_size * self.block_size

    @property
    def num_blocks(self) -> int:
        return self.capacity_tokens // self.block_size

    @classmethod
    def quick(cls, **overrides) -> "ReproConfig":
        """A scaled-down run (10-minute traces, fewer sensitivity points): a minute or two."""
        base = dict(duration_s=600.0, sensitivity_rates=(4.0,), sensitivity_step_scales=(2.0,),
                    sensitivity_output_sigmas=(0.6,))
        base.update(overrides)
        return cls(**base)


# ---------------------------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LengthFilter:
    """Which requests the experiment keeps, and why the others were dropped (counts)."""

    num_kept: int
    num_too_long: int      # prompt > max_prompt_tokens or prompt + output > max_model_len
    num_too_short: int     # prompt or output < min_tokens


def filter_lengths(requests: Iterable, config: ReproConfig, *, sampler_rule: bool = True
                   ) -> tuple[list, LengthFilter]:
    """Drop the requests the experiment cannot or would not serve.

    Always: prompt + output > max_model_len (OPT's context is 2048 and an Orca (Max) reservation
    must hold the whole sequence). With ``sampler_rule`` (real datasets), also what vLLM's
    benchmark sampler of the paper's time dropped: prompts over max_prompt_tokens (1024) and
    prompts or outputs under min_tokens (4). kvsim's synthetic presets are calibrated to the
    paper's means, i.e. to the dataset as the paper used it, so they get only the first rule.
    Dropping (not clipping) keeps each kept request's true lengths; the counts are reported.

    Args:
        requests: workloads.Request records.
        config: supplies max_prompt_tokens, max_model_len and min_tokens.
        sampler_rule: apply the sampler's prompt and minimum-length rules too.
    Returns:
        (kept requests, counts).
    """
    kept, too_long, too_short = [], 0, 0
    for req in requests:
        if sampler_rule and (req.prompt_tokens < config.min_tokens
                             or req.output_tokens < config.min_tokens):
            too_short += 1
        elif (req.prompt_tokens + req.output_tokens > config.max_model_len
              or (sampler_rule and req.prompt_tokens > config.max_prompt_tokens)):
            too_long += 1
        else:
            kept.append(req)
    return kept, LengthFilter(len(kept), too_long, too_short)


def synthetic_requests(kind: str, rate: float, config: ReproConfig, seed: int, *,
                       mode: str = "basic", n: int = 1) -> tuple[list, LengthFilter]:
    """A Poisson trace of ``config.duration_s`` seconds from kvsim's synthetic generator.

    Args:
        kind: "sharegpt" or "alpaca" (workloads' presets: lognormal lengths calibrated to the
            paper's means, pairs over 2048 tokens redrawn).
        rate: requests per second.
        config: duration and length limits.
        seed: generator seed.
        mode: "basic", "parallel" (``n`` samples per request) or "beam" (width ``n``). The
            generator keeps arrivals and lengths unchanged when sampling is turned on.
    Returns:
        (filtered requests, filter counts).
    """
    from kvsim import workloads

    if kind.startswith(SHAPE_PREFIX):
        # the ShareGPT preset with another output spread (log-sd sigma instead of 1.0), its
        # lognormals calibrated like the preset's so that the means stay the paper's
        from kvsim.workloads.synthetic import PRESETS, calibrate_pair

        mean_in, sigma_in, mean_out, _, max_len = PRESETS["sharegpt"]
        model = calibrate_pair(mean_in, sigma_in, mean_out, float(kind[len(SHAPE_PREFIX):]), max_len)
        spec = (f"synthetic:prompt=lognormal({model.prompt.mean!r},{model.prompt.sigma!r}),"
                f"output=lognormal({model.output.mean!r},{model.output.sigma!r}),max_len={max_len},"
                f"rate={rate:g},duration_s={config.duration_s:g},seed={seed}")
    else:
        spec = f"{kind}:rate={rate:g},duration_s={config.duration_s:g},seed={seed}"
    if mode == "parallel":
        spec += f",samples={n}"
    elif mode == "beam":
        spec += f",beam={n}"
    elif mode != "basic":
        raise ValueError(f"mode must be basic, parallel or beam, got {mode!r}")
    return filter_lengths(workloads.load(spec), config, sampler_rule=False)


def find_sharegpt_file(config: ReproConfig) -> Path | None:
    """The real ShareGPT length file: ``config.sharegpt_file``, else ../shared/traces (repo-relative
    and cwd-relative). None when skipped ("") or absent."""
    if config.sharegpt_file == "":
        return None
    if config.sharegpt_file is not None:
        path = Path(config.sharegpt_file)
        if not path.is_file():
            raise InputError("no such file (--sharegpt-file)", file=str(path))
        return path
    repo = Path(__file__).resolve().parent.parent
    for root in (repo.parent / "shared" / "traces", Path.cwd().parent / "shared" / "traces"):
        if (root / SHAREGPT_LENGTHS_FILE).is_file():
            return root / SHAREGPT_LENGTHS_FILE
    return None


def real_sharegpt_requests(path: Path, rate: float, config: ReproConfig, seed: int
                           ) -> tuple[list, LengthFilter, dict[str, float]]:
    """Requests of the real ShareGPT length file, filtered, arriving as Poisson at ``rate``.

    The file (Llama-2 tokenizer, multi-turn prompts) has no timestamps and much longer prompts
    than the paper's ShareGPT (mean 2340 vs 161 tokens). Rows are filtered with the same rule as
    the synthetic traces (``filter_lengths``). The loader gives rows in file order Poisson
    arrivals at rate / kept_fraction; keeping each row independently of its arrival time thins
    that process into a Poisson process at ``rate`` (the file order is not sorted by length).

    Returns:
        (requests, filter counts over the whole file, statistics of the file and of the kept rows).
    Raises:
        InputError: nothing survives the filter, or the file ends before ``config.duration_s``.
    """
    from kvsim import workloads

    rows = list(workloads.load(str(path), format="sharegpt", rate=1.0, seed=seed))
    kept_all, counts = filter_lengths(rows, config)
    if not kept_all:
        raise InputError(f"{path}: no request is left after the length filter "
                         f"(prompt <= {config.max_prompt_tokens}, total <= {config.max_model_len})")
    load_rate = rate * len(rows) / len(kept_all)
    stream = list(workloads.load(str(path), format="sharegpt", rate=load_rate, seed=seed))
    if stream[-1].arrival_s < config.duration_s:
        raise InputError(f"{path}: {len(rows)} rows last {stream[-1].arrival_s:.0f} s at "
                         f"{load_rate:.2f} req/s, shorter than the {config.duration_s:g} s trace")
    reqs, _ = filter_lengths((r for r in stream if r.arrival_s < config.duration_s), config)
    stats = {"rows_in_file": len(rows), "rows_kept": counts.num_kept,
             "rows_too_long": counts.num_too_long, "rows_too_short": counts.num_too_short,
             "mean_prompt_tokens_file": float(np.mean([r.prompt_tokens for r in rows])),
             "mean_output_tokens_file": float(np.mean([r.output_tokens for r in rows])),
             "mean_prompt_tokens_kept": float(np.mean([r.prompt_tokens for r in kept_all])),
             "mean_output_tokens_kept": float(np.mean([r.output_tokens for r in kept_all]))}
    return reqs, counts, stats


def length_stats(requests: Sequence) -> dict[str, float]:
    p = np.array([r.prompt_tokens for r in requests], dtype=np.float64)
    o = np.array([r.output_tokens for r in requests], dtype=np.float64)
    if not len(p):
        return {"num_requests": 0}
    return {"num_requests": int(len(p)), "mean_prompt_tokens": float(p.mean()),
            "mean_output_tokens": float(o.mean()), "std_output_tokens": float(o.std()),
            "max_total_tokens": int((p + o).max())}


# ---------------------------------------------------------------------------------------------
# Engine and cost model
# ---------------------------------------------------------------------------------------------

def system_engine(system: str, config: ReproConfig, step_time_scale: float | None = None):
    """The EngineConfig and cost model of one system of the paper (planner.engine_setup).

    Orca: one contiguous reservation per request placed by a buddy allocator, admitted FCFS at
    iteration granularity only when the reservation fits. vLLM: the paper's engine, vLLM v0's
    scheduler (``scheduler="v0"``: prompt-only steps, then decode steps, recompute preemption of
    the latest arrival, watermark 0.01), paged blocks of 16, prefix caching off (vLLM 0.1 had
    none). ``vllm_v1``: the same pool with kvsim's v1 scheduler (vLLM 0.33's, chunked prefill
    mixing prefills and decodes), the figures kvsim reported before it modelled v0. No system
    schedules asynchronously (the paper's engine had no such mode). The pool is the paper's 983
    blocks (15,728 slots), every one usable: vLLM 0.1 reserved no null block (v1's block 0), so
    ``null_block=False`` and every system gets the same slots.
    Step times: the roofline of ``config.model`` on ``config.gpu`` (planner/roofline.py), times
    ``step_time_scale`` (default ``config.step_time_scale``).

    Returns:
        planner.engine_setup.EngineSetup (``.config``, ``.cost``).
    """
    if system not in REPORT_SYSTEMS:
        raise ValueError(f"system must be one of {REPORT_SYSTEMS}, got {system!r}")
    common = dict(model=config.model, gpu=config.gpu, block_size=config.block_size,
                  num_gpu_blocks=config.num_blocks, null_block=False,
                  max_num_seqs=config.max_num_seqs, max_model_len=config.max_model_len,
                  enable_prefix_caching=False, scheduler_reserve_full_isl=True,
                  async_scheduling=False,
                  step_time_scale=config.step_time_scale if step_time_scale is None else step_time_scale)
    if system in ("vllm", V1_SYSTEM):
        return build_engine(allocator="paged", watermark=config.watermark,
                            scheduler="v0" if system == "vllm" else "v1",
                            max_num_batched_tokens=config.max_num_batched_tokens, **common)
    # Orca batches whole prompts (selective batching, no chunked prefill) and is limited by its
    # batch size, not by a token budget: a budget no step can exhaust keeps every prompt whole
    return build_engine(allocator=SYSTEM_ALLOCATOR[system], placement=config.placement,
                        max_num_batched_tokens=config.max_num_seqs * config.max_model_len, **common)


def run_simulation(requests: Sequence, system: str, config: ReproConfig, cost=None, *,
                   step_time_scale: float | None = None, snapshot_times_s: Sequence[float] = ()):
    """One simulation of ``system`` (simulator.Simulation), returning its Result.

    Orca (Pow2) is the allocator's ``pow2`` policy: prompt + next_pow2(output), the paper's rule.

    Args:
        cost: a cost model instead of the system's roofline (tests).
        step_time_scale: passed to ``system_engine``.
    """
    from kvsim.simulator import Simulation

    setup = system_engine(system, config, step_time_scale)
    sim = Simulation(requests, setup.config, setup.cost if cost is None else cost,
                     sample_interval_s=config.sample_interval_s, snapshot_times_s=snapshot_times_s,
                     seed=config.seed, progress=False)
    return sim.run()


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------

@dataclass
class RunMetrics:
    """What one simulation contributes to the figures (all time averages over the window)."""

    system: str
    shares_pct: dict[str, float]          # Fig. 2 classes, % of the whole pool
    shares_used_pct: dict[str, float]     # same, % of the slots held by requests (free excluded)
    shares_saturated_pct: dict[str, float]  # % of the pool, only samples with a request waiting
    mean_running: float                   # Fig. 13: time-averaged running requests
    mean_waiting: float
    saturated_fraction: float             # share of samples with a request waiting
    num_finished: int
    num_preemptions: int
    sharing_saving_pct: float | None = None        # Fig. 15: ratio of time-averaged block counts
    sharing_saving_mean_ratio_pct: float | None = None  # Fig. 15: mean of per-snapshot ratios
    extra: dict[str, Any] = field(default_factory=dict)


def _fold_classes(slots: dict[str, float]) -> dict[str, float]:
    """kvsim's six classes -> Fig. 2's four bars (same unit)."""
    return {"token_states": slots["token_states"], "reservation": slots["reservation"],
            "internal_fragmentation": slots["internal_fragmentation"],
            "external_and_other": (slots["external_fragmentation"] + slots["cached"]
                                   + slots["free"])}


def _pct(parts: dict[str, float], total: float) -> dict[str, float]:
    return {k: (100.0 * v / total if total > 0 else 0.0) for k, v in parts.items()}


def measure(result, system: str, config: ReproConfig) -> RunMetrics:
    """Time averages over [0, duration_s) of one simulation's recorded samples.

    Args:
        result: simulator Result (timeseries sampled every sample_interval_s; snapshots).
        system: one of SYSTEMS.
        config: the window (duration_s).
    Returns:
        RunMetrics.
    """
    ts = timeseries_view(result)
    window = ts[ts["time_s"] < config.duration_s]
    if window.empty:
        raise ValueError(f"{system}: the simulation recorded no sample before {config.duration_s} s")
    sums = {c: float(window[c].sum()) for c in MEMORY_CLASSES}
    capacity = sum(sums.values())
    folded = _fold_classes(sums)
    used = folded["token_states"] + folded["reservation"] + folded["internal_fragmentation"]
    held = {k: v for k, v in folded.items() if k != "external_and_other"}
    held["external_and_other"] = 0.0
    waiting = window["waiting"] > 0
    sat = window[waiting]
    if len(sat):
        sat_sums = {c: float(sat[c].sum()) for c in MEMORY_CLASSES}
        shares_sat = _pct(_fold_classes(sat_sums), sum(sat_sums.values()))
    else:
        shares_sat = {k: float("nan") for k in FIG2_CLASSES}
    summary = result.summary
    metrics = RunMetrics(
        system=system,
        shares_pct=_pct(folded, capacity),
        shares_used_pct=_pct(held, used),
        shares_saturated_pct=shares_sat,
        mean_running=float(window["running"].mean()),
        mean_waiting=float(window["waiting"].mean()),
        saturated_fraction=float(waiting.mean()),
        num_finished=int(summary["requests_finished"]),
        num_preemptions=int(summary["num_preemptions"]),
    )
    saved_total = sharing_counts(result, config)
    if saved_total is not None:
        saved, total, mean_ratio = saved_total
        metrics.sharing_saving_pct = 100.0 * saved / total if total else 0.0
        metrics.sharing_saving_mean_ratio_pct = mean_ratio
    return metrics


def timeseries_view(result):
    """The result's time series with the columns ``measure`` reads, in slots.

    Columns: time_s, the six MEMORY_CLASSES (slots), running, waiting (one replica).
    """
    ts = result.timeseries
    missing = [c for c in ("time_s", "running", "waiting", *MEMORY_CLASSES) if c not in ts]
    if missing:
        raise KeyError(f"simulator time series lacks columns {missing}; has {list(ts.columns)}")
    return ts


def sharing_counts(result, config: ReproConfig) -> tuple[float, float, float] | None:
    """Fig. 15's numbers from the pool snapshots of a paged run.

    In a snapshot, a block referenced by r sequences stands for r blocks without sharing, so
    saved = sum(r - 1) and total without sharing = sum(r) over used blocks.

    Returns:
        (saved blocks summed over snapshots, blocks-without-sharing summed over snapshots,
        mean of per-snapshot saved/total in %) or None without paged snapshots.
    """
    # Result.snapshots holds (time_s, replica, PoolSnapshot)
    snaps = [entry[-1] for entry in result.snapshots
             if entry[0] < config.duration_s and entry[-1].kind == "paged"]
    if not snaps:
        return None
    saved_sum = total_sum = 0.0
    ratios = []
    for snap in snaps:
        ref = snap.ref_cnt[snap.ref_cnt > 0].astype(np.int64)
        total = float(ref.sum())
        saved = float((ref - 1).sum())
        saved_sum += saved
        total_sum += total
        if total:
            ratios.append(100.0 * saved / total)
    return saved_sum, total_sum, (float(np.mean(ratios)) if ratios else 0.0)


# ---------------------------------------------------------------------------------------------
# Experiments
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Run:
    """One simulation: a workload through one system."""

    key: str          # unique name, e.g. "sharegpt@2/orca_max"
    workload: str     # "sharegpt", "alpaca", "sharegpt_real"
    rate: float
    system: str
    mode: str = "basic"   # "basic", "parallel", "beam"
    n: int = 1
    step_time_scale: float | None = None
    placement: str | None = None


def plan_runs(config: ReproConfig, have_real_trace: bool) -> list[Run]:
    """Every simulation the reproduction needs, in a stable order."""
    runs: list[Run] = []
    for wl, rate in (("sharegpt", config.sharegpt_rate), ("alpaca", config.alpaca_rate)):
        runs += [Run(f"{wl}@{rate:g}/{s}", wl, rate, s) for s in REPORT_SYSTEMS]
    # Fig. 15 forks sequences (parallel samples, beams): vLLM v0 swapped such groups out to CPU
    # memory when it preempted them, which kvsim does not model, so the v1 scheduler runs them
    for mode in FIG15_MODES:
        for n in FIG15_NS:
            runs.append(Run(f"{config.fig15_workload}@{config.fig15_rate:g}/{V1_SYSTEM}/{mode}{n}",
                            config.fig15_workload, config.fig15_rate, V1_SYSTEM, mode, n))
    if have_real_trace:
        runs += [Run(f"sharegpt_real@{config.sharegpt_rate:g}/{s}", "sharegpt_real",
                     config.sharegpt_rate, s) for s in REPORT_SYSTEMS]
    if config.sensitivity:
        for rate in config.sensitivity_rates:
            runs += [Run(f"sharegpt@{rate:g}/{s}", "sharegpt", rate, s) for s in SYSTEMS]
        for scale in config.sensitivity_step_scales:
            runs += [Run(f"{wl}@{rate:g}/{s}/step_x{scale:g}", wl, rate, s, step_time_scale=scale)
                     for wl, rate in (("sharegpt", config.sharegpt_rate),
                                      ("alpaca", config.alpaca_rate))
                     for s in ("orca_pow2", "orca_oracle", "vllm", V1_SYSTEM)]
        for sigma in config.sensitivity_output_sigmas:
            runs += [Run(f"{SHAPE_PREFIX}{sigma:g}@{config.sharegpt_rate:g}/{s}",
                         f"{SHAPE_PREFIX}{sigma:g}", config.sharegpt_rate, s) for s in SYSTEMS]
        for mode in FIG15_MODES:
            runs += [Run(f"sharegpt@{config.fig15_sharegpt_rate:g}/{V1_SYSTEM}/{mode}{n}",
                         "sharegpt", config.fig15_sharegpt_rate, V1_SYSTEM, mode, n)
                     for n in FIG15_NS]
        other = "first-fit" if config.placement == "buddy" else "buddy"
        runs += [Run(f"sharegpt@{config.sharegpt_rate:g}/{s}/{other}", "sharegpt",
                     config.sharegpt_rate, s, placement=other)
                 for s in ("orca_max", "orca_pow2", "orca_oracle")]
    return runs


def run_reproduction(config: ReproConfig, *, progress: bool = True) -> dict[str, Any]:
    """Run every experiment and return the results dict that results.json holds.

    Args:
        config: the setup.
        progress: show a tqdm bar on stderr (one tick per simulation).
    Returns:
        A JSON-able dict: ``fig2``, ``fig13``, ``fig15`` (the paper's figures, measured),
        ``paper`` (the paper's values, same keys), ``runs`` (per-simulation details),
        ``sensitivity``, ``workloads``, ``setup``.
    """
    from tqdm.auto import tqdm

    real_path = find_sharegpt_file(config)
    runs = plan_runs(config, real_path is not None)

    workloads_cache: dict[tuple[str, float, str, int], list] = {}
    workload_info: dict[str, Any] = {}

    def requests_for(run: Run) -> list:
        key = (run.workload, run.rate, run.mode, run.n)
        if key in workloads_cache:
            return workloads_cache[key]
        seed = config.seed
        if run.workload == "sharegpt_real":
            reqs, counts, stats = real_sharegpt_requests(real_path, run.rate, config, seed)
            info = {"source": str(real_path.name), **stats}
        else:
            reqs, counts = synthetic_requests(run.workload, run.rate, config, seed,
                                              mode=run.mode, n=run.n)
            info = {"source": f"synthetic: {run.workload}",
                    "num_dropped_too_long": counts.num_too_long,
                    "num_dropped_too_short": counts.num_too_short}
        if run.mode == "basic":   # samples/beams reuse the basic trace's arrivals and lengths
            info.update(length_stats(reqs))
            workload_info[f"{run.workload}@{run.rate:g}"] = info
            workloads_cache[key] = reqs
        return reqs

    snapshot_times = tuple(float(t) for t in np.arange(config.snapshot_interval_s / 2,
                                                       config.duration_s, config.snapshot_interval_s))
    metrics: dict[str, RunMetrics] = {}
    bar = tqdm(runs, desc="reproduce vllm-paper", unit="sim", disable=not progress, leave=True)
    for run in bar:
        bar.set_postfix_str(run.key)
        reqs = requests_for(run)
        cfg = config
        if run.placement is not None:
            cfg = replace(cfg, placement=run.placement)
        result = run_simulation(reqs, run.system, cfg, step_time_scale=run.step_time_scale,
                                snapshot_times_s=snapshot_times if run.mode != "basic" else ())
        metrics[run.key] = measure(result, run.system, config)
    bar.close()
    return assemble_results(config, runs, metrics, workload_info)


def _r(x: float | None, nd: int = 2) -> float | None:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return round(float(x), nd)


def _sensitivity(config: ReproConfig, runs: Sequence[Run], metrics: dict[str, RunMetrics],
                 res: dict[str, Any], f15: str) -> dict[str, Any]:
    """The results' ``sensitivity`` section: Fig. 2's averaging, the rates, output shapes, step
    time scales and placements that were run, and Fig. 15's variants."""
    sg, al = config.sharegpt_rate, config.alpaca_rate
    sens: dict[str, Any] = {}
    # how Fig. 2's shares are averaged: whole pool (default), held slots only, saturated samples
    sens["fig2_averaging"] = {
        s: {"pool": res["fig2"][s],
            "held_only": {c: _r(metrics[f"sharegpt@{sg:g}/{s}"].shares_used_pct[c]) for c in FIG2_CLASSES},
            "saturated_only": {c: _r(metrics[f"sharegpt@{sg:g}/{s}"].shares_saturated_pct[c])
                               for c in FIG2_CLASSES},
            "saturated_fraction": _r(metrics[f"sharegpt@{sg:g}/{s}"].saturated_fraction, 4)}
        for s in SYSTEMS}
    rate_keys = sorted({r.rate for r in runs if r.workload == "sharegpt" and r.mode == "basic"
                        and r.step_time_scale is None and r.placement is None})
    if len(rate_keys) > 1:
        sens["sharegpt_rate"] = {
            f"{rate:g}": {s: {"token_states": _r(metrics[f"sharegpt@{rate:g}/{s}"].shares_pct["token_states"]),
                              "mean_running": _r(metrics[f"sharegpt@{rate:g}/{s}"].mean_running),
                              "saturated_fraction": _r(metrics[f"sharegpt@{rate:g}/{s}"].saturated_fraction, 4)}
                          for s in SYSTEMS}
            for rate in rate_keys}
    shape_runs = [r for r in runs if r.workload.startswith(SHAPE_PREFIX)]
    if shape_runs:
        table = {"1 (kvsim preset)": {s: {**res["fig2"][s], "mean_running": res["fig13"]["sharegpt"][s]}
                                      for s in SYSTEMS}}
        for r in shape_runs:
            m = metrics[r.key]
            table.setdefault(r.workload[len(SHAPE_PREFIX):], {})[r.system] = {
                **{c: _r(m.shares_pct[c]) for c in FIG2_CLASSES}, "mean_running": _r(m.mean_running)}
        sens["sharegpt_output_sigma"] = table
    scale_runs = [r for r in runs if r.step_time_scale is not None]
    if scale_runs:
        # step time x1 is the main run; Orca (Max) is memory-bound at every scale (7 slots)
        table: dict[str, Any] = {"1": {}}
        for wl, rate in (("sharegpt", sg), ("alpaca", al)):
            table["1"][wl] = {s: {"mean_running": _r(metrics[f"{wl}@{rate:g}/{s}"].mean_running),
                                  "token_states": _r(metrics[f"{wl}@{rate:g}/{s}"].shares_pct["token_states"])}
                              for s in ("orca_pow2", "orca_oracle", "vllm", V1_SYSTEM)}
        for r in scale_runs:
            m = metrics[r.key]
            table.setdefault(f"{r.step_time_scale:g}", {}).setdefault(r.workload, {})[r.system] = {
                "mean_running": _r(m.mean_running), "token_states": _r(m.shares_pct["token_states"])}
        sens["step_time_scale"] = table
    place_runs = [r for r in runs if r.placement is not None]
    if place_runs:
        sens["placement"] = {}
        for r in place_runs:
            m = metrics[r.key]
            sens["placement"].setdefault(r.placement, {})[r.system] = {
                "token_states": _r(m.shares_pct["token_states"]),
                "external_and_other": _r(m.shares_pct["external_and_other"]),
                "mean_running": _r(m.mean_running)}
    if config.sensitivity:
        sg15 = config.fig15_sharegpt_rate
        sens["fig15_sharegpt"] = {
            m: {**{str(n): _r(metrics[f"sharegpt@{sg15:g}/{V1_SYSTEM}/{m}{n}"].sharing_saving_pct)
                   for n in FIG15_NS}, "paper_range": list(PAPER_FIG15_SHAREGPT_RANGE[m])}
            for m in FIG15_MODES}
    sens["fig15_mean_of_ratios"] = {
        m: {str(n): _r(metrics[f"{f15}/{m}{n}"].sharing_saving_mean_ratio_pct)
            for n in FIG15_NS} for m in FIG15_MODES}
    return sens


def assemble_results(config: ReproConfig, runs: Sequence[Run], metrics: dict[str, RunMetrics],
                     workload_info: dict[str, Any]) -> dict[str, Any]:
    """Fold per-run metrics into the results dict (stable keys, rounded, JSON-able)."""
    sg, al = config.sharegpt_rate, config.alpaca_rate
    res: dict[str, Any] = {"schema": "kvsim.reproduce.vllm-paper/1"}
    res["fig2"] = {s: {c: _r(metrics[f"sharegpt@{sg:g}/{s}"].shares_pct[c]) for c in FIG2_CLASSES}
                   for s in REPORT_SYSTEMS}
    res["fig13"] = {wl: {s: _r(metrics[f"{wl}@{rate:g}/{s}"].mean_running) for s in REPORT_SYSTEMS}
                    for wl, rate in (("sharegpt", sg), ("alpaca", al))}
    f15 = f"{config.fig15_workload}@{config.fig15_rate:g}/{V1_SYSTEM}"
    res["fig15"] = {m: {str(n): _r(metrics[f"{f15}/{m}{n}"].sharing_saving_pct)
                        for n in FIG15_NS} for m in FIG15_MODES}
    real_keys = [k for k in metrics if k.startswith("sharegpt_real@")]
    if real_keys:
        res["fig2_sharegpt_real"] = {
            s: {c: _r(metrics[f"sharegpt_real@{sg:g}/{s}"].shares_pct[c]) for c in FIG2_CLASSES}
            for s in REPORT_SYSTEMS}
        res["fig13"]["sharegpt_real"] = {s: _r(metrics[f"sharegpt_real@{sg:g}/{s}"].mean_running)
                                         for s in REPORT_SYSTEMS}
    # the v1 row is measured against the paper's vLLM too
    res["paper"] = {"fig2": {**PAPER_FIG2, V1_SYSTEM: PAPER_FIG2["vllm"]},
                    "fig13": {wl: {**v, V1_SYSTEM: v["vllm"]} for wl, v in PAPER_FIG13.items()},
                    "fig15": PAPER_FIG15}

    res["sensitivity"] = _sensitivity(config, runs, metrics, res, f15)
    res["runs"] = {k: {"system": m.system, "mean_running": _r(m.mean_running),
                       "mean_waiting": _r(m.mean_waiting),
                       "saturated_fraction": _r(m.saturated_fraction, 4),
                       "num_finished": m.num_finished, "num_preemptions": m.num_preemptions,
                       "shares_pct": {c: _r(v) for c, v in m.shares_pct.items()},
                       **({"sharing_saving_pct": _r(m.sharing_saving_pct)}
                          if m.sharing_saving_pct is not None else {})}
                   for k, m in metrics.items()}
    res["workloads"] = {k: {kk: (_r(v) if isinstance(v, float) else v) for kk, v in info.items()}
                        for k, info in sorted(workload_info.items())}
    setup = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()}
    setup["capacity_tokens"] = config.capacity_tokens
    setup["num_blocks"] = config.num_blocks
    setup["sharegpt_file"] = None if config.sharegpt_file is None else str(config.sharegpt_file)
    res["setup"] = setup
    return res
