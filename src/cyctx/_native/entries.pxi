# Part of the _guard module (included by _guard.pyx): a guard's enter and exit of one block
# (the per-thread entries of _cpp/thread_entries.h, the fast path, misuse).

cdef inline int _enter_block(ContextGuard self, const BlockId* block) except -1 nogil:
    # enter() for a block: the nogil enter() is block NULL, Python's `with` its BlockId
    # (_protocol/blocks.h). On the fast path (the context already current): two cheap
    # thread-local driver calls and one thread-local entry (docs/design.md, "Costs").
    cdef unsigned long long ctx_id = 0
    cdef cydriver.CUresult err
    cdef Switch s
    cdef const DriverApi* d = driver_api()  # loaded by the construction (else its first use)
    cdef cydriver.CUcontext ctx = ctx_load(&self._ctx)  # an acquire load: free on x86
    if forked_after_cuda():
        return _raise_fork()
    if ctx == NULL:
        ctx = _first_use(self)  # a shared guard's first use (retains), else GuardError: closed
        d = driver_api()
    # A reset keeps the handle and changes the id (docs/evidence.md, "Reset keeps the handle and
    # changes the id"), so the pointer alone proves nothing: one cuCtxGetId, ~9-11 ns, on
    # every enter.
    err = d.CtxGetId(ctx, &ctx_id)
    if err != cydriver.CUresult.CUDA_SUCCESS or ctx_id != u64_load(&self._ctx_id):
        if CYCTX_FREE_THREADED and block != NULL:
            _after_reset_let_go(self, err)  # a Python enter holding the gate
        else:
            _after_reset(self, err)
        ctx = ctx_load(&self._ctx)
        ctx_id = u64_load(&self._ctx_id)
    _switch_into(&s, d, ctx, &ctx_id)
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


cdef inline int _exit_block(ContextGuard self, int how, unsigned long long serial) except -1 nogil:
    # exit() for a block (see _enter_block): the nogil exit() pops the guard's innermost entry; a
    # Python exit's own is found by the Python-protocol layer (_protocol/blocks.h, with the GIL;
    # `serial`: the exit binding it came through, 0 for none) and taken by the driver layer: the
    # innermost popped, one below it spliced out by its index (_exit_found). The entry ends here
    # even if the restore fails: a failed restore leaves the driver's stack as it was, and keeping
    # the entry would make every later exit on this thread look out of order.
    cdef Switch s
    cdef size_t at = 0
    cdef size_t dropped = 0
    cdef size_t candidates = 0
    cdef int r
    if how == EXIT_NOGIL:
        if tls_pop_own(self._token, &s, &dropped) != 0:
            return _exit_misuse(self, how, dropped, False)
    else:
        r = block_find(self._token, serial, &at, &dropped, &candidates)
        if r != BLOCK_TOP:
            return _exit_found(self, how, r, at, dropped, candidates)
        tls_pop_innermost(&s)
    return _exit_restore(self, &s, &dropped)


cdef inline int _exit_restore(ContextGuard self, const Switch* s, const size_t* dropped) except -1 nogil:
    # The way back of a block whose entry was taken (`dropped`: by address, which keeps the
    # nogil exit's fast path as short as when this was written in _exit_block itself).
    if forked_after_cuda():
        return 0  # a block left in a forked child: the driver is gone, nothing to restore
    # The fast path (nothing switched): one cuCtxGetCurrent, and a switch back only if the
    # block left another context current (cudaSetDevice inside the block).
    _restore(driver_api(), s)  # loaded: the matching enter ran
    if dropped[0]:
        return _warn_dropped(self, dropped[0])  # after the restore: the exit itself is done
    return 0


cdef int _exit_found(ContextGuard self, int how, int r, size_t at, size_t dropped,
                     size_t candidates) except -1 nogil:
    # A Python exit whose entry block_find found the long way (`r`), or did not find.
    cdef Switch s
    if r == BLOCK_AMBIGUOUS:
        return _exit_ambiguous(self, candidates)
    if r == BLOCK_NONE:
        return _exit_misuse(self, how, dropped, False)
    if r == BLOCK_OWN:
        tls_pop_innermost(&s)
        return _exit_restore(self, &s, &dropped)
    tls_splice_at(at)  # from under the blocks above it, which restore what was current before it
    if r == BLOCK_HANDED:  # no disorder: those blocks are this guard's, of the same strand
        return _warn_dropped(self, dropped) if dropped else 0
    return _exit_misuse(self, how, dropped, True)


cdef int _raise_destroyed(ContextGuard g) except -1 with gil:
    raise _errors.destroyed_by_owner(repr(g))


cdef int _raise_closed(ContextGuard g) except -1 with gil:
    # Shown safely: a subclass's __repr__ may raise, and the error must stay "closed" (the
    # doctor reads the guards of other threads, which one of them may close meanwhile).
    raise _errors.closed(_inputs.shown(g, 200))


cdef int _raise_no_memory() except -1 with gil:
    raise MemoryError("cyctx: no memory to record a guard entry")


cdef int _exit_misuse(ContextGuard g, int how, size_t dropped, bint removed) except -1 with gil:
    # The exit's entry is not the innermost on this thread (after the drop of dead entries above
    # it), or the guard has none here. The nogil exit() is refused and changes nothing: its
    # caller can leave the inner blocks and call it again. Python never calls a block's __exit__
    # again, so an entry kept there would stay for ever: close() refused on this thread, and the
    # inner block, when left, making this block's context current again. So a Python exit
    # has spliced its entry out from under the open block (`removed`), which then restores what
    # was current before this one; the current context is not touched. Either way: GuardError.
    cdef unsigned long long top = tls_top_token()  # a splice never removes the innermost
    raise _errors.exit_misuse(repr(g), removed or tls_count(g._token) != 0, top == g._token, top,
                              dropped, removed, how == EXIT_GENERATOR)


cdef int _warn_dropped(ContextGuard g, size_t dropped) except -1 with gil:
    # Not an error: the exit itself completed. A guard freed while entered is a leak in the
    # caller's code, so it is reported as one (ResourceWarning is shown under -W default,
    # pytest and python -X dev).
    warnings.warn(_errors.dropped_text(repr(g), dropped), ResourceWarning, stacklevel=2)
    return 0


cdef int _exit_ambiguous(ContextGuard g, size_t candidates) except -1 with gil:
    # Several open entries of the guard on this thread could be this exit's, and nothing tells
    # which (_protocol/blocks.h): never a pick. Nothing is changed; every block keeps its context.
    import sys
    f = sys._getframe(0)  # the Python code calling __exit__ (this module's functions have no frame)
    where = f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"
    raise _errors.exit_ambiguous(repr(g), where, _open_blocks(g), PLAIN_PROTOCOL)


cdef list _open_blocks(ContextGuard g):
    # What is known of each open entry of `g` on this thread, innermost first, for the message.
    cdef size_t i = 0
    cdef int what
    out = []
    while True:
        what = block_describe(g._token, i)
        if what < 0:
            return out
        out.append(what)
        i += 1
