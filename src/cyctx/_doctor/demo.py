"""``python -m cyctx doctor --demo``: the classic failure, step by step, then fixed by a guard.

Three parts, run in one process in this order (each starts from the state the previous left;
the quoted headings are sections of docs/evidence.md):

1. the report's program: ``cudaSetDevice``, ``cuCtxGetCurrent``, ``cuCtxGetApiVersion``. A
   runtime older than 12.0 leaves an inactive primary context current and the last call fails
   with 201 ("Before CUDA 12.0, cudaSetDevice leaves the primary context inactive"); 12.0+
   passes ("Since CUDA 12.0, cudaSetDevice activates the primary context");
2. the reset variant, which fails on every version: ``cudaFree(0)``, ``cudaDeviceReset()``,
   then the same driver calls ("A reset leaves a dead handle current");
3. the same steps inside a :class:`cyctx.ContextGuard`, which succeed; after the reset the
   guard warns ``ContextResetWarning`` and re-activates the context.

The runtime is a real ``libcudart`` loaded with ctypes, or on the simulated driver a Python
stand-in (:class:`~cyctx._doctor.runtime.StandInRuntime`): a real libcudart cannot drive the
simulated driver.
"""

from __future__ import annotations

import sys
import warnings
from typing import Callable, TextIO

import cyctx
from cyctx._doctor.model import version_str
from cyctx._doctor.probe import (
    CONTEXT_IS_DESTROYED,
    INVALID_CONTEXT,
    call,
    driver,
    error_name,
    simulated_driver_path,
)
from cyctx._doctor.render import SIM_TAG, Style, sim_banner, wrap
from cyctx._doctor.runtime import Runtime, cu11_candidates


class _Out:
    def __init__(self, stream: TextIO, style: Style, dev: int, simulated: bool, width: int = 88) -> None:
        self.stream, self.s, self.dev, self.simulated, self.width = stream, style, dev, simulated, width
        self.tag = f"  {SIM_TAG}" if simulated else ""

    def line(self, text: str = "") -> None:
        print(text, file=self.stream)

    def head(self, title: str) -> None:
        self.line()
        self.line(self.s.bold(title) + (self.s.yellow(self.tag) if self.tag else ""))

    def para(self, text: str, style: Callable[[str], str] | None = None) -> None:
        wrapped = wrap(text, "   ", self.width)
        self.line(style(wrapped) if style else wrapped)

    def step(self, what: str, result: str, verdict: str | None = None, good: bool | None = None) -> None:
        text = f"   {what:<36} -> {result}"
        if verdict:
            colour = self.s.green if good else self.s.red if good is False else (lambda x: x)
            text += "   " + colour(verdict)
        self.line(text)

    def state(self) -> None:
        """One line of thread/driver state, by queries only."""
        d = driver
        e, cur = call(d.cuCtxGetCurrent)
        if e:
            where = f"cuCtxGetCurrent: {error_name(e)}"
        elif int(cur) == 0:
            where = "current NULL"
        else:
            e, cid = call(d.cuCtxGetId, cur)
            cid = (f"id {cid}" if e == 0 else f"destroyed: cuCtxGetId -> {CONTEXT_IS_DESTROYED}"
                   if e == CONTEXT_IS_DESTROYED else f"cuCtxGetId -> {error_name(e)}")
            where = f"current 0x{int(cur):x} ({cid})"
        e, st = call(d.cuDevicePrimaryCtxGetState, self.dev)
        prim = ("active" if st[1] else "inactive") if e == 0 else error_name(e)
        self.line(self.s.dim(f"{'':<6}state: {where} | device {self.dev} primary context: {prim}"))


def run_demo(rt: Runtime, device: int = 0, stream: TextIO | None = None, colour: bool = False) -> int:
    """Run the three parts, printing as it goes. Returns 0 when the guarded steps worked.

    ``rt`` is a :class:`~cyctx._doctor.runtime.Cudart` (real runtime) or a
    :class:`~cyctx._doctor.runtime.StandInRuntime` (simulated driver). The process's CUDA
    state is changed (this is a demonstration): run it in a process of its own.
    """
    d = driver
    stream = stream or sys.stdout
    o = _Out(stream, Style(colour), device, rt.simulated)
    s = o.s
    pre12 = rt.version is not None and rt.version < 12000
    e, drv_ver = call(d.cuDriverGetVersion)

    o.line(s.bold("cyctx doctor --demo: the classic CUDA context failure, step by step")
           + (s.yellow(o.tag) if o.tag else ""))
    if rt.simulated:
        o.line(s.yellow(wrap(sim_banner(
            simulated_driver_path(),
            f" The runtime is a Python stand-in that models libcudart {version_str(rt.version)}."), "", o.width)))
    o.line(f"   runtime  {rt.label}" + ("" if rt.simulated else f"  [{rt.source}]"))
    o.line(f"   driver   CUDA {version_str(drv_ver) if e == 0 else '?'}   device {device}")
    o.state()

    # --- 1 -----------------------------------------------------------------------------
    o.head("1. The classic report: cudaSetDevice, then the Driver API")
    o.para("The program of the classic report: pick the device with the runtime, take the "
           "current context from the driver, use it.")
    r = rt.set_device(device)
    o.step(f"cudaSetDevice({device})", rt.error_name(r))
    o.state()
    e, cur = call(d.cuCtxGetCurrent)
    h = int(cur) if e == 0 else 0
    o.step("cuCtxGetCurrent(&ctx)", f"{error_name(e)}, ctx = 0x{h:x}",
           "non-NULL" if h else "NULL", None)
    e, st = call(d.cuDevicePrimaryCtxGetState, device)
    o.step(f"cuDevicePrimaryCtxGetState({device})", f"active = {int(st[1])}" if e == 0 else error_name(e))
    e, api = call(d.cuCtxGetApiVersion, cur) if h else (INVALID_CONTEXT, None)
    classic_failed = e == INVALID_CONTEXT
    if classic_failed:
        o.step("cuCtxGetApiVersion(ctx)", error_name(e), "FAILS, as in the report", False)
    else:
        o.step("cuCtxGetApiVersion(ctx)", f"{error_name(e)}, {api}" if e == 0 else error_name(e),
               "works" if e == 0 else "fails", e == 0)
    if pre12 and classic_failed:
        o.para(
            "Reproduced. This runtime is older than 12.0: its cudaSetDevice only binds the "
            "device's primary context to the thread and leaves it inactive; the runtime creates "
            "it at the first call that needs it (cudaMalloc, cudaFree(0), a launch). So "
            "cuCtxGetCurrent returns a real handle, cuDevicePrimaryCtxGetState says active=0, and "
            f"the driver refuses the handle with {error_name(INVALID_CONTEXT)}. The fix is part 3.")
    elif not pre12 and e == 0:
        o.para(
            "No failure with this runtime: since CUDA 12.0 cudaSetDevice initialises the primary "
            "context (active = 1 above), so the report's program passes. The same non-NULL but "
            "dead handle still appears after a reset, on every version: part 2.")
        if not rt.simulated:
            for p in cu11_candidates():
                o.para(f"A CUDA 11 runtime is installed: `cyctx doctor --demo --cudart {p}` "
                       f"shows the classic failure itself.", s.dim)
                break
    else:
        o.para(f"Unexpected for a {version_str(rt.version)} runtime (was the primary context "
               f"already active, held by someone else?). Parts 2 and 3 still show the mechanism.", s.yellow)
    o.para("Not the cause, though often said: the runtime does not unbind the context when a "
           "function returns (the current context is per-thread state and stays), and there is no "
           "cuCtxRetain in the Driver API; cuDevicePrimaryCtxRetain is the call that activates.", s.dim)

    # --- 2 -----------------------------------------------------------------------------
    o.head("2. The reset variant: fails on every CUDA version")
    r = rt.free0()
    o.step("cudaFree(0)", rt.error_name(r), "creates the context (the old workaround)" if pre12 else None, None)
    o.state()
    e, cur = call(d.cuCtxGetCurrent)
    e, api = call(d.cuCtxGetApiVersion, cur)
    o.step("cuCtxGetApiVersion(ctx)", f"{error_name(e)}, {api}" if e == 0 else error_name(e),
           "works" if e == 0 else "fails", e == 0)
    r = rt.device_reset()
    o.step("cudaDeviceReset()", rt.error_name(r))
    o.state()
    e, cur = call(d.cuCtxGetCurrent)
    h = int(cur) if e == 0 else 0
    o.step("cuCtxGetCurrent(&ctx)", f"{error_name(e)}, ctx = 0x{h:x}", "non-NULL, same handle" if h else "NULL", None)
    e, api = call(d.cuCtxGetApiVersion, cur) if h else (INVALID_CONTEXT, None)
    reset_failed = e == INVALID_CONTEXT
    o.step("cuCtxGetApiVersion(ctx)", error_name(e) if e else f"{error_name(e)}, {api}",
           "FAILS" if reset_failed else "works (unexpected)", False if reset_failed else None)
    o.para("cudaDeviceReset destroyed the primary context and left its handle current on this "
           f"thread: cuCtxGetCurrent still returns it, the driver refuses it with {INVALID_CONTEXT}. Any runtime "
           "version does this, and so does cuDevicePrimaryCtxReset. Memory and modules made "
           "before the reset are gone.")

    # --- 3 -----------------------------------------------------------------------------
    o.head(f"3. The same steps inside a ContextGuard({device})")
    ok = [False, False]
    guard = None
    try:
        guard = cyctx.ContextGuard(device)
        o.step(f"guard = ContextGuard({device})", "retains the primary context (which activates it)")
        o.state()
        with guard:
            o.step("with guard:", "current on this thread")
            r = rt.set_device(device)
            o.step(f"    cudaSetDevice({device})", rt.error_name(r))
            o.state()
            e, cur = call(d.cuCtxGetCurrent)
            o.step("    cuCtxGetCurrent(&ctx)", f"{error_name(e)}, ctx = 0x{int(cur):x}")
            e, api = call(d.cuCtxGetApiVersion, cur)
            ok[0] = e == 0
            o.step("    cuCtxGetApiVersion(ctx)", f"{error_name(e)}, {api}" if e == 0 else error_name(e),
                   "works" if ok[0] else "FAILS", ok[0])
        r = rt.free0()
        o.step("cudaFree(0)", rt.error_name(r))
        r = rt.device_reset()
        o.step("cudaDeviceReset()", rt.error_name(r), "some library resets the device", None)
        o.state()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", cyctx.ContextResetWarning)
            with guard:
                for w in caught:
                    o.step("with guard:", s.yellow(f"{w.category.__name__}"))
                    o.para(str(w.message), s.yellow)
                if not caught:
                    o.step("with guard:", "no reset seen (unexpected)")
                o.state()
                e, cur = call(d.cuCtxGetCurrent)
                o.step("    cuCtxGetCurrent(&ctx)", f"{error_name(e)}, ctx = 0x{int(cur):x}")
                e, api = call(d.cuCtxGetApiVersion, cur)
                ok[1] = e == 0 and bool(caught)
                o.step("    cuCtxGetApiVersion(ctx)", f"{error_name(e)}, {api}" if e == 0 else error_name(e),
                       "works" if e == 0 else "FAILS", e == 0)
        guard.close()
        o.step("guard.close()", "releases the retain")
        o.state()
    except cyctx.CyctxError as exc:
        o.para(f"The guard failed: {type(exc).__name__}: {exc}", s.red)
    o.para("The guard's retain keeps the primary context active, so the handle the runtime binds "
           "is usable. After a reset the handle is the same but the context id is not: the guard "
           "checks the id at every enter, re-activates the context (refcount unchanged) and warns.")

    o.head("Summary")
    o.para(f"Without a guard: cuCtxGetApiVersion -> "
           f"{f'{INVALID_CONTEXT} after cudaSetDevice (pre-12 runtime) and ' if classic_failed else ''}"
           f"{f'{INVALID_CONTEXT} after cudaDeviceReset' if reset_failed else 'no failure after cudaDeviceReset (unexpected)'}. "
           f"Inside ContextGuard({device}): "
           f"{'the same steps work, and the reset is detected and repaired' if all(ok) else 'FAILED'}.",
           s.green if all(ok) else s.red)
    if rt.simulated:
        o.para(f"{SIM_TAG} simulated driver and stand-in runtime: run without --simulate on a GPU "
               f"machine for the real thing.", s.yellow)
    return 0 if all(ok) else 1
