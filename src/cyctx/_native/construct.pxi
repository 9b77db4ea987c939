# Part of the _guard module (included by _guard.pyx): construction (a primary context's
# retain, an existing context), re-activation after a reset, the release of __dealloc__ (where
# that retain goes is lifetime.pxi's).

cdef int _init_primary(ContextGuard self, ordinal, count) except -1:
    # Construction from an ordinal (module-level, not a method: not callable on a live guard).
    cdef cydriver.CUcontext ctx = NULL
    cdef cydriver.CUdevice dev = 0
    cdef unsigned long long ctx_id = 0
    cdef cydriver.CUresult err, rerr, own
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
        # Construction failed: no retain may be kept. If even a release fails, say so (with
        # its code) rather than claim nothing was left behind.
        rerr = cydriver.CUresult.CUDA_SUCCESS
        while extra:
            rerr = d.PrimaryCtxRelease(dev)
            if rerr != cydriver.CUresult.CUDA_SUCCESS:
                break
            extra -= 1
        own = d.PrimaryCtxRelease(dev)  # the construction's own retain
        if own != cydriver.CUresult.CUDA_SUCCESS:
            rerr = own
            extra += 1
        if extra:
            raise _errors.construction_kept_retains(<int>err, failed.decode(), <int>rerr, ordinal,
                                                    extra)
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


cdef cydriver.CUcontext _first_use(ContextGuard g) except NULL with gil:
    # A guard whose context is NULL: a shared guard not used yet takes its retain here (so
    # that making one, a decorator at import, asks nothing of the driver); any other is
    # closed. Racing first users each construct a guard of their own, as ContextGuard(k)
    # would; the one whose context is published first hands its retain over and the others
    # release theirs. Nothing is held while Python code or the driver runs.
    cdef cydriver.CUcontext ctx = ctx_load(&g._ctx)
    if ctx != NULL:
        return ctx  # another thread's first use won
    if not g._shared:
        _raise_closed(g)
    cdef ContextGuard mine = ContextGuard(g._ordinal)  # InvalidDeviceError, ForkError...: kept none
    ctx = ctx_load(&mine._ctx)
    # Every racer writes the same device and, but for a reset in between (which the next
    # enter's id check then sees), the same id, before its context is published.
    int_store(<int*>&g._dev, <int>mine._dev)
    u64_store(&g._ctx_id, u64_load(&mine._ctx_id))
    if _ctx_publish(<void**>&g._ctx, <void*>ctx):
        int_add(&g._extra_retains, int_load(&mine._extra_retains))
        int_store(&mine._extra_retains, 0)
        mine._owns_retain = False
        ctx_store(&mine._ctx, NULL)  # handed over: nothing left for its close or __dealloc__
        _publish_shared(g, g._ordinal)  # and the retain of a collected guard, if any
    else:
        try:
            mine.close()
        except CyctxError:
            pass  # the release failed: the guard stays open and __dealloc__ releases it
    return ctx_load(&g._ctx)


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


cdef int _after_reset(ContextGuard g, cydriver.CUresult err) except -1 nogil:
    # The primary context was reset since this guard last saw it. Our retain survived the
    # reset (docs/evidence.md, "A reset keeps the retain count"), so a retain+release pair
    # re-activates it
    # and leaves the refcount as it was. GIL: only to warn.
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
    cdef const char* failed = _reactivate(g, d, &err)
    gate_leave(&g._gate)
    # Raised only now: raising takes the GIL, which a thread may never get back (a daemon thread
    # while the interpreter finalizes), and the gate must not stay held then.
    if failed != NULL:
        return check(err, failed)
    return 0


cdef const char* _reactivate(ContextGuard g, const DriverApi* d, cydriver.CUresult* err) noexcept nogil:
    # _after_reset's driver calls, with the gate held: NULL, or the call that failed (its code in
    # *err). No GIL is taken here.
    cdef cydriver.CUcontext ctx = NULL
    cdef unsigned long long ctx_id = 0
    # Look again: Python code ran in the warning (another thread, or a hook, may have
    # re-activated or reset the context since), so act on what the driver says now.
    err[0] = d.CtxGetId(ctx_load(&g._ctx), &ctx_id)
    if err[0] != cydriver.CUresult.CUDA_SUCCESS and err[0] != cydriver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED:
        return "cuCtxGetId"
    if err[0] != cydriver.CUresult.CUDA_SUCCESS:
        err[0] = d.PrimaryCtxRetain(&ctx, g._dev)
        if err[0] != cydriver.CUresult.CUDA_SUCCESS:
            return "cuDevicePrimaryCtxRetain"
        if d.PrimaryCtxRelease(g._dev) != cydriver.CUresult.CUDA_SUCCESS:
            # Still balanced overall: close() releases it with the guard's own retain.
            int_add(&g._extra_retains, 1)
        ctx_store(&g._ctx, ctx)  # the driver reuses the handle; take whatever it says
        err[0] = d.CtxGetId(ctx, &ctx_id)
        if err[0] != cydriver.CUresult.CUDA_SUCCESS:
            return "cuCtxGetId"
    u64_store(&g._ctx_id, ctx_id)
    int_add(&g._resets, 1)
    return NULL


cdef int _after_reset_let_go(ContextGuard g, cydriver.CUresult err) except -1 nogil:
    # _after_reset for a Python enter on a free-threaded build, which holds the guard's gate: the
    # warning runs Python code (a close() there goes ahead), so the hold is let go around it and
    # taken back after, waiting out a close() in flight (it holds the gate across driver calls
    # only, and waits for no one who let go). A close() meanwhile leaves the guard closed.
    gate_leave_python(&g._gate)
    try:
        _after_reset(g, err)
    finally:
        while gate_enter_python(&g._gate) != 0:
            cyctx_yield_detached()
    if ctx_load(&g._ctx) == NULL:
        return _raise_closed(g)
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
    try:
        warnings.warn(_errors.reset_text(g._ordinal, repr(g), reactivated_elsewhere),
                      ContextResetWarning, stacklevel=2)
    except ContextResetWarning:
        # The warning is an error: nothing is re-activated, so its words must not say it is.
        raise ContextResetWarning(
            _errors.reset_text(g._ordinal, repr(g), reactivated_elsewhere, refused=True)
        ) from None
    return 0


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
