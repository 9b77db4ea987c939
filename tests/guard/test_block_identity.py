"""Which block an exit belongs to, however the block is written: subclasses and wrappers,
contextlib, helper functions, greenlets, tracer and gc hooks, reused frame addresses; and
out-of-order errors a framework would swallow are never lost."""

import asyncio
import contextvars
import gc
import sys
from contextlib import AsyncExitStack, ExitStack, contextmanager

import pytest
from helpers.children import run_child
from helpers.drivers import current, second_device
from helpers.finalizers import collect_unraisable, suspended_in
from helpers.threads import in_thread

from cyctx import ContextGuard, GuardError
from cyctx._guard import open_entries

D1 = second_device()  # device 1, or 0 on a one-GPU machine


# --- ways of wrapping the guard's own methods --------------------------------------------------


class Sub(ContextGuard):
    """The usual way to add logging or an NVTX range: a subclass wrapping both methods."""

    def __enter__(self):
        super().__enter__()
        return self

    def __exit__(self, *exc):
        return super().__exit__(*exc)


class SubSub(Sub):
    """Wrapped twice: each level adds a frame."""

    def __enter__(self):
        return super().__enter__()

    def __exit__(self, *exc):
        return super().__exit__(*exc)


class Wrap:
    """Not a subclass: an object holding a guard and forwarding the protocol to it."""

    def __init__(self, device):
        self.g = ContextGuard(device)

    def __enter__(self):
        self.g.__enter__()
        return self

    def __exit__(self, *exc):
        return self.g.__exit__(*exc)

    @property
    def handle(self):
        return self.g.handle

    def close(self):
        self.g.close()


WRAPPERS = [Sub, SubSub, Wrap]


@pytest.mark.strands
@pytest.mark.parametrize("kind", WRAPPERS, ids=lambda k: k.__name__)
def test_wrapped_guard_generator_closed_inside_the_callers_block_takes_its_own_entry(kind):
    # A generator holding a block of the wrapped guard s is closed inside the caller's own block
    # of s: the generator's entry is the one removed (out of order, reported), never the caller's.
    def body():
        s, h = kind(0), ContextGuard(D1)
        before = current()
        it = suspended_in(s)
        with h:
            with s:
                with pytest.raises(GuardError, match="out of order"):
                    it.close()
                assert current() == s.handle and open_entries() == 2
            # The caller's block of s restored h: its own entry was still there.
            assert current() == h.handle and open_entries() == 1
        assert current() == before and open_entries() == 0
        s.close()
        h.close()

    in_thread(body)


# ContextGuard itself: `with` tags its blocks, told apart in the plain build too (there:
# test_plain_protocol.py).
@pytest.mark.strands
@pytest.mark.parametrize("kind", [ContextGuard, *WRAPPERS], ids=lambda k: k.__name__)
def test_wrapped_guard_blocks_of_two_generators_interleaved_are_told_apart(kind):
    def body():
        s = kind(0)

        def gen():
            with s:
                yield
                yield

        with ContextGuard(D1) as other:
            a, b = gen(), gen()
            next(a)
            next(b)
            with pytest.raises(GuardError, match="same guard"):
                next(a)
                next(a)  # a's block is left while b's is open
            assert current() == s.handle and open_entries() == 2
            with pytest.raises(StopIteration):
                next(b)
                next(b)
            assert current() == other.handle and open_entries() == 1
        other.close()
        s.close()  # nothing of s is left open on this thread
        return current(), open_entries()

    assert in_thread(body) == (0, 0)


@pytest.mark.strands
def test_wrapped_guard_in_order_use_is_quiet_at_any_depth():
    def body():
        s, w = SubSub(0), Wrap(D1)
        for _ in range(3):
            with s, w, s:
                assert current() == s.handle
            assert current() == 0
        s.close()
        w.close()
        return open_entries()

    assert in_thread(body) == 0


# --- contextlib ------------------------------------------------------------------------------


@pytest.mark.strands
def test_exitstack_closed_by_the_frame_that_opened_it_inside_a_generator_and_a_task():
    def body():
        g = ContextGuard(0)

        def gen():
            with ExitStack() as st:
                st.enter_context(g)
                yield current()

        async def task():
            async with AsyncExitStack() as st:
                st.enter_context(g)
                await asyncio.sleep(0)
                return current()

        assert list(gen()) == [g.handle]
        assert asyncio.run(task()) == g.handle
        with ExitStack() as st:
            st.enter_context(g)
            st.enter_context(g)
        g.close()
        return current(), open_entries()

    assert in_thread(body) == (0, 0)


def test_contextmanager_wrapping_the_guard_in_two_generators_is_told_apart():
    def body():
        g = ContextGuard(0)

        @contextmanager
        def on(guard):
            with guard:
                yield

        def gen():
            with on(g):
                yield

        it = gen()
        next(it)
        with on(g):
            with pytest.raises(GuardError, match="out of order"):
                it.close()
            assert current() == g.handle
        g.close()
        return current(), open_entries()

    assert in_thread(body) == (0, 0)


# --- helper functions ------------------------------------------------------------------------


def enter(x):
    x.__enter__()


def leave(x):
    x.__exit__(None, None, None)


@pytest.fixture
def no_greenlet(monkeypatch):
    """A process with no greenlet loaded: a frame not running on this thread has returned."""
    monkeypatch.delitem(sys.modules, "greenlet", raising=False)


@pytest.mark.strands
@pytest.mark.parametrize("how", ["helper enter", "helper exit", "both helpers", "nested helper"])
def test_lifo_correct_helper_functions_are_accepted(how, no_greenlet):
    def nested(x):
        enter(x)

    def body():
        g, h = ContextGuard(0), ContextGuard(D1)
        before = current()
        with h:
            with g:
                if how in ("helper enter", "both helpers"):
                    enter(h)
                elif how == "nested helper":
                    nested(h)
                else:
                    h.__enter__()
                assert current() == h.handle and open_entries() == 3
                if how in ("helper exit", "both helpers"):
                    leave(h)
                else:
                    h.__exit__(None, None, None)
                assert current() == g.handle and open_entries() == 2
            assert current() == h.handle and open_entries() == 1
        assert current() == before and open_entries() == 0
        g.close()
        h.close()

    in_thread(body)


def test_a_helpers_entry_inside_a_block_of_the_same_guard_ends_with_either_exit(no_greenlet):
    # Two open entries of one guard on one thread, one made by a helper that has returned: they
    # are interchangeable, so whichever exit comes first takes the innermost.
    def body():
        g = ContextGuard(0)
        with ContextGuard(D1) as h:
            with g:
                enter(g)
            assert current() == g.handle and open_entries() == 2
            leave(g)
            assert current() == h.handle and open_entries() == 1
        h.close()
        g.close()
        return current(), open_entries()

    assert in_thread(body) == (0, 0)


# --- greenlets -------------------------------------------------------------------------------


def test_greenlet_killed_inside_a_block_out_of_order_raises_instead_of_a_lost_note():
    greenlet = pytest.importorskip("greenlet")

    def body():
        g, h = ContextGuard(0), ContextGuard(D1)

        def run():
            with g:
                greenlet.getcurrent().parent.switch()

        gl = greenlet.greenlet(run)
        gl.switch()
        with h:
            # GreenletExit is swallowed by greenlet: a note on it would never be seen.
            with pytest.raises(GuardError, match="greenlet holding this guard was closed, killed"):
                gl.throw(greenlet.GreenletExit)
            assert gl.dead and current() == h.handle and open_entries() == 1
        assert current() == 0 and open_entries() == 0
        g.close()
        h.close()

    in_thread(body)


def test_greenlet_collected_inside_a_block_out_of_order_reports_through_unraisablehook():
    greenlet = pytest.importorskip("greenlet")

    def body():
        g, h = ContextGuard(0), ContextGuard(D1)

        def run():
            with g:
                greenlet.getcurrent().parent.switch()

        gl = greenlet.greenlet(run)
        gl.switch()
        with h:

            def drop():
                nonlocal gl
                del gl
                gc.collect()

            seen = collect_unraisable(drop)
            assert current() == h.handle and open_entries() == 1
        assert [type(s.exc_value) for s in seen] == [GuardError], seen
        assert "out of order" in str(seen[0].exc_value)
        g.close()
        h.close()
        return current(), open_entries()

    assert in_thread(body) == (0, 0)


@pytest.mark.strands
def test_a_plain_frame_of_a_suspended_greenlet_is_not_taken_for_a_returned_helper():
    # With greenlet loaded, a frame that is not running on this thread's stack may be a
    # suspended greenlet's: its entry is never taken by another block's exit.
    greenlet = pytest.importorskip("greenlet")

    def body():
        g = ContextGuard(0)

        def run():
            with g:
                greenlet.getcurrent().parent.switch()

        gl = greenlet.greenlet(run)
        with g:
            gl.switch()  # gl's block of g is now the innermost entry
            with pytest.raises(GuardError, match="same guard"):
                g.__exit__(None, None, None)  # main's own exit, out of order
            assert current() == g.handle and open_entries() == 1
            gl.switch()
            assert gl.dead and open_entries() == 0
            g.__enter__()  # balance the with's own exit
        g.close()
        return current(), open_entries()

    assert in_thread(body) == (0, 0)


# --- hooks and other runners -----------------------------------------------------------------


def test_blocks_in_tracer_profiler_and_gc_callbacks_nest_inside_whatever_runs():
    def body():
        g, h = ContextGuard(0), ContextGuard(D1)
        bad = []

        def check(*_):
            with h:
                if current() != h.handle:
                    bad.append("hook")

        def tracer(frame, event, arg):
            check()
            return None

        def gen():
            with g:
                yield
                yield

        def work():
            it = gen()
            next(it)
            with g:
                assert current() == g.handle
            next(it)
            with pytest.raises(StopIteration):
                next(it)
            return current()

        before = current()
        sys.settrace(tracer)
        try:
            assert work() == before
        finally:
            sys.settrace(None)
        sys.setprofile(lambda *a: check())
        try:
            assert work() == before
        finally:
            sys.setprofile(None)
        gc.callbacks.append(check)
        try:
            with g:
                gc.collect()
                assert current() == g.handle
        finally:
            gc.callbacks.remove(check)
        assert contextvars.copy_context().run(work) == before
        assert bad == []
        g.close()
        h.close()
        return current(), open_entries()

    assert in_thread(body) == (0, 0)


@pytest.mark.strands
def test_ten_thousand_generator_blocks_closed_in_random_order():
    # Every close is in order (silent) or out of order (reported, its own entry removed); the
    # innermost open block's guard is current throughout, and nothing is left at the end.
    import random

    def body():
        guards = [ContextGuard(0), ContextGuard(D1), Sub(0)]
        rng = random.Random(7)

        def gen(g):
            with g:
                yield

        before = current()
        open_ = []
        for _ in range(10000):
            g = rng.choice(guards)
            it = gen(g)
            next(it)
            open_.append((it, g))
        order = list(range(len(open_)))
        rng.shuffle(order)
        alive = set(order)
        reported = 0
        for n, k in enumerate(order):
            it, _ = open_[k]
            top = max(alive)
            try:
                it.close()
            except GuardError:
                reported += 1
                assert k != top
            alive.discard(k)
            if alive and n % 97 == 0:
                assert current() == open_[max(alive)][1].handle
        assert reported > 9000 and current() == before and open_entries() == 0
        for g in guards:
            g.close()

    in_thread(body)


# --- swallowed exceptions --------------------------------------------------------------------


def test_an_out_of_order_exit_under_cancellation_also_reports_through_unraisablehook():
    # asyncio.CancelledError ends the task; a note on it is seen only if someone looks. The
    # GuardError rides along as the note and is reported through sys.unraisablehook too.
    def body():
        g0, g1 = ContextGuard(0), ContextGuard(D1)
        caught = []

        async def hold(g, ev):
            try:
                with g:
                    ev.set()
                    await asyncio.sleep(10)
            except asyncio.CancelledError as e:
                caught.append(e)
                raise

        async def main():
            a_in, b_in = asyncio.Event(), asyncio.Event()
            ta = asyncio.ensure_future(hold(g0, a_in))
            await a_in.wait()
            tb = asyncio.ensure_future(hold(g1, b_in))
            await b_in.wait()
            ta.cancel()  # a leaves while b is open
            await asyncio.gather(ta, return_exceptions=True)
            tb.cancel()
            await asyncio.gather(tb, return_exceptions=True)

        seen = collect_unraisable(lambda: asyncio.run(main()))
        assert [type(s.exc_value) for s in seen] == [GuardError], seen
        notes = getattr(caught[0], "__notes__", [])
        assert len(notes) == 1 and "out of order" in notes[0], notes
        g0.close()
        g1.close()
        return current(), open_entries()

    assert in_thread(body) == (0, 0)


class Cancelled(BaseException):
    """A look-alike of trio's cancellation (a BaseException that is not an Exception)."""


Cancelled.__module__ = "trio"


@pytest.mark.parametrize("exc", [Cancelled, KeyboardInterrupt], ids=lambda e: e.__name__)
def test_other_base_exceptions_keep_propagating_and_the_error_is_reported(exc):
    def body():
        g0, g1 = ContextGuard(0), ContextGuard(D1)
        it = suspended_in(g0)
        with g1:

            def throw():
                with pytest.raises(exc) as ei:
                    it.throw(exc())
                notes = getattr(ei.value, "__notes__", [])
                assert len(notes) == 1 and "out of order" in notes[0], notes

            seen = collect_unraisable(throw)
            assert current() == g1.handle and open_entries() == 1
        assert [type(s.exc_value) for s in seen] == [GuardError], seen
        g0.close()
        g1.close()
        return current(), open_entries()

    assert in_thread(body) == (0, 0)


# --- frame addresses reused -------------------------------------------------------------------


@pytest.mark.strands
def test_a_returned_helpers_frame_address_reused_by_another_frame_is_still_ended():
    # A helper enters h for its caller and returns; its frame is freed, and the next frame
    # object made (a wrapper's of the exit, or one below the caller made on demand, here the
    # thread's own) may sit at its address. The helper's entry is still seen as ended and the
    # LIFO-correct exit is accepted, every time. In a fresh interpreter, so that the frames
    # below have no frame objects yet.
    out = run_child("""
        import sys, threading
        from cyctx import ContextGuard, GuardError
        g, h = ContextGuard(0), ContextGuard(D1)
        seen, bad = [], []

        def helper(x):
            seen.append(id(sys._getframe()))
            x.__enter__()

        class Inner:
            def __init__(self, g):
                self.g = g
            def __exit__(self, *exc):
                return self.g.__exit__(*exc)

        class Fwd(Inner):
            def __exit__(self, *exc):
                seen.append(id(sys._getframe()))
                return Inner(self.g).__exit__(*exc)

        def loop():
            for i in range(200):
                with h:
                    with g:
                        helper(h)
                        try:
                            Fwd(h).__exit__(None, None, None)
                        except GuardError as e:
                            bad.append(i)
                            h.__exit__(None, None, None)
                        if (drivers.current(), open_entries()) != (g.handle, 2):
                            bad.append(i)
                assert drivers.current() == 0 and open_entries() == 0

        from cyctx._guard import open_entries
        t = threading.Thread(target=loop)
        t.start()
        t.join()
        print("BAD", bad[:5])
    """)
    assert "BAD []" in out.stdout, out.stdout + out.stderr
