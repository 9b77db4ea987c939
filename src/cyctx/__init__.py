"""cyctx: safe, fast CUDA context guards for Python and nogil Cython.

``ContextGuard(device)`` retains a device's primary context, makes it current around driver
work and restores exactly what was current before; see its docstring. Errors are typed:
:class:`CyctxError` is the base, :class:`DriverError` carries the ``CUresult``.
"""

from cyctx._compat import IncompatibleBindingsError, check_bindings, installed_bindings_version
from cyctx._version import __version__

try:
    from cyctx._build_info import BUILD_INFO
except ImportError as exc:  # running from a source tree that was never built
    raise ImportError(
        "cyctx is not built: install it with `pip install .` (or `pip install -e .`) "
        "instead of importing it from the source tree"
    ) from exc

check_bindings(installed_bindings_version())

try:
    from cyctx._errors import (
        ContextDestroyedError,
        ContextResetWarning,
        CyctxError,
        DriverError,
        ForkError,
        GuardError,
        InvalidContextError,
        InvalidDeviceError,
        NoDeviceError,
        NotInitializedError,
    )
    from cyctx._guard import ContextGuard, current_handle
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
    GuardError,
    IncompatibleBindingsError,
    InvalidContextError,
    InvalidDeviceError,
    NoDeviceError,
    NotInitializedError,
):
    _cls.__module__ = __name__
del _cls

__all__ = [
    "BUILD_INFO",
    "ContextDestroyedError",
    "ContextGuard",
    "ContextResetWarning",
    "ContextInfo",
    "CyctxError",
    "DeviceInfo",
    "Diagnosis",
    "DriverError",
    "Finding",
    "ForkError",
    "GuardError",
    "GuardInfo",
    "IncompatibleBindingsError",
    "InvalidContextError",
    "InvalidDeviceError",
    "LoadedLibrary",
    "NoDeviceError",
    "NotInitializedError",
    "RuntimeInfo",
    "__version__",
    "current_handle",
    "diagnose",
    "get_include",
]


_DOCTOR_NAMES = (
    "Diagnosis",
    "diagnose",
    "ContextInfo",
    "DeviceInfo",
    "Finding",
    "GuardInfo",
    "LoadedLibrary",
    "RuntimeInfo",
)


def __getattr__(name: str) -> object:
    # The doctor (cuda.bindings.driver, ctypes, its report and words) is imported on first
    # use, not with cyctx: code that only guards contexts never pays for it. Its records
    # (what a Diagnosis holds) are public under these names.
    if name in _DOCTOR_NAMES:
        from cyctx import _doctor

        value = getattr(_doctor, name)
        globals()[name] = value  # later lookups find it without coming here
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def get_include() -> list[str]:
    """Include directories for compiling Cython code that cimports cyctx.

    Two: cyctx's own (``cyctx/switch.h``, the C record behind ``Switch``), and the directory
    of a ``cuda.h`` that matches the installed cuda-bindings (from ``CUDA_HOME``/``CUDA_PATH``
    or the ``nvidia-cuda-runtime`` wheel), which cuda.bindings' ``cydriver.pxd`` includes.
    """
    import os

    from cyctx._cuda_headers import find_cuda_header

    return [
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "include"),
        find_cuda_header().include_dir,
    ]
