"""cyctx: safe, fast CUDA context guards for Python and nogil Cython.

``ContextGuard(device)`` retains a device's primary context, makes it current around driver
work and restores exactly what was current before. Errors are typed: :class:`CyctxError` is
the base, :class:`DriverError` carries the ``CUresult``. :func:`diagnose` reports the driver,
the runtime and this thread's context, and explains what is wrong (its records:
:mod:`cyctx.doctor`).
"""

import os
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal, Protocol, SupportsIndex, TypeVar

from cyctx._trace import Trace
from cyctx.doctor import Diagnosis

# What ContextGuard accepts (cyctx._inputs.SPELLINGS, one member per spelling there; docs/guarantees.md,
# "What a guard can be made from"): an ordinal
# (an int, or anything with __index__ but bool), or an object of cuda.core, CuPy, torch or
# cuda.bindings, recognised at run time by its type's module and name. The framework types are
# not imported here (cyctx never imports a framework), so they appear as these protocols; a
# str such as "0" matches none of them, so a type checker rejects it as the run time does.
class _CudaStream(Protocol):
    """Anything with the CUDA stream protocol, ``__cuda_stream__() -> (version, handle)``."""
    def __cuda_stream__(self) -> tuple[int, int]: ...

class _HasDeviceId(Protocol):
    """A cuda.core ``Device`` (its primary context) or ``Stream`` (its context)."""
    @property
    def device_id(self) -> int: ...

class _HasId(Protocol):
    """A ``cupy.cuda.Device``: its primary context."""
    @property
    def id(self) -> int: ...

class _HasPtr(Protocol):
    """A ``cupy.cuda.Stream``: its context."""
    @property
    def ptr(self) -> int: ...

class _HasCudaStream(Protocol):
    """A ``torch.cuda.Stream``: its context."""
    @property
    def cuda_stream(self) -> int: ...

class _HasHandle(Protocol):
    """A cuda.core ``Context`` or ``Stream``."""
    @property
    def handle(self) -> Any: ...

class _BindingsHandle(Protocol):
    """A cuda.bindings ``CUdevice`` (``CUcontext`` and the other handles have ``__index__``)."""
    def getPtr(self) -> int:
        """The handle's address."""

class _HasIndex(Protocol):
    """A ``torch.device("cuda", k)``: device k's primary context."""
    @property
    def index(self) -> int | None: ...
    @property
    def type(self) -> str: ...

DeviceLike = (
    SupportsIndex
    | _BindingsHandle
    | _CudaStream
    | _HasDeviceId
    | _HasId
    | _HasPtr
    | _HasCudaStream
    | _HasHandle
    | _HasIndex
)
"""What :class:`ContextGuard` accepts: a device ordinal, or a device, context or stream object of
cuda.bindings, cuda.core, CuPy or torch (recognised at run time by its type)."""

BUILD_INFO: dict[str, Any]
"""How this cyctx was built: the cuda-bindings whose types it was compiled with, Cython, Python."""
__version__: str
"""cyctx's version."""

class CyctxError(Exception):
    """Base class of every error cyctx raises on purpose."""

class GuardError(CyctxError):
    """A guard was misused: exit without enter, exit on another thread or out of order, use
    after close, closing a guard that is entered. Nothing was changed, except by a ``with``
    block left out of order: Python never leaves that block again, so its entry was removed
    and the block still open restores, when left, what was current before it."""

class ForkError(CyctxError):
    """CUDA was used in the parent of this forked process and cannot be used in the child.
    Start worker processes with the ``spawn`` start method."""

class ForkWarning(RuntimeWarning):
    """A process in which CUDA is initialised forks (warned in the parent once
    :func:`warn_on_fork` is called): the child cannot use CUDA. Names the CUDA libraries
    loaded and the fix, the 'spawn' start method."""

class ContextResetWarning(RuntimeWarning):
    """A guard found its primary context reset (``cudaDeviceReset``/``cuDevicePrimaryCtxReset``)
    since it last looked, and re-activated it. Memory allocated before the reset is gone.

    Make it an error to have guards refuse instead:
    ``warnings.simplefilter("error", cyctx.ContextResetWarning)``."""

class DriverError(CyctxError):
    """A CUDA driver call failed; the message says what happened and what to do."""

    code: int
    """The ``CUresult`` value, e.g. 201."""
    name: str
    """Its name, e.g. ``"CUDA_ERROR_INVALID_CONTEXT"``."""
    call: str | None
    """The driver function that returned it, when known."""
    def __init__(self, code: int, call: str | None = None, detail: str | None = None) -> None:
        """The error of ``CUresult`` ``code`` from driver function ``call``; ``detail``
        replaces the standard hint in the message."""

class InvalidContextError(DriverError):
    """``CUDA_ERROR_INVALID_CONTEXT`` (201): the context is not usable on this thread."""

class ContextDestroyedError(InvalidContextError):
    """``CUDA_ERROR_CONTEXT_IS_DESTROYED`` (709): the context was destroyed or reset."""

class NotInitializedError(DriverError):
    """``CUDA_ERROR_NOT_INITIALIZED`` (3) or ``CUDA_ERROR_DEINITIALIZED`` (4)."""

class NoDeviceError(DriverError):
    """``CUDA_ERROR_NO_DEVICE`` (100): the driver sees no CUDA device."""

class InvalidDeviceError(DriverError, ValueError):
    """``CUDA_ERROR_INVALID_DEVICE`` (101): the ordinal names no device. Also a ``ValueError``."""

class IncompatibleBindingsError(ImportError):
    """The installed cuda-bindings is older than this cyctx supports (``>=12.9``), or missing.
    ``fix``: the command that fixes it (also the end of the message)."""

    fix: str
    def __init__(self, message: str, fix: str = "") -> None:
        """``message`` says what is wrong; ``fix`` is the command that fixes it."""

class UntestedBindingsWarning(UserWarning):
    """The installed cuda-bindings is of a CUDA major newer than this cyctx was tested with
    (``<14``): guards work; the doctor and ``cimport cyctx`` builds may not."""

_F = TypeVar("_F", bound=Callable[..., Any])

class ContextGuard:
    """Retain a device's primary context; ``with guard:`` makes it current and restores.

    Construct it once and keep it: construction retains the primary context (which activates
    it), :meth:`close` releases it. Each ``with guard:`` makes the context current on the
    calling thread and, on leaving, restores exactly what was current before (no context
    included), also when the block raised or called ``cudaSetDevice``. One guard may be entered
    from many threads at once; each thread's entries are its own.

    Raises ``TypeError`` for what is not a device (``"0"``, ``None``, ``1.5``, ``True``),
    ``ValueError`` for a negative ordinal, :class:`InvalidDeviceError` for no such device,
    :class:`ForkError` in a forked child of a process that used CUDA, :class:`DriverError`
    when the driver fails."""

    def __init__(self, device: DeviceLike) -> None:
        """Retain ``device``'s primary context (for a context or stream object: refer to its
        context, which stays the caller's)."""
    @staticmethod
    def shared(device: DeviceLike) -> ContextGuard:
        """The process-wide guard of ``device`` (anything that names a device; a context or
        stream is a TypeError): made without a driver call, it retains at its first use (a
        ``with``, a call of a function it decorates, its handle), never closed. Thread-safe;
        the easy way to keep the primary context alive between blocks. Pickles as the
        receiving process's shared guard of the same device."""
    @staticmethod
    def from_handle(handle: SupportsIndex) -> ContextGuard:
        """A guard for an existing context given as an int handle (a ``CUcontext`` address);
        ``ContextGuard(int)`` means a device ordinal."""
    def __enter__(self) -> ContextGuard:
        """Make the guard's context current on this thread (no switch when it already is).
        Re-activates a reset primary context, warning :class:`ContextResetWarning`."""
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        """Restore what was current before the matching enter on this thread; never swallows
        the block's exception."""
    def close(self) -> None:
        """Release the retain taken at construction. Idempotent. :class:`GuardError` when the
        guard is entered on this thread or is a :meth:`shared` guard."""
    def __call__(self, func: _F) -> _F:
        """Decorate ``func``: each call runs inside ``with self:``. ``async def`` and generator
        functions are refused (``TypeError``)."""
    def __reduce__(self) -> tuple[Any, ...]:
        """A shared guard pickles as the receiving process's shared guard of its device; any
        other guard is a ``TypeError`` that says what to send instead."""
    def __copy__(self) -> ContextGuard:
        """A shared guard is its own copy; any other guard is a ``TypeError``."""
    def __deepcopy__(self, memo: Any) -> ContextGuard:
        """As :meth:`__copy__`."""
    @property
    def device(self) -> int:
        """The device ordinal."""
    @property
    def closed(self) -> bool:
        """True once :meth:`close` released the retain."""
    @property
    def is_shared(self) -> bool:
        """True for the process-wide guards of :meth:`shared`."""
    @property
    def is_primary(self) -> bool:
        """True when the guard holds a retain of a primary context; False for a context the
        caller owns (from ``cuCtxCreate`` or a green context)."""
    @property
    def handle(self) -> int:
        """The context's ``CUcontext`` as an int address. :class:`GuardError` when closed."""
    @property
    def context(self) -> Any:
        """The context as a ``cuda.bindings.driver.CUcontext``."""
    @property
    def context_id(self) -> int:
        """The driver's unique id of the context (``cuCtxGetId``) as enter last saw it."""
    @property
    def epoch(self) -> int | None:
        """The lifetime epoch of the guard's context now (:func:`context_epoch`); None while it
        is destroyed. GuardError when closed."""
    @property
    def resets(self) -> int:
        """How many resets of the primary context enter detected and re-activated."""

def trace(
    *, python_frames: int = 4, native_frames: int = 64, capacity: int = 16384, quiet: bool = False
) -> Trace:
    """Record every context change in the process while the returned trace is on
    (docs/tracing.md); loads nothing before it is called."""

def diagnose(
    cudart: str | bytes | os.PathLike[str] | os.PathLike[bytes] | bool | None = None,
    *,
    before_fork: bool = False,
) -> Diagnosis:
    """Report the CUDA driver, runtime, devices and the calling thread's context, and every CUDA
    library loaded in the process, with findings (:func:`cyctx.doctor.diagnose`). Changes no
    state; loads the doctor on the first call."""

def device(device: DeviceLike) -> ContextGuard:
    """The process's shared guard of ``device`` (:meth:`ContextGuard.shared`):
    ``with cyctx.device(0):`` and ``@cyctx.device(0)``."""

def current_handle() -> int:
    """The calling thread's current ``CUcontext`` as an int (0: none). One ``cuCtxGetCurrent``."""

def current_device() -> int | None:
    """The device of the calling thread's current context; None when none is current. Never
    initialises the driver or creates a context."""

def bind(fn: Any = None, device: DeviceLike | None = None) -> Any:
    """``fn`` bound to a context: each call runs inside it on whichever thread calls, restoring
    that thread's state after. ``bind(fn)``: the context current now; ``bind(fn, device=k)``
    and ``@bind(device=k)``: device k's primary context."""

def context_epoch(ctx: object) -> int | None:
    """The lifetime epoch of a context (its ``cuCtxGetId``): changes whenever the context behind
    a handle is reset, or destroyed and created again; None for a destroyed context. ``ctx``: a
    ContextGuard, an int handle, or a context or stream object ContextGuard accepts."""

def cuda_initialized() -> bool:
    """True when CUDA has been initialised in this process by any library; asks the
    ``libcuda.so.1`` already mapped, loading and initialising nothing (False when none is)."""

def warn_on_fork(enabled: bool = True) -> None:
    """Opt in: a fork while CUDA is initialised warns :class:`ForkWarning` in the parent."""

class relaxed_capture:
    """``with cyctx.relaxed_capture():`` runs the block with the calling thread's stream-capture
    mode relaxed; the thread's last such block to end puts back the mode it found."""

    def __enter__(self) -> relaxed_capture:
        """Relax this thread's mode (the first open block saves the mode it found)."""

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """The thread's last open block puts the saved mode back; never suppresses."""

def get_include() -> str:
    """cyctx's include directory (``cyctx/switch.h``), as ``numpy.get_include()`` gives numpy's."""

def get_include_dirs() -> list[str]:
    """Every include directory for compiling Cython code that cimports cyctx: :func:`get_include`
    and the directory of a ``cuda.h`` matching the installed cuda-bindings."""
