"""Is the installed cuda-bindings the one cyctx was compiled against?

cyctx's extensions call cuda.bindings' cydriver through Cython's C-API capsules, whose
signatures are checked at import: another major (or a minor older than the build's)
fails there with an obscure TypeError, or worse. This check runs first and says what to do.
Pure Python, no driver access.
"""

from __future__ import annotations

import re


class IncompatibleBindingsError(ImportError):
    """The installed cuda-bindings cannot work with this build of cyctx."""


def _major_minor(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        raise IncompatibleBindingsError(f"cannot parse cuda-bindings version {version!r}")
    return int(m.group(1)), int(m.group(2))


def check_bindings(built: str, installed: str | None) -> None:
    """Raise IncompatibleBindingsError unless ``installed`` can serve a build against ``built``."""
    fix = (
        f"install the cuda-bindings cyctx was built with (pip install 'cuda-bindings=={built}'), "
        f"or rebuild cyctx against the installed one (pip install --force-reinstall --no-binary cyctx cyctx)"
    )
    if installed is None:
        raise IncompatibleBindingsError(f"cuda-bindings is not installed; cyctx was built against {built}: {fix}")
    (bmaj, bmin), (imaj, imin) = _major_minor(built), _major_minor(installed)
    if imaj != bmaj:
        raise IncompatibleBindingsError(
            f"cyctx was built against cuda-bindings {built} (CUDA {bmaj}) but {installed} "
            f"(CUDA {imaj}) is installed; the majors have different driver APIs: {fix}"
        )
    if imin < bmin:
        raise IncompatibleBindingsError(
            f"cyctx was built against cuda-bindings {built} but the older {installed} is "
            f"installed: {fix}"
        )


def installed_bindings_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cuda-bindings")
    except PackageNotFoundError:
        return None
