"""The cases of tests/guard/test_bind.py, run in a process of their own (that test starts it):
the device bindings use the shared guards, which keep their retain for the life of the process.

cyctx.bind: a function bound to a device or to the context current at bind runs inside it on
whatever thread calls it (executors, asyncio.to_thread, run_in_executor), restoring that thread's
state; a dead bound context is refused; pickling travels as the device only."""

import asyncio
import pickle
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

import cyctx
from cyctx import ContextGuard, ContextResetWarning
from helpers.drivers import create_context, current, driver, ok, reset_primary


@pytest.fixture(scope="module", autouse=True)
def _shared_guards():
    # Before each test's state check: the shared guards' retains (taken at their first use)
    # are the process's from here.
    for k in (0, 1):
        with ContextGuard.shared(k):
            pass


@pytest.fixture
def guard():
    g = ContextGuard(0)
    yield g
    g.close()


def where():
    """What the calling thread has current: (handle, device)."""
    return cyctx.current_handle(), cyctx.current_device()


def in_worker(fn):
    """fn() on a fresh one-thread pool, then what that worker had current after it."""
    with ThreadPoolExecutor(1) as pool:
        value = pool.submit(fn).result()
        after = pool.submit(where).result()
    return value, after


def test_bound_to_a_device_runs_there_on_a_worker_and_leaves_it_clean():
    b = cyctx.bind(where, device=1)
    (h, dev), after = in_worker(b)
    assert dev == 1 and h == ContextGuard.shared(1).handle
    assert after == (0, None), "the worker's own state is restored"


def test_decorator_form():
    @cyctx.bind(device=1)
    def f(x):
        return x, cyctx.current_device()

    assert in_worker(lambda: f(7))[0] == (7, 1)
    assert f.__name__ == "f"


def test_bind_takes_the_context_current_now(guard):
    with guard:
        b = cyctx.bind(where)
    assert in_worker(b)[0] == (guard.handle, 0)
    assert "device 0" in repr(b)


def test_nothing_current_and_no_device_is_a_guard_error():
    assert current() == 0
    with pytest.raises(cyctx.GuardError, match="no context is current.*device=k"):
        cyctx.bind(where)


def test_the_calling_threads_context_is_restored_even_when_fn_raises(guard):
    def boom():
        raise KeyError(cyctx.current_device())

    b = cyctx.bind(boom, device=1)
    with guard:
        with pytest.raises(KeyError) as e:
            b()
        assert e.value.args == (1,) and current() == guard.handle
    assert current() == 0


def test_a_bound_created_context_runs_until_destroyed_then_is_refused():
    d = driver()
    ctx = create_context(0)  # pushed: current on this thread
    try:
        b = cyctx.bind(where)
    finally:
        ok(d.cuCtxPopCurrent())
    assert in_worker(b)[0][0] == int(ctx)
    with pytest.raises(TypeError, match="cannot be pickled.*device=k"):
        pickle.dumps(b)
    ok(d.cuCtxDestroy(ctx))
    calls_before = current()
    with pytest.raises(cyctx.ContextDestroyedError, match="destroyed since bind"):
        in_worker(b)
    assert current() == calls_before == 0


def test_binding_a_destroyed_current_context_is_refused():
    d = driver()
    ctx = create_context(0)
    ok(d.cuCtxPopCurrent())
    ok(d.cuCtxDestroy(ctx))
    ok(d.cuCtxPushCurrent(ctx))  # a dead handle current, as after another thread's destroy
    try:
        with pytest.raises(cyctx.ContextDestroyedError, match="nothing to bind"):
            cyctx.bind(where)
    finally:
        ok(d.cuCtxPopCurrent())


def test_a_reset_primary_is_reactivated_as_a_guard_does():
    b = cyctx.bind(where, device=0)
    assert b()[1] == 0
    reset_primary(0)
    with pytest.warns(ContextResetWarning):
        h, dev = in_worker(b)[0]
    assert dev == 0 and cyctx.context_epoch(h) is not None


def test_pickled_device_binding_is_the_same_binding():
    b = cyctx.bind(where, device=1)
    back = pickle.loads(pickle.dumps(b))
    assert back is not b and in_worker(back)[0][1] == 1 and repr(back) == repr(b)


def test_asyncio_to_thread_and_run_in_executor():
    b = cyctx.bind(where, device=1)

    async def main():
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(2) as pool:
            r1 = await loop.run_in_executor(pool, b)
        r2 = await asyncio.to_thread(b)
        return r1[1], r2[1]

    assert asyncio.run(main()) == (1, 1)


def test_many_threads_at_once():
    b = cyctx.bind(lambda i: (i, cyctx.current_device()), device=1)
    with ThreadPoolExecutor(8) as pool:
        out = list(pool.map(b, range(200)))
    assert out == [(i, 1) for i in range(200)]


# (What runs in steps, refused at bind: tests/guard/test_bind_edges.py, with the decorator's.)
@pytest.mark.parametrize(
    "args, kwargs, error, words",
    [
        ((42,), {"device": 0}, TypeError, "takes a function (any callable)"),
        ((), {}, TypeError, "needs a function or a device"),
        ((where,), {"device": "x"}, TypeError, ""),
        ((where,), {"device": 2**31}, cyctx.InvalidDeviceError, ""),
    ],
    ids=["not-callable", "nothing", "bad-device", "no-device-has-it"],
)
def test_bad_input_is_refused_at_bind(args, kwargs, error, words):
    with pytest.raises(error) as e:
        cyctx.bind(*args, **kwargs)
    assert words in str(e.value)
    assert current() == 0


def test_a_device_that_does_not_exist_is_refused_at_the_first_call():
    # Binding asks nothing of the driver (a decorator at import initialises nothing): the
    # device is checked at the first call, which changes nothing.
    b = cyctx.bind(where, device=10**6)
    for _ in range(2):
        with pytest.raises(cyctx.InvalidDeviceError, match="Device 1000000 does not exist"):
            in_worker(b)
    assert current() == 0


def test_no_warning_on_the_ordinary_path():
    b = cyctx.bind(where, device=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert in_worker(b)[0][1] == 0
