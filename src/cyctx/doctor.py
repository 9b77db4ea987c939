"""cyctx's doctor from Python: :func:`diagnose`, and the records a :class:`Diagnosis` holds.

Importing this module loads the doctor (``cuda.bindings.driver``, ``ctypes``, its report and
words); ``import cyctx`` does not, and ``cyctx.diagnose()`` loads it on its first call. The
names live here rather than on ``cyctx`` itself because a module-level ``__getattr__`` (the
only way to load them lazily from there) would make every ``cyctx.<name>`` lookup take the
interpreter's slow path: ``with cyctx.device(0):`` would pay for it on each block.
"""

from cyctx._compat import load_doctor as _load_doctor

_load_doctor()  # with an untested cuda-bindings, its ImportError says so

from cyctx._doctor import (  # noqa: E402 (after the loader's check)
    ContextInfo,
    DeviceInfo,
    Diagnosis,
    Finding,
    GuardInfo,
    LoadedLibrary,
    RuntimeInfo,
    diagnose,
)

__all__ = [
    "ContextInfo",
    "DeviceInfo",
    "Diagnosis",
    "Finding",
    "GuardInfo",
    "LoadedLibrary",
    "RuntimeInfo",
    "diagnose",
]

# Defined in private modules, public here: reprs, pickles and the docs name them as users
# import them (`cyctx.doctor.Finding`).
for _cls in (ContextInfo, DeviceInfo, Diagnosis, Finding, GuardInfo, LoadedLibrary, RuntimeInfo):
    _cls.__module__ = __name__
del _cls
