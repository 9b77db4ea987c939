"""Test support: cyctx's simulated CUDA driver.

cyctx ships a C library with soname ``libcuda.so.1`` that models the driver's context
behaviour (primary-context refcounts and resets, the per-thread context stack, created
contexts, fork, error codes). cuda.bindings resolves every driver function through
``cuGetProcAddress_v2`` of whatever ``libcuda.so.1`` is loaded, so loading the simulated one
first (``RTLD_GLOBAL``, before any driver call) routes all driver calls to it -- cyctx's
and cuda.bindings' alike. The choice is per process and cannot be undone.

Example::

    from cyctx.testing import use_simulated_driver
    sim = use_simulated_driver(device_count=2)   # before anything calls the driver
    import cyctx
    g = cyctx.ContextGuard(1)
    assert sim.retain_count(1) == 1
"""

from __future__ import annotations

import ctypes
import os

# One lookup, shared with the pytest plugin, which must not import cyctx: it lives beside cyctx.
from _cyctx_libcuda import LOAD_ERRORS, exports, loaded_libcuda, loader_message

__all__ = [
    "Sim",
    "loaded_libcuda",
    "sim_library_path",
    "use_simulated_driver",
    "simulated",
    "real_driver_available",
]

loaded_libcuda.__module__ = __name__  # named where users import it from (docs, reprs)

_sim: Sim | None = None
# The device count was chosen for a script that may ask for its own (`cyctx trace --simulate`
# with no count): its first use_simulated_driver(n) takes n, if the driver is not initialised.
_count_open = False
# Set by `cyctx trace --simulate`: the count goes on to the script's child processes too.
_exported = False
_MAX_DEVICES = 64  # SIM_MAX_DEVICES of simdriver.c: cyctxsim_configure takes 1..64


def sim_library_path() -> str:
    """Path of the simulated ``libcuda.so.1`` (env ``CYCTX_SIM_LIBRARY`` overrides)."""
    path = os.environ.get("CYCTX_SIM_LIBRARY") or os.path.join(
        os.path.dirname(__file__), "_sim", "libcuda.so.1"
    )
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"simulated driver not found at {path}{_from_env()}; was cyctx built with its "
            f"build_ext?"
        )
    return path


def _from_env() -> str:
    return " (from CYCTX_SIM_LIBRARY)" if os.environ.get("CYCTX_SIM_LIBRARY") else ""


# The simulated driver's control API (src/cyctx/_sim/simdriver.h): name, restype, argtypes.
CONTROL_API: tuple[tuple[str, type | None, list[type]], ...] = (
    ("cyctxsim_is_simulated", ctypes.c_int, []),
    ("cyctxsim_configure", ctypes.c_int, [ctypes.c_int]),
    ("cyctxsim_device_count", ctypes.c_int, []),
    ("cyctxsim_retain_count", ctypes.c_int, [ctypes.c_int]),
    ("cyctxsim_primary_active", ctypes.c_int, [ctypes.c_int]),
    ("cyctxsim_stack_depth", ctypes.c_int, []),
    ("cyctxsim_live_contexts", ctypes.c_int, []),
    ("cyctxsim_reuse_handles", ctypes.c_int, [ctypes.c_int]),
    (
        "cyctxsim_inject_fault",
        ctypes.c_int,
        [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int],
    ),
    ("cyctxsim_clear_faults", None, []),
    ("cyctxsim_call_count", ctypes.c_longlong, [ctypes.c_char_p]),
    ("cyctxsim_stall", ctypes.c_int, [ctypes.c_char_p, ctypes.c_int]),
    ("cyctxsim_stall_at_return", ctypes.c_int, [ctypes.c_char_p, ctypes.c_int]),
    ("cyctxsim_stalled", ctypes.c_int, []),
    ("cyctxsim_unstall", None, []),
    ("cyctxsim_cudaSetDevice", ctypes.c_int, [ctypes.c_int]),
    ("cyctxsim_cudaDeviceReset", ctypes.c_int, []),
)


def declare_control_api(lib: ctypes.CDLL) -> None:
    """Give the control functions of a loaded simulated driver their C signatures."""
    for name, res, args in CONTROL_API:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


class Sim:
    """Handle on the loaded simulated driver: read its state, inject faults."""

    def __init__(self, lib: ctypes.CDLL, path: str):
        self._lib = lib
        self.path = path
        declare_control_api(lib)

    @property
    def device_count(self) -> int:
        """How many devices the simulated driver has."""
        return self._lib.cyctxsim_device_count()

    def retain_count(self, device: int) -> int:
        """The primary context's refcount on ``device``."""
        n = self._lib.cyctxsim_retain_count(device)
        if n < 0:
            raise ValueError(f"no simulated device {device}")
        return n

    def primary_active(self, device: int) -> bool:
        """Whether the primary context on ``device`` is active (created)."""
        n = self._lib.cyctxsim_primary_active(device)
        if n < 0:
            raise ValueError(f"no simulated device {device}")
        return bool(n)

    def stack_depth(self) -> int:
        """Depth of the calling thread's context stack."""
        return self._lib.cyctxsim_stack_depth()

    def live_contexts(self) -> int:
        """Contexts made by cuCtxCreate and not destroyed."""
        return self._lib.cyctxsim_live_contexts()

    def reuse_handles(self, on: bool = True) -> bool:
        """Whether ``cuCtxCreate`` gives a new context the handle of the created context
        destroyed last (off by default, as on the H200; other drivers do it): the new context
        has a new id, so only the id tells it from the old one. Returns the previous
        setting."""
        return bool(self._lib.cyctxsim_reuse_handles(int(bool(on))))

    def inject_fault(self, function: str, code: int, nth: int = 1, count: int = 1) -> None:
        """Make the ``nth`` next call of driver ``function`` (and ``count - 1`` after it)
        return ``code`` without any effect."""
        if self._lib.cyctxsim_inject_fault(function.encode(), nth, int(code), count) != 0:
            raise ValueError(f"bad fault: {function!r} nth={nth} code={code} count={count}")

    def clear_faults(self) -> None:
        """Drop every fault injected and not yet delivered."""
        self._lib.cyctxsim_clear_faults()

    def stall(self, function: str, nth: int = 1, at_return: bool = False) -> None:
        """Make the ``nth`` next call of driver ``function`` wait, on whatever thread makes
        it, until :meth:`unstall`; :meth:`stalled` says when a thread is held. It waits before
        it does anything, or with ``at_return`` once it has done its work, before it returns
        (and before a CUPTI subscriber hears of its exit): for the context calls a subscriber
        sees only."""
        arm = self._lib.cyctxsim_stall_at_return if at_return else self._lib.cyctxsim_stall
        if arm(function.encode(), nth) != 0:
            raise ValueError(
                f"bad stall: {function!r} nth={nth} at_return={at_return} (or one is armed already)"
            )

    def stalled(self) -> int:
        """Threads held by a stall now."""
        return self._lib.cyctxsim_stalled()

    def unstall(self) -> None:
        """Let the held call go on; disarm a stall that has not fired."""
        self._lib.cyctxsim_unstall()

    def cuda_set_device(self, device: int) -> int:
        """The runtime's ``cudaSetDevice(device)`` as a CUDA 12+ libcudart makes it, driver
        calls and all: the device's primary context made current, and retained by the runtime
        the first time. A trace sees the driver calls inside it. Returns the driver's code
        (0: success)."""
        return self._lib.cyctxsim_cudaSetDevice(device)

    def cuda_device_reset(self) -> int:
        """The runtime's ``cudaDeviceReset()``: the current device's primary context reset
        (a trace sees its "destroy starting" inside the call), the runtime's retain given up.
        Returns the driver's code (0: success)."""
        return self._lib.cyctxsim_cudaDeviceReset()

    def call_count(self, function: str | None = None) -> int:
        """Calls of ``function`` (all driver calls when None) since the library loaded."""
        return self._lib.cyctxsim_call_count(function.encode() if function else None)


def use_simulated_driver(device_count: int = 2) -> Sim:
    """Route this process's driver calls to the simulated driver; returns its :class:`Sim`.

    Must run before the first driver call (by cyctx, cuda.bindings, CuPy, ...). Calling it
    again with the same ``device_count`` returns the same Sim. Under ``cyctx trace --simulate``
    (no count) the first call, before the first driver call, sets the count. TypeError or ValueError when
    ``device_count`` is not an int from 1 to 64 (nothing is loaded); FileNotFoundError when
    the library is missing; RuntimeError when it does not load or is not the simulator
    (``CYCTX_SIM_LIBRARY`` names another library), when another driver library is loaded
    already, or when the simulated driver is in use with another number of devices.
    """
    global _sim, _count_open
    if isinstance(device_count, bool) or not isinstance(device_count, int):
        raise TypeError(
            f"device_count must be an int, got {type(device_count).__name__} {device_count!r}"
        )
    if not 1 <= device_count <= _MAX_DEVICES:
        raise ValueError(
            f"device_count must be from 1 to {_MAX_DEVICES} (the simulated driver's most), "
            f"got {device_count}"
        )
    if _sim is not None:
        if _count_open:
            _count_open = False
            if _sim._lib.cyctxsim_configure(device_count) == 0:  # refused once initialised
                _export_count(device_count)
        in_use = _sim.device_count
        if in_use != device_count:
            raise RuntimeError(
                f"the simulated driver is in use with {in_use} device(s) in this process; it "
                f"cannot be given {device_count}"
            )
        return _sim
    loaded = loaded_libcuda()
    path = sim_library_path()
    if loaded and os.path.realpath(loaded) != os.path.realpath(path):
        raise RuntimeError(
            f"a driver library is already loaded in this process ({loaded}); the simulated "
            f"driver must be selected before the first driver call"
        )
    try:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except LOAD_ERRORS as exc:
        raise RuntimeError(
            f"{path}{_from_env()} is not a library that loads: {loader_message(exc, path)}"
        ) from None
    # A library that loads but is not the simulator (another libcuda.so.1, an older build):
    # say so before any of its functions is called.
    missing = [name for name, _, _ in CONTROL_API if not exports(lib, name)]
    if missing:
        raise RuntimeError(
            f"{path}{_from_env()} is not cyctx's simulated driver: it has no {missing[0]}"
        )
    sim = Sim(lib, path)
    if lib.cyctxsim_configure(device_count) != 0 and sim.device_count != device_count:
        raise RuntimeError(f"simulated driver already initialised with {sim.device_count} devices")
    _sim = sim
    return sim


def _export_to_children() -> str | None:
    """For `cyctx trace --simulate`: the processes the script starts (a spawn pool, a
    subprocess) run on the same simulated driver, preloaded as ``libcuda.so.1`` with the same
    count, rather than on whatever driver their machine has (or none). Returns why not, where
    the library's path cannot be written in LD_PRELOAD (a space or ':' separates its items)."""
    global _exported
    if _sim is None:
        raise RuntimeError("the simulated driver is not loaded")
    path = os.path.realpath(_sim.path)
    if " " in path or ":" in path:
        return (
            f"the processes the script starts will not have the simulated driver: its path "
            f"({path}) holds a space or ':', which separate LD_PRELOAD's items"
        )
    preload = os.environ.get("LD_PRELOAD", "").split()
    if path not in preload:
        os.environ["LD_PRELOAD"] = " ".join([path, *preload])
    _exported = True
    _export_count(_sim.device_count)
    return None


def _export_count(n: int) -> None:
    if _exported:
        os.environ["CYCTX_SIM_DEVICES"] = str(n)


def _count_open_to_the_script() -> None:
    """For `cyctx trace --simulate` (no count): the simulated driver, loaded already, takes the
    count of the next use_simulated_driver(n), if the driver is not initialised by then."""
    global _count_open
    if _sim is None:
        raise RuntimeError("the simulated driver is not loaded")
    _count_open = True


def simulated() -> Sim | None:
    """The active :class:`Sim`, or None when the real driver (or none) is in use."""
    return _sim


def real_driver_available() -> bool:
    """True when a real NVIDIA driver loads and reports at least one device.

    Checked in a subprocess, so this process stays free to pick the simulated driver.
    """
    import subprocess
    import sys

    code = (
        "import ctypes,sys\n"
        "try: lib=ctypes.CDLL('libcuda.so.1')\n"
        "except OSError: sys.exit(1)\n"
        "n=ctypes.c_int(0)\n"
        "sys.exit(0 if lib.cuInit(0)==0 and lib.cuDeviceGetCount(ctypes.byref(n))==0\n"
        "         and n.value>0 else 1)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return subprocess.run([sys.executable, "-c", code], env=env, timeout=120).returncode == 0
