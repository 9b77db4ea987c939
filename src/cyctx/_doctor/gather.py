"""What the doctor looks at, gathered once: :func:`gather` fills a report (versions, driver,
devices, guards, the current context, runtimes, the census) and says how far it got
(:class:`Seen`); it decides nothing. :mod:`.rules` judges what it gathered.

The driver is asked step by step, the way a guard loads it, and stops at the first step that
fails: after that nothing else would answer. ``Seen.stage`` names that step.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

from _cyctx_libcuda import loaded_libcuda, simulated_libcuda
from cyctx import _census as census
from cyctx._doctor.cu import NO_DEVICE, NOT_INITIALIZED, call, driver, error_name
from cyctx._doctor.probe import context_info, device_info, forked_from, guard_infos
from cyctx._doctor.report import Diagnosis, empty_report
from cyctx._doctor.runtime import add_runtimes, doctors_own, wheel_version
from cyctx._guard import load_problem

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


@dataclass
class Seen:
    """Everything the rules judge: the report so far (findings empty), how far the driver
    answered, and what the rules read that the report does not hold."""

    report: Diagnosis
    # How far the driver answered, in order:
    #   library_unusable  cyctx's loader refuses the libcuda.so.1 that loads (a stub, too old, ...)
    #   no_driver         cuda.bindings cannot load any libcuda.so.1
    #   not_initialised   asked before a fork where nobody initialised CUDA: the doctor did not
    #   forked            cuInit answers NOT_INITIALIZED: a forked child of a CUDA process
    #   init_failed       cuInit fails otherwise (no device, a broken driver)
    #   described         devices, guards and the current context are described
    stage: Literal[
        "library_unusable", "no_driver", "not_initialised", "forked", "init_failed", "described"
    ]
    load_problem: tuple[int, str] | None = None  # library_unusable: the loader's CUresult, why
    init_error: int | None = None  # forked, init_failed: cuInit's CUresult
    # Asked before a fork: whether anyone had initialised CUDA (None: not asked, or the driver
    # could not say), and if so the CUDA libraries loaded.
    initialised: bool | None = None
    fork_libraries: list[str] = field(default_factory=list)
    trace: ModuleType | None = None  # cyctx._trace, when a trace runs in the process
    events: list[Any] = field(default_factory=list)  # that trace's events so far


def gather(cudart: str | bool | None, before_fork: bool) -> Seen:
    """Look at the process and the calling thread (see :func:`~.findings.diagnose`)."""
    initialised = None  # not asked
    if before_fork:
        from cyctx._errors import CyctxError
        from cyctx._fork import cuda_initialized

        try:  # before any of the doctor's own calls: its cuInit would make the answer True
            initialised = cuda_initialized()
        except CyctxError:
            pass  # an unusable driver: the report says what is wrong with it
    # What was mapped before the doctor's own work: a runtime its lookup loads (cudart=None
    # in a process with none), now or in an earlier diagnose(), is marked as the doctor's in
    # the census, not the program's.
    own = doctors_own()
    before = [p for p in census.mapped_paths() if os.path.realpath(p) not in own]
    seen = _ask_driver(cudart, init=initialised is not False)
    seen.initialised = initialised
    if initialised:
        from cyctx._fork import cuda_libraries

        seen.fork_libraries = cuda_libraries()
    r = seen.report
    r.loaded = census.census(before, fallback_version=wheel_version)
    loaded = {os.path.realpath(lib.path) for lib in r.loaded}
    for o in r.other_runtimes:
        if os.path.realpath(o.library) in loaded:
            o.note = "loaded in this process (see the census, Diagnosis.loaded)"
    # A trace running in the process (cyctx.trace()): its events let findings name the call
    # that caused them. Nothing is loaded when none runs.
    mod = sys.modules.get("cyctx._trace")
    t = getattr(mod, "_running", None) if mod is not None else None
    if mod is not None and t is not None and t.active:
        seen.trace, seen.events = mod, t.snapshot()
    return seen


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

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
    return versions


def _ask_driver(cudart: str | bool | None, init: bool) -> Seen:
    sim_path = simulated_libcuda()
    r = empty_report(_versions(), forked_from=forked_from())
    d = driver
    # First the way a guard loads the driver (cyctx._guard.load_problem): a stub, a driver
    # older than CUDA 12.0 or a library that is not a complete driver get the diagnosis of
    # cyctx's own error, not cuda.bindings' failure to find a function.
    problem = load_problem()
    if problem is not None and problem[0] != NO_DEVICE:
        code, why = problem
        r.driver_library = loaded_libcuda()
        r.driver_error = f"{error_name(code)}: {why}"
        add_runtimes(r, cudart, query_device=False)
        return Seen(r, "library_unusable", load_problem=problem)
    try:
        # init=False: a process about to fork that nobody initialised CUDA in; loading the
        # driver (cuDriverGetVersion's first call) leaves a child free to use it, cuInit not.
        err, _ = call(d.cuInit, 0) if init else call(d.cuDriverGetVersion)
    except Exception as exc:  # cuda.bindings could not load libcuda.so.1 at all
        r.driver_error = f"{type(exc).__name__}: {exc}"
        add_runtimes(r, cudart, query_device=False)
        return Seen(r, "no_driver")
    r.driver_library = sim_path or loaded_libcuda()
    r.simulated = sim_path is not None
    e, v = call(d.cuDriverGetVersion)
    r.driver_version = v if e == 0 else None
    if not init:
        r.driver_error = (
            f"{error_name(NOT_INITIALIZED)}: not initialised, and the doctor asked before a "
            f"fork does not initialise it"
        )
        add_runtimes(r, cudart, query_device=False)
        return Seen(r, "not_initialised")
    if err == NOT_INITIALIZED:
        # A forked child of a CUDA process: nothing else will answer, and the runtime would
        # only say the same (docs/evidence.md, "A forked child gets CUDA_ERROR_NOT_INITIALIZED
        # from every call"); stop here.
        r.driver_error = error_name(err)
        return Seen(r, "forked", init_error=err)
    if err != 0:
        r.driver_error = error_name(err)
        add_runtimes(r, cudart, query_device=False)
        return Seen(r, "init_failed", init_error=err)

    e, n = call(d.cuDeviceGetCount)
    for i in range(n if e == 0 else 0):
        r.devices.append(device_info(i))
    r.guards = guard_infos()
    r.context = context_info(r.guards, r.devices)
    add_runtimes(r, cudart, query_device=not r.simulated)
    return Seen(r, "described")
