"""What a ContextGuard can be made from: recognising what the user passed.

Users arrive holding a framework's device or stream, a raw handle, or an ordinal. Objects are
recognised by their type's module and name, so no framework is imported unless the caller
passed one of its objects (then it is already imported). Every value read from a user's object
is checked here, in Python, before it reaches C: a float, a str or a huge int is a
TypeError/ValueError, never truncated, parsed or overflowed. No driver call is made here.
"""

import enum
import struct
from typing import NamedTuple


class Kind(enum.IntEnum):
    """What a Target names. The guard turns a STREAM or GREEN handle into its context."""

    ORDINAL = 0  # a device ordinal: its primary context
    CONTEXT = 1  # a CUcontext handle
    STREAM = 2  # a CUstream handle (not a default stream): its context, by cuStreamGetCtx
    GREEN = 3  # a CUgreenCtx handle: its context, by cuCtxFromGreenCtx


class Target(NamedTuple):
    kind: Kind
    value: int  # the ordinal, or the handle


# Messages show user values through shown/int_text: a repr that raises, or an int too long
# for Python to print (more than 4300 digits), must not replace the error being raised.


def shown(value, limit=80):
    """repr(value) for an error message, at most `limit` characters; never raises."""
    try:
        if isinstance(value, int) and not isinstance(value, bool):
            return int_text(int.__index__(value))
        text = repr(value)
        if not isinstance(text, str):
            raise TypeError("__repr__ returned a non-str")
    except Exception:
        return f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def int_text(n):
    """An int for a message: its digits when short (up to 2**256), else its size."""
    if n.bit_length() <= 256:
        return str(n)
    return f"{'-' if n < 0 else ''}<an int of {n.bit_length()} bits>"


def _index(value, what):
    """operator.index(value) as an exact int; an __index__ that returns a bool is refused
    (a bool is not a number here), one that returns an int subclass is taken as its value
    (operator.index would warn DeprecationWarning). Errors of the __index__ itself pass."""
    # Called as the interpreter's slot calls it: found in the type's MRO, bound, called.
    t = type(value)
    m = next((c.__dict__["__index__"] for c in t.__mro__ if "__index__" in c.__dict__), None)
    if m is None:  # only its metaclass has one: not an integer to Python either
        raise TypeError(f"'{t.__name__}' object cannot be interpreted as an integer")
    get = getattr(type(m), "__get__", None)
    r = (get(m, value, t) if get is not None else m)()
    if type(r) is int:
        return r
    if isinstance(r, bool):
        raise TypeError(
            f"{what}: {type(value).__name__}.__index__() returned a bool; a bool is not an int here"
        )
    if isinstance(r, int):
        return int.__index__(r)
    raise TypeError(f"{type(value).__name__}.__index__() returned {type(r).__name__}, not an int")


# The cuda.bindings types that mean a device, a context, a stream or a green context: every
# other type of cuda.bindings (events, modules, graphs, device pointers, enums, ...) has an
# int value too, but it is no device: refused by its type, never read as an ordinal or handle.
# cudaStream_t is the driver's stream (both are CUstream_st*); CUdevice_v1 is CUdevice. The
# runtime's cudaExecutionContext_t is opaque: the runtime offers no conversion to a CUcontext.
_DEVICE_TYPES = ("CUdevice", "CUdevice_v1")
_CONTEXT_TYPES = ("CUcontext",)
_STREAM_TYPES = ("CUstream", "cudaStream_t")
_GREEN_TYPES = ("CUgreenCtx",)
_LIBRARIES = ("cuda.bindings", "cuda.core")


def _library_class(t):
    """The class of cuda.bindings or cuda.core that type `t` is or derives from, else None."""
    for c in t.__mro__:
        m = getattr(c, "__module__", None)
        if isinstance(m, str) and m.startswith(_LIBRARIES):
            return c
    return None


def _is_bindings(c, names):
    return c.__module__.startswith("cuda.bindings") and c.__name__ in names


def _not_a(c, what):
    hint = ""
    if c.__name__ == "cudaExecutionContext_t":
        hint = (
            " (the runtime cannot convert an execution context to a CUcontext: pass its "
            "device, from cudaExecutionCtxGetDevice, or the CUcontext or CUgreenCtx itself)"
        )
    return TypeError(f"{c.__module__}.{c.__name__} is not {what}{hint}")


def _ordinal_of(device):
    """The device ordinal as a Python int, or TypeError/ValueError. No driver call."""
    t = type(device)
    if t is int:
        ordinal = device
    else:
        lib = _library_class(t)
        if lib is not None:
            if not _is_bindings(lib, _DEVICE_TYPES):
                raise _not_a(lib, "a device ordinal")
            device = int(device)  # a CUdevice is its ordinal (cuDeviceGet(&dev, k) gives k)
        elif isinstance(device, bool) or not hasattr(t, "__index__"):
            raise TypeError(
                f"device must be an int ordinal (0, 1, ...), got {t.__name__} {shown(device)}"
            )
        ordinal = _index(device, "device")
    if ordinal < 0:
        raise ValueError(f"device ordinal must be >= 0, got {int_text(ordinal)}")
    return ordinal


def _optional_ordinal(device):
    """A framework stream's fallback device: None, or a checked ordinal."""
    return None if device is None else _ordinal_of(device)


# Handles are C pointers: anything outside [0, 2**bits) cannot be one. Checked here, with the
# value in the message, instead of letting the C conversion raise OverflowError.
_HANDLE_BITS = 8 * struct.calcsize("P")
_HANDLE_LIMIT = 1 << _HANDLE_BITS


def _handle_of(value, what, kinds=_CONTEXT_TYPES):
    """A handle as a Python int in [0, 2**64), or TypeError/ValueError. No driver call.

    An int (anything with ``__index__``, not bool) or a cuda.bindings handle object of one of
    the types `kinds` (which converts with int()). A float, str or bytes is refused, never
    truncated or parsed; so is any other cuda.bindings or cuda.core object."""
    t = type(value)
    lib = _library_class(t)
    if lib is not None:
        if not _is_bindings(lib, kinds):
            raise TypeError(
                f"{what} must be an int handle or a {' or '.join(kinds)}, got "
                f"{lib.__module__}.{lib.__name__}"
            )
        h = int(value)
    elif isinstance(value, bool) or not hasattr(t, "__index__"):
        raise TypeError(f"{what} must be an int handle, got {t.__name__} {shown(value)}")
    else:
        h = _index(value, what)
    if not 0 <= h < _HANDLE_LIMIT:
        raise ValueError(
            f"{what} {h:#x} is out of range: a handle is a {_HANDLE_BITS}-bit address, "
            f"0 <= handle < 2**{_HANDLE_BITS}"
            if abs(h) < (1 << 256)
            else f"{what} is out of range: a handle is a {_HANDLE_BITS}-bit address, "
            f"0 <= handle < 2**{_HANDLE_BITS}"
        )
    return h


def _cuda_stream_handle(obj):
    """The handle of the CUDA stream protocol: ``__cuda_stream__()`` returns (version, handle)."""
    v = obj.__cuda_stream__()
    # Checked before it is looked into (the guard module, compiled with boundscheck=False,
    # gets only checked ints): a tuple of exactly two, both ints. Read with tuple's own length and items: a subclass's
    # __iter__, __len__ or __getitem__ may say anything.
    if not isinstance(v, tuple) or tuple.__len__(v) != 2:
        raise TypeError(
            f"{type(obj).__name__}.__cuda_stream__() must return a (version, handle) tuple of "
            f"two ints, got {type(v).__name__} {shown(v)}"
        )
    version = tuple.__getitem__(v, 0)
    handle = tuple.__getitem__(v, 1)
    if isinstance(version, bool) or not hasattr(type(version), "__index__"):
        raise TypeError(
            f"{type(obj).__name__}.__cuda_stream__() returned version {shown(version, 40)}; an int is needed"
        )
    return _handle_of(handle, f"{type(obj).__name__}.__cuda_stream__() handle", _STREAM_TYPES)


# Users arrive holding a framework's device or stream, a raw handle, or an ordinal. Objects are
# recognised by their type's module and name, so no framework is imported unless the caller
# passed one of its objects (then it is already imported).

_DEFAULT_STREAMS = (0, 1, 2)  # legacy, per-thread (CU_STREAM_LEGACY/PER_THREAD): no own context


def _stream(handle, device, default_as_device):
    """The Target of a stream `handle` whose device is `device` (None: unknown). The default
    streams (0/1/2) belong to whatever context is current, which is meaningless here: a
    framework's stream object still knows its device (unless `default_as_device` is false:
    then a default stream is a STREAM like any other, for shared(), which takes devices only)."""
    if handle in _DEFAULT_STREAMS and default_as_device:
        if device is None:
            raise ValueError(
                "a default stream (handle 0/1/2) has no context of its own; pass the device instead"
            )
        return Target(Kind.ORDINAL, device)
    return Target(Kind.STREAM, handle)


class Spelling(NamedTuple):
    """One way users name a device, a context, a stream or a green context (SPELLINGS)."""

    what: str  # how messages name it
    kind: str  # "device", "context", "stream" or "green context"
    library: str | None  # the module prefix of its type; None: any type outside cuda.bindings/core
    match: object  # (type, module, name, obj) -> bool; looked at in SPELLINGS' order
    read: object  # (obj, default_as_device) -> Target
    stub: str  # its member of DeviceLike in __init__.pyi
    docs: tuple  # how docs/guarantees.md's table, rendered from these, names it


def _core_stream(obj, default_as_device):
    return _stream(
        _handle_of(obj.handle, f"{type(obj).__name__}.handle", _STREAM_TYPES),
        _ordinal_of(obj.device.device_id),
        default_as_device,
    )


def _torch_device(obj, default_as_device):
    if obj.type != "cuda":
        raise ValueError(f"{shown(obj)} is not a CUDA device")
    if obj.index is None:  # torch.device("cuda"): torch's current device
        import torch

        return Target(Kind.ORDINAL, _ordinal_of(torch.cuda.current_device()))
    return Target(Kind.ORDINAL, _ordinal_of(obj.index))


def _torch_stream(obj, default_as_device):
    return _stream(
        _handle_of(obj.cuda_stream, f"{type(obj).__name__}.cuda_stream", _STREAM_TYPES),
        _optional_ordinal(obj.device.index),
        default_as_device,
    )


def _cupy_stream(obj, default_as_device):
    return _stream(
        _handle_of(obj.ptr, f"{type(obj).__name__}.ptr", _STREAM_TYPES),
        _optional_ordinal(getattr(obj, "device_id", None)),
        default_as_device,
    )


def _names(names):
    return lambda t, mod, name, obj: name in names


# Every spelling of a device, a context, a stream or a green context, written once: recognise()
# (so ContextGuard(), shared() and cyctx.device()) tries them in this order, the errors list
# them, a test ties __init__.pyi's DeviceLike to them, and docs/guarantees.md renders its table
# ("What a guard can be made from") from them.
# Objects are recognised by their type's module and name: no framework is imported.
SPELLINGS = (
    Spelling(
        "a cuda.bindings CUdevice",
        "device",
        "cuda.bindings",
        _names(_DEVICE_TYPES),
        lambda obj, _: Target(Kind.ORDINAL, _ordinal_of(obj)),
        "_BindingsHandle",
        ("`cuda.bindings.driver.CUdevice`", "`CUdevice_v1`"),
    ),
    Spelling(
        "a cuda.bindings CUcontext",
        "context",
        "cuda.bindings",
        _names(_CONTEXT_TYPES),
        lambda obj, _: Target(Kind.CONTEXT, _handle_of(obj, "CUcontext", _CONTEXT_TYPES)),
        "SupportsIndex",
        ("`cuda.bindings.driver.CUcontext`",),
    ),
    Spelling(
        "a cuda.bindings CUstream or cudaStream_t",
        "stream",
        "cuda.bindings",
        _names(_STREAM_TYPES),
        lambda obj, dflt: _stream(_handle_of(obj, type(obj).__name__, _STREAM_TYPES), None, dflt),
        "SupportsIndex",
        ("`CUstream`", "`cudaStream_t`"),
    ),
    Spelling(
        "a cuda.bindings CUgreenCtx",
        "green context",
        "cuda.bindings",
        _names(_GREEN_TYPES),
        lambda obj, _: Target(Kind.GREEN, _handle_of(obj, "CUgreenCtx", _GREEN_TYPES)),
        "SupportsIndex",
        ("`cuda.bindings.driver.CUgreenCtx`",),
    ),
    Spelling(
        "a cuda.core Device",
        "device",
        "cuda.core",
        lambda t, mod, name, obj: name == "Device" and hasattr(obj, "device_id"),
        lambda obj, _: Target(Kind.ORDINAL, _ordinal_of(obj.device_id)),
        "_HasDeviceId",
        ("`cuda.core.Device`",),
    ),
    Spelling(
        "a cuda.core Stream",
        "stream",
        "cuda.core",
        _names(("Stream",)),
        _core_stream,
        "_HasHandle",
        ("`cuda.core` `Stream`",),
    ),
    Spelling(
        "a cuda.core Context",
        "context",
        "cuda.core",
        _names(("Context",)),
        lambda obj, _: Target(
            Kind.CONTEXT, _handle_of(obj.handle, f"{type(obj).__name__}.handle", _CONTEXT_TYPES)
        ),
        "_HasHandle",
        ("a `cuda.core` `Context`",),
    ),
    Spelling(
        "anything with __cuda_stream__",  # a cuda.core stream of another kind
        "stream",
        "cuda.core",
        lambda t, mod, name, obj: hasattr(obj, "__cuda_stream__"),
        lambda obj, dflt: _stream(_cuda_stream_handle(obj), None, dflt),
        "_CudaStream",
        ("anything with `__cuda_stream__`",),
    ),
    Spelling(
        "a torch.device",
        "device",
        None,
        lambda t, mod, name, obj: mod == "torch" and name == "device",
        _torch_device,
        "_HasIndex",
        ('`torch.device("cuda", k)`', '`torch.device("cuda")`'),
    ),
    Spelling(
        "a torch.cuda.Stream",
        "stream",
        None,
        lambda t, mod, name, obj: mod.startswith("torch") and hasattr(obj, "cuda_stream"),
        _torch_stream,
        "_HasCudaStream",
        ("`torch.cuda.Stream`",),
    ),
    Spelling(
        "a cupy.cuda.Device",
        "device",
        None,
        lambda t, mod, name, obj: mod.startswith("cupy") and name == "Device",
        lambda obj, _: Target(Kind.ORDINAL, _ordinal_of(obj.id)),
        "_HasId",
        ("`cupy.cuda.Device`",),
    ),
    Spelling(
        "a cupy.cuda.Stream",
        "stream",
        None,
        lambda t, mod, name, obj: (
            mod.startswith("cupy") and "Stream" in name and hasattr(obj, "ptr")
        ),
        _cupy_stream,
        "_HasPtr",
        ("`cupy.cuda.Stream`",),
    ),
    Spelling(
        "anything with __cuda_stream__",
        "stream",
        None,
        lambda t, mod, name, obj: hasattr(obj, "__cuda_stream__"),
        lambda obj, dflt: _stream(_cuda_stream_handle(obj), None, dflt),
        "_CudaStream",
        ("anything with `__cuda_stream__`",),
    ),
    Spelling(
        "an int ordinal or anything with __index__ such as numpy.int64",
        "device",
        None,
        lambda t, mod, name, obj: not isinstance(obj, bool) and hasattr(t, "__index__"),
        lambda obj, _: Target(Kind.ORDINAL, _ordinal_of(obj)),
        "SupportsIndex",
        ("`int` ordinal (or anything with `__index__`, e.g. `numpy.int64`)",),
    ),
)

KINDS = ("device", "context", "stream", "green context")


def takes(kinds=KINDS):
    """What is taken, for messages: "a device (a ..., ...), a context (...) or ..."."""
    parts = []
    for kind in kinds:
        seen = []
        # The ordinal, tried last, is named first: it is what most callers pass.
        for sp in sorted(
            SPELLINGS, key=lambda sp: sp.stub != "SupportsIndex" or sp.library is not None
        ):
            if sp.kind == kind and sp.what not in seen:
                seen.append(sp.what)
        parts.append(f"a {kind} ({', '.join(seen)})")
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} or {parts[-1]}"


def recognise(obj):
    """The Target of anything ContextGuard accepts; TypeError/ValueError otherwise."""
    return _recognise(obj, True)


def _recognise(obj, default_as_device):
    t = type(obj)
    # Every value read from a duck-typed object is checked (_ordinal_of, _handle_of) before
    # it is used: these are user objects, and a float, a str or a huge int must be a
    # TypeError/ValueError, never truncated, parsed or overflowed.
    lib = _library_class(t)
    if lib is not None:
        # cuda.bindings and cuda.core: only their spellings; any other of their objects is
        # refused by its type, whatever __index__/__int__ it has (a CUevent is no ordinal).
        mod = lib.__module__
        for sp in SPELLINGS:
            if sp.library is not None and mod.startswith(sp.library):
                if sp.match(lib, mod, lib.__name__, obj):
                    return sp.read(obj, default_as_device)
        raise _not_a(lib, f"{takes()}, which ContextGuard takes")
    mod = t.__module__ if isinstance(t.__module__, str) else ""
    name = t.__name__
    for sp in SPELLINGS:
        if sp.library is None and sp.match(t, mod, name, obj):
            return sp.read(obj, default_as_device)
    hint = ""
    if isinstance(obj, str) and obj.startswith("cuda:") and obj[5:].isdecimal():
        # torch's spelling of a device: named, never parsed (a str is no device here).
        hint = f"; for {obj!r} pass the ordinal {int(obj[5:])} or torch.device({obj!r})"
    raise TypeError(f"ContextGuard takes {takes()}; got {mod}.{name} {shown(obj)}{hint}")


def shared_ordinal(device):
    """The ordinal of what ContextGuard.shared() takes: anything ContextGuard takes that names
    a device. A context or a stream is refused: a shared guard is a device's primary context."""
    target = _recognise(device, False)
    if target.kind != Kind.ORDINAL:
        what = {Kind.CONTEXT: "context", Kind.STREAM: "stream", Kind.GREEN: "green context"}[
            target.kind
        ]
        theirs = "that context" if what == "context" else f"that {what}'s context"
        raise TypeError(
            f"ContextGuard.shared() and cyctx.device() take {takes(('device',))}, got a {what} "
            f"({type(device).__name__} {shown(device)}): the shared guard of a device is its "
            f"primary context, which {theirs} may not be. Use ContextGuard(it) for a guard of "
            f"{theirs}, kept for the life of the work"
        )
    return target.value


def context_handle(handle, what):
    """A CUcontext handle given as an int or a CUcontext (from_handle)."""
    return _handle_of(handle, what, _CONTEXT_TYPES)
