"""A vLLM general plugin that logs every engine step inside vLLM's engine-core process.

vLLM loads ``vllm.general_plugins`` entry points in every process it starts, the engine core
included (``EngineCore.__init__`` calls ``load_general_plugins``). This one wraps the v1
scheduler's ``schedule`` and ``update_from_output`` so that each step leaves one JSON line in
``$KVSIM_STEP_LOG`` (nothing happens when the variable is unset):

    {"sched_t0": .., "sched_t1": .., "done_t": .., "upd_t1": .., "reqs": [[new, ctx_after, kind], ..]}

* ``sched_t0`` / ``sched_t1``: ``time.monotonic()`` around ``schedule()`` (the CPU's scheduling);
* ``done_t``: when ``update_from_output`` is entered, i.e. when the step's sampled tokens are
  back on the CPU; ``upd_t1`` when it returns (output processing);
* per scheduled request: the new tokens, the context after the step (num_computed_tokens once
  the scheduler advanced it) and ``d`` (one token of a request that is past its prompt) or ``p``.

``time.monotonic`` is CLOCK_MONOTONIC, shared by every process of the machine, so the harness's
per-request stamps (taken in the front-end process) line up with these.

The first line is ``{"meta": ...}``: the engine core's resolved scheduler settings and its KV
cache size, as the engine core has them (num_gpu_blocks, block_size, max_num_seqs,
max_num_batched_tokens, the scheduler class, async scheduling, cudagraph capture sizes), and its
Triton's disk cache (``triton_cache``: the folder, and the kernels it held at the first step).

Every Triton JIT compile in the engine core (``JITFunction._do_compile``: a kernel's first launch
with a new specialisation, e.g. an integer argument that is newly 1 or a multiple of 16, or a new
constexpr) leaves ``{"jit": kernel, "t0": .., "t1": .., "key": ..}``: its start and end, and its
specialisation key (cut to KEY_CHARS). vLLM's own JIT monitor logs only each kernel's first.
Triton's post-compile hook leaves ``{"jit_hook": kernel, "t": ..}`` at each compile's end too (a
second witness: the harness's ``jit_hooks.csv``).
"""
from __future__ import annotations

import atexit
import json
import os
import time

_state = {"file": None, "pending": {}, "meta_done": False}
KEY_CHARS = 4000      # a kernel of many arguments (matmul_ogs: ~60) has a long key


def _out():
    if _state["file"] is None:
        path = os.environ["KVSIM_STEP_LOG"]
        # line-buffered: the harness reads the log while this process still runs, and a 1 MiB
        # buffer lost the last 34 s of the fine grid's steps on 2026-12-04
        _state["file"] = open(path, "a", buffering=1)
        atexit.register(_state["file"].flush)
    return _state["file"]


def _meta(sched) -> dict:
    vc = getattr(sched, "vllm_config", None)
    cc = getattr(vc, "compilation_config", None)
    sc = getattr(sched, "scheduler_config", None)
    kv = getattr(sched, "kv_cache_config", None)
    return {
        "scheduler_class": type(sched).__name__,
        "num_gpu_blocks": getattr(kv, "num_blocks", None),
        "block_size": getattr(getattr(sched, "cache_config", None), "block_size", None),
        "max_num_seqs": getattr(sc, "max_num_seqs", None),
        "max_num_batched_tokens": getattr(sc, "max_num_batched_tokens", None),
        "async_scheduling": getattr(sc, "async_scheduling", None),
        "enable_chunked_prefill": getattr(sc, "enable_chunked_prefill", None),
        "cudagraph_capture_sizes": list(getattr(cc, "cudagraph_capture_sizes", None) or []),
        "cudagraph_mode": str(getattr(cc, "cudagraph_mode", None)),
        "pid": os.getpid(),
        "triton_cache": triton_cache(),
    }


def triton_cache() -> dict:
    """Where this process's Triton keeps compiled kernels on disk (``knobs.cache.dir``: the
    TRITON_CACHE_DIR variable, else ~/.triton/cache) and how many it holds (``entries``: one
    folder a compiled specialisation; None where there is no such folder). A kernel found there is
    loaded, not compiled: a second engine on the machine pays its compiles again only where the
    folder differs or misses (gpt-oss-20b-cached paid them all again, 2026-12-07)."""
    try:
        from triton import knobs
        path = knobs.cache.dir
    except (ImportError, AttributeError):     # no Triton, or one without knobs: its default
        path = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    try:
        entries = sum(1 for e in os.scandir(path) if e.is_dir())
    except OSError:
        entries = None
    return {"dir": str(path), "entries": entries}


def time_compiles(jit_function) -> bool:
    """Wrap ``jit_function._do_compile`` (triton.runtime.jit.JITFunction's; any signature) so each
    compile writes its line; False where there is none to wrap (another Triton) or it is wrapped."""
    compile_ = getattr(jit_function, "_do_compile", None)
    if compile_ is None or getattr(jit_function, "_kvsim_probe", False):
        return False

    def timed_compile(self, *args, **kwargs):
        t0 = time.monotonic()
        try:
            return compile_(self, *args, **kwargs)
        finally:
            key = args[0] if args else kwargs.get("key")
            name = getattr(getattr(self, "fn", None), "__qualname__", type(self).__name__)
            # the key lists each argument's specialisation in order: their names say which changed
            args = ",".join(getattr(self, "arg_names", None) or ())
            _out().write(json.dumps({"jit": name, "t0": t0, "t1": time.monotonic(), "key": str(key)[:KEY_CHARS],
                                     "args": args}, separators=(",", ":")) + "\n")

    jit_function._do_compile = timed_compile
    jit_function._kvsim_probe = True
    return True


def witness_compiles(knobs) -> bool:
    """Chain a hook onto Triton's ``knobs.runtime.jit_post_compile_hook`` (the hook vLLM's JIT
    monitor uses) that leaves ``{"jit_hook": kernel, "t": ..}`` at each compile's end: a second
    witness beside the ``_do_compile`` wrapper (vLLM logged Qwen3-30B-A3B's ``fused_moe_kernel``
    compiling in fresh engines where the wrapper timed none). False where there is no such knob."""
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        return False
    existing = runtime.jit_post_compile_hook

    def hook(**kwargs):
        fn = kwargs.get("fn")
        name = getattr(fn, "name", None) or getattr(getattr(fn, "fn", None), "__qualname__", "?")
        _out().write(json.dumps({"jit_hook": name, "t": time.monotonic()}, separators=(",", ":")) + "\n")
        return existing(**kwargs) if existing is not None else None

    runtime.jit_post_compile_hook = hook
    return True


def register() -> None:
    """The entry point: patch the scheduler (and Triton's compiles) once per process, when logging
    is asked for."""
    if not os.environ.get("KVSIM_STEP_LOG"):
        return
    from vllm.v1.core.sched.scheduler import Scheduler

    try:
        from triton.runtime.jit import JITFunction
    except ImportError:         # no Triton: no compiles to time
        pass
    else:
        time_compiles(JITFunction)
        try:
            from triton import knobs
        except ImportError:     # an older Triton: the wrapper alone
            pass
        else:
            witness_compiles(knobs)

    if getattr(Scheduler, "_kvsim_probe", False):
        return
    schedule, update = Scheduler.schedule, Scheduler.update_from_output

    def probed_schedule(self):
        t0 = time.monotonic()
        out = schedule(self)
        t1 = time.monotonic()
        if not _state["meta_done"]:
            _state["meta_done"] = True
            _out().write(json.dumps({"meta": _meta(self)}) + "\n")
        reqs = []
        for req_id, new in out.num_scheduled_tokens.items():
            req = self.requests.get(req_id)
            if req is None:
                continue
            ctx = req.num_computed_tokens
            before = ctx - new
            kind = "d" if new == 1 and before >= req.num_prompt_tokens else "p"
            reqs.append((new, ctx, kind))
        if reqs:
            _state["pending"][id(out)] = (t0, t1, reqs)
        return out

    def probed_update(self, scheduler_output, model_runner_output):
        done = time.monotonic()
        result = update(self, scheduler_output, model_runner_output)
        rec = _state["pending"].pop(id(scheduler_output), None)
        if rec is not None:
            t0, t1, reqs = rec
            _out().write(json.dumps({"sched_t0": t0, "sched_t1": t1, "done_t": done,
                                     "upd_t1": time.monotonic(), "reqs": reqs},
                                    separators=(",", ":")) + "\n")
        return result

    Scheduler.schedule = probed_schedule
    Scheduler.update_from_output = probed_update
    Scheduler._kvsim_probe = True
