"""The context-leak checker for users' test suites (`cyctx.pytest_plugin`), run on suites that
leak on purpose, each in its own pytest process on the simulated driver (pytester)."""

import json
import subprocess
import sys
import textwrap

import pytest
from helpers.bindings_env import env_of, fake_bindings, site_without_cuda_bindings
from helpers.drivers import STATE_CHANGING
from helpers.threads import in_thread

from cyctx.pytest_plugin import ContextState, changes

pytest_plugins = ["pytester"]

# Inner conftest: the simulated driver (whatever this run uses: the leaks stay in the child),
# initialised or only loaded or not at all; at the end the driver calls made, for the tests.
CONFTEST = """
import json, os, sys
MODE = {mode!r}
if MODE != "none":
    from cyctx.testing import use_simulated_driver
    SIM = use_simulated_driver(2)
    if MODE == "init":
        from cuda.bindings import driver as d
        d.cuInit(0)

def pytest_unconfigure(config):
    out = {{"libcuda_mapped": any("libcuda.so" in l for l in open("/proc/self/maps"))}}
    if MODE != "none":
        out["calls"] = {{f: SIM.call_count(f) for f in {functions!r}}}
    with open("driver_calls.json", "w") as f:
        json.dump(out, f)
"""

MUTATORS = ("cuInit", *STATE_CHANGING)
QUERIES = (
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuCtxGetId",
    "cuDeviceGetCount",
    "cuDevicePrimaryCtxGetState",
)

LEAKS = """
import cyctx
from cuda.bindings import driver as d
from cyctx._doctor import StandInRuntime

def test_clean():
    g = cyctx.ContextGuard(1)
    with g:
        pass
    g.close()

def test_push():
    err, ctx = d.cuDevicePrimaryCtxRetain(0)
    d.cuCtxPushCurrent(ctx)

def test_set_device():
    StandInRuntime(13000).set_device(1)   # cudaSetDevice(1), as a CUDA 12+ runtime does it

def test_leaked_guard_entry():
    cyctx.ContextGuard.shared(0).__enter__()

def test_reset():
    d.cuDevicePrimaryCtxReset(1)

def test_clean_again():
    with cyctx.ContextGuard.shared(1):
        pass
"""


def _suite(pytester, mode, tests):
    pytester.makeconftest(CONFTEST.format(mode=mode, functions=MUTATORS + QUERIES))
    pytester.makepyfile(test_inner=textwrap.dedent(tests))


def _calls(pytester):
    return json.loads((pytester.path / "driver_calls.json").read_text())


def _leak_section(result):
    """The plugin's list of leaking tests in the terminal summary."""
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if "cyctx:" in line)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith(("=", "cyctx:")))
    return lines[start:end]


def test_reports_each_test_that_leaks_with_before_after_and_device(pytester):
    import xml.etree.ElementTree as ET

    _suite(pytester, "init", LEAKS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--cyctx-check-contexts", "--junitxml=out.xml"
    )
    result.assert_outcomes(passed=6)
    assert result.ret == 0  # reports, does not fail, unless asked
    section = "\n".join(_leak_section(result))
    result.stdout.fnmatch_lines(
        [
            "*= cyctx: 4 tests left the CUDA context state changed =*",
            "test_inner.py::test_push",
            "    current context: none -> 0x* (device 0, id *)",
            "    context stack depth: 0 -> 1",
            "test_inner.py::test_set_device",
            "    current context: 0x* (device 0, id *) -> 0x* (device 1, id *)",
            "test_inner.py::test_leaked_guard_entry",
            "    current context: 0x* (device 1, id *) -> 0x* (device 0, id *)",
            "    cyctx guard entries open on this thread: 0 -> 1",
            "test_inner.py::test_reset",
            "    device 1 primary context: active -> inactive",
        ]
    )
    assert "test_clean\n" not in section + "\n" and "test_clean_again" not in section, section
    # The first use of device 0 activated it: said, as a note, with the test that did it; the
    # shared guard test_clean_again made keeps its retain: a note too, below the leaks.
    assert "device 0 primary context: inactive -> active  (note)" in section
    result.stdout.fnmatch_lines(
        [
            "cyctx: retains taken and kept*",
            "  test_inner.py::test_clean_again: device 1 primary context: inactive -> active; *",
        ]
    )
    # The findings, notes too, are in the JUnit XML: a property of each test's case.
    props = {}
    for case in ET.parse(pytester.path / "out.xml").iter("testcase"):
        for p in case.iter("property"):
            assert p.get("name") == "cyctx_context_change"
            props[case.get("name")] = json.loads(p.get("value"))
    assert set(props) == {
        "test_push",
        "test_set_device",
        "test_leaked_guard_entry",
        "test_reset",
        "test_clean_again",
    }
    assert props["test_reset"]["changes"] == [
        ["leak", "device 1 primary context: active -> inactive"]
    ]
    assert (
        props["test_push"]["kind"] == "test"
        and props["test_push"]["name"] == "test_inner.py::test_push"
    )


@pytest.mark.parametrize("how", ["option", "ini"])
def test_fail_mode_is_an_error_at_the_teardown_of_each_leaking_test(pytester, how):
    _suite(pytester, "init", LEAKS)
    if how == "ini":
        pytester.makeini("[pytest]\ncyctx_contexts_fail = true\n")
    args = ["--cyctx-contexts-fail"] if how == "option" else []
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    result.assert_outcomes(passed=6, errors=4)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*_ ERROR at teardown of test_push _*",
            "cyctx: current context: none -> 0x* (device 0, id *); context stack depth: 0 -> 1",
            "test_inner.py::test_push",
            "    current context: none -> 0x* (device 0, id *)",
            "    context stack depth: 0 -> 1",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "ERROR test_inner.py::test_push - Failed: cyctx: current context: *",
            "ERROR test_inner.py::test_set_device - Failed: cyctx: current context: *",
            "ERROR test_inner.py::test_leaked_guard_entry - Failed: cyctx: current context*",
            "ERROR test_inner.py::test_reset - Failed: cyctx: device 1 primary context: *",
        ]
    )
    # The summary stays.
    result.stdout.fnmatch_lines(["*= cyctx: 4 tests left the CUDA context state changed =*"])


def test_fail_flag_fails_the_run_on_a_leak_only(pytester):
    # A guard kept open (a retain taken and kept) is a note, not a leak: the run passes.
    _suite(
        pytester,
        "init",
        "import cyctx\ndef test_keeps_a_guard():\n    global G\n    G = cyctx.ContextGuard(1)\n",
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cyctx-contexts-fail")
    assert result.ret == 0
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*= cyctx: no test left the CUDA context state changed =*",
            "cyctx: retains taken and kept*",
            "  test_inner.py::test_keeps_a_guard: device 1 primary context: inactive -> active; "
            "device 1 primary context retains: 0 -> 1",
        ]
    )


def test_off_unless_asked_and_then_it_only_reads(pytester):
    # The same suite without and with the checker: off, it says and reads nothing; on, the
    # same state-changing driver calls, the checker's own calls being queries.
    _suite(pytester, "init", LEAKS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)
    assert "cyctx:" not in result.stdout.str()
    off = _calls(pytester)["calls"]
    assert off["cuDevicePrimaryCtxGetState"] == 0, "the plugin read while off"
    pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--cyctx-check-contexts"
    ).assert_outcomes(passed=6)
    on = _calls(pytester)["calls"]
    assert {f: on[f] for f in MUTATORS} == {f: off[f] for f in MUTATORS}
    assert all(on[f] > off[f] for f in ("cuCtxGetCurrent", "cuDevicePrimaryCtxGetState")), (on, off)


def test_never_initialises_or_loads_the_driver(pytester):
    # Loaded but not initialised: the checker must not call cuInit (a parent that did could
    # no longer fork workers that use CUDA).
    _suite(pytester, "loaded", "def test_a():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cyctx-check-contexts")
    result.assert_outcomes(passed=1)
    assert _calls(pytester)["calls"]["cuInit"] == 0
    result.stdout.fnmatch_lines(["*= cyctx: no test left the CUDA context state changed =*"])
    # Nothing loaded the driver: neither does the checker.
    _suite(pytester, "none", "def test_a():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cyctx-check-contexts")
    result.assert_outcomes(passed=1)
    assert _calls(pytester)["libcuda_mapped"] is False


@pytest.mark.parametrize("how", ["ini", "-p"])
def test_other_ways_to_turn_it_on(pytester, monkeypatch, how):
    _suite(
        pytester,
        "init",
        "import cyctx\ndef test_enter():\n    cyctx.ContextGuard.shared(0).__enter__()\n",
    )
    if how == "ini":
        pytester.makeini("[pytest]\ncyctx_check_contexts = true\n")
        args = []
    else:  # without plugin autoloading, -p names it (the entry point's plugin, not a second)
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
        args = ["-p", "cyctx.pytest_plugin", "--cyctx-check-contexts"]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*= cyctx: 1 test left the CUDA context state changed =*"])


def test_p_option_beside_the_entry_point_is_one_plugin(pytester):
    _suite(pytester, "init", "def test_a():\n    pass\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "cyctx.pytest_plugin", "--cyctx-check-contexts"
    )
    result.assert_outcomes(passed=1)
    assert result.stdout.str().count("cyctx: no test left") == 1


# --- the classification of changes, directly ----------------------------------------------


ACTIVE, INACTIVE = (True, 0), (False, 0)


def _state(current=0, cid=None, primaries=(ACTIVE, INACTIVE), retains=None, driver="ok"):
    return ContextState(driver, current, 0 if current else None, cid, primaries, 0, None, retains)


def test_a_reset_of_the_current_context_is_a_leak():
    # The same handle with a new id: the context was reset and made again under the test.
    assert changes(_state(0x1000, cid=5), _state(0x1000, cid=9)) == [
        ("leak", "current context: 0x1000 (device 0, id 5) -> 0x1000 (device 0, id 9)")
    ]
    assert changes(_state(0x1000, cid=5), _state(0x1000, cid=None)) == [
        (
            "leak",
            "current context: 0x1000 (device 0, id 5) -> "
            "0x1000 (device 0, dead (cuCtxGetId fails))",
        )
    ]
    assert changes(_state(0x1000, cid=5), _state(0x1000, cid=5)) == []


def test_a_primary_context_re_flagged_is_a_leak():
    assert changes(
        _state(primaries=(ACTIVE, INACTIVE)), _state(primaries=((True, 4), INACTIVE))
    ) == [("leak", "device 0 primary context: active -> active, flags 0x4")]


def test_a_first_activation_is_a_note_and_a_deactivation_a_leak():
    assert changes(
        _state(primaries=(INACTIVE, INACTIVE)), _state(primaries=(INACTIVE, ACTIVE))
    ) == [("note", "device 1 primary context: inactive -> active")]
    assert changes(
        _state(primaries=(INACTIVE, ACTIVE)), _state(primaries=(INACTIVE, INACTIVE))
    ) == [("leak", "device 1 primary context: active -> inactive")]
    # Before the driver is initialised no primary context is active: activated since is a note.
    assert changes(ContextState("not initialised"), _state(primaries=(ACTIVE, INACTIVE))) == [
        ("note", "device 0 primary context: inactive -> active")
    ]


def test_a_retain_released_is_a_leak_and_one_kept_a_note():
    assert changes(_state(retains=(2, 0)), _state(retains=(1, 0))) == [
        ("leak", "device 0 primary context retains: 2 -> 1")
    ]
    assert changes(_state(retains=(1, 0)), _state(retains=(1, 1))) == [
        ("note", "device 1 primary context retains: 0 -> 1")
    ]


def test_a_stack_that_shrank_or_grew_is_a_leak_even_with_the_same_context_current():
    # Two pushes of one context, one popped: the current context is the same, only the depth
    # of the thread's stack tells.
    def deep(n):
        return ContextState("ok", 0x1000, 0, 5, (ACTIVE, INACTIVE), 0, n, None)

    assert changes(deep(2), deep(1)) == [("leak", "context stack depth: 2 -> 1")]
    assert changes(deep(1), deep(2)) == [("leak", "context stack depth: 1 -> 2")]
    assert changes(deep(1), deep(1)) == []


def test_the_driver_lost_is_a_leak_and_found_is_not():
    assert changes(_state(), ContextState("deinitialised")) == [
        ("leak", "driver: ok -> deinitialised")
    ]
    assert changes(ContextState("not loaded"), _state(primaries=(INACTIVE, INACTIVE))) == []


# --- checking a thread of the test's own ----------------------------------------------------


def test_check_thread_raises_for_a_leak_on_that_thread():
    # This suite runs on the simulated driver; the thread's state is put back after.
    from cuda.bindings import driver as d

    from cyctx.pytest_plugin import ContextStateChanged, check_thread

    def leaks():
        d.cuInit(0)
        err, ctx = d.cuDevicePrimaryCtxRetain(0)
        try:
            with check_thread() as found:
                d.cuCtxPushCurrent(ctx)
        finally:
            d.cuCtxPopCurrent()
            d.cuDevicePrimaryCtxRelease(0)
        return found

    with pytest.raises(ContextStateChanged, match=r"(?s)thread .*current context: none -> 0x"):
        in_thread(leaks)
    assert isinstance(ContextStateChanged("x"), AssertionError)  # pytest shows it as a failure

    def clean():
        with check_thread() as found:
            err, ctx = d.cuDevicePrimaryCtxRetain(1)
            d.cuCtxPushCurrent(ctx)
            d.cuCtxPopCurrent()
            d.cuDevicePrimaryCtxRelease(1)
        return found

    assert in_thread(clean) == []

    def raises_inside():
        err, ctx = d.cuDevicePrimaryCtxRetain(0)
        try:
            with check_thread():
                d.cuCtxPushCurrent(ctx)
                raise ValueError("the block's own error")
        finally:
            d.cuCtxPopCurrent()
            d.cuDevicePrimaryCtxRelease(0)

    # The block's error is the one that propagates: it is not replaced by the check's.
    with pytest.raises(ValueError, match="the block's own error"):
        in_thread(raises_inside)


# --- pytest-xdist ---------------------------------------------------------------------------

XDIST_LEAKS = """
import cyctx
from cuda.bindings import driver as d

def test_clean_a():
    pass

def test_push():
    err, ctx = d.cuDevicePrimaryCtxRetain(0)
    d.cuCtxPushCurrent(ctx)

def test_clean_b():
    pass

def test_shared_entered():
    cyctx.ContextGuard.shared(1).__enter__()

def test_clean_c():
    pass
"""


@pytest.mark.parametrize("dist", [["-n", "2"], ["-n", "4"], ["-n", "2", "--dist", "loadfile"]])
def test_xdist_workers_findings_are_reported_once_and_fail_the_run(pytester, dist):
    pytest.importorskip("xdist")
    pytester.makeconftest(CONFTEST.format(mode="init", functions=()))
    pytester.makepyfile(test_one=XDIST_LEAKS, test_two=XDIST_LEAKS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", *dist, "--cyctx-check-contexts"
    )
    result.assert_outcomes(passed=10)
    assert result.ret == 0
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["*= cyctx: 4 tests left the CUDA context state changed =*"])
    for test in ("test_one.py::test_push", "test_two.py::test_push"):
        assert out.count(f"\n{test}\n") == 1, out
    for test in ("test_one.py::test_shared_entered", "test_two.py::test_shared_entered"):
        assert out.count(f"\n{test}\n") == 1, out
    assert "cyctx: no test left" not in out

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *dist, "--cyctx-contexts-fail")
    result.assert_outcomes(passed=10, errors=4)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*= cyctx: 4 tests left the CUDA context state changed =*"])
    errors = sorted(x.split(" - ")[0] for x in result.outlines if x.startswith("ERROR "))
    assert errors == [
        "ERROR test_one.py::test_push",
        "ERROR test_one.py::test_shared_entered",
        "ERROR test_two.py::test_push",
        "ERROR test_two.py::test_shared_entered",
    ]


# --- pytest-run-parallel ---------------------------------------------------------------------

PARALLEL_LEAKS = """
import cyctx
from cuda.bindings import driver as d

def test_clean():
    with cyctx.ContextGuard.shared(1):
        pass

def test_push():
    err, ctx = d.cuDevicePrimaryCtxRetain(0)
    d.cuCtxPushCurrent(ctx)

def test_shared_entered():
    cyctx.ContextGuard.shared(1).__enter__()

def test_clean_again(thread_index):
    g = cyctx.ContextGuard(thread_index % 2)
    with g:
        pass
    g.close()
"""


def test_pytest_run_parallel_threads_are_checked(pytester):
    # pytest-run-parallel calls each test's function on threads of its own: what the function
    # leaves on them is the test's, said once with how many threads it was found on.
    pytest.importorskip("pytest_run_parallel")
    pytester.makeconftest(CONFTEST.format(mode="init", functions=()))
    pytester.makepyfile(test_inner=PARALLEL_LEAKS)
    args = ["-p", "no:cacheprovider", "--parallel-threads=4"]
    result = pytester.runpytest_subprocess(*args, "--cyctx-check-contexts")
    result.assert_outcomes(passed=4)
    assert result.ret == 0
    on = " (on 4 of the threads pytest-run-parallel ran the test on)"
    result.stdout.fnmatch_lines(
        [
            "Collected 4 items to run in parallel",
            "*= cyctx: 2 tests left the CUDA context state changed =*",
            "test_inner.py::test_push",
            f"    current context: none -> 0x* (device 0, id *){on}",
            f"    context stack depth: 0 -> 1{on}",
            "test_inner.py::test_shared_entered",
            f"    current context: none -> 0x* (device 1, id *){on}",
            f"    cyctx guard entries open on this thread: 0 -> 1{on}",
        ]
    )
    out = result.stdout.str()
    assert "test_inner.py::test_clean\n" not in out and "test_clean_again" not in out, out

    result = pytester.runpytest_subprocess(*args, "--cyctx-contexts-fail")
    result.assert_outcomes(passed=4, errors=2)
    errors = sorted(x.split(" - ")[0] for x in result.outlines if x.startswith("ERROR "))
    assert errors == ["ERROR test_inner.py::test_push", "ERROR test_inner.py::test_shared_entered"]


# --- fixtures -------------------------------------------------------------------------------


@pytest.mark.parametrize("scope", ["function", "module", "session"])
@pytest.mark.parametrize("held_before", [False, True])
def test_a_balanced_fixture_is_no_leak(pytester, scope, held_before):
    # Retains in setup and releases in teardown (the retain count returns to its value before
    # the fixture; with nothing else holding it the primary context goes inactive again), and
    # a fixture that pushes its context in setup and pops it in teardown.
    _suite(
        pytester,
        "init",
        f"""
        import pytest, cyctx
        from cuda.bindings import driver as d

        HELD = cyctx.ContextGuard(0) if {held_before} else None

        @pytest.fixture(scope="{scope}")
        def guard():
            g = cyctx.ContextGuard(0)
            yield g
            g.close()

        @pytest.fixture(scope="{scope}")
        def pushed():
            err, ctx = d.cuDevicePrimaryCtxRetain(1)
            d.cuCtxPushCurrent(ctx)
            yield ctx
            d.cuCtxPopCurrent()
            d.cuDevicePrimaryCtxRelease(1)

        def test_a(guard):
            with guard:
                pass

        def test_b(guard, pushed):
            pass

        def test_c(guard):
            pass

        KEPT = []

        def test_keeps_a_retain(guard):
            KEPT.append(cyctx.ContextGuard(0))
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cyctx-contexts-fail")
    result.assert_outcomes(passed=4)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*= cyctx: no test left the CUDA context state changed =*"])
    # The retain a test keeps is the test's note (it keeps device 0's primary context active
    # after the fixture's teardown, which does not make that the fixture's).
    notes = result.stdout.str().split("retains taken and kept")[1].splitlines()[1:]
    assert notes[0].startswith("  test_inner.py::test_keeps_a_retain: "), notes
    assert "fixture" not in "\n".join(notes), notes


def test_a_fixture_s_change_is_the_fixture_s_not_the_test_s(pytester):
    _suite(
        pytester,
        "init",
        """
        import pytest, cyctx
        from cuda.bindings import driver as d

        @pytest.fixture(scope="module")
        def pushes():
            err, ctx = d.cuDevicePrimaryCtxRetain(0)
            d.cuCtxPushCurrent(ctx)
            yield

        @pytest.fixture
        def releases_at_teardown():
            # A teardown that releases what it never retained.
            yield
            d.cuDevicePrimaryCtxRelease(1)

        @pytest.fixture(scope="session")
        def keeps():
            return cyctx.ContextGuard(1)

        def test_first(keeps, pushes):
            pass

        def test_second(releases_at_teardown):
            pass

        def test_last():
            pass
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cyctx-check-contexts")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*= cyctx: 2 fixtures left the CUDA context state changed =*",
            "fixture 'releases_at_teardown' (function scope, torn down at the end of "
            "test_inner.py::test_second)",
            "    device 1 primary context: active -> inactive",
            "    device 1 primary context retains: 1 -> 0",
            "fixture 'pushes' (module scope, torn down at the end of test_inner.py::test_last)",
            "    current context: none -> 0x* (device 0, id *)",
            "    context stack depth: 0 -> 1",
            "    device 0 primary context: inactive -> active  (note)",
            "    device 0 primary context retains: 0 -> 1  (note)",
            "cyctx: retains taken and kept*",
            "  fixture 'keeps' (session scope, torn down at the end of test_inner.py::test_last): "
            "device 1 primary context: inactive -> active; "
            "device 1 primary context retains: 0 -> 1",
        ]
    )
    assert "test_inner.py::test_first\n" not in result.stdout.str() + "\n"
    # Under the fail mode: an error at the teardown that tore the fixture down, naming it.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cyctx-contexts-fail")
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*_ ERROR at teardown of test_second _*",
            "cyctx: device 1 primary context: active -> inactive; "
            "device 1 primary context retains: 1 -> 0",
            "fixture 'releases_at_teardown' (function scope, *",
        ]
    )
    result.stdout.fnmatch_lines(
        ["ERROR test_inner.py::test_second - *", "ERROR test_inner.py::test_last - *"]
    )


def test_a_test_s_change_beside_fixtures_is_the_test_s(pytester):
    # The test pushes a context on top of the one a fixture made current: the test's, from the
    # context the fixture left to the one the test left.
    _suite(
        pytester,
        "init",
        """
        import pytest
        from cuda.bindings import driver as d

        @pytest.fixture
        def on_device_0():
            err, ctx = d.cuDevicePrimaryCtxRetain(0)
            d.cuCtxPushCurrent(ctx)
            yield
            d.cuCtxSetCurrent(None)
            d.cuDevicePrimaryCtxRelease(0)

        def test_pushes_too(on_device_0):
            err, ctx = d.cuDevicePrimaryCtxRetain(1)
            d.cuCtxPushCurrent(ctx)
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cyctx-check-contexts")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*= cyctx: 1 test and 1 fixture left the CUDA context state changed =*",
            "test_inner.py::test_pushes_too",
            "    current context: 0x* (device 0, id *) -> 0x* (device 1, id *)",
            "    context stack depth: 1 -> 2",
            "    device 1 primary context: inactive -> active  (note)",
            "    device 1 primary context retains: 0 -> 1  (note)",
            # Its teardown unbinds the top (the test's context: the stack is as deep as the
            # fixture found it) and releases device 0: it leaves its own context, dead, current.
            "fixture 'on_device_0' (function scope, *)",
            "    current context: none -> 0x* (device 0, dead (cuCtxGetId fails))",
            "=*",
        ]
    )


# --- pytest conventions -----------------------------------------------------------------------


def test_the_marker_allows_a_test_s_change_with_its_reason(pytester):
    _suite(
        pytester,
        "init",
        """
        import pytest
        from cuda.bindings import driver as d

        @pytest.mark.cyctx_allow_context_change(reason="makes device 0 current for the rest")
        def test_allowed():
            err, ctx = d.cuDevicePrimaryCtxRetain(0)
            d.cuCtxPushCurrent(ctx)
        """,
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--strict-markers", "--cyctx-contexts-fail"
    )
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "*= cyctx: no test left the CUDA context state changed =*",
            "cyctx: changes allowed by @pytest.mark.cyctx_allow_context_change:",
            "  test_inner.py::test_allowed (makes device 0 current for the rest): "
            "current context: none -> 0x*",
        ]
    )
    # Registered with the check off too (--strict-markers knows it).
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--strict-markers")
    result.assert_outcomes(passed=1)
    # Without a reason: an error of that test, saying what to write.
    pytester.makepyfile(
        test_inner="""
        import pytest
        @pytest.mark.cyctx_allow_context_change
        def test_no_reason():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cyctx-check-contexts")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*cyctx_allow_context_change needs a reason*"])


def test_help_names_the_options_and_the_ini_settings(pytester):
    result = pytester.runpytest_subprocess("--help")
    out = result.stdout.str()
    for word in (
        "--cyctx-check-contexts",
        "--cyctx-contexts-fail",
        "cyctx_check_contexts",
        "cyctx_contexts_fail",
        "thread that runs the tests",
    ):
        assert word in out, word


# --- inert until asked ------------------------------------------------------------------------

UNRELATED = """
import sys

def test_unrelated(pytestconfig):
    # The plugin is loaded (through the entry point), and imported nothing of cyctx; of CUDA
    # and ctypes only what the environment imports without it (a .pth file, another plugin:
    # the run without ours says which).
    assert pytestconfig.pluginmanager.has_plugin("cyctx.pytest_plugin") == OURS
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("cyctx", "cuda", "ctypes"))
    assert not [m for m in loaded if m.split(".")[0] == "cyctx"], loaded
    print("LOADED", loaded)
"""


def _run_unrelated(pytester, env_path, *args, isolated, ours=True):
    pytester.makepyfile(test_unrelated=f"OURS = {ours}\n" + UNRELATED)
    env = env_of(env_path)
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
    cmd = [
        sys.executable,
        *(["-S"] if isolated else []),
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-s",
        *([] if ours else ["-p", "no:cyctx.pytest_plugin"]),
        *args,
    ]
    return subprocess.run(
        cmd, cwd=pytester.path, env=env, capture_output=True, text=True, timeout=120
    )


def _loaded_by_others(pytester, env_path, isolated):
    """What of ctypes the environment's other plugins import: the same suite without ours."""
    r = _run_unrelated(pytester, env_path, isolated=isolated, ours=False)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
    return [ln for ln in r.stdout.splitlines() if ln.startswith("LOADED")]


def _loaded(r):
    return [ln for ln in r.stdout.splitlines() if ln.startswith("LOADED")]


def test_an_environment_without_cuda_bindings_runs_an_unrelated_suite(pytester, tmp_path):
    farm = site_without_cuda_bindings(tmp_path)
    check = subprocess.run(
        [sys.executable, "-S", "-c", "import cyctx"],
        env=env_of(farm),
        capture_output=True,
        text=True,
    )
    assert "cuda-bindings is not installed" in check.stderr, (
        check.stderr
    )  # the environment is what it says
    r = _run_unrelated(pytester, farm, isolated=True)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
    assert _loaded(r) == _loaded_by_others(pytester, farm, isolated=True), r.stdout
    # Asked for, the check runs there too: it needs neither cyctx nor cuda-bindings.
    r = _run_unrelated(pytester, farm, "--cyctx-contexts-fail", "-k", "nothing", isolated=True)
    assert r.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, r.stdout + r.stderr
    assert "cyctx: no test left the CUDA context state changed" in r.stdout


def test_an_environment_with_unsupported_cuda_bindings_runs_an_unrelated_suite(pytester, tmp_path):
    # (That `import cyctx` stops there: test_doctor_bindings.py.)
    stub = fake_bindings(tmp_path, "11.8.0")
    r = _run_unrelated(pytester, stub, isolated=False)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
    assert _loaded(r) == _loaded_by_others(pytester, stub, isolated=False), r.stdout


def test_the_plugin_module_imports_only_pytest_and_the_standard_library():
    # Besides itself, only _cyctx_libcuda: the stdlib-only lookup it shares with cyctx.testing,
    # a top-level package of cyctx's distribution.
    code = (
        "import sys, pytest; before = set(sys.modules); import _cyctx_pytest; "
        "print(sorted({m.split('.')[0] for m in set(sys.modules) - before}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    new = set(eval(out)) - {"_cyctx_pytest", "_cyctx_libcuda"}
    assert new <= set(sys.stdlib_module_names), new - set(sys.stdlib_module_names)
    assert not new & {"cyctx", "cuda", "ctypes"}, new


def test_a_fixture_that_puts_back_what_a_test_changed_is_not_blamed(pytester):
    # An autouse fixture whose teardown unbinds whatever a test left current: the state after
    # its teardown is the state before its setup, so it changed nothing; the test did.
    _suite(
        pytester,
        "init",
        """
        import pytest
        from cuda.bindings import driver as d

        @pytest.fixture(autouse=True)
        def unbinds():
            yield
            while int(d.cuCtxGetCurrent()[1]):
                d.cuCtxPopCurrent()

        def test_leaves_a_context():
            err, ctx = d.cuDevicePrimaryCtxRetain(0)
            d.cuCtxPushCurrent(ctx)
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cyctx-check-contexts")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*= cyctx: 1 test left the CUDA context state changed =*",
            "test_inner.py::test_leaves_a_context",
            "    current context: none -> 0x* (device 0, id *)",
        ]
    )
    assert "fixture 'unbinds'" not in result.stdout.str()
