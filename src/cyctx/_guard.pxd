# The contract of cyctx's guard for Cython code (`from cyctx cimport ContextGuard`).
#
# Two layers, both usable inside `with nogil:`:
#
# * ContextGuard.enter()/exit(): the guard keeps each entry's state on a per-thread stack,
#   checks LIFO order and the thread, and restores what was current before the enter.
# * switch_to()/switch_back() with a caller-owned Switch record (e.g. a local variable):
#   the same restore rule with no bookkeeping, for hot loops that already nest correctly.
#
# Errors: every function here is `except -1`; a driver failure raises cyctx.DriverError
# (taking the GIL only then), misuse raises cyctx.GuardError.

# cydriver.pxd includes cuda.h: without it on the include path (numpy's
# include_dirs=[cyctx.get_include()] alone) the build stops with cyctx's words, not a bare
# "cuda.h: No such file or directory", in whichever order a module cimports cydriver and cyctx
# (include/cuda.h, the first cuda.h found through cyctx.get_include()).
from cuda.bindings cimport cydriver


# Driver results. `check` is inline and its success path never touches the GIL; only a failure
# takes it, in raise_driver_error, to raise the typed error of cyctx._errors for the code.
cdef int raise_driver_error(cydriver.CUresult err, const char* call) except -1 with gil

# The DriverError for a failed driver load (no libcuda.so.1, a driver older than CUDA 12.0, the
# toolkit's stub, a missing function), with `problem` in the message. GIL: takes it.
cdef int raise_load_error(cydriver.CUresult err, const char* problem) except -1 with gil

# 0 on CUDA_SUCCESS, else raises. GIL: only on failure. Errors: DriverError.
cdef inline int check(cydriver.CUresult err, const char* call) except -1 nogil:
    if err == cydriver.CUresult.CUDA_SUCCESS:
        return 0
    return raise_driver_error(err, call)


# The record of a switch, filled by switch_to (do not build one by hand). A C struct from
# cyctx/switch.h (in cyctx.get_include()): a guard's per-thread entries hold the same record.
cdef extern from "cyctx/switch.h":
    ctypedef struct Switch "cyctx_Switch":
        cydriver.CUcontext prev     # current before switch_to (NULL: none)
        unsigned long long prev_id  # prev's cuCtxGetId then (see cyctx/switch.h)
        bint switched               # switch_to changed the current context


# Make `target` current on this thread, remembering what was current in `s`: cuCtxSetCurrent
# over another context, a push onto an empty stack. No driver call but cuCtxGetCurrent when
# `target` is already current. GIL: not needed.
cdef int switch_to(Switch* s, cydriver.CUcontext target) except -1 nogil

# Make `s.prev` current again, whatever the code in between made current (it may have called
# cudaSetDevice/cuCtxSetCurrent); from an empty stack, pop to empty again (GuardError when the
# code in between left pushes, after popping them). A `s.prev` that was destroyed or reset in
# between is never handed to the driver: ContextDestroyedError, with the switch undone by a pop
# (docs/guarantees.md, "A context that dies inside the block"). GIL: not needed.
cdef int switch_back(const Switch* s) except -1 nogil


# The lifetime epoch of the context `ctx`: its cuCtxGetId, which the driver never gives twice
# in a process, so a reset, or a destroy and a new context at the same handle value, changes
# it. 0 for NULL or a destroyed context (safe on one). One driver call. GIL: not needed.
# Errors: ForkError in a forked child; DriverError for any other failure.
cdef unsigned long long epoch_of(cydriver.CUcontext ctx) except? 0 nogil


cdef class ContextGuard:
    # Retained primary context; NULL once closed.
    cdef cydriver.CUcontext _ctx
    cdef cydriver.CUdevice _dev
    cdef int _ordinal
    cdef unsigned long long _ctx_id
    cdef bint _shared
    cdef bint _owns_retain    # a primary context this guard retained (else the caller owns it)
    cdef int _resets          # resets detected (and re-activated) by enter()
    cdef int _extra_retains   # retains whose balancing release failed (re-activation, probe)
    # Key of this guard's per-thread entries: process-unique, never reused (an address is).
    cdef unsigned long long _token
    # Close vs reset re-activation (atomic builtins only): n > 0 re-activations in flight,
    # -1 a close() in flight, 0 neither. Neither is ever held across Python code.
    cdef int _gate
    # The exit binding a `with` made just before entering (_protocol/blocks.h's Pending).
    cdef unsigned long long _announced[4]
    cdef object __weakref__

    # Make the guard's context current on this thread (no driver switch when it already is).
    # Detects a reset of the primary context (its id changed) and re-activates it, warning
    # ContextResetWarning. GIL: not needed (taken only to warn or raise).
    # Errors: ForkError in a forked child; GuardError when closed; DriverError.
    cdef int enter(self) except -1 nogil

    # Restore what was current before the matching enter() on this thread.
    # The nogil pair matches entries by guard: a thread's enter()/exit() of one guard nest.
    # (Python's `with` also records which block it is, by the `with` statement's exit binding
    # or else the strand it runs in, so that interleaved blocks of one guard on a thread, two
    # tasks', greenlets' or generators', are told apart or refused, never guessed:
    # docs/guarantees.md, "Which block an exit belongs to".)
    # A context current before the enter that was destroyed or reset during the block is not
    # made current again: ContextDestroyedError (switch_back's rule).
    # Entries of guards freed while entered that lie above this guard's entry are dropped
    # first (they can never be left), then ResourceWarning is warned after the restore.
    # GIL: not needed (taken only to warn or raise). Errors: GuardError on exit without enter
    # on this thread or out of LIFO order (no state changes then: leave the guards entered
    # after this one, then call exit() again); DriverError (the entry is ended all the same).
    # (Python's `with` differs here: its exit is never called again, so an out-of-order one
    # removes its entry, and the block still open restores what was current before it.)
    cdef int exit(self) except -1 nogil

    # Internal. Release the guard's own retain and the extra ones; GuardError/DriverError.
    cdef int _release_all(self) except -1
