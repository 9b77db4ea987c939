# Part of the _guard module (included by _guard.pyx): what a guard's Python callers reach
# besides `with`: the constructor's argument, pickling and copying, the decorator.

def _device_argument(cls, args, kwargs):
    # ContextGuard(device): the one argument, with the messages Python gives a def function
    # (Cython's would name __cinit__). A subclass's own __init__ may take more: the device is
    # its first argument or `device=`, and the rest is its __init__'s to check.
    name = cls.__name__
    if args:
        if "device" in kwargs:
            raise TypeError(f"{name}() got multiple values for argument 'device'")
        if cls is ContextGuard and (len(args) > 1 or kwargs):
            if kwargs:
                raise TypeError(f"{name}() got an unexpected keyword argument {next(iter(kwargs))!r}")
            raise TypeError(f"{name}() takes 1 argument (device) but {len(args)} were given")
        return args[0]
    if "device" not in kwargs:
        raise TypeError(
            f"{name}() missing 1 required argument: 'device' (an ordinal such as 0, or a "
            f"device, context or stream object); for the process's shared guard of a device "
            f"use cyctx.device(k)"
        )
    if cls is ContextGuard and len(kwargs) > 1:
        extra = next(k for k in kwargs if k != "device")
        raise TypeError(f"{name}() got an unexpected keyword argument {extra!r}")
    return kwargs["device"]


def _cannot_travel(ContextGuard g, what):
    if g._owns_retain:
        holds = "holds this process's retain of device %d's primary context" % g._ordinal
        instead = (f"cyctx.device({g._ordinal}) (the shared guard of device {g._ordinal}, "
                   f"which {what}s as the shared guard of that device"
                   + (" in the receiving process)" if what == "pickle" else ")"))
    else:
        holds = "refers to a context this process owns"
        instead = f"cyctx.device({g._ordinal}) for its device's primary context"
    if what == "pickle":
        return (f"cannot pickle {_inputs.shown(g, 200)}: a ContextGuard {holds}, which means "
                f"nothing in another process. Send the device ordinal and make the guard "
                f"there, or send {instead}")
    return (f"cannot copy {_inputs.shown(g, 200)}: a ContextGuard {holds}, which a copy "
            f"would either share (and lose to the other's close()) or take again. Pass the "
            f"guard itself, make another with ContextGuard({g._ordinal}), or use {instead}")


def _decorated(ContextGuard guard, func):
    # The decorator of ContextGuard.__call__: `with guard:` around each call.
    # staticmethod/classmethod (a decorator above them): the function inside is decorated and
    # the descriptor kept, so the method binds as it would have.
    if isinstance(func, (staticmethod, classmethod)):
        return type(func)(_decorated(guard, func.__func__))
    if not callable(func):
        raise TypeError(
            f"{_inputs.shown(guard, 200)} decorates a function; got {type(func).__name__} "
            f"{_inputs.shown(func)}. To make the context current, write `with guard:`"
        )
    import functools

    kind = _steps_kind(func)
    if kind is not None:
        raise TypeError(
            f"cannot decorate {kind} ({_inputs.shown(func)}) with a guard: its body runs later, "
            f"in steps, on whatever thread resumes it, so a guard around the call is not around "
            f"the body. Write `with guard:` inside it, around the driver calls between its "
            f"awaits or yields"
        )

    @functools.wraps(func)
    def guarded(*args, **kwargs):
        with guard:
            return func(*args, **kwargs)

    return guarded


def _steps_kind(func):
    # What `func` hides that runs in steps: None for a plain callable. Looked for through
    # functools.partial, bound methods, __wrapped__ chains (functools.wraps) and a callable
    # object's __call__; a Cython-compiled coroutine function says so through its code flags.
    import functools
    import inspect  # decoration time only: import cyctx does not pay for it

    seen = 0
    while True:
        seen += 1
        if inspect.iscoroutinefunction(func):
            return "an async def function"
        if inspect.isasyncgenfunction(func):
            return "an async generator function"
        if inspect.isgeneratorfunction(func):
            return "a generator function"
        if seen > 100:  # a __wrapped__ cycle: nothing more to look into
            return None
        if isinstance(func, functools.partial):
            func = func.func
        elif getattr(func, "__wrapped__", None) is not None and not isinstance(func, type):
            func = func.__wrapped__
        elif not inspect.isroutine(func) and not isinstance(func, type) and callable(func):
            call = getattr(type(func), "__call__", None)
            if call is None or inspect.isbuiltin(call) or type(call).__name__ == "wrapper_descriptor":
                return None
            func = call
        else:
            return None
