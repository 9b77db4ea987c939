"""The per-thread entry stack of _cpp/thread_entries.h keeps its first kInline entries inline and
the rest in a heap block that doubles (kInline, 2 kInline, ...): every nesting depth at those
bounds, one below and one past, with each level's entry restoring a different context, so an
entry read from a neighbouring slot, or overwritten by the next one, restores the wrong one."""

import pytest
from helpers.drivers import create_context, current, driver, ok
from helpers.threads import in_thread

from cyctx import ContextGuard
from cyctx._guard import open_entries

# Five distinct contexts need two devices (the simulated driver has two).
pytestmark = pytest.mark.multigpu

K_INLINE = 6  # thread_entries.h's kInline
# The heap block holds 0, then kInline, 2 kInline, 4 kInline... entries: it grows when the depth
# reaches kInline + its size.
GROWTHS = [K_INLINE + cap for cap in (0, K_INLINE, 2 * K_INLINE, 4 * K_INLINE, 8 * K_INLINE)]
BOUNDS = sorted({0, 1} | {at + d for at in GROWTHS for d in (-1, 0, 1)})


@pytest.fixture
def five_guards():
    """Five guards of five different contexts: two primaries, three created contexts."""
    ctxs = [create_context(i % 2, current=False) for i in range(3)]
    gs = [ContextGuard(0), ContextGuard(1)] + [ContextGuard(c) for c in ctxs]
    assert len({g.handle for g in gs}) == 5
    yield gs
    for g in gs:
        g.close()
    for c in ctxs:
        ok(driver().cuCtxDestroy(c))


def _nest(gs, depth):
    """Enter depth guards (a different context than the one below at each level), checking the
    current context and the open entries on the way in and out; the log of what each exit
    restored."""
    log = []

    def level(k):
        if k == depth:
            return
        g = gs[k % len(gs)]
        before = current()
        with g:
            assert current() == g.handle and open_entries() == k + 1, (depth, k)
            level(k + 1)
            assert current() == g.handle and open_entries() == k + 1, (depth, k)
        log.append((k, current() == before, open_entries() == k))

    level(0)
    return log


@pytest.mark.parametrize("depth", BOUNDS)
def test_nesting_at_the_inline_and_heap_bounds(five_guards, depth):
    def body():
        fresh = _nest(five_guards, depth)  # a fresh thread: the heap block grows
        again = _nest(five_guards, depth)  # the grown block reused
        return fresh, again, current(), open_entries()

    fresh, again, cur, entries = in_thread(body)
    want = [(k, True, True) for k in reversed(range(depth))]
    assert fresh == want and again == want
    assert (cur, entries) == (0, 0)
