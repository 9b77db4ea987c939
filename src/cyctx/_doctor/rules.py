"""The doctor's rules: each finding it can make is one small function over what was gathered
(:class:`~.gather.Seen`), and :data:`RULES` lists them in order, each with the code and the
severity of its finding; a rule's docstring says what it finds (docs/doctor.md's table of
findings is rendered from these).

A rule returns the finding's words (:class:`~.words.Said`) or None; :func:`findings_of` makes
the :class:`~.model.Finding` from the rule's code and severity and the words, so a rule cannot
report under another code than the table says.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cyctx._doctor import words
from cyctx._doctor.cu import NO_DEVICE, NOT_FOUND, NOT_SUPPORTED, STUB_LIBRARY, error_name
from cyctx._doctor.gather import Seen
from cyctx._doctor.model import (
    ContextInfo,
    DeviceInfo,
    Finding,
    GuardInfo,
    LoadedLibrary,
)
from cyctx._doctor.words import Said


@dataclass(frozen=True)
class Rule:
    """One finding the doctor can make, and when."""

    code: str
    # As Finding.severity (a type checker holds the two to each other where findings_of makes
    # the Finding; a module-level alias of them is what stubtest cannot read).
    severity: Literal["error", "warning", "info", "unavailable"]
    finds: Callable[..., Said | None]  # (seen), or with ``each`` (seen, item)
    # The items a rule looks at one by one (each guard, each device): None, the record whole.
    each: Callable[[Seen], Sequence[Any]] | None = None
    # What the running trace saw of it, a sentence or None; the same arguments as ``finds``.
    cite: Callable[..., str | None] | None = None


# --- how far the driver answered: each stage but "described" ends the report's driver part ---

_REFUSED = (STUB_LIBRARY, NOT_SUPPORTED, NOT_FOUND)  # each has a finding of its own


def _refused(s: Seen, code: int | None) -> Said | None:
    # The library cyctx's loader refused with ``code`` (None: with a CUresult of no rule's own).
    if s.stage != "library_unusable" or s.load_problem is None:
        return None
    got, why = s.load_problem
    mine = got == code if code is not None else got not in _REFUSED
    return words.unusable_library(got, why, s.report.driver_library) if mine else None


def driver_stub(s: Seen) -> Said | None:
    """The ``libcuda.so.1`` that loads is the CUDA toolkit's stub, not a driver."""
    return _refused(s, STUB_LIBRARY)


def driver_too_old(s: Seen) -> Said | None:
    """The ``libcuda.so.1`` that loads is older than CUDA 12.0 (no ``cuGetProcAddress_v2``)."""
    return _refused(s, NOT_SUPPORTED)


def driver_incomplete(s: Seen) -> Said | None:
    """The ``libcuda.so.1`` that loads lacks a function every driver of CUDA 12.0+ has."""
    return _refused(s, NOT_FOUND)


def driver_unusable(s: Seen) -> Said | None:
    """The ``libcuda.so.1`` that loads is refused for another reason (cyctx's own error's)."""
    return _refused(s, None)


def no_driver(s: Seen) -> Said | None:
    """No NVIDIA driver: ``libcuda.so.1`` cannot be loaded."""
    if s.stage != "no_driver":
        return None
    assert s.report.driver_error is not None  # what loading it raised
    return words.no_driver(s.report.driver_error)


def forked_child(s: Seen) -> Said | None:
    """A child forked after CUDA was used: nothing can run in it; use ``spawn``."""
    return words.fork(s.report.forked_from) if s.stage == "forked" else None


def no_device(s: Seen) -> Said | None:
    """The driver loads and sees no device."""
    return words.no_device() if s.stage == "init_failed" and s.init_error == NO_DEVICE else None


def init_failed(s: Seen) -> Said | None:
    """``cuInit`` failed with an error no other finding names."""
    if s.stage != "init_failed" or s.init_error is None or s.init_error == NO_DEVICE:
        return None
    return words.driver_error("cuInit", error_name(s.init_error))


# --- the calling thread's current context: at most one of these ------------------------------
# (the context is described only at stage "described")


def current_unknown(s: Seen) -> Said | None:
    """``cuCtxGetCurrent`` failed."""
    c = s.report.context
    return words.driver_error("cuCtxGetCurrent", c.error) if c and c.error else None


def no_current_context(s: Seen) -> Said | None:
    """This thread has no current context: normal for a new thread, and always so in the
    doctor's own process."""
    c = s.report.context
    if c is None or c.error or c.handle != 0:
        return None
    return words.no_current(s.report.guards)


def _current(s: Seen) -> ContextInfo | None:
    # The context current on the thread, when the driver named one.
    c = s.report.context
    return c if c is not None and not c.error and c.handle != 0 else None


def _inactive_primary(s: Seen, c: ContextInfo) -> bool:
    # An unusable current context is an inactive primary one when a guard holds it as such, or
    # when its device's primary context is inactive (then nothing tells a destroyed created
    # context from it); a created one when the primary is active.
    if c.primary is not None:
        return c.primary
    return c.device is not None and s.report.devices[c.device].primary_active is False


def inactive_primary_current(s: Seen) -> Said | None:
    """The current context is a primary context that is not active: the classic
    ``CUDA_ERROR_INVALID_CONTEXT``."""
    c = _current(s)
    if c is None or c.usable or not _inactive_primary(s, c):
        return None
    return words.inactive_primary(c)


def dead_current_context(s: Seen) -> Said | None:
    """The current context was destroyed (``cuCtxDestroy``, on another thread)."""
    c = _current(s)
    if c is None or c.usable or _inactive_primary(s, c):
        return None
    return words.dead_current(c)


def current_not_primary(s: Seen) -> Said | None:
    """The current context is live and is not its device's primary context (made by
    ``cuCtxCreate``), and no guard holds it."""
    # Live and told apart from the primary context without retaining it; a context the caller
    # gave a guard is theirs on purpose.
    c = _current(s)
    if c is None or not c.usable or c.primary is not False:
        return None
    if any(g.handle == c.handle for g in s.report.guards):
        return None
    return words.not_primary(c)


def made_current_by(s: Seen) -> str | None:
    """The trace's word on the current context: the call that made it current, and the one
    that destroyed it after."""
    c = s.report.context
    if s.trace is None or c is None:
        return None
    made = s.trace.made_current_by(s.events, s.report.thread_native_id, c.handle)
    if made is None:
        return None
    cite = f"The running trace saw it made current by {made.describe()}"
    gone = _destroyed(s.events[s.events.index(made) + 1 :], c.handle)
    return cite + (f", then destroyed: {gone[-1].describe()}." if gone else ".")


def _destroyed(events: list[Any], handle: int) -> list[Any]:
    return [
        e
        for e in events
        if e.call == "context destroy starting"
        and e.target is not None
        and e.target.handle == handle
    ]


# --- each live guard, each device -------------------------------------------------------------


def _guards(s: Seen) -> list[GuardInfo]:
    return s.report.guards


def context_reset(s: Seen, g: GuardInfo) -> Said | None:
    """A guard's primary context was reset since the guard last saw it."""
    return words.reset(g) if g.reset else None


def reset_by(s: Seen, g: GuardInfo) -> str | None:
    """The trace's word on a reset guard: the call that destroyed its context."""
    gone = _destroyed(s.events, g.handle) if s.trace is not None else []
    return f"The running trace saw it reset: {gone[-1].describe()}." if gone else None


def guard_context_destroyed(s: Seen, g: GuardInfo) -> Said | None:
    """The caller's context behind a guard (created or green) was destroyed."""
    return words.guard_context_destroyed(g) if g.destroyed else None


def _devices(s: Seen) -> list[DeviceInfo]:
    return s.report.devices


def primary_flags(s: Seen, dev: DeviceInfo) -> Said | None:
    """A primary context is active with flags other than the default ``SCHED_AUTO``."""
    return words.primary_flags(dev) if dev.primary_active and dev.primary_flags else None


# --- asked before a fork ----------------------------------------------------------------------


def cuda_initialised_before_fork(s: Seen) -> Said | None:
    """Asked with ``before_fork=True``: CUDA is initialised, so a forked child cannot
    use it; names the CUDA libraries loaded."""
    return words.fork_ahead(s.fork_libraries) if s.initialised is True else None


def fork_safe(s: Seen) -> Said | None:
    """Asked with ``before_fork=True`` where nothing initialised CUDA: a forked child can use it."""
    return words.fork_safe() if s.initialised is False else None


# --- the census: runtimes that do not fit the driver or each other ----------------------------


def _runtimes(s: Seen) -> list[LoadedLibrary]:
    # Those whose version is known: the others cannot be judged.
    return [lib for lib in s.report.loaded if lib.kind == "runtime" and lib.version]


def _own(s: Seen) -> list[tuple[LoadedLibrary, int]]:
    # The program's own, with their versions: a runtime the doctor's lookup loaded is no part
    # of the program's mix.
    return [(lib, lib.version or 0) for lib in _runtimes(s) if not lib.by_doctor]


def runtime_newer_than_driver(s: Seen, lib: LoadedLibrary) -> Said | None:
    """A loaded CUDA runtime of a newer major than the driver."""
    drv = s.report.driver_version
    if drv and (lib.version or 0) // 1000 > drv // 1000:
        return words.runtime_newer(lib, drv)
    return None


def runtime_majors_mixed(s: Seen) -> Said | None:
    """CUDA runtimes of different majors in one process, each with the distribution that
    brought it."""
    own = _own(s)
    if len({v // 1000 for _, v in own}) > 1:
        return words.mixed_majors([lib for lib, _ in own])
    return None


def cuda11_runtime_loaded(s: Seen) -> Said | None:
    """A CUDA runtime older than 12.0 is loaded: the classic failure's precondition."""
    old = [lib for lib, v in _own(s) if v < 12000]
    if not old:
        return None
    # The fix: the driver's major, or 12 (the first after the classic failure).
    return words.cuda11_loaded(old, max(12, (s.report.driver_version or 0) // 1000))


# --- the table --------------------------------------------------------------------------------

RULES: tuple[Rule, ...] = (
    # How far the driver answered.
    Rule("driver_stub", "unavailable", driver_stub),
    Rule("driver_too_old", "unavailable", driver_too_old),
    Rule("driver_incomplete", "unavailable", driver_incomplete),
    Rule("driver_unusable", "unavailable", driver_unusable),
    Rule("no_driver", "unavailable", no_driver),
    Rule("forked_child", "error", forked_child),
    Rule("no_device", "unavailable", no_device),
    Rule("driver_error", "error", init_failed),
    # The current context.
    Rule("driver_error", "error", current_unknown),
    # A note, not a warning: every new thread starts so, guards make their context current
    # when they need it, and the doctor's own process is always in this state.
    Rule("no_current_context", "info", no_current_context),
    Rule("inactive_primary_current", "error", inactive_primary_current, cite=made_current_by),
    Rule("dead_current_context", "error", dead_current_context, cite=made_current_by),
    Rule("current_not_primary", "warning", current_not_primary, cite=made_current_by),
    # Each guard, each device.
    Rule("context_reset", "error", context_reset, each=_guards, cite=reset_by),
    Rule("guard_context_destroyed", "error", guard_context_destroyed, each=_guards),
    Rule("primary_flags", "info", primary_flags, each=_devices),
    # Asked before a fork.
    Rule("cuda_initialised_before_fork", "warning", cuda_initialised_before_fork),
    Rule("fork_safe", "info", fork_safe),
    # The census.
    Rule("runtime_newer_than_driver", "error", runtime_newer_than_driver, each=_runtimes),
    Rule("runtime_majors_mixed", "warning", runtime_majors_mixed),
    Rule("cuda11_runtime_loaded", "warning", cuda11_runtime_loaded),
)


def findings_of(seen: Seen, rules: Sequence[Rule] = RULES) -> list[Finding]:
    """The findings ``rules`` make of ``seen``, in the table's order. Neighbouring rules over
    the same items run item by item, so that a guard's findings keep the guards' order."""
    out = []
    for each, group in itertools.groupby(rules, key=lambda rule: rule.each):
        same = list(group)
        for args in [(seen,)] if each is None else [(seen, item) for item in each(seen)]:
            for rule in same:
                said = rule.finds(*args)
                if said is None:
                    continue
                cite = rule.cite(*args) if rule.cite is not None else None
                out.append(
                    Finding(
                        rule.code,
                        rule.severity,
                        said.title,
                        f"{said.explanation} {cite}" if cite else said.explanation,
                        said.fix,
                    )
                )
    return out
