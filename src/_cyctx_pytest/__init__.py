"""cyctx's pytest plugin: finds the tests and fixtures that change the CUDA context state of the
thread that runs them (``pytest --cyctx-check-contexts``; docs/testing.md tells what is read
and how changes are reported). Its public names are importable as ``cyctx.pytest_plugin``.

It only *reads*: it calls no driver function that changes state, not even ``cuInit``, and it
loads no driver. It is a top-level package, beside cyctx, so that pytest can load it in every
pytest process of an environment without importing cyctx or cuda-bindings: at load it imports
pytest, the standard library and ``_cyctx_libcuda`` only, and the check reads the driver
through ctypes, so it also works where cyctx cannot be imported.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import inspect
import json
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from _cyctx_libcuda import loaded_libcuda, same_context

__all__ = ["ContextState", "ContextStateChanged", "Observer", "changes", "check_thread"]

# CUresult values the plugin tells apart (the rest are shown by number).
_NOT_INITIALIZED = 3
_DEINITIALIZED = 4

# The user property the findings travel in (to junit-xml, and from xdist workers).
PROPERTY = "cyctx_context_change"
TRACE_PROPERTY = "cyctx_trace"  # what an xdist worker's trace sends the controller
MARKER = "cyctx_allow_context_change"


@dataclass(frozen=True)
class ContextState:
    """What can be read without changing it, on one thread at one moment."""

    driver: str  # "ok", "not loaded", "not initialised", "deinitialised", or "error N"
    current: int = 0  # the current context's handle; 0: none
    current_device: int | None = None
    current_id: int | None = None  # cuCtxGetId; None when it fails (a dead context)
    primaries: tuple[tuple[bool, int], ...] = ()  # per device: (active, flags)
    cyctx_entries: int | None = None  # open cyctx guard entries; None: cyctx not imported
    sim_stack_depth: int | None = None  # simulated driver only
    sim_retains: tuple[int, ...] | None = None  # simulated driver only

    def describe_current(self) -> str:
        """The current context in words: its handle, device and id, or ``none``."""
        return _describe_current((self.current, self.current_device, self.current_id))


def _describe_current(value: tuple[int, int | None, int | None]) -> str:
    handle, dev, cid = value
    if handle == 0:
        return "none"
    dev_s = "?" if dev is None else dev
    cid_s = "dead (cuCtxGetId fails)" if cid is None else f"id {cid}"
    return f"0x{handle:x} (device {dev_s}, {cid_s})"


_NO_DRIVER_YET = ("not loaded", "not initialised")

# --- comparing states ----------------------------------------------------------------------
#
# A state is compared as fields: (name, device) -> value. Counted fields (stack depth, guard
# entries, retains) add up over several stretches of time; the others are compared as values.

_COUNTED = ("stack", "entries", "retains")


def _fields(state: ContextState, other: ContextState) -> dict[tuple[str, int], Any]:
    """The fields of ``state``, as compared with ``other``. A driver not yet loaded or
    initialised has nothing current, no primary context active, no stack and no retains: each
    field ``other`` has reads as zero there, so that the first setup to initialise the driver
    counts its own retains and pushes, and its teardown's releases and pops cancel them. No
    cyctx imported is no cyctx guard entry open."""
    out: dict[tuple[str, int], Any] = {("driver", 0): state.driver}
    out[("current", 0)] = (state.current, state.current_device, state.current_id)
    unread = state.driver in _NO_DRIVER_YET
    depth = 0 if unread and other.sim_stack_depth is not None else state.sim_stack_depth
    if depth is not None:
        out[("stack", 0)] = depth
    out[("entries", 0)] = state.cyctx_entries or 0
    primaries = ((False, 0),) * len(other.primaries) if unread else state.primaries
    for dev, p in enumerate(primaries):
        out[("primary", dev)] = p
    retains = (0,) * len(other.sim_retains or ()) if unread else state.sim_retains
    for dev, n in enumerate(retains or ()):
        out[("retains", dev)] = n
    return out


def _differs(key: tuple[str, int], b: Any, a: Any) -> bool:
    if key[0] == "current":  # the same handle with another id is another context (a reset)
        return not same_context((b[0], b[2]), (a[0], a[2]))
    return b != a


_ORDER = ("driver", "current", "stack", "entries", "primary", "retains")


def _classify(before: dict, after: dict) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    keys = sorted(set(before) & set(after), key=lambda k: (_ORDER.index(k[0]), k[1]))
    for key in keys:
        b, a = before[key], after[key]
        if not _differs(key, b, a):
            continue
        name, dev = key
        if name == "driver":
            if a != "ok":
                out.append(("leak", f"driver: {b} -> {a}"))
        elif name == "current":
            out.append(
                ("leak", f"current context: {_describe_current(b)} -> {_describe_current(a)}")
            )
        elif name == "stack":
            out.append(("leak", f"context stack depth: {b} -> {a}"))
        elif name == "entries":
            out.append(("leak", f"cyctx guard entries open on this thread: {b} -> {a}"))
        elif name == "primary":
            kind = "note" if not b[0] and a[0] else "leak"  # activated: a retain kept
            out.append((kind, f"device {dev} primary context: {_primary(b)} -> {_primary(a)}"))
        else:  # retains: one taken and kept is a note, one released a leak
            kind = "note" if a > b else "leak"
            out.append((kind, f"device {dev} primary context retains: {b} -> {a}"))
    return out


def changes(before: ContextState, after: ContextState) -> list[tuple[str, str]]:
    """What differs between two states: ``(kind, words)`` pairs.

    ``kind`` is ``"leak"`` for a change a later test meets: a context left current or pushed
    (or the current one reset: the same handle with a new id), a guard left entered, a primary
    context reset or re-flagged, a retain released. It is ``"note"`` for a primary context
    activated, or a retain taken and kept: what a framework does at its first use of a device.
    """
    return _classify(_fields(before, after), _fields(after, before))


def _primary(state: tuple[bool, int]) -> str:
    active, flags = state
    return ("active" if active else "inactive") + (f", flags 0x{flags:x}" if flags else "")


class _Ledger:
    """The changes one test or fixture made, over the stretches of time that were its own.

    A field is compared from its value when the owner began (``origin``, for a fixture: before
    its setup) or when the owner first changed it (for a test) to its value after the owner last
    changed it: the same value is no change. Otherwise a counted field is compared by the sum of
    the owner's own changes, so that what others did between a fixture's setup and its teardown
    is not the fixture's."""

    def __init__(self, origin: dict | None, since_origin: bool) -> None:
        self.origin = origin or {}
        self.since_origin = since_origin
        self.first: dict = {}
        self.last: dict = {}
        self.delta: dict = {}
        self.seen: set = set()

    def add(self, before: dict, after: dict) -> None:
        self.seen |= set(before) & set(after)
        for key in set(before) & set(after):
            b, a = before[key], after[key]
            if not _differs(key, b, a):
                continue
            self.first.setdefault(key, b)
            self.last[key] = a
            if key[0] in _COUNTED:
                self.delta[key] = self.delta.get(key, 0) + a - b

    def net(self) -> list[tuple[str, str]]:
        before, after = {}, {}
        for key, first in self.first.items():
            start = self.origin.get(key, first) if self.since_origin else first
            if self.last[key] == start:  # put back as it was (by a fixture: before its setup)
                continue
            before[key] = start
            after[key] = start + self.delta[key] if key[0] in _COUNTED else self.last[key]
        for key in [k for k in before if k[0] == "primary"]:
            # Where retains are counted (the simulated driver), a primary context activated by
            # an owner that released all it retained is kept active by someone else's retain.
            retains = ("retains", key[1])
            if retains in self.seen and self.delta.get(retains, 0) == 0:
                if not before[key][0] and after[key][0]:
                    del before[key], after[key]
        return _classify(before, after)


# --- reading the state ---------------------------------------------------------------------


class _Reader:
    """The five query functions, resolved through the loaded library's cuGetProcAddress_v2 at
    fixed ABI versions (the same ones cyctx uses), so that the real and the simulated driver
    answer alike. No function that changes state is ever resolved."""

    def __init__(self, path: str) -> None:
        import ctypes

        self.ct = ctypes
        p_void, p_int = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int)
        specs = (  # (name, ABI version, argtypes)
            ("cuCtxGetCurrent", 4000, [p_void]),
            ("cuCtxGetDevice", 2000, [p_int]),
            ("cuCtxGetId", 12000, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulonglong)]),
            ("cuDeviceGetCount", 2000, [p_int]),
            (
                "cuDevicePrimaryCtxGetState",
                7000,
                [ctypes.c_int, ctypes.POINTER(ctypes.c_uint), p_int],
            ),
        )
        # The library is already mapped: RTLD_NOLOAD only takes another reference to it, by its
        # soname (what cuda.bindings and cyctx opened) or else by the mapped file.
        try:
            lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
        except OSError:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        gpa = lib.cuGetProcAddress_v2
        gpa.restype = ctypes.c_int
        gpa.argtypes = [ctypes.c_char_p, p_void, ctypes.c_int, ctypes.c_uint64, p_int]
        self.lib = lib
        self.fn: dict[str, Any] = {}
        for name, version, argtypes in specs:
            p, status = ctypes.c_void_p(), ctypes.c_int(0)
            err = gpa(name.encode(), ctypes.byref(p), version, 0, ctypes.byref(status))
            if err != 0 or status.value != 0 or not p.value:
                raise RuntimeError(
                    f"{path}: cuGetProcAddress_v2({name}) returned {err}, status {status.value}"
                )
            self.fn[name] = ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(p.value)

    def close(self) -> None:
        """Give back the library reference the NOLOAD open took (a reader that lost the
        publication race); the library stays mapped, held by whoever loaded it."""
        import _ctypes

        _ctypes.dlclose(self.lib._handle)

    def read(self) -> ContextState:
        ct, f = self.ct, self.fn
        cur = ct.c_void_p()
        err = f["cuCtxGetCurrent"](ct.byref(cur))
        if err in (_NOT_INITIALIZED, _DEINITIALIZED):
            # Before cuInit (or in a forked child) nothing is current, and nothing else answers.
            return ContextState("not initialised" if err == _NOT_INITIALIZED else "deinitialised")
        if err != 0:
            return ContextState(f"error {err}")
        handle = cur.value or 0
        dev = cid = None
        if handle:
            d, i = ct.c_int(-1), ct.c_ulonglong(0)
            if f["cuCtxGetDevice"](ct.byref(d)) == 0:
                dev = d.value
            if f["cuCtxGetId"](cur, ct.byref(i)) == 0:
                cid = i.value
        n = ct.c_int(0)
        primaries = []
        if f["cuDeviceGetCount"](ct.byref(n)) == 0:
            for k in range(n.value):
                flags, active = ct.c_uint(0), ct.c_int(0)
                if f["cuDevicePrimaryCtxGetState"](k, ct.byref(flags), ct.byref(active)) == 0:
                    primaries.append((bool(active.value), flags.value))
        return ContextState("ok", handle, dev, cid, tuple(primaries))


class Observer:
    """Reads the calling thread's state; built once the driver library is there."""

    def __init__(self) -> None:
        self._reader: _Reader | None = None
        self._reader_error: str | None = None
        # Publishes the first reader built: threads that race the first read each build one
        # (outside the lock: building calls into the driver), one is kept, the others closed.
        self._publish = threading.Lock()

    def read(self) -> ContextState:
        """The calling thread's state now (queries only)."""
        if self._reader is not None:  # a loaded driver stays loaded: no need to look again
            state = self._reader.read()
        else:
            path = loaded_libcuda()
            if path is None:
                state = ContextState("not loaded")
            else:
                if self._reader_error is None:
                    try:
                        built = _Reader(path)
                    except (OSError, AttributeError, RuntimeError) as exc:
                        with self._publish:
                            if self._reader is None:
                                self._reader_error = str(exc)
                    else:
                        with self._publish:
                            if self._reader is None:
                                self._reader = built
                        if self._reader is not built:
                            built.close()
                reader = self._reader
                state = (
                    reader.read()
                    if reader is not None
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


# --- checking a thread of one's own --------------------------------------------------------


class ContextStateChanged(AssertionError):
    """A thread's CUDA context state differs from how it was found (raised by
    :func:`check_thread`, and by the plugin's fail mode at a test's teardown)."""


class check_thread:  # a class, used as a function is: `with check_thread():`
    """Check the calling thread: what the block changes in its CUDA context state.

    The plugin watches the thread that runs the tests; work a test hands to a thread of its own
    (a pool, a ``threading.Thread``) is checked with this, on that thread::

        def work():
            with check_thread():
                run_on_gpu()

        with ThreadPoolExecutor() as pool:
            pool.submit(work).result()  # raises ContextStateChanged in the test

    ``with check_thread() as found:`` gives a list that holds, after the block, every change as
    :func:`changes` gives it (notes included); leaving the block raises
    :class:`ContextStateChanged` when one of them is a leak (unless the block raised). It reads
    only, with or without ``--cyctx-check-contexts``.
    """

    def __init__(self) -> None:
        self._observer = Observer()
        self._found: list[tuple[str, str]] = []
        self._before: ContextState | None = None

    def __enter__(self) -> list[tuple[str, str]]:
        """Read the thread's state; return the list the changes will be in."""
        self._before = self._observer.read()
        return self._found

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
        """Read it again; raise :class:`ContextStateChanged` for a leak."""
        assert self._before is not None, "check_thread left without being entered"
        self._found.extend(changes(self._before, self._observer.read()))
        leaks = [words for kind, words in self._found if kind == "leak"]
        if leaks and exc_type is None:
            raise ContextStateChanged(
                f"the CUDA context state of thread {threading.current_thread().name!r} changed:\n"
                + "\n".join(f"    {w}" for w in leaks)
            )


# --- the pytest hooks ----------------------------------------------------------------------


def _finding(kind: str, name: str, where: str, what: list, scope: str = "function") -> dict:
    return {"kind": kind, "name": name, "scope": scope, "where": where, "changes": what}


def _title(f: dict) -> str:
    if f["kind"] == "test":
        return f["name"]
    return f"fixture {f['name']!r} ({f['scope']} scope, torn down at the end of {f['where']})"


def _cite(words: str, tracer: Any, handle: int) -> str:
    """A change of the current context, with the traced call that made it (--cyctx-trace)."""
    if not words.startswith("current context: "):
        return words
    e = tracer.made_current(handle)
    return f"{words}: made current by {e.describe()}" if e is not None else words


def _is_leak(f: dict) -> bool:
    return not f.get("allowed") and any(k == "leak" for k, _ in f["changes"])


class _Checker:
    """The state at each boundary of a test's run, each stretch between two boundaries given to
    whoever ran in it: the test, or the fixture setting up or tearing down (a stack: fixtures
    set up fixtures)."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.observer = Observer()
        self.last: ContextState | None = None
        self.owners: list[_Ledger] = []
        self.fixtures: dict[int, tuple[_Ledger, bool]] = {}  # id(fixturedef): (ledger, torn)
        self.pending: list[dict] = []  # fixtures torn down, waiting for a teardown to carry them
        self.test: _Ledger | None = None
        self.findings: list[dict] = []  # what the reports carried (the controller's view)
        self.runner = 0  # the thread pytest runs the tests on (threading.get_ident)
        # What the running test's function left changed on threads other than the runner
        # (pytest-run-parallel's): (thread name, changes), appended by those threads.
        self.on_threads: list[tuple[str, list[tuple[str, str]]]] = []

    def _mark(self) -> None:
        now = self.observer.read()
        if self.owners and self.last is not None:
            self.owners[-1].add(_fields(self.last, now), _fields(now, self.last))
        self.last = now

    def _origin(self) -> dict:
        assert self.last is not None
        return _fields(self.last, self.last)

    @pytest.hookimpl(wrapper=True)
    def pytest_collection_finish(self, session: pytest.Session) -> Iterator[None]:
        # pytest-run-parallel wraps each test's function (in its own implementation of this hook,
        # which runs inside this wrapper) in one that calls it on threads it starts for the call:
        # the function it finds checks the thread it runs on.
        if session.config.pluginmanager.has_plugin("run-parallel"):  # its entry point's name
            for item in session.items:
                _check_each_thread(item, self)
        return (yield)

    def run_on_thread(self, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """Call a test's function; on a thread other than pytest's, check that thread."""
        if threading.get_ident() == self.runner:  # checked at the test's boundaries
            return fn(*args, **kwargs)
        before = _own(self.observer.read())
        try:
            return fn(*args, **kwargs)
        finally:
            found = changes(before, _own(self.observer.read()))
            if found:
                self.on_threads.append((threading.current_thread().name, found))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any) -> Iterator[Any]:
        self.runner = threading.get_ident()
        self.on_threads = []
        self.last = None
        self._mark()
        self.test = _Ledger(None, since_origin=False)
        self.owners = [self.test]
        try:
            return (yield)
        finally:
            self.owners, self.test = [], None

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        result = yield  # (after the setup: an error before it would leave pytest's half done)
        marker = item.get_closest_marker(MARKER)
        if marker is not None and not (marker.kwargs.get("reason") or marker.args):
            pytest.fail(
                f"{item.nodeid}: @pytest.mark.{MARKER} needs a reason: "
                f'@pytest.mark.{MARKER}(reason="why this test may change it")',
                pytrace=False,
            )
        return result

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Iterator[Any]:
        self._mark()
        ledger = _Ledger(self._origin(), since_origin=True)
        self.owners.append(ledger)
        self.fixtures[id(fixturedef)] = (ledger, False)
        try:
            result = yield
        finally:
            self._mark()
            self.owners.remove(ledger)
        # Added after the fixture's own teardown, so it runs before it (finalizers run last
        # added first): the start of the fixture's teardown.
        fixturedef.addfinalizer(lambda: self._teardown_starts(fixturedef))
        return result

    def _teardown_starts(self, fixturedef: Any) -> None:
        entry = self.fixtures.get(id(fixturedef))
        if entry is not None:
            self._mark()
            self.owners.append(entry[0])
            self.fixtures[id(fixturedef)] = (entry[0], True)

    @pytest.hookimpl(tryfirst=True)
    def pytest_fixture_post_finalizer(self, fixturedef: Any, request: Any) -> None:
        entry = self.fixtures.pop(id(fixturedef), None)
        if entry is None:
            return
        ledger, torn = entry
        if torn:
            self._mark()
            self.owners.remove(ledger)
        what = ledger.net()
        if what:  # "where" is the teardown that carries it, or else the end of the session
            self.pending.append(
                _finding("fixture", fixturedef.argname, "the session", what, fixturedef.scope)
            )

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: Any) -> Iterator[None]:
        try:
            yield
            failed = None
        except BaseException as exc:
            failed = exc
        self._mark()
        found = []
        if self.test is not None:
            self.owners = [self.test]
            what = self.test.net()
            tracer = item.config.pluginmanager.get_plugin("cyctx-tracer")
            if what and tracer is not None and self.last is not None:
                what = [(k, _cite(w, tracer, self.last.current)) for k, w in what]
            what += _on_threads(self.on_threads)
            self.on_threads = []
            if what:
                found.append(_finding("test", item.nodeid, item.nodeid, what))
                marker = item.get_closest_marker(MARKER)
                if marker is not None:
                    found[-1]["allowed"] = marker.kwargs.get("reason") or str(marker.args[0])
        for f in self.pending:
            f["where"] = item.nodeid
        found += self.pending
        self.pending = []
        for f in found:  # to the teardown report: junit-xml, xdist's controller, the summary
            item.user_properties.append((PROPERTY, json.dumps(f)))
        if failed is not None:
            raise failed
        leaks = [f for f in found if _is_leak(f)]
        if self.fail and leaks:
            # An error of this test's teardown, as pytest's own checks of unraisable exceptions
            # do it: CI shows an ERROR line for the test; the first line is what it shows.
            words = [w for f in leaks for k, w in f["changes"] if k == "leak"]
            pytest.fail(
                f"cyctx: {'; '.join(words)}\n"
                + "\n".join(
                    _title(f) + "".join(f"\n    {w}" for k, w in f["changes"] if k == "leak")
                    for f in leaks
                ),
                pytrace=False,
            )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            for name, value in report.user_properties:
                if name == PROPERTY:
                    self.findings.append(json.loads(str(value)))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # Fixtures torn down after the last test's teardown (an interrupted run tears down
        # here): kept here, or sent to the controller by an xdist worker.
        leftover, self.pending = self.pending, []
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[PROPERTY] = json.dumps(leftover)
        else:
            self.findings += leftover
        if self.fail and any(map(_is_leak, self.findings)) and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist: what a worker found outside its tests' teardowns."""
        sent = getattr(node, "workeroutput", {}).get(PROPERTY)
        if sent:
            self.findings += json.loads(sent)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        leaks = [f for f in self.findings if _is_leak(f)]
        if not leaks:
            tr.write_sep("=", "cyctx: no test left the CUDA context state changed", green=True)
        else:
            tests = sum(f["kind"] == "test" for f in leaks)
            fixtures = len(leaks) - tests
            who = " and ".join(
                f"{n} {word}{'s' if n > 1 else ''}"
                for n, word in ((tests, "test"), (fixtures, "fixture"))
                if n
            )
            tr.write_sep(
                "=",
                f"cyctx: {who} left the CUDA context state changed",
                red=self.fail,
                yellow=not self.fail,
            )
            for f in leaks:
                tr.write_line(_title(f))
                for kind, line in f["changes"]:
                    tr.write_line(f"    {line}" + ("  (note)" if kind == "note" else ""))
        allowed = [f for f in self.findings if f.get("allowed")]
        if allowed:
            tr.write_line(f"cyctx: changes allowed by @pytest.mark.{MARKER}:")
            for f in allowed:
                words = "; ".join(line for _, line in f["changes"])
                tr.write_line(f"  {f['name']} ({f['allowed']}): {words}")
        notes = [f for f in self.findings if f not in leaks and f not in allowed]
        if notes:
            tr.write_line(
                "cyctx: retains taken and kept (a framework's first use of a device does this):"
            )
            for f in notes:
                tr.write_line(f"  {_title(f)}: " + "; ".join(line for _, line in f["changes"]))


class _Owner:
    """A test or a fixture, as the trace sees it: the traced events of its own stretches of time
    (a fixture's setup and its teardown; a test's run less its fixtures')."""

    def __init__(self, title: str, since: float = 0.0) -> None:
        self.title = title
        self.since = since  # when it began (a fixture: its setup), in the trace's seconds
        self.events: list[Any] = []


def _same(a: Any, b: Any) -> bool:
    # The same handle with another id is another context (a reset), as the check has it.
    return (a.handle, a.id) == (b.handle, b.id)


class _Tracer:
    """``--cyctx-trace``: one cyctx trace over the session (docs/tracing.md, "In pytest"), cut
    into each test's and each fixture's stretches of time as the context check cuts them (a
    fixture's setup and teardown are the fixture's); for each test or fixture that left the
    current context of the thread that runs the tests changed, the call that made it current and
    where, and every context one destroyed or reset. A fixture that puts back at its teardown
    what was current before its setup changed nothing. Under pytest-xdist each worker traces its
    own tests and sends its findings to the controller, which traces nothing. cyctx is imported
    only here, when the option asks."""

    def __init__(self) -> None:
        self.trace: Any = None
        self.tests = 0
        self.events = 0
        self.dropped = 0
        self.found: list[str] = []  # the findings, in the order they were made
        self.reason: str | None = None
        self._thread = threading.get_native_id()  # the thread that runs the tests
        # Who ran when: the start of each stretch (the trace's seconds) and its owner (None:
        # between tests); the owners running now, innermost last.
        self._starts: list[float] = []
        self._stretch: list[_Owner | None] = []
        self._running: list[_Owner] = []
        self._fixtures: dict[int, _Owner] = {}
        self._test: _Owner | None = None
        self._nodeid: str | None = None
        self._given = 0  # the trace's events given to their owners so far
        # The events of the thread that runs the tests that say what was current, in order:
        # what was current when a fixture's setup began is the first one's after it.
        self._on_thread: list[Any] = []
        self._on_thread_t: list[float] = []

    def _active(self) -> bool:
        return self.trace is not None and self.trace.active

    def _now(self) -> float:
        return (time.monotonic_ns() - self.trace._t0) * 1e-9

    def _boundary(self) -> float:
        now = self._now()
        self._starts.append(now)
        self._stretch.append(self._running[-1] if self._running else None)
        return now

    def _give_out(self) -> None:
        """Collects the trace and gives each new event to the owner of its time."""
        t = self.trace
        t.collect()
        for e in t._built[self._given :]:
            i = bisect.bisect_right(self._starts, e.time_s) - 1
            owner = self._stretch[i] if i >= 0 else None
            if owner is not None:
                owner.events.append(e)
                self.events += 1
            if e.thread == self._thread and e.before is not None:
                at = bisect.bisect_right(self._on_thread_t, e.time_s)
                self._on_thread.insert(at, e)
                self._on_thread_t.insert(at, e.time_s)
        self._given = len(t._built)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if getattr(session.config, "workerinput", None) is None and _xdist_controller(
            session.config
        ):
            return  # the controller runs no test: its workers trace theirs
        import cyctx  # (a conftest has chosen the driver by now: pytest_configure)

        self.trace = cyctx.trace().start()
        self.reason = self.trace.reason

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any) -> Iterator[Any]:
        if not self._active():
            return (yield)
        self._thread = threading.get_native_id()
        self._nodeid = item.nodeid
        self._test = _Owner(item.nodeid)
        self._running = [self._test]
        self._boundary()
        try:
            return (yield)
        finally:
            self._running = []
            self._boundary()
            self._give_out()
            self.tests += 1
            self.found += self._findings(self._test)
            self._test = None

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Iterator[Any]:
        if not self._active() or self._test is None:
            return (yield)
        owner = _Owner(f"fixture {fixturedef.argname!r} ({fixturedef.scope} scope")
        self._running.append(owner)
        owner.since = self._boundary()
        self._fixtures[id(fixturedef)] = owner
        try:
            result = yield
        finally:
            self._running.remove(owner)
            self._boundary()
        # The start of the fixture's teardown, as _Checker's.
        fixturedef.addfinalizer(lambda: self._teardown_starts(fixturedef))
        return result

    def _teardown_starts(self, fixturedef: Any) -> None:
        owner = self._fixtures.get(id(fixturedef))
        if owner is not None and self._active():
            self._running.append(owner)
            self._boundary()

    @pytest.hookimpl(tryfirst=True)
    def pytest_fixture_post_finalizer(self, fixturedef: Any, request: Any) -> None:
        owner = self._fixtures.pop(id(fixturedef), None)
        if owner is None or not self._active():
            return
        if owner in self._running:
            self._running.remove(owner)
        self._boundary()
        self._give_out()
        owner.title += f", torn down at the end of {self._nodeid or 'the session'})"
        self.found += self._findings(owner)

    def _findings(self, owner: _Owner) -> list[str]:
        from cyctx._trace import made_current_by

        out = []
        events = sorted(owner.events, key=lambda e: (e.time_s, e.seq))
        mine = [e for e in events if e.thread == self._thread and e.changed]
        if mine:
            found = mine[0].before
            if owner is not self._test:
                # A fixture from what was current when its setup began.
                i = bisect.bisect_left(self._on_thread_t, owner.since)
                found = self._on_thread[i].before
            left = mine[-1].after
            if not _same(found, left):
                last = made_current_by(mine, self._thread, left.handle) or mine[-1]
                out.append(
                    f"{owner.title} left {left} current (it found {found}): made current by "
                    f"{last.describe()}"
                )
        # A context it made itself and destroyed is its own business (a fixture's primary
        # context, retained at its setup, released at its teardown): what is named is one that
        # was there before it, which a later test may have been using.
        made = {
            (e.target.handle, e.target.id)
            for e in events
            if e.call == "context created" and e.target is not None and e.target.id is not None
        }
        for e in events:
            if (
                e.call == "context destroy starting"
                and e.target is not None
                and (e.target.handle, e.target.id) not in made
            ):
                out.append(f"{owner.title} destroyed {e.target}: {e.describe()}")
        return out

    def made_current(self, handle: int) -> Any:
        """The running test's last call that made ``handle`` current on its thread."""
        if not self._active() or self._test is None:
            return None
        from cyctx._trace import made_current_by

        self._give_out()
        events = sorted(self._test.events, key=lambda e: (e.time_s, e.seq))
        return made_current_by(events, self._thread, handle)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.trace is not None:
            self.trace.stop()
            self.dropped += self.trace.dropped
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[TRACE_PROPERTY] = json.dumps(
                {
                    "tests": self.tests,
                    "events": self.events,
                    "dropped": self.dropped,
                    "found": self.found,
                    "reason": self.reason,
                }
            )

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist: a worker's tests, events and findings."""
        sent = getattr(node, "workeroutput", {}).get(TRACE_PROPERTY)
        if sent:
            got = json.loads(sent)
            self.tests += got["tests"]
            self.events += got["events"]
            self.dropped += got["dropped"]
            self.found += got["found"]
            self.reason = self.reason or got["reason"]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        if self.reason is not None:
            tr.write_sep("=", f"cyctx trace: not tracing: {self.reason}", yellow=True)
            return
        if self.trace is None and not self.tests:
            return
        tr.write_sep(
            "=",
            f"cyctx trace: {self.events} context events in {self.tests} tests"
            + (f", {self.dropped} lost" if self.dropped else ""),
        )
        for line in self.found:
            tr.write_line(line)


def _own(state: ContextState) -> ContextState:
    """A thread's own part of its state: the primary contexts and their retains are the
    process's, which the other threads of a parallel call change at the same time (the
    thread pytest runs the test on reads them, before and after the call)."""
    return dataclasses.replace(state, primaries=(), sim_retains=None)


def _on_threads(found: list[tuple[str, list[tuple[str, str]]]]) -> list[tuple[str, str]]:
    """The changes of a test's function on other threads, each said once with how many
    threads it was found on."""
    names: dict[tuple[str, str], list[str]] = {}
    for name, what in found:
        for change in what:
            names.setdefault(change, []).append(name)
    return [
        (kind, f"{words} (on {len(who)} of the threads pytest-run-parallel ran the test on)")
        if len(who) > 1
        else (kind, f"{words} (on pytest-run-parallel's thread {who[0]!r})")
        for (kind, words), who in names.items()
    ]


def _check_each_thread(item: pytest.Item, checker: _Checker) -> None:
    """Make ``item``'s test function check each thread it runs on (``run_on_thread``)."""
    fn = getattr(item, "obj", None)
    globals_ = getattr(fn, "__globals__", None)
    if (
        not callable(fn)
        or not isinstance(globals_, dict)
        or inspect.iscoroutinefunction(fn)
        or inspect.isasyncgenfunction(fn)
    ):
        return

    def each_thread(*args: Any, **kwargs: Any) -> Any:
        return checker.run_on_thread(fn, args, kwargs)

    # pytest-run-parallel tells a thread-unsafe test by the names its code calls, looked up in
    # the globals of the function it is given (and reads its source through __wrapped__): the
    # test's, as the test's own function has them.
    watched = types.FunctionType(
        each_thread.__code__, globals_, each_thread.__name__, None, each_thread.__closure__
    )
    item.obj = functools.update_wrapper(watched, fn)  # type: ignore[attr-defined]


def _xdist_controller(config: Any) -> bool:
    """Whether this process is pytest-xdist's controller (it hands the tests to workers)."""
    try:
        return bool(config.getoption("dist") != "no" and config.getoption("numprocesses"))
    except ValueError:  # no xdist
        return False


# The hooks' parameters are pytest's Parser and Config, typed Any: pytest's own types are
# partially unknown to a type checker, which would count against cyctx's type completeness.
def pytest_addoption(parser: Any) -> None:
    """The options ``--cyctx-check-contexts``, ``--cyctx-contexts-fail`` and ``--cyctx-trace``,
    and the ini settings ``cyctx_check_contexts`` and ``cyctx_contexts_fail``."""
    group = parser.getgroup("cyctx", "CUDA context checks (cyctx)")
    group.addoption(
        "--cyctx-check-contexts",
        action="store_true",
        default=None,
        help="report the tests and fixtures that change the CUDA context state of the thread "
        "that runs the tests (current context, primary contexts, open cyctx guards); it only "
        "reads it. ini: cyctx_check_contexts",
    )
    group.addoption(
        "--cyctx-contexts-fail",
        action="store_true",
        default=None,
        help="check as --cyctx-check-contexts does, and make each change an error at the "
        "teardown of the test during which it was found (notes of retains kept are not). "
        "ini: cyctx_contexts_fail",
    )
    group.addoption(
        "--cyctx-trace",
        action="store_true",
        default=None,
        help="trace every CUDA context change of the session (cyctx.trace(), which needs "
        "libcupti on a GPU: pip install cyctx[trace]) and name, for each test that left its "
        "thread's context changed or destroyed one, the call that did it and its line",
    )
    parser.addini(
        "cyctx_check_contexts",
        type="bool",
        default=False,
        help="turn --cyctx-check-contexts on for this project",
    )
    parser.addini(
        "cyctx_contexts_fail",
        type="bool",
        default=False,
        help="turn --cyctx-contexts-fail on for this project",
    )


def pytest_configure(config: Any) -> None:
    """Register the marker; register the checker only when an option asks for it."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(reason): the cyctx context check reports this test's changes of the CUDA "
        "context state as allowed, and the fail mode does not fail it for them",
    )
    fail = config.getoption("--cyctx-contexts-fail") or config.getini("cyctx_contexts_fail")
    on = fail or config.getoption("--cyctx-check-contexts") or config.getini("cyctx_check_contexts")
    if on:
        config.pluginmanager.register(_Checker(fail=bool(fail)), "cyctx-context-checker")
    if config.getoption("--cyctx-trace"):
        config.pluginmanager.register(_Tracer(), "cyctx-tracer")
