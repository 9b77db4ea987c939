"""ContextGuard: the promises of docs/guarantees.md, on either driver."""

import sys
import threading
from functools import partial

import pytest

import cyctx
from cyctx import ContextGuard, DriverError, GuardError, InvalidContextError, InvalidDeviceError

from helpers.children import run_child
from helpers.drivers import SIM_DEVICES, current, device_count, driver, ok, primary_state
from helpers.threads import in_thread, run_threads


@pytest.fixture
def guard():
    g = ContextGuard(0)
    yield g
    g.close()


@pytest.fixture
def guard1():
    if device_count() < 2:
        pytest.skip("needs 2 devices")
    g = ContextGuard(1)
    yield g
    g.close()


# --- construction, properties, close -----------------------------------------------------

def test_construct_retains_and_activates(guard):
    flags, active = primary_state(0)
    assert active, "the guard's retain must activate the primary context"
    assert guard.device == 0 and not guard.closed
    assert guard.handle != 0
    assert int(guard.context) == guard.handle
    assert guard.context_id == ok(driver().cuCtxGetId(guard.context))
    assert "device=0" in repr(guard) and "closed" not in repr(guard)


def test_handle_is_the_primary_context(guard):
    d = driver()
    ctx = ok(d.cuDevicePrimaryCtxRetain(ok(d.cuDeviceGet(0))))
    try:
        assert int(ctx) == guard.handle
    finally:
        ok(d.cuDevicePrimaryCtxRelease(ok(d.cuDeviceGet(0))))


def test_retain_balance_counted(sim):
    before = sim.retain_count(0)
    g = ContextGuard(0)
    assert sim.retain_count(0) == before + 1
    with g:
        with g:
            assert sim.retain_count(0) == before + 1, "entering must not retain"
    g.close()
    assert sim.retain_count(0) == before
    g.close()  # idempotent: no second release
    assert sim.retain_count(0) == before
    assert g.closed and "closed" in repr(g)


def test_dealloc_releases(sim):
    before = sim.retain_count(1)
    g = ContextGuard(1)
    assert sim.retain_count(1) == before + 1
    del g
    assert sim.retain_count(1) == before


def test_retain_balance_real_driver_in_fresh_process():
    # A fresh process so nothing else holds the primary context: after close it is inactive.
    out = run_child("""
        import cyctx
        g = cyctx.ContextGuard(0)
        a = drivers.primary_state(0)[1]
        for _ in range(1000):
            with g:
                pass
        b = drivers.primary_state(0)[1]
        g.close()
        c = drivers.primary_state(0)[1]
        print(a, b, c)
    """)
    assert out.stdout.split() == ["True", "True", "False"]


def test_use_after_close(guard):
    guard.close()
    with pytest.raises(GuardError, match="closed"):
        with guard:
            pass
    with pytest.raises(GuardError, match="closed"):
        guard.handle


def test_close_inside_block_refused(guard):
    with guard:
        with pytest.raises(GuardError, match="inside a with-block"):
            guard.close()
        assert not guard.closed
    guard.close()


def test_shared_guard_is_one_object_and_not_closable():
    # In a child: the shared guard holds its retain until the process ends.
    out = run_child("""
        import cyctx
        from cyctx import ContextGuard, GuardError
        from helpers.threads import run_threads
        got = run_threads(*[lambda: ContextGuard.shared(0)] * 8)
        a = ContextGuard.shared(0)
        assert all(g is a for g in got) and a.is_shared
        try:
            a.close()
        except GuardError as e:
            print("REFUSED", "shared" in str(e))
        with a:
            print("CURRENT", drivers.current() == a.handle)
        if drivers.SIM:
            print("RETAINS", drivers.SIM.retain_count(0))
    """)
    assert "REFUSED True" in out.stdout and "CURRENT True" in out.stdout
    if "RETAINS" in out.stdout:
        assert "RETAINS 1" in out.stdout


# --- enter/exit: what becomes current, what is restored ------------------------------------

def test_restores_null_on_a_fresh_thread(guard):
    def body():
        assert current() == 0
        with guard as g:
            assert g is guard
            assert current() == guard.handle
        return current()

    assert in_thread(body) == 0


def test_restores_null_when_block_raises(guard):
    def body():
        with pytest.raises(KeyError):
            with guard:
                raise KeyError("boom")
        return current()

    assert in_thread(body) == 0


def test_restores_previous_context_across_devices(guard, guard1):
    def body():
        with guard:
            with guard1:
                assert current() == guard1.handle
                with guard:
                    assert current() == guard.handle
                assert current() == guard1.handle
            assert current() == guard.handle
        return current()

    assert in_thread(body) == 0


def test_nesting_same_guard(guard):
    def body():
        with guard:
            with guard:
                with guard:
                    assert current() == guard.handle
            assert current() == guard.handle
        return current()

    assert in_thread(body) == 0


def test_fast_path_makes_no_switch(guard, sim):
    def body():
        with guard:
            n = sim.call_count("cuCtxSetCurrent") + sim.call_count("cuCtxPushCurrent") + sim.call_count("cuCtxPopCurrent")
            for _ in range(100):
                with guard:
                    pass
            m = sim.call_count("cuCtxSetCurrent") + sim.call_count("cuCtxPushCurrent") + sim.call_count("cuCtxPopCurrent")
            return m - n

    assert in_thread(body) == 0


def test_switching_keeps_stack_depth(guard, guard1, sim):
    def body():
        depth0 = sim.stack_depth()
        with guard:
            assert sim.stack_depth() == 1
            with guard1:
                assert sim.stack_depth() == 1, "a switch replaces the top, it does not push"
        return depth0, sim.stack_depth()

    assert in_thread(body) == (0, 0)


def test_repairs_cuCtxSetCurrent_inside_block(guard, guard1):
    d = driver()

    def body():
        with guard:
            with guard1:
                ok(d.cuCtxSetCurrent(guard.context))  # what cudaSetDevice(0) does to the stack
                assert current() == guard.handle
            assert current() == guard.handle
            ok(d.cuCtxSetCurrent(guard1.context))
        return current()

    assert in_thread(body) == 0


def test_repairs_replacement_on_the_fast_path(guard, guard1):
    d = driver()

    def body():
        with guard:
            with guard:  # fast path: already current
                ok(d.cuCtxSetCurrent(guard1.context))
            assert current() == guard.handle
        return current()

    assert in_thread(body) == 0


def test_block_that_popped_the_context_is_repaired(guard):
    d = driver()

    def body():
        with guard:
            with guard:
                ok(d.cuCtxPopCurrent())  # the block popped what it did not push
                assert current() == 0
            assert current() == guard.handle
        return current()

    assert in_thread(body) == 0


@pytest.mark.parametrize("how", ["pop", "set_null"])
def test_block_that_emptied_the_stack_is_left_empty(guard, how):
    # From an empty stack the guard pushes, and its exit pops one entry. When the block has
    # already emptied the stack, that pop fails; the exit must see the stack is empty (what
    # the thread had before the block) and raise nothing.
    d = driver()

    def body():
        with guard:
            if how == "pop":
                ok(d.cuCtxPopCurrent())
            else:
                ok(d.cuCtxSetCurrent(None))
            assert current() == 0
        return current()

    assert in_thread(body) == 0


def test_leaked_push_from_empty_stack_is_unwound_and_reported(guard, guard1):
    d = driver()

    def body():
        with pytest.raises(GuardError, match="pushed 1 context"):
            with guard:
                ok(d.cuCtxPushCurrent(guard1.context))
        return current()

    assert in_thread(body) == 0


def test_leaked_push_over_a_context_restores_current(guard, guard1):
    # Documented limitation: with a context below, the driver gives no stack depth, so a
    # push leaked by the block stays beneath; the current context is still restored.
    d = driver()

    def body():
        ok(d.cuCtxPushCurrent(guard.context))
        with guard1:
            ok(d.cuCtxPushCurrent(guard.context))
        restored = current()
        ok(d.cuCtxPopCurrent())
        ok(d.cuCtxPopCurrent())
        return restored, current()

    assert in_thread(body) == (guard.handle, 0)


# --- misuse -------------------------------------------------------------------------------

def test_exit_without_enter(guard):
    with pytest.raises(GuardError, match="without a matching enter"):
        guard.__exit__(None, None, None)


def test_exit_on_another_thread(guard):
    def body():
        guard.__enter__()
        try:
            with pytest.raises(GuardError, match="without a matching enter on this thread"):
                in_thread(guard.__exit__, None, None, None)
            assert current() == guard.handle, "the failed exit must change nothing"
        finally:
            guard.__exit__(None, None, None)
        return current()

    assert in_thread(body) == 0


def test_generators_interleaving_detected(guard, guard1):
    def gen(g):
        with g:
            yield current()
            yield current()

    def body():
        a, b = gen(guard), gen(guard1)
        assert next(a) == guard.handle
        assert next(b) == guard1.handle
        with pytest.raises(GuardError, match="out of order"):
            next(a)  # a's block is left while b's is still open
            next(a)
        # Nothing changed: b is still current; b's exit works and restores a's... state.
        assert current() == guard1.handle
        with pytest.raises(StopIteration):
            next(b)
            next(b)
        return current()

    # a's entry remains open after the refused exit; b's exit restored guard (a's context).
    def run():
        r = body()
        # leave a's still-open entry properly
        guard.__exit__(None, None, None)
        return r, current()

    r, after = in_thread(run)
    assert r == guard.handle and after == 0


@pytest.mark.parametrize(
    "bad, exc",
    [(-1, ValueError), ("0", TypeError), (None, TypeError), (1.5, TypeError), (True, TypeError), ([0], TypeError)],
)
def test_bad_device_argument(bad, exc):
    with pytest.raises(exc):
        ContextGuard(bad)


@pytest.mark.parametrize("bad", [10**9, SIM_DEVICES + 40, 10**30])
def test_nonexistent_device(bad, sim):
    before = [sim.retain_count(i) for i in range(sim.device_count)]
    retains = sim.call_count("cuDevicePrimaryCtxRetain")
    with pytest.raises(InvalidDeviceError) as ei:
        ContextGuard(bad)
    assert isinstance(ei.value, DriverError) and isinstance(ei.value, ValueError)
    assert ei.value.code == 101 and ei.value.name == "CUDA_ERROR_INVALID_DEVICE"
    assert str(bad) in str(ei.value)
    assert [sim.retain_count(i) for i in range(sim.device_count)] == before
    assert sim.call_count("cuDevicePrimaryCtxRetain") == retains


def test_negative_ordinal_is_refused_before_any_driver_call(sim):
    # A plain ValueError from the argument check, not the driver's InvalidDeviceError (which
    # is a ValueError too, so `pytest.raises(ValueError)` alone cannot tell them apart).
    calls = sim.call_count()
    with pytest.raises(ValueError) as ei:
        ContextGuard(-1)
    assert type(ei.value) is ValueError and "must be >= 0" in str(ei.value)
    assert sim.call_count() == calls


def test_one_past_the_last_device_is_refused_before_the_driver_is_asked(sim):
    # cyctx's own bounds check answers, not cuDeviceGet: the error says which check refused
    # it and how many devices there are.
    n = device_count()
    gets = sim.call_count("cuDeviceGet")
    with pytest.raises(InvalidDeviceError) as ei:
        ContextGuard(n)
    assert ei.value.call == "ContextGuard" and ei.value.code == 101
    assert f"Device {n} does not exist" in str(ei.value) and f"reports {n} device(s)" in str(ei.value)
    assert sim.call_count("cuDeviceGet") == gets


def test_nonexistent_device_real():
    with pytest.raises(InvalidDeviceError, match="does not exist"):
        ContextGuard(10**9)


# --- driver failures are typed and change nothing -----------------------------------------

def test_driver_error_on_enter_changes_nothing(guard, guard1, sim):
    def body():
        with guard:
            sim.inject_fault("cuCtxSetCurrent", 201)
            with pytest.raises(InvalidContextError) as ei:
                with guard1:
                    pass
            assert ei.value.code == 201 and ei.value.name == "CUDA_ERROR_INVALID_CONTEXT"
            assert ei.value.call == "cuCtxSetCurrent"
            assert "doctor" in str(ei.value)
            assert current() == guard.handle
        return current()

    assert in_thread(body) == 0


def test_errors_are_named_as_users_import_them():
    import pickle
    import traceback
    import warnings

    public = [getattr(cyctx, n) for n in cyctx.__all__]
    errors = [c for c in public if isinstance(c, type) and issubclass(c, (Exception, Warning))]
    assert len(errors) == 11
    for cls in errors:
        assert f"{cls.__module__}.{cls.__qualname__}" == f"cyctx.{cls.__name__}"
    with pytest.raises(InvalidDeviceError) as ei:
        ContextGuard(10**9)
    text = "".join(traceback.format_exception(ei.value))
    assert "\ncyctx.InvalidDeviceError: " in text, text
    assert "_errors" not in text.splitlines()[-1]
    back = pickle.loads(pickle.dumps(ei.value))
    assert type(back) is InvalidDeviceError and back.code == ei.value.code
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # `-W error::cyctx.ContextResetWarning` names the class by its public path.
        warnings.filterwarnings("error", category=cyctx.ContextResetWarning)
        assert repr(cyctx.ContextResetWarning("x")) == "ContextResetWarning('x')"


def test_cleanup_failure_does_not_replace_block_exception(guard, sim, capfd):
    def body():
        with pytest.raises(KeyError) as ei:
            with guard:
                # Entered from an empty stack (a new thread), so the exit restores by a pop.
                sim.inject_fault("cuCtxPopCurrent", 999)
                raise KeyError("from the block")
        notes = getattr(ei.value, "__notes__", [])
        assert any("CUDA_ERROR_UNKNOWN" in n for n in notes), notes
        # The failed restore left the guard's context current; put the thread back.
        ok(driver().cuCtxSetCurrent(None))
        return current()

    assert in_thread(body) == 0
    if sys.version_info < (3, 11):
        # 3.10's traceback does not print __notes__: the failure is also on stderr.
        err = capfd.readouterr().err
        assert "CUDA_ERROR_UNKNOWN" in err and "while KeyError propagated" in err


class _NotesNotAList(KeyError):
    """Its __notes__ is set to something that is not a list: add_note refuses (TypeError)."""


class _AddNoteRaises(KeyError):
    def add_note(self, note):
        raise RuntimeError("add_note of the user's exception")


def _notes_not_a_list(value):
    exc = _NotesNotAList("from the block")
    exc.__notes__ = value
    return exc


class _GuardWithRaisingRepr(ContextGuard):
    def __repr__(self):
        raise RuntimeError("repr of the guard subclass")


@pytest.mark.parametrize("make_exc", [
    lambda: _notes_not_a_list("a str"),
    lambda: _notes_not_a_list(("a", "tuple")),
    lambda: _AddNoteRaises("from the block"),
], ids=["notes str", "notes tuple", "add_note raises"])
def test_block_exception_wins_when_the_cleanup_note_cannot_be_attached(make_exc, capfd):
    # The exit fails on any driver: the block pushed a context from an empty stack (a new
    # thread) and left it, which the exit pops and reports (GuardError). Attaching that as a
    # note fails; the block's own exception must still be what propagates, and the note,
    # best effort, goes to stderr instead.
    g = ContextGuard(0)
    exc = make_exc()
    notes_before = exc.__dict__.get("__notes__")

    def body():
        with pytest.raises(KeyError) as ei:
            with g:
                ok(driver().cuCtxPushCurrent(g.context))
                raise exc
        assert ei.value is exc
        return current()

    try:
        assert in_thread(body) == 0
    finally:
        g.close()
    assert exc.__dict__.get("__notes__") == notes_before  # the user's own value, untouched
    err = capfd.readouterr().err
    assert "pushed 1 context" in err and "propagated" in err, err


def test_cleanup_note_survives_a_guard_whose_repr_raises():
    # A note that can be attached is attached, even when the guard's repr cannot be made
    # (a subclass may override __repr__); the block's exception still propagates.
    g = _GuardWithRaisingRepr(0)

    def body():
        with pytest.raises(KeyError) as ei:
            with g:
                ok(driver().cuCtxPushCurrent(g.context))
                raise KeyError("from the block")
        return getattr(ei.value, "__notes__", [])

    try:
        notes = in_thread(body)
    finally:
        g.close()
    assert any("pushed 1 context" in n for n in notes), notes


def test_cleanup_failure_raises_when_block_succeeded(guard, sim):
    def body():
        with pytest.raises(DriverError) as ei:
            with guard:
                # Entered from an empty stack (a new thread), so the exit restores by a pop.
                sim.inject_fault("cuCtxPopCurrent", 999)
        assert ei.value.code == 999
        ok(driver().cuCtxSetCurrent(None))
        return current()

    assert in_thread(body) == 0


def test_construction_failure_leaks_no_retain(sim):
    before = sim.retain_count(0)
    sim.inject_fault("cuCtxGetId", 999)
    with pytest.raises(DriverError):
        ContextGuard(0)
    assert sim.retain_count(0) == before


def test_close_failure_keeps_the_retain_for_a_retry(sim):
    before = sim.retain_count(0)
    g = ContextGuard(0)
    sim.inject_fault("cuDevicePrimaryCtxRelease", 999)
    with pytest.raises(DriverError):
        g.close()
    assert not g.closed and sim.retain_count(0) == before + 1
    g.close()
    assert g.closed and sim.retain_count(0) == before


# --- threads --------------------------------------------------------------------------------

def test_one_guard_shared_by_many_threads(guard, guard1):
    errors = []
    barrier = threading.Barrier(8)

    def worker(k):
        try:
            d = driver()
            base = guard1 if k % 2 else None  # half the threads start inside another context
            if base is not None:
                ok(d.cuCtxSetCurrent(base.context))
            expect = current()
            barrier.wait()
            for _ in range(2000):
                with guard:
                    if current() != guard.handle:
                        errors.append(("inside", k))
                if current() != expect:
                    errors.append(("after", k))
            if base is not None:
                ok(d.cuCtxSetCurrent(None))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    run_threads(*(partial(worker, k) for k in range(8)))
    assert errors == []


def test_python_facade_exports():
    for name in ("ContextGuard", "CyctxError", "DriverError", "GuardError", "InvalidDeviceError"):
        assert hasattr(cyctx, name)
    assert issubclass(GuardError, cyctx.CyctxError) and issubclass(DriverError, cyctx.CyctxError)


def test_deep_nesting_beyond_the_inline_entries(guard, guard1):
    # The per-thread entry stack keeps 8 entries inline (_tls.h, kInline) and spills to the heap beyond.
    def body():
        def nest(k):
            g = (guard, guard1)[k % 2]
            with g:
                assert current() == g.handle
                if k:
                    nest(k - 1)
                assert current() == g.handle
        for _ in range(3):  # grow, shrink, grow again
            nest(150)
        return current()

    assert in_thread(body) == 0


def test_construction_helpers_are_not_methods():
    # They would re-initialise a live guard (and leak its retain) if Python could call them.
    for name in ("_init_primary", "_init_context"):
        assert not hasattr(ContextGuard, name)
    # Nor can Python hand the driver an arbitrary integer as a stream or green context handle:
    # resolving one is part of construction, after the input was recognised.
    import cyctx._guard
    for name in ("_context_of", "_stream_context", "_green_context"):
        assert not hasattr(cyctx._guard, name), name


def test_driver_error_survives_a_trip_through_another_process():
    # Errors of a worker process reach the parent pickled: the class, the code, the call and
    # the advice (detail) all survive, so the parent sees the same message.
    import concurrent.futures
    import multiprocessing

    err = cyctx.InvalidDeviceError(101, "ContextGuard", "Device 7 does not exist: 2 device(s)")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
        back = ex.submit(_echo, err).result()
    assert type(back) is cyctx.InvalidDeviceError
    assert (back.code, back.call, back.detail) == (101, "ContextGuard", err.detail)
    assert str(back) == str(err) and "Device 7 does not exist" in str(back)


def _echo(x):
    return x
