"""close(): refused inside the guard's own block, releasing once however many threads call it,
and not undone by a re-activation in progress (deallocation: test_natural.py; a release that
fails: test_faults.py)."""

import threading
import warnings

import pytest
from helpers.drivers import current, reset_primary
from helpers.threads import in_thread, run_threads, running

from cyctx import ContextGuard, ContextResetWarning, GuardError


@pytest.mark.thread_unsafe(reason="closes the guard fixture, which all its copies share")
def test_close_inside_block_refused(guard):
    with guard:
        with pytest.raises(GuardError, match="inside a with-block"):
            guard.close()
        assert not guard.closed
    guard.close()


# --- other threads and re-activations ---------------------------------------------------------


def test_close_from_two_threads_releases_once(sim):
    base = sim.retain_count(0)
    keep = ContextGuard(0)
    for _ in range(200):
        g = ContextGuard(0)
        b = threading.Barrier(4)

        def f(b=b, g=g):
            b.wait()
            g.close()

        run_threads(*[f] * 4)
        assert g.closed and sim.retain_count(0) == base + 1
    keep.close()
    assert sim.retain_count(0) == base


def test_close_while_other_threads_use_the_guard(sim):
    # The caller's bug (README), but it must stay a typed error: no crash, no wrong retain
    # count, every thread back to what it had.
    base = sim.retain_count(0)
    g = ContextGuard(0)
    stop = threading.Event()
    bad, ends = [], []

    def worker():
        while not stop.is_set():
            try:
                with g:
                    pass
            except GuardError:
                pass  # closed
            except Exception as e:  # noqa: BLE001
                bad.append(repr(e))
        ends.append(current())

    with running(*[worker] * 4):
        g.close()
        stop.set()
    assert bad == [] and ends == [0] * 4
    assert sim.retain_count(0) == base


def test_close_during_reset_reactivation_does_not_reopen_or_steal_a_retain(sim):
    # The re-activation warns (Python code runs: a showwarning hook here, another thread in
    # real life) before it retains; a close() at that moment must not be undone: a guard
    # re-opened without a retain of its own would release another guard's at its next close.
    base = sim.retain_count(0)

    def body():
        other = ContextGuard(0)  # another guard's retain that must survive
        g = ContextGuard(0)
        reset_primary(0)
        closed_in_hook = []

        def hook(*a, **k):
            g.close()
            closed_in_hook.append(g.closed)

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            old = warnings.showwarning
            warnings.showwarning = hook
            try:
                with pytest.raises(GuardError, match="closed"):
                    g.__enter__()
            finally:
                warnings.showwarning = old
        assert closed_in_hook == [True]
        assert g.closed, "close() was undone by the re-activation"
        assert current() == 0
        assert sim.retain_count(0) == base + 1, "other's retain only"
        g.close()
        assert sim.retain_count(0) == base + 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ContextResetWarning)
            with other:
                assert current() == other.handle
        other.close()

    in_thread(body)
    assert sim.retain_count(0) == base
