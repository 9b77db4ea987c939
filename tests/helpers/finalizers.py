"""Code that runs late: a generator left suspended inside a guard (closed or collected
afterwards, maybe under another guard), and what finalizers report through
sys.unraisablehook."""

import sys


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
