"""Who made a traced call (docs/tracing.md, "Who made the call"): the library of each native
frame and Python file by where its files are, the interpreter's own frames, the user's line, and
the names of the living threads."""

from __future__ import annotations

import ctypes
import os
import sys
import threading

from cyctx._trace.events import _NATIVE_STATES, _UNLOADED, Frame, NativeFrame

_PKG_OWNERS = (
    ("cyctx", "cyctx"),
    ("torch", "torch"),
    ("cupy", "cupy"),
    ("cupy_backends", "cupy"),
    ("cuda.core", "cuda.core"),
    ("cuda.bindings", "cuda-bindings"),
    ("numba.cuda", "numba"),
    ("numba_cuda", "numba"),
    ("warp", "warp"),
    ("jax", "jax"),
    ("jaxlib", "jax"),
)


def _package_dirs() -> list[tuple[str, str]]:
    """(directory, owner) of the libraries already imported (nothing is imported here)."""
    out = []
    for mod, owner in _PKG_OWNERS:
        m = sys.modules.get(mod)
        f = getattr(m, "__file__", None) if m else None
        paths = list(getattr(m, "__path__", []) or []) if m else []
        if f:
            paths.append(os.path.dirname(f))
        for p in paths:
            out.append((os.path.realpath(p) + os.sep, owner))
    # Longest first: cuda/core before cuda.
    return sorted(set(out), key=lambda t: -len(t[0]))


def _owner_of(path: str | None, dirs: list[tuple[str, str]]) -> str | None:
    if not path:
        return None
    if _is_interpreter(path):
        return "the interpreter"
    real = os.path.realpath(path)
    for d, owner in dirs:
        if real.startswith(d):
            return owner
    base = os.path.basename(real)
    for marker, owner in (
        ("/site-packages/torch/", "torch"),
        ("/site-packages/cupy", "cupy"),
        ("/site-packages/cuda/core/", "cuda.core"),
        ("/site-packages/cuda/bindings/", "cuda-bindings"),
    ):
        if marker in real:
            return owner
    if base.startswith("libcudart"):
        return "the CUDA runtime"
    return None


def _live_thread_names(native) -> dict[tuple[int, int], str]:
    """The name of each living thread, by its thread state (interpreter, unique id): what an
    event records of its thread besides the OS thread id, which the kernel can give again to a
    later thread once the first ended. An event of a thread that ended is named by none."""
    live = native.live_threads()
    if live is None:
        return {}
    by_tid = {t.native_id: t.name for t in threading.enumerate() if t.native_id}
    return {ts: by_tid[tid] for ts, tid in live if tid in by_tid}


def _is_driver_side(path: str | None, skip: tuple[str, ...]) -> bool:
    """A frame of the tracer, of libcupti or of the driver: not a caller."""
    if not path:
        return True
    base = os.path.basename(path)
    real = os.path.realpath(path)
    return (
        real in skip
        or base.startswith(("libcupti", "libcuda.so", "libgcc_s"))
        or (base.startswith("libc.so") or base.startswith("libc-"))
    )


_INTERPRETER_OBJECT: list[str | None] = []  # found once


class _DlInfo(ctypes.Structure):  # <dlfcn.h>'s Dl_info, for dladdr
    dli_fname: bytes | None
    dli_fbase: int | None
    dli_sname: bytes | None
    dli_saddr: int | None
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _interpreter_object() -> str | None:
    """The name the loader gives the object holding CPython's C API: libpython where it is a
    shared library, else the program itself, which the loader names as it was started
    (a bare `python3` when run from PATH: no path to compare with sys.executable)."""

    if _INTERPRETER_OBJECT:
        return _INTERPRETER_OBJECT[0]
    name = None
    try:
        libc = ctypes.CDLL(None)
        addr = ctypes.cast(ctypes.pythonapi.PyObject_Vectorcall, ctypes.c_void_p).value
        info = _DlInfo()
        if libc.dladdr(ctypes.c_void_p(addr), ctypes.byref(info)) and info.dli_fname:
            name = os.fsdecode(info.dli_fname)
    except (AttributeError, OSError):
        pass
    _INTERPRETER_OBJECT.append(name)
    return name


def _is_interpreter(path: str | None) -> bool:
    """A frame of CPython itself: the caller's native stack ends below it."""
    if not path:
        return False
    base = os.path.basename(path)
    return (
        base.startswith("libpython")
        or path == _interpreter_object()
        or os.path.realpath(path) == os.path.realpath(sys.executable)
    )


def _is_library_file(file: str, dirs: list[tuple[str, str]]) -> bool:
    real = os.path.realpath(file) if file and not file.startswith("<") else file
    if any(real.startswith(d) for d, _ in dirs):
        return True
    return (
        "/site-packages/" in file
        or "/dist-packages/" in file
        or file.startswith((sys.prefix + "/lib/python", sys.base_prefix + "/lib/python", "<frozen"))
    )


_SYSTEM_LIBS = ("libc.so", "libc-", "libstdc++", "libgcc_s", "ld-linux", "libpthread", "libffi")


def _attribute(
    python: list[Frame],
    python_cut: bool,
    native: list[NativeFrame],
    native_state: int,
    dirs: list[tuple[str, str]],
    native_limit: int | None = None,
) -> tuple[str, bool, Frame | None]:
    """(library, made by a cyctx guard, the user's line) of one call.

    The library is the one the user's line called, however many it went through. Python code
    of a library between that line and the driver (the calling thread's innermost frames that
    are library files) makes it that library's: the outermost one, the one the line called
    (cuda.core's Python calling cuda.bindings is cuda.core's). Otherwise the line called
    native code itself: the library is that of the outermost native frame between the driver
    and the interpreter's eval loop that ran the line (CuPy's and cuda.core's compiled
    modules, libtorch_python; the CUDA runtime, the C and C++ runtimes and the interpreter's
    own C-API frames are passed through, not callers). Where the frames read cannot tell (every
    Python frame read is a library's and more were not read; or the native walk stopped at its
    limit before the eval loop), the library named is what the outermost frame read shows,
    followed by "(called from ...)" with the frame it was called from, never a pick.
    """
    where = None
    entry_py: str | None = None
    entry_frame: Frame | None = None
    for f in python:
        if not _is_library_file(f.file, dirs):
            where = f
            break
        owner = _owner_of(f.file, dirs)
        if owner is not None:
            entry_py, entry_frame = owner, f
    entry_native: str | None = None
    entry_native_frame: NativeFrame | None = None
    first_caller: str | None = None  # the library whose code called the driver
    native_known = native_state in (0, 1)
    seen_interpreter = False
    for n in native:
        if _is_interpreter(n.library):
            seen_interpreter = True
            continue  # the C API an extension called through (the eval loop ended the walk)
        if seen_interpreter and native_state != 0:
            # The walk did not stop at the eval loop that runs the line (none was found: a
            # Python whose frames cyctx does not read): native code beyond an interpreter frame
            # may be the line's callee or something further out.
            native_known = False
            break
        base = os.path.basename(n.library or "")
        if n.owner == "the CUDA runtime" or base.startswith(_SYSTEM_LIBS):
            continue
        if first_caller is None:
            first_caller = n.owner
        entry_native, entry_native_frame = n.owner, n
    # A cyctx guard's own call: cyctx's code called the driver and the line called cyctx.
    if entry_py is not None:
        library = entry_py
        if native_state == _UNLOADED and entry_py == "cyctx":
            # Whether cyctx's compiled code made the call (a guard's) is the native frames' say.
            return (
                f"cyctx (whether a cyctx guard made the call is not known: "
                f"{_NATIVE_STATES[_UNLOADED]})",
                False,
                where,
            )
        if where is None and python_cut:
            library = (
                f"{entry_py} (called from beyond {entry_frame}, the outermost of the "
                f"{len(python)} Python frames read)"
            )
        return library, entry_py == "cyctx" and first_caller == "cyctx", where
    if native_state == 3:  # native frames off: nothing to tell by
        return "?", False, where
    if not native_known:
        caller = f"{where}" if where is not None else "a caller not read"
        beyond = ""
        if entry_native_frame is not None:
            sym = entry_native_frame.symbol or os.path.basename(entry_native_frame.library or "?")
            beyond = f", through native code beyond {sym}"
        if native_state == 2:
            cut = "the native stack was cut" + (
                f" at native_frames={native_limit}" if native_limit is not None else ""
            )
        elif native_state in (_UNLOADED, 5):
            cut = _NATIVE_STATES[native_state]
        else:
            cut = "the eval loop that ran it was not found"
        return (
            f"{entry_native or '?'} (called from {caller}{beyond}: {cut})",
            False,
            where,
        )
    if entry_native is None:
        return "?", False, where
    return entry_native, entry_native == "cyctx" and first_caller == "cyctx", where
