"""cyctx.relaxed_capture(): a block in which the calling thread's stream-capture mode is relaxed.

The mode is the driver's, per thread (``cuThreadExchangeStreamCaptureMode``). While another
thread captures in global mode, a call the driver deems unsafe (``cuMemAlloc``) from a thread
whose own mode is global or thread-local invalidates that capture; from a thread whose mode is
relaxed it does not (docs/guarantees.md, "Guards during stream capture").

The blocks open on a thread are counted: the first exchanges the mode to relaxed and keeps the
mode it found, the last to end puts that mode back, whichever order the blocks end in (two
asyncio tasks or greenlets on one thread interleave their blocks; a stack of saved modes would
restore the wrong one).
"""

from __future__ import annotations

import os
import threading

from cyctx import _errors
from cyctx._errors import CyctxError, driver_error

_local = threading.local()  # .depth: blocks open on this thread; .saved: the mode found


_call = None  # cuda.bindings' cuThreadExchangeStreamCaptureMode and the modes, at first use
_modes: dict[int, object] = {}


def _exchange(mode: int) -> int:
    """Set this thread's capture mode; return the one it had."""
    global _call
    if _call is None:
        from cuda.bindings import driver as d

        _modes.update((int(m), m) for m in d.CUstreamCaptureMode)
        _call = d.cuThreadExchangeStreamCaptureMode
    err, previous = _call(_modes[mode])
    if int(err) != 0:  # CUDA_SUCCESS
        raise driver_error(
            err,
            "cuThreadExchangeStreamCaptureMode",
            "so this thread's stream-capture mode is unchanged",
        )
    return int(previous)


_RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED


class relaxed_capture:
    """``with cyctx.relaxed_capture():`` runs the block with the calling thread's
    stream-capture mode relaxed (``cuThreadExchangeStreamCaptureMode``), so that a call the
    driver deems unsafe during capture (``cuMemAlloc``) leaves another thread's global-mode
    capture valid. The thread's last such block to end puts back the mode it found: nested and
    interleaved blocks (two asyncio tasks on one thread) are counted, not stacked. A driver
    error raises its :class:`DriverError` with the mode unchanged; entered in a forked child,
    :class:`ForkError`. A block open at a fork is left quietly in the child, as a guard's is:
    the child cannot use the driver, so there is no mode of its to put back."""

    __slots__ = ()

    def __enter__(self) -> relaxed_capture:
        depth = getattr(_local, "depth", 0)
        if _errors._forked():  # the driver refuses every call here: say why, as a guard does
            raise _errors.forked(os.getpid())
        if depth == 0:
            _local.saved = _exchange(_RELAXED)  # raises with nothing changed
        _local.depth = depth + 1
        return self

    def __exit__(self, *exc: object) -> None:
        depth = getattr(_local, "depth", 0)
        if depth == 0:
            raise CyctxError(
                "relaxed_capture(): left on a thread where no relaxed_capture() block is "
                "open (a block is left on the thread that entered it); this thread's "
                "stream-capture mode is unchanged"
            )
        _local.depth = depth - 1
        if depth == 1 and _errors._forked():
            return  # left in a forked child, as a guard's exit there: no driver to restore
        if depth == 1:
            try:
                _exchange(_local.saved)
            except CyctxError as e:
                e.add_note("this thread's stream-capture mode stays relaxed")
                raise

    def __repr__(self) -> str:
        return f"<cyctx.relaxed_capture: {getattr(_local, 'depth', 0)} open on this thread>"


def open_blocks() -> int:
    """relaxed_capture() blocks open on the calling thread."""
    return getattr(_local, "depth", 0)
