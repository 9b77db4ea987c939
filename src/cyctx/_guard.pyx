"""ContextGuard: retain a device's primary context, make it current around work, restore.

The restore rule (docs/design.md, "The restore rule"): leaving makes current exactly what was
current before the enter. Over another context the guard switches and restores with
``cuCtxSetCurrent`` -- which replaces the top of the thread's context stack -- rather than
push/pop, so a block that called ``cudaSetDevice`` or ``cuCtxSetCurrent`` (which also replace
the top) is repaired and the guard never pops a context it did not push. On an empty stack it
pushes and pops its one entry (what ``cuCtxSetCurrent`` does there, for less). The stack's
depth is the same before and after.

This is cyctx's one extension module: it owns all native state (the driver table, the fork
flags and their pthread_atfork handler, the live-guard registry, the per-thread entries), so a
process has one of each (docs/design.md, "One owner of native state"). Its source is this file
(the guard class and the module's functions), the driver layer's parts in _native/ and the
Python-protocol layer's (everything that depends on CPython's version) in _protocol/.
"""

import os
import types
import warnings

cimport cython
from cpython.long cimport PyLong_AsLongAndOverflow
from cpython.ref cimport PyObject, Py_XDECREF
from libc.stdlib cimport free

from cuda.bindings cimport cydriver

from cyctx._driver cimport DriverApi, driver_api, driver_load
from cyctx import _errors, _inputs
from cyctx._errors import ContextResetWarning, CyctxError, driver_error


# The native state this module owns (docs/design.md, "One owner of native state"), one door
# (.pxd) per concept; the Python-protocol layer's is _pyproto.pxd.
from cyctx._registry cimport new_token, live_add, live_remove, live_take
from cyctx._entries cimport (
    BlockId, CYCTX_PREV_UNKNOWN, tls_push, tls_pop_own, tls_pop_innermost, tls_splice_at,
    tls_depth, tls_count, tls_top_token,
)
from cyctx._fields cimport (
    ctx_load, ctx_store, u64_load, u64_store, int_add, int_load, int_store, gate_enter, gate_leave,
    gate_close, gate_enter_python, gate_leave_python, gate_close_mark, gate_drained,
)
from cyctx._forkstate cimport forked_after_cuda, fork_child, mark_cuda_initialised, install_fork_handler
from cyctx._pyproto cimport (
    block_here, block_find, block_describe, BLOCK_TOP, BLOCK_OWN, BLOCK_NONE, BLOCK_HANDED, BLOCK_AMBIGUOUS,
    install_quick_with, PyEval_GetFrame, CYCTX_FREE_THREADED, cyctx_finalizing, CYCTX_PLAIN,
    cyctx_gates_held, cyctx_gates_add, cyctx_yield_detached, cyctx_enable_try_ref, cyctx_try_ref,
)

# Built for a CPython the suite has not run on (or with CYCTX_PLAIN_PROTOCOL=1): public CPython
# API only, and an exit through a wrapper is told from others' only by its generators
# (docs/guarantees.md, "Which block an exit belongs to").
PLAIN_PROTOCOL = bool(CYCTX_PLAIN)

if install_fork_handler() != 0:
    raise ImportError("cyctx: pthread_atfork failed; fork safety cannot be guaranteed")


include "_native/errors.pxi"
include "_native/driver.pxi"
include "_native/switch.pxi"


# --- the guard --------------------------------------------------------------------------

# The shared guards, one per ordinal. No lock: a lock held across the construction (which
# releases the GIL in driver calls and runs Python code that can run finalizers and signal
# handlers) would deadlock a re-entrant shared() and hang a child forked at that moment.
# Racing first users each construct a guard; dict.setdefault, atomic with or without the
# GIL (free-threaded CPython locks the dict), publishes exactly one, and the others release
# theirs. Nothing is held while Python code or the driver runs.
cdef dict _shared_guards = {}
# The same guards for the first ordinals, read by cyctx.device() without a dict lookup: borrowed
# references (the dict keeps each published guard for the life of the process), written once
# per ordinal, after publication, by the one winner of the dict's setdefault.
cdef enum:
    _FAST_ORDINALS = 64
cdef PyObject* _shared_fast[_FAST_ORDINALS]
# Every guard alive in this process, for diagnostics (cyctx's doctor compares the ids the guards
# last saw with the driver's): the live-guard registry (_cpp/registry.h) holds each one's
# address, not a reference (a weak set would cost a weak reference and its callback per guard,
# most of a temporary guard's construction), which __dealloc__ removes before anything else.
# Between the last reference's drop and that removal the address is a guard being freed: with
# the GIL no other thread runs then; on a free-threaded build a reader takes a reference only
# while the guard's count is above zero (cyctx_try_ref), under the registry's lock, which the
# removal waits for.
# What __cinit__ takes from shared() for a shared guard that is not used yet (no driver call).
cdef object _NOT_YET_USED = object()
cdef long long _MAX_ORDINAL = 2147483647  # _ordinal is a C int: no device has a larger one


cdef class ContextGuard:
    """Retain a device's primary context and make it current around work.

    Construct it once and keep it: construction retains the primary context (which
    activates it), :meth:`close` releases it. Each ``with guard:`` makes the context current
    on the calling thread and, on leaving, restores exactly what was current before (no
    context included), also when the block raised or called ``cudaSetDevice``. When the
    context is already current, entering and leaving make no driver switch.

    A guard that nothing closed never destroys a context: when the garbage collector frees
    it, its retain goes to the process (held once per device, as :func:`cyctx.device` holds
    it), so ``with ContextGuard(0):`` keeps what the block allocated. Such a guard warns
    ``ResourceWarning`` (shown under ``-X dev``); :meth:`close` releases at once.

    A guard is also a decorator: ``@guard`` runs each call of the function inside
    ``with guard:`` (``async def`` and generator functions are refused, ``TypeError``). Only a
    shared guard pickles or copies (as the shared guard of its device); any other is a
    ``TypeError`` that says what to send instead.

    Parameters
    ----------
    device : int or device object or context or stream
        A device ordinal, ``0 <= device < cuDeviceGetCount()``; a ``cuda.core`` ``Device``,
        ``cupy.cuda.Device`` or ``torch.device("cuda", k)`` (the device's primary context);
        a ``cuda.bindings.driver.CUcontext`` (see :meth:`from_handle` for an int handle); a
        stream (``CUstream``, cuda.core, CuPy or torch; its context by ``cuStreamGetCtx``);
        a ``CUgreenCtx`` (``cuCtxFromGreenCtx``). Primary contexts are retained by the
        guard; any other context stays the caller's (no retain; checked on every enter).

    Raises
    ------
    TypeError
        ``device`` is not an int (``"0"``, ``None``, ``1.5``, ``True``).
    ValueError
        ``device`` is negative.
    InvalidDeviceError
        No such device (a :class:`DriverError` and a ``ValueError``).
    ForkError
        This process is a forked child of one that used CUDA: the driver refuses it.
    DriverError
        The driver failed (no GPU, a driver in a bad state, ...).

    Examples
    --------
    From Python::

        from cyctx import ContextGuard
        guard = ContextGuard(0)          # retain once
        with guard:                      # current on this thread
            ...                          # driver calls (cuModuleLoad, cuLaunchKernel...)
        guard.close()                    # release (or let the process end)

    From Cython, without the GIL::

        from cyctx cimport ContextGuard
        cdef ContextGuard g = ContextGuard(0)
        with nogil:
            g.enter()
            try:
                ...                      # cydriver calls
            finally:
                g.exit()

    One guard may be entered from many threads at once; each thread's entries are its own.
    """

    def __cinit__(self, *args, **kwargs):
        cdef int added
        if kwargs or len(args) != 1 or type(self) is not ContextGuard:
            device = _device_argument(type(self), args, kwargs)
        else:
            device = args[0]  # ContextGuard(x), the common call: nothing to check here
        self._ctx = NULL
        self._shared = False
        self._owns_retain = False
        self._resets = 0
        self._extra_retains = 0
        self._gate = 0
        self._token = new_token()
        if type(device) is int and device >= 0:
            # The common spelling, ContextGuard(0): the ordinal as is (what recognise returns).
            _init_primary(self, device, _device_count())
        elif device is _NOT_YET_USED:
            pass  # a shared guard, made by shared(): no driver call until its first use
        else:
            target = _inputs.recognise(device)
            count = _device_count()
            if target.kind == _inputs.Kind.ORDINAL:
                _init_primary(self, target.value, count)
            else:
                _init_context(self, _context_of(target.kind, target.value), count)
        cyctx_enable_try_ref(self)
        added = live_add(self._token, <void*>self)
        if added == -1:
            raise MemoryError("cyctx: no memory to register the guard")  # __dealloc__ releases
        if added != 0:  # token 0, the registry's empty mark: the counter wrapped past 2**64
            raise SystemError("cyctx: the guard token counter wrapped; no guard can be made")

    @staticmethod
    def from_handle(handle):
        """A guard for an existing context given as an int handle (a ``CUcontext`` address).

        ``ContextGuard(int)`` means a device ordinal; this is the way to pass a raw handle.
        A primary context is retained by the guard; any other context stays the caller's.
        """
        if isinstance(handle, bool) or not hasattr(type(handle), "__index__"):
            raise TypeError(f"from_handle takes an int CUcontext address, got {type(handle).__name__}")
        h = _inputs.context_handle(handle, "from_handle: the context handle")
        from cuda.bindings.driver import CUcontext
        return ContextGuard(CUcontext(h))

    def __dealloc__(self):
        # Safety net only (close() is the deterministic release). No Python calls here:
        # this can run at interpreter shutdown. In a forked child the retain belongs to the
        # parent and the driver is unusable: nothing to release.
        # Entries this guard still has on some thread (it was freed while entered) stay there,
        # orphaned: their token is never reused, so no other guard matches them, and an exit
        # of an enclosing guard on that thread drops them (tls_drop_dead_top).
        # The guard's own primary retain goes to the process (_hand_to_process: the device's
        # shared guard or its slot), so nothing closed never destroys a context; the extra
        # retains, and the own one when the process holds one already, are released.
        cdef int n = int_load(&self._extra_retains)
        cdef bint kept = False
        if self._token:
            live_remove(self._token)
        if ctx_load(&self._ctx) != NULL and not forked_after_cuda():
            if self._owns_retain:
                if not self._shared and _hand_to_process(self._ordinal):
                    kept = True
                else:
                    n += 1
            _release(self._dev, n)
            if (n or kept) and not self._shared and not cyctx_finalizing() and PyEval_GetFrame() != NULL:
                # Like an unclosed file: the retain was dropped by the collector, not by code.
                # Under -W error the warning is raised here and, as from any finalizer,
                # reported through sys.unraisablehook (the release happened all the same).
                # Only with Python code running on this thread: not at interpreter shutdown,
                # nor when a thread's state is cleared as it exits (no frame), where no Python
                # call may be made.
                # Where the process holds the retain the context stays: no driver call to ask.
                _warn_collected(self._ordinal, not self._owns_retain and _primary_destroyed(self._dev))
        ctx_store(&self._ctx, NULL)

    @staticmethod
    def shared(device):
        """The process-wide guard of ``device``: made on first call, never closed.

        This is the easy way to hold the long-lived retain: every caller gets the same
        guard, so the primary context stays alive between blocks. Thread-safe.
        :func:`cyctx.device` returns the same guard. ``device`` is anything ContextGuard takes
        that names a device (an ordinal, a ``cuda.core`` ``Device``, ``cupy.cuda.Device``,
        ``torch.device``, a ``CUdevice``); a context or a stream is a ``TypeError``, since the
        shared guard of a device is its primary context. Pickles as the shared guard of the
        same device in the receiving process.

        Making it asks nothing of the driver: its first use (a ``with``, a call of a function
        it decorates, :attr:`handle`) retains the primary context, and raises
        :class:`InvalidDeviceError` there when the device does not exist. So a decorator at
        import (``@cyctx.device(0)``) initialises nothing.
        """
        ordinal = _inputs.shared_ordinal(device)
        guard = _shared_guards.get(ordinal)
        if guard is not None:
            return guard
        if ordinal > _MAX_ORDINAL:
            ContextGuard(ordinal)  # no device has such an ordinal: InvalidDeviceError
        # No lock (see _shared_guards): racing callers each make one; one is published.
        cdef ContextGuard mine = ContextGuard(_NOT_YET_USED)
        mine._shared = True  # before publication: nobody may ever see it closable
        mine._owns_retain = True  # a primary context's retain, taken at its first use
        mine._ordinal = ordinal
        return _shared_guards.setdefault(ordinal, mine)

    cdef int enter(self) except -1 nogil:
        return _enter_block(self, NULL)

    cdef int exit(self) except -1 nogil:
        return _exit_block(self, EXIT_NOGIL, 0)

    def __enter__(self):
        _called_on_a_guard(self, "__enter__")
        return _with_enter(self)

    def __exit__(self, exc_type, exc, tb):
        _called_on_a_guard(self, "__exit__")
        return _with_exit(self, exc_type, exc, tb, 0)

    def close(self):
        """Release the retain taken at construction. Idempotent.

        Raises
        ------
        GuardError
            The guard is entered on this thread, or it is a :meth:`shared` guard, or another
            thread is closing it or re-activating it after a reset right now (nothing done). On
            a free-threaded build ``close()`` waits for the Python enters in flight.
        DriverError
            The release failed; the guard stays open (the retain is still held) so a later
            ``close()`` or garbage collection can release it.
        """
        _called_on_a_guard(self, "close")
        if self._shared:
            raise _errors.close_refused(repr(self), "shared")
        if ctx_load(&self._ctx) == NULL:
            return
        if tls_count(self._token):
            raise _errors.close_refused(repr(self), "inside")
        # Claim the guard against a reset re-activation on another thread (which would
        # otherwise re-open it after this close and, later, release a retain that is not its
        # own) and against a second close() (a double release). With the GIL: never waits (the
        # other side may need it). Free-threaded: Python enters hold the gate across driver
        # calls only, so close() marks it (later ones say closed) and waits for those in flight;
        # but never for an enter of this thread's own (a finalizer or a signal handler run
        # inside it), nor for a re-activation (refused as with the GIL) or another close().
        if CYCTX_FREE_THREADED and not cyctx_gates_held():
            busy = gate_close_mark(&self._gate)
            if busy == 0:
                while not gate_drained(&self._gate):
                    cyctx_yield_detached()
        else:
            busy = gate_close(&self._gate)
        if busy > 0:
            raise _errors.close_refused(repr(self), "busy")
        if busy < 0:
            raise _errors.close_refused(repr(self), "closing")
        try:
            if ctx_load(&self._ctx) == NULL:
                return  # closed by another thread between the check above and the claim
            if not forked_after_cuda():  # in a forked child the retains are the parent's
                self._release_all()
            ctx_store(&self._ctx, NULL)
        finally:
            int_store(&self._gate, 0)

    cdef int _release_all(self) except -1:
        # The guard's own retain (a primary context it retained) and any it could not give
        # back earlier. Each success is counted at once, so a failure midway leaves the guard
        # open with exactly the retains it still holds (a later close() releases those).
        cdef const DriverApi* d = driver_api()  # loaded: the guard was constructed
        while self._extra_retains:
            check(d.PrimaryCtxRelease(self._dev), "cuDevicePrimaryCtxRelease")
            int_add(&self._extra_retains, -1)
        if self._owns_retain:
            check(d.PrimaryCtxRelease(self._dev), "cuDevicePrimaryCtxRelease")
        return 0

    @property
    def device(self):
        """The device ordinal (int)."""
        return self._ordinal

    @property
    def is_primary(self):
        """True when the guard holds a retain of a primary context; False for a context the
        caller owns (from cuCtxCreate or a green context)."""
        return self._owns_retain

    @property
    def closed(self):
        """True once :meth:`close` released the retain (never for a shared guard)."""
        return ctx_load(&self._ctx) == NULL and not self._shared

    @property
    def is_shared(self):
        """True for the process-wide guards of :meth:`shared`."""
        return self._shared

    @property
    def handle(self):
        """The primary context's ``CUcontext`` as an int address. GuardError when closed; a
        shared guard's first use when it has had none (it retains)."""
        cdef cydriver.CUcontext ctx = ctx_load(&self._ctx)
        if ctx == NULL:
            ctx = _first_use(self)
        return <size_t>ctx

    @property
    def context(self):
        """The primary context as a ``cuda.bindings.driver.CUcontext``."""
        from cuda.bindings.driver import CUcontext
        return CUcontext(self.handle)

    @property
    def context_id(self):
        """The driver's unique id of the context (``cuCtxGetId``) as last seen by enter()."""
        return u64_load(&self._ctx_id)

    @property
    def epoch(self):
        """The lifetime epoch of the guard's context now (:func:`cyctx.context_epoch`): a new
        value after every reset that was re-activated, None while the context is destroyed
        (reset and not yet re-activated). One ``cuCtxGetId``. GuardError when closed; a shared
        guard's first use when it has had none."""
        cdef cydriver.CUcontext ctx = ctx_load(&self._ctx)
        if ctx == NULL:
            ctx = _first_use(self)
        cdef unsigned long long e = epoch_of(ctx)
        return None if e == 0 else e

    @property
    def resets(self):
        """How many resets of the primary context enter() detected and re-activated."""
        return int_load(&self._resets)

    def __repr__(self):
        cdef cydriver.CUcontext ctx = ctx_load(&self._ctx)
        if ctx != NULL:
            state = f"ctx=0x{<size_t>ctx:x} id={u64_load(&self._ctx_id)}"
        else:
            state = "not used yet" if self._shared else "closed"
        shared = " shared" if self._shared else ""
        return f"<cyctx.ContextGuard device={self._ordinal}{shared} {state}>"

    def __call__(self, func):
        """Decorate ``func``: each call runs inside ``with self:``.

        ``async def`` and generator functions are refused (TypeError): their body runs in
        steps, resumed later on whatever thread drives them, so a guard around the call would
        not be around the work. Put ``with guard:`` inside such a function instead.
        """
        return _decorated(self, func)

    def __reduce__(self):
        _called_on_a_guard(self, "__reduce__")
        # A shared guard stands for "device k's shared guard", which every process has: it
        # travels as that (to a spawned worker, a Dask task). Any other guard holds this
        # process's retain, which means nothing elsewhere.
        if self._shared:
            return (device, (self._ordinal,))
        raise TypeError(_cannot_travel(self, "pickle"))

    def __copy__(self):
        _called_on_a_guard(self, "__copy__")
        if self._shared:
            return self  # one per device and process: a copy is the guard itself
        raise TypeError(_cannot_travel(self, "copy"))

    def __deepcopy__(self, memo):
        _called_on_a_guard(self, "__deepcopy__")
        return self.__copy__()


include "_native/entries.pxi"
include "_native/construct.pxi"
include "_native/lifetime.pxi"
include "_protocol/with.pxi"
include "_protocol/callers.pxi"
include "_native/epoch.pxi"


@cython.binding(False)  # a builtin function: the interpreter's quickest call (METH_O)
@cython.always_allow_keywords(False)
def device(device):
    """The process's shared guard of ``device``: ``with cyctx.device(0):``, ``@cyctx.device(0)``.

    The same object as :meth:`ContextGuard.shared` (it retains at its first use and is never
    closed, so making it, as a decorator at import does, asks nothing of the driver), so the
    primary context stays alive between blocks and each ``with`` costs what ``with guard:``
    costs on a kept guard. ``device`` is anything :class:`ContextGuard` takes that names a
    device: an ordinal, a ``cuda.core`` ``Device``, ``cupy.cuda.Device``,
    ``torch.device("cuda", k)``, a ``CUdevice``; a context or a stream is a TypeError (see
    :meth:`ContextGuard.shared`). As a decorator, each call of the function runs inside the
    guard; ``async def`` and generator functions are refused (TypeError).

    Pickles as the shared guard of the same ordinal in the receiving process.
    """
    # The common case, a small int already seen, reads a C array: what `with cyctx.device(k):`
    # adds to `with guard:` is the call (METH_O) and this.
    cdef int overflow = 0
    cdef long k
    cdef PyObject* g
    if type(device) is int:
        k = PyLong_AsLongAndOverflow(device, &overflow)
        if not overflow and 0 <= k < _FAST_ORDINALS:
            g = <PyObject*>_ptr_load(<void**>&_shared_fast[k])  # published by another thread
            if g != NULL:
                return <object>g
    if isinstance(device, (types.FunctionType, types.MethodType)):
        raise TypeError(
            f"cyctx.device takes a device, got the function {_inputs.shown(device)}: "
            f"decorate with @cyctx.device(0) (the device's guard), not @cyctx.device")
    return ContextGuard.shared(device)


def current_device():
    """The device (ordinal) of the calling thread's current context; None when none is current.

    Never initialises the driver or creates a context: one ``cuCtxGetCurrent`` and, when a
    context is current, one ``cuCtxGetDevice``. None also before anyone in this process called
    ``cuInit``. In a child forked after cyctx used CUDA: :class:`ForkError`."""
    cdef cydriver.CUcontext cur = NULL
    cdef cydriver.CUdevice dev = 0
    if forked_after_cuda():
        _raise_fork()
    cdef const DriverApi* d = _api()
    cdef cydriver.CUresult err = d.CtxGetCurrent(&cur)
    if err == cydriver.CUresult.CUDA_ERROR_NOT_INITIALIZED:
        return None
    check(err, "cuCtxGetCurrent")
    if cur == NULL:
        return None
    check(d.CtxGetDevice(&dev), "cuCtxGetDevice")
    return <int>dev


def current_handle():
    """The calling thread's current ``CUcontext`` as an int (0: none). One cuCtxGetCurrent.

    Before anyone in this process called ``cuInit`` nothing can be current: 0, not an error
    (threads racing the first guard's construction would otherwise see one by chance). In a
    child forked after cyctx used CUDA: :class:`ForkError`."""
    cdef cydriver.CUcontext cur = NULL
    if forked_after_cuda():
        _raise_fork()
    cdef cydriver.CUresult err = _api().CtxGetCurrent(&cur)
    if err == cydriver.CUresult.CUDA_ERROR_NOT_INITIALIZED:
        # Not a fork diagnosis: a child of a parent that never used CUDA answers the same.
        return 0
    check(err, "cuCtxGetCurrent")
    return <size_t>cur


def live_guards():
    """The ContextGuards alive in this process (a snapshot list; other threads may close or
    free them meanwhile)."""
    cdef void** got = NULL
    cdef size_t n = 0
    cdef size_t i
    if live_take(cyctx_try_ref, &got, &n) != 0:
        raise MemoryError("cyctx: no memory to list the live guards")
    # A shared guard not used yet holds nothing: it is no guard of a context yet.
    cdef list out = []
    cdef ContextGuard g
    try:
        for i in range(n):
            g = <ContextGuard>got[i]
            if not g._shared or ctx_load(&g._ctx) != NULL:
                out.append(g)
    finally:
        for i in range(n):
            Py_XDECREF(<PyObject*>got[i])  # the reference the registry's take gave
        free(got)
    return out


def open_entries():
    """Number of open guard entries on the calling thread (for tests and diagnostics)."""
    return tls_depth()


def fork_state():
    """(forked_after_cuda, fork_child) from the C flags of _cpp/fork.h, for the doctor: one fork
    state per process, the one the guard acts on (set by its pthread_atfork child handler)."""
    return bool(forked_after_cuda()), bool(fork_child())
