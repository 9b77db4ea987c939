"""Guards during stream capture (docs/guarantees.md, "Guards during stream capture"): entering,
leaving and switching guards while a stream is captured, in each capture mode, on the capturing
thread and on another, keeps the capture valid, and work enqueued inside a guard of another
context is captured into the capturing stream. The calls that do invalidate a capture are pinned
as the lab measured them (docs/lab/capture.cpp): cuCtxSynchronize with the capturing stream's
context current, in every mode and from any thread; cuMemAlloc by mode and thread. The
invalidating call itself returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; the capture status turns
INVALIDATED and the next node and the end return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.

Every test compares the whole record of what the driver answered (the calls inside, the capture
status after them, the next node, the end, the nodes captured), so a failure prints each code.
The simulated driver models no streams or graphs: gpu only."""

import pytest
from helpers.drivers import create_context, driver, ok, second_device
from helpers.threads import in_thread

import cyctx
from cyctx import ContextGuard

MODES = ("GLOBAL", "THREAD_LOCAL", "RELAXED")
WHERE = ("capturing thread", "other thread")
pytestmark = pytest.mark.gpu

OK = "CUDA_SUCCESS"
UNSUPPORTED = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
INVALIDATED = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"


def mode(name):
    return getattr(driver().CUstreamCaptureMode, f"CU_STREAM_CAPTURE_MODE_{name}")


def code(result):
    """The name of a cuda.bindings call's CUresult."""
    err = result[0] if isinstance(result, tuple) else result
    return driver().CUresult(err).name


@pytest.fixture
def setup():
    """(primary guard of device 0, guard of the second device, guard of another context of
    device 0, a non-blocking stream of device 0's primary (as the lab's), 64 bytes of its
    memory)."""
    d = driver()
    g0, g1 = ContextGuard(0), ContextGuard(second_device())
    other = create_context(0, current=False)
    go = ContextGuard(other)
    with g0:
        stream = ok(d.cuStreamCreate(int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)))
        buf = ok(d.cuMemAlloc(64))
    yield g0, g1, go, stream, buf
    with g0:
        ok(d.cuMemFree(buf))
        ok(d.cuStreamDestroy(stream))
    for g in (go, g1, g0):
        g.close()
    ok(d.cuCtxDestroy(other))


def capture(g0, stream, buf, m, body):
    """Capture on `stream` inside g0, in mode m: a memset, body(), a memset, the end.

    Returns every answer: body's own record ("calls"), the capture status after it, the next
    node's code, the end's code and the nodes of the graph (0 without one)."""
    d = driver()
    seen = {}
    with g0:
        ok(d.cuStreamBeginCapture(stream, m))
        try:
            ok(d.cuMemsetD8Async(buf, 1, 64, stream))
            seen["calls"] = body()
            err, status = d.cuStreamIsCapturing(stream)
            seen["status"] = f"{code(err)}:{d.CUstreamCaptureStatus(status).name}"
            seen["next"] = code(d.cuMemsetD8Async(buf, 3, 64, stream))
        finally:
            err, graph = d.cuStreamEndCapture(stream)
        seen["end"] = code(err)
        seen["nodes"] = 0
        if err == d.CUresult.CUDA_SUCCESS:
            try:
                seen["nodes"] = int(ok(d.cuGraphGetNodes(graph, 0))[1])
            finally:
                ok(d.cuGraphDestroy(graph))
    return seen


ACTIVE = f"{OK}:CU_STREAM_CAPTURE_STATUS_ACTIVE"
BROKEN = f"{OK}:CU_STREAM_CAPTURE_STATUS_INVALIDATED"


def valid(calls, nodes=2):
    return {"calls": calls, "status": ACTIVE, "next": OK, "end": OK, "nodes": nodes}


def invalidated(calls):
    return {"calls": calls, "status": BROKEN, "next": INVALIDATED, "end": INVALIDATED, "nodes": 0}


def on(where, fn):
    return in_thread(fn) if where == "other thread" else fn()


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("name", MODES)
def test_guards_during_capture_keep_it_valid(setup, name, where):
    g0, g1, go, stream, buf = setup
    d = driver()

    def guards():
        with g1:
            with go:
                with g0:
                    pass
            with g0:
                pass
        with go:
            with g1:
                pass
        return "guards"

    def body():
        if where == "other thread":
            return in_thread(guards)
        calls = [guards()]
        with go:  # enqueued while another context is current: still this stream's node
            calls.append(code(d.cuMemsetD8Async(buf, 2, 64, stream)))
        return calls

    seen = capture(g0, stream, buf, mode(name), body)
    if where == "other thread":
        assert seen == valid("guards"), (name, where, seen)
    else:
        assert seen == valid(["guards", OK], nodes=3), (name, where, seen)


def sync_in(guard):
    def fn():
        with guard:
            return code(driver().cuCtxSynchronize())

    return fn


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("name", MODES)
def test_cuctxsynchronize_of_the_capturing_context_invalidates_the_capture(setup, name, where):
    # What the lab measured: the capturing stream's context current, on either thread, in
    # every mode. The call itself is refused; the capture is broken.
    g0, g1, go, stream, buf = setup
    seen = capture(g0, stream, buf, mode(name), lambda: on(where, sync_in(g0)))
    assert seen == invalidated(UNSUPPORTED), (name, where, seen)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("name", MODES)
def test_cuctxsynchronize_of_another_context_leaves_the_capture_valid(setup, name, where):
    # cuCtxSynchronize waits for the current context's work only: inside a guard of another
    # context of the same device it does not touch the capturing stream.
    g0, g1, go, stream, buf = setup
    seen = capture(g0, stream, buf, mode(name), lambda: on(where, sync_in(go)))
    assert seen == valid(OK), (name, where, seen)


def alloc_in(guard):
    def fn():
        d = driver()
        with guard:
            err, ptr = d.cuMemAlloc(4096)
            if err != d.CUresult.CUDA_SUCCESS:
                return code(err)
            return f"{code(err)}+{code(d.cuMemFree(ptr))}"

    return fn


def relaxed(fn):
    def inner():
        with cyctx.relaxed_capture():
            return fn()

    return inner


# cuMemAlloc during capture, as the lab measured it: (mode, thread) -> whether the capture stays
# valid. global: broken from any thread whose own mode is not relaxed; thread_local: from the
# capturing thread only; relaxed: never.
ALLOC = {
    ("GLOBAL", "capturing thread"): False,
    ("GLOBAL", "other thread"): False,
    ("THREAD_LOCAL", "capturing thread"): False,
    ("THREAD_LOCAL", "other thread"): True,
    ("RELAXED", "capturing thread"): True,
    ("RELAXED", "other thread"): True,
}


@pytest.mark.parametrize("name, where", list(ALLOC), ids=[f"{m}-{w}" for m, w in ALLOC])
def test_cumemalloc_during_capture_as_the_lab_measured(setup, name, where):
    g0, g1, go, stream, buf = setup
    seen = capture(g0, stream, buf, mode(name), lambda: on(where, alloc_in(g0)))
    want = valid(f"{OK}+{OK}") if ALLOC[name, where] else invalidated(UNSUPPORTED)
    assert seen == want, (name, where, seen)


def test_relaxed_capture_lets_another_thread_allocate_during_a_global_capture(setup):
    # The lab's "other thread, relaxed" row, made with cyctx.relaxed_capture(): the global
    # capture stays valid, and the thread's own mode is global again after the scope.
    g0, g1, go, stream, buf = setup
    d = driver()

    def body():
        calls = relaxed(alloc_in(g0))()
        prev = d.cuThreadExchangeStreamCaptureMode(mode("GLOBAL"))
        return [calls, f"{code(prev)}:{d.CUstreamCaptureMode(prev[1]).name}"]

    seen = capture(g0, stream, buf, mode("GLOBAL"), lambda: in_thread(body))
    assert seen == valid([f"{OK}+{OK}", f"{OK}:CU_STREAM_CAPTURE_MODE_GLOBAL"]), seen


def test_relaxed_capture_does_not_excuse_cuctxsynchronize(setup):
    # Relaxed mode permits unsafe calls; cuCtxSynchronize of the capturing context still breaks
    # the capture (the lab's "other thread, relaxed" cuCtxSynchronize row).
    g0, g1, go, stream, buf = setup
    seen = capture(g0, stream, buf, mode("GLOBAL"), lambda: in_thread(relaxed(sync_in(g0))))
    assert seen == invalidated(UNSUPPORTED), seen
