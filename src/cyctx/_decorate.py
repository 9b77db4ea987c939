"""What cyctx's decorators do with what they are given: one rule for a guard's decorator
(``@guard``, ``@cyctx.device(k)``) and ``cyctx.bind``.

A staticmethod or classmethod is seen through: its function is wrapped and the descriptor
kept, so the method binds as it did. What the wrapper makes binds as a function does (a plain
function, or an object with a function's ``__get__``): on a class it is a method and gets its
``self``. A class is refused: only its construction would run inside. A callable whose body
runs in steps (async def, async generator, generator, however wrapped) is refused: its body
runs later, on whatever thread resumes it, so a context made current around the call would
not be current around the work.

Imported at decoration time only: ``import cyctx`` does not pay for ``inspect``.
"""

from __future__ import annotations

import functools
import inspect

from cyctx._inputs import shown


def decorate(func, wrap, who, not_callable):
    """``wrap(func)``, seen through staticmethod/classmethod; TypeError for what is not
    callable (``not_callable()`` makes the message) or runs in steps (the message names
    ``who``)."""
    if isinstance(func, (staticmethod, classmethod)):
        return type(func)(decorate(func.__func__, wrap, who, not_callable))
    if not callable(func):
        raise TypeError(not_callable())
    if isinstance(func, type):
        # Wrapped, only the construction would run in the context, and the name would stop
        # being a class: isinstance, subclassing and class attributes would break.
        raise TypeError(
            f"cannot decorate a class ({func.__qualname__}) with {who}: only its construction "
            f"would run in the context, and the name would no longer be a class. Decorate the "
            f"methods that make driver calls"
        )
    kind = steps_kind(func)
    if kind is not None:
        raise TypeError(
            f"cannot decorate {kind} ({shown(func)}) with {who}: its body runs later, in "
            f"steps, on whatever thread resumes it, so a context made current around the call "
            f"is not current around the body. Write `with guard:` inside it, around the "
            f"driver calls between its awaits or yields"
        )
    return wrap(func)


def steps_kind(func):
    """What ``func`` hides that runs in steps ("an async def function", ...); None for a plain
    callable. Looked for through functools.partial, bound methods, staticmethod/classmethod,
    __wrapped__ chains (functools.wraps) and a callable object's __call__; a Cython-compiled
    coroutine function says so through its code flags."""
    for _ in range(100):  # a __wrapped__ cycle: nothing more to look into
        if inspect.iscoroutinefunction(func):
            return "an async def function"
        if inspect.isasyncgenfunction(func):
            return "an async generator function"
        if inspect.isgeneratorfunction(func):
            return "a generator function"
        if isinstance(func, functools.partial):
            func = func.func
        elif isinstance(func, (staticmethod, classmethod)):
            func = func.__func__
        elif getattr(func, "__wrapped__", None) is not None and not isinstance(func, type):
            func = func.__wrapped__
        elif not inspect.isroutine(func) and not isinstance(func, type) and callable(func):
            call = type(func).__call__  # callable(func): its type has one
            if inspect.isbuiltin(call) or type(call).__name__ == "wrapper_descriptor":
                return None
            func = call
        else:
            return None
    return None
