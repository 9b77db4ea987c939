"""Guards freed while entered (their entries never matched by a new guard at the same address,
dropped by the next exit), guards used from finalizers, and memory flat over millions of uses."""

import gc
import weakref

import pytest
from helpers.children import run_child
from helpers.drivers import current, driver, ok, retains_unchanged, second_device
from helpers.finalizers import freed_on_purpose
from helpers.threads import in_thread

from cyctx import ContextGuard
from cyctx._guard import open_entries

D1 = second_device()  # device 1, or 0 on a one-GPU machine


# --- guards freed while entered ---------------------------------------------------------------


def test_guard_freed_while_entered_is_not_matched_by_a_new_guard_at_its_address():
    # In a child, on its main thread: the dead guard's entry stays there (orphaned).
    out = run_child("""
        import gc, cyctx
        from cyctx import ContextGuard, GuardError
        base = drivers.retains()[0] if drivers.SIM else None
        a = ContextGuard(0)
        a.__enter__()
        addr = id(a)
        del a  # freed while entered
        gc.collect()
        kept = [ContextGuard(0) for _ in range(3000)]
        b = next((x for x in kept if id(x) == addr), None)
        for k in kept:
            if k is not b:
                k.close()
        print("REUSED", b is not None)
        if b is not None:
            # Before: b matched a's entry: exit without enter "succeeded", close() was refused.
            try:
                b.__exit__(None, None, None)
                print("EXIT accepted")
            except GuardError as e:
                print("EXIT refused", "without a matching enter" in str(e))
            b.close()
            print("CLOSED", b.closed)
        if drivers.SIM:
            print("RETAINS", drivers.retains()[0] - base)  # less the process's retain
    """)
    assert "REUSED True" in out.stdout, (
        "the allocator did not reuse the address: test proves nothing"
    )
    assert "EXIT refused True" in out.stdout and "CLOSED True" in out.stdout, out.stdout
    assert "RETAINS" not in out.stdout or "RETAINS 0" in out.stdout


def test_orphaned_entry_dropped_by_an_exit_on_the_fast_path_warns_too(sim):
    # The outer guard's enter took the fast path (its context was current already), so its
    # exit would too; dropping the dead entry above it is reported all the same.
    d = driver()

    def body():
        outer = ContextGuard(0)
        ok(d.cuCtxPushCurrent(outer.context))
        outer.__enter__()
        inner = ContextGuard(D1)
        inner.__enter__()
        with freed_on_purpose():
            del inner
        with pytest.warns(ResourceWarning, match="dropped 1 open entry"):
            outer.__exit__(None, None, None)
        restored = (open_entries(), current() == outer.handle, sim.stack_depth())
        ok(d.cuCtxPopCurrent())
        outer.close()
        return restored

    # No entry left; outer's context current on the one-entry stack, as before its enter.
    assert in_thread(body) == (0, True, 1)


# 100: beyond the inline entries (_cpp/thread_entries.h), the spill path too.
@pytest.mark.parametrize("n", [1, 100])
def test_entries_of_guards_freed_while_entered_are_dropped_by_the_outer_exit(sim, n):
    # The outer guard's exit meets the dead guards' entries on top: they are dropped (they can
    # never be left), reported, and the outer exit restores what was current before it.
    with retains_unchanged():

        def body():
            outer = ContextGuard(D1)
            outer.__enter__()
            with freed_on_purpose():
                for _ in range(n):
                    ContextGuard(0).__enter__()
            assert open_entries() == n + 1
            with pytest.warns(ResourceWarning, match=f"dropped {n} open entr.*freed while entered"):
                outer.__exit__(None, None, None)
            assert open_entries() == 0 and current() == 0
            outer.close()

        in_thread(body)


# --- weakref callbacks and finalizers ---------------------------------------------------------


def test_weakref_callback_uses_guards_during_deallocation(sim):
    with retains_unchanged():
        seen = []

        def body():
            keep = ContextGuard(D1)

            def cb(_):
                with keep:
                    seen.append(current() == keep.handle)
                h = ContextGuard(0)
                h.close()

            g = ContextGuard(0)
            r = weakref.ref(g, cb)
            with freed_on_purpose():
                del g
            assert r() is None
            keep.close()

        in_thread(body)
        assert seen == [True]


def test_finalizer_of_a_cycle_uses_its_guard(sim):
    base = sim.retain_count(0)
    seen = []

    class Holder:
        def __init__(self):
            self.g = ContextGuard(0)
            self.me = self

        def __del__(self):
            with self.g:
                seen.append(current() == self.g.handle)
            self.g.close()

    def body():
        Holder()
        gc.collect()
        return current()

    assert in_thread(body) == 0
    assert seen == [True] and sim.retain_count(0) == base


def test_finalizer_runs_a_guard_inside_another_guards_block(sim):
    # The garbage collector can run any finalizer in the middle of a with-block: properly
    # nested, its guard use is fine, and the open block's context is back afterwards.
    with retains_unchanged():
        seen = []

        def body():
            g0, g1 = ContextGuard(0), ContextGuard(D1)

            class Fin:
                def __del__(self):
                    with g1:
                        seen.append(current() == g1.handle)

            with g0:
                f = Fin()
                f.me = f
                del f
                gc.collect()
                assert current() == g0.handle and open_entries() == 1
            g0.close()
            g1.close()
            return current()

        assert in_thread(body) == 0 and seen == [True]


# --- memory over millions of operations -------------------------------------------------------


@pytest.mark.slow
def test_memory_flat_over_millions_of_operations(sim):
    out = run_child(
        """
        import os, gc, cyctx
        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
        g0, g1 = cyctx.ContextGuard(0), cyctx.ContextGuard(D1)
        def pairs(n):
            for _ in range(n):
                with g0:
                    with g1:
                        pass
        def lifetimes(n):
            for _ in range(n):
                cyctx.ContextGuard(0).close()
                with g1:
                    cyctx.ContextGuard(D1).__enter__()  # orphaned, dropped by g1's exit
        import warnings
        warnings.simplefilter("ignore", ResourceWarning)
        lifetimes(1000)
        pairs(100000); gc.collect(); r0 = rss()
        pairs(1000000)
        lifetimes(200000)
        gc.collect(); r1 = rss()
        print("GROWTH_KB", r1 - r0, "RETAINS", drivers.retains())  # less the process's retain
        g0.close(); g1.close()
    """,
        timeout=600,
    )
    growth = int(out.stdout.split("GROWTH_KB")[1].split()[0])
    assert growth < 4096, out.stdout
    assert "RETAINS [1, 1]" in out.stdout
