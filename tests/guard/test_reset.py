"""Resets of a primary context (cuDevicePrimaryCtxReset, cudaDeviceReset): detected at the
enter, re-activated with a balanced refcount, with Python code (warning hooks) running
during the re-activation, under threads, and between a construction's driver calls."""

import threading
import warnings

import pytest
from helpers import drivers
from helpers.children import run_child
from helpers.drivers import current, driver, ok, primary_state, reset_primary, retains_unchanged
from helpers.threads import in_thread, running

from cyctx import ContextGuard, ContextResetWarning, DriverError
from cyctx._guard import open_entries


def api_version_ok():
    """Is the current context usable? (the classic report's failing call)"""
    err, _ = driver().cuCtxGetApiVersion(None)
    return err == driver().CUresult.CUDA_SUCCESS


def test_reset_is_detected_and_reactivated_with_balanced_refcount():
    def body():
        g = ContextGuard(0)
        old_id, handle = g.context_id, g.handle
        reset_primary(0)
        assert primary_state(0)[1] is False, "reset deactivates"
        with pytest.warns(ContextResetWarning, match="reset"):
            with g:
                assert current() == handle, "the driver reuses the handle"
                assert api_version_ok(), "inside the guard the context must be usable again"
        assert g.context_id != old_id and g.resets == 1
        assert primary_state(0)[1] is True
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with g:  # no second warning: the new id is recorded
                pass
        g.close()
        return current()

    assert in_thread(body) == 0


def test_reset_refcount_balance_counted(sim):
    base = sim.retain_count(0)
    g = ContextGuard(0)
    reset_primary(0)
    assert sim.retain_count(0) == base + 1, "reset keeps the refcount"
    with pytest.warns(ContextResetWarning):
        with g:
            assert sim.retain_count(0) == base + 1, "re-activation is a balanced retain+release"
    g.close()
    assert sim.retain_count(0) == base and not sim.primary_active(0)


def test_reset_while_current_is_caught_on_the_fast_path():
    # The stale handle is current (pointer-equal to the guard's), so only the id check sees it.
    def body():
        g = ContextGuard(0)
        with g:
            reset_primary(0)
            assert not api_version_ok(), "the classic state: non-NULL current, invalid context"
            with pytest.warns(ContextResetWarning):
                with g:
                    assert api_version_ok()
        g.close()
        return current()

    assert in_thread(body) == 0


def test_reset_then_reactivated_by_someone_else(sim):
    d = driver()

    def body():
        g = ContextGuard(0)
        base = sim.retain_count(0)
        reset_primary(0)
        dev = ok(d.cuDeviceGet(0))
        ok(d.cuDevicePrimaryCtxRetain(dev))  # e.g. the runtime's cudaFree(0) after a reset
        with pytest.warns(ContextResetWarning, match="re-activated it"):
            with g:
                assert api_version_ok()
        assert sim.retain_count(0) == base + 1
        ok(d.cuDevicePrimaryCtxRelease(dev))
        g.close()
        return current()

    assert in_thread(body) == 0


@pytest.mark.cudart
def test_cudaDeviceReset_is_detected():
    out = run_child("""
        import ctypes, warnings, cyctx
        rt = drivers.cudart()
        g = cyctx.ContextGuard(0)
        with g:
            pass
        # A program that used the runtime, then reset the device.
        assert rt.cudaSetDevice(0) == 0 and rt.cudaFree(None) == 0
        assert rt.cudaDeviceReset() == 0
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with g:
                err, ver = drivers.driver().cuCtxGetApiVersion(None)
        print("WARNED", any(issubclass(x.category, cyctx.ContextResetWarning) for x in w), "API", int(err))
        g.close()
    """)
    assert "WARNED True API 0" in out.stdout


# --- Python code during the re-activation, other threads --------------------------------------


def test_reset_again_while_the_reactivation_warns_is_acted_on(sim):
    # The context was reset and re-activated by someone else (the enter sees a new id, so it
    # would only record it); during the warning it is reset once more. The enter must act on
    # the driver's state after the warning, not before: the context is usable inside.
    d = driver()
    base = sim.retain_count(0)

    def body():
        g = ContextGuard(0)
        dev = ok(d.cuDeviceGet(0))
        reset_primary(0)
        ok(d.cuDevicePrimaryCtxRetain(dev))  # someone re-activates it

        def hook(*a, **k):
            ok(d.cuDevicePrimaryCtxRelease(dev))
            reset_primary(0)  # ... and resets it again while cyctx warns

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            old, warnings.showwarning = warnings.showwarning, hook
            try:
                with g:
                    err, _ = d.cuCtxGetApiVersion(None)
                    usable = err == d.CUresult.CUDA_SUCCESS
            finally:
                warnings.showwarning = old
        assert usable, "an inactive primary context was made current inside the guard"
        assert sim.retain_count(0) == base + 1
        g.close()
        return current()

    assert in_thread(body) == 0
    assert sim.retain_count(0) == base


def test_showwarning_hook_reenters_the_same_guard_during_reactivation(sim):
    base = sim.retain_count(0)

    def body():
        g = ContextGuard(0)
        reset_primary(0)
        inner = []

        def hook(*a, **k):
            if not inner:
                inner.append(1)
                with g:  # the same reset, seen again from inside the warning
                    inner.append(current() == g.handle)

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            old, warnings.showwarning = warnings.showwarning, hook
            try:
                with g:
                    assert current() == g.handle
            finally:
                warnings.showwarning = old
        assert inner == [1, True]
        assert sim.retain_count(0) == base + 1
        g.close()
        return current(), open_entries()

    assert in_thread(body) == (0, 0)
    assert sim.retain_count(0) == base


def test_enter_exit_on_many_threads_with_resets_and_a_late_close(sim):
    # The warning filter is set here, once, around the threads' whole life: warning filters
    # are process-wide, so a catch_warnings in each worker restores them while another worker
    # still runs (the first to leave drops the "ignore", and the next reset it detects raises
    # under -W error). Each reset waits until a worker's enter has detected it, so every one
    # of them is seen whatever the scheduling.
    base = sim.retain_count(0)
    g = ContextGuard(0)
    stop = threading.Event()
    entered = threading.Condition()
    bad = []

    def worker():
        while not stop.is_set():
            try:
                with g:
                    assert current() == g.handle
            except Exception as e:  # noqa: BLE001
                bad.append(repr(e))
            with entered:
                entered.notify_all()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContextResetWarning)
        with running(*[worker] * 4):
            try:
                for i in range(50):
                    reset_primary(0)
                    with entered:
                        assert entered.wait_for(lambda i=i: g.resets > i or bad, 60), (
                            f"no worker detected reset {i + 1} in 60 s"
                        )
            finally:
                stop.set()
    assert bad == []
    assert g.resets >= 50, "every reset was detected by an enter"
    assert sim.retain_count(0) == base + 1
    g.close()
    assert sim.retain_count(0) == base


# --- construction while another thread resets the device --------------------------------------


def test_construction_names_the_reactivation_call_that_failed(sim):
    # The re-activation after a reset between the retain and the id read retains again; when
    # that retain fails, the error names it (not the id read), and no retain is kept.
    with retains_unchanged():
        sim.inject_fault("cuCtxGetId", 709, nth=1)
        sim.inject_fault("cuDevicePrimaryCtxRetain", 2, nth=2)
        try:
            with pytest.raises(DriverError) as ei:
                ContextGuard(0)
        finally:
            sim.clear_faults()
        assert ei.value.code == 2 and ei.value.call == "cuDevicePrimaryCtxRetain", ei.value


def test_construction_under_constant_resets_never_fails():
    # In a child: the resets reach every guard of the process. Two threads reset device D1
    # through ctypes, which releases the GIL around each call, so resets land anywhere in a
    # construction, also between its driver calls. A race: a reset must land between the
    # retain and the id read, a few of 20000 constructions; the exact cases are in
    # test_reactivation.py.
    out = run_child(
        """
        import ctypes, threading, time
        import cyctx
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuGetProcAddress_v2.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
                                            ctypes.c_int, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
        pfn, status = ctypes.c_void_p(), ctypes.c_int()
        assert lib.cuGetProcAddress_v2(b"cuDevicePrimaryCtxReset", ctypes.byref(pfn), 11000, 0,
                                       ctypes.byref(status)) == 0 and pfn.value
        reset = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(pfn.value)
        holder = cyctx.ContextGuard(D1)  # keeps the refcount above zero throughout
        base = drivers.retains()
        stop, resets = threading.Event(), [0]

        def resetter():
            while not stop.is_set():
                reset(D1)
                resets[0] += 1

        threads = [threading.Thread(target=resetter) for _ in range(2)]
        for t in threads:
            t.start()
        failures = []
        try:
            while resets[0] == 0:
                time.sleep(0.001)
            for _ in range(N):
                try:
                    cyctx.ContextGuard(D1).close()
                except cyctx.CyctxError as e:
                    failures.append(repr(e))
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert drivers.retains() == base
        holder.close()
        print("RESETS", resets[0], "FAILURES", len(failures), failures[:1])
    """.replace("N)", "20_000)" if drivers.SIM else "2_000)"),
        timeout=300,
    )
    words = out.stdout.split()
    assert int(words[words.index("RESETS") + 1]) > 100, out.stdout
    assert "FAILURES 0 " in out.stdout, out.stdout
