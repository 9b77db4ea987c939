"""Contexts that die: destroyed or reset inside a block, dead already at the enter, or destroyed
by their owner under a guard. A dead handle is never made current again."""

import warnings

import pytest
from helpers import drivers
from helpers.children import run_child
from helpers.drivers import (
    create_context,
    current,
    driver,
    handed_over,
    ok,
    reset_primary,
    second_device,
)
from helpers.threads import in_thread

from cyctx import ContextDestroyedError, ContextGuard, ContextResetWarning
from cyctx._guard import open_entries

D1 = second_device()  # device 1, or 0 on a one-GPU machine


def depth():
    """The thread's context-stack depth where it can be seen (simulated driver), else None."""
    return None if drivers.SIM is None else drivers.SIM.stack_depth()


def test_exit_never_makes_a_context_destroyed_in_the_block_current_again():
    # A guard of the caller's own context, which was current before the block; the block
    # destroys it (the driver pops it). Leaving must not hand the dead handle back.
    def body():
        d = driver()
        ctx = create_context(0)  # pushed: current, stack depth 1
        g = ContextGuard(ctx)
        g.__enter__()  # fast path: nothing switched
        ok(d.cuCtxDestroy(ctx))  # popped by the driver: nothing current
        sets = handed_over()
        with pytest.raises(ContextDestroyedError, match="did not survive") as ei:
            g.__exit__(None, None, None)
        assert handed_over() == sets
        assert "left the stack as the block left it" in str(ei.value)
        assert current() == 0 and depth() in (0, None) and open_entries() == 0
        g.close()

    in_thread(body)


def test_exit_over_a_context_destroyed_in_the_block_pops_the_switch():
    def body():
        d = driver()
        ctx = create_context(0)  # current, depth 1
        g = ContextGuard(D1)
        g.__enter__()  # replaces ctx on top of the stack
        assert current() == g.handle and depth() in (1, None)
        ok(d.cuCtxDestroy(ctx))  # not current here: only destroyed
        sets = handed_over()
        with pytest.raises(ContextDestroyedError, match="did not survive") as ei:
            g.__exit__(None, None, None)
        assert handed_over() == sets  # the dead handle was not handed over
        assert "popped its own switch" in str(ei.value) and "no context is current" in str(ei.value)
        # As if ctx had been destroyed while current: its place is popped.
        assert current() == 0 and depth() in (0, None) and open_entries() == 0
        g.close()

    in_thread(body)


def test_exit_after_the_outer_primary_was_reset_and_reactivated_in_the_block():
    # Its handle is alive again but holds another context (a new id): not what was current.
    def body():
        g0, g1 = ContextGuard(0), ContextGuard(D1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ContextResetWarning)
            with g1:
                g0.__enter__()
                reset_primary(D1)
                with g1:  # re-activates device D1's primary: a new id
                    pass
                with pytest.raises(ContextDestroyedError, match="id changed"):
                    g0.__exit__(None, None, None)
                assert current() == 0 and open_entries() == 1
                ok(driver().cuCtxPushCurrent(g1.context))  # what g1's exit will pop
        assert current() == 0 and open_entries() == 0
        g0.close()
        g1.close()

    if D1 == 0:
        pytest.skip("needs two devices (the guard's and the reset one)")
    in_thread(body)


def test_a_context_already_dead_at_the_enter_is_restored_as_it_was():
    # The classic stale handle (a reset left it current, inactive): the block did not kill it,
    # so the thread gets exactly it back, as before the block.
    def body():
        g0 = ContextGuard(0)
        g1 = ContextGuard(D1)
        ok(driver().cuCtxSetCurrent(g1.context))
        reset_primary(D1)  # g1's handle stays current, inactive
        stale = current()
        with g0:
            assert current() == g0.handle
        assert current() == stale
        ok(driver().cuCtxSetCurrent(None))
        g0.close()
        g1.close()

    if D1 == 0:
        pytest.skip("needs two devices")
    in_thread(body)


# --- on the real driver only ------------------------------------------------------------------


@pytest.mark.gpu
def test_real_enter_after_the_owner_destroyed_a_created_context():
    # cuCtxGetId with the handle of a destroyed created context: a typed error, not a crash
    # (docs/evidence.md, "A dead context answers 201 through its handle and 709 through NULL").
    out = run_child(
        """
        import cyctx
        d = drivers.driver()
        ctx = drivers.create_context(0)
        drivers.ok(d.cuCtxPopCurrent())
        g = cyctx.ContextGuard(ctx)
        drivers.ok(d.cuCtxDestroy(ctx))
        try:
            g.__enter__()
            print("ENTERED")
        except cyctx.DriverError as e:
            print("ERROR", e.code)
        print("CURRENT", drivers.current())
        g.close()
    """,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ERROR" in out.stdout and "CURRENT 0" in out.stdout, out.stdout
