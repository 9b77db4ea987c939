"""Code that runs late: a generator left suspended inside a guard (closed or collected
afterwards, maybe under another guard), what finalizers report through sys.unraisablehook,
and guards let go without close() on purpose."""

import contextlib
import gc
import sys
from collections.abc import Iterator

import pytest


def suspended_in(guard):
    """A generator suspended inside `with guard:` (the guard entered on the calling thread)."""

    def gen():
        with guard:
            yield

    it = gen()
    next(it)
    return it


def collect_unraisable(fn):
    """Run fn and return what it reported through sys.unraisablehook (finalizer errors)."""
    seen = []
    old = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        fn()
    finally:
        sys.unraisablehook = old
    return seen


@contextlib.contextmanager
def freed_on_purpose(collect: bool = True) -> Iterator[None]:
    """A block that lets guards go without ``close()`` on purpose.

    The release of each such guard warns ResourceWarning ("released by garbage collection"),
    an error under the suite's ``-W error``: the block expects it, and fails unless at least one
    came. With ``collect`` it runs ``gc.collect()`` last, for guards that only the collector
    frees (held by a cycle, a frame or a generator); ``collect=False`` is for a test that pins
    the release as the deallocation's own, at the last reference's end.
    """
    with pytest.warns(ResourceWarning, match="released by garbage collection"):
        yield
        if collect:
            gc.collect()
