"""The doctor with a trace running: its findings about the current context name the traced call
that made it current, and a reset guard's the call that reset its context; without a trace
they are as they always are."""

import inspect

from helpers import drivers
from helpers.lines import line_of

import cyctx


def _finding(diag, code):
    (f,) = [f for f in diag.findings if f.code == code]
    return f


def test_a_dead_current_context_is_cited_with_the_call_that_made_it_current(d):
    p = drivers.ok(d.cuDevicePrimaryCtxRetain(0))
    try:
        with cyctx.trace() as t:
            drivers.ok(d.cuCtxSetCurrent(p))  # made-current
            drivers.ok(d.cuDevicePrimaryCtxRelease(0))  # destroyed-here
            diag = cyctx.diagnose()
        f = _finding(diag, "inactive_primary_current")
        fn = "(test_a_dead_current_context_is_cited_with_the_call_that_made_it_current)"
        assert f.explanation.endswith(
            "The running trace saw it made current by cuCtxSetCurrent by cuda-bindings at "
            f"{__file__}:{line_of('made-current')} {fn}, then destroyed: context destroy starting "
            f"inside cuDevicePrimaryCtxRelease_v2 by cuda-bindings at {__file__}:"
            f"{line_of('destroyed-here')} {fn}."
        ), f.explanation
        assert t.reason is None
        untraced = _finding(cyctx.diagnose(), "inactive_primary_current")
        assert "running trace" not in untraced.explanation
        assert f.explanation.startswith(untraced.explanation)
    finally:
        drivers.ok(d.cuCtxSetCurrent(None))


def _reset_line():
    src, first = inspect.getsourcelines(drivers.reset_primary)
    (k,) = [i for i, text in enumerate(src) if "ok(d.cuDevicePrimaryCtxReset" in text]
    return first + k


def test_a_reset_guard_is_cited_with_the_reset(d):
    g = cyctx.ContextGuard(0)
    try:
        with g:
            pass
        with cyctx.trace():
            drivers.reset_primary(0)  # reset-here
            diag = cyctx.diagnose()
        f = _finding(diag, "context_reset")
        assert f.explanation.endswith(
            "The running trace saw it reset: context destroy starting inside "
            f"cuDevicePrimaryCtxReset_v2 by cuda-bindings at {drivers.__file__}:"
            f"{_reset_line()} (reset_primary)."
        ), f.explanation
        assert "running trace" not in _finding(cyctx.diagnose(), "context_reset").explanation
    finally:
        g.close()
