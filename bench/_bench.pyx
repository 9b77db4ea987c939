# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled loops for the benchmarks: the driver floor, cyctx from Cython (nogil), and the
Python-level floor (an empty extension type used in a with-statement)."""

from cython.parallel cimport prange
from libc.stdint cimport int64_t
from cuda.bindings cimport cydriver
from cyctx cimport ContextGuard, Switch, switch_to, switch_back

cdef class Empty:
    """The floor of a Python `with` over an extension type."""
    def __enter__(self):
        return self
    def __exit__(self, exc_type, exc, tb):
        return False


cdef inline cydriver.CUcontext _ctx(size_t h) noexcept nogil:
    return <cydriver.CUcontext>h


def set_current(size_t h):
    if cydriver.cuCtxSetCurrent(_ctx(h)) != 0:
        raise RuntimeError("cuCtxSetCurrent failed")


def py_with(obj, int64_t n):
    cdef int64_t i
    for i in range(n):
        with obj:
            pass


cdef int _pushpop(cydriver.CUcontext c, int64_t n) except -1 nogil:
    cdef int64_t i
    cdef cydriver.CUcontext tmp
    for i in range(n):
        cydriver.cuCtxPushCurrent(c)
        cydriver.cuCtxPopCurrent(&tmp)
    return 0


cdef int _full(cydriver.CUdevice dev, int64_t n) except -1 nogil:
    cdef int64_t i
    cdef cydriver.CUcontext c
    cdef cydriver.CUcontext tmp
    for i in range(n):
        cydriver.cuDevicePrimaryCtxRetain(&c, dev)
        cydriver.cuCtxPushCurrent(c)
        cydriver.cuCtxPopCurrent(&tmp)
        cydriver.cuDevicePrimaryCtxRelease(dev)
    return 0


cdef int _setset(cydriver.CUcontext a, cydriver.CUcontext b, int64_t n) except -1 nogil:
    cdef int64_t i
    for i in range(n):
        cydriver.cuCtxSetCurrent(a)
        cydriver.cuCtxSetCurrent(b)
    return 0


cdef int _getcur(int64_t n) except -1 nogil:
    cdef int64_t i
    cdef cydriver.CUcontext c
    for i in range(n):
        cydriver.cuCtxGetCurrent(&c)
    return 0


cdef int _guard(ContextGuard g, int64_t n) except -1 nogil:
    cdef int64_t i
    for i in range(n):
        g.enter()
        g.exit()
    return 0


cdef int _switch(cydriver.CUcontext c, int64_t n) except -1 nogil:
    cdef int64_t i
    cdef Switch s
    for i in range(n):
        switch_to(&s, c)
        switch_back(&s)
    return 0


def pushpop(size_t h, int64_t n):
    with nogil:
        _pushpop(_ctx(h), n)


def full(int dev, int64_t n):
    with nogil:
        _full(dev, n)


def setset(size_t a, size_t b, int64_t n):
    with nogil:
        _setset(_ctx(a), _ctx(b), n)


def getcurrent(int64_t n):
    with nogil:
        _getcur(n)


def guard_loop(ContextGuard g, int64_t n):
    with nogil:
        _guard(g, n)


def switch_loop(size_t h, int64_t n):
    with nogil:
        _switch(_ctx(h), n)


def threaded(str kind, ContextGuard g, size_t start_ctx, int nthreads, int64_t n):
    """Each of nthreads OpenMP threads makes start_ctx current (0: none) and runs n ops."""
    cdef int t
    cdef int k = {"guard": 0, "pushpop": 1, "getcurrent": 2}[kind]
    cdef cydriver.CUcontext c = <cydriver.CUcontext><size_t>g.handle
    cdef cydriver.CUcontext s0 = _ctx(start_ctx)
    for t in prange(nthreads, nogil=True, num_threads=nthreads, schedule="static", chunksize=1):
        cydriver.cuCtxSetCurrent(s0)
        if k == 0:
            _guard(g, n)
        elif k == 1:
            _pushpop(c, n)
        else:
            _getcur(n)
        cydriver.cuCtxSetCurrent(NULL)
