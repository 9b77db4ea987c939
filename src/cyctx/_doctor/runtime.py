"""The CUDA runtime as the doctor and the demo see it: one protocol, two implementations.

:class:`Cudart` is a real ``libcudart`` loaded with ctypes; :class:`StandInRuntime` models one
on cyctx's simulated driver, where a real libcudart cannot run (it would load the real
``libcuda.so.1``). Also: which libcudart to use (:func:`find_cudart`), and what it says for
the report (:func:`add_runtimes`).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from typing import Any, Protocol

from _cyctx_libcuda import loader_message
from cyctx._doctor.cu import call, driver, error_name
from cyctx._doctor.model import RuntimeInfo, plausible_version, version_str
from cyctx._doctor.report import Diagnosis


class Runtime(Protocol):
    """The few runtime calls the doctor and the demo make. Each call returns its error code
    as an int, 0 for success (``cudaError_t`` for :class:`Cudart`; the stand-in answers with
    the driver's ``CUresult``, which its :meth:`error_name` names)."""

    simulated: bool  # a stand-in on the simulated driver, not a libcudart
    path: str
    source: str  # how it was found
    version: int | None  # e.g. 11080
    version_from: str | None  # "cudaRuntimeGetVersion", the wheel it came with, or "stand-in"

    @property
    def label(self) -> str:
        """One line naming the runtime, for the demo's header."""
        ...

    def error_name(self, code: int) -> str: ...

    def get_device(self) -> tuple[int, int]:
        """cudaGetDevice: (error, device)."""
        ...

    def set_device(self, device: int) -> int: ...

    def free0(self) -> int:
        """cudaFree(0): the runtime's first call that needs a context."""
        ...

    def device_reset(self) -> int: ...


class Cudart(Runtime):
    """A ``libcudart`` loaded with ctypes: the few runtime calls the doctor and demo make.

    Every method returns the ``cudaError_t`` as an int. Loading it creates no context; the
    runtime initialises lazily at its first call that needs the driver.
    """

    simulated = False

    def __init__(self, path: str, source: str) -> None:
        self.path = path
        self.source = source
        self.lib = ctypes.CDLL(path)
        for name in (
            "cudaRuntimeGetVersion",
            "cudaGetDevice",
            "cudaSetDevice",
            "cudaFree",
            "cudaDeviceReset",
        ):
            getattr(self.lib, name).restype = ctypes.c_int
        self.lib.cudaFree.argtypes = [ctypes.c_void_p]
        self.lib.cudaSetDevice.argtypes = [ctypes.c_int]
        self.lib.cudaGetErrorName.restype = ctypes.c_char_p
        self.lib.cudaGetErrorName.argtypes = [ctypes.c_int]
        v = ctypes.c_int(0)
        # An 11.x runtime answers cudaErrorInsufficientDriver here when no driver loads.
        # An answer that cannot be a version is not taken for one (the census notes it).
        if self.lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0 and plausible_version(v.value):
            self.version: int | None = v.value
            self.version_from: str | None = "cudaRuntimeGetVersion"
        else:
            self.version, self.version_from = wheel_version(path)

    @property
    def label(self) -> str:
        return f"libcudart {version_str(self.version) or '?'} ({self.path})"

    def error_name(self, code: int) -> str:
        name = self.lib.cudaGetErrorName(code)
        return f"{name.decode() if name else 'cudaError'} ({code})" if code else "cudaSuccess"

    def get_device(self) -> tuple[int, int]:
        dev = ctypes.c_int(-1)
        return self.lib.cudaGetDevice(ctypes.byref(dev)), dev.value

    def set_device(self, device: int) -> int:
        return self.lib.cudaSetDevice(device)

    def free0(self) -> int:
        return self.lib.cudaFree(None)

    def device_reset(self) -> int:
        return self.lib.cudaDeviceReset()


class StandInRuntime(Runtime):
    """The few ``libcudart`` calls the demo makes, modelled on the simulated driver.

    ``version < 12000`` models a pre-12 runtime: ``cudaSetDevice`` binds the primary context
    without creating it (docs/design.md, "The problem"). The simulated driver hands out a primary handle only
    through ``cuDevicePrimaryCtxRetain``, which activates it; releasing it again right away
    leaves, when nothing else holds it, the same handle inactive, and ``cuCtxSetCurrent``
    makes it current: the state a CUDA 11.8 ``cudaSetDevice`` leaves (docs/evidence.md, "Before
    CUDA 12.0, cudaSetDevice leaves the primary context inactive").
    ``version >= 12000``: ``cudaSetDevice`` initialises the context (the runtime's retain).
    The runtime's first real call (``cudaFree(0)``) takes that retain in both; ``cudaDeviceReset``
    is ``cuDevicePrimaryCtxReset`` plus the release of the runtime's retain.
    Return values are driver codes (0: success).
    """

    simulated = True

    def __init__(self, version: int = 11080) -> None:
        self.version = version
        self.version_from = "stand-in"
        self.path = "(Python stand-in)"
        self.source = "simulated"
        self._device = 0
        self._held: dict[int, object] = {}  # device -> primary handle the runtime retains

    @property
    def label(self) -> str:
        return f"stand-in runtime modelling libcudart {version_str(self.version)} (simulated)"

    def error_name(self, code: int) -> str:
        return "cudaSuccess" if code == 0 else error_name(code)

    def _retain(self, dev: int) -> tuple[int, Any]:
        d = driver
        if dev in self._held:
            return 0, self._held[dev]
        e, ctx = call(d.cuDevicePrimaryCtxRetain, dev)
        if e == 0:
            self._held[dev] = ctx
        return e, ctx

    def set_device(self, dev: int) -> int:
        d = driver
        if self.version < 12000 and dev not in self._held:
            e, ctx = call(d.cuDevicePrimaryCtxRetain, dev)
            if e == 0:
                e = call(d.cuDevicePrimaryCtxRelease, dev)[0]
        else:
            e, ctx = self._retain(dev)
        if e:
            return e
        self._device = dev
        return call(d.cuCtxSetCurrent, ctx)[0]

    def free0(self) -> int:
        d = driver
        e, ctx = self._retain(self._device)
        if e:
            return e
        e, cur = call(d.cuCtxGetCurrent)
        if e == 0 and int(cur) == 0:
            e = call(d.cuCtxSetCurrent, ctx)[0]
        return e

    def device_reset(self) -> int:
        d = driver
        e = call(d.cuDevicePrimaryCtxReset, self._device)[0]
        if self._held.pop(self._device, None) is not None:
            e = e or call(d.cuDevicePrimaryCtxRelease, self._device)[0]
        return e

    def get_device(self) -> tuple[int, int]:
        return 0, self._device


def wheel_version(path: str) -> tuple[int | None, str | None]:
    """CUDA version of a libcudart from the nvidia-cuda-runtime* wheel that installed it."""
    parts = os.path.realpath(path).split(os.sep)
    if "nvidia" not in parts:
        return None, None
    i = len(parts) - 1 - parts[::-1].index("nvidia")
    root, rel = os.sep.join(parts[:i]), "/".join(parts[i:])
    for info in glob.glob(os.path.join(root, "nvidia_cuda_runtime*.dist-info")):
        try:
            with open(os.path.join(info, "RECORD"), encoding="utf-8") as f:
                if not any(line.startswith(rel + ",") for line in f):
                    continue
        except OSError:
            continue
        ver = os.path.basename(info)[: -len(".dist-info")].rsplit("-", 1)[-1]
        try:
            major, minor = (int(x) for x in ver.split(".")[:2])
        except ValueError:
            continue
        return 1000 * major + 10 * minor, os.path.basename(info)[: -len(".dist-info")]
    return None, None


def cu11_candidates() -> list[str]:
    """``libcudart.so.11.0`` of the ``nvidia-cuda-runtime-cu11`` wheel, wherever sys.path
    has it (it is not found by cuda-pathfinder, which looks for the 12/13 layout)."""
    import site

    dirs = list(sys.path)
    try:
        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # some virtualenv flavours
        pass
    found: list[str] = []
    for d in dirs:
        p = os.path.join(d or ".", "nvidia", "cuda_runtime", "lib", "libcudart.so.11.0")
        if os.path.isfile(p) and os.path.realpath(p) not in map(os.path.realpath, found):
            found.append(p)
    return found


# The libcudart each diagnose() loaded itself (in a process that had none mapped), by real path
# -> how it was found: a later report still tells it from the program's, though it is mapped
# by then (the census marks it the doctor's; it is the runtime used only when the program has
# none).
_doctors_own: dict[str, str] = {}


def doctors_own() -> set[str]:
    """The real paths of the runtimes the doctor loaded itself, in this process."""
    return set(_doctors_own)


def _mapped_cudarts() -> list[str]:
    out = []
    try:
        with open("/proc/self/maps", "rb") as f:  # bytes: any mapped name, as os names it
            for line in f:
                name = os.fsdecode(line.split(None, 5)[-1].strip())
                if os.path.basename(name).startswith("libcudart.so") and name not in out:
                    out.append(name)
    except OSError:
        pass
    return out


def loaded_cudart() -> str | None:
    """A libcudart the program has mapped in this process (torch's, CuPy's...), not one the
    doctor loaded itself: the one that matters for "what the runtime thinks"."""
    return next((p for p in _mapped_cudarts() if os.path.realpath(p) not in _doctors_own), None)


def find_cudart(path: str | None = None) -> tuple[str | None, str, str | None]:
    """Which libcudart to use: ``(path or None, how it was found, error)``.

    Order: ``path`` if given; one already loaded in this process; cuda-pathfinder's (the
    ``nvidia-cuda-runtime`` wheel of CUDA 12/13 or a toolkit; loading it creates no context).
    A path given is the one used or the error: an empty one is refused, not taken for none.
    """
    if path is not None:
        return (path, "given", None) if path else (None, "given", "the path is empty")
    loaded = loaded_cudart()
    if loaded:
        return loaded, "already loaded in this process", None
    if _doctors_own:  # the program has none: the one an earlier diagnose() loaded
        own, how = next(iter(_doctors_own.items()))
        return own, f"{how}, loaded by an earlier diagnose()", None
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return load_nvidia_dynamic_lib("cudart").abs_path, "cuda-pathfinder", None
    except Exception as exc:  # not installed, or pathfinder's own errors
        return None, "cuda-pathfinder", f"{type(exc).__name__}: {exc}"


def load_cudart(path: str | None = None) -> tuple[Cudart | None, str | None]:
    """(Cudart, None) or (None, why not)."""
    found, source, err = find_cudart(path)
    if found is None:
        return None, f"no libcudart found ({source}: {err})"
    try:
        return Cudart(found, source), None
    except (OSError, AttributeError, UnicodeDecodeError) as exc:  # not loadable, or not a libcudart
        return None, f"cannot load {found}: {loader_message(exc, found)}"


def add_runtimes(diag: Diagnosis, cudart: str | bool | None, query_device: bool) -> None:
    """Fill ``diag.runtime`` (the libcudart ``cudart`` names, see :func:`diagnose`) and
    ``diag.other_runtimes`` (CUDA 11 runtimes installed beside it)."""
    if diag.simulated:
        diag.runtime = None  # a real libcudart cannot drive the simulated driver
    elif cudart is not False:
        mapped = {os.path.realpath(p) for p in _mapped_cudarts()}
        rt, why = load_cudart(cudart if isinstance(cudart, str) else None)
        if rt is not None and os.path.realpath(rt.path) not in mapped:
            _doctors_own[os.path.realpath(rt.path)] = rt.source
        if rt is None:
            diag.runtime = RuntimeInfo(library="", source="", note=why)
        else:
            info = RuntimeInfo(
                library=rt.path, source=rt.source, version=rt.version, version_from=rt.version_from
            )
            if not query_device:
                info.note = "cudaGetDevice not called: the driver is not usable"
            else:
                e, dev = rt.get_device()
                if e == 0:
                    info.current_device = dev
                else:
                    info.note = f"cudaGetDevice: {rt.error_name(e)}"
            diag.runtime = info
    used = os.path.realpath(diag.runtime.library) if diag.runtime and diag.runtime.library else None
    for p in cu11_candidates():
        if os.path.realpath(p) != used:
            v, frm = wheel_version(p)
            diag.other_runtimes.append(
                RuntimeInfo(
                    library=p,
                    source="nvidia-cuda-runtime-cu11 wheel",
                    version=v,
                    version_from=frm,
                    note="not loaded; `cyctx doctor --demo --cudart PATH` shows the classic "
                    "failure with it",
                )
            )
