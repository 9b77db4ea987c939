"""Typed errors of cyctx.

Every driver failure becomes a :class:`DriverError` (or a subclass a user would catch)
carrying the ``CUresult`` as ``.code`` and its name as ``.name``, with a message that says
what happened and what to do. Misuse of a guard is a :class:`GuardError`.
"""

from cuda.bindings cimport cydriver

from cyctx._driver cimport DriverApi, driver_load

# The fork flags of _fork.h, read for the fork hint. Like _driver.h's table, each extension
# module has its own copy of them, so this one installs its own handler (both run at a fork).
cdef extern from "_fork.h" namespace "cyctx" nogil:
    int fork_child() noexcept
    int install_fork_handler()

if install_fork_handler() != 0:
    raise ImportError("cyctx: pthread_atfork failed; fork safety cannot be guaranteed")


class CyctxError(Exception):
    """Base class of every error cyctx raises on purpose."""


class GuardError(CyctxError):
    """A guard was misused: exit without enter, exit on another thread or out of order,
    use after close, closing a guard that is entered."""


class ForkError(CyctxError):
    """CUDA was used in the parent of this forked process; CUDA cannot be used in the child."""


class ContextResetWarning(RuntimeWarning):
    """A guard found its primary context reset (``cudaDeviceReset``/``cuDevicePrimaryCtxReset``)
    since it last looked, and re-activated it. Memory allocated before the reset is gone.

    Make it an error to have guards refuse instead:
    ``warnings.simplefilter("error", cyctx.ContextResetWarning)``.
    """


class DriverError(CyctxError):
    """A CUDA driver call failed.

    Attributes
    ----------
    code : int
        The ``CUresult`` value, e.g. 201.
    name : str
        Its name, e.g. ``"CUDA_ERROR_INVALID_CONTEXT"``.
    call : str or None
        The driver function that returned it.
    """

    def __init__(self, code, call=None, detail=None):
        self.code = int(code)
        self.name, description = error_name_and_string(self.code)
        self.call = call
        where = f"{call} failed: " if call else ""
        msg = f"{where}{self.name} ({self.code}): {description}"
        hint = detail or _hint(self.code)
        if hint:
            msg += f". {hint}"
        super().__init__(msg)

    def __reduce__(self):
        return (type(self), (self.code, self.call))


class InvalidContextError(DriverError):
    """CUDA_ERROR_INVALID_CONTEXT (201): the context is not usable on this thread."""


class ContextDestroyedError(InvalidContextError):
    """CUDA_ERROR_CONTEXT_IS_DESTROYED (709): the context was destroyed or reset."""


class NotInitializedError(DriverError):
    """CUDA_ERROR_NOT_INITIALIZED (3) or DEINITIALIZED (4)."""


class NoDeviceError(DriverError):
    """CUDA_ERROR_NO_DEVICE (100)."""


class InvalidDeviceError(DriverError, ValueError):
    """CUDA_ERROR_INVALID_DEVICE (101): the ordinal names no device. Also a ValueError."""


# Tables keyed by CUresult, written by name (the numbers are in the class docstrings above).
_HINTS = {
    cydriver.CUresult.CUDA_ERROR_INVALID_VALUE: "An argument was out of range for the driver",
    cydriver.CUresult.CUDA_ERROR_NOT_INITIALIZED:
        "The driver is not initialised in this process: call cuInit(0) first",
    cydriver.CUresult.CUDA_ERROR_DEINITIALIZED:
        "The driver is shutting down (interpreter exit?); no CUDA work can run now",
    cydriver.CUresult.CUDA_ERROR_STUB_LIBRARY:
        ("The libcuda.so.1 that was loaded is the toolkit's stub, not the driver: "
         "remove the stubs directory from LD_LIBRARY_PATH"),
    cydriver.CUresult.CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
        "The installed NVIDIA driver is older than this call needs: upgrade the driver",
    cydriver.CUresult.CUDA_ERROR_DEVICE_UNAVAILABLE:
        "The device is in use by another process or in exclusive/prohibited compute mode",
    cydriver.CUresult.CUDA_ERROR_NO_DEVICE:
        "No CUDA-capable device is visible: check the driver, CUDA_VISIBLE_DEVICES and nvidia-smi",
    cydriver.CUresult.CUDA_ERROR_INVALID_DEVICE:
        "The device ordinal does not exist: check cuDeviceGetCount and CUDA_VISIBLE_DEVICES",
    cydriver.CUresult.CUDA_ERROR_INVALID_CONTEXT:
        ("The context is not usable: it was destroyed, or it is a primary context that is "
         "inactive (never retained, released to zero, or reset by cudaDeviceReset). A "
         "cyctx.ContextGuard retains and activates it; `cyctx doctor` explains "
         "this thread's state"),
    cydriver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED:
        ("The context was destroyed (cuCtxDestroy, or its primary context was reset or "
         "released to zero) while this handle was still in use. Retain it again, e.g. with a "
         "new cyctx.ContextGuard"),
    cydriver.CUresult.CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
        "The driver and kernel module versions do not match: reboot or reinstall the driver",
    cydriver.CUresult.CUDA_ERROR_UNKNOWN:
        "The driver reported an unknown error; the GPU may need attention (nvidia-smi)",
}

# Fork is named only in a process that was forked: elsewhere it would send the reader after a
# cause that cannot be theirs (issue 11).
_FORKED_HINTS = {
    cydriver.CUresult.CUDA_ERROR_NOT_INITIALIZED:
        ("The driver is not initialised in this process, which is a forked child: if its "
         "parent used CUDA, CUDA cannot be used here. Start workers with the 'spawn' "
         "multiprocessing start method"),
}


def _hint(code):
    if fork_child() and code in _FORKED_HINTS:
        return _FORKED_HINTS[code]
    return _HINTS.get(code)


_CLASSES = {
    cydriver.CUresult.CUDA_ERROR_NOT_INITIALIZED: NotInitializedError,
    cydriver.CUresult.CUDA_ERROR_DEINITIALIZED: NotInitializedError,
    cydriver.CUresult.CUDA_ERROR_NO_DEVICE: NoDeviceError,
    cydriver.CUresult.CUDA_ERROR_INVALID_DEVICE: InvalidDeviceError,
    cydriver.CUresult.CUDA_ERROR_INVALID_CONTEXT: InvalidContextError,
    cydriver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED: ContextDestroyedError,
}


def error_name_and_string(code):
    """(name, description) of a CUresult, from the driver; works before cuInit."""
    cdef const char* name = NULL
    cdef const char* text = NULL
    cdef const DriverApi* api = NULL
    cdef cydriver.CUresult err = <cydriver.CUresult>code
    cdef char problem[512]  # unused: without a driver the names come from _FALLBACK_NAMES
    if driver_load(&api, problem, sizeof(problem)) == cydriver.CUresult.CUDA_SUCCESS:
        if api.GetErrorName(err, &name) != cydriver.CUresult.CUDA_SUCCESS:
            name = NULL
        if api.GetErrorString(err, &text) != cydriver.CUresult.CUDA_SUCCESS:
            text = NULL
    return (
        name.decode() if name != NULL else _FALLBACK_NAMES.get(int(code), f"CUresult({int(code)})"),
        text.decode() if text != NULL else "unrecognised error code",
    )


# Names of the codes cyctx itself reports when no driver could be loaded to ask.
_FALLBACK_NAMES = {
    cydriver.CUresult.CUDA_ERROR_STUB_LIBRARY: "CUDA_ERROR_STUB_LIBRARY",
    cydriver.CUresult.CUDA_ERROR_NO_DEVICE: "CUDA_ERROR_NO_DEVICE",
    cydriver.CUresult.CUDA_ERROR_NOT_FOUND: "CUDA_ERROR_NOT_FOUND",
    cydriver.CUresult.CUDA_ERROR_NOT_SUPPORTED: "CUDA_ERROR_NOT_SUPPORTED",
}


def driver_error(code, call=None, detail=None):
    """The DriverError subclass instance for ``code``."""
    return _CLASSES.get(int(code), DriverError)(code, call, detail)


cdef int raise_driver_error(cydriver.CUresult err, const char* call) except -1 with gil:
    raise driver_error(<int>err, call.decode() if call != NULL else None)


cdef int raise_load_error(cydriver.CUresult err, const char* problem) except -1 with gil:
    why = problem.decode(errors="replace") if problem != NULL else "unknown reason"
    if err == cydriver.CUresult.CUDA_ERROR_NO_DEVICE:
        fix = ("No NVIDIA driver is installed or visible here. On a GPU machine install the "
               "NVIDIA driver; without a GPU, use cyctx's simulated driver "
               "(cyctx.testing.use_simulated_driver, or `cyctx doctor --simulate`)")
    elif err == cydriver.CUresult.CUDA_ERROR_STUB_LIBRARY:
        fix = ("Remove the toolkit's stubs directory (e.g. /usr/local/cuda/lib64/stubs) from "
               "LD_LIBRARY_PATH so that the NVIDIA driver's libcuda.so.1 is found")
    else:
        fix = "The NVIDIA driver is too old for cyctx: install a driver of CUDA 12.0 or newer"
    raise driver_error(<int>err, "loading the CUDA driver", f"{why}. {fix}")
