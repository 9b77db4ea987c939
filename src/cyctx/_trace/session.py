"""The :class:`Trace` object: checks its options, starts and stops the native subscriber
(``_native``, built from tracer.c), collects its raw records and builds them into events as it
collects them (``building``), and answers the questions."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from cyctx._trace.attribution import _live_thread_names, library_markers
from cyctx._trace.building import Builder
from cyctx._trace.events import SCHEMA, ContextEvent, ContextRef, TraceError
from cyctx._trace.options import check_options

NEVER_STARTED = (
    "the trace was never started (start it with `with cyctx.trace() as t:` or t.start())"
)

_lock = threading.Lock()
_running: Trace | None = None


def _driver() -> tuple[bool, int | None]:
    """(simulated, CUDA major of the driver) of the libcuda.so.1 in the process; loads the real
    one if none is loaded yet (libcupti would load it anyway)."""
    from _cyctx_libcuda import LOAD_ERRORS, exports

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except LOAD_ERRORS:
        return False, None
    simulated = exports(lib, "cyctxsim_is_simulated")
    v = ctypes.c_int(0)
    ok = exports(lib, "cuDriverGetVersion") and lib.cuDriverGetVersion(ctypes.byref(v)) == 0
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

        python_frames, native_frames, capacity, quiet = check_options(
            _native, python_frames, native_frames, capacity, quiet
        )
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
        self._started = False
        self._t0 = 0
        self._raw: list[dict[str, Any]] = []
        # The events built so far, in the order of the buffer (each built once, as collected),
        # and the thread state of each, which names its thread at the stop.
        self._built: list[ContextEvent] = []
        self._ts: list[tuple[int, int]] = []
        self._builder: Builder | None = None
        # Names of return addresses (dladdr), kept while no library is unloaded (collect()):
        # given under the loader's count of unloads _names_subs.
        self._names: dict[int, tuple[str | None, str | None]] = {}
        self._stack_names: dict[tuple[tuple[int, ...], tuple[int, ...]], list] = {}
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
            self._builder = Builder(self)
            why = self._native.start(
                path, self.python_frames, self.native_frames, self.capacity, library_markers()
            )
            if why is not None:
                return self._refuse(why)
            self.active = self._started = True
            _running = self
        return self

    def _refuse(self, why: str) -> Trace:
        self._started = True
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
        with _collector_paused():
            self.collect()
            dropped = self._native.drain()[1]
            self._native.release()
            threads = _live_thread_names(self._native)
            for e, ts in zip(self._built, self._ts, strict=True):
                e.thread_name = threads.get(ts) if ts[1] else None
            with _lock:
                _running = None
            self.active = False
            self.finished = True
            self.dropped = dropped
            self.events = _in_time_order(self._built)
            self.unloaded = sum(r["unloaded"] for r in self._raw)
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
        with self._collecting, _collector_paused():
            self._collect()

    def _collect(self) -> None:
        batch = self._native.drain()[0]
        # Named now, not when the trace stops: a library unloaded later, and another loaded at
        # its addresses, would give them the other's names. A name kept from an earlier
        # collection is right while nothing was unloaded since.
        subs = self._native.unloads()
        if subs < 0 or subs != self._names_subs:
            self._names.clear()
            self._stack_names.clear()
            self._names_subs = subs
        # Each distinct stack is named once (a trace has few): its return addresses, and which
        # of them were in no loaded object when walked (a JIT's code), named so: a library
        # loaded at its address since would otherwise give it its name.
        keys = [(tuple(r["native"]), tuple(r["outside"])) for r in batch]
        new = {k for k in keys if k not in self._stack_names}
        todo = sorted(
            {
                a
                for native, outside in new
                for i, a in enumerate(native)
                if a not in self._names and i not in outside
            }
        )
        for a, res in zip(todo, self._native.resolve(todo), strict=True):
            self._names[a] = (res[0], res[1])
        for native, outside in new:
            self._stack_names[(native, outside)] = [
                (None, None) if i in outside else self._names[a] for i, a in enumerate(native)
            ]
        for r, k in zip(batch, keys, strict=True):
            r["names"] = self._stack_names[k]
        # Then the loader's count of unloads again (tracer.c, unloads): an event whose walk
        # began under the same count was walked and named with nothing unloaded in between;
        # one walked under an earlier count may have been walked through a gone library, or
        # named after it was gone. A loader that does not count proves nothing.
        now = self._native.unloads()
        if now != subs:
            self._names.clear()
            self._stack_names.clear()
            self._names_subs = -1
        for r in batch:
            r["unloaded"] = r["native_state"] != 3 and (now < 0 or r["subs"] != now)
        self._raw.extend(batch)
        assert self._builder is not None
        self._built.extend(self._builder.add(batch))
        self._ts.extend(r["ts"] for r in batch)

    def snapshot(self) -> list[ContextEvent]:
        """The events so far of a running trace (all of a stopped one's), for a caller that
        asks while it runs: the doctor cites them. Each event is built once, when it is
        collected: a later snapshot and the stop give the same objects, which later collections
        may complete (a "context created" event's id, from the exit of the call it ran inside;
        the thread's name, at the stop)."""
        if not self.active:
            return list(self.events)
        self.collect()
        return _in_time_order(self._built)

    def _forget(self) -> None:
        """Drops what was collected (a benchmark or a stress run counts events and keeps
        none)."""
        with self._collecting:
            self._raw.clear()
            self._built.clear()
            self._ts.clear()

    def __enter__(self) -> Trace:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- building events (tests build records again, at once or in pieces) --
    def _build(self, raw: list[dict[str, Any]]) -> list[ContextEvent]:
        return self._build_in_pieces([raw])

    def _build_in_pieces(self, pieces: list[list[dict[str, Any]]]) -> list[ContextEvent]:
        builder = Builder(self)
        built: list[ContextEvent] = []
        for piece in pieces:
            built += builder.add(piece)
        threads = _live_thread_names(self._native)
        raw = [r for piece in pieces for r in piece]
        for e, r in zip(built, raw, strict=True):
            e.thread_name = threads.get(r["ts"]) if r["ts"][1] else None
        return _in_time_order(built)

    # -- questions --
    def _need_finished(self) -> None:
        if self.active:
            raise TraceError("the trace is still running: ask after its `with` block ends")
        if not self._started:
            raise TraceError(NEVER_STARTED)

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
        if self.reason or not self._started:
            return f"cyctx trace: not tracing: {self.reason or NEVER_STARTED}"
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
        lines += [f"  {e._line()}" for e in self.events]
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
        if self._started:
            self._need_finished()
        reason = self.reason if self._started else NEVER_STARTED
        return {
            "schema": SCHEMA,
            "active": reason is None,
            "reason": reason,
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


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector paused while a collection builds its events: they make no
    cycles, and each pass of the collector over the trace's growing set of objects would make
    the cost of naming an event grow with the size of the trace."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _in_time_order(events: list[ContextEvent]) -> list[ContextEvent]:
    # The buffer is in claim order; a call's event is written at its exit, so order by time
    # (a few out of place: a sort of runs in order costs about one pass).
    return sorted(events, key=lambda e: (e.time_s, e.seq))


def trace(
    *, python_frames: int = 4, native_frames: int = 64, capacity: int = 16384, quiet: bool = False
) -> Trace:
    """Record every context change of the process while the returned :class:`Trace` is on
    (``with cyctx.trace() as t:``). See docs/tracing.md."""
    return Trace(
        python_frames=python_frames, native_frames=native_frames, capacity=capacity, quiet=quiet
    )
