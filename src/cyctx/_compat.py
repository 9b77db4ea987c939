"""Is the installed cuda-bindings one that cyctx supports?

cyctx's compiled modules do not bind to cuda-bindings' C API (they resolve the driver
themselves, ``_cpp/driver.h``), so one build serves every cuda-bindings in the supported range,
CUDA 12 and 13 alike. Outside it, the doctor (which uses ``cuda.bindings.driver``) and
Cython code that cimports cyctx (which compiles against its ``cydriver.pxd``) need a
cuda-bindings of CUDA 12.9 or newer: older, importing cyctx stops with a command that fixes it
from where the user stands (staying on their CUDA major whenever that major is supported). A
major newer than the tested ones warns once (UntestedBindingsWarning) and imports: the guard
does not use cuda-bindings, and what does (the doctor, :func:`cyctx.get_include_dirs`) says,
when it fails, that the untested cuda-bindings may be why. Pure Python, no driver access, and
cheap: the version is read from cuda.bindings' ``_version.py`` without importing it (nor
importlib.metadata, which costs tens of milliseconds).
"""

from __future__ import annotations

import os
import sys

# The same range as `dependencies` in pyproject.toml (tests/test_packaging.py checks).
SUPPORTED_MIN = (12, 9)
SUPPORTED_MAJORS = (12, 13)


class IncompatibleBindingsError(ImportError):
    """The installed cuda-bindings is older than cyctx supports, or missing.

    ``fix``: the command that fixes it (also the end of the message)."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


class UntestedBindingsWarning(UserWarning):
    """The installed cuda-bindings is of a CUDA major newer than this cyctx was tested with."""


def _major_minor(version: str) -> tuple[int, int]:
    parts = version.split(".")
    if len(parts) < 2 or not all(p.isdigit() and p.isascii() for p in parts[:2]):
        raise IncompatibleBindingsError(f"cannot parse cuda-bindings version {version!r}")
    return int(parts[0]), int(parts[1])


def is_untested(installed: str | None) -> bool:
    """A cuda-bindings of a major newer than the tested ones (it imports, with a warning)."""
    return installed is not None and _major_minor(installed)[0] > SUPPORTED_MAJORS[-1]


def untested_note(installed: str | None) -> str:
    """What to add to an error of the doctor or a build when the cuda-bindings is untested."""
    if not is_untested(installed):
        return ""
    return (
        f" (cuda-bindings {installed} is newer than this cyctx was tested with, "
        f"{supported_range()}, which may be why: {untested_fix()})"
    )


def supported_range() -> str:
    return f">={SUPPORTED_MIN[0]}.{SUPPORTED_MIN[1]},<{SUPPORTED_MAJORS[-1] + 1}"


def check_bindings(installed: str | None) -> None:
    """Raise IncompatibleBindingsError unless cyctx can use cuda-bindings ``installed``; warn
    UntestedBindingsWarning for a major newer than the tested ones."""
    if installed is None:
        fix = "pip install 'cuda-bindings>=13,<14' (or 'cuda-bindings>=12.9,<13' for CUDA 12)"
        raise IncompatibleBindingsError(
            "cuda-bindings is not installed, and cyctx needs it (the doctor and `cimport cyctx` "
            f"use it): {fix}",
            fix,
        )
    major, minor = _major_minor(installed)
    if major in SUPPORTED_MAJORS and (major, minor) >= SUPPORTED_MIN:
        return
    if major > SUPPORTED_MAJORS[-1]:
        import warnings

        warnings.warn(
            f"cuda-bindings {installed} is newer than this cyctx was tested with "
            f"({supported_range()}). Guards work (they do not use cuda-bindings); the doctor "
            f"and `cimport cyctx` builds use it and may fail: pip install --upgrade cyctx for "
            f"a release tested with CUDA {major}",
            UntestedBindingsWarning,
            stacklevel=3,
        )
        return
    # An older minor of a supported major stays on it; an older major goes to the lowest.
    fix = f"pip install 'cuda-bindings>={SUPPORTED_MIN[0]}.{SUPPORTED_MIN[1]},<{SUPPORTED_MIN[0] + 1}'"
    why = (
        ""
        if major == SUPPORTED_MIN[0]
        else f"cyctx needs CUDA {SUPPORTED_MIN[0]} or newer bindings (and a driver of CUDA 12.0+): "
    )
    raise IncompatibleBindingsError(
        f"cuda-bindings {installed} is installed; cyctx supports cuda-bindings "
        f"{supported_range()}: {why}{fix}",
        fix,
    )


def load_doctor():
    """Import cyctx's doctor, which uses cuda.bindings.driver: with an untested cuda-bindings,
    the error says that may be why."""
    from cyctx import _doctor

    try:
        _doctor.load()
    except ImportError as exc:
        note = untested_note(installed_bindings_version())
        if not note:
            raise
        raise ImportError(f"cyctx's doctor cannot load cuda.bindings: {exc}{note}") from exc
    return _doctor


def untested_fix() -> str:
    """The command for a cuda-bindings of a newer major than the tested ones."""
    return (
        f"pip install --upgrade cyctx, or "
        f"pip install 'cuda-bindings>={SUPPORTED_MAJORS[-1]},<{SUPPORTED_MAJORS[-1] + 1}'"
    )


def bindings_problem() -> IncompatibleBindingsError | None:
    """Why the installed cuda-bindings cannot serve the doctor, or None when it can: missing,
    older than supported, or of an untested major that cuda.bindings.driver fails to import."""
    import warnings

    installed = installed_bindings_version()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UntestedBindingsWarning)  # import warned already
            check_bindings(installed)
        load_doctor()
    except IncompatibleBindingsError as exc:
        return exc
    except ImportError as exc:
        cause = exc.__cause__ or exc
        if is_untested(installed):
            what = f"cuda-bindings {installed} is newer than this cyctx was tested with ({supported_range()})"
            fix = untested_fix()
        else:
            what = f"cuda-bindings {installed} is installed"
            fix = f"pip install --force-reinstall 'cuda-bindings{supported_range()}'"
        return IncompatibleBindingsError(
            f"{what}, and importing it failed ({type(cause).__name__}: {cause}): {fix}", fix
        )
    return None


def command_line_running() -> bool:
    """True while ``python -m cyctx`` locates its module, or the ``cyctx`` console script
    (``_cyctx_cli``) runs: the command line reports an unusable cuda-bindings itself (the
    doctor's ``bindings_unusable`` finding) rather than stop at ``import cyctx``."""
    cli = sys.modules.get("_cyctx_cli")
    if cli is not None and getattr(cli, "running", False):
        return True
    # `python -m cyctx`: while runpy imports the package, sys.argv[0] is "-m" and the
    # interpreter's own arguments name the module.
    if sys.argv[:1] != ["-m"]:
        return False
    argv = list(getattr(sys, "orig_argv", ()))
    for i, arg in enumerate(argv[1:], 1):
        if arg == "-m":
            return argv[i + 1 : i + 2] in (["cyctx"], ["cyctx.__main__"])
        if arg.startswith("-m") and not arg.startswith("--"):
            return arg[2:] in ("cyctx", "cyctx.__main__")
    return False


def installed_bindings_version() -> str | None:
    """The installed cuda-bindings' version, or None when it is not installed.

    Read from cuda.bindings' own ``_version.py`` (the file setuptools-scm writes into the
    wheel): the package is not imported, and neither is importlib.metadata. Only a
    cuda-bindings without that file is asked through importlib.metadata."""
    mod = sys.modules.get("cuda.bindings")
    if mod is not None and isinstance(getattr(mod, "__version__", None), str):
        return mod.__version__
    for entry in sys.path:
        folder = os.path.join(entry or ".", "cuda", "bindings")
        if os.path.isfile(os.path.join(folder, "__init__.py")):
            found = _version_file(os.path.join(folder, "_version.py"))
            if found is not None:
                return found
            break  # the package import would find: its metadata says
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cuda-bindings")
    except PackageNotFoundError:
        return None


def _version_file(path: str) -> str | None:
    # `__version__ = version = '13.5.0'` (setuptools-scm) or `__version__ = "12.9.0"`.
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("__version__") and "=" in line:
            value = line.rsplit("=", 1)[1].strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                return value[1:-1]
    return None
