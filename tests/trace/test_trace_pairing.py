"""A "context created" or "context destroy starting" event is reported from inside a call; the
trace names the call (``via``) and gives the context the id and device that call's exit tells,
on the event's own thread. Two threads making the same call at once, on different devices, each
get their own: the simulated driver holds one thread's call as it returns, after its event
(``Sim.stall(at_return=True)``), while the other thread's call runs whole in between."""

import threading
import time

import pytest
from helpers import drivers
from helpers.threads import in_thread, running

import cyctx
from cyctx._trace import ContextRef

ok = drivers.ok


@pytest.fixture
def d(sim):
    assert not sim.primary_active(0) and not sim.primary_active(1), "a primary left active"
    return drivers.driver()


def _wait_stalled(sim):
    deadline = time.monotonic() + 60
    while not sim.stalled():
        assert time.monotonic() < deadline, "the call was never held"
        time.sleep(0.002)


def _tagged(fn):
    return lambda: (threading.get_native_id(), fn())


def _overlapped(sim, call, first, second):
    """first() on a thread whose ``call`` is held as it returns; second() on another thread
    meanwhile, whole. Each returns what its resource event must say; returns both with their
    thread ids."""
    sim.stall(call, at_return=True)
    with running(_tagged(first)) as held:
        try:
            _wait_stalled(sim)
            other = in_thread(_tagged(second))
        finally:
            sim.unstall()
    return held[0], other


def _check(t, *threads):
    for tid, (via, handle, cid, dev) in threads:
        (e,) = [
            e
            for e in t.events
            if e.domain == "resource" and e.thread == tid and e.target.handle == handle
        ]
        exit_ = next(x for x in t.events if x.thread == tid and x.domain != "resource")
        assert e.via == exit_.call and e.via.startswith(via), (e.via, exit_.call)
        assert e.target == ContextRef(handle, cid, dev), e.describe()
    # The interleaving the test is about: the held thread's event, then the other thread's
    # whole call, then the held thread's exit.
    (a, _), (b, _) = threads
    order = [(e.thread, e.domain == "resource") for e in t.events if e.thread in (a, b)]
    assert order.index((a, True)) < order.index((b, False)) < order.index((a, False)), order


def test_two_threads_activating_primaries_of_different_devices(sim, d):
    def retain(dev):
        def run():
            p = ok(d.cuDevicePrimaryCtxRetain(dev))
            return "cuDevicePrimaryCtxRetain", int(p), ok(d.cuCtxGetId(p)), dev

        return run

    try:
        with cyctx.trace() as t:
            a, b = _overlapped(sim, "cuDevicePrimaryCtxRetain", retain(0), retain(1))
        _check(t, a, b)
    finally:
        ok(d.cuDevicePrimaryCtxRelease(0))
        ok(d.cuDevicePrimaryCtxRelease(1))


@pytest.mark.parametrize("seen", [True, False], ids=["seen before", "never seen"])
def test_two_threads_resetting_different_devices(sim, d, seen):
    # A context the trace saw before keeps the id and device it was seen with; one it never saw
    # gets the device its reset names, and no id (the driver is not asked inside the event).
    def reset(dev, p, cid):
        def run():
            ok(d.cuDevicePrimaryCtxReset(dev))
            return "cuDevicePrimaryCtxReset", int(p), cid if seen else None, dev

        return run

    try:
        t = cyctx.trace()
        if seen:
            t.start()
        p0, p1 = (ok(d.cuDevicePrimaryCtxRetain(k)) for k in (0, 1))
        i0, i1 = ok(d.cuCtxGetId(p0)), ok(d.cuCtxGetId(p1))
        if not seen:
            t.start()
        try:
            a, b = _overlapped(sim, "cuDevicePrimaryCtxReset", reset(0, p0, i0), reset(1, p1, i1))
        finally:
            t.stop()
        _check(t, a, b)
    finally:
        ok(d.cuDevicePrimaryCtxRelease(0))
        ok(d.cuDevicePrimaryCtxRelease(1))


def test_two_threads_creating_contexts_on_different_devices(sim, d):
    made = []

    def create(dev):
        def run():
            c = drivers.create_context(dev, current=False)
            made.append(c)
            return "cuCtxCreate", int(c), ok(d.cuCtxGetId(c)), dev

        return run

    try:
        with cyctx.trace() as t:
            a, b = _overlapped(sim, "cuCtxCreate", create(0), create(1))
        _check(t, a, b)
    finally:
        for c in made:
            ok(d.cuCtxDestroy(c))


def test_two_threads_destroying_contexts_of_different_devices(sim, d):
    def destroy(c, cid, dev):
        def run():
            ok(d.cuCtxDestroy(c))
            return "cuCtxDestroy", int(c), cid, dev

        return run

    with cyctx.trace() as t:
        c0, c1 = (drivers.create_context(k, current=False) for k in (0, 1))
        i0, i1 = ok(d.cuCtxGetId(c0)), ok(d.cuCtxGetId(c1))
        a, b = _overlapped(sim, "cuCtxDestroy", destroy(c0, i0, 0), destroy(c1, i1, 1))
    _check(t, a, b)


def test_an_event_names_its_own_threads_call_while_another_thread_is_inside_another(sim, d):
    made = []

    def reset(p, cid):
        def run():
            ok(d.cuDevicePrimaryCtxReset(0))
            return "cuDevicePrimaryCtxReset", int(p), cid, 0

        return run

    def create():
        c = drivers.create_context(1, current=False)
        made.append(c)
        return "cuCtxCreate", int(c), ok(d.cuCtxGetId(c)), 1

    try:
        with cyctx.trace() as t:
            p = ok(d.cuDevicePrimaryCtxRetain(0))
            a, b = _overlapped(
                sim, "cuDevicePrimaryCtxReset", reset(p, ok(d.cuCtxGetId(p))), create
            )
        _check(t, a, b)
    finally:
        ok(d.cuDevicePrimaryCtxRelease(0))
        for c in made:
            ok(d.cuCtxDestroy(c))


def test_an_event_whose_call_left_no_exit_takes_no_later_calls_id_or_device(sim, d):
    # The buffer was full at the exit of the call the event ran inside: the thread's next call
    # of the same name, later, is another call, and tells nothing of this event's context.
    try:
        with cyctx.trace(capacity=2, quiet=True) as t:
            p0 = ok(d.cuDevicePrimaryCtxRetain(0))  # seen: its id and device are known
            t.collect()
            ok(d.cuCtxSetCurrent(None))  # fills the first slot
            ok(d.cuDevicePrimaryCtxReset(0))  # its event takes the last slot, its exit is lost
            t.collect()
            ok(d.cuDevicePrimaryCtxRetain(1))
            t.collect()
            ok(d.cuDevicePrimaryCtxReset(1))  # the same call, on device 1: its exit is kept
        assert t.dropped >= 1
        gone = t.who_destroyed(int(p0))
        assert len(gone) == 1 and gone[0].via == "cuDevicePrimaryCtxReset_v2"
        assert gone[0].target.device == 0 and gone[0].target.id is not None
    finally:
        ok(d.cuDevicePrimaryCtxRelease(0))
        ok(d.cuDevicePrimaryCtxRelease(1))


def test_a_handle_the_driver_gave_again_is_two_contexts_told_by_id(sim, d):
    # The simulator's handle reuse: a destroyed context's handle given to the next one.
    sim.reuse_handles(True)
    try:
        with cyctx.trace() as t:
            a = drivers.create_context(0, current=False)
            ida = ok(d.cuCtxGetId(a))
            ok(d.cuCtxDestroy(a))
            b = drivers.create_context(1, current=False)
            idb = ok(d.cuCtxGetId(b))
            ok(d.cuCtxDestroy(b))
    finally:
        sim.reuse_handles(False)
    assert int(a) == int(b)
    old, new = ContextRef(int(a), ida, 0), ContextRef(int(b), idb, 1)
    assert [e.target for e in t.events if e.call == "context created"] == [old, new]
    gone_a, gone_b = t.who_destroyed(int(a))
    assert (gone_a.target, gone_b.target) == (old, new)
    assert t.who_destroyed(old) == [gone_a] and t.who_destroyed(new) == [gone_b]
