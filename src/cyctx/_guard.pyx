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
(the guard), _driver_and_errors.pxi (the driver, and the native half of the errors) and _switch.pxi (the
raw switch layer and the restore a guard's exit shares with it).
"""

import os
import types
import warnings
import weakref

cimport cython
from cpython.long cimport PyLong_AsLongAndOverflow
from cpython.ref cimport PyObject

from cuda.bindings cimport cydriver

from cyctx._driver cimport DriverApi, driver_api, driver_load
from cyctx import _errors, _inputs
from cyctx._errors import ContextResetWarning, CyctxError, driver_error


# The native state this module owns (docs/design.md, "One owner of native state").
cdef extern from "_cpp/registry.h" namespace "cyctx" nogil:
    unsigned long long new_token() noexcept
    int live_add(unsigned long long token) noexcept
    void live_remove(unsigned long long token) noexcept

cdef extern from "cyctx/switch.h" nogil:
    const unsigned long long CYCTX_PREV_UNKNOWN

cdef extern from "_cpp/thread_entries.h" namespace "cyctx" nogil:
    int tls_push(unsigned long long token, const void* block, const Switch* sw) noexcept
    int tls_pop_own(unsigned long long token, Switch* out, size_t* dropped) noexcept
    size_t tls_depth() noexcept
    size_t tls_count(unsigned long long token) noexcept
    size_t tls_drop_dead_top(unsigned long long keep) noexcept
    int tls_splice(unsigned long long token, const void* block) noexcept
    unsigned long long tls_top_token() noexcept

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


# The key of the Python block being entered or left (the block of _cpp/thread_entries.h's Entry):
# the running generator or coroutine, else the frame running the `with`, past the frames that
# only forward the protocol (subclasses, wrappers, contextlib). See _cpp/blocks.h.
cdef extern from "_cpp/blocks.h" namespace "cyctx":
    int block_names_init(object contextlib_file) except -1
    const void* block_key() noexcept
    # Needs the GIL, which its one caller holds (_exit_block for a Python exit, from __exit__);
    # declared nogil for that caller, which the nogil exit() shares.
    int tls_pop_python(unsigned long long token, Switch* out, size_t* dropped, const void** key) noexcept nogil

# A guard collected with no Python frame running is being freed as its thread exits
# (threading.local's teardown): no Python code (the ResourceWarning) may run there.
cdef extern from "Python.h":
    const void* PyEval_GetFrame()

import contextlib as _contextlib
block_names_init(_contextlib.ExitStack.enter_context.__code__.co_filename)

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


cdef extern from "_cpp/fork.h" namespace "cyctx" nogil:
    int forked_after_cuda() noexcept
    int fork_child() noexcept
    void mark_cuda_initialised() noexcept
    int install_fork_handler()

if install_fork_handler() != 0:
    raise ImportError("cyctx: pthread_atfork failed; fork safety cannot be guaranteed")


include "_driver_and_errors.pxi"
include "_switch.pxi"


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
# Every guard alive in this process, for diagnostics (cyctx's doctor compares the ids the
# guards last saw with the driver's). Touched at construction only, never on enter/exit.
# Read by live_guards, never iterated: see there.
cdef object _all_guards = weakref.WeakSet()


cdef class ContextGuard:
    """Retain a device's primary context and make it current around work.

    Construct it once and keep it: construction retains the primary context (which
    activates it), :meth:`close` releases it. Each ``with guard:`` makes the context current
    on the calling thread and, on leaving, restores exactly what was current before (no
    context included), also when the block raised or called ``cudaSetDevice``. When the
    context is already current, entering and leaving make no driver switch.

    Creating a guard per ``with`` block is a trap: when nothing else holds the primary
    context, each release destroys it and frees everything allocated in the block. Keep the
    guard for the life of the work, or use :func:`cyctx.device` (``with cyctx.device(0):``,
    the shared guard). A guard released by the garbage collector instead of :meth:`close`
    warns ``ResourceWarning``, saying whether the release destroyed the primary context.

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
    DriverError
        The driver failed (no GPU, forked child, ...).

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
        device = _device_argument(type(self), args, kwargs)
        self._ctx = NULL
        self._shared = False
        self._owns_retain = False
        self._resets = 0
        self._extra_retains = 0
        self._gate = 0
        self._token = new_token()
        target = _inputs.recognise(device)
        count = _device_count()
        if target.kind == _inputs.Kind.ORDINAL:
            _init_primary(self, target.value, count)
        else:
            _init_context(self, _context_of(target.kind, target.value), count)
        if live_add(self._token) != 0:
            raise MemoryError("cyctx: no memory to register the guard")  # __dealloc__ releases
        _all_guards.add(self)

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
        cdef int n = (1 if self._owns_retain else 0) + int_load(&self._extra_retains)
        if self._token:
            live_remove(self._token)
        if ctx_load(&self._ctx) != NULL and not forked_after_cuda():
            _release(self._dev, n)
            if n and not self._shared and not cyctx_is_finalizing() and PyEval_GetFrame() != NULL:
                # Like an unclosed file: the retain was dropped by the collector, not by code.
                # Under -W error the warning is raised here and, as from any finalizer,
                # reported through sys.unraisablehook (the retain is released all the same).
                # Only with Python code running on this thread: not at interpreter shutdown,
                # nor when a thread's state is cleared as it exits (no frame), where no Python
                # call may be made.
                _warn_collected(self._ordinal, _primary_destroyed(self._dev))
        ctx_store(&self._ctx, NULL)

    @staticmethod
    def shared(device):
        """The process-wide guard of ``device``: created on first use, never closed.

        This is the easy way to hold the long-lived retain: every caller gets the same
        guard, so the primary context stays alive between blocks. Thread-safe.
        :func:`cyctx.device` returns the same guard. ``device`` is anything ContextGuard takes
        that names a device (an ordinal, a ``cuda.core`` ``Device``, ``cupy.cuda.Device``,
        ``torch.device``, a ``CUdevice``); a context or a stream is a ``TypeError``, since the
        shared guard of a device is its primary context. Pickles as the shared guard of the
        same device in the receiving process.
        """
        ordinal = _inputs.shared_ordinal(device)
        guard = _shared_guards.get(ordinal)
        if guard is not None:
            return guard
        # No lock (see _shared_guards). A racing first use, a finalizer or signal handler that
        # calls shared() from inside this construction, builds its own; one is published.
        cdef ContextGuard mine = ContextGuard(ordinal)
        mine._shared = True  # before publication: nobody may ever see it closable
        guard = _shared_guards.setdefault(ordinal, mine)
        if guard is mine and ordinal < _FAST_ORDINALS:
            _shared_fast[<Py_ssize_t>ordinal] = <PyObject*>mine
        if guard is not mine:
            mine._shared = False  # never published: release its retain now
            try:
                mine.close()
            except CyctxError:
                pass  # the release failed: the guard stays open and __dealloc__ releases it
        return guard

    cdef int enter(self) except -1 nogil:
        return _enter_block(self, NULL)

    cdef int exit(self) except -1 nogil:
        return _exit_block(self, EXIT_NOGIL)

    def __enter__(self):
        _called_on_a_guard(self, "__enter__")
        return _with_enter(self)

    def __exit__(self, exc_type, exc, tb):
        _called_on_a_guard(self, "__exit__")
        return _with_exit(self, exc_type, exc, tb)

    def close(self):
        """Release the retain taken at construction. Idempotent.

        Raises
        ------
        GuardError
            The guard is entered on this thread, or it is a :meth:`shared` guard, or another
            thread is closing it or re-activating it after a reset right now (nothing done).
        DriverError
            The release failed; the guard stays open (the retain is still held) so a later
            ``close()`` or garbage collection can release it.
        """
        _called_on_a_guard(self, "close")
        if ctx_load(&self._ctx) == NULL:
            return
        if self._shared:
            raise _errors.close_refused(repr(self), "shared")
        if tls_count(self._token):
            raise _errors.close_refused(repr(self), "inside")
        # Claim the guard against a reset re-activation on another thread (which would
        # otherwise re-open it after this close and, later, release a retain that is not its
        # own) and against a second close() (a double release). Never waits.
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
        """True once :meth:`close` released the retain."""
        return ctx_load(&self._ctx) == NULL

    @property
    def is_shared(self):
        """True for the process-wide guards of :meth:`shared`."""
        return self._shared

    @property
    def handle(self):
        """The primary context's ``CUcontext`` as an int address. GuardError when closed."""
        cdef cydriver.CUcontext ctx = ctx_load(&self._ctx)
        if ctx == NULL:
            _raise_closed(self)
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
    def resets(self):
        """How many resets of the primary context enter() detected and re-activated."""
        return int_load(&self._resets)

    def __repr__(self):
        cdef cydriver.CUcontext ctx = ctx_load(&self._ctx)
        state = "closed" if ctx == NULL else f"ctx=0x{<size_t>ctx:x} id={u64_load(&self._ctx_id)}"
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


cdef inline int _called_on_a_guard(object obj, str method) except -1:
    # A method called through the class (`ContextGuard.close(x)`, `map(ContextGuard.close,
    # guards)`) gets whatever it is given as self, and a Cython method does not check it: any
    # other object would be read as a guard's fields.
    if not isinstance(obj, ContextGuard):
        raise TypeError(f"ContextGuard.{method}() needs a ContextGuard, got {_inputs.shown(obj)}")
    return 0


# `with guard:` itself (what __enter__/__exit__ run). Module-level C functions so that the
# bound methods a `with` makes for an exact ContextGuard call them directly (_cpp/methods.h):
# the same code runs whichever way the method is reached.
cdef object _with_enter(object obj):
    cdef ContextGuard self = <ContextGuard>obj
    cdef const void* block = block_key()
    if not CYCTX_FREE_THREADED:
        _enter_block(self, block)
        return self
    if gate_enter(&self._gate) != 0:
        _raise_closed(self)  # a close() is in flight: it wins
    try:
        _enter_block(self, block)
    finally:
        gate_leave(&self._gate)
    return self


cdef object _with_exit(object obj, object exc_type, object exc, object tb):
    cdef ContextGuard self = <ContextGuard>obj
    # Python calls this once per block: an out-of-order exit removes its entry rather than
    # leave it for ever (_exit_misuse).
    if exc is None:
        _exit_block(self, EXIT_PYTHON)
        return False
    if isinstance(exc, GeneratorExit) or _swallowed(type(exc)):
        # A generator or coroutine closed with the block open: from close(), or from its
        # finalizer when it was abandoned; or a greenlet killed (GreenletExit, also when it
        # is collected). A note on that exception would be lost (the generator machinery and
        # greenlet swallow it), so a failure here is raised instead: close() or throw()
        # raises it, a finalizer reports it through sys.unraisablehook.
        _exit_block(self, EXIT_GENERATOR)
        return False
    # The block's exception wins; a cleanup failure rides along as a note.
    try:
        _exit_block(self, EXIT_PYTHON)
    except BaseException as cleanup:
        _errors.note_cleanup_failure(exc, _inputs.shown(self, 200), cleanup)
        if not isinstance(exc, Exception):
            # Cancellation, KeyboardInterrupt, SystemExit: what carries the note is often
            # never shown (a cancelled task, a framework's cancel scope, a quiet exit), so
            # the failure is reported through sys.unraisablehook as well.
            _errors.report_unraisable(cleanup, _inputs.shown(self, 200))
    return False


cdef extern from "_cpp/methods.h" namespace "cyctx":
    int install_quick_with(object cls, void* enter, void* exit) except -1

install_quick_with(ContextGuard, <void*>_with_enter, <void*>_with_exit)


cdef inline int _enter_block(ContextGuard self, const void* block) except -1 nogil:
    # enter() for a block: the nogil enter() is block NULL, Python's `with` its frame. The fast
    # path (the context is already current) is written out here rather than through switch_to:
    # two cheap thread-local driver calls and one thread-local entry, nothing else
    # (docs/design.md, "Costs").
    cdef cydriver.CUcontext cur = NULL
    cdef unsigned long long ctx_id = 0
    cdef cydriver.CUresult err
    cdef Switch s
    cdef const DriverApi* d = driver_api()  # loaded: this guard's construction did it
    cdef cydriver.CUcontext ctx = ctx_load(&self._ctx)  # an acquire load: free on x86
    if forked_after_cuda():
        return _raise_fork()
    if ctx == NULL:
        return _raise_closed(self)
    # A reset keeps the handle and changes the id (docs/evidence.md, "Reset keeps the handle and
    # changes the id"), so the pointer alone proves nothing: one cuCtxGetId, ~9-11 ns, on
    # every enter.
    err = d.CtxGetId(ctx, &ctx_id)
    if err != cydriver.CUresult.CUDA_SUCCESS or ctx_id != u64_load(&self._ctx_id):
        _after_reset(self, err, ctx_id)
        ctx = ctx_load(&self._ctx)
        ctx_id = u64_load(&self._ctx_id)
    err = d.CtxGetCurrent(&cur)
    if err != cydriver.CUresult.CUDA_SUCCESS:
        return raise_driver_error(err, "cuCtxGetCurrent")
    if cur == ctx:
        s.prev = ctx
        s.prev_id = ctx_id
        s.switched = False
        if tls_push(self._token, block, &s) != 0:
            return _raise_no_memory()
        return 0
    _switch_from(&s, ctx, cur, d)
    if tls_push(self._token, block, &s) != 0:
        switch_back(&s)
        return _raise_no_memory()
    return 0


# Who leaves a block (_exit_block's `how`); it matters only when the block's entry is not the
# innermost (_exit_misuse).
cdef enum:
    EXIT_NOGIL = 0       # the nogil exit(): its caller can call it again
    EXIT_PYTHON = 1      # Python's __exit__: called once per block
    EXIT_GENERATOR = 2   # Python's __exit__ for a GeneratorExit: a generator or coroutine closed


cdef inline int _exit_block(ContextGuard self, int how) except -1 nogil:
    # exit() for a block (see _enter_block): the nogil exit() has no block, a Python exit
    # finds its own (_cpp/blocks.h, with the GIL). The entry ends here even if the restore below
    # fails: a failed restore leaves the driver's stack as it was, and keeping the entry would
    # make every later exit on this thread look out of order.
    cdef Switch s
    cdef size_t dropped = 0
    cdef const void* block = NULL
    cdef int r
    if how == EXIT_NOGIL:
        r = tls_pop_own(self._token, &s, &dropped)
    else:
        r = tls_pop_python(self._token, &s, &dropped, &block)
    if r != 0:
        return _exit_misuse(self, block, how, dropped)
    if forked_after_cuda():
        return 0  # a block left in a forked child: the driver is gone, nothing to restore
    # The fast path (nothing switched): one cuCtxGetCurrent, and a switch back only if the
    # block left another context current (cudaSetDevice inside the block).
    _restore(driver_api(), &s)  # loaded: the matching enter ran
    if dropped:
        return _warn_dropped(self, dropped)  # after the restore: the exit itself is done
    return 0


cdef int _init_primary(ContextGuard self, ordinal, count) except -1:
    # Construction from an ordinal (module-level, not a method: not callable on a live guard).
    cdef cydriver.CUcontext ctx = NULL
    cdef cydriver.CUdevice dev = 0
    cdef unsigned long long ctx_id = 0
    cdef cydriver.CUresult err, rerr
    if ordinal >= count:
        raise _errors.no_such_device(_inputs.int_text(ordinal), count)
    cdef int extra = 0
    cdef int tries = 0
    cdef const char* failed = "cuCtxGetId"  # the call whose result `err` holds
    cdef const DriverApi* d = driver_api()  # loaded by _device_count
    check(d.DeviceGet(&dev, <int>ordinal), "cuDeviceGet")
    with nogil:
        # Activating a primary context creates it on the GPU: can take milliseconds.
        check(d.PrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain")
        err = d.CtxGetId(ctx, &ctx_id)
        # A reset on another thread between the retain and the id read leaves the context
        # inactive with our retain counted: re-activate it as enter() does after a reset (a
        # retain+release pair), a bounded number of times, since resets may keep coming.
        while err == cydriver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED and tries < _MAX_REACTIVATIONS:
            tries += 1
            err = d.PrimaryCtxRetain(&ctx, dev)
            if err != cydriver.CUresult.CUDA_SUCCESS:
                failed = "cuDevicePrimaryCtxRetain"
                break
            if d.PrimaryCtxRelease(dev) != cydriver.CUresult.CUDA_SUCCESS:
                extra += 1  # still balanced: released with the guard's own retain
            err = d.CtxGetId(ctx, &ctx_id)
    if err != cydriver.CUresult.CUDA_SUCCESS:
        # Construction failed: no retain may be kept. If even the release fails, say so
        # rather than claim nothing was left behind.
        while extra and d.PrimaryCtxRelease(dev) == cydriver.CUresult.CUDA_SUCCESS:
            extra -= 1
        rerr = d.PrimaryCtxRelease(dev)
        if rerr != cydriver.CUresult.CUDA_SUCCESS or extra:
            raise _errors.construction_kept_retains(<int>err, failed.decode(), <int>rerr, ordinal,
                                                    (1 if rerr else 0) + extra)
        if err == cydriver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED:
            raise _errors.reset_during_construction(ordinal, tries)
        check(err, failed)
    self._extra_retains = extra
    self._dev = dev
    self._ordinal = ordinal
    self._ctx_id = ctx_id
    self._owns_retain = True
    self._ctx = ctx
    return 0


cdef int _init_context(ContextGuard self, size_t handle, count) except -1:
    # An existing context. A primary context gets a retain of its own, like an ordinal;
    # any other (cuCtxCreate, green) stays the caller's: no retain, checked for life here
    # and on every enter.
    cdef cydriver.CUcontext ctx = <cydriver.CUcontext>handle
    cdef cydriver.CUcontext pc = NULL
    cdef cydriver.CUcontext tmp = NULL
    cdef cydriver.CUdevice dev = 0
    cdef unsigned long long ctx_id = 0
    cdef unsigned int flags = 0
    cdef int active = 0
    cdef cydriver.CUresult err
    cdef const DriverApi* d = driver_api()  # loaded by _device_count
    if ctx == NULL:
        raise ValueError("ContextGuard: the context handle is NULL")
    check(d.CtxGetId(ctx, &ctx_id), "cuCtxGetId")  # 201/709: not a live context
    # Its device: push it briefly (cuCtxGetDevice_v2, which takes a context, is CUDA 13 only).
    check(d.CtxGetCurrent(&tmp), "cuCtxGetCurrent")
    if tmp == ctx:
        check(d.CtxGetDevice(&dev), "cuCtxGetDevice")  # already current: nothing to push
    else:
        check(d.CtxPushCurrent(ctx), "cuCtxPushCurrent")
        err = d.CtxGetDevice(&dev)
        _probe_pop(d, ctx)  # the stack as it was, or an error that says it is not
        check(err, "cuCtxGetDevice")
    # Only an active primary can be this live context; retaining an inactive one would
    # create a context nobody asked for.
    check(d.PrimaryCtxGetState(dev, &flags, &active), "cuDevicePrimaryCtxGetState")
    if active:
        check(d.PrimaryCtxRetain(&pc, dev), "cuDevicePrimaryCtxRetain")
        if pc == ctx:
            self._owns_retain = True
        elif d.PrimaryCtxRelease(dev) != cydriver.CUresult.CUDA_SUCCESS:
            # The comparison's retain could not be given back now: the guard keeps it and
            # close() (or deallocation) releases it, as for a re-activation (never leaked).
            self._extra_retains = 1
    self._dev = dev
    self._ordinal = <int>dev
    self._ctx_id = ctx_id
    self._ctx = ctx
    return 0


cdef int _after_reset(ContextGuard g, cydriver.CUresult err, unsigned long long ctx_id) except -1 nogil:
    # The primary context was reset since this guard last saw it. Our retain survived the
    # reset (docs/evidence.md, "A reset keeps the retain count"), so a retain+release pair
    # re-activates it
    # and leaves the refcount as it was. GIL: only to warn.
    cdef cydriver.CUcontext ctx = NULL
    if err != cydriver.CUresult.CUDA_SUCCESS and err != cydriver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED:
        return check(err, "cuCtxGetId")
    if ctx_load(&g._ctx) == NULL:
        # Closed by another thread since this enter read the handle (close() while the guard
        # is in use is the caller's bug): say closed, not reset.
        return _raise_closed(g)
    if not g._owns_retain:
        # The caller's context (cuCtxCreate, green) was destroyed: nothing to re-activate.
        return _raise_destroyed(g)
    # Warn first: it runs Python code (filters, showwarning, other threads), and may raise;
    # nothing has changed yet. Only then announce the re-activation on the gate, which close()
    # respects: a close() that ran meanwhile wins, and this enter reports the guard closed
    # instead of re-opening it: a re-opened guard would hold no retain of its own and release
    # another guard's at its next close. The gate is held across driver calls only, never
    # across Python code.
    _warn_reset(g, err == cydriver.CUresult.CUDA_SUCCESS)
    if gate_enter(&g._gate) != 0:
        return _raise_closed(g)  # a close() is in flight: it wins
    if ctx_load(&g._ctx) == NULL:
        gate_leave(&g._gate)
        return _raise_closed(g)  # closed while the warning ran
    cdef const DriverApi* d = driver_api()  # loaded: the guard was constructed
    try:
        # Look again: Python code ran in the warning (another thread, or a hook, may have
        # re-activated or reset the context since), so act on what the driver says now.
        err = d.CtxGetId(ctx_load(&g._ctx), &ctx_id)
        if err != cydriver.CUresult.CUDA_SUCCESS and err != cydriver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED:
            check(err, "cuCtxGetId")
        if err != cydriver.CUresult.CUDA_SUCCESS:
            check(d.PrimaryCtxRetain(&ctx, g._dev), "cuDevicePrimaryCtxRetain")
            if d.PrimaryCtxRelease(g._dev) != cydriver.CUresult.CUDA_SUCCESS:
                # Still balanced overall: close() releases it with the guard's own retain.
                int_add(&g._extra_retains, 1)
            ctx_store(&g._ctx, ctx)  # the driver reuses the handle; take whatever it says
            check(d.CtxGetId(ctx, &ctx_id), "cuCtxGetId")
        u64_store(&g._ctx_id, ctx_id)
        int_add(&g._resets, 1)
    finally:
        gate_leave(&g._gate)
    return 0


cdef size_t _context_of(kind, size_t handle) except? 0:
    # The context a recognised handle names: the handle itself, or a stream's or green
    # context's own (cuStreamGetCtx, cuCtxFromGreenCtx; absent from some drivers).
    cdef cydriver.CUcontext ctx = NULL
    cdef const DriverApi* d = _api()
    if kind == _inputs.Kind.CONTEXT:
        return handle
    if kind == _inputs.Kind.STREAM:
        if d.StreamGetCtx == NULL:
            check(cydriver.CUresult.CUDA_ERROR_NOT_FOUND, "cuStreamGetCtx (not provided by this driver)")
        check(d.StreamGetCtx(<cydriver.CUstream>handle, &ctx), "cuStreamGetCtx")
    else:
        if d.CtxFromGreenCtx == NULL:
            check(cydriver.CUresult.CUDA_ERROR_NOT_FOUND, "cuCtxFromGreenCtx (not provided by this driver)")
        check(d.CtxFromGreenCtx(&ctx, <cydriver.CUgreenCtx>handle), "cuCtxFromGreenCtx")
    return <size_t>ctx


cdef void _release(cydriver.CUdevice dev, int n) noexcept nogil:
    # Release path of __dealloc__: errors cannot be reported there, and must not be raised.
    cdef int _i
    cdef const DriverApi* d = driver_api()  # loaded: a guard was constructed
    for _i in range(n):
        d.PrimaryCtxRelease(dev)


cdef int _warn_reset(ContextGuard g, bint reactivated_elsewhere) except -1 with gil:
    warnings.warn(_errors.reset_text(g._ordinal, repr(g), reactivated_elsewhere),
                  ContextResetWarning, stacklevel=2)
    return 0


cdef int _raise_destroyed(ContextGuard g) except -1 with gil:
    raise _errors.destroyed_by_owner(repr(g))


cdef int _raise_closed(ContextGuard g) except -1 with gil:
    raise _errors.closed(repr(g))


cdef int _raise_no_memory() except -1 with gil:
    raise MemoryError("cyctx: no memory to record a guard entry")


cdef int _exit_misuse(ContextGuard g, const void* block, int how, size_t dropped) except -1 with gil:
    # The exit's entry is not the innermost on this thread (after the drop of dead entries above
    # it), or the guard has none here. The nogil exit() is refused and changes nothing: its
    # caller can leave the inner blocks and call it again. Python never calls a block's __exit__
    # again, so an entry kept there would stay for ever: close() refused on this thread, and the
    # inner block, when left, making this block's context current again. So a Python exit
    # splices its entry out from under the open block, which then restores what was current
    # before this one; the current context is not touched. Either way: GuardError.
    cdef unsigned long long top = tls_top_token()  # a splice never removes the innermost
    cdef bint removed = how != EXIT_NOGIL and tls_splice(g._token, block) == 0
    raise _errors.exit_misuse(repr(g), removed or tls_count(g._token) != 0, top == g._token, top,
                              dropped, removed, how == EXIT_GENERATOR)


cdef int _warn_dropped(ContextGuard g, size_t dropped) except -1 with gil:
    # Not an error: the exit itself completed. A guard freed while entered is a leak in the
    # caller's code, so it is reported as one (ResourceWarning is shown under -W default,
    # pytest and python -X dev).
    warnings.warn(_errors.dropped_text(repr(g), dropped), ResourceWarning, stacklevel=2)
    return 0


cdef bint _swallowed(type t):
    # An exception that a framework catches and drops, so a note on it is never seen:
    # greenlet's GreenletExit (or a subclass), known by its type's module and name, never by
    # importing greenlet. Only looked at while an exception propagates out of a block.
    for k in t.__mro__:
        if getattr(k, "__name__", None) == "GreenletExit" and getattr(k, "__module__", None) == "greenlet":
            return True
    return False


cdef int _probe_pop(const DriverApi* d, cydriver.CUcontext ctx) except -1 nogil:
    # Undo the device probe's push (`ctx` was not current before it, so after a pop that
    # happened something else is current). If the pop fails, look: a pop that did not happen is
    # retried once, so the stack is as it was; only if that fails too does the error say the
    # context is still pushed (never claim a restore that did not happen).
    cdef cydriver.CUcontext tmp = NULL
    cdef cydriver.CUresult perr = d.CtxPopCurrent(&tmp)
    if perr == cydriver.CUresult.CUDA_SUCCESS:
        return 0
    if d.CtxGetCurrent(&tmp) == cydriver.CUresult.CUDA_SUCCESS and tmp != ctx:
        return check(perr, "cuCtxPopCurrent")  # it was popped all the same
    if d.CtxPopCurrent(&tmp) == cydriver.CUresult.CUDA_SUCCESS:
        return check(perr, "cuCtxPopCurrent")  # restored by the retry; still report the failure
    return _raise_probe_stuck(perr, <size_t>ctx)


cdef int _raise_probe_stuck(cydriver.CUresult perr, size_t ctx) except -1 with gil:
    raise _errors.probe_stuck(<int>perr, ctx)


@cython.binding(False)  # a builtin function: the interpreter's quickest call (METH_O)
@cython.always_allow_keywords(False)
def device(device):
    """The process's shared guard of ``device``: ``with cyctx.device(0):``, ``@cyctx.device(0)``.

    The same object as :meth:`ContextGuard.shared` (created on first use, never closed), so the
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
            g = _shared_fast[k]
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


def _device_argument(cls, args, kwargs):
    # ContextGuard(device): the one argument, with the messages Python gives a def function
    # (Cython's would name __cinit__). A subclass's own __init__ may take more: the device is
    # its first argument or `device=`, and the rest is its __init__'s to check.
    name = cls.__name__
    if args:
        if "device" in kwargs:
            raise TypeError(f"{name}() got multiple values for argument 'device'")
        if cls is ContextGuard and (len(args) > 1 or kwargs):
            if kwargs:
                raise TypeError(f"{name}() got an unexpected keyword argument {next(iter(kwargs))!r}")
            raise TypeError(f"{name}() takes 1 argument (device) but {len(args)} were given")
        return args[0]
    if "device" not in kwargs:
        raise TypeError(
            f"{name}() missing 1 required argument: 'device' (an ordinal such as 0, or a "
            f"device, context or stream object); for the process's shared guard of a device "
            f"use cyctx.device(k)"
        )
    if cls is ContextGuard and len(kwargs) > 1:
        extra = next(k for k in kwargs if k != "device")
        raise TypeError(f"{name}() got an unexpected keyword argument {extra!r}")
    return kwargs["device"]


def _cannot_travel(ContextGuard g, what):
    if g._owns_retain:
        holds = "holds this process's retain of device %d's primary context" % g._ordinal
        instead = (f"cyctx.device({g._ordinal}) (the shared guard of device {g._ordinal}, "
                   f"which {what}s as the shared guard of that device"
                   + (" in the receiving process)" if what == "pickle" else ")"))
    else:
        holds = "refers to a context this process owns"
        instead = f"cyctx.device({g._ordinal}) for its device's primary context"
    if what == "pickle":
        return (f"cannot pickle {_inputs.shown(g, 200)}: a ContextGuard {holds}, which means "
                f"nothing in another process. Send the device ordinal and make the guard "
                f"there, or send {instead}")
    return (f"cannot copy {_inputs.shown(g, 200)}: a ContextGuard {holds}, which a copy "
            f"would either share (and lose to the other's close()) or take again. Pass the "
            f"guard itself, make another with ContextGuard({g._ordinal}), or use {instead}")


def _decorated(ContextGuard guard, func):
    # The decorator of ContextGuard.__call__: `with guard:` around each call.
    if not callable(func):
        raise TypeError(
            f"{_inputs.shown(guard, 200)} decorates a function; got {type(func).__name__} "
            f"{_inputs.shown(func)}. To make the context current, write `with guard:`"
        )
    import functools
    import inspect  # decoration time only: import cyctx does not pay for it

    kind = None
    if inspect.iscoroutinefunction(func):
        kind = "an async def function"
    elif inspect.isasyncgenfunction(func):
        kind = "an async generator function"
    elif inspect.isgeneratorfunction(func):
        kind = "a generator function"
    if kind is not None:
        raise TypeError(
            f"cannot decorate {kind} ({_inputs.shown(func)}) with a guard: calling it only "
            f"creates the coroutine or generator, and its body runs later, in steps, on "
            f"whatever thread resumes it, interleaved with other work; a guard around the call "
            f"would not be around the body. Write `with guard:` inside it, around the driver "
            f"calls between its awaits or yields"
        )

    @functools.wraps(func)
    def guarded(*args, **kwargs):
        with guard:
            return func(*args, **kwargs)

    return guarded


cdef bint _primary_destroyed(cydriver.CUdevice dev) noexcept nogil:
    # After a release: is the primary context inactive now (the release was its last)?
    cdef unsigned int flags = 0
    cdef int active = 1
    cdef const DriverApi* d = driver_api()  # loaded: a guard was constructed
    if d.PrimaryCtxGetState(dev, &flags, &active) != cydriver.CUresult.CUDA_SUCCESS:
        return False
    return active == 0


cdef int _warn_collected(int ordinal, bint destroyed) except -1:
    # From __dealloc__ (the interpreter is not finalizing): no reference to the dying guard.
    if destroyed:
        what = (f"which destroyed device {ordinal}'s primary context (nothing else held it) "
                f"and freed everything made in it")
    else:
        what = f"not closed; device {ordinal}'s primary context stays (something else holds it)"
    warnings.warn(
        f"cyctx: a ContextGuard of device {ordinal} was released by garbage collection, {what}. "
        f"Use the shared guard, `with cyctx.device({ordinal}):`, or keep the guard and close() it",
        ResourceWarning, stacklevel=1)
    return 0


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
    # Not list(_all_guards): a WeakSet's iterator is Python code that runs between items, so a
    # guard created on another thread meanwhile raised "Set changed size during iteration".
    # Its set of weak references is copied in one C call instead (atomic with the GIL; under
    # the set's own lock without it), and resolved afterwards.
    out = []
    for r in _all_guards.data.copy():
        g = r()
        if g is not None:
            out.append(g)
    return out


def open_entries():
    """Number of open guard entries on the calling thread (for tests and diagnostics)."""
    return tls_depth()


def fork_state():
    """(forked_after_cuda, fork_child) from the C flags of _cpp/fork.h, for the doctor: one fork
    state per process, the one the guard acts on (set by its pthread_atfork child handler)."""
    return bool(forked_after_cuda()), bool(fork_child())
