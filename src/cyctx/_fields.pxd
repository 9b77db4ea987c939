# A guard's fields that other threads read and write (_cpp/shared_fields.h): atomic loads and
# stores, and the gate between close() and a reset's re-activation. GIL: not needed.
from cuda.bindings cimport cydriver

cdef extern from "_cpp/shared_fields.h" namespace "cyctx" nogil:
    cydriver.CUcontext ctx_load(cydriver.CUcontext* p) noexcept
    void ctx_store(cydriver.CUcontext* p, cydriver.CUcontext v) noexcept
    unsigned long long u64_load(unsigned long long* p) noexcept
    void u64_store(unsigned long long* p, unsigned long long v) noexcept
    void int_add(int* p, int v) noexcept
    int int_load(int* p) noexcept
    void int_store(int* p, int v) noexcept
    int gate_enter(int* gate) noexcept
    void gate_leave(int* gate) noexcept
    int gate_close(int* gate) noexcept
    int gate_enter_python(int* gate) noexcept
    void gate_leave_python(int* gate) noexcept
    int gate_close_mark(int* gate) noexcept
    bint gate_drained(int* gate) noexcept
