"""Blocks left late or out of order (generators, coroutines, ExitStack, tasks): the exit is
reported, removes its own entry and hands its restore on."""

import asyncio
import gc
from contextlib import ExitStack

import pytest
from helpers.children import run_child
from helpers.drivers import current, driver, ok, retains_unchanged, second_device
from helpers.finalizers import collect_unraisable, freed_on_purpose, suspended_in
from helpers.threads import in_thread

from cyctx import ContextGuard, GuardError
from cyctx._guard import open_entries

D1 = second_device()  # device 1, or 0 on a one-GPU machine


def test_generators_interleaving_detected(guard, guard1):
    def gen(g):
        with g:
            yield current()
            yield current()

    def body():
        before = current()
        a, b = gen(guard), gen(guard1)
        assert next(a) == guard.handle
        assert next(b) == guard1.handle
        with pytest.raises(GuardError, match="out of order") as ei:
            next(a)
            next(a)  # a's block is left while b's is still open
        assert "removed" in str(ei.value)
        # a's entry is gone and b keeps its context; b's block now restores what was current
        # before a's.
        assert current() == guard1.handle and open_entries() == 1
        with pytest.raises(StopIteration):
            next(b)
            next(b)
        return before, current(), open_entries()

    before, after, left = in_thread(body)
    assert after == before and left == 0


def _suspended_coroutine(g):
    class Never:
        def __await__(self):
            yield

    async def coro():
        with g:
            await Never()

    c = coro()
    c.send(None)  # suspended inside g's block
    return c


@pytest.mark.parametrize("suspend", [suspended_in, _suspended_coroutine], ids=["gen", "coro"])
def test_abandoned_inside_a_guard_collected_under_another_guard(sim, suspend):
    with retains_unchanged():

        def body():
            g0, g1 = ContextGuard(0), ContextGuard(D1)
            holder = [suspend(g0)]
            g1.__enter__()
            # The last reference: the finalizer runs.
            seen = collect_unraisable(lambda: (holder.clear(), gc.collect()))
            # The late exit is reported (not swallowed with the GeneratorExit) ...
            assert len(seen) == 1 and isinstance(seen[0].exc_value, GuardError), seen
            assert "generator" in str(seen[0].exc_value)
            # ... its entry is gone, and the open guard still sees its own context current.
            assert open_entries() == 1 and current() == g1.handle
            g1.__exit__(None, None, None)
            # Leaving g1 restores what was current before g0's block, not g0's context.
            assert current() == 0 and open_entries() == 0
            g0.close()
            g1.close()

        in_thread(body)


def test_late_exit_hands_its_restore_to_the_entry_just_above_it():
    # A generator's block of g0, then g1, then h (another guard of device 0); the generator is
    # closed late. Its restore (back to no context) goes to g1's entry, the one just above it,
    # not to the innermost: every block left afterwards restores what it should.
    def body():
        g0, g1, h = ContextGuard(0), ContextGuard(D1), ContextGuard(0)
        seen = []
        it = suspended_in(g0)
        with g1:
            with h:
                with pytest.raises(GuardError, match="generator"):
                    it.close()
                seen.append(current() == h.handle)
            seen.append(current() == g1.handle)  # leaving h: back to g1
        seen.append(current() == 0)  # leaving g1: what was before the generator's block
        for g in (g0, g1, h):
            g.close()
        return seen, open_entries()

    assert in_thread(body) == ([True, True, True], 0)


def test_late_exit_spliced_into_a_fast_path_entry_keeps_the_leaked_push_check(sim):
    # The generator's block pushed onto an empty stack; the block above it (another guard of
    # the same context) entered on the fast path. Spliced, that block now owns the "pop back
    # to empty" restore, and with it the check for pushes its own body leaked.
    d = driver()

    def body():
        g0, g1, h = ContextGuard(0), ContextGuard(D1), ContextGuard(0)
        it = suspended_in(g0)
        with pytest.raises(GuardError, match="pushed 1 context"):
            with h:
                with pytest.raises(GuardError, match="generator"):
                    it.close()
                ok(d.cuCtxPushCurrent(g1.context))
        state = (current(), sim.stack_depth(), open_entries())
        for g in (g0, g1, h):
            g.close()
        return state

    assert in_thread(body) == (0, 0, 0)


@pytest.mark.strands
def test_late_generator_exit_under_deep_nesting_is_spliced(sim):
    # The spliced entry is deep (the heap spill), with 40 entries above it.
    with retains_unchanged():

        def body():
            g0, g1 = ContextGuard(0), ContextGuard(D1)
            for _ in range(5):
                g1.__enter__()
            it = suspended_in(g0)
            for _ in range(40):
                g1.__enter__()
            with pytest.raises(GuardError, match="generator"):
                it.close()
            assert open_entries() == 45 and current() == g1.handle
            for _ in range(45):
                g1.__exit__(None, None, None)
            g0.close()
            g1.close()
            return current()

        assert in_thread(body) == 0


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
        return open_entries()

    assert in_thread(body) == 0


def test_generator_closed_on_another_thread_raises_and_keeps_the_entering_threads_entry():
    # Documented limit: the guard cannot reach another thread's entries. The close is not
    # silent: a GuardError raised while GeneratorExit propagates must not end up as a mere note
    # on the GeneratorExit, where it is lost.
    g0 = ContextGuard(0)

    def gen():
        with g0:
            yield

    it = gen()

    def body():
        next(it)
        with pytest.raises(GuardError, match="without a matching enter"):
            in_thread(it.close)
        left = open_entries()
        g0.__exit__(None, None, None)  # the entering thread leaves its entry itself
        return left, current()

    left, cur = in_thread(body)
    assert left == 1 and cur == 0
    g0.close()


def test_generator_finalized_in_order_is_quiet():
    def body():
        g0 = ContextGuard(0)

        holder = [suspended_in(g0)]
        seen = collect_unraisable(holder.clear)
        assert seen == [] and current() == 0
        g0.close()

    in_thread(body)


def test_generator_exit_that_drops_dead_entries_warns_as_exit_does():
    def body():
        g = ContextGuard(0)
        it = suspended_in(g)
        with freed_on_purpose():
            ContextGuard(D1).__enter__()  # freed while entered: a dead entry above g's
        with pytest.warns(ResourceWarning, match="freed while entered"):
            it.close()
        assert open_entries() == 0 and current() == 0
        g.close()

    in_thread(body)


# --- two open blocks of the same guard on one thread ------------------------------------------


def test_same_guard_generator_closed_inside_the_callers_block_removes_its_own_entry():
    def body():
        g, other = ContextGuard(0), ContextGuard(D1)
        with other:  # what was current before the generator's block
            it = suspended_in(g)  # entry A: the generator's block, g current
            with g:  # entry B: the caller's block, fast path over A
                with pytest.raises(GuardError, match="generator"):
                    it.close()  # A is the late one: A goes, B stays
                assert open_entries() == 2 and current() == g.handle
            # Leaving B restores what was current before A: other's context.
            assert open_entries() == 1 and current() == other.handle
        assert open_entries() == 0 and current() == 0
        g.close()  # nothing of g is left open on this thread
        other.close()

    in_thread(body)


def test_same_guard_generator_collected_inside_another_block_of_it():
    def body():
        g = ContextGuard(0)
        holder = [suspended_in(g)]
        with g:
            seen = collect_unraisable(lambda: (holder.clear(), gc.collect()))
            assert len(seen) == 1 and isinstance(seen[0].exc_value, GuardError), seen
            assert open_entries() == 1 and current() == g.handle
        assert open_entries() == 0 and current() == 0
        g.close()

    with retains_unchanged():
        in_thread(body)


def test_same_guard_generators_closed_in_entry_order_each_take_their_own():
    def body():
        g, other = ContextGuard(0), ContextGuard(D1)
        a = suspended_in(g)  # entered from no context: leaving it restores none
        with other:
            b = suspended_in(g)  # entered over other's context
            with pytest.raises(GuardError, match="generator"):
                a.close()  # a lies below: spliced out, its duty handed to other's block
            assert current() == g.handle and open_entries() == 2
            b.close()  # b is on top: its own exit restores other's context
            assert current() == other.handle and open_entries() == 1
        # other's block inherited a's duty: leaving it restores no context.
        assert current() == 0 and open_entries() == 0
        g.close()
        other.close()

    in_thread(body)


# --- blocks left out of order, by Python's own exit -------------------------------------------
# Python calls a block's __exit__ once: an entry it leaves behind could never be left again. So
# an out-of-order exit removes its entry from under the open block and hands that block its
# restore, as the late generator exit does, and reports GuardError.


def test_exitstack_leaving_the_outer_guard_first_hands_its_restore_to_the_inner_block():
    with retains_unchanged():

        def body():
            g0, g1 = ContextGuard(0), ContextGuard(D1)
            before = current()
            outer, inner = ExitStack(), ExitStack()
            outer.enter_context(g0)
            inner.enter_context(g1)
            with pytest.raises(GuardError, match="out of order") as ei:
                outer.close()  # g0's block left while g1's is open
            assert "removed" in str(ei.value)
            # g1's block keeps its context; only g0's entry is gone.
            assert current() == g1.handle and open_entries() == 1
            inner.close()  # restores what was current before g0's block
            assert current() == before and open_entries() == 0
            g0.close()
            g1.close()
            return current()

        assert in_thread(body) == 0


def test_exception_thrown_into_a_block_left_out_of_order_carries_the_note_and_removes_the_entry():
    # The block's exception wins; the out-of-order exit rides along as a note, and its entry is
    # removed all the same.
    def body():
        g0, g1 = ContextGuard(0), ContextGuard(D1)
        it = suspended_in(g0)
        with g1:
            boom, caught = ValueError("boom"), []
            seen = collect_unraisable(
                lambda: caught.append(pytest.raises(ValueError, it.throw, boom))
            )
            assert caught[0].value is boom and seen == []  # only noted, not reported unraisable
            notes = getattr(boom, "__notes__", [])
            assert len(notes) == 1 and "GuardError" in notes[0], notes
            assert "out of order" in notes[0] and "removed" in notes[0], notes
            assert current() == g1.handle and open_entries() == 1
        # g1's block restored what was current before g0's.
        assert current() == 0 and open_entries() == 0
        g0.close()
        g1.close()

    in_thread(body)


# --- coroutines and asyncio -------------------------------------------------------------------


def test_coroutine_holding_a_guard_across_await_interleaved():
    import asyncio

    def body():
        g0, g1 = ContextGuard(0), ContextGuard(D1)
        errors = []

        async def hold(g, ev_in, ev_out):
            try:
                with g:
                    ev_in.set()
                    await ev_out.wait()
            except GuardError as e:
                errors.append(e)

        async def main():
            a_in, a_out, b_in, b_out = (asyncio.Event() for _ in range(4))
            ta = asyncio.ensure_future(hold(g0, a_in, a_out))
            await a_in.wait()
            tb = asyncio.ensure_future(hold(g1, b_in, b_out))
            await b_in.wait()
            a_out.set()  # a leaves while b is open: out of order
            await ta
            b_out.set()
            await tb

        asyncio.run(main())
        # a's out-of-order exit removed its entry and b's restored what was before a's block:
        # nothing is left open, so both guards close.
        left = open_entries()
        g0.close()
        g1.close()
        return len(errors), left, current()

    n, left, cur = in_thread(body)
    assert n == 1 and left == 0 and cur == 0


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
        return current(), open_entries()

    assert in_thread(body) == (0, 0)
    g0.close()
    g1.close()


# --- on the real driver only ------------------------------------------------------------------


@pytest.mark.gpu
def test_real_generator_late_exit_and_orphan_drop():
    out = run_child(
        """
        import gc, sys, warnings, cyctx
        from cyctx._guard import open_entries
        n = drivers.device_count()
        g0, g1 = cyctx.ContextGuard(0), cyctx.ContextGuard(1 % n)
        def gen():
            with g0:
                yield
        it = gen(); next(it)
        seen = []
        sys.unraisablehook = seen.append
        with g1:
            h = [it]; del it; h.clear(); gc.collect()
            cyctx.ContextGuard(0).__enter__(); gc.collect()   # an orphan above g1's entry
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                pass
        print("SEEN", len(seen), type(seen[0].exc_value).__name__)
        print("STATE", drivers.current(), open_entries())
        g0.close(); g1.close()
    """,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "SEEN 1 GuardError" in out.stdout and "STATE 0 0" in out.stdout, out.stdout


def test_late_exit_splices_its_own_entry_not_the_guards_innermost():
    # Two generators hold blocks of the same guard g, each under a block of h. The first
    # generator's late exit must remove its own (deepest) entry, not g's innermost one (the
    # second generator's), or the blocks above restore the wrong contexts.
    if D1 == 0:
        pytest.skip("needs two devices: g's and h's contexts must differ")

    def body():
        g, h = ContextGuard(0), ContextGuard(D1)
        a = suspended_in(g)  # a's block: from no context
        with h:  # over g
            b = suspended_in(g)  # b's block: over h
            with h:  # over g
                with pytest.raises(GuardError, match="generator"):
                    a.close()  # a's entry goes; its duty passes to the outer h
                assert current() == h.handle
            assert current() == g.handle  # the inner h restored b's block's context
            b.close()  # b's block, in order: back to h
            assert current() == h.handle
        assert current() == 0 and open_entries() == 0  # a's duty: no context
        g.close()
        h.close()

    in_thread(body)
