"""kvsim.kernels.launcher.CachedLauncher: eager launches that skip Triton's per-call binding once a
specialisation is compiled. CI has no GPU, so a stand-in kernel records what reaches Triton and what
reaches the compiled kernel's launcher; the GPU benchmark (bench/kernels.py, eager section) measures
the real thing."""
import inspect

import pytest

import kvsim.kernels.attention as attention
import kvsim.kernels.launcher as launcher


class Param:
    def __init__(self, name, is_constexpr):
        self.name, self.is_constexpr = name, is_constexpr


class Tensor:
    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr


class Compiled:
    function, packed_metadata = "function", "metadata"

    def __init__(self, log):
        self.log = log

    def run(self, *call):
        self.log.append(("direct", call))


class Kernel:
    """What CachedLauncher uses of a JITFunction: params and fn[grid](*args, **kwargs)."""
    params = [Param("x_ptr", False), Param("n", False), Param("BLOCK", True), Param("MODE", True)]

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.log.append(("triton", grid, args, kwargs))
            return Compiled(self.log)
        return call


@pytest.fixture
def gpu_like(monkeypatch):
    monkeypatch.setattr(launcher, "_INTERPRET", False)
    monkeypatch.setattr(launcher, "_device_and_stream", lambda: (0, 77))
    monkeypatch.setattr(launcher, "_hooks_installed", lambda: False)


def test_second_call_of_a_key_goes_straight_to_the_compiled_kernel(gpu_like):
    kernel = Kernel()
    launch = launcher.CachedLauncher(kernel)
    x = Tensor(4096)
    kw = dict(MODE=2, BLOCK=64, num_warps=4)  # any order: the launcher passes them in parameter order
    launch((3, 1, 1), (x, 10), kw, key="a", pointers=(x,))
    assert [e[0] for e in kernel.log] == ["triton"] and launch.direct_calls == 0
    launch((5, 2, 1), (x, 11), kw, key="a", pointers=(x,))
    assert kernel.log[-1] == ("direct", (5, 2, 1, 77, "function", "metadata", None, None, None, x, 11, 64, 2))
    assert launch.direct_calls == 1
    launch((5, 2, 1), (x, 11), kw, key="b", pointers=(x,))  # another specialisation: through Triton
    assert kernel.log[-1][0] == "triton"


def test_unaligned_pointers_and_hooks_go_through_triton(gpu_like, monkeypatch):
    kernel = Kernel()
    launch = launcher.CachedLauncher(kernel)
    aligned, unaligned = Tensor(4096), Tensor(4098)
    launch((1, 1, 1), (aligned, 1), dict(BLOCK=16, MODE=0), key="k", pointers=(aligned,))
    launch((1, 1, 1), (unaligned, 1), dict(BLOCK=16, MODE=0), key="k", pointers=(unaligned,))
    assert kernel.log[-1][0] == "triton"  # Triton specialises on 16-byte alignment
    monkeypatch.setattr(launcher, "_hooks_installed", lambda: True)  # a profiler's launch hook
    launch((1, 1, 1), (aligned, 1), dict(BLOCK=16, MODE=0), key="k", pointers=(aligned,))
    assert kernel.log[-1][0] == "triton" and launch.direct_calls == 0


def test_interpreter_always_goes_through_triton():
    kernel = Kernel()
    launch = launcher.CachedLauncher(kernel)  # conftest set TRITON_INTERPRET=1
    for _ in range(2):
        launch((1, 1, 1), (Tensor(0), 1), dict(BLOCK=16, MODE=0), key="k")
    assert [e[0] for e in kernel.log] == ["triton", "triton"]


@pytest.mark.parametrize("kernel", [attention._attention_kernel, attention._reduce_partitions_kernel])
def test_attention_kernels_take_their_runtime_arguments_first(kernel):
    # the compiled kernel's launcher takes every parameter in order: runtime ones, then constexprs
    params = list(inspect.signature(kernel.fn).parameters.values())
    kinds = ["constexpr" in str(p.annotation) for p in params]
    assert kinds == sorted(kinds) and any(kinds)


def test_a_plan_made_again_gets_a_new_launch_key(monkeypatch):
    # bench/kernels.py times rule variants by changing module constants and clearing the plan
    # caches: the launches of the new plan must not reuse the compiled kernel of the old one
    import torch
    from test_kernels_unified import make_batch, run
    keys = []
    real = attention._ATTENTION
    monkeypatch.setattr(attention, "_ATTENTION", lambda grid, args, kw, key, pointers: (
        keys.append(key), real(grid, args, kw, key, pointers)))
    case = make_batch(contexts=[5, 40], q_lens=[3, 1], seed=3)
    first = run(case)
    assert torch.equal(first, run(case)) and keys[0] == keys[1]  # the same launch: the same key
    attention._PLANS.clear()
    attention._STATIC.clear()
    assert torch.equal(first, run(case)) and keys[2] != keys[0]
