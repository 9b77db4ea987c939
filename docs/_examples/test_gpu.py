# test_gpu.py
import pytest
from cuda.bindings import driver as d

import cyctx


@pytest.fixture(scope="module")
def guard():  # balanced: retains in setup, releases in teardown
    g = cyctx.ContextGuard(0)
    yield g
    g.close()


@pytest.fixture(scope="module")
def on_device_1():  # pushes a context and never pops it
    err, ctx = d.cuDevicePrimaryCtxRetain(1)
    d.cuCtxPushCurrent(ctx)
    yield


def test_uses_the_guard(guard):
    with guard:
        pass


@pytest.mark.cyctx_allow_context_change(reason="leaves device 1 current for the benchmarks")
def test_sets_up_benchmarks():
    err, ctx = d.cuDevicePrimaryCtxRetain(1)
    d.cuCtxSetCurrent(ctx)


def test_push(guard):  # pushes a context and never pops it
    err, ctx = d.cuDevicePrimaryCtxRetain(0)
    d.cuCtxPushCurrent(ctx)


def test_leaked_guard_entry(on_device_1):
    cyctx.ContextGuard.shared(0).__enter__()
