"""What the doctor recognises: :func:`diagnose` gathers the state (:mod:`.probe`,
:mod:`.runtime`) into a :class:`~.report.Diagnosis` and adds a :class:`~.model.Finding`, in
plain words and with the fix, for each problem it sees.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import threading

from cyctx._doctor import census
from cyctx._doctor.cu import (
    CONTEXT_IS_DESTROYED,
    INVALID_CONTEXT,
    NO_DEVICE,
    NOT_INITIALIZED,
    call,
    driver,
    error_name,
)
from cyctx._doctor.model import (
    ContextInfo,
    DeviceInfo,
    Finding,
    GuardInfo,
    LoadedLibrary,
    version_str,
)
from cyctx._doctor.probe import (
    context_info,
    device_info,
    forked_from,
    guard_infos,
    simulated_driver_path,
)
from cyctx._doctor.render import flags_str
from cyctx._doctor.report import Diagnosis
from cyctx._doctor.runtime import add_runtimes, wheel_version
from cyctx._errors import load_fix
from cyctx._guard import load_problem
from cyctx.testing import loaded_libcuda

# Distributions whose versions the report lists when they are installed (CuPy's wheels are
# named for their CUDA major).
FRAMEWORK_DISTRIBUTIONS = (
    "torch",
    "cupy",
    "cupy-cuda13x",
    "cupy-cuda12x",
    "cupy-cuda11x",
    "cuda-core",
    "numba-cuda",
    "jax-cuda13-plugin",
    "jax-cuda12-plugin",
)


def _cudart_path(cudart: object) -> str | bool | None:
    # bytes and os.PathLike are paths, as everywhere in the standard library; anything else
    # would otherwise fall through to the default lookup and report another runtime, silently.
    if cudart is None or isinstance(cudart, bool):
        return cudart
    if isinstance(cudart, (str, bytes, os.PathLike)):
        path = os.fsdecode(os.fspath(cudart))
        if not path:
            raise ValueError("diagnose(cudart=...): the path is empty; pass None for the default")
        return path
    raise TypeError(
        f"diagnose(cudart=...) takes a path (str, bytes or os.PathLike), None (find one) or "
        f"False (none), not {type(cudart).__name__}"
    )


def diagnose(
    cudart: str | bytes | os.PathLike[str] | os.PathLike[bytes] | bool | None = None,
    *,
    before_fork: bool = False,
) -> Diagnosis:
    """Report the CUDA driver, runtime, devices and the calling thread's context, and every CUDA
    library loaded in the process (the census), with findings.

    Changes no state: it only queries the driver (and the runtime's ``cudaGetDevice``); it never
    retains, pushes or sets a context. The census asks each loaded library its version through
    a handle already loaded, and loads nothing. Safe in a forked child and on a machine without
    a GPU.

    Parameters
    ----------
    cudart : str, bytes, os.PathLike, bool or None
        Which ``libcudart`` to ask for its version and current device: a path; None (default)
        for one already loaded in this process, else cuda-pathfinder's; False for none.
        Another type is a TypeError, an empty path a ValueError.
    before_fork : bool
        Asked from a process about to fork: whether a forked child could use CUDA. When CUDA
        is initialised already (by anyone: :func:`cyctx.cuda_initialized`) the report has the
        warning ``cuda_initialised_before_fork``, naming the CUDA libraries loaded and the fix.
        When it is not, the doctor does not initialise it either (no ``cuInit``, so no devices
        or contexts are described) and says so in the finding ``fork_safe``.

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
    if not isinstance(before_fork, bool):
        raise TypeError(f"diagnose(before_fork=...): a bool, not {type(before_fork).__name__}")
    cudart = _cudart_path(cudart)
    initialised = None  # not asked
    if before_fork:
        from cyctx._errors import CyctxError
        from cyctx._fork import cuda_initialized

        try:  # before any of the doctor's own calls: its cuInit would make the answer True
            initialised = cuda_initialized()
        except CyctxError:
            pass  # an unusable driver: the report below says what is wrong with it
    # What was mapped before the doctor's own work: a runtime its lookup loads (cudart=None
    # in a process with none) is marked as the doctor's in the census, not the program's.
    before = census.mapped_paths()
    diag = _diagnose(cudart, init=initialised is not False)
    if initialised is not None:
        from cyctx._fork import cuda_libraries

        diag.findings.append(_f_fork_ahead(cuda_libraries()) if initialised else _f_fork_safe())
    diag.loaded = census.census(before, fallback_version=wheel_version)
    loaded = {os.path.realpath(lib.path) for lib in diag.loaded}
    for o in diag.other_runtimes:
        if os.path.realpath(o.library) in loaded:
            o.note = "loaded in this process (see the census, Diagnosis.loaded)"
    diag.findings.extend(census_findings(diag))
    _cite_trace(diag)
    order = {"unavailable": 0, "error": 1, "warning": 2, "info": 3}
    diag.findings.sort(key=lambda f: order.get(f.severity, 4))
    return diag


def _diagnose(cudart: str | bool | None, init: bool = True) -> Diagnosis:
    from importlib.metadata import PackageNotFoundError, version

    findings: list[Finding] = []
    sim_path = simulated_driver_path()
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("cyctx", "cuda-bindings"):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            versions[dist] = None
    # The frameworks that make contexts current in this environment, only those installed:
    # read from their metadata, never imported (importing torch or CuPy can touch the driver).
    for dist in FRAMEWORK_DISTRIBUTIONS:
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            pass
    t = threading.current_thread()
    diag = Diagnosis(
        simulated=False,
        driver_library=None,
        driver_version=None,
        driver_error=None,
        runtime=None,
        other_runtimes=[],
        devices=[],
        thread_name=t.name,
        thread_native_id=threading.get_native_id(),
        context=None,
        guards=[],
        findings=findings,
        forked_from=forked_from(),
        versions=versions,
    )

    d = driver
    # First the way a guard loads the driver (cyctx._guard.load_problem): a stub, a driver
    # older than CUDA 12.0 or a library that is not a complete driver get the diagnosis of
    # cyctx's own error, not cuda.bindings' failure to find a function.
    problem = load_problem()
    if problem is not None and problem[0] != NO_DEVICE:
        code, why = problem
        diag.driver_library = loaded_libcuda()
        diag.driver_error = f"{error_name(code)}: {why}"
        findings.append(_f_unusable_library(code, why, diag.driver_library))
        add_runtimes(diag, cudart, query_device=False)
        return diag
    try:
        # init=False: a process about to fork that nobody initialised CUDA in; loading the
        # driver (cuDriverGetVersion's first call) leaves a child free to use it, cuInit not.
        err, _ = call(d.cuInit, 0) if init else call(d.cuDriverGetVersion)
    except Exception as exc:  # cuda.bindings could not load libcuda.so.1 at all
        diag.driver_error = f"{type(exc).__name__}: {exc}"
        findings.append(_f_no_driver(diag.driver_error))
        add_runtimes(diag, cudart, query_device=False)
        return diag
    diag.driver_library = sim_path or loaded_libcuda()
    diag.simulated = sim_path is not None
    e, v = call(d.cuDriverGetVersion)
    diag.driver_version = v if e == 0 else None
    if not init:
        diag.driver_error = (
            f"{error_name(NOT_INITIALIZED)}: not initialised, and the doctor asked before a "
            f"fork does not initialise it"
        )
        add_runtimes(diag, cudart, query_device=False)
        return diag

    if err == NOT_INITIALIZED:
        # A forked child of a CUDA process: nothing else will answer, and the runtime would
        # only say the same (docs/evidence.md, "A forked child gets CUDA_ERROR_NOT_INITIALIZED
        # from every call"); stop here.
        diag.driver_error = error_name(err)
        findings.append(_f_fork(diag.forked_from))
        return diag
    if err != 0:
        diag.driver_error = error_name(err)
        findings.append(
            _f_no_device() if err == NO_DEVICE else _f_driver_error("cuInit", error_name(err))
        )
        add_runtimes(diag, cudart, query_device=False)
        return diag

    e, n = call(d.cuDeviceGetCount)
    for i in range(n if e == 0 else 0):
        diag.devices.append(device_info(i))
    diag.guards = guard_infos()
    c = diag.context = context_info(diag.guards, diag.devices)
    add_runtimes(diag, cudart, query_device=not diag.simulated)

    if c.error:
        findings.append(_f_driver_error("cuCtxGetCurrent", c.error))
    elif c.handle == 0:
        findings.append(_f_no_current(diag))
    elif not c.usable:
        inactive = c.primary is True or (
            c.primary is None
            and c.device is not None
            and diag.devices[c.device].primary_active is False
        )
        findings.append(_f_inactive_primary(c) if inactive else _f_dead_current(c))
    elif c.primary is False and not any(g.handle == c.handle for g in diag.guards):
        # Live and told apart from the primary context without retaining it; a context the
        # caller gave a guard is theirs on purpose.
        findings.append(_f_not_primary(c))
    for g in diag.guards:
        if g.reset:
            findings.append(_f_reset(g))
        elif g.destroyed:
            findings.append(_f_guard_context_destroyed(g))
    for dev in diag.devices:
        if dev.primary_active and dev.primary_flags:
            findings.append(_f_primary_flags(dev))
    return diag


_CURRENT_CODES = ("inactive_primary_current", "dead_current_context", "current_not_primary")


def _cite_trace(diag: Diagnosis) -> None:
    """With a cyctx trace running in the process (cyctx.trace()), each finding about the current
    context names the traced call that made it current, and a reset guard's the call that
    destroyed its context: the trace's events so far. Nothing is loaded when none runs."""
    mod = sys.modules.get("cyctx._trace")
    t = getattr(mod, "_running", None) if mod is not None else None
    if mod is None or t is None or not t.active:
        return
    events = t.snapshot()
    c = diag.context
    for i, f in enumerate(diag.findings):
        cite = None
        if f.code in _CURRENT_CODES and c is not None:
            made = mod.made_current_by(events, diag.thread_native_id, c.handle)
            if made is not None:
                cite = f"The running trace saw it made current by {made.describe()}"
                gone = [
                    e
                    for e in events[events.index(made) + 1 :]
                    if e.call == "context destroy starting"
                    and e.target is not None
                    and e.target.handle == c.handle
                ]
                cite += f", then destroyed: {gone[-1].describe()}." if gone else "."
        elif f.code == "context_reset":
            g = next((g for g in diag.guards if f"0x{g.handle:x}" in f.explanation), None)
            gone = [
                e
                for e in events
                if g is not None
                and e.call == "context destroy starting"
                and e.target is not None
                and e.target.handle == g.handle
            ]
            if gone:
                cite = f"The running trace saw it reset: {gone[-1].describe()}."
        if cite:
            diag.findings[i] = dataclasses.replace(f, explanation=f"{f.explanation} {cite}")


def census_findings(diag: Diagnosis) -> list[Finding]:
    """What the census shows: runtimes that do not fit the driver or each other."""
    out = []
    runtimes = [lib for lib in diag.loaded if lib.kind == "runtime" and lib.version]
    version = {id(lib): lib.version or 0 for lib in runtimes}  # each is set (filtered above)
    drv = diag.driver_version
    for lib in runtimes:
        if drv and version[id(lib)] // 1000 > drv // 1000:
            out.append(_f_runtime_newer(lib, drv))
    # The program's own: a runtime the doctor's lookup loaded is no part of the mix.
    own = [lib for lib in runtimes if not lib.by_doctor]
    if len({version[id(lib)] // 1000 for lib in own}) > 1:
        out.append(_f_mixed_majors(own))
    old = [lib for lib in own if version[id(lib)] < 12000]
    if old:  # the fix: the driver's major, or 12 (the first after the classic failure)
        out.append(_f_cuda11_loaded(old, max(12, (drv or 0) // 1000)))
    return out


# --- the words ---------------------------------------------------------------------------------

_GUARD_FIX = (
    "create a guard once, `guard = cyctx.ContextGuard({dev})` (or `cyctx.ContextGuard.shared({dev})`), "
    "and make driver calls inside `with guard:`"
)


def _f_no_driver(error: str) -> Finding:
    return Finding(
        "no_driver",
        "unavailable",
        "No NVIDIA driver: this machine has no usable GPU for CUDA",
        f"libcuda.so.1, the NVIDIA driver's CUDA library, cannot be loaded ({error}). Nothing "
        f"in CUDA can run without it; this is normal on a machine without an NVIDIA GPU.",
        "On a GPU machine, install the NVIDIA driver. To try cyctx here, use its simulated driver: "
        "`cyctx doctor --simulate` and `cyctx doctor --demo --simulate`.",
    )


# The libraries cyctx cannot use, by the CUresult its loader reports (_cpp/driver.h, driver_load).
_UNUSABLE = {
    34: (
        "driver_stub",
        "The libcuda.so.1 that loads is the CUDA toolkit's stub, not the NVIDIA driver",
    ),
    801: (
        "driver_too_old",
        "The NVIDIA driver is too old: cyctx needs a driver of CUDA 12.0 or newer",
    ),
    500: ("driver_incomplete", "The libcuda.so.1 that loads is not a complete NVIDIA driver"),
}


def _f_unusable_library(code: int, why: str, path: str | None) -> Finding:
    # The words of cyctx's own error (cyctx._guard.raise_load_error): the reason and the fix.
    fid, title = _UNUSABLE.get(code, ("driver_unusable", "The CUDA driver library cannot be used"))
    where = f" ({path})" if path else ""
    return Finding(
        fid,
        "unavailable",
        title,
        f"Loading libcuda.so.1{where} as a ContextGuard does fails with {error_name(code)}. "
        f"{why}. Nothing in CUDA can run with this library.",
        load_fix(code) + ".",
    )


def _f_no_device() -> Finding:
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = (
        f"CUDA_VISIBLE_DEVICES is {vis!r}" if vis is not None else "CUDA_VISIBLE_DEVICES is not set"
    )
    return Finding(
        "no_device",
        "unavailable",
        "The driver loads but finds no CUDA device",
        f"cuInit returned {error_name(NO_DEVICE)}; {seen}.",
        "Check `nvidia-smi`; an empty or wrong CUDA_VISIBLE_DEVICES hides every GPU. "
        "Without a GPU, `cyctx doctor --simulate` runs on cyctx's simulated driver.",
    )


def _f_driver_error(call: str, what: str) -> Finding:
    return Finding(
        "driver_error",
        "error",
        f"{call} failed with {what}",
        f"The driver answered {call} with {what}; the doctor cannot look further.",
        "Check the driver installation (`nvidia-smi`) and that the driver is at least as new as "
        "the CUDA version the program was built for.",
    )


def _f_fork(parent: int | None) -> Finding:
    known = (
        f"This process was forked from pid {parent}"
        if parent is not None
        else "This process is most likely a fork of one"
    )
    return Finding(
        "forked_child",
        "error",
        "Forked child: use spawn",
        f"{known} after CUDA was initialised there. In such a child the driver refuses every "
        f"call, cuInit included, with {error_name(NOT_INITIALIZED)}; nothing in this process "
        f"can fix that.",
        "Start worker processes with the 'spawn' start method: "
        "`multiprocessing.get_context('spawn')` or `multiprocessing.set_start_method('spawn')` "
        "(concurrent.futures: `ProcessPoolExecutor(mp_context=multiprocessing.get_context('spawn'))`). "
        "Or fork before anything initialises CUDA.",
    )


def _f_fork_ahead(libraries: list[str]) -> Finding:
    if libraries:
        who = "One of the CUDA libraries loaded did: " + ", ".join(
            os.path.basename(p) for p in libraries
        )
    else:
        who = "No CUDA library but the driver is loaded: the driver API was called directly"
    return Finding(
        "cuda_initialised_before_fork",
        "warning",
        "CUDA is initialised; a forked child cannot use it",
        f"CUDA is initialised in this process (pid {os.getpid()}). {who} (the driver does not "
        f"record which). In a child forked from it the driver refuses every call, cuInit "
        f"included, with {error_name(NOT_INITIALIZED)}.",
        "Start worker processes with the 'spawn' start method: "
        "`multiprocessing.get_context('spawn')` "
        "(concurrent.futures: `ProcessPoolExecutor(mp_context=multiprocessing.get_context('spawn'))`), "
        "or fork before anything initialises CUDA. `cyctx.warn_on_fork()` warns at each such fork.",
    )


def _f_fork_safe() -> Finding:
    return Finding(
        "fork_safe",
        "info",
        "CUDA is not initialised; a forked child can use it",
        "Nothing in this process has initialised CUDA, so a forked child can initialise it "
        "itself. The doctor did not initialise it either: the devices and contexts are not "
        "described, since asking the driver about them needs cuInit.",
        "Nothing to do before the fork. Initialising CUDA before forking (any library's first "
        "GPU call) would make the children unable to use it.",
    )


def _f_no_current(diag: Diagnosis) -> Finding:
    dev = next((g.device for g in diag.guards), 0)
    return Finding(
        # A note, not a warning: every new thread starts so, guards make their context current
        # when they need it, and the doctor's own process is always in this state.
        "no_current_context",
        "info",
        "No current context on this thread",
        "cuCtxGetCurrent returned NULL. The current context is per-thread state: every new thread "
        "starts without one, even when another thread called cudaSetDevice or entered a guard. "
        f"Driver calls that need a context fail here with {error_name(INVALID_CONTEXT)}.",
        f"On each thread that calls the driver, {_GUARD_FIX.format(dev=dev)}. "
        "(Runtime-only code: call cudaSetDevice on each new thread.)",
    )


def _f_inactive_primary(c: ContextInfo) -> Finding:
    if c.primary:  # a guard holds it: it was reset inside the guard's block
        fix = (
            "A ContextGuard holds this context, so it was reset while the guard was entered: "
            "leave the `with guard:` block and enter it again; the enter re-activates the "
            "context (and warns ContextResetWarning). Memory and modules from before the reset "
            "are gone: recreate them."
        )
    else:
        fix = (
            f"Hold a retain on the primary context, which activates it: "
            f"{_GUARD_FIX.format(dev=c.device)}. Without cyctx: cuDevicePrimaryCtxRetain, or "
            f"cudaFree(0) right after cudaSetDevice on a pre-12 runtime. After a reset, memory "
            f"and modules from before it are gone: recreate them."
        )
    maybe = (
        ""
        if c.primary
        else (
            " (A context made by cuCtxCreate and destroyed with cuCtxDestroy on another thread "
            "looks the same to the driver; if this program does that, see that first.)"
        )
    )
    return Finding(
        "inactive_primary_current",
        "error",
        f"The current context is device {c.device}'s primary context, and it is not active",
        f"cuCtxGetCurrent returns a non-NULL handle (0x{c.handle:x}) but the primary context "
        f"behind it is not created (cuDevicePrimaryCtxGetState: active=0), so driver calls "
        f"through it fail: {c.why}, and with the handle passed explicitly, as in the classic "
        f"report, {error_name(INVALID_CONTEXT)}. Two things leave a thread like this: a CUDA "
        f"runtime older than 12.0, whose cudaSetDevice only binds the primary context to the "
        f"thread and creates it later, at the first runtime call that needs it; or "
        f"cudaDeviceReset / cuDevicePrimaryCtxReset (any CUDA version), which destroy the "
        f"context and leave its handle current.{maybe}",
        fix,
    )


def _f_dead_current(c: ContextInfo) -> Finding:
    return Finding(
        "dead_current_context",
        "error",
        "The current context is unusable",
        f"cuCtxGetCurrent returns 0x{c.handle:x}, but {c.why}. "
        + (
            f"It is not device {c.device}'s primary context (that one is active): "
            if c.primary is False
            else ""
        )
        + f"a context destroyed with cuCtxDestroy on another thread stays current on this one, and "
        f"the driver answers {error_name(CONTEXT_IS_DESTROYED)}.",
        "Drop the dead context, cuCtxSetCurrent(NULL) (or cuCtxPopCurrent), and make a live one "
        f"current for driver work: {_GUARD_FIX.format(dev=c.device if c.device is not None else 0)}.",
    )


def _f_guard_context_destroyed(g: GuardInfo) -> Finding:
    # Not a reset: only a primary context is reset and re-activated. A created or green
    # context destroyed by its owner is gone for good; the guard cannot bring it back.
    now = (
        f"the driver now answers {g.driver_id_error}"
        if g.driver_id is None
        else f"the driver now reports id {g.driver_id} for the handle: another context reuses it"
    )
    return Finding(
        "guard_context_destroyed",
        "error",
        f"A ContextGuard's context (device {g.device}, not a primary context) was destroyed",
        f"A guard made from a context its caller owns (cuCtxCreate or a green context, handle "
        f"0x{g.handle:x}) last saw context id {g.seen_id}; {now}. Its owner destroyed it "
        f"(cuCtxDestroy, or cuGreenCtxDestroy) while the guard still refers to it. Such a "
        f"context is never re-activated: everything in it is gone.",
        "Close the guard (its next enter raises ContextDestroyedError), and make a new guard from "
        "a live context; keep the context alive for as long as any guard made from it is used.",
    )


def _f_reset(g: GuardInfo) -> Finding:
    now = (
        f"the driver now reports id {g.driver_id}: someone re-activated it since"
        if g.driver_id is not None
        else f"the driver now answers {g.driver_id_error}: the context is destroyed "
        f"and the primary context is inactive"
    )
    return Finding(
        "context_reset",
        "error",
        f"Device {g.device}'s primary context was reset since a ContextGuard last saw it",
        f"A guard of device {g.device} (handle 0x{g.handle:x}) last saw context id {g.seen_id}; "
        f"{now}. cudaDeviceReset or cuDevicePrimaryCtxReset ran in between. The handle value is "
        f"reused across a reset, only the id tells. Everything allocated or loaded "
        f"in the old context (memory, modules, streams) is gone.",
        "Driver calls inside `with guard:` are safe: the next enter re-activates the context and "
        "warns ContextResetWarning. Recreate what was allocated before the reset, and find who "
        "resets the device (`-W error::cyctx.ContextResetWarning` stops at the next enter).",
    )


def _where(lib: LoadedLibrary) -> str:
    """``CUDA 12.9 runtime libcudart.so.12 (PATH, from cupy-cuda12x 13.6.0)``."""
    frm = f", from {lib.distribution}" if lib.distribution else ""
    return f"CUDA {version_str(lib.version)} runtime {lib.name} ({lib.path}{frm})"


def _brought_by(lib: LoadedLibrary) -> str:
    return lib.distribution.split(" ")[0] if lib.distribution else lib.path


def _build_for(libs: list[LoadedLibrary], major: int) -> str:
    """How to get the CUDA ``major`` build of what brought ``libs``, for a fix."""
    ways = []
    for name in sorted({_brought_by(lib) for lib in libs}):
        if name.startswith("cupy-cuda"):
            ways.append(f"CuPy's (`pip install cupy-cuda{major}x` in place of {name})")
        elif name == "torch":
            ways.append(f"torch's (its CUDA {major} wheel, from the cu{major}x index)")
        elif name.startswith("nvidia-cuda-runtime"):
            ways.append(f"the CUDA runtime wheel's (CUDA {major}'s, in place of {name})")
        elif name.startswith(os.sep):  # no distribution ships it: a toolkit, a system package
            ways.append(f"a CUDA {major} runtime in place of {name}")
        else:
            ways.append(f"{name}'s")
    return f"the CUDA {major} build of each: " + ", ".join(ways)


def _f_runtime_newer(lib: LoadedLibrary, driver_version: int) -> Finding:
    assert lib.version is not None
    need = lib.version // 1000
    return Finding(
        "runtime_newer_than_driver",
        "error",
        f"The CUDA {version_str(lib.version)} runtime is newer than the driver "
        f"(CUDA {version_str(driver_version)})",
        f"{_where(lib)} is loaded, and the driver supports CUDA "
        f"{version_str(driver_version)}. A runtime of a newer major than the driver's fails "
        f"its first call that needs the driver with cudaErrorInsufficientDriver (35), and the "
        f'libraries built on it (cuBLAS, cuSPARSE, ...) fail to create their handles ("CUDA '
        f"context cannot be initialized\"). (A newer minor of the driver's own major works, "
        f"under CUDA's minor version compatibility.)",
        f"Install an NVIDIA driver of CUDA {need}.0 or newer, or install "
        f"{_build_for([lib], driver_version // 1000)}.",
    )


def _f_mixed_majors(runtimes: list[LoadedLibrary]) -> Finding:
    majors = sorted({lib.version // 1000 for lib in runtimes if lib.version})
    newest = majors[-1]
    odd = [lib for lib in runtimes if lib.version and lib.version // 1000 != newest]
    return Finding(
        "runtime_majors_mixed",
        "warning",
        "CUDA runtimes of different majors in one process: "
        + ", ".join(f"CUDA {m}" for m in majors),
        "Loaded: "
        + "; ".join(_where(lib) for lib in runtimes)
        + ". Each runtime keeps its own state (the current device it sets, its error state, "
        "its modules), and each library built for one major (cuBLAS, cuSPARSE, NCCL) is loaded "
        "again for the other. A runtime of a newer major than the driver fails outright, and "
        "the older one's limits (a CUDA 11 runtime's cudaSetDevice) apply to the code that "
        "uses it.",
        "Install every framework's build for one CUDA major: here, "
        + _build_for(odd, newest)
        + ".",
    )


def _f_cuda11_loaded(runtimes: list[LoadedLibrary], major: int) -> Finding:
    return Finding(
        "cuda11_runtime_loaded",
        "warning",
        "A CUDA runtime older than 12.0 is loaded",
        "Loaded: "
        + "; ".join(_where(lib) for lib in runtimes)
        + ". Its cudaSetDevice makes the device's primary context current without creating "
        "it, so a driver call made right after it fails with "
        f"{error_name(INVALID_CONTEXT)}: the classic failure (`cyctx doctor --demo --cudart "
        "PATH` shows it). The context is created only at that runtime's first call that "
        "needs it.",
        "Make driver calls inside `with cyctx.ContextGuard(dev):`, which activates the primary "
        "context whatever the runtime did; or install " + _build_for(runtimes, major) + ".",
    )


def _f_not_primary(c: ContextInfo) -> Finding:
    return Finding(
        "current_not_primary",
        "warning",
        f"The current context is not device {c.device}'s primary context",
        f"cuCtxGetCurrent returns 0x{c.handle:x}, a live context that is not the primary "
        f"context: {c.primary_why}. The runtime (and torch, CuPy, every library on it) works in "
        f"the primary context; runtime calls on this thread now run in this other context "
        f"instead. Memory, streams, events and modules of one context are not usable in the "
        f"other: kernels fault on the other's memory (CUDA_ERROR_ILLEGAL_ADDRESS) and its "
        f"handles answer {error_name(INVALID_CONTEXT)} or CUDA_ERROR_INVALID_HANDLE.",
        f"Use the primary context for work shared with the runtime: "
        f"`cyctx.ContextGuard({c.device})` (or cuDevicePrimaryCtxRetain) instead of "
        f"cuCtxCreate. If a library made this context on purpose, keep its work inside "
        f"`with cyctx.ContextGuard(ctx):` so the thread's previous context comes back after it.",
    )


def _f_primary_flags(dev: DeviceInfo) -> Finding:
    assert dev.primary_flags is not None
    return Finding(
        "primary_flags",
        "info",
        f"Device {dev.ordinal}'s primary context was activated with flags "
        f"{flags_str(dev.primary_flags)}",
        f"cuDevicePrimaryCtxGetState reports flags {flags_str(dev.primary_flags)}, not "
        f"0x0 (SCHED_AUTO), the flags a ContextGuard or the runtime activates a primary "
        f"context with when nobody set any: a library called cudaSetDeviceFlags or "
        f"cuDevicePrimaryCtxSetFlags. The flags belong to the one primary context that every "
        f"library on the device shares: a blocking-sync or spin schedule set by one changes how "
        f"every other library's synchronisation waits.",
        "If that is intended, nothing to do. If not, find the library that sets them; set flags "
        "once, before anything activates the context (cudaSetDeviceFlags before the first CUDA "
        "call), since every library in the process gets them.",
    )
