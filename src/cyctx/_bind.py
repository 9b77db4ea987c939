"""``cyctx.bind``: a callable that runs a function inside one context on whatever thread calls
it (a thread pool's worker, ``asyncio.to_thread``), restoring that thread's state after.

Pure Python over the guard: a device binds its shared guard; the context current at ``bind``
binds a guard of that context, with its lifetime epoch, so that a call after the context died
is refused instead of handing a dead handle to the driver.
"""

from __future__ import annotations

import functools
import inspect

from cyctx._errors import ContextDestroyedError, GuardError
from cyctx._guard import ContextGuard, context_epoch, current_device, current_handle


def _refuse_stepwise(fn):
    if not callable(fn):
        raise TypeError(f"cyctx.bind takes a callable, got {type(fn).__name__}")
    if (
        inspect.iscoroutinefunction(fn)
        or inspect.isasyncgenfunction(fn)
        or inspect.isgeneratorfunction(fn)
    ):
        raise TypeError(
            f"cyctx.bind cannot bind {getattr(fn, '__qualname__', fn)!r}: an async or generator "
            f"function runs in steps, resumed later on whatever thread drives it, so a context "
            f"around the call would not be around the work. Put `with guard:` inside it instead."
        )


class Bound:
    """``fn`` bound to a context: each call runs inside it on the calling thread
    (:func:`cyctx.bind`)."""

    __slots__ = ("__dict__", "__weakref__", "_fn", "_guard", "_device", "_epoch")

    def __init__(self, fn, guard, device, epoch):
        self._fn = fn
        self._guard = guard
        self._device = device  # the ordinal bound by device, else None (a bound context)
        # The epoch of a bound context that is not a primary (None: a primary's guard, which
        # re-activates a reset one): a call after it changed is refused.
        self._epoch = epoch
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        if self._epoch is not None and context_epoch(self._guard.handle) != self._epoch:
            raise ContextDestroyedError(
                709,
                "cyctx.bind",
                f"the context {self._guard.handle:#x} that {self._name()} was bound to has been "
                f"destroyed since bind() (its epoch changed): bind the function again to a "
                f"live context, or bind it to a device, bind(fn, device=k)",
            )
        with self._guard:
            return self._fn(*args, **kwargs)

    def _name(self):
        return getattr(self._fn, "__qualname__", None) or repr(self._fn)

    def __repr__(self):
        to = (
            f"device {self._device}"
            if self._device is not None
            else f"context {self._guard.handle:#x}"
        )
        return f"<cyctx.bind {self._name()} to {to}>"

    def __reduce__(self):
        # A device means the same in every process; a context is this process's alone.
        if self._device is None:
            raise TypeError(
                f"{self!r} cannot be pickled: it is bound to a context of this process, which "
                f"means nothing in another. Bind to a device instead: cyctx.bind(fn, device=k)"
            )
        return (bind, (self._fn, self._device))


def bind(fn=None, device=None):
    """``fn`` bound to a context: each call runs ``fn`` inside that context on the calling
    thread, and restores the thread's own state after (see the module docstring)."""
    if fn is None:
        if device is None:
            raise TypeError(
                "cyctx.bind() needs a function or a device: bind(fn), bind(fn, device=k), or "
                "the decorator @cyctx.bind(device=k)"
            )
        guard = ContextGuard.shared(device)  # checks the device now, not at the first call
        return lambda f: _bound_to_device(f, guard)
    _refuse_stepwise(fn)
    if device is not None:
        return _bound_to_device(fn, ContextGuard.shared(device))
    handle = current_handle()
    if handle == 0:
        raise GuardError(
            f"cyctx.bind({getattr(fn, '__qualname__', fn)!r}): no context is current on this "
            f"thread to bind, and no device was given: bind(fn, device=k) binds device k's "
            f"primary context"
        )
    ordinal = current_device()
    shared = ContextGuard.shared(ordinal)
    if shared.handle == handle:  # the device's primary context: its shared guard re-activates it
        return Bound(fn, shared, ordinal, None)
    epoch = context_epoch(handle)
    if epoch is None:
        raise ContextDestroyedError(
            709,
            "cyctx.bind",
            f"the context {handle:#x} current on this thread is destroyed: there is nothing to "
            f"bind {getattr(fn, '__qualname__', fn)!r} to",
        )
    return Bound(fn, ContextGuard.from_handle(handle), None, epoch)


def _bound_to_device(fn, guard):
    _refuse_stepwise(fn)
    return Bound(fn, guard, guard.device, None)
