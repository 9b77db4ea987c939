"""The report when cuda-bindings is missing or unusable: the doctor cannot query the driver
(it does so through cuda.bindings.driver), so it says that, with the command that fixes it.

It imports :mod:`.model` and :mod:`.report` only, neither of which needs cuda.bindings; so its
one finding is declared here, not in :data:`.rules.RULES` (whose words need cuda.bindings).
"""

from __future__ import annotations

import platform
from typing import Final

from cyctx._doctor.model import Finding
from cyctx._doctor.report import Diagnosis, empty_report

CODE = "bindings_unusable"
SEVERITY: Final = "error"  # exit status 1: a problem found, and one that the fix solves


def bindings_report(problem: str, fix: str, installed: str | None, cyctx_version: str) -> Diagnosis:
    """The doctor's report of a cuda-bindings that cannot be used: one error finding (exit
    status 1, a problem found); the driver is not queried."""
    report = empty_report(
        {"python": platform.python_version(), "cyctx": cyctx_version, "cuda-bindings": installed},
        driver_error="not queried: cuda-bindings is not usable",
    )
    report.findings.append(
        Finding(
            code=CODE,
            severity=SEVERITY,
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
    )
    return report
