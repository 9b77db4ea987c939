"""Find ``cuda.h`` for building against ``cuda.bindings.cydriver`` (no CUDA toolkit needed).

Used by ``setup.py`` (loaded by path, so it must not import cyctx) and by
:func:`cyctx.get_include_dirs` for Cython code that cimports cyctx. It imports nothing
from cyctx and nothing that loads a driver.

``cydriver.pxd`` includes ``cuda.h``; a header older than the bindings, or of another
major, does not compile (13.5 bindings against 13.0 headers fail to compile; docs/packaging.md). So the
header is checked against the installed ``cuda-bindings`` and a mismatch stops with the
exact pip command that fixes it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass


class HeaderError(RuntimeError):
    """No usable ``cuda.h``: the message says what to install."""


def in_pep517_build() -> bool:
    """Whether this runs inside a build backend called by a PEP 517 frontend (pip, build).

    There, the environment is the frontend's throw-away one: ``pip install`` from a shell does
    not reach it, only the ``[build-system] requires`` of the package being built does.
    pyproject_hooks, which pip and build call backends through, marks the backend's process.
    """
    return bool(
        os.environ.get("_PYPROJECT_HOOKS_BUILD_BACKEND") or os.environ.get("PEP517_BUILD_BACKEND")
    )


def _for_this_environment(message: str, major: int | None) -> HeaderError:
    if not in_pep517_build():
        return HeaderError(message)
    extra = "cu12" if major == 12 else "cu13"
    return HeaderError(
        f"{message}. This is an isolated PEP 517 build, whose environment holds only what "
        f"[build-system] requires in the pyproject.toml of the package being built lists: "
        f"`pip install` cannot help here. Add the requirements above there; a package that "
        f"cimports cyctx lists 'cyctx[{extra}]', which brings cuda-bindings with its headers"
    )


@dataclass(frozen=True)
class CudaHeader:
    include_dir: str
    found_via: str
    version: int  # CUDA_VERSION from cuda.h, e.g. 13050

    @property
    def major_minor(self) -> tuple[int, int]:
        return self.version // 1000, (self.version % 1000) // 10


def bindings_version() -> tuple[int, int, str]:
    """(major, minor, full string) of the installed cuda-bindings, without loading a driver."""
    try:
        from importlib.metadata import version

        full = version("cuda-bindings")
    except Exception as exc:  # not installed
        raise HeaderError(
            "cuda-bindings is not installed; install it first: pip install 'cuda-bindings==13.*'"
        ) from exc
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", full).groups())
    return major, minor, full


# Headers that cydriver.pxd may include besides cuda.h, and the wheel that ships each
# (cuda-bindings 13.3's cydriver.pxd includes cudaProfiler.h; 13.5's does not).
_HEADER_WHEELS = {"cudaProfiler.h": "nvidia-cuda-profiler-api"}


def required_headers() -> list[str]:
    """The C headers the installed cuda.bindings' cydriver.pxd includes."""
    import importlib.util

    spec = importlib.util.find_spec("cuda.bindings")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        pxd = os.path.join(loc, "cydriver.pxd")
        if os.path.isfile(pxd):
            with open(pxd, encoding="utf-8") as f:
                found = re.findall(r"""extern from ["']([^"'<>]+\.h)["']""", f.read())
            return sorted(set(found) | {"cuda.h"})
    return ["cuda.h"]


def header_wheel_requirement(header: str, major: int, minor: int) -> str:
    if header == "cuda.h":
        return runtime_wheel_requirement(major, minor)
    name = _HEADER_WHEELS.get(header, "nvidia-cuda-runtime")
    return f"{name}=={major}.{minor}.*" if major >= 13 else f"{name}-cu{major}=={major}.{minor}.*"


def runtime_wheel_requirement(major: int, minor: int) -> str:
    """The pip requirement whose wheel ships a cuda.h for CUDA major.minor."""
    if major >= 13:
        return f"nvidia-cuda-runtime=={major}.{minor}.*"
    return f"nvidia-cuda-runtime-cu{major}=={major}.{minor}.*"


def header_version(include_dir: str) -> int:
    path = os.path.join(include_dir, "cuda.h")
    with open(path, encoding="latin-1") as f:
        m = re.search(r"^#define\s+CUDA_VERSION\s+(\d+)", f.read(), re.M)
    if not m:
        raise HeaderError(f"{path} has no CUDA_VERSION define; is it really CUDA's cuda.h?")
    return int(m.group(1))


def _candidates():
    # An explicit toolkit wins: the user named it.
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            yield os.path.join(root, "include"), f"${var}"
    # The header wheels on sys.path. pip's isolated build environment is on sys.path but not
    # in site.getsitepackages(), where cuda-pathfinder looks, so look here first (else a fresh
    # `pip install .` would miss the nvidia-cuda-runtime wheel it just put there).
    import sys

    for entry in sys.path:
        for sub in ("nvidia/cu13/include", "nvidia/cuda_runtime/include"):
            inc = os.path.join(entry or ".", sub)
            if os.path.isfile(os.path.join(inc, "cuda.h")):
                yield inc, f"sys.path ({entry})"
    try:
        from cuda.pathfinder import locate_nvidia_header_directory
    except ImportError:
        return
    # cuda.h ships beside cuda_runtime.h in the nvidia-cuda-runtime wheel.
    located = locate_nvidia_header_directory("cudart")
    if located is not None and located.abs_path:
        yield located.abs_path, f"cuda-pathfinder ({located.found_via})"


def find_cuda_header() -> CudaHeader:
    """Locate a cuda.h that matches the installed cuda-bindings, or raise HeaderError.

    Inside a PEP 517 build the error also names ``[build-system] requires`` as the place to
    fix it (:func:`in_pep517_build`).
    """
    try:
        return _find_cuda_header()
    except HeaderError as exc:
        try:
            major = bindings_version()[0]
        except HeaderError:
            major = None
        raise _for_this_environment(str(exc), major) from None


def _find_cuda_header() -> CudaHeader:
    major, minor, full = bindings_version()
    needed = required_headers()
    fix = "pip install " + " ".join(
        f"'{header_wheel_requirement(h, major, minor)}'" for h in needed
    )
    problems = []
    for include_dir, via in _candidates():
        if not os.path.isfile(os.path.join(include_dir, "cuda.h")):
            problems.append(f"{via}: no cuda.h in {include_dir}")
            if via.startswith("$"):
                raise HeaderError(
                    problems[-1]
                    + f"; unset {via[1:]} or point it at a CUDA {major}.{minor}+ toolkit"
                )
            continue
        try:
            version = header_version(include_dir)
        except (HeaderError, OSError) as exc:  # no define, unreadable: named like the others
            problems.append(f"{via}: {exc}")
            if via.startswith("$"):
                raise HeaderError(
                    problems[-1] + f". Point {via[1:]} at a CUDA {major}.{minor}+ toolkit, "
                    f"unset it, or {fix}"
                ) from None
            continue
        hdr = CudaHeader(include_dir, via, version)
        hmaj, hmin = hdr.major_minor
        missing = [h for h in needed if not os.path.isfile(os.path.join(include_dir, h))]
        if hmaj != major or hmin < minor:
            problems.append(
                f"{via}: {include_dir}/cuda.h is CUDA {hmaj}.{hmin}, older than or of another major "
                f"than cuda-bindings {full}"
            )
        elif missing:
            # cuda.h alone is not enough: cydriver.pxd includes these too.
            wheels = " ".join(f"'{header_wheel_requirement(h, major, minor)}'" for h in missing)
            problems.append(
                f"{via}: {include_dir} lacks {', '.join(missing)}; pip install {wheels}"
            )
        else:
            return hdr
        if via.startswith("$"):
            # An explicit choice that cannot work must not be skipped silently.
            raise HeaderError(
                problems[-1]
                + f". Point {via[1:]} at a matching CUDA {major}.{minor}+ toolkit, unset it, or {fix}"
            )
    detail = (
        "; ".join(problems)
        if problems
        else "no CUDA_HOME/CUDA_PATH and cuda-pathfinder found nothing"
    )
    raise HeaderError(
        f"no cuda.h for cuda-bindings {full} ({detail}). It needs a CUDA {major}.{minor} or newer "
        f"{major}.x header: {fix}"
    )
