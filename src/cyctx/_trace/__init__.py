"""cyctx.trace(): who changed my context? (docs/tracing.md)

A CUPTI callback subscriber (``_native``, built from tracer.c) records every context change of
the process while a trace is on: the call, the thread, the time, the context before and after
(handle, id, device), and where it came from (the Python frames of the calling thread and the
native libraries on its stack). The package starts and stops it (``session``), turns the raw
records into :class:`ContextEvent` objects (``events``) named after their callers
(``attribution``), and answers the questions: who made the current context of a
thread current, who reset or destroyed a context, which libraries touch a device. Loaded only
when a trace starts; ``import cyctx`` loads none of it.
"""

from __future__ import annotations

from typing import Any

from cyctx._trace import session as _session
from cyctx._trace.events import (
    SCHEMA,
    ContextEvent,
    ContextRef,
    Frame,
    NativeFrame,
    TraceError,
    made_current_by,
)
from cyctx._trace.session import Trace, trace

# Named where users import them from (reprs, pickles, the docs).
for _obj in (
    ContextEvent,
    ContextRef,
    Frame,
    NativeFrame,
    Trace,
    TraceError,
    made_current_by,
    trace,
):
    _obj.__module__ = __name__
del _obj


def __getattr__(name: str) -> Any:
    # The running trace, read where it changes (the doctor cites its events).
    if name == "_running":
        return _session._running
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SCHEMA",
    "ContextEvent",
    "ContextRef",
    "Frame",
    "NativeFrame",
    "Trace",
    "TraceError",
    "made_current_by",
    "trace",
]
