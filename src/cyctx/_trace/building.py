"""A trace's raw records built into :class:`ContextEvent` objects, batch by batch as they are
collected, each record once: what one batch leaves open (a handle's last id and device, a
"context created" event whose call has not returned yet) is carried into the next."""

from __future__ import annotations

import os
from typing import Any

from cyctx._trace.attribution import Naming, _attribute
from cyctx._trace.events import (
    _DOMAINS,
    _NATIVE_STATES,
    _PY_STATES,
    _UNLOADED,
    ContextEvent,
    ContextRef,
    Frame,
    NativeFrame,
)


class Builder:
    """Builds one trace's records. ``trace``: its start time (set before it is given), its
    limits, its native module."""

    def __init__(self, trace: Any) -> None:
        self._t0 = trace._t0
        self._native_frames = trace.native_frames
        self._names = Naming(skip=(os.path.realpath(trace._native.__file__),))
        self._frames: dict[tuple[str | None, str | None], NativeFrame] = {}
        # What each distinct stack was named: the frames read, the native ones, the unloaded
        # state and the cut decide it, and a trace has few distinct ones.
        self._stacks: dict[
            tuple, tuple[list[Frame], list[NativeFrame], str, bool, Frame | None]
        ] = {}
        self._refs: dict[tuple[int, int, int], ContextRef] = {}
        # The id and device each handle was last seen with, in the order of the records.
        self._last_id: dict[int, int] = {}
        self._last_dev: dict[int, int] = {}
        # Resource events waiting for the exit of the call they ran inside, oldest first.
        self._pending: list[ContextEvent] = []

    def add(self, raw: list[dict[str, Any]]) -> list[ContextEvent]:
        """The events of ``raw`` (the next records, in the buffer's order), in that order."""
        dirs = self._names.dirs
        self._names.refresh()  # a package imported since the last batch names its files
        if self._names.dirs is not dirs:
            self._frames.clear()
            self._stacks.clear()
        events = [self._event(r) for r in raw]
        self._complete(events)
        return events

    def _native(self, names: list[tuple[str | None, str | None]]) -> list[NativeFrame]:
        out: list[NativeFrame] = []
        for lib, sym in names:
            if not out and self._names.is_driver_side(lib):
                continue  # the tracer, libcupti, the driver: below the caller
            frame = self._frames.get((lib, sym))
            if frame is None:
                owner = self._names.owner_of(lib) or (os.path.basename(lib) if lib else "?")
                frame = self._frames[(lib, sym)] = NativeFrame(lib, sym, owner)
            out.append(frame)
        return out

    def _ref(self, h: int, cid: int, dev: int) -> ContextRef:
        key = (h, cid, dev)
        ref = self._refs.get(key)
        if ref is None:
            ref = self._refs[key] = ContextRef(h, cid or None, None if dev < 0 else dev)
        if h:
            if cid:
                self._last_id[h] = cid
            if dev >= 0:
                self._last_dev[h] = dev
        return ref

    def _stack(self, r: dict[str, Any], native_state: int) -> tuple:
        key = (tuple(r["python"]), tuple(r["names"]), native_state, r["py_cut"])
        found = self._stacks.get(key)
        if found is None:
            native = self._native(r["names"])
            python = [Frame(*f) for f in r["python"]]
            library, cyctx_guard, where = _attribute(
                python,
                bool(r["py_cut"]),
                native,
                native_state,
                self._names.dirs,
                self._native_frames,
                self._names,
            )
            found = self._stacks[key] = (python, native, library, cyctx_guard, where)
        return found

    def _event(self, r: dict[str, Any]) -> ContextEvent:
        native_state = _UNLOADED if r["unloaded"] else r["native_state"]
        python, native, library, cyctx_guard, where = self._stack(r, native_state)
        dom = _DOMAINS.get(r["domain"], str(r["domain"]))
        target: ContextRef | None
        if dom == "resource":
            h = r["arg_ctx"]
            before = after = None
            # Not asked in the callback (the driver holds its locks there). A destroyed
            # context: the id and device its handle was last seen with (None if never); a
            # created one is new: the enclosing call's exit tells (_complete).
            if r["cbid"] == 2:
                target = ContextRef(h, self._last_id.get(h), self._last_dev.get(h))
            else:
                target = ContextRef(h, None, None)
        else:
            before = self._ref(r["before"], r["before_id"], r["before_dev"])
            after = self._ref(r["after"], r["after_id"], r["after_dev"])
            # The device argument is the target's device (a retain's, a create's).
            target = (
                self._ref(r["arg_ctx"], r["arg_ctx_id"], r["arg_dev"]) if r["arg_ctx"] else None
            )
        # Positional, in the order of ContextEvent's fields (a third of the keywords' cost).
        return ContextEvent(
            r["seq"],
            (r["t_ns"] - self._t0) * 1e-9,
            (r["t_ns"] - r["t_enter_ns"]) * 1e-9,
            r["tid"],
            None,  # thread_name: given at the stop, after the threads living then
            dom,
            r["func"],
            r["via"] or None,
            r["result"],
            before,
            after,
            target,
            None if r["arg_dev"] < 0 else r["arg_dev"],
            bool(r["gil"]),
            list(python),
            _PY_STATES.get(r["py_state"], "?"),
            list(native),
            _NATIVE_STATES.get(native_state, "?"),
            library,
            where,
            cyctx_guard,
        )

    def _complete(self, events: list[ContextEvent]) -> None:
        """A resource event happens inside a call (via); that call's exit, later on the same
        thread, names the context's id and device (a retain's, a create's result; a destroy's
        argument). The first such exit that entered after the event is another call: this one's
        exit was lost (a full buffer), and nothing more is known. The exit may come in a later
        batch: the event waits for it."""
        exits: dict[tuple[int, str], list[ContextEvent]] = {}
        for e in sorted(events, key=lambda e: (e.time_s, e.seq)):
            if e.domain != "resource":
                exits.setdefault((e.thread, e.call), []).append(e)
            elif e.target is not None and e.via:
                self._pending.append(e)
        waiting = []
        for e in self._pending:
            later = next(
                (
                    x
                    for x in exits.get((e.thread, e.via or ""), ())
                    if (x.time_s, x.seq) > (e.time_s, e.seq)
                ),
                None,
            )
            if later is None:
                waiting.append(e)
                continue
            if later.time_s - later.duration_s <= e.time_s + 1e-9:  # 1 ns: float rounding
                assert e.target is not None
                t = later.target
                cid = e.target.id
                if cid is None and t is not None and t.handle == e.target.handle:
                    cid = t.id
                dev = later.device if later.device is not None else e.target.device
                e.target = ContextRef(e.target.handle, cid, dev)
        self._pending = waiting
