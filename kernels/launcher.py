"""Eager-mode launches of a ``@triton.jit`` kernel through its cached compiled kernel.

``fn[grid](*args, **constexprs)`` costs tens of microseconds of Python per call in Triton 3.6: it
binds every argument, computes each one's specialisation (integers equal to 1, 16-divisible values,
16-byte-aligned pointers), hashes them into a cache key and builds launch metadata, for a kernel that
is already compiled. A caller that knows what its arguments' specialisation depends on can skip all
of that: the first call of a specialisation goes through Triton (compiling if needed) and returns the
``CompiledKernel``; later calls with the same ``key`` hand the arguments straight to its launcher.

The key is the caller's promise: every argument that Triton specialises must be a function of it.
``launch`` adds the one thing callers cannot know cheaply, whether all pointers are 16-byte aligned
(calls with an unaligned pointer always go through Triton). Under TRITON_INTERPRET=1, and while a
launch hook is installed (profilers), every call goes through Triton.
"""
from __future__ import annotations

import os

import triton

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _hooks_installed() -> bool:
    # triton 3.6 keeps the hooks in a HookChain (never None); later versions use None for none
    knobs = triton.knobs.runtime
    for hook in (knobs.launch_enter_hook, knobs.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _device_and_stream() -> tuple[int, int]:
    """Triton's current device and its current stream (what ``fn[grid]`` launches on)."""
    driver = triton.runtime.driver.active
    device = driver.get_current_device()
    return device, driver.get_current_stream(device)


class CachedLauncher:
    """Launches one jitted kernel; compiled kernels are kept per (key, device, pointer alignment)."""

    def __init__(self, fn):
        self.fn = fn
        params = [] if _INTERPRET else fn.params  # (the interpreter's functions have no parameter list)
        self.params = [p.name for p in params]
        self.num_runtime = sum(not p.is_constexpr for p in params)
        # the kernel's runtime parameters must come first: the launcher takes all of them in order
        assert all(not p.is_constexpr for p in params[:self.num_runtime]), fn
        self.cache: dict[tuple, tuple] = {}
        self.direct_calls = 0  # launches that skipped Triton's binder (for tests and benchmarks)

    def __call__(self, grid: tuple, args: tuple, constexprs: dict, key, pointers: tuple = ()):
        """Run ``fn[grid](*args, **constexprs)``.

        Args:
            grid: three ints.
            args: the runtime arguments, in the kernel's parameter order.
            constexprs: the constexpr parameters and the launch options (num_warps, num_stages).
            key: hashable; equal keys promise equal constexprs and equal Triton specialisation of
                every int in ``args`` (==1, divisible by 16, 64-bit) and equal dtypes of the tensors.
            pointers: the tensors among ``args`` (their alignment is checked here).
        """
        if _INTERPRET:
            return self.fn[grid](*args, **constexprs)
        aligned = True
        for t in pointers:
            if t.data_ptr() & 15:
                aligned = False
                break
        if not aligned or _hooks_installed():
            return self.fn[grid](*args, **constexprs)
        device, stream = _device_and_stream()
        hit = self.cache.get((key, device))
        if hit is None:
            kernel = self.fn[grid](*args, **constexprs)
            tail = tuple(constexprs[name] for name in self.params[self.num_runtime:])
            self.cache[(key, device)] = (kernel, tail)
            return kernel
        kernel, tail = hit
        kernel.run(grid[0], grid[1], grid[2], stream, kernel.function, kernel.packed_metadata, None, None, None,
                   *args, *tail)
        self.direct_calls += 1
        return kernel
