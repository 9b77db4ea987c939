"""Run functions on new threads (each starts with no current context).

An exception in a thread only prints; here it is re-raised in the test's thread, so it fails
the test. A thread still running long after it should have finished fails the test too,
instead of hanging the run.
"""

import contextlib
import threading
import time

JOIN_TIMEOUT = 300  # seconds, for all the threads of one call: far beyond what any test needs


@contextlib.contextmanager
def running(*fns, timeout=JOIN_TIMEOUT):
    """Start a thread for each fn; at the end of the block join them, then re-raise the first
    exception one of them raised (in the order of fns). Yields the list of their return
    values, complete after the block. If the block itself raises, that error goes up at once:
    the threads may be waiting for what the block did not do (they are daemons, so they do
    not keep the interpreter alive)."""
    results = [None] * len(fns)
    errors = [None] * len(fns)

    def body(i):
        try:
            results[i] = fns[i]()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors[i] = exc

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    yield results
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = sum(t.is_alive() for t in threads)
    if stuck:
        raise AssertionError(f"{stuck} of {len(threads)} threads still running after {timeout} s")
    for exc in errors:
        if exc is not None:
            raise exc


def run_threads(*fns, timeout=JOIN_TIMEOUT):
    """Run each fn on its own thread, all at once; return their results in order."""
    with running(*fns, timeout=timeout) as results:
        pass
    return results


def in_thread(fn, *args):
    """Run fn(*args) on a new thread; return its value or re-raise its error."""
    return run_threads(lambda: fn(*args))[0]
