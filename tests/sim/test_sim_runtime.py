"""The simulated driver's runtime imitation (``Sim.cuda_set_device``, ``Sim.cuda_device_reset``):
what a CUDA 12+ libcudart's cudaSetDevice and cudaDeviceReset do to the driver's state, made
through the driver's own entry points (counted, faultable, traced), as on the H200
(docs/evidence.md, "CUPTI callbacks", "Since CUDA 12.0, cudaSetDevice activates the primary
context", "cudaSetDevice inside a block replaces the top of the stack"). What a trace sees of
them is in tests/trace/test_trace_runtime.py."""

import threading

import pytest
from helpers import drivers
from helpers.forking import run_forked
from helpers.threads import in_thread, run_threads

ok = drivers.ok
CALLS = ("cuInit", "cuCtxSetCurrent", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxReset")


def counts(sim):
    return {name: sim.call_count(name) for name in CALLS}


def grown(sim, before):
    return {k: v - before[k] for k, v in counts(sim).items() if v != before[k]}


@pytest.fixture
def rt(sim):
    """The runtime, with its retains given back after the test (a reset per device it set)."""
    assert not sim.primary_active(0) and not sim.primary_active(1), "a primary left active"
    base = [sim.retain_count(k) for k in (0, 1)]
    yield sim
    for k in (0, 1):
        if sim.retain_count(k) != base[k]:
            in_thread(lambda k=k: (sim.cuda_set_device(k), sim.cuda_device_reset()))
    assert [sim.retain_count(k) for k in (0, 1)] == base


def test_set_device_makes_the_primary_current_and_retains_it_once(rt):
    d = drivers.driver()

    def first():
        before = counts(rt)
        assert rt.cuda_set_device(1) == 0
        p = drivers.current()
        assert p == int(ok(d.cuDevicePrimaryCtxRetain(1)))  # the device's primary context
        ok(d.cuDevicePrimaryCtxRelease(1))
        assert rt.stack_depth() == 1 and rt.primary_active(1)
        return p, grown(rt, before)

    p, calls = in_thread(first)
    # cuInit (the runtime initialises the driver), the set, the runtime's own retain; the
    # retain and release pair of the check above are counted too.
    assert calls == {"cuInit": 1, "cuCtxSetCurrent": 1, "cuDevicePrimaryCtxRetain": 2}
    assert rt.retain_count(1) == 1  # the runtime's

    def again():
        assert rt.cuda_set_device(1) == 0 and rt.cuda_set_device(1) == 0
        return drivers.current()

    # Again, and on two other threads at once: made current, never retained again (the counts
    # are the process's, so they are taken around both threads).
    before = counts(rt)
    assert run_threads(again, again) == [p, p]
    assert grown(rt, before) == {"cuInit": 4, "cuCtxSetCurrent": 4}
    assert rt.retain_count(1) == 1


def test_set_device_replaces_the_top_of_the_stack(rt):
    d = drivers.driver()

    def body():
        p0 = ok(d.cuDevicePrimaryCtxRetain(0))
        ok(d.cuCtxPushCurrent(p0))
        assert rt.cuda_set_device(1) == 0
        assert rt.stack_depth() == 1 and drivers.current() != int(p0)
        popped = ok(d.cuCtxPopCurrent())
        ok(d.cuDevicePrimaryCtxRelease(0))
        return int(popped) == int(ok(d.cuDevicePrimaryCtxRetain(1)))

    assert in_thread(body)
    ok(d.cuDevicePrimaryCtxRelease(1))


def test_first_set_device_on_many_threads_takes_one_retain(rt):
    start = threading.Barrier(8)

    def first():
        start.wait()
        return rt.cuda_set_device(0)

    assert run_threads(*[first] * 8) == [0] * 8
    assert rt.retain_count(0) == 1


@pytest.mark.parametrize("bad", [-1, 2, 64, 2**31 - 1])
def test_a_device_that_does_not_exist_is_refused_with_nothing_changed(rt, bad):
    def body():
        before = counts(rt)
        code = rt.cuda_set_device(bad)
        return code, grown(rt, before), rt.stack_depth()

    code, calls, depth = in_thread(body)
    assert code == drivers.driver().CUresult.CUDA_ERROR_INVALID_DEVICE
    assert calls == {"cuInit": 1} and depth == 0
    assert rt.retain_count(0) == rt.retain_count(1) == 0


def test_a_failing_set_current_fails_it_before_any_retain(rt):
    def body():
        rt.inject_fault("cuCtxSetCurrent", 999)
        return rt.cuda_set_device(0), rt.stack_depth()

    assert in_thread(body) == (999, 0)
    assert rt.retain_count(0) == 0 and not rt.primary_active(0)


def test_a_failing_retain_leaves_the_primary_bound_inactive_and_is_retried(rt):
    # The state a pre-12 runtime leaves (docs/evidence.md, "Before CUDA 12.0, cudaSetDevice
    # leaves the primary context inactive"), here from a failure; the next call retains.
    def body():
        rt.inject_fault("cuDevicePrimaryCtxRetain", 2)
        code = rt.cuda_set_device(0)
        bound = drivers.current() != 0 and not rt.primary_active(0)
        return code, bound, rt.cuda_set_device(0), rt.primary_active(0)

    assert in_thread(body) == (2, True, 0, True)
    assert rt.retain_count(0) == 1


def test_device_reset_resets_the_current_device_and_gives_up_the_runtimes_retain(rt):
    d = drivers.driver()

    def body():
        assert rt.cuda_set_device(1) == 0
        p = ok(d.cuCtxGetCurrent())
        old = ok(d.cuCtxGetId(p))
        mine = ok(d.cuDevicePrimaryCtxRetain(1))  # a retain of the program's: it survives
        before = counts(rt)
        assert rt.cuda_device_reset() == 0
        calls = grown(rt, before)
        # The handle stays current, dead ("A reset leaves a dead handle current").
        dead = int(ok(d.cuCtxGetCurrent())) == int(p) and not rt.primary_active(1)
        kept = rt.retain_count(1)
        assert rt.cuda_set_device(1) == 0  # retains again, a new context at the same handle
        new = ok(d.cuCtxGetId(p))
        ok(d.cuCtxSetCurrent(None))
        ok(d.cuDevicePrimaryCtxRelease(1))
        return int(mine) == int(p), calls, dead, kept, new != old

    # No driver call a program could see: the runtime resets the context itself.
    assert in_thread(body) == (True, {"cuInit": 1}, True, 1, True)


def test_device_reset_without_a_current_context_resets_the_threads_device(rt):
    def body():
        assert rt.cuda_set_device(1) == 0
        ok(drivers.driver().cuCtxSetCurrent(None))
        assert rt.cuda_device_reset() == 0
        return rt.primary_active(1), rt.retain_count(1)

    assert in_thread(body) == (False, 0)


def test_in_a_forked_child_every_runtime_call_fails_not_initialised(rt):
    assert in_thread(rt.cuda_set_device, 0) == 0

    def child():
        return rt.cuda_set_device(0), rt.cuda_device_reset()

    assert run_forked(child) == (3, 3)
