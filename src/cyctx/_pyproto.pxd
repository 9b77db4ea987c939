# The Python-protocol layer's door: everything of the guard module that depends on CPython's
# version (_protocol/*.h and the macros below); the driver layer uses none of it.
from cyctx._guard cimport Switch

# The key of the Python block being entered or left (the block of _cpp/thread_entries.h's
# Entry). See _protocol/blocks.h.
cdef extern from "_protocol/blocks.h" namespace "cyctx":
    int block_names_init(object contextlib_file) except -1
    const void* block_key() noexcept
    # Needs the GIL, which its one caller holds (_exit_block for a Python exit, from __exit__);
    # declared nogil for that caller, which the nogil exit() shares.
    int tls_pop_python(unsigned long long token, Switch* out, size_t* dropped, const void** key) noexcept nogil

# The quick bound __enter__/__exit__ of an exact ContextGuard (_protocol/methods.h).
cdef extern from "_protocol/methods.h" namespace "cyctx":
    int install_quick_with(object cls, void* enter, void* exit) except -1

# A guard collected with no Python frame running is being freed as its thread exits
# (threading.local's teardown): no Python code (the ResourceWarning) may run there.
cdef extern from "Python.h":
    const void* PyEval_GetFrame()

# Free-threaded CPython: the Python-level enter takes the guard's gate so that close() cannot
# release the retain between the enter's read of the handle and its switch. With the GIL the
# two cannot interleave (the enter holds the GIL throughout), so the check compiles away.
cdef extern from *:
    """
    #ifdef Py_GIL_DISABLED
    #define CYCTX_FREE_THREADED 1
    #else
    #define CYCTX_FREE_THREADED 0
    #endif
    """
    bint CYCTX_FREE_THREADED

# Interpreter shutdown: a guard freed then must make no Python call (no warning either).
cdef extern from *:
    """
    #if PY_VERSION_HEX >= 0x030D0000
    #define cyctx_is_finalizing() Py_IsFinalizing()
    #else
    #define cyctx_is_finalizing() _Py_IsFinalizing()
    #endif
    """
    int cyctx_is_finalizing() noexcept nogil
