# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False
# cython: freethreading_compatible=True
"""Compiled loops for the benchmarks (built by bench/harness.py into a scratch directory).

Every loop runs without the GIL, so the timing is the driver's and cyctx's, not the
interpreter's. The driver floor calls the driver through pointers resolved once with
cuGetProcAddress, as a C program (docs/evidence.md, "The driver calls a guard makes") or cyctx's
own hot path does:
cuda.bindings' cydriver adds an initialisation check and two indirect calls to each call, so
a floor measured through it would flatter whatever is compared with it. The cydriver cost is
measured too, as its own row. The floor loops do not check return codes (cyctx does; that is
part of its cost); `checked()` makes each of their calls once, checked, before any timing.
"""

from cython.parallel cimport prange, threadid
from libc.stdint cimport int64_t
from cuda.bindings cimport cydriver
from cyctx cimport ContextGuard, Switch, switch_to, switch_back

ctypedef cydriver.CUcontext Ctx
ctypedef cydriver.CUresult Res
ctypedef Res (*ctx_fn)(Ctx) noexcept nogil
ctypedef Res (*ctx_out_fn)(Ctx*) noexcept nogil
ctypedef Res (*retain_fn)(Ctx*, cydriver.CUdevice) noexcept nogil
ctypedef Res (*release_fn)(cydriver.CUdevice) noexcept nogil
ctypedef Res (*get_id_fn)(Ctx, unsigned long long*) noexcept nogil

cdef struct Api:
    ctx_fn push
    ctx_out_fn pop
    retain_fn retain
    release_fn release
    ctx_out_fn get_current
    ctx_fn set_current
    get_id_fn get_id

cdef Api api


cdef void* _proc(const char* name, int version) except NULL:
    # The ABI versions cuda.bindings asks for (e.g. cuCtxPushCurrent_v2 = 4000,
    # cuDevicePrimaryCtxRelease_v2 = 11000), so both paths reach the same entry points.
    cdef void* p = NULL
    cdef cydriver.CUdriverProcAddressQueryResult status
    err = cydriver.cuGetProcAddress(name, &p, version, cydriver.CU_GET_PROC_ADDRESS_DEFAULT, &status)
    if err != cydriver.CUresult.CUDA_SUCCESS or p == NULL:
        raise RuntimeError(f"cuGetProcAddress({name.decode()}, {version}) failed: CUresult {<int>err}")
    return p


def resolve():
    """Resolve the floor's driver entry points (after cuInit)."""
    api.push = <ctx_fn>_proc(b"cuCtxPushCurrent", 4000)
    api.pop = <ctx_out_fn>_proc(b"cuCtxPopCurrent", 4000)
    api.retain = <retain_fn>_proc(b"cuDevicePrimaryCtxRetain", 7000)
    api.release = <release_fn>_proc(b"cuDevicePrimaryCtxRelease", 11000)
    api.get_current = <ctx_out_fn>_proc(b"cuCtxGetCurrent", 4000)
    api.set_current = <ctx_fn>_proc(b"cuCtxSetCurrent", 4000)
    api.get_id = <get_id_fn>_proc(b"cuCtxGetId", 12000)


cdef inline int _need() except -1:
    if api.push == NULL:
        resolve()
    return 0


cdef class Empty:
    """The floor of a Python `with` over an extension type: the same kind of object as a
    ContextGuard, doing nothing."""
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return False


cdef inline Ctx _ctx(size_t h) noexcept nogil:
    return <Ctx>h


cdef int _ok(Res err, str call) except -1:
    if err != cydriver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{call} failed with CUresult {<int>err}")
    return 0


def set_current(size_t h):
    """cuCtxSetCurrent(h) (0: no context), checked."""
    _ok(cydriver.cuCtxSetCurrent(_ctx(h)), "cuCtxSetCurrent")


def checked():
    """Each driver call the floor loops make, once, with its result checked. Leaves the
    thread's context as it found it."""
    cdef cydriver.CUdevice dev
    cdef Ctx c, tmp
    cdef unsigned long long cid
    _need()
    _ok(cydriver.cuDeviceGet(&dev, 0), "cuDeviceGet")
    _ok(api.retain(&c, dev), "cuDevicePrimaryCtxRetain")
    _ok(api.push(c), "cuCtxPushCurrent")
    _ok(api.get_current(&tmp), "cuCtxGetCurrent")
    _ok(api.get_id(c, &cid), "cuCtxGetId")
    _ok(api.set_current(c), "cuCtxSetCurrent")
    _ok(api.pop(&tmp), "cuCtxPopCurrent")
    _ok(api.release(dev), "cuDevicePrimaryCtxRelease")
    _ok(cydriver.cuCtxPushCurrent(c), "cydriver.cuCtxPushCurrent")
    _ok(cydriver.cuCtxPopCurrent(&tmp), "cydriver.cuCtxPopCurrent")


# --- the driver floor --------------------------------------------------------------------

cdef void _pushpop(Ctx c, int64_t n) noexcept nogil:
    cdef int64_t _i
    cdef Ctx tmp
    for _i in range(n):
        api.push(c)
        api.pop(&tmp)


cdef void _pushpop_cydriver(Ctx c, int64_t n) noexcept nogil:
    cdef int64_t _i
    cdef Ctx tmp
    for _i in range(n):
        cydriver.cuCtxPushCurrent(c)
        cydriver.cuCtxPopCurrent(&tmp)


cdef void _full(cydriver.CUdevice dev, int64_t n) noexcept nogil:
    # What a naive guard does per block: take the primary context, push, pop, give it back.
    cdef int64_t _i
    cdef Ctx c
    cdef Ctx tmp
    for _i in range(n):
        api.retain(&c, dev)
        api.push(c)
        api.pop(&tmp)
        api.release(dev)


cdef void _setset(Ctx a, Ctx b, int64_t n) noexcept nogil:
    cdef int64_t _i
    for _i in range(n):
        api.set_current(a)
        api.set_current(b)


cdef void _getcur(int64_t n) noexcept nogil:
    cdef int64_t _i
    cdef Ctx c
    for _i in range(n):
        api.get_current(&c)


cdef void _getid(Ctx c, int64_t n) noexcept nogil:
    cdef int64_t _i
    cdef unsigned long long cid
    for _i in range(n):
        api.get_id(c, &cid)


# --- what a guard's bookkeeping costs -------------------------------------------------------

cdef extern from *:
    """
    // cyctx's own per-thread entry stack (src/cyctx/_cpp/thread_entries.h, the installed copy: see
    // bench/harness.py's build_here), compiled into this extension module as into cyctx's:
    // a thread_local in a shared object is reached through the general-dynamic TLS model.
    // Each call is kept out of line: in the guard, push and pop are in enter() and exit(),
    // separate calls that each compute the thread-local's address; inlined into one loop,
    // it would be computed once for all iterations. Its own stack, not the installed cyctx's (t_stack is
    // static in the header), so it cannot disturb a guard's entries.
    #include "_cpp/thread_entries.h"
    __attribute__((noinline)) static int bench_tls_push(unsigned long long token) {
        cyctx_Switch sw = {nullptr, 0, 0};
        return cyctx::tls_push(token, nullptr, &sw);
    }
    __attribute__((noinline)) static int bench_tls_pop(unsigned long long token, cyctx_Switch *out) {
        std::size_t dropped = 0;
        return cyctx::tls_pop_own(token, out, &dropped);
    }
    """
    int bench_tls_push(unsigned long long token) noexcept nogil
    int bench_tls_pop(unsigned long long token, Switch* out) noexcept nogil


cdef int _tls(int64_t n) except -1 nogil:
    cdef int64_t _i
    cdef Switch e
    cdef unsigned long long token = 1  # any token: this stack holds no one else's entries
    for _i in range(n):
        if bench_tls_push(token) != 0 or bench_tls_pop(token, &e) != 0:
            with gil:
                raise RuntimeError("thread-local stack out of balance")
    return 0


def tls_loop(int64_t n):
    with nogil:
        _tls(n)


# --- cyctx from Cython -------------------------------------------------------------------

cdef int _guard(ContextGuard g, int64_t n) except -1 nogil:
    cdef int64_t _i
    for _i in range(n):
        g.enter()
        g.exit()
    return 0


cdef int _switch(Ctx c, int64_t n) except -1 nogil:
    # The raw layer: the guard's restore rule without its reset check and bookkeeping.
    cdef int64_t _i
    cdef Switch s
    for _i in range(n):
        switch_to(&s, c)
        switch_back(&s)
    return 0


cdef int _switch_id(Ctx c, int64_t n) except -1 nogil:
    # The raw layer plus the guard's per-enter reset check (one cuCtxGetId, docs/design.md "Reset"):
    # switch_id - switch is the reset check; guard - switch_id the bookkeeping, except on the
    # fast path, where switch_to reads the id itself and guard - switch is (bench/report.py).
    cdef int64_t _i
    cdef Switch s
    cdef unsigned long long cid
    for _i in range(n):
        api.get_id(c, &cid)
        switch_to(&s, c)
        switch_back(&s)
    return 0


def pushpop(size_t h, int64_t n):
    _need()
    with nogil:
        _pushpop(_ctx(h), n)


def pushpop_cydriver(size_t h, int64_t n):
    with nogil:
        _pushpop_cydriver(_ctx(h), n)


def full(int dev, int64_t n):
    _need()
    with nogil:
        _full(dev, n)


def setset(size_t a, size_t b, int64_t n):
    _need()
    with nogil:
        _setset(_ctx(a), _ctx(b), n)


def getcurrent(int64_t n):
    _need()
    with nogil:
        _getcur(n)


def getid(size_t h, int64_t n):
    _need()
    with nogil:
        _getid(_ctx(h), n)


def guard_loop(ContextGuard g, int64_t n):
    with nogil:
        _guard(g, n)


def switch_loop(size_t h, int64_t n):
    with nogil:
        _switch(_ctx(h), n)


def switch_id_loop(size_t h, int64_t n):
    _need()
    with nogil:
        _switch_id(_ctx(h), n)


# --- thread scaling ----------------------------------------------------------------------

THREAD_KINDS = ("guard", "pushpop", "switch", "getid")


def threaded(str kind, ContextGuard g, size_t start_ctx, int nthreads, int64_t n):
    """Each of `nthreads` OpenMP threads makes `start_ctx` current (0: none), runs `n`
    operations of `kind` on the guard's context, and leaves no context current."""
    cdef int _t
    cdef int k = THREAD_KINDS.index(kind)
    cdef Ctx c = <Ctx><size_t>g.handle
    cdef Ctx s0 = _ctx(start_ctx)
    _need()
    for _t in prange(nthreads, nogil=True, num_threads=nthreads, schedule="static", chunksize=1):
        api.set_current(s0)
        if k == 0:
            _guard(g, n)
        elif k == 1:
            _pushpop(c, n)
        elif k == 2:
            _switch(c, n)
        else:
            _getid(c, n)
        api.set_current(NULL)


def team_size(int nthreads):
    """How many distinct OpenMP threads a prange over `nthreads` really runs on (the
    runtime may give fewer, e.g. under OMP_THREAD_LIMIT)."""
    cdef int _t
    cdef int seen = 0
    cdef int[256] ids
    if not 0 < nthreads <= 256:
        raise ValueError("1..256 threads")
    for t in range(256):
        ids[t] = 0
    for _t in prange(nthreads, nogil=True, num_threads=nthreads, schedule="static", chunksize=1):
        ids[threadid()] = 1
    for t in range(256):
        seen += ids[t]
    return seen
