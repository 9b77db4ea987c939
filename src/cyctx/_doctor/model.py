"""The records a report holds: plain data classes, and the exit statuses.

No driver access, and no other module of the doctor: :mod:`.probe` and :mod:`.runtime` fill
these records, :mod:`.rules` judges them, :mod:`.render` prints them, and
:class:`~.report.Diagnosis` holds them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from _cyctx_libcuda import same_context

# One entry of the census and its test of a version are the census's; the doctor's modules
# read them with the other records.
from cyctx._census import LoadedLibrary as LoadedLibrary
from cyctx._census import plausible_version as plausible_version

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

    Attributes
    ----------
    code : str
        A stable name of the finding, e.g. ``"inactive-primary-current"``.
    severity : str
        ``"error"``, ``"warning"``, ``"info"`` or ``"unavailable"``.
    title : str
        One line: what was found.
    explanation : str
        Why it matters.
    fix : str
        What to do.
    """

    code: str
    severity: Literal["error", "warning", "info", "unavailable"]
    title: str
    explanation: str
    fix: str


@dataclass
class RuntimeInfo:
    """A ``libcudart``: where it is and what it says.

    Attributes
    ----------
    library : str
        Its path.
    source : str
        How it was found.
    version : int or None
        ``cudaRuntimeGetVersion``, e.g. 11080 for 11.8.
    version_from : str or None
        Where the version came from: the call, or the wheel the library came with.
    current_device : int or None
        ``cudaGetDevice`` on the calling thread (it creates no context).
    note : str or None
        Why ``current_device`` is missing, or why the library could not be loaded.
    """

    library: str
    source: str  # how it was found
    version: int | None = None  # cudaRuntimeGetVersion, e.g. 11080
    version_from: str | None = None  # "cudaRuntimeGetVersion" or the wheel it came with
    current_device: int | None = None  # cudaGetDevice on the calling thread
    note: str | None = None  # why current_device is missing, or a load error


@dataclass
class DeviceInfo:
    """One GPU, as the driver describes it.

    Attributes
    ----------
    ordinal : int
        Its device ordinal.
    name, pci_bus_id : str or None
        ``cuDeviceGetName``, ``cuDeviceGetPCIBusId``.
    compute_capability : tuple of int or None
        (major, minor).
    total_memory : int or None
        Bytes.
    primary_active, primary_flags : bool, int or None
        ``cuDevicePrimaryCtxGetState``: whether its primary context is active, and its flags.
    error : str or None
        Why the rest is missing.
    """

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
    """The calling thread's current context (``handle`` 0: none).

    Attributes
    ----------
    handle : int
        ``cuCtxGetCurrent``; 0 when no context is current.
    id, id_error : int or None, str or None
        ``cuCtxGetId``, or why it failed (a dead context answers 709).
    device : int or None
        ``cuCtxGetDevice``.
    primary, primary_why : bool or None, str or None
        Whether it is its device's primary context (None: cannot be told without retaining
        it), and why not known.
    usable, why : bool or None, str or None
        Whether driver calls on it succeed, and why not.
    api_version : int or None
        ``cuCtxGetApiVersion``.
    error : str or None
        ``cuCtxGetCurrent`` failed.
    """

    handle: int
    id: int | None = None
    id_error: str | None = None
    device: int | None = None
    primary: bool | None = None  # None: cannot be told without retaining it
    primary_why: str | None = None
    usable: bool | None = None
    flags: int | None = None  # cuCtxGetFlags
    api_version: int | None = None
    why: str | None = None  # why it is not usable
    error: str | None = None  # cuCtxGetCurrent failed


@dataclass
class GuardInfo:
    """A live :class:`cyctx.ContextGuard` and what the driver says about its context now.

    Attributes
    ----------
    device : int
        The guard's device.
    handle : int
        Its context's handle.
    seen_id : int
        The context id the guard last saw (at construction or its last enter).
    driver_id, driver_id_error : int or None, str or None
        The id the driver gives now, or why it gives none.
    shared : bool
        The guard is ``ContextGuard.shared(k)``.
    primary : bool
        The guard retains a primary context (else the caller owns the context).
    """

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
        return self.primary and not self._same()

    @property
    def destroyed(self) -> bool:
        """The caller's context (cuCtxCreate, green) behind a guard was destroyed."""
        return not self.primary and not self._same()

    def _same(self) -> bool:
        # The guard's handle with the id it saw, against the id the driver gives it now.
        return same_context((self.handle, self.seen_id), (self.handle, self.driver_id))


@dataclass
class DiagnosisRecord:
    """The whole of what the doctor saw, as data (:class:`~.report.Diagnosis` adds its JSON and
    human forms): what :func:`~.render.render` reads, so that it need not know the report."""

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
    loaded: list[LoadedLibrary] = field(default_factory=list)

    @property
    def cuda_usable(self) -> bool:
        """A driver and a device are usable."""
        return not any(f.severity == "unavailable" for f in self.findings)

    @property
    def ok(self) -> bool:
        """No finding is an error and CUDA is usable."""
        return not any(f.severity in ("error", "unavailable") for f in self.findings)

    @property
    def exit_status(self) -> int:
        """0 nothing wrong, 1 a problem was found, 3 no usable driver or GPU."""
        if any(f.severity == "error" for f in self.findings):
            return EXIT_PROBLEM
        return EXIT_OK if self.cuda_usable else EXIT_NO_CUDA
