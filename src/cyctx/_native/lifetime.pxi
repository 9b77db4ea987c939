# Part of the _guard module (included by _guard.pyx): the lifetime policy of a primary retain
# that nothing closed. A guard the collector frees gives its retain to the process (one per
# device: the shared guard's own, else a slot here), so the context and what was made in it
# live on, as under CuPy, torch and cuda.core; and it warns ResourceWarning, as an unclosed file
# does.

# The process's retain of a device: the shared guard's own or, before there is one, the slot
# here (an atomic int: set by __dealloc__, which may make no Python call, drained by shared()
# when it publishes the device's shared guard). Ordinals past the slots release as before (and
# say so).
cdef extern from *:
    """
    static int cyctx_process_slot[64];
    static int cyctx_slot_take(int k) {  /* 1: this caller now holds the slot */
        int zero = 0;
        return __atomic_compare_exchange_n(&cyctx_process_slot[k], &zero, 1, 0,
                                           __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
    static int cyctx_slot_drain(int k) {  /* the retain the slot held (0 or 1), now 0 */
        return __atomic_exchange_n(&cyctx_process_slot[k], 0, __ATOMIC_SEQ_CST);
    }
    static int cyctx_slot_load(int k) { return __atomic_load_n(&cyctx_process_slot[k], __ATOMIC_SEQ_CST); }
    static void* cyctx_ptr_load(void** p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    static void cyctx_ptr_store(void** p, void* v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
    static int cyctx_ctx_publish(void** p, void* v) {  /* NULL -> v; 1 when this call did it */
        void* none = NULL;
        return __atomic_compare_exchange_n(p, &none, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    """
    int _slot_take "cyctx_slot_take"(int k) noexcept nogil
    int _slot_drain "cyctx_slot_drain"(int k) noexcept nogil
    int _slot_load "cyctx_slot_load"(int k) noexcept nogil
    void* _ptr_load "cyctx_ptr_load"(void** p) noexcept nogil
    void _ptr_store "cyctx_ptr_store"(void** p, void* v) noexcept nogil
    bint _ctx_publish "cyctx_ctx_publish"(void** p, void* v) noexcept nogil


cdef bint _hand_to_process(int ordinal) noexcept nogil:
    # From __dealloc__: True when the dying guard's primary retain now is the process's (the
    # caller keeps it); False when the process already holds one (the caller releases it).
    if ordinal < 0 or ordinal >= _FAST_ORDINALS:
        return False
    if _ptr_load(<void**>&_shared_fast[ordinal]) != NULL:
        return False  # the shared guard holds the process's retain
    if not _slot_take(ordinal):
        return False  # an earlier collected guard's retain is held already
    # A shared() publishing right now drains the slot after it publishes: look again, and
    # whoever drains the slot releases what it held, so one retain is held either way.
    if _ptr_load(<void**>&_shared_fast[ordinal]) != NULL and _slot_drain(ordinal):
        return False
    return True


cdef int _publish_shared(ContextGuard g, int ordinal) except -1:
    # shared()'s winner: the fast pointer, then the slot's retain, now redundant, released.
    if ordinal >= _FAST_ORDINALS:
        return 0
    _ptr_store(<void**>&_shared_fast[ordinal], <void*>g)
    if _slot_drain(ordinal):
        if driver_api().PrimaryCtxRelease(g._dev) != cydriver.CUresult.CUDA_SUCCESS:
            int_add(&g._extra_retains, 1)  # held by the shared guard instead: never leaked
    return 0


def process_retains(device):
    """Retains of ``device``'s primary context the process holds for guards the collector
    freed (0 or 1; the shared guard's own retain is not counted): for tests and diagnostics."""
    if type(device) is not int or device < 0:
        raise TypeError(f"process_retains takes a device ordinal, got {_inputs.shown(device)}")
    return _slot_load(device) if device < _FAST_ORDINALS else 0


cdef dict _collected_texts = {}  # the "stays" message per ordinal: made once, not per block


cdef int _warn_collected(int ordinal, bint destroyed) except -1:
    # From __dealloc__ (the interpreter is not finalizing): no reference to the dying guard.
    if destroyed:
        msg = (f"cyctx: a ContextGuard of device {ordinal} was released by garbage collection, "
               f"which destroyed device {ordinal}'s primary context (nothing else held it) and "
               f"freed everything made in it. Use `with cyctx.device({ordinal}):`, or keep the "
               f"guard and close() it")
    else:
        msg = _collected_texts.get(ordinal)
        if msg is None:
            msg = _collected_texts.setdefault(ordinal, (
                f"cyctx: a ContextGuard of device {ordinal} was released by garbage collection, "
                f"not close(): device {ordinal}'s primary context and what was made in it stay, "
                f"held by the process as `cyctx.device({ordinal})` holds them. To release at "
                f"once, close() the guard (or use contextlib.closing)"))
    if not _ignored_resource_warning(msg):
        warnings.warn(msg, ResourceWarning, stacklevel=1)
    return 0


# Whether warnings.warn(msg, ResourceWarning) would do nothing, decided as its filters decide
# (docs/guarantees.md: the warning shows under -X dev, -W, PYTHONWARNINGS, pytest): the first
# filter whose category and message match acts. Where that filter names a module or line, the
# answer depends on the code running (the collector runs anywhere): not decided here, warn
# decides. A warn that ends ignored still costs ~1 us, most of a temporary guard's cost; the
# decision is kept while warnings.filters is the same list with the same items. The kept state
# is one tuple (the list, its items then, msg -> ignored) in a dict: replaced whole, so threads
# deciding at once (free-threaded) never mix two states, and a decision made against an older
# one lands in that one, no longer read.
cdef dict _rw_state = {}
# 3.14+ may keep filters in a context variable (fixed at start-up): then warn always decides.
cdef bint _rw_context_aware = bool(getattr(__import__("sys").flags, "context_aware_warnings", 0))


cdef bint _ignored_resource_warning(str msg) except -1:
    if _rw_context_aware:
        return False
    filters = warnings.filters
    state = _rw_state.get(None)
    if state is None or filters is not state[0] or filters != state[1]:
        state = (filters, list(filters), {})
        _rw_state[None] = state
    items, decided = state[1], state[2]
    r = decided.get(msg)
    if r is None:
        r = False
        for action, text, category, module, lineno in items:
            if not issubclass(ResourceWarning, category):
                continue
            if text is not None and not text.match(msg):
                continue
            r = action == "ignore" and module is None and not lineno
            break
        else:
            r = warnings.defaultaction == "ignore"
        decided[msg] = r
    return r


def _drop_process_retains():
    """Release the retains the process holds for collected guards (for tests, which start each
    case from a driver with no such retain). Returns how many were released."""
    cdef int k, n = 0
    cdef const DriverApi* d = driver_api()
    cdef cydriver.CUdevice dev = 0
    if d == NULL or forked_after_cuda():
        return 0
    for k in range(_FAST_ORDINALS):
        if _slot_drain(k):
            check(d.DeviceGet(&dev, k), "cuDeviceGet")
            check(d.PrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")
            n += 1
    return n


cdef bint _primary_destroyed(cydriver.CUdevice dev) noexcept nogil:
    # After a release: is the primary context inactive now (the release was its last)?
    cdef unsigned int flags = 0
    cdef int active = 1
    cdef const DriverApi* d = driver_api()  # loaded: a guard was constructed
    if d.PrimaryCtxGetState(dev, &flags, &active) != cydriver.CUresult.CUDA_SUCCESS:
        return False
    return active == 0
