"""The guard next to the CUDA Runtime (docs/guarantees.md, "The promises"): real driver and libcudart only.

Each test runs in its own process: the runtime keeps its own retains and per-thread state
for the life of the process, which must not leak into other tests.
"""

import pytest
from helpers.children import run_child

pytestmark = pytest.mark.cudart

PRELUDE = """
    import ctypes, cyctx
    from helpers.threads import in_thread
    rt = drivers.cudart()
    d = drivers.driver()
    def rt_get():
        k = ctypes.c_int(-1); assert rt.cudaGetDevice(ctypes.byref(k)) == 0; return k.value
    class PtrAttr(ctypes.Structure):  # struct cudaPointerAttributes, CUDA 13 layout (12: smaller)
        _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int),
                    ("devicePointer", ctypes.c_void_p), ("hostPointer", ctypes.c_void_p),
                    ("locality", ctypes.c_long), ("reserved", ctypes.c_long * 7)]
    def rt_malloc_device():
        p = ctypes.c_void_p(); assert rt.cudaMalloc(ctypes.byref(p), 1 << 20) == 0
        a = PtrAttr(); assert rt.cudaPointerGetAttributes(ctypes.byref(a), p) == 0
        assert rt.cudaFree(p) == 0
        return a.device
    n = drivers.device_count()
    guards = [cyctx.ContextGuard(k) for k in range(n)]
"""


def test_runtime_sees_the_guard_device():
    out = run_child(
        PRELUDE
        + """
    for k, g in enumerate(guards):
        with g:
            print("DEV", k, rt_get(), rt_malloc_device())
    """
    )
    rows = [ln.split()[1:] for ln in out.stdout.splitlines() if ln.startswith("DEV")]
    assert rows and all(a == b == c for a, b, c in rows), rows


@pytest.mark.multigpu
def test_block_calling_cudaSetDevice_is_repaired():
    out = run_child(
        PRELUDE
        + """
    def body(start):
        if start is not None:
            assert rt.cudaSetDevice(start) == 0
        before = drivers.current()
        with guards[0]:
            assert rt.cudaSetDevice(1) == 0          # a library switching device behind our back
            assert drivers.current() == guards[1].handle
        return before == drivers.current()
    res = [in_thread(body, start) for start in (None, 0, 1)]
    print("RESTORED", res)
    """
    )
    assert "RESTORED [True, True, True]" in out.stdout


def test_classic_stale_current_context_is_fixed_inside_the_guard():
    # cudaDeviceReset leaves the thread's current handle non-NULL but dead (docs/evidence.md,
    # "A reset leaves a dead handle current"): cuCtxGetApiVersion fails outside the guard (201
    # with the explicit handle; 709 through the NULL "current" argument: "A dead context answers
    # 201 through its handle and 709 through NULL") and works inside it.
    out = run_child(
        PRELUDE
        + """
    import warnings
    warnings.simplefilter("ignore", cyctx.ContextResetWarning)
    assert rt.cudaSetDevice(0) == 0 and rt.cudaFree(None) == 0
    assert rt.cudaDeviceReset() == 0
    cur = d.cuCtxGetCurrent()[1]
    assert int(cur) != 0, "the stale handle stays current"
    outside = int(d.cuCtxGetApiVersion(cur)[0])
    with guards[0]:
        inside = int(d.cuCtxGetApiVersion(d.cuCtxGetCurrent()[1])[0])
    print("CODES", outside, inside)
    """
    )
    assert "CODES 201 0" in out.stdout
