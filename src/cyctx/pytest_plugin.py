"""A pytest plugin that finds the tests which change the CUDA context state of their thread.

GPU test suites get bitten when one test leaves a context pushed or current, or resets a
device, and a later test fails for it. With ``pytest --cyctx-check-contexts`` this plugin
reads, before and after each test (its setup, call and teardown together), on the thread that
runs the tests:

* the current context (``cuCtxGetCurrent``), with its device and id;
* each device's primary context: active or not, and its flags (``cuDevicePrimaryCtxGetState``);
* the number of cyctx guard entries open on the thread;
* on cyctx's simulated driver also the depth of the thread's context stack and each primary
  context's retain count, which the real driver does not tell.

and reports every test after which something differs, in the terminal summary (with
``--cyctx-contexts-fail`` the run also fails). It only *reads*: it calls no driver function that
changes state, not even ``cuInit``, and it loads no driver: until something in the process has
loaded ``libcuda.so.1`` nothing can be current, and it records just that.

Installed with cyctx (a ``pytest11`` entry point) and off unless asked for: without the flag it
makes no driver call. With plugin autoloading disabled, add ``-p cyctx.pytest_plugin``.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from cyctx.testing import loaded_libcuda

# The reading and the comparison are the API; the pytest hooks are found by pytest by name.
__all__ = ["ContextState", "Observer", "changes"]

# CUresult values the plugin tells apart (the rest are shown by number).
_NOT_INITIALIZED = 3
_DEINITIALIZED = 4


@dataclass(frozen=True)
class ContextState:
    """What can be read without changing it, on one thread at one moment."""

    driver: str  # "ok", "not loaded", "not initialised", or "error N"
    current: int = 0  # the current context's handle; 0: none
    current_device: int | None = None
    current_id: int | None = None  # cuCtxGetId; None when it fails (a dead context)
    primaries: tuple[tuple[bool, int], ...] = ()  # per device: (active, flags)
    cyctx_entries: int | None = None  # open cyctx guard entries; None: cyctx not imported
    sim_stack_depth: int | None = None  # simulated driver only
    sim_retains: tuple[int, ...] | None = None  # simulated driver only

    def describe_current(self) -> str:
        """The current context in words: its handle, device and id, or ``none``."""
        if self.current == 0:
            return "none"
        dev = "?" if self.current_device is None else self.current_device
        cid = "dead (cuCtxGetId fails)" if self.current_id is None else f"id {self.current_id}"
        return f"0x{self.current:x} (device {dev}, {cid})"


_NO_DRIVER_YET = ("not loaded", "not initialised")


def changes(before: ContextState, after: ContextState) -> list[tuple[str, str]]:
    """What differs between two states: ``(kind, words)`` pairs. ``kind`` is ``"leak"`` for a
    change a later test meets (a context left current or pushed, a guard left entered, a
    primary context reset or re-flagged) and ``"note"`` for a retain taken and kept, which is
    what a framework does at its first use of a device."""
    out: list[tuple[str, str]] = []
    if before.driver != after.driver and after.driver != "ok":
        out.append(("leak", f"driver: {before.driver} -> {after.driver}"))
    if before.current != after.current or (
        before.current and before.current_id != after.current_id
    ):
        out.append(
            ("leak", f"current context: {before.describe_current()} -> {after.describe_current()}")
        )
    if (
        None not in (before.sim_stack_depth, after.sim_stack_depth)
        and before.sim_stack_depth != after.sim_stack_depth
    ):
        out.append(
            ("leak", f"context stack depth: {before.sim_stack_depth} -> {after.sim_stack_depth}")
        )
    if (
        None not in (before.cyctx_entries, after.cyctx_entries)
        and before.cyctx_entries != after.cyctx_entries
    ):
        out.append(
            (
                "leak",
                f"cyctx guard entries open on this thread: {before.cyctx_entries} -> {after.cyctx_entries}",
            )
        )
    # Before the driver is initialised no primary context can be active.
    was = (
        before.primaries
        if before.driver not in _NO_DRIVER_YET
        else ((False, 0),) * len(after.primaries)
    )
    # A process's device count does not change; were a snapshot to see fewer devices, compare
    # the devices both saw rather than fail the user's test run (strict=False).
    for dev, (b, a) in enumerate(zip(was, after.primaries, strict=False)):
        if b != a:
            kind = "note" if not b[0] and a[0] else "leak"  # activated: a retain kept
            out.append((kind, f"device {dev} primary context: {_primary(b)} -> {_primary(a)}"))
    if before.sim_retains is not None and after.sim_retains is not None:
        for dev, (nb, na) in enumerate(zip(before.sim_retains, after.sim_retains, strict=False)):
            if nb != na:
                out.append(
                    (
                        "note" if na > nb else "leak",
                        f"device {dev} primary context retains: {nb} -> {na}",
                    )
                )
    return out


def _primary(state: tuple[bool, int]) -> str:
    active, flags = state
    return ("active" if active else "inactive") + (f", flags 0x{flags:x}" if flags else "")


# --- reading the state ---------------------------------------------------------------------


class _Reader:
    """The five query functions, resolved through the loaded library's cuGetProcAddress_v2 at
    fixed ABI versions (the same ones cyctx uses), so that the real and the simulated driver
    answer alike. No function that changes state is ever resolved."""

    # (name, ABI version, argtypes)
    _SPECS = (
        ("cuCtxGetCurrent", 4000, [ctypes.POINTER(ctypes.c_void_p)]),
        ("cuCtxGetDevice", 2000, [ctypes.POINTER(ctypes.c_int)]),
        ("cuCtxGetId", 12000, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulonglong)]),
        ("cuDeviceGetCount", 2000, [ctypes.POINTER(ctypes.c_int)]),
        (
            "cuDevicePrimaryCtxGetState",
            7000,
            [ctypes.c_int, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_int)],
        ),
    )

    def __init__(self, path: str) -> None:
        # The library is already mapped: RTLD_NOLOAD only takes another reference to it, by its
        # soname (what cuda.bindings and cyctx opened) or else by the mapped file.
        try:
            lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
        except OSError:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        gpa = lib.cuGetProcAddress_v2
        gpa.restype = ctypes.c_int
        gpa.argtypes = [
            ctypes.c_char_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int,
            ctypes.c_uint64,
            ctypes.POINTER(ctypes.c_int),
        ]
        self.fn: dict[str, Any] = {}
        for name, version, argtypes in self._SPECS:
            p, status = ctypes.c_void_p(), ctypes.c_int(0)
            err = gpa(name.encode(), ctypes.byref(p), version, 0, ctypes.byref(status))
            if err != 0 or status.value != 0 or not p.value:
                raise RuntimeError(
                    f"{path}: cuGetProcAddress_v2({name}) returned {err}, status {status.value}"
                )
            self.fn[name] = ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(p.value)

    def read(self) -> ContextState:
        f = self.fn
        cur = ctypes.c_void_p()
        err = f["cuCtxGetCurrent"](ctypes.byref(cur))
        if err in (_NOT_INITIALIZED, _DEINITIALIZED):
            # Before cuInit (or in a forked child) nothing is current, and nothing else answers.
            return ContextState("not initialised" if err == _NOT_INITIALIZED else "deinitialised")
        if err != 0:
            return ContextState(f"error {err}")
        handle = cur.value or 0
        dev = cid = None
        if handle:
            d, i = ctypes.c_int(-1), ctypes.c_ulonglong(0)
            if f["cuCtxGetDevice"](ctypes.byref(d)) == 0:
                dev = d.value
            if f["cuCtxGetId"](cur, ctypes.byref(i)) == 0:
                cid = i.value
        n = ctypes.c_int(0)
        primaries = []
        if f["cuDeviceGetCount"](ctypes.byref(n)) == 0:
            for k in range(n.value):
                flags, active = ctypes.c_uint(0), ctypes.c_int(0)
                if (
                    f["cuDevicePrimaryCtxGetState"](k, ctypes.byref(flags), ctypes.byref(active))
                    == 0
                ):
                    primaries.append((bool(active.value), flags.value))
        return ContextState("ok", handle, dev, cid, tuple(primaries))


class Observer:
    """Reads the calling thread's state; built once the driver library is there."""

    def __init__(self) -> None:
        self._reader: _Reader | None = None
        self._reader_error: str | None = None

    def read(self) -> ContextState:
        """The calling thread's state now (queries only)."""
        path = loaded_libcuda()
        if path is None:
            state = ContextState("not loaded")
        else:
            if self._reader is None and self._reader_error is None:
                try:
                    self._reader = _Reader(path)
                except (OSError, AttributeError, RuntimeError) as exc:
                    self._reader_error = str(exc)
            state = (
                self._reader.read()
                if self._reader
                else ContextState(f"unreadable: {self._reader_error}")
            )
        # cyctx's own counters, only where the test process imported them (importing them here
        # could load a driver).
        guard = sys.modules.get("cyctx._guard")
        entries = guard.open_entries() if guard is not None else None
        testing = sys.modules.get("cyctx.testing")
        sim = testing.simulated() if testing is not None else None
        depth = retains = None
        if sim is not None and state.driver == "ok":
            depth = sim.stack_depth()
            retains = tuple(sim.retain_count(k) for k in range(sim.device_count))
        return ContextState(
            state.driver,
            state.current,
            state.current_device,
            state.current_id,
            state.primaries,
            entries,
            depth,
            retains,
        )


# --- pytest hooks --------------------------------------------------------------------------

Change = tuple[str, list[tuple[str, str]]]  # nodeid, changes()


class _Checker:
    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.observer = Observer()
        self.changed: list[Change] = []

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Iterator[None]:
        before = self.observer.read()
        yield
        what = changes(before, self.observer.read())
        if what:
            self.changed.append((item.nodeid, what))

    def leaks(self) -> list[Change]:
        return [(n, w) for n, w in self.changed if any(k == "leak" for k, _ in w)]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        leaks = self.leaks()
        if not leaks:
            tr.write_sep("=", "cyctx: no test left the CUDA context state changed", green=True)
        else:
            n = len(leaks)
            tr.write_sep(
                "=",
                f"cyctx: {n} test{'s' if n > 1 else ''} left the CUDA context state changed",
                red=self.fail,
                yellow=not self.fail,
            )
            for nodeid, what in leaks:
                tr.write_line(nodeid)
                for kind, line in what:
                    tr.write_line(f"    {line}" + ("  (note)" if kind == "note" else ""))
        notes = [(n, w) for n, w in self.changed if (n, w) not in leaks]
        if notes:
            tr.write_line(
                "cyctx: retains taken and kept (a framework's first use of a device does this):"
            )
            for nodeid, what in notes:
                tr.write_line(f"  {nodeid}: " + "; ".join(line for _, line in what))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.fail and self.leaks() and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


# The hooks' parameters are pytest's Parser and Config, typed Any: pytest's own types are
# partially unknown to a type checker, which would count against cyctx's type completeness.
def pytest_addoption(parser: Any) -> None:
    """The options: ``--cyctx-check-contexts``, ``--cyctx-contexts-fail``, ini ``cyctx_check_contexts``."""
    group = parser.getgroup("cyctx", "CUDA context checks (cyctx)")
    group.addoption(
        "--cyctx-check-contexts",
        action="store_true",
        default=None,
        help="report the tests that change the CUDA context state of their thread "
        "(current context, primary contexts, open cyctx guards); only reads it",
    )
    group.addoption(
        "--cyctx-contexts-fail",
        action="store_true",
        default=False,
        help="with --cyctx-check-contexts: fail the run when a test changed it",
    )
    parser.addini(
        "cyctx_check_contexts",
        type="bool",
        default=False,
        help="turn --cyctx-check-contexts on for this project",
    )


def pytest_configure(config: Any) -> None:
    """Register the checker when one of the options asks for it; otherwise do nothing."""
    fail = config.getoption("--cyctx-contexts-fail")
    on = config.getoption("--cyctx-check-contexts") or config.getini("cyctx_check_contexts") or fail
    if on:
        config.pluginmanager.register(_Checker(fail=bool(fail)), "cyctx-context-checker")
