# Part of the _guard module (included by _guard.pyx): the context-lifetime epoch, a context's
# cuCtxGetId. The driver never gives an id twice in a process (docs/evidence.md, "Context ids
# come from one process-wide counter"), so a reset, or a destroy and a new context at the same
# handle value, gives a new epoch; a destroyed context answers CUDA_ERROR_CONTEXT_IS_DESTROYED
# through its handle, without a crash ("A destroyed context answers 709 to cuCtxGetId").

cdef unsigned long long epoch_of(cydriver.CUcontext ctx) except? 0 nogil:
    cdef unsigned long long cid = 0
    cdef cydriver.CUresult err
    if ctx == NULL:
        return 0
    if forked_after_cuda():
        _raise_fork()
    err = _api().CtxGetId(ctx, &cid)
    if err == cydriver.CUresult.CUDA_SUCCESS:
        return cid
    if err == cydriver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED:
        return 0
    raise_driver_error(err, "cuCtxGetId")
    return 0


def _not_a_context(ctx):
    return (f"context_epoch takes a context (a ContextGuard, an int CUcontext handle, a "
            f"context or stream object), got {type(ctx).__name__} {_inputs.shown(ctx)}")


def context_epoch(ctx):
    """The lifetime epoch of a context: a value that changes whenever the context behind a
    handle is reset, or destroyed and created again (a handle value the driver reuses gets a
    new one); None for a destroyed context. Key a cache of per-context objects (modules,
    kernels) by it instead of by the handle.

    ``ctx``: a ``ContextGuard``, an int ``CUcontext`` address, or any context or stream
    object :class:`ContextGuard` accepts (a stream gives its context's epoch). A device is a
    TypeError: its primary context has an epoch only while it is active, so ask a guard of
    it (``ContextGuard.shared(d).epoch``). One ``cuCtxGetId``; safe on a destroyed context.
    """
    cdef unsigned long long e
    cdef size_t h
    if isinstance(ctx, ContextGuard):
        return ctx.epoch
    if type(ctx) is int and 0 < ctx < (1 << 64):  # a plain handle: what a cache keys by
        e = epoch_of(<cydriver.CUcontext><size_t>ctx)
        return None if e == 0 else e
    if isinstance(ctx, bool) or ctx is None:
        raise TypeError(_not_a_context(ctx))
    if isinstance(ctx, int):  # an int is a handle here: a device is no context
        h = _inputs.context_handle(ctx, "context_epoch: the context handle")
    else:
        try:
            target = _inputs.recognise(ctx)
        except TypeError:
            raise TypeError(_not_a_context(ctx)) from None
        if target.kind == _inputs.Kind.ORDINAL:
            raise TypeError(
                f"context_epoch takes a context, got the device {_inputs.shown(ctx)}: a "
                f"device's primary context has an epoch only while active; ask a guard of it, "
                f"cyctx.ContextGuard.shared(device).epoch")
        h = _context_of(target.kind, target.value)
    if h == 0:
        raise ValueError("context_epoch: the handle is NULL (0), which is no context")
    e = epoch_of(<cydriver.CUcontext>h)
    return None if e == 0 else e
