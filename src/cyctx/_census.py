"""The census: every CUDA library loaded in this process, the version each reports, and the
installed distribution that ships it. The doctor lists it, the fork checks and the tracer look
libraries up in it; it imports none of them.

The libraries are found in the process's memory map (``/proc/self/maps``: a plain file read,
with no loader lock held, unlike ``dl_iterate_phdr``, whose callback would take the GIL inside
the loader's lock) and asked through handles that are already loaded: ``dlopen`` with
``RTLD_NOLOAD`` returns the library only when it is loaded already, and loads nothing. Each
is asked one version function that only reports a constant (``cudaRuntimeGetVersion``,
``cuDriverGetVersion``, ``nvrtcVersion``, ``nvJitLinkVersion``), and the handle is closed
again. Nothing here initialises a runtime or creates a context. A runtime linked statically
into a Python extension (``cuda.bindings.runtime``, CuPy's) is asked through that module, only
when it is imported already.

Which distribution ships a file comes from the distributions' ``RECORD`` files: slow enough
(torch's lists thousands of files) that only :func:`census` reads them, once per call.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


def plausible_version(v: int) -> bool:
    """Whether ``v`` can be a CUDA version as the version functions encode it (1000 * major +
    10 * minor, major 1 to 99, minor 0 to 99): anything else is a broken or foreign library's
    answer, which the doctor reports as such and never takes for a version."""
    return 1000 <= v <= 99990 and v % 10 == 0


@dataclass
class LoadedLibrary:
    """A CUDA library loaded in the process (one entry of the census)."""

    kind: str  # "driver", "runtime", "nvrtc", "nvjitlink" or "library" (cuBLAS, cuDNN, ...)
    name: str  # the file name, e.g. libcudart.so.12
    path: str
    version: int | None = None  # what it reports, e.g. 12090
    version_from: str | None = None  # the function that said so, or the wheel it came with
    distribution: str | None = None  # the installed distribution that ships it, "torch 2.11.0"
    static: bool = False  # a runtime linked into another library (cuda.bindings.runtime)
    by_doctor: bool = (
        False  # mapped after diagnose() began: the doctor's own load, not the program's
    )
    note: str | None = None  # why the version is missing
    # Whether the mapped file is still the one at ``path``: "same", or, where /proc/self/maps
    # marks it "(deleted)", "deleted" (no file there now) or "replaced" (another file there
    # now, as `pip install -U` leaves it under a running process).
    file: str = "same"
    on_disk: str | None = None  # for deleted or replaced: what is at ``path`` now, in words


# The libraries of the census, by the start of their file name, with the version function
# each answers (None: listed with its path and distribution only). Order: how they are shown.
KINDS: tuple[tuple[str, re.Pattern[str], str | None], ...] = (
    ("driver", re.compile(r"libcuda\.so(\.|$)"), "cuDriverGetVersion"),
    ("runtime", re.compile(r"libcudart\.so(\.|$)"), "cudaRuntimeGetVersion"),
    ("nvrtc", re.compile(r"libnvrtc\.so(\.|$)"), "nvrtcVersion"),
    ("nvjitlink", re.compile(r"libnvJitLink\.so(\.|$)"), "nvJitLinkVersion"),
    (
        "library",
        re.compile(
            r"lib(cublas|cublasLt|cufft|cufftw|curand|cusparse|cusparseLt|cusolver|cusolverMg"
            r"|cudnn|nccl|nvToolsExt|cupti|nvjpeg|cufile|nvshmem_host|nvvm)\.so(\.|$)"
        ),
        None,
    ),
)


_DELETED = " (deleted)"


@dataclass
class Mapped:
    """One shared object of the memory map: its path (without the kernel's ``(deleted)``),
    its inode, whether the kernel marked it deleted, and the address ranges it is mapped at."""

    path: str
    inode: int
    deleted: bool
    ranges: list[tuple[int, int]] = field(default_factory=list)

    def file_now(self) -> str:
        """ "same", "deleted" or "replaced": whether the file at ``path`` is the mapped one."""
        # (The kernel's mark, not an inode comparison: overlay file systems report other
        # inode numbers to stat than to the memory map.)
        if not self.deleted:
            return "same"
        return "replaced" if os.path.exists(self.path) else "deleted"


def mapped_files() -> list[Mapped]:
    """The shared objects mapped in this process, each once, in the order of the map; a file
    deleted or replaced since it was mapped included (the kernel lists it as ``PATH
    (deleted)``)."""
    seen: dict[tuple[str, int], Mapped] = {}
    try:
        with open("/proc/self/maps", "rb") as f:  # bytes: a name as os names it, never altered
            for raw in f:
                parts = os.fsdecode(raw).split(None, 5)
                if len(parts) != 6 or not parts[5].startswith("/"):
                    continue
                path = parts[5].rstrip("\n")
                deleted = path.endswith(_DELETED)
                if deleted:
                    path = path[: -len(_DELETED)]
                if ".so" not in os.path.basename(path):
                    continue
                inode = int(parts[4]) if parts[4].isdigit() else 0
                entry = seen.setdefault((path, inode), Mapped(path, inode, deleted))
                start, _, end = parts[0].partition("-")
                entry.ranges.append((int(start, 16), int(end, 16)))
    except OSError:  # not Linux, or /proc not mounted
        return []
    return list(seen.values())


def mapped_paths() -> list[str]:
    """The paths of :func:`mapped_files`, each once."""
    return list(dict.fromkeys(m.path for m in mapped_files()))


def kind_of(path: str) -> str | None:
    name = os.path.basename(path)
    for kind, pattern, _ in KINDS:
        if pattern.match(name):
            return kind
    return None


class _Dl:
    """dlopen(RTLD_NOLOAD), dlsym and dlclose of the process's C library."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None)  # the symbols already in the process: loads nothing
        self.open = libc.dlopen
        self.open.restype, self.open.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
        self.sym = libc.dlsym
        self.sym.restype, self.sym.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
        self.close = libc.dlclose
        self.close.argtypes = [ctypes.c_void_p]
        self.info = getattr(libc, "dlinfo", None)  # in libdl before glibc 2.34
        if self.info is not None:
            self.info.restype = ctypes.c_int
            self.info.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]

    def loaded_names(self) -> list[tuple[str, int]]:
        """(name, address of its dynamic section) of each object the loader has loaded, from
        its link map (``dlinfo(RTLD_DI_LINKMAP)`` of the program: a list the loader keeps, read
        without calling into it). The name is what the loader knows the object by, which a
        NOLOAD open of that name finds whatever is on disk now."""
        head = ctypes.POINTER(_LinkMap)()
        program = self.open(None, os.RTLD_NOLOAD | os.RTLD_LAZY)
        if self.info is None or not program:
            return []
        try:
            if self.info(program, _RTLD_DI_LINKMAP, ctypes.byref(head)) != 0 or not head:
                return []
            out, node = [], head
            while node:
                entry = node.contents
                if entry.l_name:
                    out.append((entry.l_name.decode(errors="replace"), entry.l_ld or 0))
                node = entry.l_next
            return out
        finally:
            self.close(program)


_RTLD_DI_LINKMAP = 2  # <dlfcn.h>


class _LinkMap(ctypes.Structure):
    # The fields _fields_ below makes, declared for the type checkers.
    l_addr: int | None
    l_name: bytes | None
    l_ld: int | None
    l_next: ctypes._Pointer[_LinkMap]
    l_prev: ctypes._Pointer[_LinkMap]


# The public head of glibc's struct link_map (<link.h>); the loader's own fields follow it.
_LinkMap._fields_ = [
    ("l_addr", ctypes.c_void_p),
    ("l_name", ctypes.c_char_p),
    ("l_ld", ctypes.c_void_p),
    ("l_next", ctypes.POINTER(_LinkMap)),
    ("l_prev", ctypes.POINTER(_LinkMap)),
]


def loader_name(dl: _Dl, mapped: Mapped) -> str | None:
    """The name the loader knows a mapped file by: the link-map entry whose dynamic section
    lies in the file's mapped ranges (a deleted or replaced file can no longer be found by its
    path on disk). None: mapped by other means than the loader."""
    for name, dynamic in dl.loaded_names():
        if any(start <= dynamic < end for start, end in mapped.ranges):
            return name
    return None


_INT2 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))
_INT1 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))


def _ask(fn_name: str, address: int) -> tuple[int | None, str | None]:
    """Call the version function at ``address``: (1000 * major + 10 * minor, None) or
    (None, why not): an error, or an answer that cannot be a CUDA version."""
    if fn_name in ("nvrtcVersion", "nvJitLinkVersion"):  # (major, minor); unsigned for nvJitLink
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        e = _INT2(address)(ctypes.byref(major), ctypes.byref(minor))
        value = 1000 * major.value + 10 * minor.value
        raw = f"major {major.value}, minor {minor.value}"
        ok = 0 <= minor.value <= 99 and plausible_version(value)
    else:  # cudaRuntimeGetVersion, cuDriverGetVersion: 1000 * major + 10 * minor already
        v = ctypes.c_int(0)
        e = _INT1(address)(ctypes.byref(v))
        value, raw = v.value, str(v.value)
        ok = plausible_version(value)
    if e != 0:
        return None, f"{fn_name} returned {e}"
    if not ok:
        return None, f"{fn_name} returned an implausible version ({raw})"
    return value, None


def query(dl: _Dl, path: str, fn_name: str | None) -> tuple[bool, int | None, str | None]:
    """(loaded as a library, version or None, note) through a handle already loaded."""
    handle = dl.open(os.fsencode(path), os.RTLD_NOLOAD | os.RTLD_LAZY)
    if not handle:  # mapped, but not as a loaded library (a file mapped by other means)
        return False, None, None
    try:
        if fn_name is None:
            return True, None, None
        address = dl.sym(handle, fn_name.encode())
        if not address:
            return True, None, f"no {fn_name} in it"
        version, why = _ask(fn_name, address)
        return True, version, why
    finally:
        dl.close(handle)  # the NOLOAD open took a reference: give it back


# The owner of a file found once, for the process's life (a file replaced on disk is asked
# again): reading every distribution's RECORD takes seconds in a large environment, and a
# program may call diagnose() often.
_OWNER_OF: dict[tuple[str, int], str | None] = {}


class Owners:
    """Which installed distribution ships a file, from the distributions' RECORD files; each
    RECORD is read at most once for the life of this object (one census), and each file's
    answer is kept for the process's life."""

    def __init__(self) -> None:
        self._dists: list[tuple[str, str, Any]] | None = None  # (root, "name version", dist)
        self._records: dict[int, str] = {}

    def _all(self) -> list[tuple[str, str, Any]]:
        if self._dists is None:
            from importlib.metadata import distributions

            found = []
            # Every one, a name installed twice too: each owns the files its RECORD lists.
            for dist in distributions():
                name = dist.metadata["Name"]
                if not name:
                    continue
                root = os.path.realpath(str(dist.locate_file("")))
                found.append((root, f"{name} {dist.version}", dist))
            self._dists = found
        return self._dists

    def owner(self, path: str) -> str | None:
        """``"name version"`` of the distribution whose RECORD lists ``path``, else None."""
        real = os.path.realpath(path)
        try:
            key = (real, os.stat(real).st_mtime_ns)
        except OSError:
            key = (real, 0)
        if key not in _OWNER_OF:
            # Threads that race the first ask each find it; the first answer kept is the one
            # every one of them returns (dict.setdefault is atomic).
            return _OWNER_OF.setdefault(key, self._find(real))
        return _OWNER_OF[key]

    def _find(self, real: str) -> str | None:
        for i, (root, label, dist) in enumerate(self._all()):
            if not real.startswith(root.rstrip(os.sep) + os.sep):
                continue
            rel = os.path.relpath(real, root).replace(os.sep, "/")
            if i not in self._records:
                try:
                    self._records[i] = "\n" + (dist.read_text("RECORD") or "")
                except OSError:
                    self._records[i] = ""
            if f"\n{rel}," in self._records[i]:
                return label
        return None


# Runtimes linked statically into a Python extension, which the memory map cannot show: the
# module that holds one, the module whose file it is in, and how to ask its version.
STATIC_RUNTIMES: tuple[tuple[str, str, Callable[[Any], tuple[int, ...]]], ...] = (
    (
        "cuda.bindings.runtime",
        "cuda.bindings._internal.runtime",
        lambda m: tuple(int(x) for x in m.cudaRuntimeGetVersion()),
    ),
    # CuPy links the runtime into each of its extensions; this one is its runtime API.
    ("cupy_backends.cuda.api.runtime", "", lambda m: (0, int(m.runtimeGetVersion()))),
)


def static_runtimes(owners: Owners) -> list[LoadedLibrary]:
    """The CUDA runtimes linked into Python extensions, for those imported already (importing
    one here would be a load); each asked with its own cudaRuntimeGetVersion."""
    out = []
    for module, inner, ask in STATIC_RUNTIMES:
        mod = sys.modules.get(module)
        if mod is None:
            continue
        holder = sys.modules.get(inner) if inner else None
        path = getattr(holder, "__file__", None) or getattr(mod, "__file__", None) or module
        lib = LoadedLibrary(
            kind="runtime",
            name=f"cudart (static, in {module})",
            path=path,
            static=True,
            distribution=owners.owner(path),
        )
        try:
            e, v = ask(mod)
        except Exception as exc:  # a version without the function, or a broken install
            lib.note = f"cudaRuntimeGetVersion: {type(exc).__name__}: {exc}"
        else:
            if e != 0:
                lib.note = f"cudaRuntimeGetVersion returned {e}"
            elif not plausible_version(v):
                lib.note = f"cudaRuntimeGetVersion returned an implausible version ({v})"
            else:
                lib.version, lib.version_from = v, "cudaRuntimeGetVersion"
        out.append(lib)
    return out


def _on_disk(owners: Owners, path: str, file_now: str) -> str | None:
    if file_now == "same":
        return None
    if file_now == "deleted":
        return "no file at this path now"
    dist = owners.owner(path)
    return "another file at this path now" + (f", shipped by {dist}" if dist else "")


def census(
    before: Iterable[str] | None = None,
    fallback_version: Callable[[str], tuple[int | None, str | None]] | None = None,
) -> list[LoadedLibrary]:
    """Every CUDA library loaded in this process now, the driver first.

    ``before``: the paths mapped before the doctor's own work (:func:`mapped_paths`); a
    library mapped since is marked ``by_doctor``. ``fallback_version(path)``: where a
    runtime's version function does not answer (an 11.x one without a driver), the version
    from elsewhere, ``(version, where from)``.
    """
    earlier = None if before is None else set(before)
    dl = _Dl()
    owners = Owners()
    found: dict[str, list[LoadedLibrary]] = {kind: [] for kind, _, _ in KINDS}
    functions = {kind: fn for kind, _, fn in KINDS}
    seen: set[str] = set()
    for mapped in mapped_files():
        path = mapped.path
        kind = kind_of(path)
        file_now = mapped.file_now()
        real = os.path.realpath(path) if file_now == "same" else f"{path}\0{mapped.inode}"
        if kind is None or real in seen:
            continue
        seen.add(real)
        # A file deleted or replaced since it was loaded is asked through the name the loader
        # knows it by: its path now names another file, or none.
        name = path if file_now == "same" else loader_name(dl, mapped)
        loaded, version, note = query(dl, name, functions[kind]) if name else (False, None, None)
        if not loaded:
            continue
        lib = LoadedLibrary(
            kind=kind,
            name=os.path.basename(path),
            path=path,
            version=version,
            version_from=functions[kind] if version is not None else None,
            # The distribution that ships the file at the path now need not be the one that
            # shipped the file loaded: a replaced file's is told apart, as what is on disk.
            distribution=owners.owner(path) if file_now == "same" else None,
            by_doctor=earlier is not None and path not in earlier,
            note=note,
            file=file_now,
            on_disk=_on_disk(owners, path, file_now),
        )
        if kind == "runtime" and version is None and fallback_version is not None:
            if file_now == "same":  # (a wheel's version describes the file on disk)
                lib.version, lib.version_from = fallback_version(path)
        found[kind].append(lib)
    found["runtime"].extend(static_runtimes(owners))
    return [lib for kind, _, _ in KINDS for lib in found[kind]]
