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
from collections.abc import Callable
from typing import Any, TextIO

from _cyctx_libcuda import simulated_libcuda
from cyctx._doctor.cu import CONTEXT_IS_DESTROYED, INVALID_CONTEXT, call, driver, error_name
from cyctx._doctor.model import version_str
from cyctx._doctor.render import SIM_TAG, Style, sim_banner, wrap
from cyctx._doctor.runtime import Runtime, cu11_candidates
from cyctx._errors import ContextResetWarning, CyctxError
from cyctx._guard import ContextGuard


class _Out:
    def __init__(
        self, stream: TextIO, style: Style, dev: int, simulated: bool, width: int = 88
    ) -> None:
        self.stream, self.s, self.dev, self.simulated, self.width = (
            stream,
            style,
            dev,
            simulated,
            width,
        )
        self.tag = f"  {SIM_TAG}" if simulated else ""

    def line(self, text: str = "") -> None:
        print(text, file=self.stream)

    def head(self, title: str) -> None:
        self.line()
        self.line(self.s.bold(title) + (self.s.yellow(self.tag) if self.tag else ""))

    def para(self, text: str, style: Callable[[str], str] | None = None) -> None:
        wrapped = wrap(text, "   ", self.width)
        self.line(style(wrapped) if style else wrapped)

    def step(
        self, what: str, result: str, verdict: str | None = None, good: bool | None = None
    ) -> None:
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
            cid = (
                f"id {cid}"
                if e == 0
                else f"destroyed: cuCtxGetId -> {CONTEXT_IS_DESTROYED}"
                if e == CONTEXT_IS_DESTROYED
                else f"cuCtxGetId -> {error_name(e)}"
            )
            where = f"current 0x{int(cur):x} ({cid})"
        e, st = call(d.cuDevicePrimaryCtxGetState, self.dev)
        prim = ("active" if st[1] else "inactive") if e == 0 else error_name(e)
        self.line(self.s.dim(f"{'':<6}state: {where} | device {self.dev} primary context: {prim}"))


def run_demo(
    rt: Runtime, device: int = 0, stream: TextIO | None = None, colour: bool = False
) -> int:
    """Run the three parts, printing as it goes. Returns 0 when the guarded steps worked.

    ``rt`` is a :class:`~cyctx._doctor.runtime.Cudart` (real runtime) or a
    :class:`~cyctx._doctor.runtime.StandInRuntime` (simulated driver). The process's CUDA
    state is changed (this is a demonstration): run it in a process of its own.
    """
    demo = _Demo(rt, _Out(stream or sys.stdout, Style(colour), device, rt.simulated))
    demo.introduction()
    classic_failed = demo.classic()
    reset_failed = demo.reset()
    guarded_ok = demo.guarded()
    demo.summary(classic_failed, reset_failed, guarded_ok)
    return 0 if guarded_ok else 1


class _Demo:
    """The demo's parts, and the steps they share: each runtime or driver call the parts make
    is written once, as a step that makes the call and prints its line."""

    def __init__(self, rt: Runtime, out: _Out) -> None:
        self.rt, self.o, self.s, self.dev = rt, out, out.s, out.dev
        self.pre12 = rt.version is not None and rt.version < 12000

    # --- the steps ---------------------------------------------------------------------

    def set_device(self, indent: str = "") -> None:
        r = self.rt.set_device(self.dev)
        self.o.step(f"{indent}cudaSetDevice({self.dev})", self.rt.error_name(r))
        self.o.state()

    def free0(self, verdict: str | None = None) -> None:
        r = self.rt.free0()
        self.o.step("cudaFree(0)", self.rt.error_name(r), verdict, None)

    def device_reset(self, verdict: str | None = None) -> None:
        r = self.rt.device_reset()
        self.o.step("cudaDeviceReset()", self.rt.error_name(r), verdict, None)
        self.o.state()

    def current(
        self, indent: str = "", verdicts: tuple[str, str] | None = None, quiet: bool = False
    ) -> tuple[Any, int]:
        """cuCtxGetCurrent: (the handle as cuda.bindings gives it, as an int; 0 on error).
        ``verdicts``: what to say of a non-NULL handle and of NULL."""
        e, cur = call(driver.cuCtxGetCurrent)
        h = int(cur) if e == 0 else 0
        if not quiet:
            verdict = (verdicts[0] if h else verdicts[1]) if verdicts else None
            self.o.step(
                f"{indent}cuCtxGetCurrent(&ctx)", f"{error_name(e)}, ctx = 0x{h:x}", verdict, None
            )
        return cur, h

    @staticmethod
    def api_version(cur: Any) -> tuple[int, str]:
        """cuCtxGetApiVersion(cur): (code, what to print)."""
        e, api = call(driver.cuCtxGetApiVersion, cur)
        return e, f"{error_name(e)}, {api}" if e == 0 else error_name(e)

    def api_version_of_handle(self, cur: Any, h: int) -> tuple[int, str]:
        """The report's program passes only a non-NULL handle on: NULL counts as refused."""
        return self.api_version(cur) if h else (INVALID_CONTEXT, error_name(INVALID_CONTEXT))

    def api_version_step(self, cur: Any, indent: str = "", failed: str = "fails") -> bool:
        """cuCtxGetApiVersion(cur) where it is expected to work (true when it does)."""
        e, result = self.api_version(cur)
        self.o.step(
            f"{indent}cuCtxGetApiVersion(ctx)", result, "works" if e == 0 else failed, e == 0
        )
        return e == 0

    # --- the parts ---------------------------------------------------------------------

    def introduction(self) -> None:
        o, s, rt = self.o, self.s, self.rt
        e, drv_ver = call(driver.cuDriverGetVersion)
        o.line(
            s.bold("cyctx doctor --demo: the classic CUDA context failure, step by step")
            + (s.yellow(o.tag) if o.tag else "")
        )
        if rt.simulated:
            o.line(
                s.yellow(
                    wrap(
                        sim_banner(
                            simulated_libcuda(),
                            f" The runtime is a Python stand-in that models libcudart {version_str(rt.version)}.",
                        ),
                        "",
                        o.width,
                    )
                )
            )
        o.line(f"   runtime  {rt.label}" + ("" if rt.simulated else f"  [{rt.source}]"))
        o.line(f"   driver   CUDA {version_str(drv_ver) if e == 0 else '?'}   device {self.dev}")
        o.state()

    def classic(self) -> bool:
        """Part 1, the report's program. True when its last call failed as in the report."""
        o, s, rt, dev = self.o, self.s, self.rt, self.dev
        o.head("1. The classic report: cudaSetDevice, then the Driver API")
        o.para(
            "The program of the classic report: pick the device with the runtime, take the "
            "current context from the driver, use it."
        )
        self.set_device()
        cur, h = self.current(verdicts=("non-NULL", "NULL"))
        e, st = call(driver.cuDevicePrimaryCtxGetState, dev)
        o.step(
            f"cuDevicePrimaryCtxGetState({dev})",
            f"active = {int(st[1])}" if e == 0 else error_name(e),
        )
        e, result = self.api_version_of_handle(cur, h)
        failed = e == INVALID_CONTEXT
        if failed:
            o.step("cuCtxGetApiVersion(ctx)", result, "FAILS, as in the report", False)
        else:
            o.step("cuCtxGetApiVersion(ctx)", result, "works" if e == 0 else "fails", e == 0)
        if self.pre12 and failed:
            o.para(
                "Reproduced. This runtime is older than 12.0: its cudaSetDevice only binds the "
                "device's primary context to the thread and leaves it inactive; the runtime creates "
                "it at the first call that needs it (cudaMalloc, cudaFree(0), a launch). So "
                "cuCtxGetCurrent returns a real handle, cuDevicePrimaryCtxGetState says active=0, and "
                f"the driver refuses the handle with {error_name(INVALID_CONTEXT)}. The fix is part 3."
            )
        elif not self.pre12 and e == 0:
            o.para(
                "No failure with this runtime: since CUDA 12.0 cudaSetDevice initialises the primary "
                "context (active = 1 above), so the report's program passes. The same non-NULL but "
                "dead handle still appears after a reset, on every version: part 2."
            )
            if not rt.simulated:
                for p in cu11_candidates():
                    o.para(
                        f"A CUDA 11 runtime is installed: `cyctx doctor --demo --cudart {p}` "
                        f"shows the classic failure itself.",
                        s.dim,
                    )
                    break
        else:
            o.para(
                f"Unexpected for a {version_str(rt.version)} runtime (was the primary context "
                f"already active, held by someone else?). Parts 2 and 3 still show the mechanism.",
                s.yellow,
            )
        o.para(
            "Not the cause, though often said: the runtime does not unbind the context when a "
            "function returns (the current context is per-thread state and stays), and there is no "
            "cuCtxRetain in the Driver API; cuDevicePrimaryCtxRetain is the call that activates.",
            s.dim,
        )
        return failed

    def reset(self) -> bool:
        """Part 2, the reset variant. True when the handle left current was refused."""
        o = self.o
        o.head("2. The reset variant: fails on every CUDA version")
        self.free0("creates the context (the old workaround)" if self.pre12 else None)
        o.state()
        cur, _ = self.current(quiet=True)
        self.api_version_step(cur)
        self.device_reset()
        cur, h = self.current(verdicts=("non-NULL, same handle", "NULL"))
        e, result = self.api_version_of_handle(cur, h)
        failed = e == INVALID_CONTEXT
        o.step(
            "cuCtxGetApiVersion(ctx)",
            result,
            "FAILS" if failed else "works (unexpected)",
            False if failed else None,
        )
        o.para(
            "cudaDeviceReset destroyed the primary context and left its handle current on this "
            f"thread: cuCtxGetCurrent still returns it, the driver refuses it with {INVALID_CONTEXT}. Any runtime "
            "version does this, and so does cuDevicePrimaryCtxReset. Memory and modules made "
            "before the reset are gone."
        )
        return failed

    def guarded(self) -> bool:
        """Part 3, the same steps inside a guard. True when they worked and the reset was seen."""
        o, s, dev = self.o, self.s, self.dev
        o.head(f"3. The same steps inside a ContextGuard({dev})")
        ok = [False, False]
        try:
            guard = ContextGuard(dev)
            o.step(
                f"guard = ContextGuard({dev})", "retains the primary context (which activates it)"
            )
            o.state()
            with guard:
                o.step("with guard:", "current on this thread")
                self.set_device("    ")
                cur, _ = self.current("    ")
                ok[0] = self.api_version_step(cur, "    ", "FAILS")
            self.free0()
            self.device_reset("some library resets the device")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ContextResetWarning)
                with guard:
                    for w in caught:
                        o.step("with guard:", s.yellow(f"{w.category.__name__}"))
                        o.para(str(w.message), s.yellow)
                    if not caught:
                        o.step("with guard:", "no reset seen (unexpected)")
                    o.state()
                    cur, _ = self.current("    ")
                    ok[1] = self.api_version_step(cur, "    ", "FAILS") and bool(caught)
            guard.close()
            o.step("guard.close()", "releases the retain")
            o.state()
        except CyctxError as exc:
            o.para(f"The guard failed: {type(exc).__name__}: {exc}", s.red)
        o.para(
            "The guard's retain keeps the primary context active, so the handle the runtime binds "
            "is usable. After a reset the handle is the same but the context id is not: the guard "
            "checks the id at every enter, re-activates the context (refcount unchanged) and warns."
        )
        return all(ok)

    def summary(self, classic_failed: bool, reset_failed: bool, guarded_ok: bool) -> None:
        o, s = self.o, self.s
        o.head("Summary")
        o.para(
            f"Without a guard: cuCtxGetApiVersion -> "
            f"{f'{INVALID_CONTEXT} after cudaSetDevice (pre-12 runtime) and ' if classic_failed else ''}"
            + (
                f"{INVALID_CONTEXT} after cudaDeviceReset"
                if reset_failed
                else "no failure after cudaDeviceReset (unexpected)"
            )
            + ". "
            f"Inside ContextGuard({self.dev}): "
            f"{'the same steps work, and the reset is detected and repaired' if guarded_ok else 'FAILED'}.",
            s.green if guarded_ok else s.red,
        )
        if self.rt.simulated:
            o.para(
                f"{SIM_TAG} simulated driver and stand-in runtime: run without --simulate on a GPU "
                f"machine for the real thing.",
                s.yellow,
            )
