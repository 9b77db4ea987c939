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
    # The decorator of ContextGuard.__call__: `with guard:` around each call, under the rule
    # cyctx.bind shares (_decorate.py: methods, staticmethod/classmethod, what runs in steps).
    import functools
    from cyctx._decorate import decorate  # decoration time only: import cyctx does not pay

    def wrap(func):
        @functools.wraps(func)
        def guarded(*args, **kwargs):
            with guard:
                return func(*args, **kwargs)

        return guarded

    return decorate(
        func,
        wrap,
        "a guard",
        lambda: f"{_inputs.shown(guard, 200)} decorates a function; got "
        f"{type(func).__name__} {_inputs.shown(func)}. To make the context current, write "
        f"`with guard:`",
    )
