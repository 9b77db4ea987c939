"""The context-leak checker for users' test suites (`cyctx.pytest_plugin`), run on suites that
leak on purpose, each in its own pytest process on the simulated driver (pytester)."""

import json
import textwrap

import pytest

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
    out = {{"libcuda_mapped": any("libcuda.so" in ln for ln in open("/proc/self/maps"))}}
    if MODE != "none":
        out["calls"] = {{f: SIM.call_count(f) for f in {functions!r}}}
    with open("driver_calls.json", "w") as f:
        json.dump(out, f)
"""

MUTATORS = (
    "cuInit",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxReset",
    "cuDevicePrimaryCtxSetFlags",
    "cuCtxPushCurrent",
    "cuCtxPopCurrent",
    "cuCtxSetCurrent",
    "cuCtxCreate",
    "cuCtxDestroy",
    "cuCtxSetFlags",
)
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
    start = next(i for i, ln in enumerate(lines) if "cyctx:" in ln)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith(("=", "cyctx:")))
    return lines[start:end]


def test_reports_each_test_that_leaks_with_before_after_and_device(pytester):
    _suite(pytester, "init", LEAKS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cyctx-check-contexts")
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


def test_fail_flag_fails_the_run_on_a_leak_only(pytester):
    _suite(pytester, "init", LEAKS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cyctx-contexts-fail")
    result.assert_outcomes(passed=6)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # A guard kept open (a retain taken and kept) is a note, not a leak: the run passes.
    pytester.makepyfile(
        test_inner="""
        import cyctx
        def test_keeps_a_guard():
            global G
            G = cyctx.ContextGuard(1)
    """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cyctx-contexts-fail")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "*= cyctx: no test left the CUDA context state changed =*",
            "cyctx: retains taken and kept*",
            "  test_inner.py::test_keeps_a_guard: device 1 primary context: inactive -> active; "
            "device 1 primary context retains: 0 -> 1",
        ]
    )


def test_it_only_reads(pytester):
    # The same suite with and without the checker: the same state-changing driver calls; the
    # checker's own calls are queries.
    _suite(pytester, "init", LEAKS)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=6)
    off = _calls(pytester)["calls"]
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


def test_off_unless_asked(pytester):
    _suite(pytester, "init", LEAKS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)
    assert "cyctx:" not in result.stdout.str()
    assert _calls(pytester)["calls"]["cuDevicePrimaryCtxGetState"] == 0, "the plugin read while off"


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
    else:  # without plugin autoloading, -p names it (and it is the entry point's plugin, not a second)
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
