"""Run a function in a forked child and get its result back through a pipe.

The child sends what the function returned (pickled) or the traceback of what it raised, and
leaves with os._exit: no atexit handlers, no finalizers of what it inherited, no flushing of
the parent's buffers. The parent waits with a timeout: a child that hangs (on a lock it
inherited held, what fork tests look for) is killed and fails the test instead of hanging
the run.
"""

import os
import pickle
import select
import signal
import time
import traceback
import warnings

FORK_TIMEOUT = 60  # seconds


class ForkedChildError(AssertionError):
    """The forked child raised, died before it reported, or hung."""


def run_forked(fn, timeout=FORK_TIMEOUT):
    """fn() in a forked child; returns its value, or raises ForkedChildError."""
    r, w = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns about fork in a process with threads: these tests fork on purpose.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
        if pid == 0:
            # Leaves from inside the block: its end takes the warnings module's lock, which
            # CPython does not reset in a child, and which another thread of the parent may
            # have held at the fork (one warning while the test forks).
            _child(fn, r, w)
    os.close(w)
    try:
        data, status = _collect(pid, r, time.monotonic() + timeout, timeout)
    finally:
        os.close(r)
    if status != 0 or not data:
        raise ForkedChildError(
            f"forked child exited with {os.waitstatus_to_exitcode(status)} before it reported"
        )
    returned, value = pickle.loads(data)
    if not returned:
        raise ForkedChildError(f"forked child raised:\n{value}")
    return value


def _child(fn, r, w):
    status = 1
    try:
        os.close(r)
        try:
            report = (True, fn())
        except BaseException:  # noqa: BLE001 - sent to the parent
            report = (False, traceback.format_exc())
        with os.fdopen(w, "wb") as f:
            pickle.dump(report, f)
        status = 0
    finally:
        os._exit(status)


def raised_in_fork(fn, timeout=FORK_TIMEOUT):
    """fn() in a forked child: the name of the exception type it raised there, or None."""

    def child():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - what the caller asks about
            return type(exc).__name__
        return None

    return run_forked(child, timeout)


def _collect(pid, fd, deadline, timeout):
    """Everything the child writes to fd, then its wait status; kills it at the deadline."""
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return data, status
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise ForkedChildError(f"forked child still running after {timeout} s: killed")
