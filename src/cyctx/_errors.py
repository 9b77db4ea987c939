"""Typed errors of cyctx, and their words.

Every driver failure becomes a :class:`DriverError` (or a subclass a user would catch)
carrying the ``CUresult`` as ``.code`` and its name as ``.name``, with a message that says
what happened and what to do. Misuse of a guard is a :class:`GuardError`.

Pure Python on purpose: the native state (the driver table, the fork flags) has one owner,
the ``_guard`` extension module, which imports this module and raises its classes. Two things
only the native side can know reach this module through one hook, :func:`connect_native`,
which ``_guard`` calls once as it loads: how the driver names a code, and whether this process
is a forked child. Until then, and with no driver, the names come from
:func:`fallback_name_and_string`.
"""

import sys

# The CUresult codes cyctx names (cuda.h), as plain ints: this module imports no bindings.
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_DEINITIALIZED = 4
CUDA_ERROR_STUB_LIBRARY = 34
CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER = 36
CUDA_ERROR_DEVICE_UNAVAILABLE = 46
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_CONTEXT_IS_DESTROYED = 709
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803
CUDA_ERROR_UNKNOWN = 999


class CyctxError(Exception):
    """Base class of every error cyctx raises on purpose."""


class GuardError(CyctxError):
    """A guard was misused: exit without enter, exit on another thread or out of order,
    use after close, closing a guard that is entered."""


class ForkError(CyctxError):
    """CUDA was used in the parent of this forked process; CUDA cannot be used in the child."""


class ContextResetWarning(RuntimeWarning):
    """A guard found its primary context reset (``cudaDeviceReset``/``cuDevicePrimaryCtxReset``)
    since it last looked, and re-activated it. Memory allocated before the reset is gone.

    Make it an error to have guards refuse instead:
    ``warnings.simplefilter("error", cyctx.ContextResetWarning)``.
    """


class ForkWarning(RuntimeWarning):
    """A process in which CUDA is initialised forks (warned in the parent, once
    :func:`cyctx.warn_on_fork` is called): the child cannot use CUDA. The message names the
    CUDA libraries loaded and the fix, the 'spawn' start method.

    Make it an error to see the traceback of the fork:
    ``warnings.simplefilter("error", cyctx.ForkWarning)`` (Python reports an error in a fork
    hook as unraisable; the fork goes on).
    """


class DriverError(CyctxError):
    """A CUDA driver call failed.

    Attributes
    ----------
    code : int
        The ``CUresult`` value, e.g. 201.
    name : str
        Its name, e.g. ``"CUDA_ERROR_INVALID_CONTEXT"``.
    call : str or None
        The driver function that returned it.
    detail : str or None
        What cyctx knows of the failure beyond the code (replaces the generic hint).
    """

    def __init__(self, code, call=None, detail=None):
        self.code = int(code)
        self.name, description = _describe(self.code)
        self.call = call
        self.detail = detail
        if call == LOAD_CALL and detail:
            # cyctx's own code for a driver it could not load: the driver's description of
            # that code ("no CUDA-capable device is detected") would say something else.
            super().__init__(f"{call} failed ({self.name}, {self.code}): {detail}")
            return
        where = f"{call} failed: " if call else ""
        msg = f"{where}{self.name} ({self.code}): {description}"
        hint = detail or _hint(self.code)
        if hint:
            msg += f". {hint}"
        super().__init__(msg)

    def __reduce__(self):
        # The constructor's arguments, so that an error sent across processes (multiprocessing,
        # concurrent.futures) keeps its advice.
        return (type(self), (self.code, self.call, self.detail))


class InvalidContextError(DriverError):
    """CUDA_ERROR_INVALID_CONTEXT (201): the context is not usable on this thread."""


class ContextDestroyedError(InvalidContextError):
    """CUDA_ERROR_CONTEXT_IS_DESTROYED (709): the context was destroyed or reset."""


class NotInitializedError(DriverError):
    """CUDA_ERROR_NOT_INITIALIZED (3) or DEINITIALIZED (4)."""


class NoDeviceError(DriverError):
    """CUDA_ERROR_NO_DEVICE (100)."""


class InvalidDeviceError(DriverError, ValueError):
    """CUDA_ERROR_INVALID_DEVICE (101): the ordinal names no device. Also a ValueError."""


# Tables keyed by CUresult, written by name (the numbers are in the class docstrings above).
_HINTS = {
    CUDA_ERROR_INVALID_VALUE: "An argument was out of range for the driver",
    CUDA_ERROR_NOT_INITIALIZED: "The driver is not initialised in this process: call cuInit(0) first",
    CUDA_ERROR_DEINITIALIZED: "The driver is shutting down (interpreter exit?); no CUDA work can run now",
    CUDA_ERROR_STUB_LIBRARY: (
        "The libcuda.so.1 that was loaded is the toolkit's stub, not the driver: "
        "remove the stubs directory from LD_LIBRARY_PATH"
    ),
    CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER: (
        "The installed NVIDIA driver is older than this call needs: upgrade the driver"
    ),
    CUDA_ERROR_DEVICE_UNAVAILABLE: "The device is in use by another process or in exclusive/prohibited compute mode",
    CUDA_ERROR_NO_DEVICE: "No CUDA-capable device is visible: check the driver, CUDA_VISIBLE_DEVICES and nvidia-smi",
    CUDA_ERROR_INVALID_DEVICE: "The device ordinal does not exist: check cuDeviceGetCount and CUDA_VISIBLE_DEVICES",
    CUDA_ERROR_INVALID_CONTEXT: (
        "The context is not usable: it was destroyed, or it is a primary context that is "
        "inactive (never retained, released to zero, or reset by cudaDeviceReset). A "
        "cyctx.ContextGuard retains and activates it; `cyctx doctor` explains "
        "this thread's state"
    ),
    CUDA_ERROR_CONTEXT_IS_DESTROYED: (
        "The context was destroyed (cuCtxDestroy, or its primary context was reset or "
        "released to zero) while this handle was still in use. Retain it again, e.g. with a "
        "new cyctx.ContextGuard"
    ),
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: (
        "The driver and kernel module versions do not match: reboot or reinstall the driver"
    ),
    CUDA_ERROR_UNKNOWN: "The driver reported an unknown error; the GPU may need attention (nvidia-smi)",
}

# Fork is named only in a process that was forked: elsewhere it would send the reader after a
# cause that cannot be theirs.
_FORKED_HINTS = {
    CUDA_ERROR_NOT_INITIALIZED: (
        "The driver is not initialised in this process, which is a forked child: if its "
        "parent used CUDA, CUDA cannot be used here. Start workers with the 'spawn' "
        "multiprocessing start method"
    ),
}


def _hint(code):
    if _forked() and code in _FORKED_HINTS:
        return _FORKED_HINTS[code]
    return _HINTS.get(code)


_CLASSES = {
    CUDA_ERROR_NOT_INITIALIZED: NotInitializedError,
    CUDA_ERROR_DEINITIALIZED: NotInitializedError,
    CUDA_ERROR_NO_DEVICE: NoDeviceError,
    CUDA_ERROR_INVALID_DEVICE: InvalidDeviceError,
    CUDA_ERROR_INVALID_CONTEXT: InvalidContextError,
    CUDA_ERROR_CONTEXT_IS_DESTROYED: ContextDestroyedError,
}


# The codes cyctx itself reports when loading the driver fails (driver_load in _cpp/driver.h),
# named and described as the driver does: no driver could be loaded to ask.
_FALLBACK = {
    CUDA_ERROR_OUT_OF_MEMORY: ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
    CUDA_ERROR_STUB_LIBRARY: ("CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"),
    CUDA_ERROR_NO_DEVICE: ("CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"),
    CUDA_ERROR_NOT_FOUND: ("CUDA_ERROR_NOT_FOUND", "named symbol not found"),
    CUDA_ERROR_NOT_SUPPORTED: ("CUDA_ERROR_NOT_SUPPORTED", "operation not supported"),
}


def fallback_name_and_string(code):
    """(name, description) of a CUresult without asking a driver."""
    return _FALLBACK.get(
        int(code), (f"CUresult({int(code)})", "no CUDA driver could be loaded to describe it")
    )


def driver_error(code, call=None, detail=None):
    """The DriverError subclass instance for ``code``."""
    return _CLASSES.get(int(code), DriverError)(code, call, detail)


LOAD_CALL = "loading the CUDA driver"


def load_error(code, problem):
    """The error of a failed load of the driver (driver_load in _cpp/driver.h): `problem` is
    its reason, `code` the CUresult it chose; two sentences, what happened and what to do."""
    if code == CUDA_ERROR_NO_DEVICE:
        detail = (
            f"libcuda.so.1, the NVIDIA driver's library, is missing or cannot be loaded "
            f"({problem}). Install the NVIDIA driver; without a GPU, use cyctx's simulated "
            f"driver (cyctx.testing.use_simulated_driver, or `cyctx doctor --simulate`)."
        )
    else:
        detail = f"{problem}. {load_fix(code)}."
    return driver_error(code, LOAD_CALL, detail)


def load_fix(code):
    """What to do about a failure to load the driver with `code` (driver_load's codes): the
    same words for a guard's error and for the doctor's finding (no library at all,
    CUDA_ERROR_NO_DEVICE, has its words in load_error and the doctor's no_driver finding)."""
    if code == CUDA_ERROR_STUB_LIBRARY:
        return (
            "Remove the toolkit's stubs directory (e.g. /usr/local/cuda/lib64/stubs) from "
            "LD_LIBRARY_PATH so that the NVIDIA driver's libcuda.so.1 is found"
        )
    if code == CUDA_ERROR_NOT_SUPPORTED:
        return "The NVIDIA driver is too old for cyctx: install a driver of CUDA 12.0 or newer"
    if code == CUDA_ERROR_NOT_FOUND:
        # It has cuGetProcAddress_v2 (CUDA 12.0+), and every driver of 12.0+ provides each
        # function cyctx resolves: not an old driver, not a driver at all.
        return (
            "The libcuda.so.1 that loaded is not a complete NVIDIA driver: every driver of "
            "CUDA 12.0 or newer provides this function. Check which libcuda.so.1 is found "
            "first (LD_LIBRARY_PATH, LD_PRELOAD, `ldconfig -p | grep libcuda`) and reinstall "
            "the NVIDIA driver"
        )
    if code == CUDA_ERROR_OUT_OF_MEMORY:
        return "The process ran out of memory while loading the driver"
    return "Check the NVIDIA driver installation (`nvidia-smi`)"


# --- the words of the guard's errors ------------------------------------------------------
# Built here, raised by the _guard module: each says what happened, what state it left, and
# what to do. `guard` is the guard's repr.


def _entries(n):
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def _dropped_note(dropped):
    # A clause, not a sentence: the messages it joins stay at two sentences.
    if not dropped:
        return ""
    return (
        f" (after dropping {_entries(dropped)} of guards freed while entered from the top of "
        f"this thread's entries)"
    )


def closed(guard):
    return GuardError(f"{guard} is closed: its retain was released; create a new guard")


def close_refused(guard, why):
    return GuardError(
        {
            "shared": f"{guard} is shared by the whole process and is never closed",
            "inside": f"{guard}: close() inside a with-block of the same guard on this thread; "
            f"leave the block first",
            "busy": f"{guard}: close() while another thread is entering the guard or re-activating "
            f"its context after a reset; nothing was released. Close it when no thread uses it.",
            "closing": f"{guard}: close() while another thread is closing it; nothing was done",
        }[why]
    )


def exit_misuse(
    guard, entered_here, same_guard_on_top, top, dropped, removed=False, generator=False
):
    """An exit whose entry is not the innermost on this thread, or that has none here.

    `removed`: the entry was taken out from under the open block (a Python exit, never called
    again for its block); else nothing was changed (the nogil exit(), which its caller can call
    again). `generator`: the exit is a generator's or coroutine's, closed or collected, or a
    greenlet's, killed or collected. Two sentences: what happened (and what state it left),
    and what to do."""
    also = _dropped_note(dropped)
    if not entered_here:
        return GuardError(
            f"{guard}: exit without a matching enter on this thread{also}. Entries are per "
            f"thread: leave a guard on the thread that entered it, once per enter."
        )
    who = (
        "another block of this same guard" if same_guard_on_top else f"another guard (guard #{top})"
    )
    what = (
        "a generator, coroutine or greenlet holding this guard was closed, killed or collected "
        "out of order"
        if generator
        else "exit out of order"
    )
    if removed:
        return GuardError(
            f"{guard}: {what}: {who} was entered after this block on this thread and is still "
            f"open{also}. Its entry was removed and the current context left to the open block, "
            f"whose exit restores what was current before this one; leave blocks in reverse "
            f"order of entry (a generator or coroutine holding a guard across yield/await, or "
            f"two tasks sharing one guard, breaks that)."
        )
    return GuardError(
        f"{guard}: {what}: {who} was entered after this block on this thread and is still "
        f"open{also}. Nothing was changed: leave the blocks entered after this one, then exit "
        f"again."
    )


def exit_ambiguous(guard, where, blocks, plain=False):
    """An exit that several open blocks of the guard on this thread could own, none provably.

    `blocks`: what is known of each open entry, innermost first (bits of _protocol/blocks.h's
    block_describe: 1 same strand, 2 inside a generator or coroutine not running now, 4 entered
    by `with` itself, 8 by the nogil enter()). `plain`: the build reads no task or greenlet
    identity (public CPython API only)."""

    def said(what):
        if what & 8:
            return "entered by Cython's nogil enter()"
        parts = []
        if not plain:
            parts.append(
                "in this task or greenlet" if what & 1 else "in another task, greenlet or context"
            )
        if what & 2:
            parts.append("inside a generator or coroutine that is not running now")
        parts.append("by `with` on the guard" if what & 4 else "through a wrapper")
        return " ".join(parts)

    listed = "; ".join(f"#{n} {said(w)}" for n, w in enumerate(blocks, 1))
    why = (
        " This build of cyctx (public CPython API only) tells no task, greenlet or generator from another."
        if plain
        else ""
    )
    return GuardError(
        f"{guard}: cannot tell which of its {len(blocks)} open blocks on this thread the exit at "
        f"{where} leaves ({listed}), so nothing was changed.{why} Leave it with `with guard:` "
        f"itself or `with cyctx.device(k):`, which identify their block, or give each task its "
        f"own guard."
    )


def dropped_text(guard, dropped):
    return (
        f"cyctx: leaving {guard} dropped {dropped} open entr{'y' if dropped == 1 else 'ies'} "
        f"of a ContextGuard freed while entered on this thread (entered, never left, then "
        f"garbage); what was current before {guard}'s enter is restored. Leave every guard "
        f"you enter."
    )


def leaked_pushes(n, still):
    if still == 0:
        return GuardError(
            f"code inside the guard pushed {n} context(s) with cuCtxPushCurrent and did not pop "
            f"them; the thread had no current context before the guard, so they were popped to "
            f"restore that. Balance every push with a pop inside the block."
        )
    # The cap: say what was done and what is left, not that the stack was restored.
    return GuardError(
        f"code inside the guard pushed more than {n} context(s) with cuCtxPushCurrent and did "
        f"not pop them; cyctx popped {n} and stopped there (its cap). The thread still has "
        f"context 0x{still:x} current and more beneath it: its context stack is NOT restored to "
        f"the empty stack it had before the guard. Pop the rest with cuCtxPopCurrent, and "
        f"balance every push with a pop inside the block."
    )


def prev_died(prev, err, switched, cur, popped=True):
    """`cur`: the context current now (0: none; None: it could not be read); `popped`: the
    switch's place was popped (False: the pop failed twice)."""
    how = (
        "its id changed: it was reset, or its handle now holds another context"
        if err == 0
        else "cuCtxGetId: CUDA_ERROR_CONTEXT_IS_DESTROYED (709)"
        if err == 709
        else "cuCtxGetId: CUDA_ERROR_INVALID_CONTEXT (201), the driver no longer knows it"
    )
    now = _now(cur)
    if not switched:
        undone = "cyctx left the stack as the block left it"
    elif popped:
        undone = (
            "cyctx popped its own switch, as cuCtxDestroy pops a destroyed context that is current"
        )
    else:
        undone = (
            "cyctx could not pop its own switch (cuCtxPopCurrent failed twice), so the block's "
            "context is still in its place: pop it with cuCtxPopCurrent"
        )
    return driver_error(
        CUDA_ERROR_CONTEXT_IS_DESTROYED,
        "cuCtxGetId",
        f"The context that was current before the block (0x{prev:x}) did not survive it ({how}), "
        f"so it was not made current again: {undone}; {now}. Do not destroy or reset a context "
        f"that an enclosing block returns to.",
    )


def _now(cur):
    if cur is None:
        return "what is current on this thread could not be read (cuCtxGetCurrent failed)"
    return f"context 0x{cur:x} is current on this thread" if cur else "no context is current"


def exit_retried(err, call, twice=False):
    """Leaving a block, `call` failed with `err` once and succeeded when made again (`twice`: a
    read of the current context failed twice, and cyctx made the context current before the
    block current again regardless): the thread is as the block's enter found it."""
    done = (
        "it failed twice, and cyctx made the context that was current before the block current "
        "again all the same"
        if twice
        else "it failed once and succeeded when cyctx made it again: what was current before "
        "the block is current again"
    )
    return driver_error(
        err,
        call,
        f"Leaving the block, {done}. If it recurs, the driver or the GPU needs attention "
        f"(nvidia-smi)",
    )


def exit_stuck(err, call, cur, before, why):
    """Leaving a block, `call` failed twice (the second time with `err`), so what was current
    before the block (`before`, 0: none) is not current again. `cur`: the context current now
    (0: none; None: it could not be read). `why`: what could not be done."""
    was = f"context 0x{before:x}" if before else "no context"
    now = _now(cur)
    if why == "set":
        what = f"could not make {was} current again"
        todo = f"Make it current yourself (cuCtxSetCurrent(0x{before:x}))"
    elif why == "unchecked":
        what = (
            f"could not tell whether {was}, current before the block, survived it, so it was not "
            f"handed back to the driver (a destroyed context can crash it)"
        )
        todo = f"If it is alive, make it current yourself (cuCtxSetCurrent(0x{before:x}))"
    elif why == "pop":
        what = "could not pop the context it pushed onto the empty stack"
        todo = "Pop it yourself (cuCtxPopCurrent)"
    else:
        what = (
            "could not read which context is current, so it changed nothing more "
            f"({was} was current before the block)"
        )
        todo = "Check with cuCtxGetCurrent and restore it yourself"
    return driver_error(
        err,
        call,
        f"Leaving the block, cyctx {what} ({call} failed twice): {now}. {todo}, or end this "
        f"thread: code that runs next on it would run in that context",
    )


def forked(pid):
    return ForkError(
        f"CUDA was initialised in a parent of this forked process (pid {pid}); a "
        f"forked child cannot use CUDA: every driver call fails with "
        f"CUDA_ERROR_NOT_INITIALIZED. Start worker processes with the 'spawn' start method: "
        f"multiprocessing.get_context('spawn') or multiprocessing.set_start_method('spawn')."
    )


def reset_text(ordinal, guard, reactivated_elsewhere, refused=False):
    """The ContextResetWarning's words; `refused`: the warning was an error (the documented
    refuse mode), so the guard left the context as it found it."""
    what = (
        f"device {ordinal}'s primary context was reset (cudaDeviceReset or "
        f"cuDevicePrimaryCtxReset) since {guard} last entered it"
    )
    if refused:
        return (
            f"{what}, and memory and modules created in it before are gone. With "
            f"ContextResetWarning an error the guard refused to re-activate it and changed "
            f"nothing: rebuild what you need, then enter with the warning allowed."
        )
    how = (
        "someone re-activated it since"
        if reactivated_elsewhere
        else "it is inactive; cyctx re-activates it (refcount unchanged)"
    )
    return f"{what}; {how}. Memory and modules created in it before the reset are gone."


def destroyed_by_owner(guard):
    return driver_error(
        CUDA_ERROR_CONTEXT_IS_DESTROYED,
        "cuCtxGetId",
        f"The context of {guard} was destroyed by its owner (cuCtxDestroy) while the guard "
        f"still referred to it; the guard cannot bring it back. Close the guard.",
    )


def no_such_device(ordinal_text, count):
    return InvalidDeviceError(
        CUDA_ERROR_INVALID_DEVICE,
        "ContextGuard",
        f"Device {ordinal_text} does not exist: the driver reports {count} device(s), "
        f"ordinals 0..{count - 1} (CUDA_VISIBLE_DEVICES renumbers them)",
    )


def construction_kept_retains(err, call, rerr, ordinal, kept):
    return driver_error(
        err,
        call,
        f"and releasing the retain(s) just taken failed too (cuDevicePrimaryCtxRelease: "
        f"{rerr}): device {ordinal}'s primary context keeps {kept} retain(s) more until the "
        f"process exits",
    )


def reset_during_construction(ordinal, tries):
    return driver_error(
        CUDA_ERROR_CONTEXT_IS_DESTROYED,
        "cuCtxGetId",
        f"device {ordinal}'s primary context was reset again each time it was re-activated "
        f"({tries} times) while the guard was being constructed; no retain is kept. "
        f"Construct it when no other thread resets the device",
    )


def probe_stuck(perr, ctx):
    return driver_error(
        perr,
        "cuCtxPopCurrent",
        f"cyctx pushed context 0x{ctx:x} to learn its device and could not pop it again (twice): "
        f"it is still pushed on this thread's context stack. Pop it with cuCtxPopCurrent",
    )


def note_cleanup_failure(exc, guard, cleanup):
    """Note on the block's exception `exc` that leaving `guard` failed with `cleanup`."""
    # Runs while the block's exception propagates: the note is best effort and nothing here
    # may raise, or it would replace that exception (a subclass's __repr__, a cleanup error's
    # __str__, or the user's exception refusing notes).
    try:
        what = str(cleanup)
    except Exception:
        what = "(its message could not be made)"
    _add_note(exc, f"cyctx: leaving {guard} also failed: {type(cleanup).__name__}: {what}")


def report_unraisable(err, guard):
    """Report `err`, a failure leaving `guard` while an exception that is often never shown
    propagated, through sys.unraisablehook (as a finalizer's error is). Never raises."""
    try:
        hook = sys.unraisablehook
        hook(_Unraisable(type(err), err, err.__traceback__, f"cyctx: leaving {guard}", None))
    except Exception:
        pass


class _Unraisable:
    # The argument sys.unraisablehook takes (sys.UnraisableHookArgs cannot be made from Python).
    __slots__ = ("exc_type", "exc_value", "exc_traceback", "err_msg", "object")

    def __init__(self, exc_type, exc_value, exc_traceback, err_msg, obj):
        self.exc_type, self.exc_value, self.exc_traceback = exc_type, exc_value, exc_traceback
        self.err_msg, self.object = err_msg, obj


def _add_note(exc, note):
    # PEP 678. Best effort: an exception whose __notes__ is not a list, or whose add_note
    # raises, keeps its own __notes__, and the note goes to stderr instead: never lost.
    shown = False
    try:
        exc.add_note(note)
        shown = True
    except Exception:
        pass
    if not shown:
        try:
            print(f"{note} (while {type(exc).__name__} propagated)", file=sys.stderr)
        except Exception:
            pass  # no usable stderr


# --- the one hook of the native side -----------------------------------------------------


def _not_forked():
    return False


# What DriverError asks: the name and description of a code, and whether this process is a
# forked child. Until connect_native, the fallbacks (no driver, no fork flags).
_describe = fallback_name_and_string
_forked = _not_forked


def connect_native(describe, is_fork_child):
    """Called once, by the ``_guard`` extension as it loads: `describe(code)` gives the
    driver's ``(name, description)`` of a CUresult, `is_fork_child()` the fork flag of
    ``_cpp/fork.h``. The only way native state reaches this module."""
    global _describe, _forked
    _describe, _forked = describe, is_fork_child
