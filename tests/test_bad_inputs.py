"""The table of bad inputs and misuse in docs/guarantees.md: every row is tried here, gets the error the table
says, and changes no state (the autouse fixture checks this thread's context state; the
retain counts are checked on the simulated driver). The table and this list must agree."""

import builtins
import os
import re
import warnings

import pytest

import cyctx
from cyctx import ContextGuard

from helpers.children import run_child
from helpers.drivers import SIM, device_count, driver, ok
from helpers.threads import in_thread

GUARANTEES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "guarantees.md")


def _closed():
    g = ContextGuard(0)
    g.close()
    return g


def _with(g):
    with g:
        pass


def _exit_on_other_thread():
    g = ContextGuard(0)
    g.__enter__()
    try:
        in_thread(g.__exit__, None, None, None)  # its error is the row's
    finally:
        g.__exit__(None, None, None)
        g.close()


def _out_of_order():
    a, b = ContextGuard(0), ContextGuard(0)
    a.__enter__()
    b.__enter__()
    try:
        a.__exit__(None, None, None)
    finally:
        b.__exit__(None, None, None)
        a.__exit__(None, None, None)
        a.close()
        b.close()


def _close_inside():
    g = ContextGuard(0)
    try:
        with g:
            g.close()
    finally:
        g.close()


def _leaked_push():
    g = ContextGuard(0)
    d = driver()

    def body():
        with g:
            ok(d.cuCtxPushCurrent(g.context))

    try:
        in_thread(body)  # its error is the row's
    finally:
        g.close()


def _reset_as_error():
    g = ContextGuard(0)
    ok(driver().cuDevicePrimaryCtxReset(ok(driver().cuDeviceGet(0))))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", cyctx.ContextResetWarning)
            _with(g)
    finally:
        g.close()


def _fork_child():
    out = run_child("""
        import cyctx
        from helpers.forking import raised_in_fork
        g = cyctx.ContextGuard(0)
        print("CHILD", raised_in_fork(g.__enter__))
    """)
    if "CHILD ForkError" in out.stdout:
        raise cyctx.ForkError("seen in the child")


def _all_raise(exc_name, calls):
    # A row that lists several inputs: each must raise the row's error on its own; the last
    # one's error is what the row's test sees.
    expected = getattr(cyctx, exc_name, None) or getattr(builtins, exc_name)
    for call in calls[:-1]:
        with pytest.raises(expected):
            call()
    calls[-1]()


def _stream_returning(value):
    return type("S", (), {"__cuda_stream__": lambda self: value})()


def _bad_cuda_streams():
    _all_raise("TypeError", [lambda v=v: ContextGuard(_stream_returning(v))
                             for v in [(), [0, 1], (1,), (0, "1"), (0, 1.5)]])


def _handles_out_of_range():
    _all_raise("ValueError", [lambda: ContextGuard.from_handle(-1), lambda: ContextGuard.from_handle(2**64)])


def _handles_not_ints():
    _all_raise("TypeError", [lambda: ContextGuard.from_handle(1.5), lambda: ContextGuard.from_handle("0x1234")])


# (the table's wording of the input, how to try it, the error the table names)
ROWS = [
    ("`ContextGuard(-1)`", lambda: ContextGuard(-1), "ValueError"),
    ("`ContextGuard(10**9)`", lambda: ContextGuard(10**9), "InvalidDeviceError"),
    ("`ContextGuard(n)` with n = device count", lambda: ContextGuard(device_count()), "InvalidDeviceError"),
    ("`ContextGuard(10**30)`", lambda: ContextGuard(10**30), "InvalidDeviceError"),
    ('`ContextGuard("0")`', lambda: ContextGuard("0"), "TypeError"),
    ("`ContextGuard(None)`", lambda: ContextGuard(None), "TypeError"),
    ("`ContextGuard(1.5)`", lambda: ContextGuard(1.5), "TypeError"),
    ("`ContextGuard(True)`", lambda: ContextGuard(True), "TypeError"),
    ("`ContextGuard()`", lambda: ContextGuard(), "TypeError"),
    ("`ContextGuard(0, 1)`", lambda: ContextGuard(0, 1), "TypeError"),
    ('`ContextGuard.shared("0")`', lambda: ContextGuard.shared("0"), "TypeError"),
    ("`ContextGuard.shared(True)`", lambda: ContextGuard.shared(True), "TypeError"),
    ("`with` a closed guard", lambda: _with(_closed()), "GuardError"),
    ("`.handle` of a closed guard", lambda: _closed().handle, "GuardError"),
    ("exit without enter", lambda: _closed().__exit__(None, None, None), "GuardError"),
    ("exit on another thread than the enter", _exit_on_other_thread, "GuardError"),
    ("exit out of LIFO order (generators, coroutines)", _out_of_order, "GuardError"),
    ("`close()` inside the guard's own `with`", _close_inside, "GuardError"),
    ("`close()` of `ContextGuard.shared(k)`", None, "GuardError"),
    ("block pushes a context and leaves it, from an empty stack", _leaked_push, "GuardError"),
    ("enter after a reset, with `ContextResetWarning` as an error", _reset_as_error, "ContextResetWarning"),
    ("enter in a child forked after CUDA was used", _fork_child, "ForkError"),
    ("`__cuda_stream__()` returning `()`, `[0, 1]`, `(1,)` or a non-int handle", _bad_cuda_streams, "TypeError"),
    ("`ContextGuard.from_handle(-1)` or `from_handle(2**64)`", _handles_out_of_range, "ValueError"),
    ('`ContextGuard.from_handle(1.5)` or `from_handle("0x1234")`', _handles_not_ints, "TypeError"),
]


def _table_rows():
    rows = {}
    with open(GUARANTEES, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for line in lines:
        m = re.match(r"^\|\s*(.+?)\s*\|\s*`(\w+)`", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def test_guarantees_table_matches_this_list():
    table = _table_rows()
    missing = [(what, exc) for what, _, exc in ROWS if table.get(what) != exc]
    assert missing == [], f"docs/guarantees.md's bad-input table disagrees with the tests: {missing}"
    assert len(ROWS) >= 15


@pytest.mark.parametrize("what, fn, exc", [r for r in ROWS if r[1] is not None], ids=[r[0] for r in ROWS if r[1] is not None])
def test_bad_input_row(what, fn, exc):
    before = [SIM.retain_count(i) for i in range(SIM.device_count)] if SIM else None
    expected = getattr(cyctx, exc, None) or getattr(builtins, exc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cyctx.ContextResetWarning)
        with pytest.raises(expected):
            fn()
    if SIM:
        assert [SIM.retain_count(i) for i in range(SIM.device_count)] == before


def test_close_of_shared_guard_row():
    # Its own child: a shared guard keeps its retain for the life of the process.
    out = run_child("""
        import cyctx
        try:
            cyctx.ContextGuard.shared(0).close()
        except cyctx.GuardError:
            print("GuardError")
    """)
    assert "GuardError" in out.stdout
