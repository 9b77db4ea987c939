"""Is the installed cuda-bindings one that cyctx supports?

cyctx's compiled modules do not bind to cuda-bindings' C API (they resolve the driver
themselves, ``_cpp/driver.h``), so one build serves every cuda-bindings in the supported range,
CUDA 12 and 13 alike. Outside it, the doctor (which uses ``cuda.bindings.driver``) and
Cython code that cimports cyctx (which compiles against its ``cydriver.pxd``) are untested,
so importing cyctx stops with a command that fixes it from where the user stands: staying
on their CUDA major whenever that major is supported. Pure Python, no driver access.
"""

from __future__ import annotations

import re

# The same range as `dependencies` in pyproject.toml (tests/test_packaging.py checks).
SUPPORTED_MIN = (12, 9)
SUPPORTED_MAJORS = (12, 13)


class IncompatibleBindingsError(ImportError):
    """The installed cuda-bindings is outside the range cyctx supports."""


def _major_minor(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        raise IncompatibleBindingsError(f"cannot parse cuda-bindings version {version!r}")
    return int(m.group(1)), int(m.group(2))


def supported_range() -> str:
    return f">={SUPPORTED_MIN[0]}.{SUPPORTED_MIN[1]},<{SUPPORTED_MAJORS[-1] + 1}"


def check_bindings(installed: str | None) -> None:
    """Raise IncompatibleBindingsError unless cyctx supports cuda-bindings ``installed``."""
    if installed is None:
        raise IncompatibleBindingsError(
            "cuda-bindings is not installed, and cyctx needs it (the doctor and `cimport cyctx` "
            "use it): pip install 'cuda-bindings>=13,<14' (or 'cuda-bindings>=12.9,<13' "
            "for CUDA 12)"
        )
    major, minor = _major_minor(installed)
    if major in SUPPORTED_MAJORS and (major, minor) >= SUPPORTED_MIN:
        return
    if major == SUPPORTED_MIN[0]:  # an older minor of a supported major: stay on it
        fix = f"pip install 'cuda-bindings>={SUPPORTED_MIN[0]}.{SUPPORTED_MIN[1]},<{major + 1}'"
    elif major < SUPPORTED_MIN[0]:
        fix = (
            f"cyctx needs CUDA {SUPPORTED_MIN[0]} or newer bindings (and a driver of CUDA "
            f"12.0+): pip install 'cuda-bindings>={SUPPORTED_MIN[0]}.{SUPPORTED_MIN[1]},<{SUPPORTED_MIN[0] + 1}'"
        )
    else:  # a newer major than this cyctx knows
        fix = (
            f"this cyctx supports CUDA {SUPPORTED_MAJORS[0]} and {SUPPORTED_MAJORS[-1]}: "
            f"pip install --upgrade cyctx for a release that supports CUDA {major}, or "
            f"pip install 'cuda-bindings>={SUPPORTED_MAJORS[-1]},<{SUPPORTED_MAJORS[-1] + 1}'"
        )
    raise IncompatibleBindingsError(
        f"cuda-bindings {installed} is installed; cyctx supports cuda-bindings "
        f"{supported_range()}: {fix}"
    )


def installed_bindings_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cuda-bindings")
    except PackageNotFoundError:
        return None
