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
    # path when nothing was switched: one cuCtxGetCurrent). A driver call that fails on the way
    # is made once more: the way back ends with the thread as the enter found it (and the
    # failure raised all the same), or raises an error that names the state it leaves.
    cdef cydriver.CUcontext cur = NULL
    cdef cydriver.CUresult err
    if s.switched and s.prev == NULL:
        return _pop_to_empty(d)
    if not s.switched:
        err = d.CtxGetCurrent(&cur)
        if err != cydriver.CUresult.CUDA_SUCCESS:
            return _restore_unread(d, s, err)
        if cur == s.prev:
            return 0
    # Switched over `prev` (set it again without looking at what is current: that also undoes
    # a replacement of the top made inside the block), or the block made another context
    # current. Either way `prev` is handed back only if it survived the block (_set_prev).
    return _set_prev(d, s.prev, s.prev_id, s.switched)


# The first failure of a call on the way back that was made again, for the error that says so.
cdef struct _Failed:
    cydriver.CUresult err
    const char* call

# What a way back that could not restore was unable to do (_errors.exit_stuck).
cdef enum:
    _STUCK_SET = 0        # make `before` current again
    _STUCK_UNCHECKED = 1  # tell whether `before` survived the block
    _STUCK_POP = 2        # pop what the enter pushed onto an empty stack
    _STUCK_UNREAD = 3     # read what is current


cdef inline cydriver.CUresult _twice(cydriver.CUresult err, cydriver.CUresult again,
                                     const char* call, _Failed* f) noexcept nogil:
    # `again`, the second try's result, when the first (`err`) failed; the first failure noted.
    if f.err == cydriver.CUresult.CUDA_SUCCESS:
        f.err = err
        f.call = call
    return again


cdef int _restore_unread(const DriverApi* d, const Switch* s, cydriver.CUresult err) except -1 nogil:
    # The fast path's cuCtxGetCurrent failed with `err` (nothing was switched): once more.
    cdef cydriver.CUcontext cur = NULL
    cdef _Failed f
    f.err = err
    f.call = "cuCtxGetCurrent"
    err = d.CtxGetCurrent(&cur)
    if err != cydriver.CUresult.CUDA_SUCCESS:
        # Whatever the block left current, make prev current again: what the enter found.
        _set_prev(d, s.prev, s.prev_id, s.switched)
        return _raise_retried(err, f.call, True)
    if cur != s.prev:
        _set_prev(d, s.prev, s.prev_id, s.switched)
    return _raise_retried(f.err, f.call, False)


cdef int _set_prev(const DriverApi* d, cydriver.CUcontext prev, unsigned long long prev_id,
                   bint switched) except -1 nogil:
    # Make `prev` current again, unless it did not survive the block: a context destroyed
    # meanwhile may have been freed by the driver (its handle is then garbage to it), and a
    # handle whose id changed holds another context (a reset primary, or a new context at a
    # freed address). One cuCtxGetId tells; it is never called on the exit's fast path.
    cdef unsigned long long now = 0
    cdef _Failed f
    f.err = cydriver.CUresult.CUDA_SUCCESS
    f.call = NULL
    cdef cydriver.CUresult err = d.CtxGetId(prev, &now)
    if not _told(err):
        err = _twice(err, d.CtxGetId(prev, &now), "cuCtxGetId", &f)
        if not _told(err):  # cannot tell whether prev survived: it is not handed back
            return _raise_stuck(d, err, "cuCtxGetId", prev, _STUCK_UNCHECKED)
    # Alive and unchanged; or dead at the enter, alive again (a reset primary re-activated); or
    # dead at the enter already, and still the same handle to the driver. An id of
    # CYCTX_PREV_UNKNOWN matches nothing: a context there now is not prev.
    if (err == cydriver.CUresult.CUDA_SUCCESS and (now == prev_id or prev_id == 0)) or (
            err == cydriver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED and prev_id == 0):
        err = d.CtxSetCurrent(prev)
        if err != cydriver.CUresult.CUDA_SUCCESS:
            err = _twice(err, d.CtxSetCurrent(prev), "cuCtxSetCurrent", &f)
            if err != cydriver.CUresult.CUDA_SUCCESS:
                return _raise_stuck(d, err, "cuCtxSetCurrent", prev, _STUCK_SET)
        if f.err != cydriver.CUresult.CUDA_SUCCESS:
            return _raise_retried(f.err, f.call, False)
        return 0
    return _prev_died(d, prev, err, switched)


cdef inline bint _told(cydriver.CUresult err) noexcept nogil:
    # A cuCtxGetId answer about the context: alive, destroyed, or a handle the driver does not know.
    return (err == cydriver.CUresult.CUDA_SUCCESS
            or err == cydriver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED
            or err == cydriver.CUresult.CUDA_ERROR_INVALID_CONTEXT)


cdef int _prev_died(const DriverApi* d, cydriver.CUcontext prev, cydriver.CUresult err,
                    bint switched) except -1 nogil:
    # What cuCtxDestroy does to a context that is current: it pops it. The switch replaced
    # prev's place on the stack, so that place is popped; without a switch the block's own
    # destroy already popped it, and what the block left is left.
    cdef cydriver.CUcontext popped = NULL
    cdef cydriver.CUcontext cur = NULL
    cdef bint done = True
    if switched and d.CtxPopCurrent(&popped) != cydriver.CUresult.CUDA_SUCCESS:
        # Fails on a stack the block emptied: nothing to undo. Else once more.
        if d.CtxGetCurrent(&cur) == cydriver.CUresult.CUDA_SUCCESS and cur != NULL:
            done = d.CtxPopCurrent(&popped) == cydriver.CUresult.CUDA_SUCCESS
    cdef bint read = d.CtxGetCurrent(&cur) == cydriver.CUresult.CUDA_SUCCESS
    return _raise_prev_died(<size_t>prev, <int>err, switched, done, <size_t>cur, read)


cdef int _raise_prev_died(size_t prev, int err, bint switched, bint popped, size_t cur,
                          bint read) except -1 with gil:
    raise _errors.prev_died(prev, err, switched, cur if read else None, popped)


cdef int _pop_to_empty(const DriverApi* d) except -1 nogil:
    # The enter pushed onto an empty stack. Pop one entry: the guard's, or whatever the block
    # replaced it with (cudaSetDevice, cuCtxSetCurrent), as cuCtxSetCurrent(NULL) would.
    # Anything still current after that was pushed inside the block and never popped.
    cdef cydriver.CUcontext popped = NULL
    cdef cydriver.CUcontext cur = NULL
    cdef _Failed f
    f.err = cydriver.CUresult.CUDA_SUCCESS
    f.call = NULL
    cdef cydriver.CUresult err = d.CtxPopCurrent(&popped)
    if err != cydriver.CUresult.CUDA_SUCCESS:
        # Fine if the block emptied the stack itself (a pop, or cuCtxSetCurrent(NULL)); else
        # once more.
        if _current_twice(d, &cur, &f) != 0:
            return _raise_stuck(d, f.err, "cuCtxGetCurrent", NULL, _STUCK_UNREAD)
        if cur != NULL:
            err = _twice(err, d.CtxPopCurrent(&popped), "cuCtxPopCurrent", &f)
            if err != cydriver.CUresult.CUDA_SUCCESS:
                return _raise_stuck(d, err, "cuCtxPopCurrent", NULL, _STUCK_POP)
    if _current_twice(d, &cur, &f) != 0:
        return _raise_stuck(d, f.err, "cuCtxGetCurrent", NULL, _STUCK_UNREAD)
    if cur != NULL:
        return _unwind_leaked_pushes(d)
    if f.err != cydriver.CUresult.CUDA_SUCCESS:
        return _raise_retried(f.err, f.call, False)
    return 0


cdef int _current_twice(const DriverApi* d, cydriver.CUcontext* cur, _Failed* f) noexcept nogil:
    # cuCtxGetCurrent, made again if it fails (the failure noted in f). 0, or -1 when it failed
    # twice (its code in f.err).
    cdef cydriver.CUresult err = d.CtxGetCurrent(cur)
    if err == cydriver.CUresult.CUDA_SUCCESS:
        return 0
    err = _twice(err, d.CtxGetCurrent(cur), "cuCtxGetCurrent", f)
    if err == cydriver.CUresult.CUDA_SUCCESS:
        return 0
    f.err = err
    return -1


cdef int _unwind_leaked_pushes(const DriverApi* d) except -1 nogil:
    # The thread entered with no context; restore that exactly, and say so loudly: silently
    # popping another library's contexts would hide its bug (docs/design.md, "The restore rule").
    cdef cydriver.CUcontext cur = NULL
    cdef int n = 0
    cdef cydriver.CUresult err
    cdef _Failed f
    f.err = cydriver.CUresult.CUDA_SUCCESS
    f.call = NULL
    while True:
        if _current_twice(d, &cur, &f) != 0:
            return _raise_stuck(d, f.err, "cuCtxGetCurrent", NULL, _STUCK_UNREAD)
        if cur == NULL or n == _MAX_UNWIND:
            break
        err = d.CtxSetCurrent(NULL)
        if err != cydriver.CUresult.CUDA_SUCCESS:
            err = _twice(err, d.CtxSetCurrent(NULL), "cuCtxSetCurrent", &f)
            if err != cydriver.CUresult.CUDA_SUCCESS:
                return _raise_stuck(d, err, "cuCtxSetCurrent", NULL, _STUCK_POP)
        n += 1
    return _raise_leaked(n, <size_t>cur)


cdef int _raise_leaked(int n, size_t still) except -1 with gil:
    raise _errors.leaked_pushes(n, still)


cdef int _raise_retried(cydriver.CUresult err, const char* call, bint twice) except -1 with gil:
    raise _errors.exit_retried(<int>err, call.decode(), twice)


cdef int _raise_stuck(const DriverApi* d, cydriver.CUresult err, const char* call,
                      cydriver.CUcontext before, int why) except -1 nogil:
    # The way back stops here: `call` failed twice, the second time with `err`. What is current
    # now, for the error to name.
    cdef cydriver.CUcontext cur = NULL
    cdef bint read = why != _STUCK_UNREAD and d.CtxGetCurrent(&cur) == cydriver.CUresult.CUDA_SUCCESS
    return _raise_stuck_words(<int>err, call, <size_t>cur, read, <size_t>before, why)


cdef int _raise_stuck_words(int err, const char* call, size_t cur, bint read, size_t before,
                            int why) except -1 with gil:
    raise _errors.exit_stuck(err, call.decode(), cur if read else None, before,
                             ("set", "unchecked", "pop", "unread")[why])


cdef int _raise_value(str msg) except -1 with gil:
    raise ValueError(msg)
