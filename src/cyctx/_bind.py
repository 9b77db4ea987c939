"""``cyctx.bind``: a callable that runs a function inside one context on whatever thread calls
it (a thread pool's worker, ``asyncio.to_thread``), restoring that thread's state after.

Pure Python over the guard: a device binds its shared guard; the context current at ``bind``
binds a guard of that context, with its lifetime epoch, so that a call after the context died
is refused instead of handing a dead handle to the driver.
"""

from __future__ import annotations

import functools
import sys
import types

from cyctx._decorate import decorate
from cyctx._errors import ContextDestroyedError, GuardError
from cyctx._guard import ContextGuard, context_epoch, current_handle


def _bound(fn, make):
    """``make(f)`` for the function ``fn`` under the decorators' one rule (_decorate.py)."""
    return decorate(
        fn,
        make,
        "cyctx.bind",
        lambda: f"cyctx.bind takes a function (any callable); got {type(fn).__name__}",
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

    def __get__(self, instance, owner=None):
        # Binds as the function it wraps would: on a class, a method that gets its self.
        return self if instance is None else types.MethodType(self, instance)

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
        # The decorator's form (`@cyctx.bind(device=k)`) stands under its function's name,
        # where the function itself is no longer found: it travels by that name, as a
        # function does, and the receiving process's import makes the same binding.
        if _found_as(self, self._fn):
            return self._fn.__qualname__
        return (bind, (self._fn, self._device))


def _found_as(obj, fn):
    """Whether ``obj`` is what ``fn``'s module and qualified name lead to."""
    where = sys.modules.get(getattr(fn, "__module__", None) or "")
    name = getattr(fn, "__qualname__", None)
    if where is None or not isinstance(name, str) or "<locals>" in name:
        return False
    for part in name.split("."):
        where = getattr(where, part, None)
    return where is obj


def bind(fn=None, device=None):
    """``fn`` bound to a context: each call runs ``fn`` inside that context on the calling
    thread, and restores the thread's own state after (see the module docstring)."""
    if fn is None:
        if device is None:
            raise TypeError(
                "cyctx.bind() needs a function or a device: bind(fn), bind(fn, device=k), or "
                "the decorator @cyctx.bind(device=k)"
            )
        # The device's spelling is checked now; the driver is first asked at the first call
        # (a shared guard retains on its first use): decorating at import initialises nothing.
        guard = ContextGuard.shared(device)
        return lambda f: _bound(f, lambda f: Bound(f, guard, guard.device, None))
    if device is not None:
        guard = ContextGuard.shared(device)
        return _bound(fn, lambda f: Bound(f, guard, guard.device, None))
    _bound(fn, lambda f: f)  # refused before anything is asked of the driver
    handle = current_handle()
    if handle == 0:
        raise GuardError(
            f"cyctx.bind({getattr(fn, '__qualname__', fn)!r}): no context is current on this "
            f"thread to bind, and no device was given: bind(fn, device=k) binds device k's "
            f"primary context"
        )
    epoch = context_epoch(handle)
    if epoch is None:
        raise ContextDestroyedError(
            709,
            "cyctx.bind",
            f"the context {handle:#x} current on this thread is destroyed: there is nothing to "
            f"bind {getattr(fn, '__qualname__', fn)!r} to",
        )
    # A guard of the context itself tells whether it is its device's primary without keeping
    # (or, for an inactive primary, taking) a retain of that primary: a context the caller
    # made (cuCtxCreate) binds as it is and activates nothing.
    own = ContextGuard.from_handle(handle)
    if not own.is_primary:
        return _bound(fn, lambda f: Bound(f, own, None, epoch))
    # The device's primary context: its shared guard re-activates it after a reset. Its retain
    # is taken before this guard's is given back, so the context is never left unheld.
    shared = ContextGuard.shared(own.device)
    try:
        shared.handle  # noqa: B018 - its first use: the shared guard's retain
    finally:
        own.close()
    return _bound(fn, lambda f: Bound(f, shared, shared.device, None))
