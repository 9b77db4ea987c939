// A guard's fields that threads may touch concurrently, and the gate between close() and a
// reset re-activation (or, on free-threaded builds, a Python-level enter).
#pragma once
#include <climits>
#include <cuda.h>

namespace cyctx {

// Accessed with the compiler's atomic builtins (plain fields, so the Cython class keeps its C
// layout). A relaxed load is a plain load everywhere; an acquire load is a plain load on x86
// and an ldar on ARM (a little dearer there, still free of any lock or fence instruction).

inline CUcontext ctx_load(CUcontext *p) noexcept { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void ctx_store(CUcontext *p, CUcontext v) noexcept { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline unsigned long long u64_load(unsigned long long *p) noexcept { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline void u64_store(unsigned long long *p, unsigned long long v) noexcept { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
inline void int_add(int *p, int v) noexcept { __atomic_add_fetch(p, v, __ATOMIC_ACQ_REL); }
inline int int_load(int *p) noexcept { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void int_store(int *p, int v) noexcept { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

// Re-activation announces itself: 0, or -1 when a close() is in flight (the gate is -1).
inline int gate_enter(int *gate) noexcept {
    int g = __atomic_load_n(gate, __ATOMIC_ACQUIRE);
    do {
        if (g < 0) return -1;
    } while (!__atomic_compare_exchange_n(gate, &g, g + 1, true, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    return 0;
}

inline void gate_leave(int *gate) noexcept { __atomic_sub_fetch(gate, 1, __ATOMIC_ACQ_REL); }

// close() claims the gate: 0 when claimed, else what it holds (n > 0: re-activations in
// flight; -1: another close()). Never waits: the other side may need the GIL to finish.
inline int gate_close(int *gate) noexcept {
    int expected = 0;
    if (__atomic_compare_exchange_n(gate, &expected, -1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return 0;
    return expected;
}

// Free-threaded builds: a Python enter holds the gate too, across its driver calls, counted
// apart from re-activations (kGateEnter each). A close() marks the gate closing (its sign bit:
// from then on every gate_enter refuses) and waits for the enters in flight (gate_drained);
// it refuses as gate_close does while a re-activation is in flight (n > 0: a driver call of
// its may stall, and the thread that would end the stall may be this close()'s own), and when
// another close() marked it (-1). 0: marked.
enum { kGateEnter = 1 << 15 };

inline int gate_enter_python(int *gate) noexcept {
    int g = __atomic_load_n(gate, __ATOMIC_ACQUIRE);
    do {
        if (g < 0) return -1;
    } while (!__atomic_compare_exchange_n(gate, &g, g + kGateEnter, true, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    return 0;
}

inline void gate_leave_python(int *gate) noexcept { __atomic_sub_fetch(gate, kGateEnter, __ATOMIC_ACQ_REL); }

inline int gate_close_mark(int *gate) noexcept {
    int g = __atomic_load_n(gate, __ATOMIC_ACQUIRE);
    do {
        if (g < 0) return -1;
        if (g % kGateEnter) return g % kGateEnter;
    } while (!__atomic_compare_exchange_n(gate, &g, g | INT_MIN, true, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    return 0;
}

inline bool gate_drained(int *gate) noexcept { return __atomic_load_n(gate, __ATOMIC_ACQUIRE) == INT_MIN; }

}  // namespace cyctx
