"""The pytest plugin's --cyctx-trace: each test that left its thread's context changed, or
destroyed a context, is named with the call that did it and its line."""

import textwrap

pytest_plugins = ["pytester"]

CONFTEST = """
from cyctx.testing import use_simulated_driver
use_simulated_driver(2)
from cuda.bindings import driver as d
d.cuInit(0)
"""

TESTS = """
import cyctx
from cuda.bindings import driver as d

def test_clean():
    with cyctx.ContextGuard(1):
        pass

def test_leaks():
    err, p = d.cuDevicePrimaryCtxRetain(1)
    d.cuCtxSetCurrent(p)  # leak-line

def test_puts_back():
    d.cuCtxSetCurrent(None)  # back-line
    err, p = d.cuDevicePrimaryCtxRetain(0)
    d.cuDevicePrimaryCtxReset(0)  # reset-line
    d.cuDevicePrimaryCtxRelease(0)
"""


def _line(text, marker):
    (n,) = [i + 1 for i, ln in enumerate(text.splitlines()) if ln.endswith(f"# {marker}")]
    return n


def test_trace_names_the_test_the_call_and_the_line(pytester):
    pytester.makeconftest(CONFTEST)
    text = textwrap.dedent(TESTS).lstrip("\n")
    path = pytester.makepyfile(test_inner=text)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cyctx-trace")
    result.assert_outcomes(passed=3)
    out = result.stdout.str()
    assert "cyctx trace: " in out and " context events in 3 tests" in out
    lines = [ln for ln in out.splitlines() if ln.startswith("test_inner.py::")]
    assert len(lines) == 3, out
    # test_clean's guard, collected, handed its retain to the process: nothing was destroyed.
    assert not any(ln.startswith("test_inner.py::test_clean ") for ln in lines), out
    assert lines[0].startswith("test_inner.py::test_leaks left ")
    assert "(device 1, id 1)" in lines[0] and "(it found none)" in lines[0]
    assert lines[0].endswith(
        f"made current by cuCtxSetCurrent by cuda-bindings at {path}:{_line(text, 'leak-line')} (test_leaks)"
    )
    # test_puts_back undid test_leaks' change: a change against what it found, so it is named.
    assert lines[1].startswith("test_inner.py::test_puts_back left none current (it found ")
    assert lines[1].endswith(f"at {path}:{_line(text, 'back-line')} (test_puts_back)")
    assert lines[2].startswith("test_inner.py::test_puts_back destroyed ")
    assert lines[2].endswith(
        "context destroy starting inside cuDevicePrimaryCtxReset_v2 by cuda-bindings at "
        f"{path}:{_line(text, 'reset-line')} (test_puts_back)"
    )


def test_without_the_option_nothing_of_cyctx_is_imported_by_the_plugin(pytester):
    pytester.makepyfile(
        test_inner="""
        import sys
        def test_x():
            assert not [m for m in sys.modules if m.startswith("cyctx")]
        """
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
