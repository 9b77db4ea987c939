# Part of the _guard module (included by _guard.pyx): the raw switch layer of the .pxd
# (switch_to/switch_back) and the one restore that a guard's exit shares with it.

# --- the raw layer ---------------------------------------------------------------------

cdef int switch_to(Switch* s, cydriver.CUcontext target) except -1 nogil:
    if target == NULL:
        return _raise_value("switch_to: target context is NULL")
    return _switch_into(s, _api(), target, NULL)


cdef inline int _switch_into(Switch* s, const DriverApi* d, cydriver.CUcontext target,
                             const unsigned long long* target_id) except -1 nogil:
    # Make `target` current, recording the way back in `s`: switch_to's and a guard's enter.
    # cuCtxGetCurrent is thread-local and ~7-12 ns; the switch is only paid when needed
    # (docs/design.md, "Costs"). `target_id`: target's id where the caller has read it (the
    # enter's reset check), else NULL.
    cdef cydriver.CUcontext cur = NULL
    check(d.CtxGetCurrent(&cur), "cuCtxGetCurrent")
    if cur == target:
        # Nothing to switch, but the way back still needs target's id: if the code in between
        # makes another context current and destroys or resets target, the restore must not
        # hand target back to the driver.
        if target_id != NULL:
            s.prev_id = target_id[0]
        else:
            _id_of(d, cur, &s.prev_id)
        s.prev = cur
        s.switched = False
        return 0
    return _switch_from(s, target, cur, d)


cdef inline int _id_of(const DriverApi* d, cydriver.CUcontext ctx, unsigned long long* ctx_id) except -1 nogil:
    # ctx's id, kept so that the way back can tell it from a context that died meanwhile and
    # left its handle to a new one (_set_prev). A context that is already dead (a stale handle
    # after a reset: destroyed, its handle still known to the driver) gets 0; a handle the
    # driver does not know at all gets CYCTX_PREV_UNKNOWN, which no context found there later
    # matches (cyctx/switch.h).
    cdef cydriver.CUresult err = d.CtxGetId(ctx, ctx_id)
    if err == cydriver.CUresult.CUDA_SUCCESS:
        return 0
    if err == cydriver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED:
        ctx_id[0] = 0
        return 0
    if err == cydriver.CUresult.CUDA_ERROR_INVALID_CONTEXT:
        ctx_id[0] = CYCTX_PREV_UNKNOWN
        return 0
    return raise_driver_error(err, "cuCtxGetId")


cdef int _switch_from(Switch* s, cydriver.CUcontext target, cydriver.CUcontext cur,
                      const DriverApi* d) except -1 nogil:
    # `target` is not current; `cur` is what is. On an empty stack a push is what
    # cuCtxSetCurrent(target) would do (it pushes there), and push+pop is cheaper than a
    # cuCtxSetCurrent pair (docs/evidence.md, "Push+pop vs the cuCtxSetCurrent pair": 31.8 vs
    # 39.2 ns).
    # Over another context, cuCtxSetCurrent replaces it, so the exit can restore it whatever
    # the block did (docs/design.md, "The restore rule"); it is remembered with its id.
    cdef unsigned long long prev_id = 0
    if cur == NULL:
        check(d.CtxPushCurrent(target), "cuCtxPushCurrent")
    else:
        _id_of(d, cur, &prev_id)
        check(d.CtxSetCurrent(target), "cuCtxSetCurrent")
    s.prev = cur
    s.prev_id = prev_id
    s.switched = True
    return 0


cdef int switch_back(const Switch* s) except -1 nogil:
    return _restore(_api(), s)


cdef inline int _restore(const DriverApi* d, const Switch* s) except -1 nogil:
    # The one way back, for switch_back and for a guard's exit (inline: it is the exit's fast
    # path when nothing was switched: one cuCtxGetCurrent).
    cdef cydriver.CUcontext cur = NULL
    if s.switched and s.prev == NULL:
        return _pop_to_empty(d)
    if not s.switched:
        check(d.CtxGetCurrent(&cur), "cuCtxGetCurrent")
        if cur == s.prev:
            return 0
    # Switched over `prev` (set it again without looking at what is current: that also undoes
    # a replacement of the top made inside the block), or the block made another context
    # current. Either way `prev` is handed back only if it survived the block (_set_prev).
    return _set_prev(d, s.prev, s.prev_id, s.switched)


cdef int _set_prev(const DriverApi* d, cydriver.CUcontext prev, unsigned long long prev_id,
                   bint switched) except -1 nogil:
    # Make `prev` current again, unless it did not survive the block: a context destroyed
    # meanwhile may have been freed by the driver (its handle is then garbage to it), and a
    # handle whose id changed holds another context (a reset primary, or a new context at a
    # freed address). One cuCtxGetId tells; it is never called on the exit's fast path.
    cdef unsigned long long now = 0
    cdef cydriver.CUresult err = d.CtxGetId(prev, &now)
    if err == cydriver.CUresult.CUDA_SUCCESS:
        # Unchanged; or dead at the enter, alive again (a reset primary re-activated). An id of
        # CYCTX_PREV_UNKNOWN matches nothing: a context there now is not prev.
        if now == prev_id or prev_id == 0:
            return check(d.CtxSetCurrent(prev), "cuCtxSetCurrent")
    elif err == cydriver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED:
        if prev_id == 0:  # dead at the enter already, and still the same handle to the driver
            return check(d.CtxSetCurrent(prev), "cuCtxSetCurrent")
    elif err != cydriver.CUresult.CUDA_ERROR_INVALID_CONTEXT:
        return raise_driver_error(err, "cuCtxGetId")  # cannot tell: change nothing
    return _prev_died(d, prev, err, switched)


cdef int _prev_died(const DriverApi* d, cydriver.CUcontext prev, cydriver.CUresult err,
                    bint switched) except -1 nogil:
    # What cuCtxDestroy does to a context that is current: it pops it. The switch replaced
    # prev's place on the stack, so that place is popped; without a switch the block's own
    # destroy already popped it, and what the block left is left.
    cdef cydriver.CUcontext popped = NULL
    cdef cydriver.CUcontext cur = NULL
    if switched:
        d.CtxPopCurrent(&popped)  # fails only on a stack the block emptied: nothing to undo
    if d.CtxGetCurrent(&cur) != cydriver.CUresult.CUDA_SUCCESS:
        cur = NULL
    return _raise_prev_died(<size_t>prev, <int>err, switched, <size_t>cur)


cdef int _raise_prev_died(size_t prev, int err, bint switched, size_t cur) except -1 with gil:
    raise _errors.prev_died(prev, err, switched, cur)


cdef int _pop_to_empty(const DriverApi* d) except -1 nogil:
    # The enter pushed onto an empty stack. Pop one entry: the guard's, or whatever the block
    # replaced it with (cudaSetDevice, cuCtxSetCurrent), as cuCtxSetCurrent(NULL) would.
    # Anything still current after that was pushed inside the block and never popped.
    cdef cydriver.CUcontext popped = NULL
    cdef cydriver.CUcontext cur = NULL
    cdef cydriver.CUresult err = d.CtxPopCurrent(&popped)
    check(d.CtxGetCurrent(&cur), "cuCtxGetCurrent")
    if err != cydriver.CUresult.CUDA_SUCCESS:
        if cur == NULL:
            return 0  # the block emptied the stack itself (a pop, or cuCtxSetCurrent(NULL))
        return raise_driver_error(err, "cuCtxPopCurrent")
    if cur != NULL:
        return _unwind_leaked_pushes(d)
    return 0


cdef int _unwind_leaked_pushes(const DriverApi* d) except -1 nogil:
    # The thread entered with no context; restore that exactly, and say so loudly: silently
    # popping another library's contexts would hide its bug (docs/design.md, "The restore rule").
    cdef cydriver.CUcontext cur = NULL
    cdef int n = 0
    while True:
        check(d.CtxGetCurrent(&cur), "cuCtxGetCurrent")
        if cur == NULL or n == _MAX_UNWIND:
            break
        check(d.CtxSetCurrent(NULL), "cuCtxSetCurrent")
        n += 1
    return _raise_leaked(n, <size_t>cur)


cdef int _raise_leaked(int n, size_t still) except -1 with gil:
    raise _errors.leaked_pushes(n, still)


cdef int _raise_value(str msg) except -1 with gil:
    raise ValueError(msg)
