"""The pytest plugin's trace (--cyctx-trace) and its context check (--cyctx-check-contexts)
judge alike.

A fixture's setup and teardown are the fixture's, not the tests' that ran them; a fixture that
puts back what it found is no change (nothing is named, whatever its scope; nor is a context it
made and destroyed itself, as a test's own), and one that does not is named as the fixture, by
both. These inner sessions run on this run's driver (`--driver`).

What a worker thread of a test leaves current on itself is that thread's, not the test's (the
check reads the thread that runs the tests); a new context at the handle of the one the test
found current is a change for both (the same handle with another id is another context:
_cyctx_libcuda.same_context). These inner sessions run on the simulated driver: the second
needs its handle reuse."""

import json
import textwrap

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

SIM_REUSING_HANDLES = """
from cyctx.testing import use_simulated_driver
sim = use_simulated_driver(2)
sim.reuse_handles(True)
from cuda.bindings import driver as d
d.cuInit(0)
"""

COMMON = """
import json
import threading
import pytest
from cuda.bindings import driver as d


def push():
    err, p = d.cuDevicePrimaryCtxRetain(0)
    d.cuCtxPushCurrent(p)


def pop():
    d.cuCtxPopCurrent()
    d.cuDevicePrimaryCtxRelease(0)


def create(dev):
    # cuCtxCreate on both majors of cuda-bindings: 13 takes (params, flags, dev).
    try:
        return d.cuCtxCreate(None, 0, dev)[1]  # create-line
    except TypeError:
        return d.cuCtxCreate(0, dev)[1]  # create-line


def on_a_worker(fn, end=True):
    go = threading.Event()
    def body():
        fn()
        go.set()
        if not end:
            threading.Event().wait()  # alive, its context current, until the process ends
    threading.Thread(target=body, daemon=True).start()
    go.wait()
"""


def _run(pytester, tests, n, conftest=CONFTEST):
    pytester.makeconftest(conftest)
    text = COMMON + textwrap.dedent(tests)
    path = pytester.path / "test_inner.py"
    path.write_text(text)  # as it is: the lines the findings cite
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--cyctx-trace", "--cyctx-check-contexts"
    )
    out = result.stdout.str()
    result.assert_outcomes(passed=n)
    assert "not tracing" not in out, out
    assert f" context events in {n} tests" in out, out
    return out, text, path


def _trace_lines(out, test=None):
    """The trace's findings: of test_inner.py's `test`, or (None) of every test and fixture."""
    if test is not None:
        return [ln for ln in out.splitlines() if ln.startswith(f"test_inner.py::{test} ")]
    return [
        ln
        for ln in out.splitlines()
        if (ln.startswith("test_inner.py::") or ln.startswith("fixture '"))
        and (" left " in ln or " destroyed " in ln)
    ]


# --- fixtures -------------------------------------------------------------------------------------


def test_a_balanced_fixture_of_any_scope_blames_nothing(pytester):
    out, _, _ = _run(
        pytester,
        """
        @pytest.fixture(scope="class")
        def pushed_class():
            push()
            yield
            pop()


        @pytest.fixture(scope="module")
        def pushed_module():
            push()
            yield
            pop()


        @pytest.fixture
        def pushed_function():
            push()
            yield
            pop()


        @pytest.fixture
        def nested(request):
            request.getfixturevalue("pushed_function")
            push()
            yield
            pop()


        @pytest.mark.usefixtures("pushed_class")
        class TestClass:
            def test_one(self):
                pass

            def test_two(self):
                pass


        @pytest.mark.usefixtures("pushed_module")
        def test_module_one():
            pass


        @pytest.mark.usefixtures("pushed_module")
        def test_module_two():
            pass


        @pytest.mark.usefixtures("nested")
        def test_nested():
            pass


        def test_own_context():
            c = create(0)  # made current, and destroyed: gone as it came
            d.cuCtxDestroy(c)
        """,
        6,
    )
    assert _trace_lines(out) == [], out
    assert "cyctx: no test left the CUDA context state changed" in out, out


def test_a_fixture_that_does_not_put_back_is_named_as_the_fixture_by_both(pytester):
    out, text, path = _run(
        pytester,
        """
        @pytest.fixture(scope="class")
        def leaky():
            err, p = d.cuDevicePrimaryCtxRetain(0)
            d.cuCtxSetCurrent(p)  # leaky-line
            yield


        @pytest.mark.usefixtures("leaky")
        class TestLeaky:
            def test_one(self):
                pass

            def test_two(self):
                pass


        def test_after():
            pass
        """,
        3,
    )
    (line,) = _trace_lines(out)
    n = line_of("leaky-line", text)
    title = (
        "fixture 'leaky' (class scope, torn down at the end of test_inner.py::TestLeaky::test_two)"
    )
    assert line.startswith(f"{title} left "), out
    assert "current (it found none): made current by cuCtxSetCurrent by cuda-bindings" in line
    assert line.endswith(f"at {path}:{n} (leaky)"), out
    # The check names the same fixture, and no test.
    assert title in out.replace(line, ""), out
    assert "cyctx: 1 fixture left the CUDA context state changed" in out, out


def test_what_runs_after_a_fixtures_teardown_is_the_tests_not_that_fixtures(pytester):
    # The test's own finalizer runs after its fixtures are torn down: what it leaves is the
    # test's. `late` also ends a second time, with the session fixture it depends on.
    out, text, path = _run(
        pytester,
        """
        @pytest.fixture(scope="session")
        def base():
            yield


        @pytest.fixture
        def early(request):
            def leave():
                err, p = d.cuDevicePrimaryCtxRetain(0)
                d.cuCtxSetCurrent(p)  # finalizer-line
            request.node.addfinalizer(leave)


        @pytest.fixture
        def late(base):
            push()
            yield
            pop()


        def test_one(early, late):
            pass
        """,
        1,
    )
    (line,) = _trace_lines(out)
    assert line.startswith("test_inner.py::test_one left "), out
    assert line.endswith(f"at {path}:{line_of('finalizer-line', text)} (early.<locals>.leave)")
    assert "cyctx: 1 test left the CUDA context state changed" in out, out


def test_a_test_that_changes_what_a_fixture_set_is_named_and_the_fixture_is_not(pytester):
    out, text, path = _run(
        pytester,
        """
        @pytest.fixture
        def pushed_function():
            push()
            yield
            pop()  # pops what the test put in its place: the fixture ends as it began


        @pytest.mark.usefixtures("pushed_function")
        class TestClass:
            def test_one(self):
                pass

            def test_swaps(self):
                c = create(0)  # pushed on the fixture's context, then put in its place
                d.cuCtxPopCurrent()
                d.cuCtxSetCurrent(c)  # swap-line
        """,
        2,
    )
    lines = _trace_lines(out)
    assert len(lines) == 1 and lines[0].startswith("test_inner.py::TestClass::test_swaps left "), (
        out
    )
    n = line_of("swap-line", text)
    assert lines[0].endswith(f"at {path}:{n} (TestClass.test_swaps)"), out


# --- worker threads and reused handles ------------------------------------------------------------


def test_a_workers_own_current_context_is_neither_the_tests_nor_the_checks(sim, pytester):
    out, text, path = _run(
        pytester,
        """
        def test_worker_that_ended():
            on_a_worker(lambda: create(1))  # current on the worker, which ends

        def test_worker_still_running():
            on_a_worker(lambda: d.cuCtxSetCurrent(create(0)), end=False)

        def test_main_and_worker_both():
            # Pushed on the test's thread and left there; then made current on a worker too.
            ctx = create(1)
            on_a_worker(lambda: d.cuCtxSetCurrent(ctx))
        """,
        3,
        SIM_REUSING_HANDLES,
    )
    assert not _trace_lines(out, "test_worker_that_ended"), out
    assert not _trace_lines(out, "test_worker_still_running"), out
    # The test's own change is named with the test's own call, not the worker's later one.
    (line,) = _trace_lines(out, "test_main_and_worker_both")
    made = [i + 1 for i, ln in enumerate(text.splitlines()) if ln.endswith("# create-line")]
    at = tuple(f" by cuda-bindings at {path}:{n} (create)" for n in made)
    assert "made current by cuCtxCreate" in line and line.endswith(at), out
    # The check agrees: the one change is the test's, on its own thread, cited alike.
    titles = [ln for ln in out.splitlines() if ln.startswith("test_inner.py::") and " " not in ln]
    assert titles == ["test_inner.py::test_main_and_worker_both"], out
    (cited,) = [ln for ln in out.splitlines() if ln.strip().startswith("current context: none ->")]
    assert ": made current by cuCtxCreate" in cited and cited.endswith(at), out


def test_a_new_context_at_the_handle_of_the_one_found_current_is_a_change_for_both(sim, pytester):
    out, text, path = _run(
        pytester,
        """
        def test_leaves_a():
            create(0)

        def test_replaces_a_at_its_handle():
            err, a = d.cuCtxGetCurrent()
            a_id = d.cuCtxGetId(a)[1]
            d.cuCtxDestroy(a)  # popped: nothing current
            b = create(0)  # the driver gives the new context a's handle, current
            with open("ids.json", "w") as f:
                json.dump({"a": int(a), "b": int(b), "a_id": a_id, "b_id": d.cuCtxGetId(b)[1]}, f)
        """,
        2,
        SIM_REUSING_HANDLES,
    )
    ids = json.loads((pytester.path / "ids.json").read_text())
    assert ids["a"] == ids["b"] and ids["a_id"] != ids["b_id"], ids
    h = f"{ids['a']:#x}"
    a, b = f"{h} (device 0, id {ids['a_id']})", f"{h} (device 0, id {ids['b_id']})"
    # The trace: left b current, having found a.
    left = _trace_lines(out, "test_replaces_a_at_its_handle")
    assert any(
        ln.startswith(
            f"test_inner.py::test_replaces_a_at_its_handle left {b} current (it found {a})"
        )
        for ln in left
    ), out
    # The check: the current context changed, though its handle did not.
    assert f"current context: {a} -> {b}" in out, out
