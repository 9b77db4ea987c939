"""The words of each finding the doctor makes: its title, why it matters, and the fix.

Each function here returns a :class:`Said`; which finding it is (its code and severity) and
when it is made are :mod:`.rules`' to say.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from cyctx._doctor.cu import (
    CONTEXT_IS_DESTROYED,
    INVALID_CONTEXT,
    NO_DEVICE,
    NOT_FOUND,
    NOT_INITIALIZED,
    NOT_SUPPORTED,
    STUB_LIBRARY,
    error_name,
)
from cyctx._doctor.model import ContextInfo, DeviceInfo, GuardInfo, LoadedLibrary, version_str
from cyctx._doctor.render import flags_str
from cyctx._errors import load_fix


class Said(NamedTuple):
    """What a finding says: one line of what was found, why it matters, what to do."""

    title: str
    explanation: str
    fix: str


_GUARD_FIX = (
    "create a guard once, `guard = cyctx.ContextGuard({dev})` (or `cyctx.ContextGuard.shared({dev})`), "
    "and make driver calls inside `with guard:`"
)


def no_driver(error: str) -> Said:
    return Said(
        "No NVIDIA driver: this machine has no usable GPU for CUDA",
        f"libcuda.so.1, the NVIDIA driver's CUDA library, cannot be loaded ({error}). Nothing "
        f"in CUDA can run without it; this is normal on a machine without an NVIDIA GPU.",
        "On a GPU machine, install the NVIDIA driver. To try cyctx here, use its simulated driver: "
        "`cyctx doctor --simulate` and `cyctx doctor --demo --simulate`.",
    )


# The titles of the libraries cyctx's loader refuses, by the CUresult it answers.
_REFUSED = {
    STUB_LIBRARY: "The libcuda.so.1 that loads is the CUDA toolkit's stub, not the NVIDIA driver",
    NOT_SUPPORTED: "The NVIDIA driver is too old: cyctx needs a driver of CUDA 12.0 or newer",
    NOT_FOUND: "The libcuda.so.1 that loads is not a complete NVIDIA driver",
}


def unusable_library(code: int, why: str, path: str | None) -> Said:
    # The words of cyctx's own error (cyctx._guard.raise_load_error): the reason and the fix.
    title = _REFUSED.get(code, "The CUDA driver library cannot be used")
    where = f" ({path})" if path else ""
    return Said(
        title,
        f"Loading libcuda.so.1{where} as a ContextGuard does fails with {error_name(code)}. "
        f"{why}. Nothing in CUDA can run with this library.",
        load_fix(code) + ".",
    )


def no_device() -> Said:
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = (
        f"CUDA_VISIBLE_DEVICES is {vis!r}" if vis is not None else "CUDA_VISIBLE_DEVICES is not set"
    )
    return Said(
        "The driver loads but finds no CUDA device",
        f"cuInit returned {error_name(NO_DEVICE)}; {seen}.",
        "Check `nvidia-smi`; an empty or wrong CUDA_VISIBLE_DEVICES hides every GPU. "
        "Without a GPU, `cyctx doctor --simulate` runs on cyctx's simulated driver.",
    )


def driver_error(call: str, what: str) -> Said:
    return Said(
        f"{call} failed with {what}",
        f"The driver answered {call} with {what}; the doctor cannot look further.",
        "Check the driver installation (`nvidia-smi`) and that the driver is at least as new as "
        "the CUDA version the program was built for.",
    )


def fork(parent: int | None) -> Said:
    known = (
        f"This process was forked from pid {parent}"
        if parent is not None
        else "This process is most likely a fork of one"
    )
    return Said(
        "Forked child: use spawn",
        f"{known} after CUDA was initialised there. In such a child the driver refuses every "
        f"call, cuInit included, with {error_name(NOT_INITIALIZED)}; nothing in this process "
        f"can fix that.",
        "Start worker processes with the 'spawn' start method: "
        "`multiprocessing.get_context('spawn')` or `multiprocessing.set_start_method('spawn')` "
        "(concurrent.futures: `ProcessPoolExecutor(mp_context=multiprocessing.get_context('spawn'))`). "
        "Or fork before anything initialises CUDA.",
    )


def fork_ahead(libraries: list[str]) -> Said:
    if libraries:
        who = "One of the CUDA libraries loaded did: " + ", ".join(
            os.path.basename(p) for p in libraries
        )
    else:
        who = "No CUDA library but the driver is loaded: the driver API was called directly"
    return Said(
        "CUDA is initialised; a forked child cannot use it",
        f"CUDA is initialised in this process (pid {os.getpid()}). {who} (the driver does not "
        f"record which). In a child forked from it the driver refuses every call, cuInit "
        f"included, with {error_name(NOT_INITIALIZED)}.",
        "Start worker processes with the 'spawn' start method: "
        "`multiprocessing.get_context('spawn')` "
        "(concurrent.futures: `ProcessPoolExecutor(mp_context=multiprocessing.get_context('spawn'))`), "
        "or fork before anything initialises CUDA. `cyctx.warn_on_fork()` warns at each such fork.",
    )


def fork_safe() -> Said:
    return Said(
        "CUDA is not initialised; a forked child can use it",
        "Nothing in this process has initialised CUDA, so a forked child can initialise it "
        "itself. The doctor did not initialise it either: the devices and contexts are not "
        "described, since asking the driver about them needs cuInit.",
        "Nothing to do before the fork. Initialising CUDA before forking (any library's first "
        "GPU call) would make the children unable to use it.",
    )


def no_current(guards: list[GuardInfo]) -> Said:
    dev = next((g.device for g in guards), 0)  # the fix names a device the program uses
    return Said(
        "No current context on this thread",
        "cuCtxGetCurrent returned NULL. The current context is per-thread state: every new thread "
        "starts without one, even when another thread called cudaSetDevice or entered a guard. "
        f"Driver calls that need a context fail here with {error_name(INVALID_CONTEXT)}.",
        f"On each thread that calls the driver, {_GUARD_FIX.format(dev=dev)}. "
        "(Runtime-only code: call cudaSetDevice on each new thread.)",
    )


def inactive_primary(c: ContextInfo) -> Said:
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
    return Said(
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


def dead_current(c: ContextInfo) -> Said:
    return Said(
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


def guard_context_destroyed(g: GuardInfo) -> Said:
    # Not a reset: only a primary context is reset and re-activated. A created or green
    # context destroyed by its owner is gone for good; the guard cannot bring it back.
    now = (
        f"the driver now answers {g.driver_id_error}"
        if g.driver_id is None
        else f"the driver now reports id {g.driver_id} for the handle: another context reuses it"
    )
    return Said(
        f"A ContextGuard's context (device {g.device}, not a primary context) was destroyed",
        f"A guard made from a context its caller owns (cuCtxCreate or a green context, handle "
        f"0x{g.handle:x}) last saw context id {g.seen_id}; {now}. Its owner destroyed it "
        f"(cuCtxDestroy, or cuGreenCtxDestroy) while the guard still refers to it. Such a "
        f"context is never re-activated: everything in it is gone.",
        "Close the guard (its next enter raises ContextDestroyedError), and make a new guard from "
        "a live context; keep the context alive for as long as any guard made from it is used.",
    )


def reset(g: GuardInfo) -> Said:
    now = (
        f"the driver now reports id {g.driver_id}: someone re-activated it since"
        if g.driver_id is not None
        else f"the driver now answers {g.driver_id_error}: the context is destroyed "
        f"and the primary context is inactive"
    )
    return Said(
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


def runtime_newer(lib: LoadedLibrary, driver_version: int) -> Said:
    assert lib.version is not None
    need = lib.version // 1000
    return Said(
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


def mixed_majors(runtimes: list[LoadedLibrary]) -> Said:
    majors = sorted({lib.version // 1000 for lib in runtimes if lib.version})
    newest = majors[-1]
    odd = [lib for lib in runtimes if lib.version and lib.version // 1000 != newest]
    return Said(
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


def cuda11_loaded(runtimes: list[LoadedLibrary], major: int) -> Said:
    return Said(
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


def not_primary(c: ContextInfo) -> Said:
    return Said(
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


def primary_flags(dev: DeviceInfo) -> Said:
    assert dev.primary_flags is not None
    return Said(
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
