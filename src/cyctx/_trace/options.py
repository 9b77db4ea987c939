"""The checks of ``cyctx.trace()``'s options, made at the call: each bad one a TypeError or
ValueError that names it, before anything is loaded or started; the buffer bounded by the
memory the process can afford."""

from __future__ import annotations

import os
from typing import Any

from cyctx._inputs import _index, int_text, shown

# A trace's buffer may take this share of the memory the process can have: it is the tracer's,
# beside everything the traced program needs.
MEMORY_SHARE = 4  # a quarter


def check_options(
    native: Any, python_frames: Any, native_frames: Any, capacity: Any, quiet: Any
) -> tuple[int, int, int, bool]:
    """(python_frames, native_frames, capacity, quiet) as checked values."""
    py = _count("python_frames", python_frames, 0, native.MAX_PY)
    nat = _count("native_frames", native_frames, 0, native.MAX_NATIVE)
    cap = _count("capacity", capacity, 1, None)
    if not isinstance(quiet, bool):
        raise TypeError(
            f"cyctx.trace(quiet={shown(quiet)}): quiet must be True or False, not a "
            f"{type(quiet).__name__}"
        )
    slot = native.slot_bytes(py, nat)
    limit, of_what = affordable()
    if cap * slot > limit:
        raise ValueError(
            f"cyctx.trace(capacity={int_text(cap)}): a buffer of {int_text(cap)} events needs "
            f"{_size(cap * slot)} ({slot} bytes an event with python_frames={py}, "
            f"native_frames={nat}), and a trace takes at most a quarter of the memory "
            f"{of_what} ({_size(limit * MEMORY_SHARE)}): at most capacity={limit // slot}"
        )
    return py, nat, cap, quiet


def _count(option: str, value: Any, lo: int, hi: int | None) -> int:
    words = f"an int from {lo} to {hi}" if hi is not None else f"an int of {lo} or more"
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(
            f"cyctx.trace({option}={shown(value)}): {option} must be {words}, not a "
            f"{type(value).__name__}"
        )
    n = _index(value, option)
    if n < lo or (hi is not None and n > hi):
        raise ValueError(
            f"cyctx.trace({option}={int_text(n)}): {option} must be {words}, not {int_text(n)}"
        )
    return n


def affordable() -> tuple[int, str]:
    """(the bytes a trace's buffer may take, whose memory that is a share of): a quarter of the
    machine's physical memory, or of the process's control group's limit where that is lower."""
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    group = _cgroup_limit()
    if group is not None and group < physical:
        return group // MEMORY_SHARE, "of this process's control group"
    return physical // MEMORY_SHARE, "of this machine"


def _cgroup_limit() -> int | None:
    """The memory limit of the process's control group (v2's memory.max, v1's
    memory.limit_in_bytes), or None where none is set or none can be read."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            where = f"/sys/fs/cgroup{path}/memory.max"
        elif "memory" in controllers.split(","):
            where = f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"
        else:
            continue
        try:
            with open(where) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"
