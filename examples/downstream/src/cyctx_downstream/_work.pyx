# distutils: language = c++
"""What a library built on cyctx does: enter a guard without the GIL, make driver calls of
its own through cydriver inside, leave; from as many Python threads as the caller likes."""

from cuda.bindings cimport cydriver

from cyctx cimport ContextGuard


def current_device(ContextGuard guard):
    """The device of the context current inside ``guard`` (cuCtxGetDevice), without the GIL."""
    cdef cydriver.CUdevice dev = -1
    cdef cydriver.CUresult err
    with nogil:
        guard.enter()
        try:
            err = cydriver.cuCtxGetDevice(&dev)
        finally:
            guard.exit()
    if err != cydriver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuCtxGetDevice failed: {int(err)}")
    return dev


def hammer(ContextGuard guard, Py_ssize_t n):
    """Enter and leave ``guard`` n times without the GIL; return how many times the context
    inside was not the guard's or the context after was not the one before (0 when right)."""
    cdef cydriver.CUcontext want = <cydriver.CUcontext><size_t>guard.handle
    cdef cydriver.CUcontext before = NULL
    cdef cydriver.CUcontext inside = NULL
    cdef cydriver.CUcontext after = NULL
    cdef Py_ssize_t _i, bad = 0
    with nogil:
        for _i in range(n):
            cydriver.cuCtxGetCurrent(&before)
            guard.enter()
            try:
                cydriver.cuCtxGetCurrent(&inside)
            finally:
                guard.exit()
            cydriver.cuCtxGetCurrent(&after)
            bad += (inside != want) + (after != before)
    return bad
