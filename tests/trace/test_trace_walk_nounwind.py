"""A native frame without unwind information between the driver and the eval loop.

The walk cannot step past it (no FDE: the fast walk hands over to the unwinder, which stops
there), so it never reaches the eval loop although the thread has one (a known boundary). The
event must not present that as a complete walk ("the stack's end") nor name the frame's library
as the one the line called: the line called _ctypes, which called the no-unwind library."""

import ctypes
import os
import subprocess

import pytest
from helpers import drivers, fakelibs

import cyctx

SRC = r"""
typedef int (*set_fn)(void *);
__attribute__((noinline)) int cyctx_test_nounwind(int n, set_fn f) {
    if (n <= 0) return f((void *)0);
    int r = cyctx_test_nounwind(n - 1, f);
    return r + (n & 0);
}
"""


@pytest.fixture(scope="module")
def nounwind(tmp_path_factory):
    cc = fakelibs.compiler()
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("nounwind")
    so = d / "libcyctxnounwind.so"
    (d / "n.c").write_text(SRC)
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-O1",
            "-fno-optimize-sibling-calls",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
            "-fno-exceptions",
            "-o",
            str(so),
            str(d / "n.c"),
        ],
        check=True,
    )
    lib = ctypes.CDLL(str(so))
    lib.cyctx_test_nounwind.argtypes = [ctypes.c_int, ctypes.c_void_p]
    lib.cyctx_test_nounwind.restype = ctypes.c_int
    return lib, str(so)


@pytest.mark.parametrize("unwinder_only", [False, True], ids=["fast", "unwinder"])
def test_a_walk_stopped_by_a_frame_without_unwind_info_is_not_called_complete(
    nounwind, sim, unwinder_only
):
    from cyctx._trace import _native

    lib, path = nounwind
    fn = ctypes.cast(drivers.sim_set_current(sim), ctypes.c_void_p).value
    prev = _native.set_walker(unwinder_only)
    try:
        with cyctx.trace() as t:
            assert lib.cyctx_test_nounwind(3, fn) == 0
    finally:
        _native.set_walker(prev)
    (e,) = [e for e in t.events if e.call == "cuCtxSetCurrent"]
    import _ctypes

    # Either the walk says it did not reach the eval loop and the library is not given as
    # known, or it reached it and names _ctypes.
    if e.native_state == "the eval loop":
        assert e.library == os.path.basename(_ctypes.__file__), e
    else:
        assert e.native_state == "stopped before the eval loop (a frame without unwind information)"
        assert "libcyctxnounwind.so (called from" in e.library, e.library
        assert "stopped before the eval loop" in e.library, e.library
