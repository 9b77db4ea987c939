# The Python-protocol layer's door: everything of the guard module that depends on CPython's
# version (_protocol/*.h and _cpython.h); the driver layer uses none of it.
from cyctx._entries cimport BlockId

# Which Python block an enter opens and an exit leaves (_protocol/blocks.h). GIL: held by every
# caller; block_find is declared nogil for its one caller, _exit_block, whose Python callers hold
# it (the nogil exit() never calls it).
cdef extern from "_protocol/blocks.h" namespace "cyctx":
    enum:
        BLOCK_TOP "cyctx::kTop"
        BLOCK_OWN "cyctx::kOwn"
        BLOCK_SPLICED "cyctx::kSpliced"
        BLOCK_HANDED "cyctx::kHanded"
        BLOCK_NONE "cyctx::kNone"
        BLOCK_AMBIGUOUS "cyctx::kAmbiguous"
    void block_here(void* announced, BlockId* id) noexcept
    int block_find(unsigned long long token, unsigned long long serial, size_t* at, size_t* dropped,
                   size_t* candidates) noexcept nogil
    int block_describe(unsigned long long token, size_t i) noexcept
    # 1: the plain build (public CPython API only: no task or greenlet identity; strand.h).
    bint CYCTX_PLAIN "(CYCTX_PLAIN)"

# The quick bound __enter__/__exit__ of an exact ContextGuard (_protocol/methods.h).
cdef extern from "_protocol/methods.h" namespace "cyctx":
    int install_quick_with(object cls, void* enter, void* exit, void* announced_of) except -1

# A guard collected with no Python frame running is being freed as its thread exits
# (threading.local's teardown): no Python code (the ResourceWarning) may run there.
cdef extern from "Python.h":
    const void* PyEval_GetFrame()

# CPython's internals (_cpython.h). Free-threaded CPython: the Python-level enter takes the
# guard's gate so that close() cannot release the retain between the enter's read of the handle
# and its switch, and close() waits for the enters in flight (one turn at a time, detached:
# cyctx_yield_detached); with the GIL the two cannot interleave (the enter holds the GIL
# throughout), so the check compiles away. At interpreter shutdown a guard freed then must make
# no Python call (no warning either). cyctx_try_ref: a reference to a guard that another thread
# may be freeing, taken only while it is alive (cyctx.live_guards, on a free-threaded build).
cdef extern from "_cpython.h":
    bint CYCTX_FREE_THREADED
    int cyctx_finalizing() noexcept nogil
    void cyctx_yield_detached() noexcept nogil
    void cyctx_enable_try_ref(object o) noexcept
    int cyctx_try_ref(void* o) noexcept nogil

# The gates this thread's Python enters hold (free-threaded; a count only this thread touches):
# a close() run inside one of them (a finalizer or a signal handler during its error) must not
# wait for it.
cdef extern from *:
    """
    #ifdef Py_GIL_DISABLED
    static thread_local int cyctx_t_gates __attribute__((tls_model("initial-exec")));
    #define cyctx_gates_held() (cyctx_t_gates)
    #define cyctx_gates_add(n) ((void)(cyctx_t_gates += (n)))
    #else
    #define cyctx_gates_held() 0
    #define cyctx_gates_add(n) ((void)0)
    #endif
    """
    int cyctx_gates_held() noexcept nogil
    void cyctx_gates_add(int n) noexcept nogil
