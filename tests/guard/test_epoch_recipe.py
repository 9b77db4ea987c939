"""The recipe of docs/reset-fork.md, "A cache keyed by the epoch", run as the page shows it: one
build per live context, a new one after a reset and for a new context at any handle."""

import os
import re
import warnings

import pytest
from helpers.drivers import create_context, driver, ok, reset_primary

from cyctx import ContextGuard, ContextResetWarning

PAGE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "docs",
    "reset-fork.md",
)


def recipe():
    with open(PAGE, encoding="utf-8") as f:
        text = f.read()
    section = text.split("## A cache keyed by the epoch", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    ns = {}
    exec(compile(code, PAGE, "exec"), ns)
    return ns["KernelCache"]


def test_one_build_per_context_lifetime():
    built = []
    cache = recipe()(lambda: built.append(object()) or built[-1])
    g = ContextGuard(0)
    try:
        first = cache.get(g)
        assert cache.get(g) is first and len(built) == 1
        reset_primary(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ContextResetWarning)
            second = cache.get(g)  # same handle, new context: built again
        assert second is not first and len(built) == 2
        assert cache.get(g) is second and len(built) == 2
        assert len(cache._entries) == 1, "the stale entry was replaced, not kept"
    finally:
        g.close()


def test_a_new_context_is_built_for_even_at_a_reused_handle_value():
    # Whatever handle value the driver gives a new context, its epoch is new: build again.
    d = driver()
    built = []
    cache = recipe()(lambda: built.append(object()) or built[-1])
    for n in range(1, 4):
        ctx = create_context(0, current=False)
        g = ContextGuard(ctx)
        try:
            cache.get(g)
            cache.get(g)
        finally:
            g.close()
            ok(d.cuCtxDestroy(ctx))
        assert len(built) == n


PTX = b"""
.version 7.0
.target sm_50
.address_size 64
.visible .entry noop() { ret; }
"""


def launch(kernel):
    """Launch a parameterless kernel on one thread of the current context's default stream:
    cuda.bindings takes the stream as an int or CUstream, kernelParams as None, and `extra` as
    an int address (0: none), never None."""
    d = driver()
    return d.cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, 0, None, 0)


def test_the_launch_passes_arguments_cuda_bindings_takes(sim):
    # The simulated driver has no cuLaunchKernel: cuda.bindings converts every argument first
    # and only then finds the function missing, so an argument of a type it does not take
    # (extra=None: "an integer is required") fails here, not first on a GPU. (On the real
    # driver the GPU test below launches for real.)
    with pytest.raises(Exception) as e:
        launch(driver().CUfunction(0))
    assert not isinstance(e.value, TypeError) and "cuLaunchKernel" in str(e.value), e.value


@pytest.mark.gpu
def test_a_cached_kernel_is_loaded_again_after_a_reset_and_launches():
    d = driver()

    def build():
        module = ok(d.cuModuleLoadData(PTX))
        return ok(d.cuModuleGetFunction(module, b"noop"))

    cache = recipe()(build)
    g = ContextGuard(0)
    try:
        k1, e1 = cache.get(g), g.epoch
        with g:
            assert launch(k1)[0] == d.CUresult.CUDA_SUCCESS, launch(k1)
            ok(d.cuCtxSynchronize())
        reset_primary(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ContextResetWarning)
            k2 = cache.get(g)
        assert g.epoch != e1 and cache._entries[g.handle] == (g.epoch, k2) and k2 is not k1, (
            e1,
            g.epoch,
            cache._entries,
        )
        with g:
            err = launch(k2)[0]
            assert err == d.CUresult.CUDA_SUCCESS, err
            ok(d.cuCtxSynchronize())
    finally:
        g.close()
