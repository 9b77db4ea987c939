"""The doctor's words on screen: the human report, and the styling (colour, wrapping, the
simulated label) that the demo shares.

:func:`render` prints a :class:`~.report.Diagnosis`, annotated with the record it is made of
(:class:`~.model.DiagnosisRecord`): it imports only :mod:`.model`, and :mod:`.report` imports it
for ``Diagnosis.render()``. What render reads is checked against the record's own fields, not
against a copy of them that could drift.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from typing import Any

from cyctx._doctor.model import (
    EXIT_NO_CUDA,
    EXIT_PROBLEM,
    DiagnosisRecord,
    version_str,
)


class Style:
    """ANSI styles, or nothing."""

    _CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}

    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def __getattr__(self, name: str) -> Callable[[str], str]:
        code = self._CODES[name]
        return (lambda s: f"\x1b[{code}m{s}\x1b[0m") if self.colour else (lambda s: s)


def use_colour(stream: Any) -> bool:
    """Colour only on a terminal, and never with NO_COLOR set (https://no-color.org)."""
    isatty = getattr(stream, "isatty", None)
    return (
        bool(isatty and isatty())
        and not os.environ.get("NO_COLOR")
        and os.environ.get("TERM") != "dumb"
    )


SIM_TAG = "[SIMULATED]"


def sim_banner(path: str | None, extra: str = "") -> str:
    return (
        f"SIMULATED: every driver call here goes to cyctx's simulated driver ({path}), "
        f"not to a GPU.{extra} Nothing below describes real hardware."
    )


def wrap(text: str, indent: str, width: int) -> str:
    return textwrap.fill(
        text,
        width=width,
        initial_indent=indent,
        subsequent_indent=indent,
        break_on_hyphens=False,
        break_long_words=False,
    )


_FLAG_NAMES = {
    1: "SCHED_SPIN",
    2: "SCHED_YIELD",
    4: "SCHED_BLOCKING_SYNC",
    8: "MAP_HOST",
    0x10: "LMEM_RESIZE_TO_MAX",
    0x20: "COREDUMP_ENABLE",
    0x40: "USER_COREDUMP_ENABLE",
    0x80: "SYNC_MEMOPS",
}


def flags_str(flags: int) -> str:
    names = [n for bit, n in _FLAG_NAMES.items() if flags & bit]
    return f"0x{flags:x} ({'|'.join(names) if names else 'SCHED_AUTO'})"


def render(r: DiagnosisRecord, colour: bool = False, width: int = 88, cli: bool = False) -> str:
    """The human report of ``r`` (:meth:`Diagnosis.render <cyctx.doctor.Diagnosis.render>`)."""
    s = Style(colour)
    tag = f"  {SIM_TAG}" if r.simulated else ""
    out: list[str] = []

    def head(title: str) -> None:
        out.append("")
        out.append(s.bold(title) + (s.yellow(tag) if tag else ""))

    def kv(key: str, value: str) -> None:
        out.append(f"  {key:<18}{value}")

    out.append(
        s.bold("cyctx doctor: CUDA driver, runtime and context report")
        + (s.yellow(tag) if tag else "")
    )
    if r.simulated:
        out.append(s.yellow(wrap(sim_banner(r.driver_library), "", width)))

    head("Versions")
    if r.driver_version is not None:
        kv(
            "driver",
            f"CUDA {version_str(r.driver_version)} ({r.driver_version})  {r.driver_library or ''}".rstrip(),
        )
    elif any(f.code == "bindings_unusable" for f in r.findings):
        kv("driver", s.red("not queried: cuda-bindings is not usable (see Findings)"))
    else:
        kv("driver", s.red("none: libcuda.so.1 cannot be loaded (see Findings)"))
    if r.simulated:
        kv(
            "runtime",
            "not queried: a real libcudart cannot run on the simulated driver "
            "(--demo uses a stand-in)",
        )
    elif r.runtime is None:
        kv("runtime", "not queried")
    elif not r.runtime.library:
        kv("runtime", f"none loadable: {r.runtime.note}")
    else:
        rt = r.runtime
        ver = (
            f"CUDA {version_str(rt.version)} ({rt.version}, from {rt.version_from})"
            if rt.version
            else "version unknown"
        )
        kv("runtime", f"{ver}  {rt.library}  [{rt.source}]")
    for o in r.other_runtimes:
        kv("also found", f"CUDA {version_str(o.version) or '?'} runtime  {o.library}  [{o.source}]")
    v = r.versions
    frameworks = "".join(
        f", {name} {ver}"
        for name, ver in v.items()
        if name not in ("cyctx", "cuda-bindings", "python")
    )
    kv(
        "packages",
        f"cyctx {v.get('cyctx')}, cuda-bindings {v.get('cuda-bindings')}{frameworks}, "
        f"Python {v.get('python')}",
    )
    kv("process", f"pid {r.pid}" + (f", forked from pid {r.forked_from}" if r.forked_from else ""))

    head("Loaded")
    if cli:
        out.append(
            s.dim(
                wrap(
                    "(the doctor's own process: what a fresh Python process loads. To see your "
                    "program's libraries, call cyctx.diagnose() in it.)",
                    "  ",
                    width,
                )
            )
        )
    if not r.loaded:
        out.append("  no CUDA library")
    for lib in r.loaded:
        ver = f"CUDA {version_str(lib.version)}" if lib.version else ""
        newer = (
            lib.kind == "runtime"
            and lib.version
            and r.driver_version
            and lib.version > r.driver_version
        )
        notes = [
            lib.distribution
            or ("its distribution is not known now" if lib.file != "same" else "")
            or "no Python distribution"
        ]
        if lib.by_doctor and not cli:
            notes.append("loaded by the doctor")
        if (
            newer
            and lib.version
            and r.driver_version
            and lib.version // 1000 == r.driver_version // 1000
        ):
            notes.append("newer minor than the driver: minor version compatibility")
        if lib.note:
            notes.append(lib.note)
        if lib.file != "same":
            notes.append(f"{lib.file} since it was loaded: {lib.on_disk}")
        where = f"{lib.name}  {lib.path}" if lib.static else lib.path
        # Two spaces at least between columns, whatever a column's width.
        out.append(f"  {lib.kind:<9}  {ver:<9}  {where}  [{'; '.join(notes)}]")

    if r.driver_error is None:  # cuInit succeeded: there is a machine to describe
        head(f"Devices ({len(r.devices)})")
        for dev in r.devices:
            if dev.error and dev.name is None:
                out.append(f"  {dev.ordinal}  {s.red(dev.error)}")
                continue
            cc = (
                f"cc {dev.compute_capability[0]}.{dev.compute_capability[1]}"
                if dev.compute_capability
                else "cc ?"
            )
            mem = f"{dev.total_memory / 2**30:.0f} GiB" if dev.total_memory else "? GiB"
            if dev.primary_active is None or dev.primary_flags is None:  # set together
                prim = s.red(dev.error or "?")
            else:
                prim = (
                    s.green("active") if dev.primary_active else "inactive"
                ) + f", flags {flags_str(dev.primary_flags)}"
            out.append(f"  {dev.ordinal}  {dev.name}  {cc}  {dev.pci_bus_id}  {mem}")
            out.append(f"     primary context: {prim}")

        head(f"This thread: {r.thread_name} (native id {r.thread_native_id})")
        c = r.context
        if c is None or c.error:
            kv("current context", s.red(f"cuCtxGetCurrent failed: {c.error if c else '?'}"))
        elif c.handle == 0:
            kv("current context", "none (cuCtxGetCurrent returned NULL)")
            if cli:
                out.append(
                    s.dim(
                        wrap(
                            "(expected here: the doctor runs in a new process. To see your program's "
                            "threads, call cyctx.diagnose() in it and print the result.)",
                            "  ",
                            width,
                        )
                    )
                )
        else:
            kv("current context", f"0x{c.handle:x}")
            kv("  id", str(c.id) if c.id is not None else s.red(f"none: {c.id_error}"))
            kv("  device", str(c.device) if c.device is not None else "?")
            prim = {True: "yes", False: "no", None: "unknown"}[c.primary]
            kv("  primary", f"{prim} ({c.primary_why})")
            kv(
                "  usable",
                s.green(f"yes (cuCtxGetApiVersion: {c.api_version})")
                if c.usable
                else s.red(f"NO: {c.why}"),
            )
        if r.simulated:
            kv("runtime device", "not queried (simulated driver)")
        elif r.runtime and r.runtime.current_device is not None:
            kv("runtime device", f"{r.runtime.current_device} (cudaGetDevice)")
        elif r.runtime:
            kv("runtime device", f"unknown: {r.runtime.note}")

        head("ContextGuards alive in this process")
        if not r.guards:
            out.append("  none")
        for g in r.guards:
            now = str(g.driver_id) if g.driver_id is not None else g.driver_id_error
            state = (
                s.red("RESET since last seen")
                if g.reset
                else s.red("DESTROYED by its owner")
                if g.destroyed
                else s.green("unchanged")
            )
            kind = "" if g.primary else " (caller's context)"
            out.append(
                f"  device {g.device}{' (shared)' if g.shared else ''}{kind}  handle 0x{g.handle:x}  "
                f"id seen {g.seen_id}, now {now}: {state}"
            )

    head("Findings")
    if not r.findings:
        out.append("  " + s.green("nothing wrong"))
    for f in r.findings:
        label = {
            "error": s.red("ERROR"),
            "warning": s.yellow("WARNING"),
            "info": s.cyan("NOTE"),
            "unavailable": s.red("NO CUDA"),
        }.get(f.severity, f.severity.upper())
        out.append(f"  {label}  {s.bold(f.title)}")
        out.append(wrap(f.explanation, "      ", width))
        out.append(wrap("Fix: " + f.fix, "      ", width))

    status = r.exit_status
    errors = sum(f.severity == "error" for f in r.findings)
    warnings = sum(f.severity == "warning" for f in r.findings)
    if status == EXIT_NO_CUDA:
        verdict = s.red("CUDA is not usable here")
    elif status == EXIT_PROBLEM:
        verdict = s.red(f"PROBLEMS FOUND: {errors} error{'s' if errors > 1 else ''}")
    else:
        verdict = s.green("OK") + (
            f", {warnings} warning{'s' if warnings > 1 else ''}" if warnings else ""
        )
    out.append("")
    out.append(
        s.bold("Result") + (s.yellow(tag) if tag else "") + f": {verdict} (exit status {status})"
    )
    return "\n".join(out)
