"""An adversarial pass: ordinary-but-hostile user code against the guard. Each test
is one attempt from docs/guarantees.md's table; crashes and hangs are tried in a child with a
timeout. What is checked is always the state afterwards: no retain leaked or lost, every
thread's context stack as it was, the error typed."""

import asyncio
import copy
import enum
import fractions
import decimal
import gc
import os
import pickle
import signal
import threading
import warnings
import weakref

import pytest

import cyctx
from cyctx import ContextGuard, ContextResetWarning, DriverError, GuardError
from cyctx._guard import _open_entries

from helpers.children import run_child
from helpers.drivers import current, reset_primary, second_device
from helpers.finalizers import collect_unraisable, suspended_in
from helpers.threads import in_thread, running

D1 = second_device()  # device 1, or 0 on a one-GPU machine


# --- values of every type ------------------------------------------------------------------

class _Ord(enum.IntEnum):
    ONE = 1


class _BigIndex:
    def __index__(self):
        return 2**100


class _RaisingIndex:
    def __index__(self):
        raise RuntimeError("boom from __index__")


@pytest.mark.parametrize("value, exc", [
    (b"0", TypeError), (bytearray(b"0"), TypeError), (0j, TypeError), (decimal.Decimal(0), TypeError),
    (fractions.Fraction(0), TypeError), ([0], TypeError), ((0,), TypeError), ({0}, TypeError),
    (object(), TypeError), (type, TypeError), (float("nan"), TypeError), (float("inf"), TypeError),
    (_BigIndex(), cyctx.InvalidDeviceError), (-2**100, ValueError), (_RaisingIndex(), RuntimeError),
])
def test_every_kind_of_value_as_a_device(value, exc, sim):
    base = [sim.retain_count(i) for i in range(2)]
    with pytest.raises(exc):
        ContextGuard(value)
    with pytest.raises(exc):
        ContextGuard.shared(value)
    assert [sim.retain_count(i) for i in range(2)] == base


def test_int_like_values_are_accepted(sim):
    for v in (_Ord.ONE, 1):
        g = ContextGuard(v)
        assert g.device == 1 and type(g.device) is int
        g.close()


def test_cuda_stream_protocol_edge_objects():
    class Raises:
        def __cuda_stream__(self):
            raise KeyError("from the user")

    class NotCallable:
        __cuda_stream__ = (0, 5)

    class NamedTuple(tuple):
        pass

    class Sub:
        def __cuda_stream__(self):
            return NamedTuple((0, 2))

    with pytest.raises(KeyError):  # the user's own error, unchanged
        ContextGuard(Raises())
    with pytest.raises(TypeError):
        ContextGuard(NotCallable())
    with pytest.raises(ValueError, match="default stream"):  # a tuple subclass is a tuple
        ContextGuard(Sub())


def test_pickle_and_copy_cannot_duplicate_a_retain(sim):
    # A copy would be a second owner of one retain (a double release at close).
    g = ContextGuard(0)
    base = sim.retain_count(0)
    for attempt in (lambda: pickle.dumps(g), lambda: copy.copy(g), lambda: copy.deepcopy(g)):
        with pytest.raises(TypeError):
            attempt()
    assert sim.retain_count(0) == base
    g.close()


# --- lifetimes: GC, cycles, __del__, weakrefs, subclassing --------------------------------

def test_subclass_works_and_releases(sim):
    base = sim.retain_count(0)

    class Mine(ContextGuard):
        entered = 0

        def __enter__(self):
            self.entered += 1
            return super().__enter__()

    def body():
        g = Mine(0)
        with g as x:
            assert x is g and current() == g.handle
        assert g.entered == 1 and current() == 0
        del g
        gc.collect()

    in_thread(body)
    assert sim.retain_count(0) == base


def test_subclass_with_own_init_arguments_is_a_type_error(sim):
    # __cinit__ takes exactly the device: a subclass cannot add constructor arguments.
    class Named(ContextGuard):
        def __init__(self, device, name):
            self.name = name

    base = sim.retain_count(0)
    with pytest.raises(TypeError):
        Named(0, "x")
    assert sim.retain_count(0) == base


def test_weakref_callback_uses_guards_during_deallocation(sim):
    base = [sim.retain_count(i) for i in range(2)]
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
        del g
        gc.collect()
        assert r() is None
        keep.close()

    in_thread(body)
    assert seen == [True]
    assert [sim.retain_count(i) for i in range(2)] == base


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
    base = [sim.retain_count(i) for i in range(2)]
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
            assert current() == g0.handle and _open_entries() == 1
        g0.close()
        g1.close()
        return current()

    assert in_thread(body) == 0 and seen == [True]
    assert [sim.retain_count(i) for i in range(2)] == base


def test_many_guards_freed_while_entered_on_one_thread(sim):
    # Orphans pile up under an outer guard; its exit drops them all and restores.
    base = [sim.retain_count(i) for i in range(2)]

    def body():
        outer = ContextGuard(D1)
        outer.__enter__()
        for _ in range(100):  # beyond the inline entries (_tls.h): the spill path too
            ContextGuard(0).__enter__()
        gc.collect()
        assert _open_entries() == 101
        with pytest.warns(ResourceWarning, match="dropped 100"):
            outer.__exit__(None, None, None)
        assert _open_entries() == 0 and current() == 0
        outer.close()

    in_thread(body)
    assert [sim.retain_count(i) for i in range(2)] == base


def test_late_generator_exit_under_deep_nesting_is_spliced(sim):
    # The spliced entry is deep (the heap spill), with 40 entries above it.
    base = [sim.retain_count(i) for i in range(2)]

    def body():
        g0, g1 = ContextGuard(0), ContextGuard(D1)
        for _ in range(5):
            g1.__enter__()
        it = suspended_in(g0)
        for _ in range(40):
            g1.__enter__()
        with pytest.raises(GuardError, match="generator"):
            it.close()
        assert _open_entries() == 45 and current() == g1.handle
        for _ in range(45):
            g1.__exit__(None, None, None)
        g0.close()
        g1.close()
        return current()

    assert in_thread(body) == 0
    assert [sim.retain_count(i) for i in range(2)] == base


def test_spliced_exit_restores_what_was_before_the_late_block():
    def body():
        g0, g1 = ContextGuard(0), ContextGuard(D1)
        with g1:  # before the generator's block: g1 current
            it = suspended_in(g0)  # g0 current
            with g1:  # g1 again, then the generator is closed late
                with pytest.raises(GuardError):
                    it.close()
                assert current() == g1.handle
            # leaving the inner g1 restores what was current before g0's block: g1
            assert current() == g1.handle
        assert current() == 0
        g0.close()
        g1.close()
        return _open_entries()

    assert in_thread(body) == 0


# --- threads ------------------------------------------------------------------------------

def test_many_short_lived_threads_racing_first_use_in_a_fresh_process(sim):
    # Driver-table load, cuInit and first retains raced by 32 threads at once.
    out = run_child("""
        import functools, threading, cyctx
        from helpers.threads import run_threads
        b = threading.Barrier(32)
        errs, got = [], []
        def f(i):
            try:
                b.wait()
                if i % 4 == 0:
                    assert cyctx.current_handle() == 0  # before or after the first cuInit
                g = cyctx.ContextGuard(i % 2)
                with g:
                    got.append(cyctx.current_handle() == g.handle)
                g.close()
                with cyctx.ContextGuard.shared(i % 2):
                    pass
            except BaseException as e:
                errs.append(repr(e))
        run_threads(*(functools.partial(f, i) for i in range(32)))
        print("ERRS", errs)
        print("RETAINS", [drivers.SIM.retain_count(i) for i in range(2)])
    """, init=False, timeout=120)
    assert "ERRS []" in out.stdout and "RETAINS [1, 1]" in out.stdout, out.stdout


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


def test_enter_exit_on_many_threads_with_resets_and_a_late_close(sim):
    base = sim.retain_count(0)
    g = ContextGuard(0)
    stop = threading.Event()
    bad = []

    def worker():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ContextResetWarning)
            while not stop.is_set():
                try:
                    with g:
                        assert current() == g.handle
                except Exception as e:  # noqa: BLE001
                    bad.append(repr(e))

    with running(*[worker] * 4):
        for _ in range(50):
            reset_primary(0)
        stop.set()
    assert bad == []
    assert sim.retain_count(0) == base + 1
    g.close()
    assert sim.retain_count(0) == base


# --- fork and multiprocessing -------------------------------------------------------------

def test_fork_while_other_threads_construct_and_free_guards():
    # The live-guard registry's mutex is held across fork by the atfork handlers: a child
    # never inherits it locked, so a dealloc or an exit's slow path in the child cannot hang.
    out = run_child("""
        import threading, cyctx
        from helpers.forking import run_forked
        from helpers.threads import running
        stop = threading.Event()
        def churn():
            while not stop.is_set():
                cyctx.ContextGuard(0).__enter__()  # freed while entered: registry traffic
        def child():
            global g
            try:
                cyctx.ContextGuard(0)
                return "no ForkError"
            except cyctx.ForkError:
                pass
            g.__exit__(None, None, None)
            del g
            return "left"
        g = cyctx.ContextGuard(D1)
        seen = []
        with running(*[churn] * 3):
            for _ in range(30):
                g.__enter__()
                seen.append(run_forked(child))
                g.__exit__(None, None, None)
            stop.set()
        print("SEEN", set(seen))
    """, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "SEEN {'left'}" in out.stdout, out.stdout


def _pool_target(_):
    import cyctx

    with cyctx.ContextGuard(0):
        return 1


def test_fork_pool_worker_gets_ForkError_in_the_parent():
    out = run_child("""
        import multiprocessing as mp, warnings, cyctx, test_adversarial
        warnings.simplefilter("ignore", DeprecationWarning)
        g = cyctx.ContextGuard(0)
        with mp.get_context("fork").Pool(1) as pool:
            try:
                pool.apply(test_adversarial._pool_target, (0,))
                print("NO ERROR")
            except cyctx.ForkError as e:
                print("FORKERROR", "spawn" in str(e))
        g.close()
    """, timeout=120)
    assert "FORKERROR True" in out.stdout


# --- signals --------------------------------------------------------------------------------

def test_signal_handler_using_guards_during_enter_exit_loops():
    # SIGALRM every 50 us runs a handler that uses a guard and shared() (first use included)
    # between any two bytecodes of a loop of other guards' blocks, including warnings code.
    out = run_child("""
        import signal, cyctx
        g0, g1 = cyctx.ContextGuard(0), cyctx.ContextGuard(D1)
        hits = [0]
        def handler(sig, frame):
            with cyctx.ContextGuard.shared(D1):
                with g0:
                    hits[0] += 1
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, 0.00005, 0.00005)
        for i in range(100000):
            with g1:
                with g0:
                    pass
            if hits[0] > 500 and i > 20000:
                break
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        from cyctx._guard import _open_entries
        print("HITS", hits[0] > 0, "STATE", drivers.current(), _open_entries())
        g0.close(); g1.close()
    """, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "HITS True STATE 0 0" in out.stdout, out.stdout


# --- warnings filters: Python code inside enter ----------------------------------------------

def test_showwarning_hook_reenters_the_same_guard_during_reactivation(sim):
    base = sim.retain_count(0)

    def body():
        g = ContextGuard(0)
        reset_primary(0)
        inner = []

        def hook(*a, **k):
            if not inner:
                inner.append(1)
                with g:  # the same reset, seen again from inside the warning
                    inner.append(current() == g.handle)

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            old, warnings.showwarning = warnings.showwarning, hook
            try:
                with g:
                    assert current() == g.handle
            finally:
                warnings.showwarning = old
        assert inner == [1, True]
        assert sim.retain_count(0) == base + 1
        g.close()
        return current(), _open_entries()

    assert in_thread(body) == (0, 0)
    assert sim.retain_count(0) == base


# --- asyncio ----------------------------------------------------------------------------------

def test_asyncio_tasks_with_guards_in_synchronous_sections():
    # The supported way: no await inside the block.
    g0, g1 = ContextGuard(0), ContextGuard(D1)

    async def task(g, n):
        for _ in range(n):
            with g:
                assert current() == g.handle
            await asyncio.sleep(0)

    async def main():
        await asyncio.gather(*(task(g0 if i % 2 else g1, 50) for i in range(10)))

    def body():
        asyncio.run(main())
        return current(), _open_entries()

    assert in_thread(body) == (0, 0)
    g0.close()
    g1.close()


def test_abandoned_coroutine_inside_a_guard_collected_under_another_guard(sim):
    base = [sim.retain_count(i) for i in range(2)]

    def body():
        g0, g1 = ContextGuard(0), ContextGuard(D1)

        class Never:
            def __await__(self):
                yield

        async def coro():
            with g0:
                await Never()

        c = coro()
        c.send(None)  # suspended inside g0's block
        g1.__enter__()
        holder = [c]
        del c
        seen = collect_unraisable(lambda: (holder.clear(), gc.collect()))
        assert len(seen) == 1 and isinstance(seen[0].exc_value, GuardError)
        assert current() == g1.handle and _open_entries() == 1
        g1.__exit__(None, None, None)
        g0.close()
        g1.close()
        return current(), _open_entries()

    assert in_thread(body) == (0, 0)
    assert [sim.retain_count(i) for i in range(2)] == base


# --- interpreter shutdown --------------------------------------------------------------------

def test_shutdown_with_suspended_generators_orphans_and_atexit_users(sim):
    out = run_child("""
        import atexit, cyctx
        g = cyctx.ContextGuard(0)
        def gen():
            with g:
                yield
        it = gen(); next(it)                       # suspended inside a block at exit
        cyctx.ContextGuard(D1).__enter__()          # an orphaned entry at exit
        def at_exit():
            with cyctx.ContextGuard.shared(D1):
                with g:
                    pass
        atexit.register(at_exit)
        class Late:
            def __del__(self):
                with g:
                    pass
        late = Late()
        print("END")
    """, timeout=120, check=False, env={"CYCTX_SIM_REPORT_AT_EXIT": "1"})
    assert out.returncode == 0 and "END" in out.stdout, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "Fatal" not in out.stderr, out.stderr[-2000:]
    assert "cyctxsim at exit:" in out.stderr


# --- memory over millions of operations ------------------------------------------------------

def _rss_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


@pytest.mark.slow
def test_memory_flat_over_millions_of_operations(sim):
    out = run_child("""
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
        print("GROWTH_KB", r1 - r0, "RETAINS", [drivers.SIM.retain_count(i) for i in range(2)])
        g0.close(); g1.close()
    """, timeout=600)
    growth = int(out.stdout.split("GROWTH_KB")[1].split()[0])
    assert growth < 4096, out.stdout
    assert "RETAINS [1, 1]" in out.stdout
