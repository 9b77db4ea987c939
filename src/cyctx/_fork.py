"""Whether CUDA is initialised in this process, asked of the driver already loaded, and the
opt-in warning before a fork of such a process.

Pure Python over ctypes: the ``libcuda.so.1`` that the process has mapped (whoever loaded it:
cuda.bindings, torch, CuPy, the runtime) is opened with ``RTLD_NOLOAD``, which returns it only
when it is loaded already, and asked ``cuDeviceGetCount``, which answers
``CUDA_ERROR_NOT_INITIALIZED`` until some library's ``cuInit`` succeeded. Nothing here loads a
library, calls ``cuInit`` or creates a context.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings

from _cyctx_libcuda import loaded_libcuda
from cyctx._errors import CUDA_ERROR_NOT_INITIALIZED, CyctxError, ForkWarning, driver_error

_GET_PROC = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64
)
_GET_COUNT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))
# The cudaVersion asked of cuGetProcAddress: cuDeviceGetCount's one variant dates from 2.0,
# and every driver cyctx supports (12.x and later) knows 12.0.
_PROC_VERSION = 12000


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        libc = ctypes.CDLL(None)  # the symbols already in the process: loads nothing
        libc.dlopen.restype = ctypes.c_void_p
        libc.dlopen.argtypes = [ctypes.c_char_p, ctypes.c_int]
        libc.dlsym.restype = ctypes.c_void_p
        libc.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        libc.dlclose.argtypes = [ctypes.c_void_p]
        _LIBC = libc
    return _LIBC


def _where() -> str:
    """The loaded driver's path, for a message (reads /proc/self/maps: error paths only)."""
    return loaded_libcuda() or "libcuda.so.1"


def cuda_initialized() -> bool:
    """True when a successful ``cuInit`` has been made in this process, by any library.

    Asked of the ``libcuda.so.1`` this process has mapped already: False when none is (then
    nobody has initialised CUDA here), and in a child forked after CUDA was initialised (the
    driver answers it ``CUDA_ERROR_NOT_INITIALIZED``: such a child cannot use CUDA). It loads
    nothing and initialises nothing. Any other answer of the driver raises its
    :class:`DriverError`: cyctx does not guess.
    """
    libc = _libc()
    # By soname, which the dynamic loader matches against every library loaded (the real
    # driver and the simulator alike): no read of /proc/self/maps on the common path.
    handle = libc.dlopen(b"libcuda.so.1", os.RTLD_NOLOAD | os.RTLD_LAZY)
    if not handle:  # none loaded (a file merely mapped is no library: nothing called into it)
        return False
    try:
        address = libc.dlsym(handle, b"cuGetProcAddress")
        if not address:
            raise CyctxError(f"{_where()} has no cuGetProcAddress: not a CUDA driver")
        fn = ctypes.c_void_p(0)
        e = _GET_PROC(address)(b"cuDeviceGetCount", ctypes.byref(fn), _PROC_VERSION, 0)
        if e != 0:
            raise driver_error(
                e,
                "cuGetProcAddress",
                f"looking up cuDeviceGetCount in {_where()}, so cyctx cannot "
                f"tell whether CUDA is initialised in this process",
            )
        if not fn.value:
            raise CyctxError(f"the driver {_where()} has no cuDeviceGetCount")
        count = ctypes.c_int(0)
        e = _GET_COUNT(fn.value)(ctypes.byref(count))
    finally:
        libc.dlclose(handle)  # the NOLOAD open took a reference: give it back
    if e == 0:
        return True
    if e == CUDA_ERROR_NOT_INITIALIZED:
        return False
    raise driver_error(
        e, "cuDeviceGetCount", "so cyctx cannot tell whether CUDA is initialised in this process"
    )


def cuda_libraries() -> list[str]:
    """The CUDA libraries mapped in this process (the doctor's census, without versions or
    distributions: cheap enough for a fork hook), the driver left out: the candidates for
    who initialised CUDA, since the driver does not record its caller."""
    from cyctx._census import kind_of, mapped_paths

    return [p for p in mapped_paths() if kind_of(p) not in (None, "driver")]


def fork_message(libraries: list[str]) -> str:
    if libraries:
        who = "; the CUDA libraries loaded in it, one of which did: " + ", ".join(
            os.path.basename(p) for p in libraries
        )
    else:
        who = "; no CUDA library but the driver is loaded, so the driver API was called directly"
    return (
        f"fork() of a process in which CUDA is initialised (pid {os.getpid()}){who}. The "
        f"forked child cannot use CUDA: every driver call in it fails with "
        f"CUDA_ERROR_NOT_INITIALIZED. Start worker processes with the 'spawn' start method: "
        f"multiprocessing.get_context('spawn'), or "
        f"ProcessPoolExecutor(mp_context=multiprocessing.get_context('spawn'))."
    )


def _before_fork() -> None:
    # Runs in the parent, inside os.fork(); an exception here (a filter that makes the warning
    # an error) is reported as unraisable by Python and the fork goes on.
    if not _enabled:
        return
    if cuda_initialized():
        # stacklevel 2: the line that called os.fork() (the hook is called from C)
        warnings.warn(ForkWarning(fork_message(cuda_libraries())), stacklevel=2)


_enabled = False
_installed = False
_lock = threading.Lock()


def warn_on_fork(enabled: bool = True) -> None:
    """From now on, a fork of this process while CUDA is initialised in it warns
    :class:`ForkWarning` in the parent, naming the CUDA libraries loaded and the fix.

    ``import cyctx`` installs nothing: this call does (``os.register_at_fork``, once, however
    often it is called). ``warn_on_fork(False)`` silences it again (Python cannot unregister a
    fork hook; the hook then does nothing). Every fork is checked: ``os.fork()``,
    multiprocessing's 'fork' start method, ``ProcessPoolExecutor`` with it.
    """
    global _enabled, _installed
    if not isinstance(enabled, bool):
        raise TypeError(f"warn_on_fork(enabled): a bool, not {type(enabled).__name__}")
    with _lock:
        if enabled and not _installed:
            os.register_at_fork(before=_before_fork)
            _installed = True
        _enabled = enabled
