"""The simulated driver's handle reuse (``Sim.reuse_handles``): off by default, as the H200
behaved (no handle value given again in 64 create/destroy rounds); on, the next cuCtxCreate
takes the handle of the created context destroyed last, with a new id, as drivers that free a
destroyed context's record do. What cyctx does with such a handle is in
tests/guard/test_reused_handles.py."""

import threading

import pytest
from helpers import drivers
from helpers.threads import running

ok = drivers.ok


def _destroyed_context(dev=0):
    """A created context, destroyed: its handle and id."""
    d = drivers.driver()
    ctx = drivers.create_context(dev, current=False)
    cid = ok(d.cuCtxGetId(ctx))
    ok(d.cuCtxDestroy(ctx))
    return int(ctx), cid


def test_off_by_default_a_new_context_never_gets_a_destroyed_handle(sim):
    d = drivers.driver()
    seen = set()
    for _ in range(8):
        h, _ = _destroyed_context()
        assert h not in seen
        seen.add(h)
    fresh = drivers.create_context(current=False)
    try:
        assert int(fresh) not in seen
    finally:
        ok(d.cuCtxDestroy(fresh))


@pytest.mark.parametrize("dev", [0, 1])
def test_on_the_next_context_takes_the_handle_with_a_new_id(reuse, dev):
    d = drivers.driver()
    h, old_id = _destroyed_context(0)
    new = drivers.create_context(dev, flags=4, current=False)
    try:
        assert int(new) == h
        new_id = ok(d.cuCtxGetId(new))
        assert new_id > old_id  # the process-wide counter: never an id given before
        ok(d.cuCtxPushCurrent(new))
        try:
            assert int(ok(d.cuCtxGetDevice())) == dev
            assert ok(d.cuCtxGetFlags()) == 4
        finally:
            ok(d.cuCtxPopCurrent())
        assert reuse.live_contexts() >= 1
    finally:
        ok(d.cuCtxDestroy(new))
    # The handle now names the new context's record: destroyed once, then gone.
    assert d.cuCtxGetId(new)[0] == d.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED


def test_only_the_context_destroyed_last_and_only_once(reuse):
    d = drivers.driver()
    first, _ = _destroyed_context()
    last, _ = _destroyed_context()
    a = drivers.create_context(current=False)
    b = drivers.create_context(current=False)
    try:
        assert int(a) == last
        assert int(b) not in (first, last)
    finally:
        ok(d.cuCtxDestroy(a))
        ok(d.cuCtxDestroy(b))


def test_not_the_handle_of_a_context_some_thread_still_has_current(reuse):
    # The driver keeps a destroyed context's record for the threads that have it current.
    d = drivers.driver()
    made, go, done = [], threading.Event(), threading.Event()

    def holder():
        made.append(drivers.create_context())  # current on this thread
        go.set()
        done.wait(60)
        ok(d.cuCtxPopCurrent())

    with running(holder):
        assert go.wait(60)
        (ctx,) = made
        ok(d.cuCtxDestroy(ctx))  # destroyed while current on the holder
        other = drivers.create_context(current=False)
        assert int(other) != int(ctx)
        done.set()
    # Popped everywhere now: the next context takes it.
    again = drivers.create_context(current=False)
    try:
        assert int(again) == int(ctx)
    finally:
        ok(d.cuCtxDestroy(again))
        ok(d.cuCtxDestroy(other))


def test_turned_off_no_destroyed_handle_is_given_again(sim):
    d = drivers.driver()
    sim.reuse_handles(True)
    try:
        h, _ = _destroyed_context()
    finally:
        sim.reuse_handles(False)
    fresh = drivers.create_context(current=False)
    try:
        assert int(fresh) != h
    finally:
        ok(d.cuCtxDestroy(fresh))


def test_a_primary_contexts_handle_is_never_given_to_a_created_one(reuse):
    d = drivers.driver()
    p = ok(d.cuDevicePrimaryCtxRetain(0))
    ok(d.cuDevicePrimaryCtxRelease(0))  # perhaps its last retain: destroyed, handle kept
    ctx = drivers.create_context(current=False)
    try:
        assert int(ctx) != int(p)
    finally:
        ok(d.cuCtxDestroy(ctx))
