"""Each driver call an exit makes, failed once and twice (simulated driver), on every way a block
is left and from every state an enter can find. Failed once, the exit tries again: the thread
is as the enter found it and the DriverError is still raised. Failed twice, the error names the
context left current. Retains stay balanced. The calls are counted, not listed by hand.
"""

import asyncio
import json
import re
import types
import warnings

import pytest
from helpers.children import run_child
from helpers.drivers import (
    create_context,
    current,
    driver,
    ok,
    set_current,
    sim_thread_state,
)
from helpers.finalizers import suspended_in
from helpers.threads import in_thread

import cyctx
from cyctx import ContextGuard, DriverError

FUNCS = (
    "cuCtxGetId",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxPushCurrent",
    "cuCtxPopCurrent",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuCtxGetDevice",
)


# --- the states an enter can find ---------------------------------------------------------------
# (prepare(g0, g1) before the enter, inside(g0, g1) in the block before it is left)
STATES = {
    "no context": (lambda g0, g1: None, lambda g0, g1: None),
    "another device's": (lambda g0, g1: set_current(g1.context), lambda g0, g1: None),
    "its own": (lambda g0, g1: set_current(g0.context), lambda g0, g1: None),
    "its own, the block switching device": (
        lambda g0, g1: set_current(g0.context),
        lambda g0, g1: set_current(g1.context),
    ),
}


# --- the ways a block is left -------------------------------------------------------------------
# Each runs a block of device 0 and calls at_exit() last thing before the block is left; returns
# the exception that leaving raised (None when it raised none).


class Boom(Exception):
    pass


def _with(g, at_exit):
    with g:
        at_exit()


def _decorator(g, at_exit):
    g(at_exit)()


def _device_decorator(g, at_exit):
    cyctx.device(0)(at_exit)()


def _bind(g, at_exit):
    cyctx.bind(at_exit, device=0)()


def _raising(g, at_exit):
    # The block's own exception wins; the exit's failure rides on it as a note.
    try:
        with g:
            at_exit()
            raise Boom("the block's own error")
    except Boom as e:
        notes = getattr(e, "__notes__", [])
        if notes:
            raise _Noted(notes) from None


class _Noted(Exception):
    """The exit failure a block's exception carried as a note."""


def _generator_closed(g, at_exit):
    it = suspended_in(g)
    at_exit()
    it.close()


def _coroutine_finished(g, at_exit):
    async def co():
        with g:
            await asyncio.sleep(0)
            at_exit()

    c = co()
    c.send(None)
    with pytest.raises(StopIteration):
        c.send(None)


def _coroutine_closed(g, at_exit):
    @types.coroutine
    def suspend():
        yield

    async def co():
        with g:
            await suspend()

    c = co()
    c.send(None)
    at_exit()
    c.close()


def _nogil_exit(g, at_exit):
    import cyctx_consumer  # tests/consumer, built against the installed cyctx

    cyctx_consumer.enter_nogil(g)
    at_exit()
    cyctx_consumer.exit_nogil(g)


def _switch_back(g, at_exit):
    import cyctx_consumer

    s = cyctx_consumer.switch_to_only(g.handle)
    at_exit()
    cyctx_consumer.switch_back_only(*s)


# Cython's ways: a nogil exit() and the raw layer's switch_back.
NATIVE = {"nogil exit()": _nogil_exit, "switch_back": _switch_back}

PATHS = {
    **NATIVE,
    "with": _with,
    "guard decorator": _decorator,
    "cyctx.device decorator": _device_decorator,
    "bind": _bind,
    "block raising": _raising,
    "generator closed": _generator_closed,
    "coroutine finished": _coroutine_finished,
    "coroutine closed": _coroutine_closed,
}


def _run(sim, path, state, fault=None):
    """Leave a block of device 0 by `path` from `state` on a fresh thread, with fault
    (func, nth, code, count) armed as the block is left. Returns (calls the exit made,
    state before the enter, state after the exit, exception)."""
    prepare, inside = STATES[state]

    def body():
        g0, g1 = ContextGuard(0), ContextGuard(1)
        seen = {}
        try:
            prepare(g0, g1)
            before = sim_thread_state(sim)

            def at_exit():
                inside(g0, g1)
                seen["counts"] = {f: sim.call_count(f) for f in FUNCS}
                if fault:
                    func, nth, code, count = fault
                    sim.inject_fault(func, code, nth=nth, count=count)

            exc = None
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                try:
                    PATHS[path](g0, at_exit)
                except Exception as e:  # noqa: BLE001 - examined by the caller
                    exc = e
            sim.clear_faults()
            calls = {f: sim.call_count(f) - seen["counts"][f] for f in FUNCS}
            after = sim_thread_state(sim)
        finally:
            sim.clear_faults()
            while current():
                set_current(None)
            g0.close()
            g1.close()
        return calls, before, after, exc

    return in_thread(body)


def _failure(exc):
    """The DriverError an exit raised, or the note its block's exception carried (as text)."""
    if isinstance(exc, _Noted):
        return None, "\n".join(exc.args[0])
    assert isinstance(exc, DriverError), f"raised {exc!r}"
    return exc, str(exc)


def _names_state(text, after):
    if after["current"]:
        return re.search(rf"0x0*{after['current']:x}\b", text) is not None
    return "no context is current" in text


def once_problems(sim, path, state):
    """What goes wrong when each call of the exit fails once (an empty list: nothing)."""
    calls, before, after, exc = _run(sim, path, state)
    if exc is not None or after != before:
        return [f"fails without a fault: {exc!r}, {before} -> {after}"]
    made = {f: n for f, n in calls.items() if n}
    if not made:
        return ["the exit made no driver call?"]
    problems = []
    for func, n in made.items():
        for nth in range(1, n + 1):
            for code in (999, 46):
                _, before, after, exc = _run(sim, path, state, (func, nth, code, 1))
                where = f"{func} call #{nth} -> {code}"
                if after != before:
                    problems.append(f"{where}: not as the enter found it: {before} -> {after}")
                if exc is None:
                    problems.append(f"{where}: the failure was lost")
                    continue
                err, text = _failure(exc)
                if err is not None and (err.code != code or err.call != func):
                    problems.append(f"{where}: raised {err!r}")
                if err is None and f"{func} failed" not in text:
                    problems.append(f"{where}: noted {text}")
    return problems


def twice_problems(sim, path, state):
    """What goes wrong when each call of the exit fails twice in a row."""
    calls, _, _, _ = _run(sim, path, state)
    problems = []
    for func, n in calls.items():
        for nth in range(1, n + 1):
            _, before, after, exc = _run(sim, path, state, (func, nth, 999, 2))
            where = f"{func} call #{nth} failing twice"
            if after["retains"] != before["retains"]:
                problems.append(f"{where}: retains {before['retains']} -> {after['retains']}")
            if exc is None:
                problems.append(f"{where}: the failure was lost")
                continue
            err, text = _failure(exc)
            if err is not None and err.code != 999:
                problems.append(f"{where}: raised {err!r}")
            if (after["current"], after["depth"]) != (before["current"], before["depth"]):
                if not _names_state(text, after):
                    problems.append(
                        f"{where}: left {after['current']:#x} current (depth {after['depth']}; "
                        f"{before['current']:#x}, depth {before['depth']} before) and says: {text}"
                    )
    return problems


# The paths of a device's shared guard run in a child: it holds its retain for the process's life.
SHARED = ("cyctx.device decorator", "bind")


def _problems(sim, which, path, state, consumer=None):
    if path not in SHARED and path not in NATIVE:
        return which(sim, path, state)
    out = run_child(f"""
        import json, sys, cyctx
        sys.path[:0] = [{consumer!r}] if {consumer!r} else []
        from guard import test_exit_faults as t
        cyctx.device(0).handle  # the shared guard's retain (its first use) before any state is read
        print("PROBLEMS", json.dumps(t.{which.__name__}(drivers.SIM, {path!r}, {state!r})))
    """)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("PROBLEMS ")][0]
    return json.loads(line[len("PROBLEMS ") :])


CASES = [(p, s) for p in PATHS if p not in NATIVE for s in STATES]
NATIVE_CASES = [(p, s) for p in NATIVE for s in STATES]


FAILING = {"once": once_problems, "twice": twice_problems}


@pytest.mark.parametrize("failing", list(FAILING))
@pytest.mark.parametrize(("path", "state"), CASES, ids=[f"{p}/{s}" for p, s in CASES])
def test_a_call_failing_in_an_exit_is_made_again_or_names_what_it_leaves(sim, path, state, failing):
    problems = _problems(sim, FAILING[failing], path, state)
    assert not problems, "\n".join(problems)


# A Cython consumer built against the installed cyctx (tests/test_consumer.py builds it).
import test_consumer  # noqa: E402

consumer_dir = test_consumer.consumer_dir  # a fixture


@pytest.mark.parametrize("failing", list(FAILING))
@pytest.mark.parametrize(("path", "state"), NATIVE_CASES, ids=[f"{p}/{s}" for p, s in NATIVE_CASES])
def test_a_call_failing_in_a_cython_exit_is_made_again_or_names_what_it_leaves(
    sim, consumer_dir, path, state, failing
):
    problems = _problems(sim, FAILING[failing], path, state, consumer_dir)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("failures", [1, 2])
def test_the_pop_in_place_of_a_context_destroyed_in_the_block_says_what_it_left(sim, failures):
    # The block destroyed what was current before it: the exit pops its switch in that place, as
    # cuCtxDestroy pops a current context. That pop failing once is made again; failing twice,
    # the error says the block's context is still current, not that it was popped.
    def body():
        ctx = create_context(0)  # current, depth 1
        g = ContextGuard(1)
        try:
            g.__enter__()  # replaces ctx on top of the stack
            ok(driver().cuCtxDestroy(ctx))  # not current here: only destroyed
            sim.inject_fault("cuCtxPopCurrent", 999, nth=1, count=failures)
            with pytest.raises(cyctx.ContextDestroyedError, match="did not survive") as ei:
                g.__exit__(None, None, None)
            sim.clear_faults()
            if failures == 1:
                assert current() == 0 and sim.stack_depth() == 0
                assert "popped its own switch" in str(ei.value)
                assert "no context is current" in str(ei.value)
            else:
                assert current() == g.handle and sim.stack_depth() == 1
                assert "could not pop its own switch" in str(ei.value)
                assert f"context 0x{g.handle:x} is current" in str(ei.value)
        finally:
            sim.clear_faults()
            while current():
                set_current(None)
            g.close()

    in_thread(body)
