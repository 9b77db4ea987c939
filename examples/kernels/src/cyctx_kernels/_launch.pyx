# distutils: language = c++
"""Load a compiled kernel on a device inside a cyctx guard, and launch it without the GIL.

Every driver call here is the module's own (cydriver); cyctx only makes the right context
current around them and restores the thread's context afterwards. The kernel this example
uses is ``add(float* x, int n, float v)``: ``x[i] += v``.
"""

from libc.stdint cimport int64_t, uintptr_t
from libc.stdlib cimport free, malloc
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from cuda.bindings cimport cydriver

from cyctx cimport ContextGuard

cdef enum:
    BLOCK = 256  # threads per block

# What each launch loop puts around a launch (bench_launches, run_worker).
MODES = {
    "guard_per_launch": 0,   # with guard: around every launch
    "guard_per_batch": 1,    # one with guard: around the whole loop
    "raw_push_pop": 2,       # cuCtxPushCurrent/cuCtxPopCurrent around every launch, no guard
    "guard_launch_sync": 3,  # with guard: around launch + cuStreamSynchronize
    "raw_set_current": 4,    # cuCtxSetCurrent(ctx) / cuCtxSetCurrent(NULL) around every launch, no guard
}


cdef int _check(cydriver.CUresult err, const char* what) except -1 nogil:
    if err != cydriver.CUresult.CUDA_SUCCESS:
        with gil:
            raise RuntimeError(f"{what.decode()} failed: CUresult {<int>err}")
    return 0


cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef class DeviceKernel:
    """A kernel loaded on the device of ``guard`` (cuModuleLoadData inside the guard)."""

    cdef readonly ContextGuard guard
    cdef cydriver.CUmodule module
    cdef cydriver.CUfunction fn

    def __cinit__(self, ContextGuard guard, bytes image, bytes name):
        cdef const char* img = image
        cdef const char* nm = name
        self.guard = guard
        self.module = NULL
        with nogil:
            guard.enter()
            try:
                _check(cydriver.cuModuleLoadData(&self.module, img), b"cuModuleLoadData")
                _check(cydriver.cuModuleGetFunction(&self.fn, self.module, nm), b"cuModuleGetFunction")
            finally:
                guard.exit()

    def close(self):
        """Unload the module (inside the guard). Idempotent."""
        if self.module == NULL:
            return
        with nogil:
            self.guard.enter()
            try:
                _check(cydriver.cuModuleUnload(self.module), b"cuModuleUnload")
                self.module = NULL
            finally:
                self.guard.exit()

    cdef int launch(self, cydriver.CUstream stream, cydriver.CUdeviceptr x, int n, float v) except -1 nogil:
        # The caller has made the kernel's context current.
        cdef void* args[3]
        args[0] = &x
        args[1] = &n
        args[2] = &v
        return _check(cydriver.cuLaunchKernel(self.fn, <unsigned int>((n + BLOCK - 1) // BLOCK), 1, 1,
                                              BLOCK, 1, 1, 0, stream, args, NULL), b"cuLaunchKernel")


cdef int _loop(DeviceKernel k, cydriver.CUcontext ctx, cydriver.CUstream s, cydriver.CUdeviceptr x,
               int n, int launches, int mode) except -1 nogil:
    cdef int _i
    cdef cydriver.CUcontext popped = NULL
    if mode == 1:
        k.guard.enter()
        try:
            for _i in range(launches):
                k.launch(s, x, n, 1.0)
        finally:
            k.guard.exit()
        return 0
    for _i in range(launches):
        if mode == 2:
            _check(cydriver.cuCtxPushCurrent(ctx), b"cuCtxPushCurrent")
            try:
                k.launch(s, x, n, 1.0)
            finally:
                _check(cydriver.cuCtxPopCurrent(&popped), b"cuCtxPopCurrent")
        elif mode == 4:
            # What the guard's switching path does from a thread with no context, without the
            # guard: to see whether cuCtxSetCurrent itself is what costs after a launch.
            _check(cydriver.cuCtxSetCurrent(ctx), b"cuCtxSetCurrent")
            try:
                k.launch(s, x, n, 1.0)
            finally:
                _check(cydriver.cuCtxSetCurrent(NULL), b"cuCtxSetCurrent")
        else:
            k.guard.enter()
            try:
                k.launch(s, x, n, 1.0)
                if mode == 3:
                    _check(cydriver.cuStreamSynchronize(s), b"cuStreamSynchronize")
            finally:
                k.guard.exit()
    return 0


def run_worker(DeviceKernel k, int n, int launches, str mode="guard_per_launch", bint check=True):
    """On the calling thread, without the GIL: inside the guard, make a stream and a buffer of
    ``n`` zeros, launch ``add(x, n, 1.0)`` ``launches`` times on that stream with ``mode``
    around each launch, synchronise, and check every element equals ``launches``.

    Returns ``(wrong elements, ns spent in the launch loop)``. The thread's current context
    is the same after as before.
    """
    cdef int m = MODES[mode]
    cdef cydriver.CUcontext ctx = <cydriver.CUcontext><uintptr_t>k.guard.handle  # raw mode pushes it
    cdef cydriver.CUstream s = NULL
    cdef cydriver.CUdeviceptr x = 0
    cdef float* host = NULL
    cdef int64_t t0 = 0, t1 = 0
    cdef Py_ssize_t i, wrong = 0
    cdef bint do_check = check
    with nogil:
        k.guard.enter()
        try:
            _check(cydriver.cuStreamCreate(&s, cydriver.CU_STREAM_NON_BLOCKING),
                   b"cuStreamCreate")
            _check(cydriver.cuMemAlloc(&x, n * sizeof(float)), b"cuMemAlloc")
            # On the thread's own stream, so it is ordered before the launches: a plain
            # cuMemsetD32 runs on the legacy default stream, which a non-blocking stream does
            # not wait for (with 16 threads on an H200, a launch can land before the zeroing).
            _check(cydriver.cuMemsetD32Async(x, 0, n, s), b"cuMemsetD32Async")
        finally:
            k.guard.exit()
        # The loop enters and leaves the guard itself (or does not, in raw mode).
        t0 = _now_ns()
        _loop(k, ctx, s, x, n, launches, m)
        t1 = _now_ns()
        k.guard.enter()
        try:
            _check(cydriver.cuStreamSynchronize(s), b"cuStreamSynchronize")
            if do_check:
                host = <float*>malloc(n * sizeof(float))
                if host == NULL:
                    with gil:
                        raise MemoryError()
                _check(cydriver.cuMemcpyDtoH(host, x, n * sizeof(float)), b"cuMemcpyDtoH")
                for i in range(n):
                    wrong += host[i] != <float>launches
                free(host)
            _check(cydriver.cuMemFree(x), b"cuMemFree")
            _check(cydriver.cuStreamDestroy(s), b"cuStreamDestroy")
        finally:
            k.guard.exit()
    return wrong, t1 - t0


def launch_on(DeviceKernel k, uintptr_t ptr, int n, float v, uintptr_t stream):
    """Launch ``add(ptr, n, v)`` on a stream someone else owns (a torch or CuPy stream),
    inside the kernel's guard, without the GIL. Does not synchronise."""
    with nogil:
        k.guard.enter()
        try:
            k.launch(<cydriver.CUstream>stream, <cydriver.CUdeviceptr>ptr, n, v)
        finally:
            k.guard.exit()
