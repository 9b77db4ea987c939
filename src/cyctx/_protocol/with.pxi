# Part of the _guard module (included by _guard.pyx): the Python protocol of `with guard:`
# (what __enter__/__exit__ run, the quick bound methods of _protocol/methods.h).

cdef inline int _called_on_a_guard(object obj, str method) except -1:
    # A method called through the class (`ContextGuard.close(x)`, `map(ContextGuard.close,
    # guards)`) gets whatever it is given as self, and a Cython method does not check it: any
    # other object would be read as a guard's fields.
    if not isinstance(obj, ContextGuard):
        raise TypeError(f"ContextGuard.{method}() needs a ContextGuard, got {_inputs.shown(obj)}")
    return 0


# `with guard:` itself (what __enter__/__exit__ run). Module-level C functions so that the
# bound methods a `with` makes for an exact ContextGuard call them directly (_protocol/methods.h):
# the same code runs whichever way the method is reached.
cdef object _with_enter(object obj):
    cdef ContextGuard self = <ContextGuard>obj
    cdef BlockId block
    block_here(&self._announced[0], &block)
    if not CYCTX_FREE_THREADED:
        _enter_block(self, &block)
        return self
    if gate_enter_python(&self._gate) != 0:
        _raise_closed(self)  # a close() is in flight: it wins
    cyctx_gates_add(1)
    try:
        _enter_block(self, &block)
    finally:
        cyctx_gates_add(-1)
        gate_leave_python(&self._gate)
    return self


cdef object _with_exit(object obj, object exc_type, object exc, object tb, unsigned long long serial):
    cdef ContextGuard self = <ContextGuard>obj
    # Python calls this once per block: an out-of-order exit removes its entry rather than
    # leave it for ever (_exit_misuse).
    if exc is None:
        _exit_block(self, EXIT_PYTHON, serial)
        return False
    if not isinstance(exc, BaseException):
        # A hand-made call (`g.__exit__(str, "boom", None)`): nothing could carry a note, so
        # a failure to leave is raised, as with no exception.
        _exit_block(self, EXIT_PYTHON, serial)
        return False
    if isinstance(exc, GeneratorExit) or _swallowed(type(exc)):
        # A generator or coroutine closed with the block open: from close(), or from its
        # finalizer when it was abandoned; or a greenlet killed (GreenletExit, also when it
        # is collected). A note on that exception would be lost (the generator machinery and
        # greenlet swallow it), so a failure here is raised instead: close() or throw()
        # raises it, a finalizer reports it through sys.unraisablehook.
        _exit_block(self, EXIT_GENERATOR, serial)
        return False
    # The block's exception wins; a cleanup failure rides along as a note.
    try:
        _exit_block(self, EXIT_PYTHON, serial)
    except BaseException as cleanup:
        _errors.note_cleanup_failure(exc, _inputs.shown(self, 200), cleanup)
        if not isinstance(exc, Exception):
            # Cancellation, KeyboardInterrupt, SystemExit: what carries the note is often
            # never shown (a cancelled task, a framework's cancel scope, a quiet exit), so
            # the failure is reported through sys.unraisablehook as well.
            _errors.report_unraisable(cleanup, _inputs.shown(self, 200))
    return False


cdef void* _announced_of(object obj) noexcept:
    return &(<ContextGuard>obj)._announced[0]


install_quick_with(ContextGuard, <void*>_with_enter, <void*>_with_exit, <void*>_announced_of)


cdef bint _swallowed(type t):
    # An exception that a framework catches and drops, so a note on it is never seen:
    # greenlet's GreenletExit (or a subclass), known by its type's module and name, never by
    # importing greenlet. Only looked at while an exception propagates out of a block.
    for k in t.__mro__:
        if getattr(k, "__name__", None) == "GreenletExit" and getattr(k, "__module__", None) == "greenlet":
            return True
    return False
