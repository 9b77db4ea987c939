"""The user's line through any depth of library code: an event reads Python frames past the
ones it keeps until the first one outside the libraries (a package in site-packages, the
standard library, a package cyctx knows), so the line is named however deep the library's own
stack is (numba-cuda's `with gpus[0]:` is six frames, a Dask task twenty and more); up to a
bound, past which it says how far it read. Walking the library's frames costs little.

The libraries here are packages the test writes into a site-packages directory of its own."""

import functools
import importlib.util
import sys
import textwrap
import threading
import time

import pytest
from helpers.lines import line_of

import cyctx
from cyctx._trace import _native

DEEP = """
from cuda.bindings import driver as d


def call(depth, fn):
    if depth <= 1:
        return fn()
    return call(depth - 1, fn)


def set_none(depth):
    return call(depth, lambda: d.cuCtxSetCurrent(None))


def run_on_a_thread(depth, user_fn):
    # A scheduler's worker: the user's function runs under the library's own frames.
    out = []
    t = threading.Thread(target=lambda: out.append(call(depth, user_fn)))
    t.start()
    t.join()
    return out[0]


import threading
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    """Installs packages into a site-packages directory on sys.path; removed after."""
    where = tmp_path / "lib" / "python3" / "site-packages"
    where.mkdir(parents=True)
    monkeypatch.syspath_prepend(str(where))
    installed = []

    def install(name):
        pkg = where / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text(textwrap.dedent(DEEP))
        installed.append(name)
        return __import__(name)

    yield install
    for name in installed:
        sys.modules.pop(name, None)


@pytest.mark.parametrize("depth", [1, 4, 6, 20, 100])
def test_the_users_line_is_named_through_any_library_depth(site, d, depth):
    deep = site("cyctx_fake_deep")
    with cyctx.trace() as t:
        assert deep.set_none(depth) == (0,)  # user-line
    (e,) = t.events
    assert e.where is not None, e
    assert (e.where.file, e.where.line) == (__file__, line_of("user-line")), e.where
    assert e.where.function == "test_the_users_line_is_named_through_any_library_depth"
    # The library the line called: the package's own frame that the line called, read too.
    assert e.python[0].file == deep.__file__ and e.python[-2].file == deep.__file__
    assert e.python[-2].function == "set_none" and e.python[-1] == e.where
    # Innermost first: the lambda, `depth` frames of call(), set_none(), the line.
    assert e.python[-1].depth == depth + 2 and e.python[0].depth == 0
    assert "called from beyond" not in e.library and e.library == "cuda-bindings", e.library
    assert t.to_json()["events"][0]["where"]["line"] == line_of("user-line")


def test_a_library_cyctx_knows_is_named_at_the_users_line_however_deep(site, d):
    # numba-cuda's package (numba_cuda) is one cyctx names: "numba", as its own frames are
    # read, and the line beyond them.
    if "numba_cuda" in sys.modules or importlib.util.find_spec("numba_cuda") is not None:
        pytest.skip("a real numba_cuda is installed here: the GPU test traces it")
    numba_like = site("numba_cuda")
    with cyctx.trace() as t:
        numba_like.set_none(20)  # numba-line
    (e,) = t.events
    assert e.library == "numba", e.library
    assert e.where is not None and e.where.line == line_of("numba-line"), e


def test_a_worker_threads_user_function_is_its_line(site, d):
    deep = site("cyctx_fake_sched")

    def task():
        return deep.set_none(20)  # task-line

    with cyctx.trace() as t:
        assert deep.run_on_a_thread(20, task) == (0,)
    (e,) = t.events
    assert e.thread != threading.get_native_id()
    assert e.where is not None and e.where.line == line_of("task-line"), e
    assert e.where.function.endswith("task")


def test_past_the_bound_it_says_how_far_it_read(site, d):
    deep = site("cyctx_fake_deeper")
    limit = _native.MAX_PY_WALK
    assert limit >= 256
    with cyctx.trace() as t:
        deep.set_none(limit + 50)
    (e,) = t.events
    assert e.where is None
    outer = e.python[-1]
    assert outer.file == deep.__file__ and outer.depth == limit - 1, outer
    assert e.library == (
        f"cuda-bindings (called from beyond {outer}, the outermost of the {limit} Python "
        "frames read)"
    ) or e.library.startswith(f"? (called from beyond {outer}"), e.library


def test_a_stack_all_of_library_frames_that_ends_is_no_cut(site, d):
    # A library's own thread whose every frame is the library's or the standard library's:
    # read to its end, there is no user's line, and nothing was cut.
    deep = site("cyctx_fake_own_thread")
    with cyctx.trace() as t:
        th = threading.Thread(target=deep.set_none, args=(10,))
        th.start()
        th.join()
    (e,) = t.events
    assert e.where is None
    assert e.library == "cuda-bindings", e.library


def _per_call(fn, n, traced):
    best = float("inf")
    for _ in range(5):
        if traced:
            t = cyctx.trace(capacity=n + 16, quiet=True).start()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if traced:
            t.stop()
            assert len(t.events) == n and t.dropped == 0
        best = min(best, dt)
    return best / n


def test_reading_a_deep_library_stack_costs_little(site, d):
    """The tracer's own cost per call (traced minus untraced, best of 5) through 20 and through
    the bound's worth of library frames, against a call from the user's line itself. A loose
    bound: a loaded shared machine moves these figures; what is pinned is that the frames read
    past the first few cost microseconds, not the milliseconds a Python-level walk would."""
    deep = site("cyctx_fake_cost")
    n = 200
    direct = _per_call(lambda: d.cuCtxSetCurrent(None), n, True) - _per_call(
        lambda: d.cuCtxSetCurrent(None), n, False
    )
    for depth in (20, _native.MAX_PY_WALK):
        call = functools.partial(deep.set_none, depth)
        traced = _per_call(call, n, True)
        untraced = _per_call(call, n, False)
        extra = (traced - untraced) - direct
        assert extra < 50e-6 * max(1, depth / 20), (depth, extra, direct)
