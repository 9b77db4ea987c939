"""The :class:`Trace` object: starts and stops the native subscriber (``_native``, built from
tracer.c), collects and names its raw records, builds the events and answers the questions."""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
import time
from collections import Counter
from typing import Any

from cyctx._trace.attribution import (
    _attribute,
    _is_driver_side,
    _live_thread_names,
    _owner_of,
    _package_dirs,
)
from cyctx._trace.events import (
    _DOMAINS,
    _NATIVE_STATES,
    _PY_STATES,
    _UNLOADED,
    SCHEMA,
    ContextEvent,
    ContextRef,
    Frame,
    NativeFrame,
    TraceError,
)

_lock = threading.Lock()
_running: Trace | None = None


def _driver() -> tuple[bool, int | None]:
    """(simulated, CUDA major of the driver) of the libcuda.so.1 in the process; loads the real
    one if none is loaded yet (libcupti would load it anyway)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False, None
    simulated = hasattr(lib, "cyctxsim_is_simulated")
    v = ctypes.c_int(0)
    try:
        ok = lib.cuDriverGetVersion(ctypes.byref(v)) == 0
    except AttributeError:
        ok = False
    return simulated, (v.value // 1000 if ok else None)


class Trace:
    """What ``cyctx.trace()`` returns: a context manager that records every context change of
    the process between its start and its stop, and answers questions about them afterwards.

    A trace that cannot subscribe (another CUPTI subscriber such as a profiler, no libcupti, a
    driver older than CUDA 12) says so in one line on stderr, records nothing and changes
    nothing: ``active`` is False and ``reason`` says why.
    """

    def __init__(
        self,
        *,
        python_frames: int = 4,
        native_frames: int = 64,
        capacity: int = 16384,
        quiet: bool = False,
    ) -> None:
        import cyctx._trace._native as _native  # type: ignore[import-not-found]  # compiled

        if not 0 <= python_frames <= _native.MAX_PY:
            raise ValueError(f"python_frames must be 0..{_native.MAX_PY}, not {python_frames!r}")
        if not 0 <= native_frames <= _native.MAX_NATIVE:
            raise ValueError(
                f"native_frames must be 0..{_native.MAX_NATIVE}, not {native_frames!r}"
            )
        if not 1 <= capacity <= 1 << 24:
            raise ValueError(f"capacity must be 1..{1 << 24} events, not {capacity!r}")
        self._native = _native
        self.python_frames = python_frames
        self.native_frames = native_frames
        self.capacity = capacity
        self.quiet = quiet
        self.active: bool = False
        self.finished: bool = False
        self.reason: str | None = None
        self.simulated: bool | None = None
        self.cupti: str | None = None
        self.cupti_found_via: str | None = None
        self.events: list[ContextEvent] = []
        self.dropped: int = 0
        self._t0 = 0
        self._raw: list[dict[str, Any]] = []
        self._threads: dict[tuple[int, int], str] = {}
        # Names of return addresses (dladdr), kept while no library is unloaded (collect()):
        # given under the loader's count of unloads _names_subs.
        self._names: dict[int, tuple[str | None, str | None]] = {}
        self._names_subs = -1
        self._collecting = threading.Lock()  # a collection's naming and its check, together
        self.unloaded: int = 0  # events whose native frames may be wrong (a library was unloaded)

    # -- start / stop --
    def start(self) -> Trace:
        global _running
        if self.active or self.finished:
            raise TraceError("a trace runs once: make a new one with cyctx.trace()")
        with _lock:
            if _running is not None:
                return self._refuse("a cyctx trace is already running in this process")
            simulated, major = _driver()
            self.simulated = simulated
            if major is None:
                return self._refuse("no CUDA driver (libcuda.so.1) could be loaded")
            from cyctx._trace.locate import find_cupti

            path, how = find_cupti(major)
            if path is None:
                return self._refuse(how)
            self.cupti, self.cupti_found_via = path, how
            self._t0 = time.monotonic_ns()
            why = self._native.start(path, self.python_frames, self.native_frames, self.capacity)
            if why is not None:
                return self._refuse(why)
            self.active = True
            _running = self
        return self

    def _refuse(self, why: str) -> Trace:
        self.reason = why
        self.finished = True
        if not self.quiet:
            sys.stderr.write(f"cyctx trace: not tracing: {why}\n")
        return self

    def stop(self) -> Trace:
        global _running
        if not self.active:
            return self
        self._native.stop()
        self.collect()
        dropped = self._native.drain()[1]
        raw = self._raw
        self._native.release()
        self._threads = _live_thread_names(self._native)
        with _lock:
            _running = None
        self.active = False
        self.finished = True
        self.dropped = dropped
        self._raw = raw
        self.events = self._build(raw)
        self.unloaded = sum(r["unloaded"] for r in raw)
        if dropped and not self.quiet:
            sys.stderr.write(
                f"cyctx trace: {dropped} events were lost (the buffer of {self.capacity} was full;"
                f" pass capacity=)\n"
            )
        if self.unloaded and not self.quiet:
            sys.stderr.write(
                f"cyctx trace: a library was unloaded while tracing: the native frames of "
                f"{self.unloaded} events may be wrong (their native_state says so)\n"
            )
        return self

    def collect(self) -> None:
        """Move what the buffer holds now into this trace, while it runs (a long trace drains
        itself this way, so that its buffer need only hold what happens in between). The events'
        native frames are named now, then the loader is asked whether a library was unloaded
        since the last collection: if so, those events say their native frames may be wrong
        (docs/tracing.md, "A library unloaded while tracing")."""
        if not self.active:
            return
        with self._collecting:
            self._collect()

    def _collect(self) -> None:
        batch = self._native.drain()[0]
        # Named now, not when the trace stops: a library unloaded later, and another loaded at
        # its addresses, would give them the other's names. A name kept from an earlier
        # collection is right while nothing was unloaded since.
        subs = self._native.unloads()
        if subs < 0 or subs != self._names_subs:
            self._names.clear()
            self._names_subs = subs
        # A frame that was in no loaded object when it was walked (a JIT's code) is named so: a
        # library loaded at its address since would otherwise give it its name.
        todo = sorted(
            {
                a
                for r in batch
                for i, a in enumerate(r["native"])
                if a not in self._names and i not in r["outside"]
            }
        )
        for a, res in zip(todo, self._native.resolve(todo), strict=True):
            self._names[a] = (res[0], res[1])
        for r in batch:
            outside = set(r["outside"])
            r["names"] = [
                (None, None) if i in outside else self._names[a] for i, a in enumerate(r["native"])
            ]
        # Then the loader's count of unloads again (tracer.c, unloads): an event whose walk
        # began under the same count was walked and named with nothing unloaded in between;
        # one walked under an earlier count may have been walked through a gone library, or
        # named after it was gone. A loader that does not count proves nothing.
        now = self._native.unloads()
        if now != subs:
            self._names.clear()
            self._names_subs = -1
        for r in batch:
            r["unloaded"] = r["native_state"] != 3 and (now < 0 or r["subs"] != now)
        self._raw.extend(batch)

    def snapshot(self) -> list[ContextEvent]:
        """The events so far of a running trace (all of a stopped one's), for a caller that
        asks while it runs: the doctor cites them."""
        if not self.active:
            return list(self.events)
        self.collect()
        return self._build(self._raw)

    def __enter__(self) -> Trace:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- building events --
    def _build(
        self,
        raw: list[dict[str, Any]],
        seen: tuple[dict[int, int], dict[int, int]] | None = None,
    ) -> list[ContextEvent]:
        """Events of ``raw`` records. ``seen``: the id and device each handle was last seen
        with, kept by a caller that builds a trace's records in pieces, in order."""
        dirs = _package_dirs()
        skip = (os.path.realpath(self._native.__file__),)
        last_id, last_dev = seen if seen is not None else ({}, {})
        events = []
        for r in raw:
            native: list[NativeFrame] = []
            for lib, sym in r["names"]:
                if _is_driver_side(lib, skip) and not native:
                    continue  # the tracer, libcupti, the driver: below the caller
                owner = _owner_of(lib, dirs) or (os.path.basename(lib) if lib else "?")
                native.append(NativeFrame(lib, sym, owner))
            python = [Frame(f, line, fn) for f, line, fn in r["python"]]
            native_state = _UNLOADED if r["unloaded"] else r["native_state"]
            library, cyctx_guard, where = _attribute(
                python,
                len(python) >= self.python_frames,
                native,
                native_state,
                dirs,
                self.native_frames,
            )
            dom = _DOMAINS.get(r["domain"], str(r["domain"]))

            def ref(h: int, cid: int, dev: int) -> ContextRef:
                if h and cid:
                    last_id[h] = cid
                if h and dev >= 0:
                    last_dev[h] = dev
                return ContextRef(h, cid or None, None if dev < 0 else dev)

            if dom == "resource":
                h = r["arg_ctx"]
                before = after = None
                # Not asked in the callback (the driver holds its locks there). A destroyed
                # context: the id and device its handle was last seen with (None if never); a
                # created one is new: the enclosing call's exit tells (below).
                if r["cbid"] == 2:
                    target = ContextRef(h, last_id.get(h), last_dev.get(h))
                else:
                    target = ContextRef(h, None, None)
            else:
                before = ref(r["before"], r["before_id"], r["before_dev"])
                after = ref(r["after"], r["after_id"], r["after_dev"])
                # The device argument is the target's device (a retain's, a create's).
                target = ref(r["arg_ctx"], r["arg_ctx_id"], r["arg_dev"]) if r["arg_ctx"] else None  # type: ignore[assignment]
            events.append(
                ContextEvent(
                    seq=r["seq"],
                    time_s=(r["t_ns"] - self._t0) * 1e-9,
                    duration_s=(r["t_ns"] - r["t_enter_ns"]) * 1e-9,
                    thread=r["tid"],
                    thread_name=self._threads.get(r["ts"]) if r["ts"][1] else None,
                    domain=dom,
                    call=r["func"],
                    via=r["via"] or None,
                    result=r["result"],
                    before=before,
                    after=after,
                    target=target,
                    device=None if r["arg_dev"] < 0 else r["arg_dev"],
                    held_gil=bool(r["gil"]),
                    python=python,
                    python_state=_PY_STATES.get(r["py_state"], "?"),
                    native=native,
                    native_state=_NATIVE_STATES.get(native_state, "?"),
                    library=library,
                    where=where,
                    cyctx_guard=cyctx_guard,
                )
            )
        # The buffer is in claim order; a call's event is written at its exit, so order by time.
        events.sort(key=lambda e: (e.time_s, e.seq))
        # A resource event happens inside a call (via); that call's exit, later on the same
        # thread, names the context's id and device (a retain's, a create's result; a
        # destroy's argument). The first such exit that entered after the event is another
        # call: this one's exit was lost (a full buffer), and nothing more is known.
        for i, e in enumerate(events):
            if e.domain != "resource" or e.target is None or not e.via:
                continue
            for later in events[i + 1 :]:
                if later.thread == e.thread and later.call == e.via and later.domain != "resource":
                    if later.time_s - later.duration_s <= e.time_s + 1e-9:  # 1 ns: float rounding
                        t = later.target
                        cid = e.target.id
                        if cid is None and t is not None and t.handle == e.target.handle:
                            cid = t.id
                        dev = later.device if later.device is not None else e.target.device
                        e.target = ContextRef(e.target.handle, cid, dev)
                    break
        return events

    # -- questions --
    def _need_finished(self) -> None:
        if self.active:
            raise TraceError("the trace is still running: ask after its `with` block ends")

    def changes(self, thread: int | None = None) -> list[ContextEvent]:
        """The calls that changed their thread's current context, in order (optionally one
        thread's, by OS thread id as ``threading.get_native_id()`` gives it)."""
        self._need_finished()
        return [e for e in self.events if e.changed and (thread is None or e.thread == thread)]

    def who_made_current(self, thread: int | None = None) -> ContextEvent | None:
        """The last call that changed the current context of ``thread`` (default: the calling
        thread): the one that made its current context current, as far as this trace saw.
        None when no call in the trace changed it (it was current before the trace started).
        A driver call made inside a runtime call (cudaSetDevice) names it in ``via``."""
        tid = threading.get_native_id() if thread is None else thread
        found = self.changes(tid)
        return found[-1] if found else None

    def who_destroyed(self, context: int | ContextRef) -> list[ContextEvent]:
        """Every destruction of ``context`` (a handle, or a :class:`ContextRef`, which also
        matches its id) in the trace: the driver's "context destroy starting" event, which names
        the call it ran inside (``via``: cuCtxDestroy, cuDevicePrimaryCtxReset,
        cuDevicePrimaryCtxRelease, cudaDeviceReset) and where that call came from. A primary
        context keeps its handle across a reset: with a plain handle every one is listed."""
        self._need_finished()
        if isinstance(context, ContextRef):
            handle, cid = context.handle, context.id
        elif isinstance(context, int) and not isinstance(context, bool):
            handle, cid = context, None
        else:
            h = getattr(context, "handle", None)
            if not isinstance(h, int):
                raise TypeError(
                    f"who_destroyed() takes a context handle (int) or a ContextRef, not {type(context).__name__}"
                )
            handle, cid = h, None
        return [
            e
            for e in self.events
            if e.call == "context destroy starting"
            and e.target is not None
            and e.target.handle == handle
            and (cid is None or e.target.id == cid)
        ]

    def libraries_touching(self, device: int) -> dict[str, int]:
        """How many traced calls each library made on ``device`` (as argument, or as the device
        of the context current before or after the call)."""
        self._need_finished()
        if not isinstance(device, int) or isinstance(device, bool) or device < 0:
            raise ValueError(f"device must be an ordinal (int >= 0), not {device!r}")
        count: Counter[str] = Counter()
        for e in self.events:
            devs = {e.device}
            for r in (e.before, e.after, e.target):
                if r is not None:
                    devs.add(r.device)
            if device in devs:
                count["cyctx guard" if e.cyctx_guard else e.library] += 1
        return dict(count.most_common())

    # -- output --
    def report(self) -> str:
        """The trace in words: each event, then the answers per thread."""
        if self.reason:
            return f"cyctx trace: not tracing: {self.reason}"
        self._need_finished()
        driver = (
            "the simulated driver" if self.simulated else f"{self.cupti} ({self.cupti_found_via})"
        )
        threads = sorted({e.thread for e in self.events})
        lines = [
            f"cyctx trace: {len(self.events)} events on {len(threads)} "
            f"thread{'' if len(threads) == 1 else 's'}, through {driver}"
            + (f"; {self.dropped} LOST (buffer full)" if self.dropped else "")
            + (
                f"; {self.unloaded} with native frames that may be wrong (a library was unloaded)"
                if self.unloaded
                else ""
            )
        ]
        for e in self.events:
            name = e.thread_name or "?"
            if e.domain == "resource":
                what = f"{e.call} {e.target}"
            else:
                what = f"{e.call}"
                if e.device is not None:
                    what += f"({e.device})"
                elif e.target is not None:
                    what += f"({e.target.handle:#x})"
                what += f" -> {e.result}" if e.result else ""
                if e.changed:
                    what += f"  current {e.before} => {e.after}"
            who = "cyctx guard" if e.cyctx_guard else e.library
            at = f" at {e.where}" if e.where else ""
            via = f" [in {e.via}]" if e.via else ""
            lines.append(
                f"  {e.time_s * 1e3:10.3f} ms  {e.thread} {name:<12} {what}{via}  by {who}{at}"
            )
        lines.append("who made each thread's context current (its last change):")
        for t in threads:
            last = self.changes(t)
            if last:
                lines.append(f"  thread {t}: {last[-1].after} by {last[-1].describe()}")
        gone = [e for e in self.events if e.call == "context destroy starting"]
        if gone:
            lines.append("contexts destroyed or reset:")
            for e in gone:
                lines.append(f"  {e.target}: {e.describe()}")
        devices: list[int] = sorted(
            {
                d
                for e in self.events
                for d in [e.device] + [r.device for r in (e.before, e.after, e.target) if r]
                if d is not None
            }
        )
        if devices:
            lines.append("libraries per device:")
            for d in devices:
                libs = ", ".join(f"{k} ({v})" for k, v in self.libraries_touching(d).items())
                lines.append(f"  device {d}: {libs}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The trace as plain JSON-able data (schema ``cyctx.trace/1``, docs/tracing.md)."""
        self._need_finished()
        return {
            "schema": SCHEMA,
            "active": self.reason is None,
            "reason": self.reason,
            "driver": None
            if self.simulated is None
            else ("simulated" if self.simulated else "real"),
            "cupti": self.cupti,
            "cupti_found_via": self.cupti_found_via,
            "dropped": self.dropped,
            "events": [e.as_json() for e in self.events],
        }


def _stop_at_exit() -> None:
    # The interpreter's frames must not be read once it finalizes: stop first.
    t = _running
    if t is not None:
        t.stop()


atexit.register(_stop_at_exit)


def trace(
    *, python_frames: int = 4, native_frames: int = 64, capacity: int = 16384, quiet: bool = False
) -> Trace:
    """Record every context change of the process while the returned :class:`Trace` is on
    (``with cyctx.trace() as t:``). See docs/tracing.md."""
    return Trace(
        python_frames=python_frames, native_frames=native_frames, capacity=capacity, quiet=quiet
    )
