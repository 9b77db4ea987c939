"""The plugin when the driver is initialised by the suite itself: the first fixture or test to
call cuInit, retain a primary context, push one, make one current or enter a cyctx guard.

A reading taken before the driver is initialised has nothing current, no primary context
active, no stack, no retains and no guard entries: the first setup's retains and pushes count
from zero, so its teardown's releases and pops cancel them. Each case runs in its own pytest
process (pytester), under the fail mode, at each fixture scope and in the test itself, with and
without pytest-xdist, on the simulated driver and (marked gpu) on the real one."""

import itertools
import textwrap
from fnmatch import fnmatch

import pytest

pytest_plugins = ["pytester"]

# The inner suite's conftest: the driver chosen and never initialised (the suite does it).
# "sim-bare" loads the simulated driver's library as a wrong LD_LIBRARY_PATH would, without
# importing cyctx: the first fixture or test to use a guard is the first to import cyctx, and
# the plugin sees neither stack depth nor retains, as on the real driver.
CONFTEST = {
    "sim": "from cyctx.testing import use_simulated_driver\n\nuse_simulated_driver(2)\n",
    "sim-bare": "import ctypes\n\nctypes.CDLL({path!r}, mode=ctypes.RTLD_GLOBAL).cyctxsim_configure(2)\n",
    "real": "",  # the real driver, loaded and initialised by whatever first needs it
}


# What the first user does at setup (the driver not yet initialised), and undoes at teardown.
ACTIONS = {
    "init": ("d.cuInit(0)", "pass"),
    "retain": (
        "d.cuInit(0)\nerr, ctx = d.cuDevicePrimaryCtxRetain(0)\nassert err == 0, err",
        "assert d.cuDevicePrimaryCtxRelease(0)[0] == 0",
    ),
    "push": (
        "d.cuInit(0)\nerr, ctx = d.cuDevicePrimaryCtxRetain(0)\nassert err == 0, err\n"
        "assert d.cuCtxPushCurrent(ctx)[0] == 0",
        "assert d.cuCtxPopCurrent()[0] == 0\nassert d.cuDevicePrimaryCtxRelease(0)[0] == 0",
    ),
    "current": (
        "d.cuInit(0)\nerr, ctx = d.cuDevicePrimaryCtxRetain(0)\nassert err == 0, err\n"
        "assert d.cuCtxSetCurrent(ctx)[0] == 0",
        "assert d.cuCtxSetCurrent(d.CUcontext(0))[0] == 0\n"
        "assert d.cuDevicePrimaryCtxRelease(0)[0] == 0",
    ),
    "guard": (
        "import cyctx\n\nctx = cyctx.ContextGuard(0)\nctx.__enter__()",
        "ctx.__exit__(None, None, None)\nctx.close()",
    ),
}

# The changes an action left undone shows, in the plugin's words (fnmatch patterns); "sim": only
# on the simulated driver, which alone tells stack depth and retains. The guard's own cuInit
# happens inside the guard.
CURRENT = "current context: none -> 0x* (device 0, id *)"
ACTIVATED = "device 0 primary context: inactive -> active*"
LEFT = {
    "retain": [
        (ACTIVATED, "note", "all"),
        ("device 0 primary context retains: 0 -> 1", "note", "sim"),
    ],
    "push": [
        (CURRENT, "leak", "all"),
        ("context stack depth: 0 -> 1", "leak", "sim"),
        (ACTIVATED, "note", "all"),
        ("device 0 primary context retains: 0 -> 1", "note", "sim"),
    ],
    "guard": [
        (CURRENT, "leak", "all"),
        ("context stack depth: 0 -> 1", "leak", "sim"),
        ("cyctx guard entries open on this thread: 0 -> 1", "leak", "all"),
        (ACTIVATED, "note", "all"),
        ("device 0 primary context retains: 0 -> 1", "note", "sim"),
    ],
}
LEFT["current"] = LEFT["push"]

WHO = ["function", "class", "module", "session", "test"]
XDIST = ["-n", "2", "-p", "no:benchmark"]

# The family, pairwise rather than the full product (each case is a pytest process): undone,
# every action by every first user; kept, every action by a module fixture and by a test, and
# the guard (which moves every counted field) by each scope; under xdist the guard by each.
UNDONE = [(a, w, []) for a in ACTIONS for w in WHO] + [("guard", w, XDIST) for w in WHO]
KEPT = (
    [(a, w, []) for a in LEFT for w in ("module", "test")]
    + [("guard", w, []) for w in ("function", "class", "session")]
    + [("guard", w, XDIST) for w in ("function", "session")]
)


def _params(cases):
    """Each case on the simulated driver and (gpu) the real one; a guard's also where cyctx is
    first imported by it."""
    out = []
    for action, who, xdist in cases:
        drivers = ["sim", "real"] + (["sim-bare"] if action == "guard" else [])
        for driver in drivers:
            marks = [pytest.mark.gpu] if driver == "real" else []
            name = f"{action}-{who}-{'xdist' if xdist else 'serial'}-{driver}"
            out.append(pytest.param((action, who, xdist), driver, marks=marks, id=name))
    return out


def _body(code: str, indent: str) -> str:
    return textwrap.indent(code, indent)


def _inner(action: str, who: str, balanced: bool) -> str:
    begin, end = ACTIONS[action]
    end = end if balanced else "pass"
    head = "import pytest\nfrom cuda.bindings import driver as d\n\n\n"
    if who == "test":
        return (
            head
            + f"def test_first():\n{_body(begin, '    ')}\n{_body(end, '    ')}\n\n\n"
            + "def test_after():\n    pass\n"
        )
    fixture = (
        f'@pytest.fixture(scope="{who}")\ndef first():\n{_body(begin, "    ")}\n    yield\n'
        f"{_body(end, '    ')}\n\n\n"
    )
    if who == "class":
        tests = "class TestIn:\n    def test_first(self, first):\n        pass\n\n\n"
    else:
        tests = "def test_first(first):\n    pass\n\n\n"
    return head + fixture + tests + "def test_after():\n    pass\n"


def _run(pytester, driver: str, action: str, who: str, balanced: bool, xdist: list):
    if xdist:
        pytest.importorskip("xdist")
    from cyctx.testing import sim_library_path

    pytester.makeconftest(CONFTEST[driver].format(path=sim_library_path()))
    pytester.makepyfile(test_inner=_inner(action, who, balanced))
    args = xdist or ["-p", "no:xdist", "-p", "no:benchmark"]
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, "--cyctx-contexts-fail")


@pytest.mark.slow
@pytest.mark.parametrize(("case", "driver"), _params(UNDONE))
def test_the_first_to_initialise_that_puts_it_back_changed_nothing(pytester, case, driver):
    action, who, xdist = case
    result = _run(pytester, driver, action, who, True, xdist)
    out = result.stdout.str()
    assert (result.ret, result.parseoutcomes().get("passed")) == (0, 2), (
        f"{action} by the first {who}, undone: expected 2 passed and exit 0, got exit "
        f"{result.ret}:\n{out}"
    )
    assert "cyctx: no test left the CUDA context state changed" in out, out
    # Not even a note: what the setup took, the teardown gave back.
    assert "retains taken and kept" not in out, out


def _title(who: str) -> str:
    if who == "test":
        return "test_inner.py::test_first"
    return f"fixture 'first' ({who} scope, torn down at the end of *)"


@pytest.mark.slow
@pytest.mark.parametrize(("case", "driver"), _params(KEPT))
def test_the_first_to_initialise_that_keeps_it_is_counted_from_zero(pytester, case, driver):
    action, who, xdist = case
    result = _run(pytester, driver, action, who, False, xdist)
    out = result.stdout.str()
    expected = [(w, k) for w, k, where in LEFT[action] if where == "all" or driver == "sim"]
    leaks = any(k == "leak" for _, k in expected)
    got = (result.ret, result.parseoutcomes().get("errors", 0))
    want = (pytest.ExitCode.TESTS_FAILED, 1) if leaks else (pytest.ExitCode.OK, 0)
    assert got == want, f"{action} by the first {who}, kept: expected (exit, errors) {want}:\n{out}"
    if leaks:  # the summary: the owner, then each change on a line of its own, in order
        lines = result.outlines
        head = [i for i, x in enumerate(lines) if "left the CUDA context state changed =" in x]
        assert head and fnmatch(lines[head[0]], "*= cyctx: 1 * left *"), out
        title = [i for i in range(head[0], len(lines)) if fnmatch(lines[i], _title(who))]
        assert title, f"{action} by the first {who}: no {_title(who)!r} in the summary:\n{out}"
        listed = list(itertools.takewhile(lambda x: x.startswith("    "), lines[title[0] + 1 :]))
        want_lines = [f"    {w}" + ("  (note)" if k == "note" else "") for w, k in expected]
        assert len(listed) == len(want_lines) and all(map(fnmatch, listed, want_lines)), (
            f"{action} by the first {who}, kept: expected {want_lines}, the summary lists "
            f"{listed}:\n{out}"
        )
    else:  # only notes: listed apart, on one line
        result.stdout.fnmatch_lines(
            [
                "cyctx: retains taken and kept*",
                f"  {_title(who)}: " + "; ".join(w for w, _ in expected),
            ]
        )
