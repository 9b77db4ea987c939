"""The restore rules, one rule per test: what an exit makes current again when the context
that was current before the enter was dead, unknown to the driver, or died in the block, and
what the refusal of a restore says about what is current after it."""

import warnings

import pytest
from helpers import drivers
from helpers.drivers import create_context, current, driver, ok, reset_primary, second_device
from helpers.finalizers import freed_on_purpose
from helpers.threads import in_thread

import cyctx
from cyctx import ContextDestroyedError, ContextGuard, ContextResetWarning
from cyctx._guard import open_entries

D1 = second_device()


def needs_two_devices():
    if D1 == 0:
        pytest.skip("needs two devices (the guard's and the other context's)")


def test_a_context_dead_at_the_enter_and_reactivated_in_the_block_is_restored():
    # The stale handle of a reset primary is current at the enter (its id reads 709: recorded as
    # dead, id 0). The block re-activates that primary: the same handle, alive, with a new id.
    # Dead at the enter means no id to compare: the handle the thread had is what it gets back.
    needs_two_devices()

    def body():
        g0, g1 = ContextGuard(0), ContextGuard(D1)
        ok(driver().cuCtxSetCurrent(g1.context))
        reset_primary(D1)  # g1's handle stays current, inactive
        stale = current()
        with g0:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ContextResetWarning)
                with g1:  # re-activates device D1's primary context
                    pass
            assert current() == g0.handle
        assert current() == stale == g1.handle
        assert open_entries() == 0
        ok(driver().cuCtxSetCurrent(None))
        g0.close()
        g1.close()

    in_thread(body)


@pytest.mark.parametrize(
    "code, restored",
    [(709, True), (201, False)],
    ids=["dead-at-the-enter-is-restored", "unknown-at-the-enter-is-not"],
)
def test_prev_recorded_as_dead_versus_unknown(sim, code, restored):
    # The id read of what the enter replaces answers 709 (dead: its handle is still the
    # driver's) or 201 (the driver does not know the handle). At the exit a live context answers
    # at that handle. Dead: the handle is the thread's, restored. Unknown: whatever answers there
    # now is not what was current (its context may have been freed and a new one made at the
    # same address), so it is not made current, nor handed to the driver at all.
    def body():
        ctx = create_context(0)  # current, depth 1
        g = ContextGuard(D1)
        sim.inject_fault("cuCtxGetId", code, nth=2)  # 1: the guard's own id; 2: ctx's
        g.__enter__()
        sim.clear_faults()
        assert current() == g.handle
        if restored:
            g.__exit__(None, None, None)
            assert current() == int(ctx) and sim.stack_depth() == 1
        else:
            sets = drivers.handed_over()
            with pytest.raises(ContextDestroyedError, match="did not survive.*its id changed"):
                g.__exit__(None, None, None)
            assert drivers.handed_over() == sets
            assert current() == 0 and sim.stack_depth() == 0  # the switch's place popped
            ok(driver().cuCtxPushCurrent(ctx))
        assert open_entries() == 0
        ok(driver().cuCtxDestroy(ctx))
        g.close()

    in_thread(body)


def test_a_refused_restore_after_a_switch_names_what_is_current_after_the_pop():
    # Stack [a, b], b current; the enter replaces b; the block destroys b (not current: only
    # destroyed). The exit pops its switch, which leaves a current, and its error says so: the
    # context current after the pop, not the guard's that was popped.
    def body():
        d = driver()
        a = create_context(0)
        b = create_context(0)  # pushed over a
        g = ContextGuard(D1)
        g.__enter__()
        ok(d.cuCtxDestroy(b))
        with pytest.raises(ContextDestroyedError, match="did not survive") as ei:
            g.__exit__(None, None, None)
        msg = str(ei.value)
        assert f"context 0x{int(a):x} is current" in msg, msg
        assert f"0x{g.handle:x} is current" not in msg, msg
        assert f"(0x{int(b):x})" in msg, msg  # the context that did not survive
        assert current() == int(a)
        ok(d.cuCtxDestroy(a))  # popped with it
        assert current() == 0
        g.close()

    in_thread(body)


def test_a_refused_restore_without_a_switch_names_the_context_the_block_left_current():
    # The fast path (b was the guard's own context, current at the enter); the block pushes the
    # other guard's context and destroys b under it. Nothing of the block is undone, and the
    # error names the context the block left current.
    def body():
        d = driver()
        b = create_context(0)  # current, depth 1
        g = ContextGuard(b)
        other = ContextGuard(D1)
        g.__enter__()  # nothing switched
        ok(d.cuCtxPushCurrent(other.context))
        ok(d.cuCtxDestroy(b))  # under the top: destroyed, not popped
        with pytest.raises(ContextDestroyedError, match="did not survive") as ei:
            g.__exit__(None, None, None)
        msg = str(ei.value)
        assert "left the stack as the block left it" in msg, msg
        assert f"context 0x{other.handle:x} is current" in msg, msg
        assert current() == other.handle
        ok(d.cuCtxPopCurrent())
        ok(d.cuCtxPopCurrent())  # the dead b
        assert current() == 0 and open_entries() == 0
        g.close()
        other.close()

    in_thread(body)


@pytest.mark.parametrize(
    "code, says",
    [
        (709, "cuCtxGetId: CUDA_ERROR_CONTEXT_IS_DESTROYED (709)"),
        (201, "cuCtxGetId: CUDA_ERROR_INVALID_CONTEXT (201), the driver no longer knows it"),
    ],
)
def test_a_refused_restore_says_how_the_driver_answered_for_what_was_current(sim, code, says):
    # What cuCtxGetId said of what was current, at the exit: destroyed, or not known at all.
    def body():
        ctx = create_context(0)  # current, depth 1
        g = ContextGuard(D1)
        g.__enter__()
        sim.inject_fault("cuCtxGetId", code, nth=1)  # the exit's look at ctx
        try:
            with pytest.raises(ContextDestroyedError) as ei:
                g.__exit__(None, None, None)
        finally:
            sim.clear_faults()
        assert says in str(ei.value), ei.value
        other = 201 if code == 709 else 709
        assert f"({other})" not in str(ei.value).split("did not survive")[1], ei.value
        assert current() == 0 and open_entries() == 0  # the switch's place popped
        ok(driver().cuCtxPushCurrent(ctx))
        ok(driver().cuCtxDestroy(ctx))
        g.close()

    in_thread(body)


@pytest.mark.parametrize("n, words", [(1, "1 entry of guards"), (2, "2 entries of guards")])
def test_an_exit_out_of_order_counts_the_dead_entries_it_dropped(guard, guard1, n, words):
    # Guards freed while entered above an open block of another guard: the out-of-order exit
    # of the outer guard drops them first, and says how many, in words that agree with it.
    def body():
        guard.__enter__()
        guard1.__enter__()
        with freed_on_purpose():
            for _ in range(n):
                gx = ContextGuard(0)
                gx.__enter__()
                del gx
        with pytest.raises(cyctx.GuardError) as ei:
            guard.__exit__(None, None, None)
        assert words in str(ei.value) and "freed while entered" in str(ei.value), ei.value
        guard1.__exit__(None, None, None)
        assert current() == 0 and open_entries() == 0

    in_thread(body)


def test_a_spliced_switch_still_pops_its_place_when_what_it_returns_to_died():
    # An out-of-order exit of a fast-path block (nothing switched) hands its restore to the
    # switched block above it. That block's exit still owns its switch: when what was current
    # died meanwhile, its place on the stack is popped, as cuCtxDestroy pops a current context.
    def body():
        d = driver()
        c = create_context(0)  # current, depth 1
        gc_ = ContextGuard(c)
        g1 = ContextGuard(D1)
        gc_.__enter__()  # fast path over c
        g1.__enter__()  # switches: replaces c on top
        with pytest.raises(cyctx.GuardError, match="exit out of order"):
            gc_.__exit__(None, None, None)  # its entry spliced out under g1's
        ok(d.cuCtxDestroy(c))  # not current: destroyed, not popped
        with pytest.raises(ContextDestroyedError, match="popped its own switch") as ei:
            g1.__exit__(None, None, None)
        assert "no context is current" in str(ei.value), ei.value
        assert current() == 0 and open_entries() == 0
        gc_.close()
        g1.close()

    in_thread(body)


def test_an_exit_without_an_enter_changes_nothing_not_even_dead_entries(guard, guard1):
    # A guard freed while entered leaves an entry that only an exit of a guard entered below it
    # drops. An exit of a guard that has no entry on this thread at all changes nothing.
    def body():
        guard.__enter__()
        with freed_on_purpose():
            gx = ContextGuard(0)
            gx.__enter__()
            del gx
        with pytest.raises(cyctx.GuardError, match="exit without a matching enter") as ei:
            guard1.__exit__(None, None, None)
        assert "freed while entered" not in str(ei.value), ei.value
        assert open_entries() == 2
        with pytest.warns(ResourceWarning, match="dropped 1 open entry"):
            guard.__exit__(None, None, None)  # drops the dead entry, then leaves its own
        assert current() == 0 and open_entries() == 0

    in_thread(body)


def test_the_unknown_marker_matches_no_real_context_id_not_even_the_first(sim):
    # In a fresh process the first context made has the first id. A handle the driver did not
    # know at the enter is still not taken for it at the exit.
    from helpers.children import run_child

    out = run_child("""
        import cyctx
        sim = drivers.SIM
        c = drivers.create_context(0)                 # the process's first context: current
        g = cyctx.ContextGuard(D1)
        sim.inject_fault("cuCtxGetId", 201, nth=2)    # the enter's read of c's id
        g.__enter__()
        sim.clear_faults()
        try:
            g.__exit__(None, None, None)
            print("RESTORED", drivers.current() == int(c))
        except cyctx.ContextDestroyedError as e:
            print("REFUSED", drivers.current())
        g.close()
    """)
    assert "REFUSED 0" in out.stdout, out.stdout
