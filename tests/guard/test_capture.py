"""Guards during stream capture (docs/guarantees.md, "Guards during stream capture"): entering,
leaving and switching guards while a stream is captured, in each capture mode, on the capturing
thread and on another, keeps the capture valid, and work enqueued inside a guard of another
context is captured into the capturing stream. cuCtxSynchronize inside a guard is the control
that does invalidate a capture. The simulated driver models no streams or graphs: gpu only."""

import pytest
from helpers.drivers import create_context, driver, ok, second_device
from helpers.threads import in_thread

from cyctx import ContextGuard

MODES = ("GLOBAL", "THREAD_LOCAL", "RELAXED")
pytestmark = pytest.mark.gpu


def mode(name):
    return getattr(driver().CUstreamCaptureMode, f"CU_STREAM_CAPTURE_MODE_{name}")


@pytest.fixture
def setup():
    """(primary guard of device 0, guard of the second device, guard of another context of
    device 0, a stream of device 0's primary, 64 bytes of its memory)."""
    d = driver()
    g0, g1 = ContextGuard(0), ContextGuard(second_device())
    other = create_context(0, current=False)
    go = ContextGuard(other)
    with g0:
        stream = ok(d.cuStreamCreate(0))
        buf = ok(d.cuMemAlloc(64))
    yield g0, g1, go, stream, buf
    with g0:
        ok(d.cuMemFree(buf))
        ok(d.cuStreamDestroy(stream))
    for g in (go, g1, g0):
        g.close()
    ok(d.cuCtxDestroy(other))


def capture(g0, stream, buf, m, body):
    """Capture on `stream` inside g0: a memset, body(), a memset. (end result, node count)."""
    d = driver()
    with g0:
        ok(d.cuStreamBeginCapture(stream, m))
        try:
            ok(d.cuMemsetD8Async(buf, 1, 64, stream))
            body()
            d.cuMemsetD8Async(buf, 3, 64, stream)  # fails once invalidated: the end says so
        finally:
            err, graph = d.cuStreamEndCapture(stream)
        if err != d.CUresult.CUDA_SUCCESS:
            return err, 0
        try:
            _, _, n = d.cuGraphGetNodes(graph, 0)
            return err, int(n)
        finally:
            ok(d.cuGraphDestroy(graph))


@pytest.mark.parametrize("where", ("capturing thread", "other thread"))
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

    def body():
        if where == "other thread":
            in_thread(guards)
        else:
            guards()
            with go:  # enqueued while another context is current: still this stream's node
                ok(d.cuMemsetD8Async(buf, 2, 64, stream))
        status = ok(d.cuStreamIsCapturing(stream))
        assert status == d.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE, status

    err, nodes = capture(g0, stream, buf, mode(name), body)
    assert err == d.CUresult.CUDA_SUCCESS, err
    assert nodes == (3 if where == "capturing thread" else 2), nodes


@pytest.mark.parametrize("name", MODES)
def test_cuctxsynchronize_inside_a_guard_does_invalidate_the_capture(setup, name):
    # The control: the same capture is broken by a call that the driver forbids during capture.
    g0, g1, go, stream, buf = setup
    d = driver()

    def body():
        with go:
            d.cuCtxSynchronize()

    err, _ = capture(g0, stream, buf, mode(name), body)
    assert err == d.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, err
