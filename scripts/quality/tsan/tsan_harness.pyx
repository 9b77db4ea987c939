# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False
"""Native half of the ThreadSanitizer check (scripts/quality/tsan.sh): loops over cyctx's
nogil surface that run without the GIL, so that the threads of run.py run them at the same
time. Compiled with -fsanitize=thread against a ThreadSanitizer build of cyctx, the way a
user's extension is (`cimport cyctx`). Not part of the package.

Each loop runs until a deadline (CLOCK_MONOTONIC, seconds) and returns what it did. A loop
that meets an error it may meet (a reset or a close on another thread) raises it; the Python
side counts it and calls the loop again for the rest of the time.
"""

from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from cuda.bindings cimport cydriver

from cyctx cimport ContextGuard, Switch, switch_to, switch_back


cdef extern from * nogil:
    """
    // Threads inside a nogil loop now, and the most seen at once: the evidence that the loops
    // ran concurrently. Atomics, so the counting itself is no race.
    static int tsan_inside = 0;
    static int tsan_most_inside = 0;
    static inline void tsan_in(void) {
        int now = __atomic_add_fetch(&tsan_inside, 1, __ATOMIC_RELAXED);
        int most = __atomic_load_n(&tsan_most_inside, __ATOMIC_RELAXED);
        while (now > most &&
               !__atomic_compare_exchange_n(&tsan_most_inside, &most, now, 1, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED)) {}
    }
    static inline void tsan_out(void) { __atomic_sub_fetch(&tsan_inside, 1, __ATOMIC_RELAXED); }
    static inline int tsan_most(void) { return __atomic_load_n(&tsan_most_inside, __ATOMIC_RELAXED); }

    // The seeded race: a plain long written by several threads with no synchronisation.
    static long tsan_racy_counter = 0;
    static int tsan_racy_arrived = 0;
    // Both threads wait here (relaxed: no happens-before) so that their loops overlap.
    static void tsan_racy_meet(int n) {
        __atomic_add_fetch(&tsan_racy_arrived, 1, __ATOMIC_RELAXED);
        while (__atomic_load_n(&tsan_racy_arrived, __ATOMIC_RELAXED) < n) {}
    }
    static void tsan_racy_increment(void) { tsan_racy_counter++; }
    static long tsan_racy_value(void) { return tsan_racy_counter; }
    """
    void tsan_in() noexcept nogil
    void tsan_out() noexcept nogil
    int tsan_most() noexcept nogil
    void tsan_racy_meet(int n) noexcept nogil
    void tsan_racy_increment() noexcept nogil
    long tsan_racy_value() noexcept nogil


cdef double now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


def monotonic():
    """The clock the loops' deadlines are on."""
    return now()


def most_inside():
    """The most threads seen inside the nogil loops at once."""
    return tsan_most()


cdef cydriver.CUcontext current() noexcept nogil:
    cdef cydriver.CUcontext cur = NULL
    if cydriver.cuCtxGetCurrent(&cur) != cydriver.CUresult.CUDA_SUCCESS:
        return <cydriver.CUcontext>1  # matches no context: counted as a mismatch
    return cur


# --- guards that nothing resets or closes: every step must restore exactly --------------

cdef int nested_step(ContextGuard a, ContextGuard b, cydriver.CUcontext ca,
                     cydriver.CUcontext cb) except -1 nogil:
    # Mismatches in one round of: a, a again (the fast path), b inside, a raw switch back to a
    # and back, out again; each level checks what is current.
    cdef Switch s
    cdef int bad = 0
    cdef cydriver.CUcontext before = current()
    a.enter()
    try:
        bad += current() != ca
        a.enter()
        try:
            bad += current() != ca
            b.enter()
            try:
                bad += current() != cb
                switch_to(&s, ca)
                try:
                    bad += current() != ca
                finally:
                    switch_back(&s)
                bad += current() != cb
            finally:
                b.exit()
            bad += current() != ca
        finally:
            a.exit()
    finally:
        a.exit()
    bad += current() != before
    return bad


def nested(ContextGuard a, ContextGuard b, double deadline):
    """Rounds of nested_step until the deadline: (rounds, mismatches)."""
    cdef cydriver.CUcontext ca = <cydriver.CUcontext><size_t>a.handle
    cdef cydriver.CUcontext cb = <cydriver.CUcontext><size_t>b.handle
    cdef long rounds = 0
    cdef long bad = 0
    with nogil:
        tsan_in()
        try:
            while True:
                bad += nested_step(a, b, ca, cb)
                rounds += 1
                if (rounds & 63) == 0 and now() > deadline:
                    break
        finally:
            tsan_out()
    return rounds, bad


# --- a guard whose primary context another thread resets --------------------------------

cdef int reset_step(ContextGuard g, cydriver.CUcontext target) except -1 nogil:
    cdef Switch s
    g.enter()
    g.exit()
    switch_to(&s, target)
    switch_back(&s)
    return 0


def under_resets(ContextGuard g, double deadline, long[::1] rounds):
    """Enter/exit g and switch to its handle until the deadline, counting rounds in rounds[0].
    A reset on another thread can make a step fail (the error is raised; call again)."""
    cdef cydriver.CUcontext target = <cydriver.CUcontext><size_t>g.handle
    with nogil:
        tsan_in()
        try:
            while True:
                reset_step(g, target)
                rounds[0] += 1
                if (rounds[0] & 63) == 0 and now() > deadline:
                    break
        finally:
            tsan_out()


def resetter(int ordinal, double deadline, long spin):
    """cuDevicePrimaryCtxReset of the device (what cudaDeviceReset does to it), then `spin`
    idle iterations, until the deadline: the number of resets."""
    cdef cydriver.CUdevice dev = 0
    cdef long resets = 0
    cdef long i
    cdef volatile long sink = 0
    if cydriver.cuDeviceGet(&dev, ordinal) != cydriver.CUresult.CUDA_SUCCESS:
        raise RuntimeError("cuDeviceGet failed")
    with nogil:
        tsan_in()
        try:
            while now() < deadline:
                if cydriver.cuDevicePrimaryCtxReset(dev) != cydriver.CUresult.CUDA_SUCCESS:
                    break
                resets += 1
                for i in range(spin):
                    sink += i
        finally:
            tsan_out()
    return resets


# --- a guard that another thread closes -------------------------------------------------

def until_closed(ContextGuard g, double deadline, long[::1] rounds):
    """Enter/exit g until the deadline or until an enter fails (g was closed: GuardError).
    Rounds in rounds[0]."""
    with nogil:
        tsan_in()
        try:
            while True:
                g.enter()
                g.exit()
                rounds[0] += 1
                if (rounds[0] & 63) == 0 and now() > deadline:
                    break
        finally:
            tsan_out()


# --- single nogil calls, for the Python-level workloads ---------------------------------

def enter_nogil(ContextGuard g):
    with nogil:
        g.enter()


def exit_nogil(ContextGuard g):
    with nogil:
        g.exit()


# --- the seeded race (tsan.sh's self-test) ----------------------------------------------

def racy(long n, int meet):
    """Increment a plain global n times without the GIL and without synchronisation, once
    `meet` threads are in here: a data race. Only the self-test calls it."""
    cdef long _i
    with nogil:
        tsan_racy_meet(meet)
        for _i in range(n):
            tsan_racy_increment()
    return tsan_racy_value()
