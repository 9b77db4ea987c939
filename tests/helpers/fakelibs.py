"""Stand-ins for a broken ``libcuda.so.1``, compiled on demand with the system C compiler.

A child that loads one of them first (``ctypes.CDLL(path, RTLD_GLOBAL)``, as a wrong
``LD_LIBRARY_PATH`` would) gets it from every later ``dlopen("libcuda.so.1")``: cyctx's and
cuda.bindings' alike. Each kind models a real misconfiguration:

stub           the CUDA toolkit's lib64/stubs/libcuda.so.1: every entry point answers
               CUDA_ERROR_STUB_LIBRARY (34)
old            a driver older than CUDA 12.0: no cuGetProcAddress_v2
lacking:NAME   a library with cuGetProcAddress_v2 that does not provide NAME (every other
               function is found, and answers CUDA_ERROR_UNKNOWN)
"""

import os
import shutil
import subprocess

_HEAD = r"""
typedef int CUresult;
typedef unsigned long long cuuint64_t;
static CUresult unknown(void) { return 999; }
"""

_STUB = (
    _HEAD
    + r"""
CUresult cuGetProcAddress_v2(const char *s, void **p, int v, cuuint64_t f, int *st) {
    (void)s; (void)v; (void)f; if (p) *p = 0; if (st) *st = 0; return 34;
}
CUresult cuGetProcAddress(const char *s, void **p, int v, cuuint64_t f) {
    (void)s; (void)v; (void)f; if (p) *p = 0; return 34;
}
CUresult cuInit(unsigned int flags) { (void)flags; return 34; }
CUresult cuDriverGetVersion(int *v) { if (v) *v = 0; return 34; }
"""
)

_OLD = (
    _HEAD
    + r"""
/* What a driver of CUDA 11.x exports: cuGetProcAddress without the status argument. */
CUresult cuGetProcAddress(const char *s, void **p, int v, cuuint64_t f) {
    (void)s; (void)v; (void)f; if (p) *p = (void *)unknown; return 0;
}
CUresult cuInit(unsigned int flags) { (void)flags; return 0; }
CUresult cuDriverGetVersion(int *v) { if (v) *v = 11080; return 0; }
"""
)

_LACKING = (
    _HEAD
    + r"""
#include <string.h>
CUresult cuGetProcAddress_v2(const char *s, void **p, int v, cuuint64_t f, int *st) {
    (void)v; (void)f;
    if (strcmp(s, "%(name)s") == 0) { if (p) *p = 0; if (st) *st = 1; return 0; }  /* SYMBOL_NOT_FOUND */
    if (p) *p = (void *)unknown; if (st) *st = 0; return 0;
}
CUresult cuGetProcAddress(const char *s, void **p, int v, cuuint64_t f) {
    int st; return cuGetProcAddress_v2(s, p, v, f, &st);
}
CUresult cuInit(unsigned int flags) { (void)flags; return 999; }
CUresult cuDriverGetVersion(int *v) { if (v) *v = 13000; return 0; }
"""
)


def compiler():
    """The C compiler, or None."""
    return shutil.which("cc") or shutil.which("gcc")


def shared_library(source, path, soname=None, flags=()):
    """Compile C ``source`` into the shared library ``path`` (its soname ``soname``, if given);
    the source is left beside it as ``path + ".c"``. Returns ``path``. Without a C compiler,
    skips the test that asked (every stand-in below is built here)."""
    if compiler() is None:
        import pytest

        pytest.skip("no C compiler")
    c = str(path) + ".c"
    with open(c, "w") as f:
        f.write(source)
    link = [f"-Wl,-soname,{soname}"] if soname else []
    subprocess.run(
        [compiler(), *flags, "-shared", "-fPIC", *link, "-o", str(path), c],
        check=True,
        capture_output=True,
    )
    return str(path)


def fake_libcuda(directory, kind):
    """Build the `kind` stand-in in `directory`; its path (soname libcuda.so.1)."""
    if kind == "stub":
        src = _STUB
    elif kind == "old":
        src = _OLD
    elif kind.startswith("lacking:"):
        src = _LACKING % {"name": kind.split(":", 1)[1]}
    else:
        raise ValueError(kind)
    out = os.path.join(str(directory), kind.replace(":", "-"))
    os.makedirs(out, exist_ok=True)
    return shared_library(src, os.path.join(out, "libcuda.so.1"), "libcuda.so.1")


def preload(lib):
    """Child-code prologue: load `lib` first, as the process's libcuda.so.1."""
    return f"import ctypes; ctypes.CDLL({lib!r}, mode=ctypes.RTLD_GLOBAL)\n"


# --- stand-ins for the CUDA libraries of the doctor's census --------------------------------------

# Each answers its version function and counts every call into it (census_calls), so a test
# can tell that the census asked and how often; nothing else is in them.
_VERSIONED = {
    "cudart": r"""
int census_calls = 0;
int cudaRuntimeGetVersion(int *v) { census_calls++; if (!v) return 1; *v = %(version)d; return 0; }
""",
    "nvrtc": r"""
int census_calls = 0;
int nvrtcVersion(int *major, int *minor) {
    census_calls++; *major = %(version)d / 1000; *minor = (%(version)d %% 1000) / 10; return 0;
}
""",
    "nvJitLink": r"""
int census_calls = 0;
int nvJitLinkVersion(unsigned *major, unsigned *minor) {
    census_calls++; *major = %(version)d / 1000; *minor = (%(version)d %% 1000) / 10; return 0;
}
""",
}


def fake_cuda_library(directory, lib, version, soname=None):
    """Build a stand-in ``lib{lib}.so.MAJOR`` (lib: cudart, nvrtc, nvJitLink) that reports
    ``version`` (e.g. 12090) in ``directory``; its path. soname: another file name and soname
    (``libcudart.so.11.0``, as CUDA 11's)."""
    name = soname or f"lib{lib}.so.{version // 1000}"
    os.makedirs(str(directory), exist_ok=True)
    path = shared_library(
        _VERSIONED[lib] % {"version": version}, os.path.join(str(directory), name), name
    )
    os.remove(path + ".c")
    return path


def fake_distribution(site, name, version, files):
    """An installed distribution ``name`` ``version`` in the folder ``site`` (put it on
    PYTHONPATH) whose RECORD lists ``files`` (paths under ``site``), as pip writes it."""
    info = os.path.join(str(site), f"{name.replace('-', '_')}-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    rel = os.path.relpath(info, str(site))
    with open(os.path.join(info, "RECORD"), "w") as f:
        for p in files:
            f.write(f"{os.path.relpath(p, str(site))},,\n")
        f.write(f"{rel}/METADATA,,\n{rel}/RECORD,,\n")
    return info
