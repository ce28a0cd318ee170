"""Synthetic workloads: arrivals, length distributions, sharing structure; deterministic by seed.

Spec strings (grammar in ``workloads.spec``)::

    sharegpt:rate=2,n=1000,seed=0
    alpaca:rate=30,duration_s=3600
    synthetic:prompt=lognormal(500,0.6),output=fixed(128),rate=5,arrival=gamma(cv=2)
    sharegpt:rate=1,system=512,turns=uniform(1,6),think_s=30,samples=2

Sources: ``sharegpt`` and ``alpaca`` preset the lengths (below); ``synthetic`` needs ``prompt=``
and ``output=``. Keys (every other key is an error naming it):

==============  ===============================================================================
key             meaning
==============  ===============================================================================
n               requests to generate (default 1000 when neither n nor duration_s is given,
                except with replay(), which ends with the trace)
duration_s      generate arrivals in [0, duration_s)
rate            arrivals per second (conversations per second with ``turns``); required
                unless ``arrival=replay(...)``
seed            integer seed (default: the ``seed`` argument of ``load``)
arrival         ``poisson`` (default) | ``gamma(cv=C)`` (gamma gaps, mean 1/rate, coefficient of
                variation C: C > 1 is burstier than Poisson) | ``replay(PATH)`` (the arrival
                times of a trace file; lengths still come from this spec)
prompt, output  a length distribution: ``fixed(N)`` or ``N`` | ``uniform(LO,HI)`` (inclusive) |
                ``lognormal(MEAN,SIGMA)`` (MEAN and SIGMA of the continuous lognormal before
                rounding; lengths are rounded and at least 1)
max_len         max prompt + output tokens of a drawn pair (pairs above are redrawn); ``none``
                for no limit. sharegpt/alpaca default 2048, synthetic none.
system          a shared system prompt of this many tokens, prepended to the prompt
system_frac     fraction of requests (conversations) that carry the system prompt (default 1)
turns           multi-turn conversations: turns per conversation, a distribution as above
think_s         mean (exponential) gap between a turn's arrival and the next turn's (default 30)
samples         parallel sampling: n samples per request (``Request.n``)
beam            beam search width (``Request.beam_width``)
==============  ===============================================================================

Lengths of the presets. The vLLM paper (SOSP'23, section 6.1) gives only the means: ShareGPT
input 161.31 / output 337.99 tokens, Alpaca 19.31 / 58.45, with the model's 2048-token limit.
We use independent lognormals (our choice of shape: ShareGPT sigma 1.2 input / 1.0 output, long
tails; Alpaca 0.7 / 0.9, short instructions), rounded to integers >= 1, with pairs whose sum
exceeds 2048 redrawn (as vLLM's benchmark filters them). The lognormal means are calibrated
numerically (``calibrate_pair``) so that the means AFTER rounding and redrawing equal the
paper's to 1e-6; a sample of 400k lands within 1%.

Sharing structure, per request: a shared system prompt is one segment common to every request
that carries it (``num_shareable_tokens`` = its length). A conversation's turn k prompt is the
system prompt (if any), every earlier turn's message and output, and a new message; the turn
arrives ``think_s`` (exponential) after the previous turn's arrival (the simulator does not wait
for the previous turn to finish, so an early next turn may miss the previous output in the
cache). Its shareable tokens are its whole prompt and output when a later turn follows, else
the history (prompt minus the new message). With ``max_len``, a conversation ends before the
turn whose history + message + output would exceed it (system prompt not counted). A request
with ``samples`` > 1 or ``beam`` > 1 shares its prompt with its own samples, so its
``num_shareable_tokens`` is at least the prompt.

Randomness: ``numpy.random.SeedSequence(seed)`` is split into independent streams (arrivals,
lengths, conversation shape, system-prompt choice, think time), each a ``Generator(PCG64)``,
so that turning a sharing feature on leaves the arrivals of the workload unchanged. Draws are
buffered in chunks (vectorised), so generation is fast and identical for any chunking.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

import numpy as np

from kvsim.errors import InputError
from kvsim.workloads.arrivals import CHUNK, Buffered, Gamma, Poisson, ServeArrivals, arrival_times, seed_streams
from kvsim.workloads.loaders import load_file
from kvsim.workloads.request import NS_PROMPT, NS_SYSTEM, NS_TURN_OUTPUT, NS_USER, Request, derived_id
from kvsim.workloads.spec import Call, Spec, call_args, parse_spec, plain, to_float, to_int

_MAX_TOKENS = 1 << 30  # keeps extreme lognormal draws inside int64 arithmetic


# ----------------------------------------------------------------------------- distributions
@dataclass(frozen=True)
class Fixed:
    """Every length is ``tokens``."""

    tokens: int

    def __post_init__(self):
        if not 1 <= self.tokens <= _MAX_TOKENS:
            raise ValueError(f"fixed length must be in [1, {_MAX_TOKENS}], got {self.tokens}")

    @property
    def min_tokens(self) -> int:
        return self.tokens

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return np.full(size, self.tokens, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Integers uniform in ``[low, high]``, both included."""

    low: int
    high: int

    def __post_init__(self):
        if not 1 <= self.low <= self.high <= _MAX_TOKENS:
            raise ValueError(f"uniform needs 1 <= low <= high <= {_MAX_TOKENS}, got "
                             f"low={self.low}, high={self.high}")

    @property
    def min_tokens(self) -> int:
        return self.low

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.integers(self.low, self.high, size=size, endpoint=True, dtype=np.int64)


@dataclass(frozen=True)
class LogNormal:
    """Lognormal with mean ``mean`` and log-sd ``sigma``, rounded, at least 1 token."""

    mean: float
    sigma: float

    def __post_init__(self):
        if not (self.mean > 0 and math.isfinite(self.mean)):
            raise ValueError(f"lognormal mean must be > 0, got {self.mean}")
        if not 0 <= self.sigma <= 4:
            raise ValueError(f"lognormal sigma must be in [0, 4], got {self.sigma}")

    @property
    def mu(self) -> float:
        return math.log(self.mean) - self.sigma ** 2 / 2  # so that E[X] = mean

    @property
    def min_tokens(self) -> int:
        return 1

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        x = rng.lognormal(self.mu, self.sigma, size)
        return np.clip(np.rint(x), 1, _MAX_TOKENS).astype(np.int64)

    def pmf(self, max_tokens: int) -> np.ndarray:
        """P(length = k) for k = 0..max_tokens (index 0 is 0; mass above is dropped)."""
        edges = np.arange(max_tokens + 1) + 0.5  # length k <=> x in [k-0.5, k+0.5)
        z = (np.log(edges) - self.mu) / (self.sigma * math.sqrt(2)) if self.sigma else None
        if z is None:
            cdf = (edges > math.exp(self.mu)).astype(float)
        else:
            cdf = 0.5 * (1 + np.array([math.erf(v) for v in z]))
        pmf = np.zeros(max_tokens + 1)
        pmf[1] = cdf[1]             # everything below 1.5 rounds (or clips) to 1
        pmf[2:] = np.diff(cdf[1:])
        return pmf


Dist = Fixed | Uniform | LogNormal


@dataclass(frozen=True)
class LengthModel:
    """Joint (prompt, output) lengths: independent draws; pairs above max_total_tokens redrawn."""

    prompt: Dist
    output: Dist
    max_total_tokens: int | None = None

    def __post_init__(self):
        if self.max_total_tokens is not None and (
                self.prompt.min_tokens + self.output.min_tokens > self.max_total_tokens):
            raise ValueError(f"the shortest prompt ({self.prompt.min_tokens}) plus the shortest "
                             f"output ({self.output.min_tokens}) exceed max_len "
                             f"{self.max_total_tokens}")

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        """``size`` accepted (prompt, output) pairs, in draw order."""
        prompts, outputs, have = [], [], 0
        while have < size:
            p = self.prompt.sample(rng, CHUNK)
            o = self.output.sample(rng, CHUNK)
            if self.max_total_tokens is not None:
                ok = p + o <= self.max_total_tokens
                if not ok.any():
                    raise InputError(f"no drawn (prompt, output) pair fits max_len "
                                     f"{self.max_total_tokens} in {CHUNK} tries")
                p, o = p[ok], o[ok]
            prompts.append(p)
            outputs.append(o)
            have += len(p)
        return np.concatenate(prompts)[:size], np.concatenate(outputs)[:size]


def pair_means(model: LengthModel) -> tuple[float, float]:
    """Exact mean prompt and output length of ``model`` (lognormals and a max total only)."""
    m = model.max_total_tokens
    pp, po = model.prompt.pmf(m), model.output.pmf(m)
    cp, co = np.cumsum(pp), np.cumsum(po)
    k = np.arange(m + 1)
    accept_p = co[m - k]                # P(output <= m - k)
    accept_o = cp[m - k]
    z = float(np.sum(pp * accept_p))
    return float(np.sum(k * pp * accept_p)) / z, float(np.sum(k * po * accept_o)) / z


@cache
def calibrate_pair(prompt_mean: float, prompt_sigma: float, output_mean: float,
                   output_sigma: float, max_total_tokens: int) -> LengthModel:
    """A LengthModel of lognormals whose rounded, redrawn means equal the targets.

    Args:
        prompt_mean, output_mean: target mean lengths after rounding and redrawing.
        prompt_sigma, output_sigma: lognormal log-sd (the shape).
        max_total_tokens: pairs above are redrawn.
    Returns:
        The calibrated LengthModel (fixed-point iteration on the lognormal means).
    """
    mp, mo = prompt_mean, output_mean
    for _ in range(200):
        model = LengthModel(LogNormal(mp, prompt_sigma), LogNormal(mo, output_sigma),
                            max_total_tokens)
        got_p, got_o = pair_means(model)
        if abs(got_p / prompt_mean - 1) < 1e-9 and abs(got_o / output_mean - 1) < 1e-9:
            return model
        mp *= prompt_mean / got_p
        mo *= output_mean / got_o
    raise RuntimeError("length calibration did not converge")  # not reachable for sane targets


# vLLM paper (SOSP'23) section 6.1 means; shapes are our choice (module docstring)
PRESETS = {
    "sharegpt": (161.31, 1.2, 337.99, 1.0, 2048),
    "alpaca": (19.31, 0.7, 58.45, 0.9, 2048),
}


def preset_lengths(name: str) -> LengthModel:
    """The calibrated length model of a preset ('sharegpt' or 'alpaca')."""
    return calibrate_pair(*PRESETS[name])


# ----------------------------------------------------------------------------- arrivals
@dataclass(frozen=True)
class Replay:
    """Arrival times replayed from a trace file (any format with timestamps)."""

    path: str

    def times(self) -> Iterator[float]:
        for req in load_file(self.path):
            yield req.arrival_s


# ----------------------------------------------------------------------------- the generator
@dataclass(frozen=True)
class SyntheticWorkload:
    """A synthetic workload; iterate it for Requests in arrival order.

    Args (fields): lengths, arrival (Poisson | Gamma | Replay), num_requests, duration_s,
    seed, system_prompt_tokens, system_frac, turns (a Dist of turns per conversation, None for
    single requests), think_s, samples (Request.n), beam_width, max_concurrency (the client's
    limit on requests in flight, for the engine: ``Simulation``'s max_concurrency; None: open
    loop).
    """

    lengths: LengthModel
    arrival: Poisson | Gamma | Replay | ServeArrivals
    num_requests: int | None = 1000
    duration_s: float | None = None
    seed: int = 0
    system_prompt_tokens: int = 0
    system_frac: float = 1.0
    turns: Dist | None = None
    think_s: float = 30.0
    samples: int = 1
    beam_width: int = 1
    max_concurrency: int | None = None

    def __post_init__(self):
        if (self.num_requests is None and self.duration_s is None
                and not isinstance(self.arrival, Replay)):
            raise ValueError("give num_requests or duration_s (or both)")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.system_prompt_tokens < 0 or not 0 <= self.system_frac <= 1:
            raise ValueError(f"system prompt needs tokens >= 0 and 0 <= fraction <= 1, got "
                             f"{self.system_prompt_tokens} and {self.system_frac}")
        if self.think_s < 0:
            raise ValueError(f"think_s must be >= 0, got {self.think_s}")
        if self.samples < 1 or self.beam_width < 1 or (self.samples > 1 and self.beam_width > 1):
            raise ValueError(f"samples and beam must be >= 1 and not both > 1, got "
                             f"{self.samples} and {self.beam_width}")

    def __iter__(self) -> Iterator[Request]:
        rng_arrival, rng_length, rng_turns, rng_system, rng_think = seed_streams(self.seed)
        if isinstance(self.arrival, Replay):
            starts = self.arrival.times()
        elif isinstance(self.arrival, ServeArrivals):
            starts = self.arrival.times(rng_arrival)
        else:
            starts = arrival_times(self.arrival, rng_arrival)
        lengths = Buffered(lambda k: np.stack(self.lengths.sample(rng_length, k), axis=1))
        with_system = Buffered(lambda k: rng_system.random(k) < self.system_frac)
        num_turns = (Buffered(lambda k: self.turns.sample(rng_turns, k))
                     if self.turns is not None else None)
        think = Buffered(lambda k: rng_think.exponential(self.think_s, k))
        system_id = derived_id(NS_SYSTEM, 0)
        max_len = self.lengths.max_total_tokens
        fanout = max(self.samples, self.beam_width)

        # pending turns: (arrival_s, tie-break order, conversation state)
        heap: list[tuple[float, int, _Conversation]] = []
        order = 0             # heap tie-break: equal times keep push order
        num_conversations = 0
        next_start = next(starts, None)
        request_id = 0
        while self.num_requests is None or request_id < self.num_requests:
            if heap and (next_start is None or heap[0][0] <= next_start):
                arrival_s, _, conv = heapq.heappop(heap)
            elif next_start is not None:
                arrival_s = next_start
                next_start = next(starts, None)
                system = (self.system_prompt_tokens
                          if self.system_prompt_tokens and with_system.next() else 0)
                user, out = lengths.next()
                conv = _Conversation(
                    conversation_id=num_conversations,
                    num_turns=num_turns.next() if num_turns is not None else 1,
                    history=((system_id, system),) if system else (), history_tokens=system,
                    system_tokens=system, user_tokens=user, output_tokens=out)
                num_conversations += 1
            else:
                return
            if self.duration_s is not None and arrival_s >= self.duration_s:
                return
            conv_id, turn = conv.conversation_id, conv.turn
            if num_turns is None:
                user_segment = derived_id(NS_PROMPT, request_id)
                output_segment_id = None
            else:
                user_segment = derived_id(NS_USER, conv_id, turn)
                output_segment_id = derived_id(NS_TURN_OUTPUT, conv_id, turn)
            segments = conv.history + ((user_segment, conv.user_tokens),)
            prompt = conv.history_tokens + conv.user_tokens
            # look one turn ahead: whether a later turn follows decides what is shareable
            follows = False
            if turn + 1 < conv.num_turns:
                next_user, next_out = lengths.next()
                context = prompt + conv.output_tokens - conv.system_tokens
                if max_len is None or context + next_user + next_out <= max_len:
                    follows = True
            shareable = prompt + conv.output_tokens if follows else conv.history_tokens
            if fanout > 1:
                shareable = max(shareable, prompt)
            yield Request(
                request_id=request_id, arrival_s=arrival_s, prompt_tokens=prompt,
                output_tokens=conv.output_tokens,
                # a lone unique prompt stays () (cheapest); turns need their named segments
                segments=segments if conv.history or num_turns is not None else (),
                output_segment_id=output_segment_id, num_shareable_tokens=shareable,
                conversation_id=conv_id if num_turns is not None else None, turn=turn,
                n=self.samples, beam_width=self.beam_width)
            request_id += 1
            if follows:
                nxt = _Conversation(
                    conversation_id=conv_id, num_turns=conv.num_turns, turn=turn + 1,
                    history=segments + ((output_segment_id, conv.output_tokens),),
                    history_tokens=prompt + conv.output_tokens, system_tokens=conv.system_tokens,
                    user_tokens=next_user, output_tokens=next_out)
                order += 1
                heapq.heappush(heap, (arrival_s + think.next(), order, nxt))


@dataclass(frozen=True, slots=True)
class _Conversation:
    """The next turn of a conversation: its history and its drawn lengths."""

    conversation_id: int
    num_turns: int
    history: tuple[tuple[int, int], ...]
    history_tokens: int
    system_tokens: int
    user_tokens: int
    output_tokens: int
    turn: int = 0


# ----------------------------------------------------------------------------- spec strings
SOURCES = ("sharegpt", "alpaca", "synthetic", "random")
_KEYS = frozenset({"n", "duration_s", "rate", "seed", "arrival", "prompt", "output", "max_len",
                   "system", "system_frac", "turns", "think_s", "samples", "beam"})


def parse_dist(spec: Spec, key: str) -> Dist:
    """A length distribution value: ``N``, ``fixed(N)``, ``uniform(LO,HI)``,
    ``lognormal(MEAN,SIGMA)``."""
    value = spec.params[key]
    try:
        if not isinstance(value, Call):
            return Fixed(to_int(spec, key, value, 1))
        if value.name == "fixed":
            a = call_args(spec, key, value, ("tokens",), 1)
            return Fixed(to_int(spec, key, a["tokens"], 1))
        if value.name == "uniform":
            a = call_args(spec, key, value, ("low", "high"), 2)
            return Uniform(to_int(spec, key, a["low"], 1), to_int(spec, key, a["high"], 1))
        if value.name == "lognormal":
            a = call_args(spec, key, value, ("mean", "sigma"), 2)
            return LogNormal(to_float(spec, key, a["mean"], 0, strict=True),
                             to_float(spec, key, a["sigma"], 0))
    except ValueError as err:
        if isinstance(err, InputError):
            raise
        raise spec.error(key, str(err)) from None
    raise spec.error(key, f"unknown distribution {value.name}(); expected fixed(N), "
                          "uniform(LO,HI) or lognormal(MEAN,SIGMA)")


def _parse_arrival(spec: Spec, rate: float | None) -> Poisson | Gamma | Replay:
    value = spec.params.get("arrival", "poisson")
    if isinstance(value, Call) and value.name == "replay":
        if not value.inner.strip():
            raise spec.error("arrival", "replay() needs a trace path")
        if rate is not None:
            raise spec.error("rate", "a replayed trace has its own arrival times; drop the rate")
        return Replay(value.inner.strip())
    if rate is None:
        raise spec.error("rate", "needs rate= (arrivals per second)")
    if value == "poisson":
        return Poisson(rate)
    if isinstance(value, Call) and value.name == "gamma":
        a = call_args(spec, "arrival", value, ("cv",), 1)
        return Gamma(rate, to_float(spec, "arrival", a["cv"], 0, strict=True))
    shown = value if isinstance(value, str) else value.name + "()"
    raise spec.error("arrival", f"unknown arrival process {shown}; expected poisson, "
                                "gamma(cv=C) or replay(PATH)")


def workload_from_spec(text: str, *, rate: float | None = None, seed: int = 0,
                       num_requests: int | None = None) -> SyntheticWorkload:
    """Build a SyntheticWorkload from a spec string (grammar: module docstring).

    Args:
        text: e.g. ``sharegpt:rate=2,n=1000,seed=0``.
        rate: default arrival rate when the spec has no ``rate=``.
        seed: default seed when the spec has no ``seed=``.
        num_requests: default request count when the spec has neither ``n=`` nor
            ``duration_s=`` (1000 if None).
    Returns:
        The workload (iterate it).
    Raises:
        InputError: unknown source or key, bad value; the message names the key.
    """
    spec = parse_spec(text)
    if spec.name not in SOURCES:
        raise InputError(f"unknown workload '{spec.name}' in '{text}': expected a trace file "
                         f"or one of {', '.join(SOURCES)}")
    if spec.name == "random":
        return _random(spec, rate, seed, num_requests)
    spec.check_keys(_KEYS)
    p = spec.params
    for key, needs in (("system_frac", "system"), ("think_s", "turns")):
        if key in p and needs not in p:
            raise spec.error(key, f"{key}= has no effect without {needs}=")
    if spec.name == "synthetic":
        for key in ("prompt", "output"):
            if key not in p:
                raise spec.error(key, "synthetic workloads need prompt= and output=")
        base = LengthModel(parse_dist(spec, "prompt"), parse_dist(spec, "output"))
    else:
        base = preset_lengths(spec.name)
        if "prompt" in p or "output" in p:
            base = LengthModel(parse_dist(spec, "prompt") if "prompt" in p else base.prompt,
                               parse_dist(spec, "output") if "output" in p else base.output,
                               base.max_total_tokens)
    max_len = base.max_total_tokens
    if "max_len" in p:
        raw = plain(spec, "max_len")
        max_len = None if raw.lower() == "none" else to_int(spec, "max_len", raw, 2)
    if "rate" in p:
        rate = to_float(spec, "rate", plain(spec, "rate"), 0, strict=True)
    elif rate is not None and not rate > 0:
        raise spec.error("rate", f"must be > 0, got {rate}")
    n = to_int(spec, "n", plain(spec, "n"), 1) if "n" in p else None
    duration_s = (to_float(spec, "duration_s", plain(spec, "duration_s"), 0, strict=True)
                  if "duration_s" in p else None)
    replay = isinstance(p.get("arrival"), Call) and p["arrival"].name == "replay"
    if n is None and duration_s is None and not replay:  # a replay ends with its trace
        n = num_requests or 1000
    try:
        lengths = LengthModel(base.prompt, base.output, max_len)
    except ValueError as err:
        raise spec.error("max_len", str(err)) from None
    try:
        return _build(spec, lengths, rate, n, duration_s, seed)
    except ValueError as err:
        if isinstance(err, InputError):
            raise
        raise InputError(f"{err} (in '{text}')") from None


def _build(spec: Spec, lengths: LengthModel, rate: float | None, n: int | None,
           duration_s: float | None, seed: int) -> SyntheticWorkload:
    p = spec.params
    return SyntheticWorkload(
        lengths=lengths,
        arrival=_parse_arrival(spec, rate),
        num_requests=n, duration_s=duration_s,
        seed=to_int(spec, "seed", plain(spec, "seed"), 0) if "seed" in p else seed,
        system_prompt_tokens=(to_int(spec, "system", plain(spec, "system"), 1)
                              if "system" in p else 0),
        system_frac=(to_float(spec, "system_frac", plain(spec, "system_frac"), 0)
                     if "system_frac" in p else 1.0),
        turns=parse_dist(spec, "turns") if "turns" in p else None,
        think_s=to_float(spec, "think_s", plain(spec, "think_s"), 0) if "think_s" in p else 30.0,
        samples=to_int(spec, "samples", plain(spec, "samples"), 1) if "samples" in p else 1,
        beam_width=to_int(spec, "beam", plain(spec, "beam"), 1) if "beam" in p else 1,
    )


# ----------------------------------------------------------------------------- vllm bench serve
_RANDOM_KEYS = frozenset({"n", "isl", "osl", "isl_range", "osl_range", "prefix_len", "rate",
                          "burstiness", "concurrency", "seed"})


def _random(spec: Spec, rate: float | None, seed: int, num_requests: int | None) -> SyntheticWorkload:
    """``vllm bench serve``'s random dataset and its way of sending requests::

        random:isl=1024,osl=128,n=640,concurrency=64[,isl_range=0.1,osl_range=0.1,prefix_len=0,
               rate=inf,burstiness=1,seed=0]

    * ``isl``, ``osl`` (defaults 1024, 128, as vllm bench serve's): each request's input and
      output lengths are integers uniform in ``[floor(L * (1 - r)), ceil(L * (1 + r))]`` with
      ``r`` = ``isl_range`` / ``osl_range`` in [0, 1) (its ``--random-range-ratio``; outputs at
      least 1). Lengths are tokens: no tokenizer's special tokens are taken off.
    * ``prefix_len``: one shared prefix of this many tokens in front of every prompt (the
      prompt is prefix + input, as its ``--random-prefix-len``).
    * ``n`` requests (default 1000), sent at ``rate`` per second (default ``inf``: all at 0)
      with ``burstiness`` (gamma shape; 1 Poisson), as ``ServeArrivals``.
    * ``concurrency``: at most this many in flight, the next sent as one finishes (its
      ``--max-concurrency``; a closed loop when the rate is inf).
    """
    spec.check_keys(_RANDOM_KEYS)
    p = spec.params

    def number(key, default, minimum, *, allow_inf=False, strict=False):
        if key not in p:
            return default
        raw = plain(spec, key)
        if allow_inf and raw.strip().lower() in ("inf", "infinity"):
            return float("inf")
        return to_float(spec, key, raw, minimum, strict=strict)

    isl = to_int(spec, "isl", plain(spec, "isl"), 1) if "isl" in p else 1024
    osl = to_int(spec, "osl", plain(spec, "osl"), 1) if "osl" in p else 128
    dists = []
    for key, length in (("isl_range", isl), ("osl_range", osl)):
        r = number(key, 0.0, 0.0)
        if r >= 1:
            raise spec.error(key, f"must be in [0, 1), got {r:g}")
        low, high = math.floor(length * (1 - r)), math.ceil(length * (1 + r))
        if key == "osl_range":
            low = max(low, 1)         # vllm bench serve never draws an empty output
        elif low < 1:
            raise spec.error(key, f"leaves inputs of {low} tokens (the shortest is "
                                  f"floor({length} x (1 - {r:g}))); at least 1 is needed")
        dists.append(Uniform(low, high) if high > low else Fixed(low))
    lengths = LengthModel(*dists)
    prefix = to_int(spec, "prefix_len", plain(spec, "prefix_len"), 0) if "prefix_len" in p else 0
    n = to_int(spec, "n", plain(spec, "n"), 1) if "n" in p else (num_requests or 1000)
    if "rate" in p:
        rate = number("rate", None, 0.0, allow_inf=True, strict=True)
    elif rate is None:
        rate = float("inf")
    elif not rate > 0:
        raise spec.error("rate", f"must be > 0, got {rate}")
    burstiness = number("burstiness", 1.0, 0.0, allow_inf=True, strict=True)
    concurrency = to_int(spec, "concurrency", plain(spec, "concurrency"), 1) if "concurrency" in p else None
    return SyntheticWorkload(
        lengths=lengths, arrival=ServeArrivals(rate, burstiness, n), num_requests=n,
        seed=to_int(spec, "seed", plain(spec, "seed"), 0) if "seed" in p else seed,
        system_prompt_tokens=prefix, max_concurrency=concurrency)
