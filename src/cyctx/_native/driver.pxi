# Part of the _guard module (included by _guard.pyx): the driver as this module reaches it
# (the table of _cpp/driver.h, loaded once per process), and the device count with the fork
# check that every construction starts with.

# --- the driver -------------------------------------------------------------------------
# Every driver function is called through the table of _cpp/driver.h, resolved once per process
# at fixed ABI versions (not through cydriver's functions, so this build loads beside any
# cuda-bindings major; _cpp/driver.h says why). A guard's construction loads it, so enter/exit
# of a constructed guard find it loaded; the raw layer may run first and loads it itself.

cdef inline const DriverApi* _api() except NULL nogil:
    cdef const DriverApi* api = driver_api()
    if api != NULL:
        return api
    return _load_api()


cdef const DriverApi* _load_api() except NULL nogil:
    cdef const DriverApi* api = NULL
    cdef char problem[512]
    problem[0] = 0
    cdef cydriver.CUresult err = driver_load(&api, problem, sizeof(problem))
    if err != cydriver.CUresult.CUDA_SUCCESS:
        raise_load_error(err, problem)
        return NULL
    return api


# A thread left this many contexts pushed inside a guard from an empty stack: more than
# this and the driver is not behaving like a stack at all; stop rather than loop forever.
cdef enum:
    _MAX_UNWIND = 4096

# Re-activations a construction tries when resets on other threads keep deactivating the primary
# context it just retained: each try is a retain+release pair, so this only bounds a loop that a
# reset storm could otherwise keep going.
cdef enum:
    _MAX_REACTIVATIONS = 64


# The device count, fixed once cuInit has succeeded (the driver reads CUDA_VISIBLE_DEVICES there):
# later constructions skip cuInit and its GIL release (~200 ns of a temporary guard's cost).
cdef int _known_count = 0


cdef int _device_count() except -1:
    global _known_count
    cdef int n = 0
    cdef cydriver.CUresult err
    cdef const DriverApi* d = NULL
    if forked_after_cuda():
        _raise_fork()
    if _known_count:
        return _known_count
    with nogil:
        # Loading the driver and cuInit can take long the first time: not under the GIL.
        d = _api()
        err = d.Init(0)
    if err == cydriver.CUresult.CUDA_ERROR_NOT_INITIALIZED and fork_child():
        _raise_fork()  # CUDA was initialised in an ancestor by someone else (torch, CuPy...)
    check(err, "cuInit")
    mark_cuda_initialised()
    check(d.DeviceGetCount(&n), "cuDeviceGetCount")
    _known_count = n
    return n


cdef int _raise_fork() except -1 with gil:
    raise _errors.forked(os.getpid())
