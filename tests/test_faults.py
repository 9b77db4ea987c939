"""Fault injection (simulated driver): every driver call that construction, enter, exit and
close make is failed, one at a time, with each plausible code. After each failure the
thread's context stack is as before the failed operation, no retain is leaked or released
twice, and the error is a DriverError with that code.

The calls an operation makes are discovered by counting them, not listed by hand, so a new
driver call in the guard is covered automatically.
"""

import warnings

import pytest

from cyctx import ContextGuard, ContextResetWarning, DriverError

from _drv import driver, in_thread, ok

FUNCS = (
    "cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease",
    "cuCtxGetId", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxPushCurrent", "cuCtxPopCurrent",
)
CODES = (201, 709, 999, 2, 46)


class Case:
    """One guard operation with its set-up; run() returns nothing and may raise."""

    def __init__(self, name, start, op, after_success):
        self.name, self.start, self.op, self.after_success = name, start, op, after_success


def _guards():
    return ContextGuard(0), ContextGuard(1)


def _set(ctx):
    ok(driver().cuCtxSetCurrent(ctx))


def state(sim):
    return {"current": int(ok(driver().cuCtxGetCurrent())), "depth": sim.stack_depth(),
            "retains": [sim.retain_count(i) for i in range(2)]}


def _reset0():
    d = driver()
    ok(d.cuDevicePrimaryCtxReset(ok(d.cuDeviceGet(0))))


# (name, prepare(g0, g1) -> None run on the thread before the op, op(g0, g1))
SCENARIOS = {
    "construct": (lambda g0, g1: None, lambda g0, g1: ContextGuard(0).close()),
    "enter from no context": (lambda g0, g1: None, lambda g0, g1: g0.__enter__()),
    "enter over dev1": (lambda g0, g1: _set(g1.context), lambda g0, g1: g0.__enter__()),
    "enter already current": (lambda g0, g1: _set(g0.context), lambda g0, g1: g0.__enter__()),
    "enter after reset": (lambda g0, g1: _reset0(), lambda g0, g1: g0.__enter__()),
    "exit to no context": (lambda g0, g1: g0.__enter__(), lambda g0, g1: g0.__exit__(None, None, None)),
    "exit to dev1": (lambda g0, g1: (_set(g1.context), g0.__enter__()), lambda g0, g1: g0.__exit__(None, None, None)),
    "exit fast path": (lambda g0, g1: (_set(g0.context), g0.__enter__()), lambda g0, g1: g0.__exit__(None, None, None)),
    "close": (lambda g0, g1: None, lambda g0, g1: g0.close()),
}


def _cleanup(g0, g1):
    from cyctx._guard import _open_entries

    while _open_entries():
        # Leave whatever the case left open, innermost first.
        for g in (g0, g1):
            try:
                g.__exit__(None, None, None)
                break
            except Exception:
                continue
        else:
            break
    _set(None)
    while int(ok(driver().cuCtxGetCurrent())):
        _set(None)
    for g in (g0, g1):
        g.close()


def _run(sim, name, fault):
    """Run scenario `name` on a fresh thread, optionally with fault=(func, nth, code).
    Returns (calls made by the op, state before op, state after op, exception)."""
    prepare, op = SCENARIOS[name]

    def body():
        g0, g1 = _guards()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ContextResetWarning)
                prepare(g0, g1)
                before = state(sim)
                counts = {f: sim.call_count(f) for f in FUNCS}
                if fault:
                    sim.inject_fault(fault[0], fault[2], nth=fault[1])
                exc = None
                try:
                    op(g0, g1)
                except Exception as e:  # noqa: BLE001 - examined by the caller
                    exc = e
                sim.clear_faults()
                calls = {f: sim.call_count(f) - counts[f] for f in FUNCS}
                after = state(sim)
        finally:
            _cleanup(g0, g1)
        return calls, before, after, exc

    return in_thread(body)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_driver_call_failing(sim, name):
    base = [sim.retain_count(i) for i in range(2)]
    calls, before, ok_after, exc = _run(sim, name, None)
    assert exc is None, f"{name} fails without a fault: {exc!r}"
    made = {f: n for f, n in calls.items() if n}
    assert made, f"{name} made no driver call?"
    tried = 0
    for func, n in made.items():
        for nth in range(1, n + 1):
            for code in CODES:
                _, before, after, exc = _run(sim, name, (func, nth, code))
                where = f"{name}: {func} call #{nth} -> {code}"
                balanced_release = name == "enter after reset" and func == "cuDevicePrimaryCtxRelease"
                looks_reset = name.startswith("enter") and func == "cuCtxGetId" and nth == 1 and code == 709
                if balanced_release or looks_reset:
                    # Not failures: a swallowed balancing release is remembered and released by
                    # close; CONTEXT_IS_DESTROYED from cuCtxGetId is what a reset looks like,
                    # and the guard re-activates the context.
                    assert exc is None, where
                    continue
                assert isinstance(exc, DriverError), f"{where}: raised {exc!r}"
                assert exc.code == code, where
                if name.startswith("exit to no context") and func == "cuCtxGetCurrent":
                    # The restore (SetCurrent(NULL)) already happened; only the leak check failed.
                    assert after["current"] == 0 and after["depth"] == 0, where
                else:
                    assert after["current"] == before["current"] and after["depth"] == before["depth"], where
                if name not in ("construct", "close"):
                    assert after["retains"] == before["retains"], where
                tried += 1
        # Every retain taken in the case was released by its cleanup.
        assert [sim.retain_count(i) for i in range(2)] == base, f"{name}/{func}: retain leaked"
    assert tried > 0


def test_construct_fault_leaks_nothing(sim):
    base = [sim.retain_count(i) for i in range(2)]
    for func in ("cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxGetId"):
        sim.inject_fault(func, 999)
        with pytest.raises(DriverError) as ei:
            ContextGuard(0)
        sim.clear_faults()
        assert ei.value.code == 999 and ei.value.call == func
        assert [sim.retain_count(i) for i in range(2)] == base, func


def test_close_fault_keeps_guard_open_then_releases(sim):
    base = sim.retain_count(0)
    g = ContextGuard(0)
    for code in CODES:
        sim.inject_fault("cuDevicePrimaryCtxRelease", code)
        with pytest.raises(DriverError):
            g.close()
        assert not g.closed and sim.retain_count(0) == base + 1
    g.close()
    assert sim.retain_count(0) == base
