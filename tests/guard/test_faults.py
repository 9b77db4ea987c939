"""Each driver call of every public path failed, one at a time, with each plausible code
(simulated driver): the thread's stack is as before the operation, no retain is leaked or
released twice, and the error is a DriverError naming the call and its code. The calls are
counted, not listed by hand; the exits' own faults: test_exit_faults.py.
"""

import warnings

import pytest
from helpers.children import run_child, run_python
from helpers.drivers import (
    create_context,
    current,
    driver,
    ok,
    reset_primary,
    retains,
    set_current,
    sim_thread_state,
)
from helpers.threads import in_thread

import cyctx
from cyctx import ContextGuard, ContextResetWarning, DriverError, InvalidContextError

FUNCS = (
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuCtxGetId",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxPushCurrent",
    "cuCtxPopCurrent",
    "cuDevicePrimaryCtxGetState",
    "cuCtxGetDevice",
)


CODES = (201, 709, 999, 2, 46)


class Case:
    """One guard operation with its set-up; run() returns nothing and may raise."""

    def __init__(self, name, start, op, after_success):
        self.name, self.start, self.op, self.after_success = name, start, op, after_success


def _guards():
    return ContextGuard(0), ContextGuard(1)


# A created (non-primary) context of device 0 for the scenarios that need one; made by the
# prepare step on the case's thread, destroyed by the cleanup.
_CREATED = {}


def _make_created(current=False):
    _CREATED["ctx"] = create_context(0, current=current)


# (name, prepare(g0, g1) -> None run on the thread before the op, op(g0, g1))
SCENARIOS = {
    "construct": (lambda g0, g1: None, lambda g0, g1: ContextGuard(0).close()),
    "construct from primary CUcontext": (
        lambda g0, g1: None,
        lambda g0, g1: ContextGuard(g0.context).close(),
    ),
    "construct from current primary": (
        lambda g0, g1: set_current(g0.context),
        lambda g0, g1: ContextGuard(g0.context).close(),
    ),
    "from_handle": (
        lambda g0, g1: set_current(g1.context),
        lambda g0, g1: ContextGuard.from_handle(g0.handle).close(),
    ),
    "construct from created context": (
        lambda g0, g1: _make_created(),
        lambda g0, g1: ContextGuard(_CREATED["ctx"]).close(),
    ),
    "construct from current created context": (
        lambda g0, g1: _make_created(current=True),
        lambda g0, g1: ContextGuard(_CREATED["ctx"]).close(),
    ),
    "enter created-context guard": (
        lambda g0, g1: _make_created(),
        lambda g0, g1: _created_guard().__enter__(),
    ),
    "current_handle": (
        lambda g0, g1: set_current(g1.context),
        lambda g0, g1: cyctx.current_handle(),
    ),
    "enter from no context": (lambda g0, g1: None, lambda g0, g1: g0.__enter__()),
    "enter over dev1": (lambda g0, g1: set_current(g1.context), lambda g0, g1: g0.__enter__()),
    "enter already current": (
        lambda g0, g1: set_current(g0.context),
        lambda g0, g1: g0.__enter__(),
    ),
    "enter after reset": (lambda g0, g1: reset_primary(0), lambda g0, g1: g0.__enter__()),
    "exit to no context": (
        lambda g0, g1: (_found(), g0.__enter__()),
        lambda g0, g1: g0.__exit__(None, None, None),
    ),
    "exit to dev1": (
        lambda g0, g1: (set_current(g1.context), _found(), g0.__enter__()),
        lambda g0, g1: g0.__exit__(None, None, None),
    ),
    "exit fast path": (
        lambda g0, g1: (set_current(g0.context), _found(), g0.__enter__()),
        lambda g0, g1: g0.__exit__(None, None, None),
    ),
    "close": (lambda g0, g1: None, lambda g0, g1: g0.close()),
}


# The state an exit scenario's enter found, which its exit restores.
_FOUND = {}


def _found():
    _FOUND["state"] = sim_thread_state(_FOUND["sim"])


def _created_guard():
    g = _CREATED.get("guard")
    if g is None:
        g = _CREATED["guard"] = ContextGuard(_CREATED["ctx"])
    return g


def _cleanup(g0, g1):
    from cyctx._guard import open_entries

    extra = [_CREATED["guard"]] if "guard" in _CREATED else []
    g0, g1 = (g0, g1, *extra), None

    while open_entries():
        # Leave whatever the case left open, innermost first.
        for g in g0:
            try:
                g.__exit__(None, None, None)
                break
            except Exception:
                continue
        else:
            break
    set_current(None)
    while int(ok(driver().cuCtxGetCurrent())):
        set_current(None)
    for g in g0:
        g.close()
    _CREATED.pop("guard", None)
    ctx = _CREATED.pop("ctx", None)
    if ctx is not None:
        ok(driver().cuCtxDestroy(ctx))


def _run(sim, name, fault):
    """Run scenario `name` on a fresh thread, optionally with fault=(func, nth, code).
    Returns (calls made by the op, state before op, state after op, exception)."""
    prepare, op = SCENARIOS[name]
    _FOUND["sim"] = sim

    def body():
        g0, g1 = _guards()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ContextResetWarning)
                # A close() the fault made fail leaves the release to the collector, which
                # says so (tests/guard/test_spellings.py tests that warning).
                warnings.simplefilter("ignore", ResourceWarning)
                prepare(g0, g1)
                if name.startswith("enter created"):
                    _created_guard()  # made before the op: only its enter is faulted
                before = sim_thread_state(sim)
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
                after = sim_thread_state(sim)
        finally:
            _cleanup(g0, g1)
        return calls, before, after, exc

    return in_thread(body)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_driver_call_failing(sim, name):
    base = retains()
    calls, before, _, exc = _run(sim, name, None)
    assert exc is None, f"{name} fails without a fault: {exc!r}"
    made = {f: n for f, n in calls.items() if n}
    assert made, f"{name} made no driver call?"
    tried = 0
    for func, n in made.items():
        for nth in range(1, n + 1):
            for code in CODES:
                _, before, after, exc = _run(sim, name, (func, nth, code))
                where = f"{name}: {func} call #{nth} -> {code}"
                balanced_release = (
                    name == "enter after reset" and func == "cuDevicePrimaryCtxRelease"
                )
                # CONTEXT_IS_DESTROYED from the first cuCtxGetId is what a reset looks like; in a
                # re-activation the second one (the look again after the warning) says it again.
                looks_reset = (
                    name.startswith("enter")
                    and "created" not in name
                    and func == "cuCtxGetId"
                    and code == 709
                    and (nth == 1 or (nth == 2 and name == "enter after reset"))
                )
                # The probe's comparison retain of a created context: a failed release is kept
                # by the guard and released by its close() (part of the op): nothing changes.
                probe_release = (
                    name.startswith("construct from")
                    and "created" in name
                    and func == "cuDevicePrimaryCtxRelease"
                )
                if probe_release:
                    assert exc is None and after == before, where
                    continue
                dead = code in (201, 709)
                # A construction from an ordinal that reads 709 for the context it just retained
                # saw a reset land in between: it re-activates, as enter does.
                if name == "construct" and func == "cuCtxGetId" and code == 709 and nth == 1:
                    assert exc is None and after == before, where
                    continue
                # Switching over dev1's context, the enter reads its id; a dead answer means the
                # context was dead already (a stale handle): the enter goes ahead.
                if name == "enter over dev1" and func == "cuCtxGetId" and nth == 2 and dead:
                    assert exc is None, where
                    continue
                # Switching back, the exit reads the id of the context it restores; a dead answer
                # means it died in the block: not made current again, its place popped.
                if name == "exit to dev1" and func == "cuCtxGetId" and dead:
                    assert isinstance(exc, cyctx.ContextDestroyedError), f"{where}: raised {exc!r}"
                    assert after["depth"] == before["depth"] - 1 and after["current"] == 0, where
                    assert after["retains"] == before["retains"], where
                    tried += 1
                    continue
                if balanced_release or looks_reset:
                    # Not failures: a swallowed balancing release is remembered and released by
                    # close; CONTEXT_IS_DESTROYED from cuCtxGetId is what a reset looks like,
                    # and the guard re-activates the context.
                    assert exc is None, where
                    continue
                assert isinstance(exc, DriverError), f"{where}: raised {exc!r}"
                assert (exc.code, exc.call) == (code, func), where
                if name.startswith("exit"):
                    # The exit made the call again: the thread is as the enter found it.
                    found = _FOUND["state"]
                    assert (
                        after["current"] == found["current"] and after["depth"] == found["depth"]
                    ), where
                else:
                    assert (
                        after["current"] == before["current"] and after["depth"] == before["depth"]
                    ), where
                if name not in ("construct", "close") and not name.startswith(
                    ("construct from", "from_handle")
                ):
                    assert after["retains"] == before["retains"], where
                elif func != "cuDevicePrimaryCtxRelease":
                    # A failed construction keeps no retain (a failed close()'s guard is
                    # collected with the case and releases by __dealloc__).
                    assert after["retains"] == before["retains"], where
                tried += 1
        # Every retain taken in the case was released by its cleanup.
        assert retains() == base, f"{name}/{func}: retain leaked"
    assert tried > 0


@pytest.mark.parametrize("func", ["cuInit", "cuDeviceGetCount"])
def test_a_first_construction_whose_init_fails_raises_and_a_later_one_asks_no_more(sim, func):
    # cuInit and the device count are asked until they have once succeeded in the process; a
    # failure raises and keeps nothing; once known, the count is not asked again (a fault
    # injected then is never reached).
    proc = run_python(
        f"""
        from cyctx import ContextGuard, DriverError
        sim.inject_fault({func!r}, 999)
        try:
            ContextGuard(0)
        except DriverError as e:
            print("first", e.code, e.call, sim.retain_count(0))
        sim.clear_faults()
        ContextGuard(0).close()
        sim.inject_fault({func!r}, 999)
        ContextGuard(0).close()
        print("later", sim.retain_count(0))
        """,
        "from cyctx.testing import use_simulated_driver; sim = use_simulated_driver(2)\n",
    )
    assert proc.stdout.split("\n")[-3:-1] == [f"first 999 {func} 0", "later 0"], proc.stdout


def test_close_fault_keeps_guard_open_then_releases(sim):
    base = sim.retain_count(0)
    g = ContextGuard(0)
    for code in CODES:
        sim.inject_fault("cuDevicePrimaryCtxRelease", code)
        with pytest.raises(DriverError):
            g.close()
        assert not g.closed and sim.retain_count(0) == base + 1
    g.close()
    assert g.closed and sim.retain_count(0) == base


def test_shared_first_use_under_every_fault(sim):
    # A shared guard's first use publishes only a context it retained: a failed one keeps no
    # retain, so the next use tries again. In a child: a shared guard lives forever.
    out = run_child(
        """
        import cyctx
        sim = drivers.SIM
        FUNCS = %r
        CODES = (201, 709, 999, 2, 46)
        cyctx.ContextGuard(0).close()  # cuInit and the count, asked once per process
        counts = {f: sim.call_count(f) for f in FUNCS}
        cyctx.ContextGuard(1).close()  # what shared(1)'s first use calls, minus publication
        made = {f: sim.call_count(f) - counts[f] for f in FUNCS}
        made = {f: n for f, n in made.items() if n}
        base = drivers.retains()
        tried = 0
        for func, n in made.items():
            if func == "cuDevicePrimaryCtxRelease":
                continue  # the close above; shared() never releases
            for nth in range(1, n + 1):
                for code in CODES:
                    sim.inject_fault(func, code, nth=nth)
                    if func == "cuCtxGetId" and nth == 1 and code == 709:
                        # What a reset between the retain and the id read looks like: the
                        # construction re-activates and succeeds. (Not through shared(), which
                        # would publish the guard for the rest of this process.)
                        cyctx.ContextGuard(1).close()
                        sim.clear_faults()
                        assert drivers.retains() == base
                        print("REACTIVATED")
                        continue
                    try:
                        cyctx.ContextGuard.shared(1).handle
                        raise SystemExit(f"no error: {func} #{nth} {code}")
                    except cyctx.DriverError as e:
                        assert e.code == code, (func, nth, code, e)
                    finally:
                        sim.clear_faults()
                    assert drivers.retains() == base, (func, nth, code)
                    assert sim.stack_depth() == 0 and drivers.current() == 0
                    tried += 1
        g = cyctx.ContextGuard.shared(1)
        g.handle
        assert g is cyctx.ContextGuard.shared(1) and sim.retain_count(1) == base[1] + 1
        # A first use that reads 709 for the context it just retained (a reset landed in
        # between) re-activates it and publishes its guard.
        sim.inject_fault("cuCtxGetId", 709, nth=1)
        g0 = cyctx.ContextGuard.shared(0)
        g0.handle
        sim.clear_faults()
        assert sim.retain_count(0) == base[0] + 1 and not g0.closed
        with g0:
            assert drivers.current() == g0.handle
        print("TRIED", tried)
    """  # noqa: UP031 (the child code has braces; %r keeps them single)
        % (FUNCS,)
    )
    assert int(out.stdout.split("TRIED")[1]) >= 10
    assert "REACTIVATED" in out.stdout


# --- single faults ----------------------------------------------------------------------------


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
