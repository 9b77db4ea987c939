"""The report: :class:`Diagnosis`, the whole of what :func:`~.findings.diagnose` saw, with its
JSON form (:meth:`Diagnosis.to_dict`) and its human form (:meth:`Diagnosis.render`).

It sits above both of its parts: the records of :mod:`.model` (its fields are
:class:`~.model.DiagnosisRecord`'s) and the words of :mod:`.render`, which know nothing of this
module.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass
from typing import Any

from cyctx._doctor.model import DiagnosisRecord, version_str
from cyctx._doctor.render import render

SCHEMA = "cyctx.diagnosis/2"


@dataclass
class Diagnosis(DiagnosisRecord):
    """What :func:`diagnose` saw; ``str()`` gives the human report, :meth:`to_dict` the JSON one.

    Attributes
    ----------
    findings : list of Finding
        The recognised problems, worst first.
    simulated : bool
        The process runs on cyctx's simulated driver, not a GPU.
    loaded : list of LoadedLibrary
        The census: every CUDA library loaded in the process, with the version it reports
        and the installed distribution that ships it.
    """

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-able data (schema ``cyctx.diagnosis/2``)."""
        asdict = dataclasses.asdict
        ctx = self.context
        return {
            "schema": SCHEMA,
            "ok": self.ok,
            "exit_status": self.exit_status,
            "simulated": self.simulated,
            "versions": dict(self.versions),
            "process": {"pid": self.pid, "forked_from": self.forked_from},
            "driver": {
                "library": self.driver_library,
                "version": self.driver_version,
                "version_str": version_str(self.driver_version),
                "error": self.driver_error,
            },
            "runtime": asdict(self.runtime) if self.runtime else None,
            "other_runtimes": [asdict(r) for r in self.other_runtimes],
            "loaded": [
                {**asdict(lib), "version_str": version_str(lib.version)} for lib in self.loaded
            ],
            "devices": [
                {
                    "ordinal": dev.ordinal,
                    "name": dev.name,
                    "compute_capability": (
                        f"{dev.compute_capability[0]}.{dev.compute_capability[1]}"
                        if dev.compute_capability
                        else None
                    ),
                    "pci_bus_id": dev.pci_bus_id,
                    "total_memory": dev.total_memory,
                    "primary_context": {"active": dev.primary_active, "flags": dev.primary_flags},
                    "error": dev.error,
                }
                for dev in self.devices
            ],
            "thread": {
                "name": self.thread_name,
                "native_id": self.thread_native_id,
                # null: no current context (or the driver was not usable)
                "current_context": asdict(ctx) if ctx and (ctx.handle or ctx.error) else None,
                "runtime_current_device": self.runtime.current_device if self.runtime else None,
            },
            "guards": [{**asdict(g), "reset": g.reset} for g in self.guards],
            "findings": [asdict(f) for f in self.findings],
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    def render(self, colour: bool = False, width: int = 88, cli: bool = False) -> str:
        """The human report; ANSI colour when ``colour`` is true. ``cli``: the report is of
        the doctor's own new process (says so where that explains what is seen)."""
        return render(self, colour, width, cli)

    def __str__(self) -> str:
        return self.render()


def empty_report(
    versions: dict[str, str | None],
    *,
    driver_error: str | None = None,
    forked_from: int | None = None,
) -> Diagnosis:
    """A report of the calling thread that has seen nothing yet: no driver, device, context,
    guard, runtime or finding. Both the doctor and the report of unusable cuda-bindings (which
    never asks the driver) start from it."""
    return Diagnosis(
        simulated=False,
        driver_library=None,
        driver_version=None,
        driver_error=driver_error,
        runtime=None,
        other_runtimes=[],
        devices=[],
        thread_name=threading.current_thread().name,
        thread_native_id=threading.get_native_id(),
        context=None,
        guards=[],
        findings=[],
        forked_from=forked_from,
        versions=versions,
    )
