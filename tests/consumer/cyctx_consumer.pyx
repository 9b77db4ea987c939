# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False
"""A Cython module that uses cyctx the way a user's extension would: `cimport cyctx`,
guards entered and left without the GIL from OpenMP threads (prange)."""

from cython.parallel cimport prange, threadid
from libc.stdlib cimport calloc, free
from cuda.bindings cimport cydriver

cimport cyctx
from cyctx cimport ContextGuard, Switch, switch_to, switch_back


cdef int one(ContextGuard g, cydriver.CUcontext want) except -1 nogil:
    # 0 when the guard made `want` current inside and restored the thread's context after.
    cdef cydriver.CUcontext before = NULL
    cdef cydriver.CUcontext inside = NULL
    cdef cydriver.CUcontext after = NULL
    cydriver.cuCtxGetCurrent(&before)
    g.enter()
    try:
        cydriver.cuCtxGetCurrent(&inside)
    finally:
        g.exit()
    cydriver.cuCtxGetCurrent(&after)
    return (inside != want) + (after != before)


cdef int raw(cydriver.CUcontext want) except -1 nogil:
    # The same through the bookkeeping-free layer.
    cdef Switch s
    cdef cydriver.CUcontext before = NULL
    cdef cydriver.CUcontext inside = NULL
    cdef cydriver.CUcontext after = NULL
    cydriver.cuCtxGetCurrent(&before)
    switch_to(&s, want)
    try:
        cydriver.cuCtxGetCurrent(&inside)
    finally:
        switch_back(&s)
    cydriver.cuCtxGetCurrent(&after)
    return (inside != want) + (after != before)


def run_parallel(ContextGuard g, int n, int nthreads):
    """(mismatches, number of distinct OpenMP threads that ran iterations)."""
    cdef cydriver.CUcontext want = <cydriver.CUcontext><size_t>g.handle
    cdef int _i, bad = 0, used = 0
    cdef int* per_thread = <int*>calloc(nthreads, sizeof(int))
    try:
        for _i in prange(n, nogil=True, num_threads=nthreads, schedule="static", chunksize=1):
            bad += one(g, want) + raw(want)
            per_thread[threadid()] += 1
        for i in range(nthreads):
            used += per_thread[i] > 0
    finally:
        free(per_thread)
    return bad, used


def exit_without_enter(ContextGuard g):
    """GuardError must cross the nogil boundary as a Python exception."""
    with nogil:
        g.exit()


def enter_closed(cyctx.ContextGuard g):
    with nogil:
        g.enter()


def enter_nogil(ContextGuard g):
    """g.enter() alone, without the GIL (a test leaves it with exit_nogil, in any order)."""
    with nogil:
        g.enter()


def exit_nogil(ContextGuard g):
    """g.exit() alone, without the GIL; raises what it raises."""
    with nogil:
        g.exit()


def switch_to_only(size_t target):
    """switch_to(target) alone; returns (prev, prev_id, switched) so the caller can switch back."""
    cdef Switch s
    with nogil:
        switch_to(&s, <cydriver.CUcontext>target)
    return <size_t>s.prev, s.prev_id, s.switched


def switch_back_only(size_t prev, unsigned long long prev_id, bint switched):
    cdef Switch s
    s.prev = <cydriver.CUcontext>prev
    s.prev_id = prev_id
    s.switched = switched
    with nogil:
        switch_back(&s)


def device_get_checked(int ordinal):
    """cuDeviceGet through cyctx.check_result without the GIL: a bad ordinal raises cyctx's
    typed error across the nogil section."""
    cdef cydriver.CUdevice dev
    with nogil:
        cyctx.check_result(cydriver.cuDeviceGet(&dev, ordinal), "cuDeviceGet")
    return dev


def enter_and_exit_nogil(ContextGuard g):
    """A block entered and left without the GIL: a re-activation after a reset runs inside
    enter() without it too, so another thread can call close() meanwhile."""
    with nogil:
        g.enter()
        g.exit()


def hold(g):
    """A Cython-compiled generator holding a block of g (it has no Python frame of its own)."""
    with g:
        yield
        yield


async def hold_async(g, ev):
    """A Cython-compiled coroutine holding a block of g across an await."""
    with g:
        await ev.wait()


def epoch_nogil(size_t ctx):
    """cyctx's context_epoch through the cimport, without the GIL: 0 for a destroyed context."""
    cdef unsigned long long e
    with nogil:
        e = cyctx.context_epoch(<cydriver.CUcontext>ctx)
    return e
