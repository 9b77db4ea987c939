"""The report when cuda-bindings is missing or unusable: the doctor cannot query the driver
(it does so through cuda.bindings.driver), so it says that, with the command that fixes it.

It imports :mod:`.model` and :mod:`.report` only, neither of which needs cuda.bindings.
"""

from __future__ import annotations

import platform
import threading

from cyctx._doctor.model import Finding
from cyctx._doctor.report import Diagnosis

CODE = "bindings_unusable"


def bindings_report(problem: str, fix: str, installed: str | None, cyctx_version: str) -> Diagnosis:
    """The doctor's report of a cuda-bindings that cannot be used: one error finding (exit
    status 1, a problem found); the driver is not queried."""
    t = threading.current_thread()
    return Diagnosis(
        simulated=False,
        driver_library=None,
        driver_version=None,
        driver_error="not queried: cuda-bindings is not usable",
        runtime=None,
        other_runtimes=[],
        devices=[],
        thread_name=t.name,
        thread_native_id=threading.get_native_id(),
        context=None,
        guards=[],
        findings=[
            Finding(
                code=CODE,
                severity="error",
                title=(
                    "cuda-bindings is not installed"
                    if installed is None
                    else f"cuda-bindings {installed} cannot be used"
                ),
                explanation=(
                    f"{problem}. The doctor queries the driver through cuda.bindings, so it "
                    "checked nothing else."
                ),
                fix=fix,
            )
        ],
        versions={
            "python": platform.python_version(),
            "cyctx": cyctx_version,
            "cuda-bindings": installed,
        },
    )
