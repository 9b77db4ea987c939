"""Reset, fork, shutdown (docs/design.md: reset, fork, shutdown): what a long-running service runs into."""

import os
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

import cyctx
from cyctx import ContextGuard, ContextResetWarning, ForkError

from helpers.children import run_child
from helpers.drivers import current, driver, ok, primary_state, reset_primary
from helpers.threads import in_thread


def api_version_ok():
    """Is the current context usable? (the classic report's failing call)"""
    err, _ = driver().cuCtxGetApiVersion(None)
    return err == driver().CUresult.CUDA_SUCCESS


# --- reset ---------------------------------------------------------------------------------

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


def test_reset_as_error_changes_nothing(sim):
    def body():
        g = ContextGuard(0)
        base = sim.retain_count(0)
        reset_primary(0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ContextResetWarning)
            with pytest.raises(ContextResetWarning):
                with g:
                    pass
        assert current() == 0 and sim.retain_count(0) == base and not sim.primary_active(0)
        with pytest.warns(ContextResetWarning):
            with g:
                pass
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


def test_reset_reactivation_release_failure_is_not_leaked(sim):
    base = sim.retain_count(0)
    g = ContextGuard(0)
    reset_primary(0)
    sim.inject_fault("cuDevicePrimaryCtxRelease", 999)
    with pytest.warns(ContextResetWarning):
        with g:
            pass
    assert sim.retain_count(0) == base + 2  # the unbalanced one is remembered...
    g.close()
    assert sim.retain_count(0) == base  # ...and released with the guard's own


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


# --- fork ----------------------------------------------------------------------------------

# {child} runs in a forked child and notes what it saw in msgs; the driver calls it made are
# counted on the simulated driver.
FORK_CHILD = """
    import cyctx
    from helpers.forking import run_forked
    {setup}
    def child():
        msgs = []
        calls0 = drivers.SIM.call_count() if drivers.SIM else None
        {child}
        if drivers.SIM:
            msgs.append(f"driver-calls={{drivers.SIM.call_count() - calls0}}")
        return "|".join(msgs)
    print("CHILD", run_forked(child))
"""


def test_fork_after_cuda_refuses_before_any_driver_call():
    out = run_child(FORK_CHILD.format(
        setup="g = cyctx.ContextGuard(0)\n    s = cyctx.ContextGuard.shared(0)",
        child="""
        for what, fn in (("enter", lambda: g.__enter__()), ("shared", lambda: s.__enter__()),
                         ("new", lambda: cyctx.ContextGuard(0))):
            try:
                fn()
                msgs.append(what + "=no-error")
            except cyctx.ForkError as e:
                msgs.append(what + "=ForkError:" + str("spawn" in str(e) and "fork" in str(e)))
        g.close()
        msgs.append("closed=" + str(g.closed))
        """))
    line = out.stdout.split("CHILD", 1)[1]
    assert "enter=ForkError:True" in line and "shared=ForkError:True" in line and "new=ForkError:True" in line
    assert "closed=True" in line
    if "driver-calls=" in line:
        assert "driver-calls=0" in line


def test_fork_inside_a_block_leaves_quietly():
    out = run_child(FORK_CHILD.format(
        setup="g = cyctx.ContextGuard(0)\n    g.__enter__()",
        child="""
        g.__exit__(None, None, None)
        msgs.append("exited")
        """) + "    g.__exit__(None, None, None)\n    print('PARENT', drivers.current())\n")
    assert "CHILD exited" in out.stdout and "PARENT 0" in out.stdout


def test_fork_after_cuda_used_by_someone_else():
    # The parent used the driver directly, not through cyctx: the child's cuInit fails with 3
    # and cyctx still names fork.
    out = run_child(FORK_CHILD.format(
        setup="d = drivers.driver(); drivers.ok(d.cuInit(0)); drivers.ok(d.cuDevicePrimaryCtxRetain(drivers.ok(d.cuDeviceGet(0))))",
        child="""
        try:
            cyctx.ContextGuard(0)
            msgs.append("no-error")
        except cyctx.ForkError as e:
            msgs.append("ForkError")
        """), init=False)
    assert "CHILD ForkError" in out.stdout


def test_child_without_inherited_cuda_is_unaffected():
    out = run_child(FORK_CHILD.format(
        setup="pass",
        child="""
        g = cyctx.ContextGuard(0)
        with g:
            msgs.append("ok=" + str(drivers.current() == g.handle))
        g.close()
        """), init=False)
    assert "ok=True" in out.stdout


def _spawn_target(q):
    from helpers import drivers

    drivers.select(os.environ["CYCTX_TEST_DRIVER"])
    import cyctx

    g = cyctx.ContextGuard(0)
    with g:
        q.put(cyctx.current_handle() == g.handle)
    g.close()


def test_spawn_is_the_way():
    import multiprocessing as mp

    out = run_child("""
        import multiprocessing as mp, cyctx, test_robustness
        g = cyctx.ContextGuard(0)
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=test_robustness._spawn_target, args=(q,))
        p.start(); got = q.get(timeout=120); p.join()
        print("SPAWN", got, p.exitcode)
    """)
    assert "SPAWN True 0" in out.stdout


# --- shutdown and thread exit ------------------------------------------------------------

SHUTDOWN = """
    import threading, time, cyctx
    from cuda.bindings import driver as d
    d.cuInit(0)
    last = d.cuDeviceGetCount()[1] - 1             # device 1 where there are two
    g = cyctx.ContextGuard(0)                      # module global, never closed
    s = cyctx.ContextGuard.shared(0)
    h = cyctx.ContextGuard(last)
    def ends_inside():
        g.__enter__()                             # the thread ends while entered
        h.__enter__()
    t = threading.Thread(target=ends_inside); t.start(); t.join()
    def daemon():
        while True:
            with g:
                with h:
                    time.sleep(0.0005)
    threading.Thread(target=daemon, daemon=True).start()
    time.sleep(0.01)
    h.__enter__()                                  # the main thread exits inside a guard
    print("END")
"""


def _shutdown_once(_):
    return run_child(SHUTDOWN, check=False, timeout=120)


@pytest.mark.slow
def test_shutdown_with_live_guards_100_runs():
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(_shutdown_once, range(100)))
    bad = [(r.returncode, r.stderr[-500:]) for r in results if r.returncode != 0 or r.stderr.strip() or "END" not in r.stdout]
    assert bad == [], f"{len(bad)} of 100 runs did not exit cleanly: {bad[:3]}"


def test_shutdown_releases_module_level_guards(sim):
    # Without daemon threads holding them, guards left in globals are released at exit:
    # the simulated driver reports its retain counts from its own destructor.
    out = run_child("""
        import os, cyctx, threading
        g = cyctx.ContextGuard(0)
        h = cyctx.ContextGuard(1)
        threading.Thread(target=g.__enter__).start()
    """, env={"CYCTX_SIM_REPORT_AT_EXIT": "1"})
    assert "cyctxsim at exit: retains=[0, 0]" in out.stderr, out.stderr
