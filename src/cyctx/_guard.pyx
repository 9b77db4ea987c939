"""ContextGuard: retain a device's primary context, make it current around work, restore.

The restore rule (DESIGN §3.1-3.3): leaving makes current exactly what was current before
the enter, with ``cuCtxSetCurrent`` -- which replaces the top of the thread's context
stack -- rather than push/pop. So a block that called ``cudaSetDevice`` or
``cuCtxSetCurrent`` (which also replace the top) is repaired, and the guard never pops a
context it did not push: the stack's depth is the same before and after, except that from
an empty stack it is emptied again.
"""

import operator
import os
import sys
import threading
import warnings
import weakref

from cuda.bindings cimport cydriver

from cyctx._driver cimport DriverApi, driver_api, driver_load, driver_load_problem
from cyctx._errors cimport check, raise_load_error
from cyctx._errors import ContextResetWarning, ForkError, GuardError, InvalidDeviceError, driver_error


cdef extern from "_tls.h" namespace "cyctx" nogil:
    cdef struct Entry:
        const void* owner
        cydriver.CUcontext prev
        int switched
    int tls_push(const void* owner, cydriver.CUcontext prev, int switched) noexcept
    Entry* tls_top() noexcept
    int tls_pop_matching(const void* owner, Entry* out) noexcept
    size_t tls_depth() noexcept
    size_t tls_count(const void* owner) noexcept


cdef extern from "_fork.h" namespace "cyctx" nogil:
    int g_cuda_initialised
    int g_forked_after_cuda
    int g_fork_child
    int install_fork_handler()

if install_fork_handler() != 0:
    raise ImportError("cyctx: pthread_atfork failed; fork safety cannot be guaranteed")


# --- the driver -------------------------------------------------------------------------
# Every driver function is called through the table of _driver.h, resolved once per process
# at fixed ABI versions (not through cydriver's functions, so this build loads beside any
# cuda-bindings major; _driver.h says why). A guard's construction loads it, so enter/exit
# of a constructed guard find it loaded; the raw layer may run first and loads it itself.

cdef inline const DriverApi* _api() except NULL nogil:
    cdef const DriverApi* api = driver_api()
    if api != NULL:
        return api
    return _load_api()


cdef const DriverApi* _load_api() except NULL nogil:
    cdef const DriverApi* api = NULL
    cdef cydriver.CUresult err = driver_load(&api)
    if err != cydriver.CUresult.CUDA_SUCCESS:
        raise_load_error(err, driver_load_problem())
        return NULL
    return api


# A thread left this many contexts pushed inside a guard from an empty stack: more than
# this and the driver is not behaving like a stack at all; stop rather than loop forever.
cdef enum:
    _MAX_UNWIND = 4096


# --- the raw layer ---------------------------------------------------------------------

cdef int switch_to(Switch* s, cydriver.CUcontext target) except -1 nogil:
    cdef cydriver.CUcontext cur = NULL
    if target == NULL:
        return _raise_value("switch_to: target context is NULL")
    cdef const DriverApi* d = _api()
    # cuCtxGetCurrent is thread-local and ~12 ns; the switch is only paid when needed
    # (DESIGN §3.2, §4).
    check(d.CtxGetCurrent(&cur), "cuCtxGetCurrent")
    if cur != target:
        check(d.CtxSetCurrent(target), "cuCtxSetCurrent")
    s.prev = cur
    s.switched = cur != target
    return 0


cdef int switch_back(const Switch* s) except -1 nogil:
    cdef cydriver.CUcontext cur = NULL
    cdef const DriverApi* d = _api()
    if s.switched:
        # Unconditional: cheaper than reading first, and it also undoes a replacement of
        # the top made inside the block.
        check(d.CtxSetCurrent(s.prev), "cuCtxSetCurrent")
        if s.prev == NULL:
            # From an empty stack, SetCurrent(NULL) popped one entry. Anything still current
            # was pushed inside the block and never popped.
            check(d.CtxGetCurrent(&cur), "cuCtxGetCurrent")
            if cur != NULL:
                return _unwind_leaked_pushes(d)
        return 0
    check(d.CtxGetCurrent(&cur), "cuCtxGetCurrent")
    if cur != s.prev:
        check(d.CtxSetCurrent(s.prev), "cuCtxSetCurrent")
    return 0


cdef int _unwind_leaked_pushes(const DriverApi* d) except -1 nogil:
    # The thread entered with no context; restore that exactly, and say so loudly: silently
    # popping another library's contexts would hide its bug (DESIGN §3.3).
    cdef cydriver.CUcontext cur = NULL
    cdef int n = 0
    while n < _MAX_UNWIND:
        check(d.CtxGetCurrent(&cur), "cuCtxGetCurrent")
        if cur == NULL:
            break
        check(d.CtxSetCurrent(NULL), "cuCtxSetCurrent")
        n += 1
    return _raise_leaked(n)


cdef int _raise_leaked(int n) except -1 with gil:
    raise GuardError(
        f"code inside the guard pushed {n} context(s) with cuCtxPushCurrent and did not pop "
        f"them; the thread had no current context before the guard, so they were popped to "
        f"restore that. Balance every push with a pop inside the block."
    )


cdef int _raise_value(str msg) except -1 with gil:
    raise ValueError(msg)


# --- argument checks ------------------------------------------------------------------

def _ordinal_of(device):
    """The device ordinal as a Python int, or TypeError/ValueError. No driver call."""
    if isinstance(device, bool) or not hasattr(type(device), "__index__"):
        raise TypeError(
            f"device must be an int ordinal (0, 1, ...), got {type(device).__name__} {device!r}"
        )
    ordinal = operator.index(device)
    if ordinal < 0:
        raise ValueError(f"device ordinal must be >= 0, got {ordinal}")
    return ordinal


cdef int _device_count() except -1:
    global g_cuda_initialised
    cdef int n = 0
    cdef cydriver.CUresult err
    cdef const DriverApi* d = NULL
    if g_forked_after_cuda:
        _raise_fork()
    with nogil:
        # Loading the driver and cuInit can take long the first time: not under the GIL.
        d = _api()
        err = d.Init(0)
    if err == cydriver.CUresult.CUDA_ERROR_NOT_INITIALIZED and g_fork_child:
        _raise_fork()  # CUDA was initialised in an ancestor by someone else (torch, CuPy...)
    check(err, "cuInit")
    g_cuda_initialised = 1
    check(d.DeviceGetCount(&n), "cuDeviceGetCount")
    return n


cdef int _raise_fork() except -1 with gil:
    raise ForkError(
        f"CUDA was initialised in a parent of this forked process (pid {os.getpid()}); a "
        f"forked child cannot use CUDA: every driver call fails with "
        f"CUDA_ERROR_NOT_INITIALIZED. Start worker processes with the 'spawn' start method: "
        f"multiprocessing.get_context('spawn') or multiprocessing.set_start_method('spawn')."
    )


# --- what a guard can be made from ---------------------------------------------------------
# Users arrive holding a framework's device or stream, a raw handle, or an ordinal. Objects are
# recognised by their type's module and name, so no framework is imported unless the caller
# passed one of its objects (then it is already imported).

_DEFAULT_STREAMS = (0, 1, 2)  # legacy, per-thread (CU_STREAM_LEGACY/PER_THREAD): no own context


def _target_of(obj):
    """('ordinal', k) or ('context', handle) or ('stream', handle, fallback ordinal or None)
    or ('green', handle) for anything ContextGuard accepts; TypeError/ValueError otherwise."""
    t = type(obj)
    mod = t.__module__ or ""
    name = t.__name__
    if mod.startswith("cuda.bindings"):
        if name == "CUcontext":
            return ("context", int(obj))
        if name == "CUstream":
            return ("stream", int(obj), None)
        if name == "CUgreenCtx":
            return ("green", int(obj))
        if name == "CUdevice":
            return ("ordinal", _ordinal_of(int(obj)))  # a CUdevice is its ordinal
    elif mod == "torch" and name == "device":
        if obj.type != "cuda":
            raise ValueError(f"{obj!r} is not a CUDA device")
        if obj.index is None:  # torch.device("cuda"): torch's current device
            import torch
            return ("ordinal", torch.cuda.current_device())
        return ("ordinal", obj.index)
    elif mod.startswith("torch") and hasattr(obj, "cuda_stream"):
        return ("stream", int(obj.cuda_stream), obj.device.index)
    elif mod.startswith("cupy"):
        if name == "Device":
            return ("ordinal", int(obj.id))
        if hasattr(obj, "ptr") and "Stream" in name:
            return ("stream", int(obj.ptr), getattr(obj, "device_id", None))
    elif mod.startswith("cuda.core"):
        if hasattr(obj, "device_id") and name == "Device":
            return ("ordinal", int(obj.device_id))
        if name == "Stream":
            return ("stream", int(obj.handle), int(obj.device.device_id))
        if name == "Context":
            return ("context", int(obj.handle))
    if hasattr(obj, "__cuda_stream__"):  # the CUDA stream protocol: (version, handle)
        return ("stream", int(obj.__cuda_stream__()[1]), None)
    if isinstance(obj, bool) or not hasattr(t, "__index__"):
        raise TypeError(
            f"ContextGuard takes a device ordinal (int), a device (cuda.core Device, "
            f"cupy.cuda.Device, torch.device), a CUcontext, a stream or a green context; got "
            f"{mod}.{name} {obj!r}"
        )
    return ("ordinal", _ordinal_of(obj))


# --- the guard --------------------------------------------------------------------------

cdef object _shared_lock = threading.Lock()
cdef dict _shared_guards = {}
# Every guard alive in this process, for diagnostics (cyctx's doctor compares the ids the
# guards last saw with the driver's). Touched at construction only, never on enter/exit.
cdef object _all_guards = weakref.WeakSet()


cdef class ContextGuard:
    """Retain a device's primary context and make it current around work.

    Construct it once and keep it: construction retains the primary context (which
    activates it), :meth:`close` releases it. Each ``with guard:`` makes the context current
    on the calling thread and, on leaving, restores exactly what was current before (no
    context included), also when the block raised or called ``cudaSetDevice``. When the
    context is already current, entering and leaving make no driver switch.

    Creating a guard per ``with`` block is a trap: when nothing else holds the primary
    context, each close destroys it and frees everything allocated in the block. Keep the
    guard for the life of the work, or use :meth:`ContextGuard.shared`.

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

    def __cinit__(self, device):
        self._ctx = NULL
        self._shared = False
        self._owns_retain = False
        self._resets = 0
        self._extra_retains = 0
        target = _target_of(device)
        count = _device_count()
        if target[0] == "ordinal":
            self._init_primary(target[1], count)
        elif target[0] == "stream" and target[1] in _DEFAULT_STREAMS:
            # The default streams belong to whatever context is current: meaningless here. A
            # framework's stream object still knows its device.
            if target[2] is None:
                raise ValueError(
                    "a default stream (handle 0/1/2) has no context of its own; pass the device instead"
                )
            self._init_primary(target[2], count)
        elif target[0] == "stream":
            self._init_context(_stream_context(target[1]), count)
        elif target[0] == "green":
            self._init_context(_green_context(target[1]), count)
        else:
            self._init_context(target[1], count)
        _all_guards.add(self)

    def _init_primary(self, ordinal, count):
        cdef cydriver.CUcontext ctx = NULL
        cdef cydriver.CUdevice dev = 0
        cdef unsigned long long ctx_id = 0
        cdef cydriver.CUresult err
        if ordinal >= count:
            raise InvalidDeviceError(
                101, "ContextGuard",
                f"Device {ordinal} does not exist: the driver reports {count} device(s), "
                f"ordinals 0..{count - 1} (CUDA_VISIBLE_DEVICES renumbers them)",
            )
        cdef const DriverApi* d = driver_api()  # loaded by _device_count
        check(d.DeviceGet(&dev, <int>ordinal), "cuDeviceGet")
        with nogil:
            # Activating a primary context creates it on the GPU: can take milliseconds.
            check(d.PrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain")
        err = d.CtxGetId(ctx, &ctx_id)
        if err != cydriver.CUresult.CUDA_SUCCESS:
            d.PrimaryCtxRelease(dev)  # construction failed: no retain kept
            check(err, "cuCtxGetId")
        self._dev = dev
        self._ordinal = ordinal
        self._ctx_id = ctx_id
        self._owns_retain = True
        self._ctx = ctx

    def _init_context(self, size_t handle, count):
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
        check(d.CtxPushCurrent(ctx), "cuCtxPushCurrent")
        err = d.CtxGetDevice(&dev)
        check(d.CtxPopCurrent(&tmp), "cuCtxPopCurrent")
        check(err, "cuCtxGetDevice")
        # Only an active primary can be this live context; retaining an inactive one would
        # create a context nobody asked for (DESIGN §1).
        check(d.PrimaryCtxGetState(dev, &flags, &active), "cuDevicePrimaryCtxGetState")
        if active:
            check(d.PrimaryCtxRetain(&pc, dev), "cuDevicePrimaryCtxRetain")
            if pc == ctx:
                self._owns_retain = True
            else:
                check(d.PrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")
        self._dev = dev
        self._ordinal = <int>dev
        self._ctx_id = ctx_id
        self._ctx = ctx

    @staticmethod
    def from_handle(handle):
        """A guard for an existing context given as an int handle (a ``CUcontext`` address).

        ``ContextGuard(int)`` means a device ordinal; this is the way to pass a raw handle.
        A primary context is retained by the guard; any other context stays the caller's.
        """
        if isinstance(handle, bool) or not hasattr(type(handle), "__index__"):
            raise TypeError(f"from_handle takes an int CUcontext address, got {type(handle).__name__}")
        from cuda.bindings.driver import CUcontext
        return ContextGuard(CUcontext(operator.index(handle)))

    def __dealloc__(self):
        # Safety net only (close() is the deterministic release). No Python calls here:
        # this can run at interpreter shutdown (DESIGN §3.9). In a forked child the retain
        # belongs to the parent and the driver is unusable: nothing to release.
        if self._ctx != NULL and self._owns_retain and not g_forked_after_cuda:
            _release(self._dev, 1 + self._extra_retains)
        self._ctx = NULL

    @staticmethod
    def shared(device):
        """The process-wide guard of ``device``: created on first use, never closed.

        This is the easy way to hold the long-lived retain: every caller gets the same
        guard, so the primary context stays alive between blocks. Thread-safe.
        """
        ordinal = _ordinal_of(device)
        guard = _shared_guards.get(ordinal)
        if guard is None:
            with _shared_lock:
                guard = _shared_guards.get(ordinal)
                if guard is None:
                    guard = ContextGuard(ordinal)
                    (<ContextGuard>guard)._shared = True
                    _shared_guards[ordinal] = guard
        return guard

    cdef int enter(self) except -1 nogil:
        cdef Switch s
        cdef unsigned long long ctx_id = 0
        cdef cydriver.CUresult err
        if g_forked_after_cuda:
            return _raise_fork()
        if self._ctx == NULL:
            return _raise_closed(self)
        # A reset keeps the handle and changes the id (lab probe2), so the pointer alone
        # proves nothing (DESIGN §3.7): one cuCtxGetId, ~11 ns, on every enter.
        # The table is loaded: this guard's construction did it.
        err = driver_api().CtxGetId(self._ctx, &ctx_id)
        if err != cydriver.CUresult.CUDA_SUCCESS or ctx_id != self._ctx_id:
            _after_reset(self, err, ctx_id)
        switch_to(&s, self._ctx)
        if tls_push(<void*>self, s.prev, s.switched) != 0:
            switch_back(&s)
            return _raise_no_memory()
        return 0

    cdef int exit(self) except -1 nogil:
        cdef Entry e
        cdef Switch s
        # The entry ends here even if the restore below fails: a failed restore leaves the
        # driver's stack as it was, and keeping the entry would make every later exit on
        # this thread look out of order.
        if tls_pop_matching(<void*>self, &e) != 0:
            return _raise_exit_misuse(self)
        if g_forked_after_cuda:
            return 0  # a block left in a forked child: the driver is gone, nothing to restore
        s.prev = e.prev
        s.switched = e.switched
        return switch_back(&s)

    def __enter__(self):
        self.enter()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            self.exit()
            return False
        # The block's exception wins; a cleanup failure rides along as a note.
        try:
            self.exit()
        except BaseException as cleanup:
            _add_note(exc, f"cyctx: leaving {self!r} also failed: {type(cleanup).__name__}: {cleanup}")
        return False

    def close(self):
        """Release the retain taken at construction. Idempotent.

        Raises
        ------
        GuardError
            The guard is entered on this thread, or it is a :meth:`shared` guard.
        DriverError
            The release failed; the guard stays open (the retain is still held) so a later
            ``close()`` or garbage collection can release it.
        """
        if self._ctx == NULL:
            return
        if self._shared:
            raise GuardError(f"{self!r} is shared by the whole process and is never closed")
        if tls_count(<void*>self):
            raise GuardError(
                f"{self!r}: close() inside a with-block of the same guard on this thread; "
                f"leave the block first"
            )
        if g_forked_after_cuda or not self._owns_retain:
            self._ctx = NULL  # nothing of ours to release (the parent's, or the caller's context)
            return
        cdef const DriverApi* d = driver_api()  # loaded: the guard was constructed
        while self._extra_retains:
            check(d.PrimaryCtxRelease(self._dev), "cuDevicePrimaryCtxRelease")
            self._extra_retains -= 1
        check(d.PrimaryCtxRelease(self._dev), "cuDevicePrimaryCtxRelease")
        self._ctx = NULL

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
        return self._ctx == NULL

    @property
    def is_shared(self):
        """True for the process-wide guards of :meth:`shared`."""
        return self._shared

    @property
    def handle(self):
        """The primary context's ``CUcontext`` as an int address. GuardError when closed."""
        if self._ctx == NULL:
            _raise_closed(self)
        return <size_t>self._ctx

    @property
    def context(self):
        """The primary context as a ``cuda.bindings.driver.CUcontext``."""
        from cuda.bindings.driver import CUcontext
        return CUcontext(self.handle)

    @property
    def context_id(self):
        """The driver's unique id of the context (``cuCtxGetId``) as last seen by enter()."""
        return self._ctx_id

    @property
    def resets(self):
        """How many resets of the primary context enter() detected and re-activated."""
        return self._resets

    def __repr__(self):
        state = "closed" if self._ctx == NULL else f"ctx=0x{<size_t>self._ctx:x} id={self._ctx_id}"
        shared = " shared" if self._shared else ""
        return f"<cyctx.ContextGuard device={self._ordinal}{shared} {state}>"


def _add_note(exc, note):
    # PEP 678 (3.11+). On 3.10 the same attribute is set, so code that reads __notes__ finds
    # it, and, since 3.10's traceback does not print notes, it is also written to stderr:
    # the failure is never lost.
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        return
    notes = getattr(exc, "__notes__", None)
    if not isinstance(notes, list):
        notes = []
        try:
            exc.__notes__ = notes
        except AttributeError:
            pass
    notes.append(note)
    print(f"{note} (while {type(exc).__name__} propagated)", file=sys.stderr)


cdef int _after_reset(ContextGuard g, cydriver.CUresult err, unsigned long long ctx_id) except -1 nogil:
    # The primary context was reset since this guard last saw it. Our retain survived the
    # reset (lab probe2: the refcount is kept), so a retain+release pair re-activates it
    # and leaves the refcount as it was. GIL: only to warn.
    cdef cydriver.CUcontext ctx = NULL
    if err != cydriver.CUresult.CUDA_SUCCESS and err != cydriver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED:
        return check(err, "cuCtxGetId")
    if not g._owns_retain:
        # The caller's context (cuCtxCreate, green) was destroyed: nothing to re-activate.
        return _raise_destroyed(g)
    _warn_reset(g, err == cydriver.CUresult.CUDA_SUCCESS)  # may raise: nothing changed yet
    cdef const DriverApi* d = driver_api()  # loaded: the guard was constructed
    if err != cydriver.CUresult.CUDA_SUCCESS:
        check(d.PrimaryCtxRetain(&ctx, g._dev), "cuDevicePrimaryCtxRetain")
        if d.PrimaryCtxRelease(g._dev) != cydriver.CUresult.CUDA_SUCCESS:
            # Still balanced overall: close() releases it with the guard's own retain.
            g._extra_retains += 1
        g._ctx = ctx  # the driver reuses the handle; take whatever it says
        check(d.CtxGetId(ctx, &ctx_id), "cuCtxGetId")
    g._ctx_id = ctx_id
    g._resets += 1
    return 0


def _stream_context(size_t handle):
    """The context handle a stream belongs to (cuStreamGetCtx)."""
    cdef cydriver.CUcontext ctx = NULL
    cdef const DriverApi* d = _api()
    if d.StreamGetCtx == NULL:
        check(cydriver.CUresult.CUDA_ERROR_NOT_FOUND, "cuStreamGetCtx (not provided by this driver)")
    check(d.StreamGetCtx(<cydriver.CUstream>handle, &ctx), "cuStreamGetCtx")
    return <size_t>ctx


def _green_context(size_t handle):
    cdef cydriver.CUcontext ctx = NULL
    cdef const DriverApi* d = _api()
    if d.CtxFromGreenCtx == NULL:
        check(cydriver.CUresult.CUDA_ERROR_NOT_FOUND, "cuCtxFromGreenCtx (not provided by this driver)")
    check(d.CtxFromGreenCtx(&ctx, <cydriver.CUgreenCtx>handle), "cuCtxFromGreenCtx")
    return <size_t>ctx


cdef void _release(cydriver.CUdevice dev, int n) noexcept nogil:
    # Release path of __dealloc__: errors cannot be reported there, and must not be raised.
    cdef int i
    cdef const DriverApi* d = driver_api()  # loaded: a guard was constructed
    for i in range(n):
        d.PrimaryCtxRelease(dev)


cdef int _warn_reset(ContextGuard g, bint reactivated_elsewhere) except -1 with gil:
    how = ("someone re-activated it since" if reactivated_elsewhere
           else "it is inactive; cyctx re-activates it (refcount unchanged)")
    warnings.warn(
        f"device {g._ordinal}'s primary context was reset (cudaDeviceReset or "
        f"cuDevicePrimaryCtxReset) since {g!r} last entered it; {how}. Memory and modules "
        f"created in it before the reset are gone.",
        ContextResetWarning, stacklevel=2,
    )
    return 0


cdef int _raise_destroyed(ContextGuard g) except -1 with gil:
    raise driver_error(
        709, "cuCtxGetId",
        f"The context of {g!r} was destroyed by its owner (cuCtxDestroy) while the guard "
        f"still referred to it; the guard cannot bring it back. Close the guard.",
    )


cdef int _raise_closed(ContextGuard g) except -1 with gil:
    raise GuardError(f"{g!r} is closed: its retain was released; create a new guard")


cdef int _raise_no_memory() except -1 with gil:
    raise MemoryError("cyctx: no memory to record a guard entry")


cdef int _raise_exit_misuse(ContextGuard g) except -1 with gil:
    cdef Entry* top = tls_top()
    if tls_count(<void*>g) == 0:
        raise GuardError(
            f"{g!r}: exit without a matching enter on this thread. Entries are per thread: "
            f"leave a guard on the thread that entered it, once per enter."
        )
    raise GuardError(
        f"{g!r}: exit out of order: another guard (object at 0x{<size_t>top.owner:x}) was "
        f"entered after it on this thread and is still open. Guards are left in reverse "
        f"order of entry; a generator or coroutine holding a guard across yield/await breaks "
        f"that. Nothing was changed."
    )


def current_handle():
    """The calling thread's current ``CUcontext`` as an int (0: none). One cuCtxGetCurrent."""
    cdef cydriver.CUcontext cur = NULL
    check(_api().CtxGetCurrent(&cur), "cuCtxGetCurrent")
    return <size_t>cur


def _live_guards():
    """The ContextGuards alive in this process (a snapshot list)."""
    return list(_all_guards)


def _open_entries():
    """Number of open guard entries on the calling thread (for tests and diagnostics)."""
    return tls_depth()
