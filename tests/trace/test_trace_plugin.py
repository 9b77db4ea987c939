"""The pytest plugin's --cyctx-trace: each test that left its thread's context changed, or
destroyed a context, is named with the call that did it and its line; with the context check
on, its findings cite the call too; under pytest-xdist the workers' findings reach the
controller. The inner session runs on the driver of this run (`--driver`): on the real one it
needs libcupti, and the one device it can count on is device 0."""

import json
import textwrap

from helpers import drivers
from helpers.lines import line_of

pytest_plugins = ["pytester"]

CONFTEST = """
import os
if os.environ.get("CYCTX_TEST_DRIVER") != "real":
    from cyctx.testing import use_simulated_driver
    use_simulated_driver(2)
from cuda.bindings import driver as d
d.cuInit(0)
"""

TESTS = """
import json
import cyctx
from cuda.bindings import driver as d

DEV = min(1, d.cuDeviceGetCount()[1] - 1)  # a second device where there is one

def test_clean():
    with cyctx.ContextGuard(DEV):
        pass

def test_leaks():
    err, p = d.cuDevicePrimaryCtxRetain(DEV)
    d.cuCtxSetCurrent(p)  # leak-line
    # What the driver says of it, read by the test itself, not by the trace.
    with open("leak.json", "w") as f:
        json.dump({"device": DEV, "id": d.cuCtxGetId(p)[1]}, f)

def test_puts_back():
    d.cuCtxSetCurrent(None)  # back-line
    err, p = d.cuDevicePrimaryCtxRetain(DEV)  # the primary context test_clean's guard made
    d.cuDevicePrimaryCtxReset(DEV)  # reset-line
    d.cuDevicePrimaryCtxRelease(DEV)
"""


def _session(pytester, *args):
    pytester.makeconftest(CONFTEST)
    text = textwrap.dedent(TESTS).lstrip("\n")
    path = pytester.makepyfile(test_inner=text)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cyctx-trace", *args)
    out = result.stdout.str()
    result.assert_outcomes(passed=3)
    assert "not tracing" not in out, out
    leak = json.loads((pytester.path / "leak.json").read_text())
    return out, text, path, leak


def _check_findings(out, text, path, leak):
    assert "cyctx trace: " in out and " context events in 3 tests" in out, out
    # The trace's findings (the context check, when on, titles its findings with a bare node id).
    lines = [ln for ln in out.splitlines() if ln.startswith("test_inner.py::") and " " in ln]
    assert len(lines) == 3, out
    # test_clean's guard, collected, handed its retain to the process: nothing was destroyed.
    assert not any(ln.startswith("test_inner.py::test_clean ") for ln in lines), out
    assert lines[0].startswith("test_inner.py::test_leaks left "), out
    assert f"(device {leak['device']}, id {leak['id']}) current" in lines[0], (leak, out)
    assert "(it found none)" in lines[0], out
    assert lines[0].endswith(
        f"made current by cuCtxSetCurrent by cuda-bindings at {path}:{line_of('leak-line', text)} (test_leaks)"
    ), out
    # test_puts_back undid test_leaks' change: a change against what it found, so it is named.
    assert lines[1].startswith("test_inner.py::test_puts_back left none current (it found "), out
    assert lines[1].endswith(f"at {path}:{line_of('back-line', text)} (test_puts_back)"), out
    assert lines[2].startswith("test_inner.py::test_puts_back destroyed "), out
    assert lines[2].endswith(
        "context destroy starting inside cuDevicePrimaryCtxReset_v2 by cuda-bindings at "
        f"{path}:{line_of('reset-line', text)} (test_puts_back)"
    ), out


def test_trace_names_the_test_the_call_and_the_line(pytester):
    _check_findings(*_session(pytester))


def test_the_context_check_cites_the_call_that_made_the_context_current(pytester):
    out, text, path, leak = _session(pytester, "--cyctx-check-contexts")
    _check_findings(out, text, path, leak)
    at = f"at {path}:{line_of('leak-line', text)} (test_leaks)"
    (cited,) = [ln for ln in out.splitlines() if ln.strip().startswith("current context: none ->")]
    assert f"(device {leak['device']}, id {leak['id']})" in cited, out
    assert cited.endswith(f": made current by cuCtxSetCurrent by cuda-bindings {at}"), out
    back = [ln for ln in out.splitlines() if "-> none" in ln and "current context:" in ln]
    assert len(back) == 1 and back[0].endswith(
        f"made current by cuCtxSetCurrent by cuda-bindings at {path}:"
        f"{line_of('back-line', text)} (test_puts_back)"
    ), out


def test_under_xdist_each_worker_traces_and_the_controller_reports(pytester):
    # One worker: the three tests run in order on it, as they do without xdist.
    out, text, path, leak = _session(pytester, "-n", "1", "-p", "no:benchmark")
    _check_findings(out, text, path, leak)
    assert "1 worker" in out or "gw0" in out, out


def test_under_xdist_with_two_workers_every_test_is_accounted_for(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_inner="""
        from cuda.bindings import driver as d

        def test_leaks_a():
            err, p = d.cuDevicePrimaryCtxRetain(0)
            d.cuCtxSetCurrent(p)  # a-line

        def test_leaks_b():
            err, p = d.cuDevicePrimaryCtxRetain(0)
            d.cuCtxSetCurrent(p)  # b-line
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--cyctx-trace", "-n", "2", "-p", "no:benchmark"
    )
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert " context events in 2 tests" in out, out
    lines = sorted(ln for ln in out.splitlines() if ln.startswith("test_inner.py::") and " " in ln)
    assert [ln.split(" ", 1)[0] for ln in lines] == [
        "test_inner.py::test_leaks_a",
        "test_inner.py::test_leaks_b",
    ], out
    text = (pytester.path / "test_inner.py").read_text()
    for ln, marker in zip(lines, ("a-line", "b-line"), strict=True):
        assert " left " in ln and "(it found none)" in ln, out
        assert f"test_inner.py:{line_of(marker, text)} (" in ln, out


def test_without_the_option_nothing_of_cyctx_is_imported_by_the_plugin(pytester):
    pytester.makepyfile(
        test_inner="""
        import sys
        def test_x():
            assert not [m for m in sys.modules if m.startswith("cyctx")]
        """
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_the_inner_session_runs_on_this_runs_driver():
    # The tests above follow --driver: on the real one they trace the real driver.
    assert drivers.KIND in ("real", "sim")
