"""Who made a traced call (docs/tracing.md, "Who made the call"): the library of each native
frame and Python file by where its files are, the interpreter's own frames, the user's line, and
the names of the living threads. A trace names its events through one :class:`Naming`, which
looks each distinct path up once."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable

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


def _imported_package_paths() -> list[tuple[str, str]]:
    """(directory as imported, owner) of the libraries already imported (nothing is imported
    here)."""
    out: list[tuple[str, str]] = []
    for mod, owner in _PKG_OWNERS:
        m = sys.modules.get(mod)
        f = getattr(m, "__file__", None) if m else None
        paths = list(getattr(m, "__path__", []) or []) if m else []
        if f:
            paths.append(os.path.dirname(f))
        out.extend((p, owner) for p in paths if isinstance(p, str))
    return out


def _package_dirs(real: Callable[[str], str] = os.path.realpath) -> list[tuple[str, str]]:
    """(real directory, owner) of the libraries already imported."""
    out = [(real(p) + os.sep, owner) for p, owner in _imported_package_paths()]
    # Longest first: cuda/core before cuda.
    return sorted(set(out), key=lambda t: -len(t[0]))


# A Python file is a library's when it is under a package cyctx knows, in site-packages or
# dist-packages, or in the standard library (or frozen into the interpreter).
_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/")


def _stdlib_prefixes() -> tuple[str, ...]:
    return (sys.prefix + "/lib/python", sys.base_prefix + "/lib/python", "<frozen")


def library_markers() -> list[tuple[str, bool]]:
    """What the tracer's read of a thread's Python frames takes for a library's file, as
    (text, found anywhere in the file name rather than at its start): the rule of
    :func:`_is_library_file` without resolving links (the read allocates nothing), so each
    imported package's directory both as imported and as resolved. The read uses it to go on
    past library frames to the user's line; the naming judges the frames read by the rule."""
    prefixes = {p for p, _ in _imported_package_paths()} | {d for d, _ in _package_dirs()}
    out = [(p.rstrip(os.sep) + os.sep, False) for p in sorted(prefixes)]
    out += [(p, False) for p in _stdlib_prefixes()]
    out += [(part, True) for part in _LIBRARY_PARTS]
    return out


def _owner_of(path: str | None, dirs: list[tuple[str, str]]) -> str | None:
    return Naming(dirs).owner_of(path)


def _find_owner(path: str | None, dirs: list[tuple[str, str]], names: Naming) -> str | None:
    if not path:
        return None
    if names.is_interpreter(path):
        return "the interpreter"
    real = names.real(path)
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


def _driver_side(path: str | None, skip: tuple[str, ...], names: Naming) -> bool:
    """A frame of the tracer, of libcupti or of the driver: not a caller."""
    if not path:
        return True
    base = os.path.basename(path)
    real = names.real(path)
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
    return Naming([]).is_interpreter(path)


def _interpreter(path: str | None, names: Naming) -> bool:
    if not path:
        return False
    base = os.path.basename(path)
    return (
        base.startswith("libpython")
        or path == _interpreter_object()
        or names.real(path) == names.real(sys.executable)
    )


def _is_library_file(file: str, dirs: list[tuple[str, str]]) -> bool:
    return Naming(dirs).is_library_file(file)


def _library_file(file: str, dirs: list[tuple[str, str]], names: Naming) -> bool:
    real = names.real(file) if file and not file.startswith("<") else file
    if any(real.startswith(d) for d, _ in dirs):
        return True
    return any(part in file for part in _LIBRARY_PARTS) or file.startswith(_stdlib_prefixes())


class Naming:
    """The names of one trace's paths: each distinct file or library is resolved and judged
    once, however many events it appears in (a trace of thousands of events has tens of
    paths). ``dirs``: the imported packages' directories, (real directory, owner); a trace's
    naming takes them anew at each collection (:meth:`refresh`: a package imported since names
    its files), keeping its answers while they are the same. ``skip``: the tracer's own
    module, whose frames are below every caller."""

    def __init__(self, dirs: list[tuple[str, str]] | None = None, skip: tuple[str, ...] = ()):
        self.dirs = dirs if dirs is not None else []
        self.skip = skip
        self._real: dict[str, str] = {}
        self._owner: dict[str | None, str | None] = {}
        self._library: dict[str, bool] = {}
        self._driver_side: dict[str | None, bool] = {}
        self._interpreter: dict[str | None, bool] = {}

    def refresh(self) -> None:
        dirs = _package_dirs(self.real)
        if dirs != self.dirs:
            self.dirs = dirs
            self._owner.clear()
            self._library.clear()

    def real(self, path: str) -> str:
        found = self._real.get(path)
        if found is None:
            found = self._real[path] = os.path.realpath(path)
        return found

    def owner_of(self, path: str | None) -> str | None:
        if path not in self._owner:
            self._owner[path] = _find_owner(path, self.dirs, self)
        return self._owner[path]

    def is_library_file(self, file: str) -> bool:
        if file not in self._library:
            self._library[file] = _library_file(file, self.dirs, self)
        return self._library[file]

    def is_driver_side(self, path: str | None) -> bool:
        if path not in self._driver_side:
            self._driver_side[path] = _driver_side(path, self.skip, self)
        return self._driver_side[path]

    def is_interpreter(self, path: str | None) -> bool:
        if path not in self._interpreter:
            self._interpreter[path] = _interpreter(path, self)
        return self._interpreter[path]


_SYSTEM_LIBS = ("libc.so", "libc-", "libstdc++", "libgcc_s", "ld-linux", "libpthread", "libffi")


def _attribute(
    python: list[Frame],
    python_cut: bool,
    native: list[NativeFrame],
    native_state: int,
    dirs: list[tuple[str, str]],
    native_limit: int | None = None,
    names: Naming | None = None,
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

    ``python``: the frames read, innermost first; a read that went past the kept frames to the
    user's line has a gap before the last two (their ``depth`` says where they are).
    ``python_cut``: the read stopped before the stack's end with no frame outside the libraries
    found. ``names``: a trace's :class:`Naming` (one for ``dirs`` otherwise).
    """
    if names is None:
        names = Naming(dirs)
    where = None
    entry_py: str | None = None
    for f in python:
        if not names.is_library_file(f.file):
            where = f
            break
        owner = names.owner_of(f.file)
        if owner is not None:
            entry_py = owner
    entry_native: str | None = None
    entry_native_frame: NativeFrame | None = None
    first_caller: str | None = None  # the library whose code called the driver
    native_known = native_state in (0, 1)
    seen_interpreter = False
    for n in native:
        if names.is_interpreter(n.library):
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
            library = f"{entry_py} ({_beyond(python)})"
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
        read_short = where is None and python_cut and bool(python)
        return (f"? ({_beyond(python)})" if read_short else "?"), False, where
    if where is None and python_cut and python:
        # The line that called into the library code read is further out than the read went:
        # what called it is not known, and said so.
        return f"{entry_native} ({_beyond(python)})", False, where
    return entry_native, entry_native == "cyctx" and first_caller == "cyctx", where


def _beyond(python: list[Frame]) -> str:
    outer = python[-1]
    read = outer.depth + 1 if outer.depth is not None else len(python)
    return f"called from beyond {outer}, the outermost of the {read} Python frames read"
