"""pytest --cyctx-trace and the context check agree on what a fixture did: a fixture's setup and
teardown are the fixture's, not the tests' that ran them; a fixture that puts back what it
found is no change (nothing is named, whatever its scope; nor is a context it made and
destroyed itself, as a test's own), and one that does not is named as the fixture, by both.
The inner sessions run on this run's driver (`--driver`)."""

import textwrap

pytest_plugins = ["pytester"]

CONFTEST = """
import os
if os.environ.get("CYCTX_TEST_DRIVER") != "real":
    from cyctx.testing import use_simulated_driver
    use_simulated_driver(2)
from cuda.bindings import driver as d
d.cuInit(0)
"""

COMMON = """
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
        return d.cuCtxCreate(None, 0, dev)[1]
    except TypeError:
        return d.cuCtxCreate(0, dev)[1]
"""


def _run(pytester, tests, n):
    pytester.makeconftest(CONFTEST)
    text = textwrap.dedent(COMMON) + textwrap.dedent(tests)
    path = pytester.path / "test_inner.py"
    path.write_text(text)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--cyctx-trace", "--cyctx-check-contexts"
    )
    out = result.stdout.str()
    result.assert_outcomes(passed=n)
    assert "not tracing" not in out, out
    assert f" context events in {n} tests" in out, out
    return out, text, path


def _trace_lines(out):
    return [
        ln
        for ln in out.splitlines()
        if (ln.startswith("test_inner.py::") or ln.startswith("fixture '"))
        and (" left " in ln or " destroyed " in ln)
    ]


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
    (n,) = [i + 1 for i, ln in enumerate(text.splitlines()) if ln.endswith("# leaky-line")]
    title = (
        "fixture 'leaky' (class scope, torn down at the end of test_inner.py::TestLeaky::test_two)"
    )
    assert line.startswith(f"{title} left "), out
    assert "current (it found none): made current by cuCtxSetCurrent by cuda-bindings" in line
    assert line.endswith(f"at {path}:{n} (leaky)"), out
    # The check names the same fixture, and no test.
    assert title in out.replace(line, ""), out
    assert "cyctx: 1 fixture left the CUDA context state changed" in out, out


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
    (n,) = [i + 1 for i, ln in enumerate(text.splitlines()) if ln.endswith("# swap-line")]
    assert lines[0].endswith(f"at {path}:{n} (TestClass.test_swaps)"), out
