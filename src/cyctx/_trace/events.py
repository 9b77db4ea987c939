"""The trace's records: a traced call as :class:`ContextEvent` (the contexts it saw as
:class:`ContextRef`, where it came from as :class:`Frame` and :class:`NativeFrame`), the words
for how its frames were read, and its JSON (schema ``cyctx.trace/1``, docs/tracing.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SCHEMA = "cyctx.trace/1"

_DOMAINS = {1: "driver", 2: "runtime", 3: "resource"}
_NATIVE_STATES = {
    0: "the eval loop",  # reached the C frame of the eval loop that runs the calling Python frame
    1: "the end of the stack",  # a thread no Python code started
    2: "cut",  # the native_frames limit: who called the outermost frame is not known
    3: "native frames off",
    # A library was unloaded (dlclose) after this event's walk began, before its frames were
    # named: the walk may have used that library's unwind rules, or its addresses been named
    # after another library took them.
    4: "a library was unloaded between this walk and its naming: its native frames may be wrong",
    # The thread has an eval loop the walk did not reach: a frame without unwind information
    # (JIT code, hand-written assembly) stopped it, so who called that frame is not known.
    5: "stopped before the eval loop (a frame without unwind information)",
}
_UNLOADED = 4
_PY_STATES = {
    0: "read",
    1: "not a Python thread",
    2: "this Python's frame layout is not known to cyctx",
    3: "the interpreter was finalizing",
    4: "Python frames off",
}


@dataclass(frozen=True)
class ContextRef:
    """A context as an event saw it: its handle, its id (``cuCtxGetId``; None where the
    driver gave none: a destroyed context, or not asked) and its device (None: not asked)."""

    handle: int
    id: int | None
    device: int | None

    def __str__(self) -> str:
        if not self.handle:
            return "none"
        dev = "?" if self.device is None else self.device
        cid = "?" if self.id is None else self.id
        return f"{self.handle:#x} (device {dev}, id {cid})"

    def as_json(self) -> dict[str, Any]:
        return {"handle": self.handle, "id": self.id, "device": self.device}


@dataclass(frozen=True)
class Frame:
    """A Python frame: its file, line and function (qualified name) as Python shows them, and
    its place in the thread's stack (``depth``, 0 the innermost; None where not known)."""

    file: str
    line: int
    function: str
    depth: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


@dataclass(frozen=True)
class NativeFrame:
    library: str | None  # path of the shared object
    symbol: str | None
    owner: str  # the library it belongs to, in words: "cyctx", "torch", "cupy", ...


@dataclass(repr=False, slots=True)
class ContextEvent:
    """One traced call (or resource event) and where it came from. It prints (``str``,
    ``repr``) as its line of the report: the time, the thread, the call and its argument, the
    contexts before and after when it changed them, the call it ran inside, who made it and
    at which line. :meth:`describe` is the shorter form the report's answers use."""

    seq: int
    time_s: float  # since the trace started
    duration_s: float
    thread: int  # the OS thread id
    thread_name: str | None
    domain: str  # "driver", "runtime", "resource"
    call: str  # "cuCtxSetCurrent", ..., or "context created" / "context destroy starting"
    via: str | None  # the traced call this one ran inside (e.g. cudaSetDevice)
    result: int
    before: ContextRef | None  # current at the call (API events)
    after: ContextRef | None  # current at its return (API events)
    target: ContextRef | None  # the context argument or result (created, destroyed, pushed)
    device: int | None  # the device argument
    held_gil: bool
    python: list[Frame]
    python_state: str
    native: list[NativeFrame]
    native_state: str  # how the native walk ended (_NATIVE_STATES)
    library: str  # who made the call: "cyctx", "torch", "cupy", "cuda.core", "cuda-bindings", ...
    # (where the frames cannot tell, what they show, said so: "cuda-bindings (called from ...)")
    where: Frame | None  # the innermost Python frame outside the libraries (the user's line)
    cyctx_guard: bool  # made by a cyctx guard (its block is `where`)

    @property
    def changed(self) -> bool:
        """Whether the calling thread's current context differs after the call."""
        if self.before is None or self.after is None:
            return False
        return (self.before.handle, self.before.id) != (self.after.handle, self.after.id)

    def _line(self) -> str:
        """Its line of the report (the time right-aligned, as the report's lines are)."""
        name = self.thread_name or "?"
        if self.domain == "resource":
            what = f"{self.call} {self.target}"
        else:
            what = self.call
            if self.device is not None:
                what += f"({self.device})"
            elif self.target is not None:
                what += f"({self.target.handle:#x})"
            what += f" -> {self.result}" if self.result else ""
            if self.changed:
                what += f"  current {self.before} => {self.after}"
        who = "cyctx guard" if self.cyctx_guard else self.library
        at = f" at {self.where}" if self.where else ""
        via = f" [in {self.via}]" if self.via else ""
        return f"{self.time_s * 1e3:10.3f} ms  {self.thread} {name:<12} {what}{via}  by {who}{at}"

    def __str__(self) -> str:
        return self._line().lstrip()

    __repr__ = __str__

    def describe(self) -> str:
        """The call, the call it ran inside, who made it and where: ``cuCtxSetCurrent by
        cuda-bindings at app.py:12 (main)``."""
        who = "cyctx guard" if self.cyctx_guard else self.library
        at = f" at {self.where}" if self.where else ""
        if not self.python and self.python_state != "read":
            at += f" (no Python frames: {self.python_state})"
        via = f" inside {self.via}" if self.via else ""
        return f"{self.call}{via} by {who}{at}"

    def as_json(self) -> dict[str, Any]:
        ref = lambda r: None if r is None else r.as_json()  # noqa: E731
        return {
            "seq": self.seq,
            "time_s": self.time_s,
            "duration_s": self.duration_s,
            "thread": self.thread,
            "thread_name": self.thread_name,
            "domain": self.domain,
            "call": self.call,
            "via": self.via,
            "result": self.result,
            "before": ref(self.before),
            "after": ref(self.after),
            "target": ref(self.target),
            "device": self.device,
            "changed": self.changed,
            "held_gil": self.held_gil,
            "python": [
                {"file": f.file, "line": f.line, "function": f.function, "depth": f.depth}
                for f in self.python
            ],
            "python_state": self.python_state,
            "native_state": self.native_state,
            "native": [
                {"library": n.library, "symbol": n.symbol, "owner": n.owner} for n in self.native
            ],
            "library": self.library,
            "where": None
            if self.where is None
            else {
                "file": self.where.file,
                "line": self.where.line,
                "function": self.where.function,
            },
            "cyctx_guard": self.cyctx_guard,
        }


class TraceError(RuntimeError):
    """Bad use of a trace (started twice, asked before it ended)."""


def made_current_by(events: list[ContextEvent], thread: int, handle: int) -> ContextEvent | None:
    """The last of ``events`` that made ``handle`` current on ``thread`` from another context
    (or none: handle 0); a call that only changed the current context's id (its release or
    reset destroyed it) did not make it current. None when no event did."""
    for e in reversed(events):
        if (
            e.thread == thread
            and e.changed
            and e.after is not None
            and e.after.handle == handle
            and (e.before is None or e.before.handle != handle)
        ):
            return e
    return None
