"""cyctx: safe, fast CUDA context guards for Python and nogil Cython.

``ContextGuard(device)`` retains a device's primary context, makes it current around driver
work and restores exactly what was current before; see its docstring. Errors are typed:
:class:`CyctxError` is the base, :class:`DriverError` carries the ``CUresult``.
"""

from cyctx import _compat
from cyctx._compat import (
    IncompatibleBindingsError,
    UntestedBindingsWarning,
    check_bindings,
    installed_bindings_version,
)
from cyctx._version import __version__

try:
    from cyctx._build_info import BUILD_INFO
except ImportError as exc:  # running from a source tree that was never built
    raise ImportError(
        "cyctx is not built: install it with `pip install .` (or `pip install -e .`) "
        "instead of importing it from the source tree"
    ) from exc

try:
    check_bindings(installed_bindings_version())
except IncompatibleBindingsError:
    # The command line (`cyctx doctor`, `cyctx --version`) says this itself, as a finding;
    # the guards below do not use cuda-bindings, so they import all the same.
    if not _compat.command_line_running():
        raise

try:
    from cyctx._capture import relaxed_capture
    from cyctx._errors import (
        ContextDestroyedError,
        ContextResetWarning,
        CyctxError,
        DriverError,
        ForkError,
        ForkWarning,
        GuardError,
        InvalidContextError,
        InvalidDeviceError,
        NoDeviceError,
        NotInitializedError,
    )
    from cyctx._guard import (
        ContextGuard,
        context_epoch,
        current_device,
        current_handle,
        device,
    )
except ModuleNotFoundError as exc:
    raise ImportError(
        f"cyctx's compiled modules are missing ({exc}): importing cyctx from a source tree? "
        f"Install it with `pip install .` and import it from elsewhere"
    ) from exc


# The errors are defined in private modules but public here: tracebacks, reprs and pickles
# name them as users import them (`cyctx.NoDeviceError`, not `cyctx._errors.NoDeviceError`).
for _cls in (
    ContextDestroyedError,
    ContextResetWarning,
    CyctxError,
    DriverError,
    ForkError,
    ForkWarning,
    GuardError,
    IncompatibleBindingsError,
    InvalidContextError,
    InvalidDeviceError,
    NoDeviceError,
    NotInitializedError,
    UntestedBindingsWarning,
    relaxed_capture,
):
    _cls.__module__ = __name__
del _cls

__all__ = [
    "BUILD_INFO",
    "ContextDestroyedError",
    "ContextGuard",
    "ContextResetWarning",
    "CyctxError",
    "DriverError",
    "ForkError",
    "ForkWarning",
    "GuardError",
    "IncompatibleBindingsError",
    "InvalidContextError",
    "InvalidDeviceError",
    "NoDeviceError",
    "NotInitializedError",
    "UntestedBindingsWarning",
    "__version__",
    "bind",
    "context_epoch",
    "cuda_initialized",
    "current_device",
    "current_handle",
    "device",
    "diagnose",
    "get_include",
    "get_include_dirs",
    "relaxed_capture",
    "trace",
    "warn_on_fork",
]


def diagnose(cudart=None, *, before_fork=False):
    """Report the CUDA driver, runtime, devices, the calling thread's context and the CUDA
    libraries loaded in the process, with findings: :func:`cyctx.doctor.diagnose`, whose
    records are in :mod:`cyctx.doctor`. The doctor is loaded on the first call, not by
    ``import cyctx``. Changes no state. ``before_fork=True``, asked from a process about to
    fork: whether a forked child could use CUDA (the finding "CUDA is initialised; a forked
    child cannot use it"), without initialising CUDA where nobody has.
    """
    from cyctx.doctor import diagnose as _diagnose

    return _diagnose(cudart, before_fork=before_fork)


def trace(*, python_frames=4, native_frames=64, capacity=16384, quiet=False):
    """Record every context change in the process while the returned trace is on:
    ``with cyctx.trace() as t: ...``, then ``t.report()``, ``t.who_made_current()``,
    ``t.who_destroyed(handle)``, ``t.libraries_touching(device)``, ``t.to_json()``
    (``cyctx._trace.Trace``; docs/tracing.md). Each event names the call, the thread, the
    context before and after, and where it came from: the Python line, the library. Nothing of
    the tracer or of CUPTI is loaded before this is called. A trace that cannot subscribe
    (another profiler holds CUPTI, no libcupti, an older driver) says so in one line on stderr
    and changes nothing.
    """
    from cyctx._trace import trace as _trace

    return _trace(
        python_frames=python_frames, native_frames=native_frames, capacity=capacity, quiet=quiet
    )


def bind(fn=None, device=None):
    """``fn`` bound to a context: each call runs ``fn`` inside it, on whichever thread calls
    (a pool's worker, ``asyncio.to_thread``), and restores that thread's state after.

    ``bind(fn)`` binds the context current on this thread now (:class:`GuardError` when none
    is); ``bind(fn, device=k)`` and the decorator ``@cyctx.bind(device=k)`` bind device k's
    primary context through its shared guard. A call after a bound context (not a primary)
    was destroyed raises :class:`ContextDestroyedError`; a reset primary is re-activated, as a
    guard does. Async and generator functions are refused (TypeError), by the guard's
    decorator's rule. On a method it binds ``self``. Binding asks nothing of the driver (the
    device's shared guard retains at the first call). Pickles when bound to a device (as the
    same binding in the receiving process); bound to a context, it cannot.
    """
    from cyctx._bind import bind as _bind

    return _bind(fn, device)


def cuda_initialized() -> bool:
    """True when CUDA has been initialised in this process, by any library (a successful
    ``cuInit``), asked of the ``libcuda.so.1`` already mapped; False when none is mapped, or in
    a child forked after CUDA was initialised (it cannot use CUDA). Loads nothing and
    initialises nothing; another answer of the driver raises its :class:`DriverError`."""
    from cyctx._fork import cuda_initialized as _cuda_initialized

    return _cuda_initialized()


def warn_on_fork(enabled: bool = True) -> None:
    """Opt in (``import cyctx`` installs nothing): from now on a fork of this process while
    CUDA is initialised warns :class:`ForkWarning` in the parent, naming the CUDA libraries
    loaded and the fix (the 'spawn' start method). ``warn_on_fork(False)`` turns it off."""
    from cyctx._fork import warn_on_fork as _warn_on_fork

    _warn_on_fork(enabled)


def get_include() -> str:
    """cyctx's include directory (``cyctx/switch.h``, the C record behind ``Switch``, and a
    ``cuda.h`` that includes the next one on the path or says what to do where there is none),
    as ``numpy.get_include()`` gives numpy's: ``include_dirs=[cyctx.get_include(), ...]``.

    Cython code that cimports cyctx also needs the directory of a ``cuda.h`` (cuda.bindings'
    ``cydriver.pxd`` includes it): :func:`get_include_dirs` gives both.
    """
    import os

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def get_include_dirs() -> list[str]:
    """Every include directory for compiling Cython code that cimports cyctx.

    Two: :func:`get_include`, and the directory of a ``cuda.h`` that matches the installed
    cuda-bindings (from ``CUDA_HOME``/``CUDA_PATH`` or the ``nvidia-cuda-runtime`` wheel), which
    cuda.bindings' ``cydriver.pxd`` includes. Raises an error that says what to install when
    there is none, or when the installed cuda-bindings is one cyctx cannot build against.
    """
    from cyctx._cuda_headers import HeaderError, find_cuda_header

    try:
        header = find_cuda_header()
    except HeaderError as exc:
        note = _compat.untested_note(installed_bindings_version())
        if not note:
            raise
        raise HeaderError(f"{exc}{note}") from None
    return [get_include(), header.include_dir]
