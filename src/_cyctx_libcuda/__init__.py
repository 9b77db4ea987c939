"""Which ``libcuda.so.1`` this process has mapped: the one answer that cyctx (``cyctx.testing``,
the doctor) and its pytest plugin share.

A top-level package of cyctx's distribution, beside cyctx rather than in it, so that the plugin
(``_cyctx_pytest``, loaded in every pytest process) can use it without importing cyctx, whose
``__init__`` checks cuda-bindings and may refuse it. It imports nothing but ``os``'s builtins
and loads nothing.
"""

from __future__ import annotations

import os

__all__ = [
    "LOAD_ERRORS",
    "exports",
    "loaded_libcuda",
    "loader_message",
    "same_context",
    "simulated_libcuda",
]

# What ctypes raises for a library that does not load: its message is the loader's, which names
# the path, and where the path is not UTF-8 ctypes fails to decode it (UnicodeDecodeError).
LOAD_ERRORS = (OSError, UnicodeDecodeError)


def loaded_libcuda() -> str | None:
    """Path of the ``libcuda.so.1`` already mapped in this process (real or simulated), or
    None. It reads ``/proc/self/maps`` and loads nothing, so it is safe before the choice of
    driver is made."""
    try:
        # Bytes, decoded as the file system encodes names: a mapped path that is not UTF-8
        # elsewhere in the map neither stops the read nor comes back altered.
        with open("/proc/self/maps", "rb") as f:
            for line in f:
                if b"libcuda.so" in line:
                    return os.fsdecode(line.split(None, 5)[-1].strip())
    except OSError:
        pass
    return None


def simulated_libcuda() -> str | None:
    """Path of the mapped ``libcuda.so.1`` when it is cyctx's simulated driver (the library
    that exports ``cyctxsim_is_simulated``), else None: what the doctor asks. The library is
    asked through the handle already mapped (``RTLD_NOLOAD``), so nothing is loaded."""
    path = loaded_libcuda()
    if path is None:
        return None
    import ctypes

    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except LOAD_ERRORS:  # no longer mapped, or "(deleted)": not a library to ask
        return None
    return path if exports(lib, "cyctxsim_is_simulated") else None


def exports(lib, name: str) -> bool:
    """Whether the loaded ctypes library ``lib`` has ``name``: hasattr, but for a library whose
    path is not UTF-8, where ctypes reports a missing name with a UnicodeDecodeError."""
    try:
        getattr(lib, name)
    except (AttributeError, UnicodeDecodeError):
        return False
    return True


def loader_message(exc: BaseException, path: str) -> str:
    """What the loader said in ``exc``, the error ctypes raised for ``path`` (a library that
    does not load, or a name it lacks). The loader's message names the path; where that is not
    UTF-8, CPython before 3.14 cannot decode it and raises a UnicodeDecodeError or, in some 3.11
    releases, the error with no message at all: then these words say what is known."""
    said = "" if isinstance(exc, UnicodeDecodeError) else str(exc)
    if said:
        return said
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        return (
            "a function is missing or it does not load (ctypes cannot decode the loader's "
            "message: the path is not UTF-8)"
        )
    return f"{type(exc).__name__} with no message from the loader"


def same_context(before: tuple[int, int | None], after: tuple[int, int | None]) -> bool:
    """Whether two readings ``(handle, id)`` (``cuCtxGetId``; None where it fails) are one
    context: the same handle and the same id. The same handle with a new id is another context:
    a primary context reset (its handle stays, its id changes) or a context destroyed and
    another made at its address. Shared by the doctor and the pytest plugin."""
    return before[0] == after[0] and (before[0] == 0 or before[1] == after[1])
