"""cyctx's doctor: a read-only report of the CUDA driver, runtime and contexts, with findings.

:func:`diagnose` looks at the process and the calling thread and explains, in plain words and
with the fix, the states that make mixed Runtime/Driver API code fail (docs/design.md, "The problem"): a current
handle to an inactive primary context, no current context, a primary context reset behind a
guard's back, a forked child. It only *queries*: cuInit, cuDriverGetVersion, cuDeviceGet*,
cuDevicePrimaryCtxGetState, cuCtxGetCurrent, and cuCtxGetId/GetDevice/GetApiVersion on the
current context and on the guards' handles, plus the runtime's cudaGetDevice (results/2026-11-30-lab/2026-11-30-gpu1.log:
"new thread, after cudaGetDevice cur=(nil)": it creates no context). It never retains, pushes
or sets a context.

``python -m cyctx doctor`` prints the report (see ``cyctx/__main__.py``); the step-by-step
demonstration of the classic failure is in ``cyctx/_demo.py``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import json
import os
import platform
import sys
import textwrap
import threading
from dataclasses import dataclass, field

__all__ = ["Diagnosis", "Finding", "diagnose", "find_cudart", "Cudart"]

SCHEMA = "cyctx.diagnosis/1"

# Exit statuses of `python -m cyctx doctor` (2 is argparse's usage error).
EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, EXIT_NO_CUDA = 0, 1, 2, 3

# CUresult codes the doctor reasons about (stable across CUDA versions).
_NOT_INITIALIZED, _NO_DEVICE, _INVALID_CONTEXT, _CONTEXT_IS_DESTROYED = 3, 100, 201, 709


# --- fork ---------------------------------------------------------------------------------
# In a child forked after CUDA was initialised in the parent, every driver call returns
# CUDA_ERROR_NOT_INITIALIZED (results/2026-11-30-lab/2026-11-30-gpu3.log, "child: ... cuInit r3"). The guard's C flags
# for that are not exposed to Python, so the doctor keeps its own: this hook runs in every
# child forked after this module was imported (cyctx imports it with the package).
_forked_from: int | None = None


def _after_fork_in_child() -> None:
    global _forked_from
    _forked_from = os.getppid()


os.register_at_fork(after_in_child=_after_fork_in_child)


# --- the report's data ----------------------------------------------------------------------

@dataclass
class Finding:
    """One thing the doctor recognised: what, why, and what to do.

    ``severity`` is ``"error"`` (driver calls fail or data was lost), ``"warning"`` (they
    will fail unless something is done first) or ``"unavailable"`` (no driver or no GPU).
    """

    code: str
    severity: str
    title: str
    explanation: str
    fix: str


@dataclass
class RuntimeInfo:
    """A ``libcudart``: where it is and what it says."""

    library: str
    source: str  # how it was found
    version: int | None = None  # cudaRuntimeGetVersion, e.g. 11080
    version_from: str | None = None  # "cudaRuntimeGetVersion" or the wheel it came with
    current_device: int | None = None  # cudaGetDevice on the calling thread
    note: str | None = None  # why current_device is missing, or a load error


@dataclass
class DeviceInfo:
    ordinal: int
    name: str | None = None
    compute_capability: tuple[int, int] | None = None
    pci_bus_id: str | None = None
    total_memory: int | None = None
    primary_active: bool | None = None
    primary_flags: int | None = None
    error: str | None = None


@dataclass
class ContextInfo:
    """The calling thread's current context (``handle`` 0: none)."""

    handle: int
    id: int | None = None
    id_error: str | None = None
    device: int | None = None
    primary: bool | None = None  # None: cannot be told without retaining it
    primary_why: str | None = None
    usable: bool | None = None
    api_version: int | None = None
    why: str | None = None  # why it is not usable
    error: str | None = None  # cuCtxGetCurrent failed


@dataclass
class GuardInfo:
    """A live :class:`cyctx.ContextGuard` and what the driver says about its context now."""

    device: int
    handle: int
    seen_id: int  # the id the guard last saw (at construction or its last enter)
    driver_id: int | None
    driver_id_error: str | None
    shared: bool
    primary: bool = True  # the guard retains a primary context (else the caller owns it)

    @property
    def reset(self) -> bool:
        """A primary context reset since the guard last saw it. Only a primary context is
        reset (and re-activated by the guard's next enter); a context the caller owns whose
        id changed or vanished was destroyed (see ``destroyed``)."""
        return self.primary and self.driver_id != self.seen_id

    @property
    def destroyed(self) -> bool:
        """The caller's context (cuCtxCreate, green) behind a guard was destroyed."""
        return not self.primary and self.driver_id != self.seen_id


@dataclass
class Diagnosis:
    """What :func:`diagnose` saw; ``str()`` gives the human report, :meth:`to_dict` the JSON one.

    Attributes
    ----------
    ok : bool
        True when no finding is an error and CUDA is usable.
    findings : list of Finding
        The recognised problems, worst first.
    simulated : bool
        The process runs on cyctx's simulated driver, not a GPU.
    """

    simulated: bool
    driver_library: str | None
    driver_version: int | None
    driver_error: str | None
    runtime: RuntimeInfo | None
    other_runtimes: list[RuntimeInfo]
    devices: list[DeviceInfo]
    thread_name: str
    thread_native_id: int
    context: ContextInfo | None
    guards: list[GuardInfo]
    findings: list[Finding]
    pid: int = field(default_factory=os.getpid)
    forked_from: int | None = None
    versions: dict[str, str | None] = field(default_factory=dict)

    @property
    def cuda_usable(self) -> bool:
        return not any(f.severity == "unavailable" for f in self.findings)

    @property
    def ok(self) -> bool:
        return not any(f.severity in ("error", "unavailable") for f in self.findings)

    @property
    def exit_status(self) -> int:
        """0 nothing wrong, 1 a problem was found, 3 no usable driver or GPU."""
        if any(f.severity == "error" for f in self.findings):
            return EXIT_PROBLEM
        return EXIT_OK if self.cuda_usable else EXIT_NO_CUDA

    def to_dict(self) -> dict:
        """The report as plain JSON-able data (schema ``cyctx.diagnosis/1``)."""
        asdict = dataclasses.asdict
        ctx = self.context
        return {
            "schema": SCHEMA,
            "ok": self.ok,
            "exit_status": self.exit_status,
            "simulated": self.simulated,
            "versions": dict(self.versions),
            "process": {"pid": self.pid, "forked_from": self.forked_from},
            "driver": {
                "library": self.driver_library,
                "version": self.driver_version,
                "version_str": _version_str(self.driver_version),
                "error": self.driver_error,
            },
            "runtime": asdict(self.runtime) if self.runtime else None,
            "other_runtimes": [asdict(r) for r in self.other_runtimes],
            "devices": [
                {
                    "ordinal": dev.ordinal,
                    "name": dev.name,
                    "compute_capability": (f"{dev.compute_capability[0]}.{dev.compute_capability[1]}"
                                           if dev.compute_capability else None),
                    "pci_bus_id": dev.pci_bus_id,
                    "total_memory": dev.total_memory,
                    "primary_context": {"active": dev.primary_active, "flags": dev.primary_flags},
                    "error": dev.error,
                }
                for dev in self.devices
            ],
            "thread": {
                "name": self.thread_name,
                "native_id": self.thread_native_id,
                # null: no current context (or the driver was not usable)
                "current_context": asdict(ctx) if ctx and (ctx.handle or ctx.error) else None,
                "runtime_current_device": self.runtime.current_device if self.runtime else None,
            },
            "guards": [{**asdict(g), "reset": g.reset} for g in self.guards],
            "findings": [asdict(f) for f in self.findings],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def render(self, colour: bool = False, width: int = 88, cli: bool = False) -> str:
        """The human report; ANSI colour when ``colour`` is true. ``cli``: the report is of
        the doctor's own new process (says so where that explains what is seen)."""
        return _render(self, _Style(colour), width, cli)

    def __str__(self) -> str:
        return self.render()


# --- small helpers ---------------------------------------------------------------------------

def _drv():
    # Imported on use: importing cuda.bindings.driver loads no driver, but keeping the
    # doctor's import free of it keeps `import cyctx` as cheap as it was.
    from cuda.bindings import driver

    return driver


def _call(fn, *args):
    """Call a cuda.bindings function: (code as int, value or tuple of values or None)."""
    res = fn(*args)
    if not isinstance(res, tuple):
        res = (res,)
    err, *vals = res
    return int(err), (vals[0] if len(vals) == 1 else tuple(vals) if vals else None)


def error_name(code: int) -> str:
    """``CUDA_ERROR_INVALID_CONTEXT (201)`` for 201; no driver call."""
    try:
        return f"{_drv().CUresult(code).name} ({code})"
    except Exception:  # a code this cuda-bindings does not know
        return f"CUresult {code}"


def _version_str(v: int | None) -> str | None:
    # CUDA encodes 1000 * major + 10 * minor (13000 -> 13.0, 11080 -> 11.8).
    return None if v is None else f"{v // 1000}.{(v % 1000) // 10}"


def _cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode(errors="replace").strip()


def simulated_driver_path() -> str | None:
    """Path of cyctx's simulated ``libcuda.so.1`` when it is this process's driver."""
    from cyctx import testing

    sim = testing.simulated()
    if sim is not None:
        return sim.path
    loaded = testing._loaded_libcuda()
    try:
        sim_path = testing.sim_library_path()
    except FileNotFoundError:
        return None
    if loaded and os.path.realpath(loaded) == os.path.realpath(sim_path):
        return loaded
    return None


# --- libcudart ------------------------------------------------------------------------------

class Cudart:
    """A ``libcudart`` loaded with ctypes: the few runtime calls the doctor and demo make.

    Every method returns the ``cudaError_t`` as an int. Loading it creates no context; the
    runtime initialises lazily at its first call that needs the driver.
    """

    simulated = False

    def __init__(self, path: str, source: str):
        self.path = path
        self.source = source
        self.lib = ctypes.CDLL(path)
        for name in ("cudaRuntimeGetVersion", "cudaGetDevice", "cudaSetDevice", "cudaFree",
                     "cudaDeviceReset"):
            getattr(self.lib, name).restype = ctypes.c_int
        self.lib.cudaFree.argtypes = [ctypes.c_void_p]
        self.lib.cudaSetDevice.argtypes = [ctypes.c_int]
        self.lib.cudaGetErrorName.restype = ctypes.c_char_p
        self.lib.cudaGetErrorName.argtypes = [ctypes.c_int]
        v = ctypes.c_int(0)
        # An 11.x runtime answers cudaErrorInsufficientDriver here when no driver loads.
        if self.lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0 and v.value:
            self.version, self.version_from = v.value, "cudaRuntimeGetVersion"
        else:
            self.version, self.version_from = _wheel_version(path)

    @property
    def label(self) -> str:
        return f"libcudart {_version_str(self.version) or '?'} ({self.path})"

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


def _wheel_version(path: str) -> tuple[int | None, str | None]:
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
    found = []
    for d in dirs:
        p = os.path.join(d or ".", "nvidia", "cuda_runtime", "lib", "libcudart.so.11.0")
        if os.path.isfile(p) and os.path.realpath(p) not in map(os.path.realpath, found):
            found.append(p)
    return found


def _loaded_cudart() -> str | None:
    """A libcudart already mapped in this process (torch's, CuPy's...): the one that
    matters for "what the runtime thinks"."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                name = line.split(None, 5)[-1].strip()
                if os.path.basename(name).startswith("libcudart.so"):
                    return name
    except OSError:
        pass
    return None


def find_cudart(path: str | None = None) -> tuple[str | None, str, str | None]:
    """Which libcudart to use: ``(path or None, how it was found, error)``.

    Order: ``path`` if given; one already loaded in this process; cuda-pathfinder's (the
    ``nvidia-cuda-runtime`` wheel of CUDA 12/13 or a toolkit; loading it creates no context).
    """
    if path:
        return path, "given", None
    loaded = _loaded_cudart()
    if loaded:
        return loaded, "already loaded in this process", None
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
    except (OSError, AttributeError) as exc:  # not loadable, or not a libcudart
        return None, f"cannot load {found}: {exc}"


# --- diagnose ---------------------------------------------------------------------------------

def diagnose(cudart: str | bool | None = None) -> Diagnosis:
    """Report the CUDA driver, runtime, devices and the calling thread's context, with findings.

    Changes no state: it only queries the driver (and the runtime's ``cudaGetDevice``); it never
    retains, pushes or sets a context. Safe in a forked child and on a machine without a GPU.

    Parameters
    ----------
    cudart : str, bool or None
        Which ``libcudart`` to ask for its version and current device: a path; None (default)
        for one already loaded in this process, else cuda-pathfinder's; False for none.

    Returns
    -------
    Diagnosis
        ``print()`` it for people, ``.to_json()`` for machines; ``.ok`` says whether anything
        is wrong, ``.findings`` what and how to fix it.

    Examples
    --------
    >>> import cyctx
    >>> report = cyctx.diagnose()
    >>> print(report)              # doctest: +SKIP
    >>> report.ok                  # doctest: +SKIP
    True
    """
    from importlib.metadata import PackageNotFoundError, version

    findings: list[Finding] = []
    sim_path = simulated_driver_path()
    versions = {"python": platform.python_version()}
    for dist in ("cyctx", "cuda-bindings"):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            versions[dist] = None
    t = threading.current_thread()
    diag = Diagnosis(
        simulated=False, driver_library=None, driver_version=None, driver_error=None,
        runtime=None, other_runtimes=[], devices=[], thread_name=t.name,
        thread_native_id=threading.get_native_id(), context=None, guards=[], findings=findings,
        forked_from=_forked_from, versions=versions,
    )

    d = _drv()
    try:
        err, _ = _call(d.cuInit, 0)
    except Exception as exc:  # cuda.bindings could not load libcuda.so.1 at all
        diag.driver_error = f"{type(exc).__name__}: {exc}"
        findings.append(_f_no_driver(diag.driver_error))
        _add_runtimes(diag, cudart, query_device=False)
        return diag
    from cyctx import testing

    diag.driver_library = sim_path or testing._loaded_libcuda()
    diag.simulated = sim_path is not None
    e, v = _call(d.cuDriverGetVersion)
    diag.driver_version = v if e == 0 else None

    if err == _NOT_INITIALIZED:
        # A forked child of a CUDA process: nothing else will answer, and the runtime would
        # only say the same (results/2026-11-30-lab/2026-11-30-gpu3.log, "cudaGetDevice r3"); stop here.
        diag.driver_error = error_name(err)
        findings.append(_f_fork(_forked_from))
        return diag
    if err != 0:
        diag.driver_error = error_name(err)
        findings.append(_f_no_device() if err == _NO_DEVICE else _f_driver_error("cuInit", err))
        _add_runtimes(diag, cudart, query_device=False)
        return diag

    e, n = _call(d.cuDeviceGetCount)
    for i in range(n if e == 0 else 0):
        diag.devices.append(_device_info(d, i))
    diag.guards = _guard_infos(d)
    diag.context = _context_info(d, diag.guards, diag.devices)
    _add_runtimes(diag, cudart, query_device=not diag.simulated)

    c = diag.context
    if c.error:
        findings.append(_f_driver_error("cuCtxGetCurrent", None, c.error))
    elif c.handle == 0:
        findings.append(_f_no_current(diag))
    elif not c.usable:
        inactive = c.primary is True or (c.primary is None and c.device is not None
                                          and diag.devices[c.device].primary_active is False)
        findings.append(_f_inactive_primary(c) if inactive else _f_dead_current(c))
    for g in diag.guards:
        if g.reset:
            findings.append(_f_reset(g))
        elif g.destroyed:
            findings.append(_f_guard_context_destroyed(g))
    order = {"unavailable": 0, "error": 1, "warning": 2}
    findings.sort(key=lambda f: order.get(f.severity, 3))
    return diag


def _device_info(d, i: int) -> DeviceInfo:
    info = DeviceInfo(ordinal=i)
    A = d.CUdevice_attribute
    e, dev = _call(d.cuDeviceGet, i)
    if e:
        info.error = f"cuDeviceGet: {error_name(e)}"
        return info
    e, name = _call(d.cuDeviceGetName, 256, dev)
    info.name = _cstr(name) if e == 0 else None
    e1, major = _call(d.cuDeviceGetAttribute, A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    e2, minor = _call(d.cuDeviceGetAttribute, A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    info.compute_capability = (major, minor) if e1 == e2 == 0 else None
    e, bus = _call(d.cuDeviceGetPCIBusId, 32, dev)
    info.pci_bus_id = _cstr(bus) if e == 0 else None
    e, mem = _call(d.cuDeviceTotalMem, dev)
    info.total_memory = int(mem) if e == 0 else None
    e, state = _call(d.cuDevicePrimaryCtxGetState, dev)
    if e == 0:
        info.primary_flags, info.primary_active = int(state[0]), bool(state[1])
    else:
        info.error = f"cuDevicePrimaryCtxGetState: {error_name(e)}"
    return info


def _guard_infos(d) -> list[GuardInfo]:
    from cyctx._guard import _live_guards

    out = []
    for g in _live_guards():
        if g.closed:
            continue
        h = g.handle
        # The handle value survives a reset, the id does not (docs/design.md "Reset", results/2026-11-30-lab/2026-11-30-gpu3.log): 709
        # means the context behind the handle is destroyed and the primary is inactive.
        e, cid = _call(d.cuCtxGetId, d.CUcontext(h))
        out.append(GuardInfo(
            device=g.device, handle=h, seen_id=g.context_id,
            driver_id=int(cid) if e == 0 else None,
            driver_id_error=error_name(e) if e else None, shared=g.is_shared,
            primary=g.is_primary,
        ))
    return sorted(out, key=lambda g: (g.device, g.handle))


def _context_info(d, guards: list[GuardInfo], devices: list[DeviceInfo]) -> ContextInfo:
    e, cur = _call(d.cuCtxGetCurrent)
    if e:
        return ContextInfo(handle=0, error=error_name(e))
    c = ContextInfo(handle=int(cur))
    if not c.handle:
        return c
    # Every query goes through NULL ("the current context"), not the handle: a context that
    # cuCtxDestroy freed on another thread stays current here, and passing its handle risks
    # a freed pointer. The H200 answers a dead current context -- an inactive primary or a
    # destroyed created one, alike -- with 709 from cuCtxGetApiVersion(NULL) and cuCtxGetId,
    # and cuCtxGetDevice still works (tests/differential/real_h200.json, reset_stale_current
    # and destroy_current_on_other_thread); the handle passed explicitly gives 201 (results/2026-11-30-lab/2026-11-30-gpu1.log).
    null = d.CUcontext(0)
    e, api = _call(d.cuCtxGetApiVersion, null)
    c.usable = e == 0
    c.api_version = int(api) if e == 0 else None
    if e:
        c.why = f"cuCtxGetApiVersion(NULL) fails with {error_name(e)}"
    e, cid = _call(d.cuCtxGetId, null)
    c.id, c.id_error = (int(cid), None) if e == 0 else (None, error_name(e))
    e, dev = _call(d.cuCtxGetDevice)
    c.device = int(dev) if e == 0 else None
    primary_active = devices[c.device].primary_active if c.device is not None and c.device < len(devices) else None
    # The driver has no query for "is this a primary context" short of retaining the primary
    # (which the doctor never does), so it is told from what is known.
    held = [g for g in guards if g.handle == c.handle and g.device == c.device]
    if any(g.primary for g in held):
        c.primary, c.primary_why = True, "a ContextGuard holds this handle as a primary context"
    elif held:
        c.primary, c.primary_why = False, (
            "a ContextGuard holds this handle as a context its caller owns (cuCtxCreate or green)")
    elif primary_active is False and c.usable:
        c.primary, c.primary_why = False, (
            "it is live while its device's primary context is inactive: made by cuCtxCreate")
    elif primary_active is True and not c.usable:
        c.primary, c.primary_why = False, (
            "it is dead while its device's primary context is active: a context destroyed "
            "with cuCtxDestroy")
    elif primary_active is False:
        c.primary_why = (
            "probably: it is dead and its device's primary context is inactive. The driver "
            "answers an inactive primary context and one destroyed with cuCtxDestroy alike")
    else:
        c.primary_why = "cannot tell without retaining the primary context, which the doctor never does"
    return c


def _add_runtimes(diag: Diagnosis, cudart, query_device: bool) -> None:
    if diag.simulated:
        diag.runtime = None  # a real libcudart cannot drive the simulated driver
    elif cudart is not False:
        rt, why = load_cudart(cudart if isinstance(cudart, str) else None)
        if rt is None:
            diag.runtime = RuntimeInfo(library="", source="", note=why)
        else:
            info = RuntimeInfo(library=rt.path, source=rt.source, version=rt.version,
                               version_from=rt.version_from)
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
            v, frm = _wheel_version(p)
            diag.other_runtimes.append(RuntimeInfo(
                library=p, source="nvidia-cuda-runtime-cu11 wheel", version=v, version_from=frm,
                note="not loaded; `python -m cyctx doctor --demo --cudart PATH` shows the classic "
                     "failure with it"))


# --- findings: the words ---------------------------------------------------------------------

_GUARD_FIX = ("create a guard once, `guard = cyctx.ContextGuard({dev})` (or `cyctx.ContextGuard.shared({dev})`), "
              "and make driver calls inside `with guard:`")


def _f_no_driver(error: str) -> Finding:
    return Finding(
        "no_driver", "unavailable", "No NVIDIA driver: this machine has no usable GPU for CUDA",
        f"libcuda.so.1, the NVIDIA driver's CUDA library, cannot be loaded ({error}). Nothing "
        f"in CUDA can run without it; this is normal on a machine without an NVIDIA GPU.",
        "On a GPU machine, install the NVIDIA driver. To try cyctx here, use its simulated driver: "
        "`python -m cyctx doctor --simulate` and `python -m cyctx doctor --demo --simulate`.",
    )


def _f_no_device() -> Finding:
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f"CUDA_VISIBLE_DEVICES is {vis!r}" if vis is not None else "CUDA_VISIBLE_DEVICES is not set"
    return Finding(
        "no_device", "unavailable", "The driver loads but finds no CUDA device",
        f"cuInit returned {error_name(_NO_DEVICE)}; {seen}.",
        "Check `nvidia-smi`; an empty or wrong CUDA_VISIBLE_DEVICES hides every GPU. "
        "Without a GPU, `python -m cyctx doctor --simulate` runs on cyctx's simulated driver.",
    )


def _f_driver_error(call: str, code: int | None, name: str | None = None) -> Finding:
    what = name or error_name(code)
    return Finding(
        "driver_error", "error", f"{call} failed with {what}",
        f"The driver answered {call} with {what}; the doctor cannot look further.",
        "Check the driver installation (`nvidia-smi`) and that the driver is at least as new as "
        "the CUDA version the program was built for.",
    )


def _f_fork(parent: int | None) -> Finding:
    known = (f"This process was forked from pid {parent}" if parent is not None
             else "This process is most likely a fork of one")
    return Finding(
        "forked_child", "error", "Forked child: use spawn",
        f"{known} after CUDA was initialised there. In such a child the driver refuses every "
        f"call, cuInit included, with {error_name(_NOT_INITIALIZED)}; nothing in this process "
        f"can fix that.",
        "Start worker processes with the 'spawn' start method: "
        "`multiprocessing.get_context('spawn')` or `multiprocessing.set_start_method('spawn')` "
        "(concurrent.futures: `ProcessPoolExecutor(mp_context=multiprocessing.get_context('spawn'))`). "
        "Or fork before anything initialises CUDA.",
    )


def _f_no_current(diag: Diagnosis) -> Finding:
    dev = next((g.device for g in diag.guards), 0)
    return Finding(
        "no_current_context", "warning", "No current context on this thread",
        "cuCtxGetCurrent returned NULL. The current context is per-thread state: every new thread "
        "starts without one, even when another thread called cudaSetDevice or entered a guard. "
        f"Driver calls that need a context fail here with {error_name(_INVALID_CONTEXT)}.",
        f"On each thread that calls the driver, {_GUARD_FIX.format(dev=dev)}. "
        "(Runtime-only code: call cudaSetDevice on each new thread.)",
    )


def _f_inactive_primary(c: ContextInfo) -> Finding:
    if c.primary:  # a guard holds it: it was reset inside the guard's block
        fix = ("A ContextGuard holds this context, so it was reset while the guard was entered: "
               "leave the `with guard:` block and enter it again; the enter re-activates the "
               "context (and warns ContextResetWarning). Memory and modules from before the reset "
               "are gone: recreate them.")
    else:
        fix = (f"Hold a retain on the primary context, which activates it: "
               f"{_GUARD_FIX.format(dev=c.device)}. Without cyctx: cuDevicePrimaryCtxRetain, or "
               f"cudaFree(0) right after cudaSetDevice on a pre-12 runtime. After a reset, memory "
               f"and modules from before it are gone: recreate them.")
    maybe = "" if c.primary else (
        " (A context made by cuCtxCreate and destroyed with cuCtxDestroy on another thread "
        "looks the same to the driver; if this program does that, see that first.)")
    return Finding(
        "inactive_primary_current", "error",
        f"The current context is device {c.device}'s primary context, and it is not active",
        f"cuCtxGetCurrent returns a non-NULL handle (0x{c.handle:x}) but the primary context "
        f"behind it is not created (cuDevicePrimaryCtxGetState: active=0), so driver calls "
        f"through it fail: {c.why}, and with the handle passed explicitly, as in the classic "
        f"report, {error_name(_INVALID_CONTEXT)}. Two things leave a thread like this: a CUDA "
        f"runtime older than 12.0, whose cudaSetDevice only binds the primary context to the "
        f"thread and creates it later, at the first runtime call that needs it; or "
        f"cudaDeviceReset / cuDevicePrimaryCtxReset (any CUDA version), which destroy the "
        f"context and leave its handle current.{maybe}",
        fix,
    )


def _f_dead_current(c: ContextInfo) -> Finding:
    return Finding(
        "dead_current_context", "error", "The current context is unusable",
        f"cuCtxGetCurrent returns 0x{c.handle:x}, but {c.why}. "
        + (f"It is not device {c.device}'s primary context (that one is active): " if c.primary is False else "")
        + f"a context destroyed with cuCtxDestroy on another thread stays current on this one, and "
        f"the driver answers {error_name(_CONTEXT_IS_DESTROYED)}.",
        "Drop the dead context, cuCtxSetCurrent(NULL) (or cuCtxPopCurrent), and make a live one "
        f"current for driver work: {_GUARD_FIX.format(dev=c.device if c.device is not None else 0)}.",
    )


def _f_guard_context_destroyed(g: GuardInfo) -> Finding:
    # Not a reset: only a primary context is reset and re-activated. A created or green
    # context destroyed by its owner is gone for good; the guard cannot bring it back.
    now = (f"the driver now answers {g.driver_id_error}" if g.driver_id is None
           else f"the driver now reports id {g.driver_id} for the handle: another context reuses it")
    return Finding(
        "guard_context_destroyed", "error",
        f"A ContextGuard's context (device {g.device}, not a primary context) was destroyed",
        f"A guard made from a context its caller owns (cuCtxCreate or a green context, handle "
        f"0x{g.handle:x}) last saw context id {g.seen_id}; {now}. Its owner destroyed it "
        f"(cuCtxDestroy, or cuGreenCtxDestroy) while the guard still refers to it. Such a "
        f"context is never re-activated: everything in it is gone.",
        "Close the guard (its next enter raises ContextDestroyedError), and make a new guard from "
        "a live context; keep the context alive for as long as any guard made from it is used.",
    )


def _f_reset(g: GuardInfo) -> Finding:
    now = (f"the driver now reports id {g.driver_id}: someone re-activated it since" if g.driver_id
           is not None else f"the driver now answers {g.driver_id_error}: the context is destroyed "
           f"and the primary context is inactive")
    return Finding(
        "context_reset", "error",
        f"Device {g.device}'s primary context was reset since a ContextGuard last saw it",
        f"A guard of device {g.device} (handle 0x{g.handle:x}) last saw context id {g.seen_id}; "
        f"{now}. cudaDeviceReset or cuDevicePrimaryCtxReset ran in between. The handle value is "
        f"reused across a reset, only the id tells. Everything allocated or loaded "
        f"in the old context (memory, modules, streams) is gone.",
        "Driver calls inside `with guard:` are safe: the next enter re-activates the context and "
        "warns ContextResetWarning. Recreate what was allocated before the reset, and find who "
        "resets the device (`-W error::cyctx.ContextResetWarning` stops at the next enter).",
    )


# --- rendering ------------------------------------------------------------------------------

class _Style:
    """ANSI styles, or nothing."""

    _CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}

    def __init__(self, colour: bool):
        self.colour = colour

    def __getattr__(self, name):
        code = self._CODES[name]
        return (lambda s: f"\x1b[{code}m{s}\x1b[0m") if self.colour else (lambda s: s)


def use_colour(stream) -> bool:
    """Colour only on a terminal, and never with NO_COLOR set (https://no-color.org)."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


SIM_TAG = "[SIMULATED]"


def sim_banner(path: str | None, extra: str = "") -> str:
    return (f"SIMULATED: every driver call here goes to cyctx's simulated driver ({path}), "
            f"not to a GPU.{extra} Nothing below describes real hardware.")


def _wrap(text: str, indent: str, width: int) -> str:
    return textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False)


_FLAG_NAMES = {1: "SCHED_SPIN", 2: "SCHED_YIELD", 4: "SCHED_BLOCKING_SYNC", 8: "MAP_HOST",
               0x10: "LMEM_RESIZE_TO_MAX", 0x20: "COREDUMP_ENABLE", 0x40: "USER_COREDUMP_ENABLE",
               0x80: "SYNC_MEMOPS"}


def flags_str(flags: int) -> str:
    names = [n for bit, n in _FLAG_NAMES.items() if flags & bit]
    return f"0x{flags:x} ({'|'.join(names) if names else 'SCHED_AUTO'})"


def _render(r: Diagnosis, s: _Style, width: int, cli: bool) -> str:
    tag = f"  {SIM_TAG}" if r.simulated else ""
    out = []

    def head(title):
        out.append("")
        out.append(s.bold(title) + (s.yellow(tag) if tag else ""))

    def kv(key, value):
        out.append(f"  {key:<18}{value}")

    out.append(s.bold("cyctx doctor: CUDA driver, runtime and context report") + (s.yellow(tag) if tag else ""))
    if r.simulated:
        out.append(s.yellow(_wrap(sim_banner(r.driver_library), "", width)))

    head("Versions")
    if r.driver_version is not None:
        kv("driver", f"CUDA {_version_str(r.driver_version)} ({r.driver_version})  {r.driver_library or ''}".rstrip())
    else:
        kv("driver", s.red("none: libcuda.so.1 cannot be loaded (see Findings)"))
    if r.simulated:
        kv("runtime", "not queried: a real libcudart cannot run on the simulated driver "
                      "(--demo uses a stand-in)")
    elif r.runtime is None:
        kv("runtime", "not queried")
    elif not r.runtime.library:
        kv("runtime", f"none loadable: {r.runtime.note}")
    else:
        rt = r.runtime
        ver = (f"CUDA {_version_str(rt.version)} ({rt.version}, from {rt.version_from})"
               if rt.version else "version unknown")
        kv("runtime", f"{ver}  {rt.library}  [{rt.source}]")
    for o in r.other_runtimes:
        kv("also found", f"CUDA {_version_str(o.version) or '?'} runtime  {o.library}  [{o.source}]")
    v = r.versions
    kv("packages", f"cyctx {v.get('cyctx')}, cuda-bindings {v.get('cuda-bindings')}, Python {v.get('python')}")
    kv("process", f"pid {r.pid}" + (f", forked from pid {r.forked_from}" if r.forked_from else ""))

    if r.driver_error is None:  # cuInit succeeded: there is a machine to describe
        head(f"Devices ({len(r.devices)})")
        for dev in r.devices:
            if dev.error and dev.name is None:
                out.append(f"  {dev.ordinal}  {s.red(dev.error)}")
                continue
            cc = f"cc {dev.compute_capability[0]}.{dev.compute_capability[1]}" if dev.compute_capability else "cc ?"
            mem = f"{dev.total_memory / 2**30:.0f} GiB" if dev.total_memory else "? GiB"
            if dev.primary_active is None:
                prim = s.red(dev.error or "?")
            else:
                prim = (s.green("active") if dev.primary_active else "inactive") + f", flags {flags_str(dev.primary_flags)}"
            out.append(f"  {dev.ordinal}  {dev.name}  {cc}  {dev.pci_bus_id}  {mem}")
            out.append(f"     primary context: {prim}")

        head(f"This thread: {r.thread_name} (native id {r.thread_native_id})")
        c = r.context
        if c is None or c.error:
            kv("current context", s.red(f"cuCtxGetCurrent failed: {c.error if c else '?'}"))
        elif c.handle == 0:
            kv("current context", "none (cuCtxGetCurrent returned NULL)")
            if cli:
                out.append(s.dim(_wrap(
                    "(expected here: the doctor runs in a new process. To see your program's "
                    "threads, call cyctx.diagnose() in it and print the result.)", "  ", width)))
        else:
            kv("current context", f"0x{c.handle:x}")
            kv("  id", str(c.id) if c.id is not None else s.red(f"none: {c.id_error}"))
            kv("  device", str(c.device) if c.device is not None else "?")
            prim = {True: "yes", False: "no", None: "unknown"}[c.primary]
            kv("  primary", f"{prim} ({c.primary_why})")
            kv("  usable", s.green(f"yes (cuCtxGetApiVersion: {c.api_version})") if c.usable else s.red(f"NO: {c.why}"))
        if r.simulated:
            kv("runtime device", "not queried (simulated driver)")
        elif r.runtime and r.runtime.current_device is not None:
            kv("runtime device", f"{r.runtime.current_device} (cudaGetDevice)")
        elif r.runtime:
            kv("runtime device", f"unknown: {r.runtime.note}")

        head("ContextGuards alive in this process")
        if not r.guards:
            out.append("  none")
        for g in r.guards:
            now = str(g.driver_id) if g.driver_id is not None else g.driver_id_error
            state = (s.red("RESET since last seen") if g.reset else
                     s.red("DESTROYED by its owner") if g.destroyed else s.green("unchanged"))
            kind = "" if g.primary else " (caller's context)"
            out.append(f"  device {g.device}{' (shared)' if g.shared else ''}{kind}  handle 0x{g.handle:x}  "
                       f"id seen {g.seen_id}, now {now}: {state}")

    head("Findings")
    if not r.findings:
        out.append("  " + s.green("nothing wrong"))
    for f in r.findings:
        label = {"error": s.red("ERROR"), "warning": s.yellow("WARNING"),
                 "unavailable": s.red("NO CUDA")}.get(f.severity, f.severity.upper())
        out.append(f"  {label}  {s.bold(f.title)}")
        out.append(_wrap(f.explanation, "      ", width))
        out.append(_wrap("Fix: " + f.fix, "      ", width))

    status = r.exit_status
    errors = sum(f.severity == "error" for f in r.findings)
    warnings = sum(f.severity == "warning" for f in r.findings)
    if status == EXIT_NO_CUDA:
        verdict = s.red("CUDA is not usable here")
    elif status == EXIT_PROBLEM:
        verdict = s.red(f"PROBLEMS FOUND: {errors} error{'s' if errors > 1 else ''}")
    else:
        verdict = s.green("OK") + (f", {warnings} warning{'s' if warnings > 1 else ''}" if warnings else "")
    out.append("")
    out.append(s.bold("Result") + (s.yellow(tag) if tag else "") + f": {verdict} (exit status {status})")
    return "\n".join(out)
