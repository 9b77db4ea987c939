"""cyctx's doctor: a read-only report of the CUDA driver, runtime and contexts, with findings
(docs/doctor.md). It only *queries*: it never retains, pushes or sets a context, and its census
loads nothing and initialises nothing.

One module per job; each imports only those above it in this list:

* ``cu``: calling cuda.bindings.driver (``call``, ``error_name``) and the named ``CUresult``
  codes; it imports nothing of cyctx;
* ``model``: the records a report holds (plain data classes), the exit statuses;
* ``probe``: the queries of the driver and of the live guards that fill the records;
* ``render``: the human report, and the styling the demo shares;
* ``report``: :class:`Diagnosis`, with its JSON form and (through ``render``) its human one;
* ``runtime``: the CUDA runtime protocol and its two implementations, :class:`Cudart` (a real
  ``libcudart`` through ctypes) and :class:`StandInRuntime` (on the simulated driver);
* ``gather``: what the doctor looks at, gathered once into a report, and how far the driver
  answered (``Seen``);
* ``words``: the words of each finding, its title, explanation and fix;
* ``rules``: the table of rules (``RULES``): each finding's code, severity, and when it is made;
* ``findings``: :func:`diagnose`: gather, then the rules' findings, worst first;
* ``demo``: ``python -m cyctx doctor --demo``, the classic failure step by step.

``bindings`` (the report when cuda-bindings is missing or unusable) imports model and report
only. ``cyctx.doctor`` (the public names) loads the package, and ``cyctx.diagnose`` on its
first call; the command line (``cyctx/__main__.py``) uses the names below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cyctx._doctor.demo import run_demo
    from cyctx._doctor.findings import diagnose
    from cyctx._doctor.model import (
        EXIT_NO_CUDA,
        EXIT_OK,
        EXIT_PROBLEM,
        EXIT_USAGE,
        ContextInfo,
        DeviceInfo,
        Finding,
        GuardInfo,
        LoadedLibrary,
        RuntimeInfo,
    )
    from cyctx._doctor.probe import device_count
    from cyctx._doctor.render import use_colour
    from cyctx._doctor.report import Diagnosis
    from cyctx._doctor.runtime import (
        Cudart,
        Runtime,
        StandInRuntime,
        cu11_candidates,
        find_cudart,
        load_cudart,
    )

# Each public name and its module, loaded on first use: the modules that need cuda.bindings
# (cu and those above it) load only when asked, so that the report of a cuda-bindings that is
# missing or unusable (``bindings``, which needs model and report only) can still be made.
_HOME = {
    "run_demo": "demo",
    "diagnose": "findings",
    "device_count": "probe",
    "use_colour": "render",
    "Diagnosis": "report",
    **dict.fromkeys(
        (
            "EXIT_NO_CUDA",
            "EXIT_OK",
            "EXIT_PROBLEM",
            "EXIT_USAGE",
            "ContextInfo",
            "DeviceInfo",
            "Finding",
            "GuardInfo",
            "LoadedLibrary",
            "RuntimeInfo",
        ),
        "model",
    ),
    **dict.fromkeys(
        ("Cudart", "Runtime", "StandInRuntime", "cu11_candidates", "find_cudart", "load_cudart"),
        "runtime",
    ),
}


def load() -> None:
    """Import every module of the doctor now (ImportError when cuda.bindings cannot be)."""
    for mod in sorted(set(_HOME.values())):
        importlib.import_module(f"{__name__}.{mod}")


def __getattr__(name: str) -> object:
    mod = _HOME.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


__all__ = [
    "EXIT_NO_CUDA",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_USAGE",
    "ContextInfo",
    "Cudart",
    "DeviceInfo",
    "Diagnosis",
    "Finding",
    "GuardInfo",
    "LoadedLibrary",
    "Runtime",
    "RuntimeInfo",
    "StandInRuntime",
    "cu11_candidates",
    "device_count",
    "diagnose",
    "find_cudart",
    "load_cudart",
    "run_demo",
    "use_colour",
]
