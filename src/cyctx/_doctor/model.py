"""The doctor's report: plain data classes, the JSON form and the exit statuses.

No driver access, and at import time no other module of the doctor: :mod:`.probe` and
:mod:`.runtime` fill these records, :mod:`.findings` judges them, :mod:`.render` prints them
(:meth:`Diagnosis.render` imports it when called).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Literal

SCHEMA = "cyctx.diagnosis/1"

# Exit statuses of `cyctx doctor` (2 is argparse's usage error).
EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, EXIT_NO_CUDA = 0, 1, 2, 3


def version_str(v: int | None) -> str | None:
    # CUDA encodes 1000 * major + 10 * minor (13000 -> 13.0, 11080 -> 11.8).
    return None if v is None else f"{v // 1000}.{(v % 1000) // 10}"


@dataclass
class Finding:
    """One thing the doctor recognised: what, why, and what to do.

    ``severity`` is ``"error"`` (driver calls fail or data was lost), ``"warning"`` (they
    will fail unless something is done first), ``"info"`` (a state worth knowing that is
    normal, such as a thread with no current context; it never makes a report less than OK)
    or ``"unavailable"`` (no driver or no GPU).
    """

    code: str
    severity: Literal["error", "warning", "info", "unavailable"]
    title: str
    explanation: str
    fix: str


@dataclass
class RuntimeInfo:
    """A ``libcudart``: where it is and what it says."""

    library: str
    source: str  # how it was found
    version: int | None = None  # cudaRuntimeGetVersion, e.g. 11080
    version_from: str | None = None  # "cudaRuntimeGetVersion" or the wheel it came with
    current_device: int | None = None  # cudaGetDevice on the calling thread
    note: str | None = None  # why current_device is missing, or a load error


@dataclass
class DeviceInfo:
    ordinal: int
    name: str | None = None
    compute_capability: tuple[int, int] | None = None
    pci_bus_id: str | None = None
    total_memory: int | None = None
    primary_active: bool | None = None
    primary_flags: int | None = None
    error: str | None = None


@dataclass
class ContextInfo:
    """The calling thread's current context (``handle`` 0: none)."""

    handle: int
    id: int | None = None
    id_error: str | None = None
    device: int | None = None
    primary: bool | None = None  # None: cannot be told without retaining it
    primary_why: str | None = None
    usable: bool | None = None
    api_version: int | None = None
    why: str | None = None  # why it is not usable
    error: str | None = None  # cuCtxGetCurrent failed


@dataclass
class GuardInfo:
    """A live :class:`cyctx.ContextGuard` and what the driver says about its context now."""

    device: int
    handle: int
    seen_id: int  # the id the guard last saw (at construction or its last enter)
    driver_id: int | None
    driver_id_error: str | None
    shared: bool
    primary: bool = True  # the guard retains a primary context (else the caller owns it)

    @property
    def reset(self) -> bool:
        """A primary context reset since the guard last saw it. Only a primary context is
        reset (and re-activated by the guard's next enter); a context the caller owns whose
        id changed or vanished was destroyed (see ``destroyed``)."""
        return self.primary and self.driver_id != self.seen_id

    @property
    def destroyed(self) -> bool:
        """The caller's context (cuCtxCreate, green) behind a guard was destroyed."""
        return not self.primary and self.driver_id != self.seen_id


@dataclass
class Diagnosis:
    """What :func:`diagnose` saw; ``str()`` gives the human report, :meth:`to_dict` the JSON one.

    Attributes
    ----------
    ok : bool
        True when no finding is an error and CUDA is usable.
    findings : list of Finding
        The recognised problems, worst first.
    simulated : bool
        The process runs on cyctx's simulated driver, not a GPU.
    """

    simulated: bool
    driver_library: str | None
    driver_version: int | None
    driver_error: str | None
    runtime: RuntimeInfo | None
    other_runtimes: list[RuntimeInfo]
    devices: list[DeviceInfo]
    thread_name: str
    thread_native_id: int
    context: ContextInfo | None
    guards: list[GuardInfo]
    findings: list[Finding]
    pid: int = field(default_factory=os.getpid)
    forked_from: int | None = None
    versions: dict[str, str | None] = field(default_factory=dict)

    @property
    def cuda_usable(self) -> bool:
        return not any(f.severity == "unavailable" for f in self.findings)

    @property
    def ok(self) -> bool:
        return not any(f.severity in ("error", "unavailable") for f in self.findings)

    @property
    def exit_status(self) -> int:
        """0 nothing wrong, 1 a problem was found, 3 no usable driver or GPU."""
        if any(f.severity == "error" for f in self.findings):
            return EXIT_PROBLEM
        return EXIT_OK if self.cuda_usable else EXIT_NO_CUDA

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-able data (schema ``cyctx.diagnosis/1``)."""
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
            "devices": [
                {
                    "ordinal": dev.ordinal,
                    "name": dev.name,
                    "compute_capability": (f"{dev.compute_capability[0]}.{dev.compute_capability[1]}"
                                           if dev.compute_capability else None),
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
        return json.dumps(self.to_dict(), indent=indent)

    def render(self, colour: bool = False, width: int = 88, cli: bool = False) -> str:
        """The human report; ANSI colour when ``colour`` is true. ``cli``: the report is of
        the doctor's own new process (says so where that explains what is seen)."""
        # render.py imports this module, so it is imported here, on call: at import time the
        # doctor's modules import one way (docs/design.md, "Layout, and who imports whom").
        from cyctx._doctor.render import render

        return render(self, colour, width, cli)

    def __str__(self) -> str:
        return self.render()
