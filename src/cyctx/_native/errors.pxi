# Part of the _guard module (included by _guard.pyx): the typed errors' native half (raising
# cyctx._errors' classes, naming codes through the driver).

# --- errors ------------------------------------------------------------------------------
# The classes and their words are cyctx._errors (pure Python), imported and raised here; what
# only this module can know, the driver's name for a code and whether this process is a forked
# child, reaches it through its one hook, _errors.connect_native, called below as this loads.

def _error_name_and_string(code):
    """(name, description) of a CUresult, from the driver; works before cuInit."""
    cdef const char* name = NULL
    cdef const char* text = NULL
    cdef const DriverApi* api = NULL
    cdef cydriver.CUresult err = <cydriver.CUresult>code
    cdef char problem[512]  # unused: without a driver the names come from the fallback
    if driver_load(&api, problem, sizeof(problem)) != cydriver.CUresult.CUDA_SUCCESS:
        return _errors.fallback_name_and_string(code)
    if api.GetErrorName(err, &name) != cydriver.CUresult.CUDA_SUCCESS:
        name = NULL
    if api.GetErrorString(err, &text) != cydriver.CUresult.CUDA_SUCCESS:
        text = NULL
    fallback_name, _ = _errors.fallback_name_and_string(code)
    return (
        name.decode() if name != NULL else fallback_name,
        # The driver was asked and does not know the code.
        text.decode() if text != NULL else "unrecognised error code",
    )


def _is_fork_child():
    return bool(fork_child())


_errors.connect_native(_error_name_and_string, _is_fork_child)


cdef int raise_driver_error(cydriver.CUresult err, const char* call) except -1 with gil:
    raise driver_error(<int>err, call.decode() if call != NULL else None)


cdef int raise_load_error(cydriver.CUresult err, const char* problem) except -1 with gil:
    raise _errors.load_error(<int>err, problem.decode(errors="replace") if problem != NULL else "unknown reason")


def load_problem():
    """None when cyctx can load the driver (a libcuda.so.1 of CUDA 12.0+ that is not the
    toolkit's stub), else (code, why): the CUresult and the reason a guard's error would give
    (its fix is cyctx._errors.load_fix(code)). For the doctor, so that both say the same. Calls
    no driver function but cuGetProcAddress."""
    cdef const DriverApi* api = NULL
    cdef char problem[512]
    problem[0] = 0
    cdef cydriver.CUresult err = driver_load(&api, problem, sizeof(problem))
    if err == cydriver.CUresult.CUDA_SUCCESS:
        return None
    why = problem.decode(errors="replace")
    return (<int>err, why[:1].upper() + why[1:])
