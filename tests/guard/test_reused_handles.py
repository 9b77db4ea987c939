"""A destroyed context's handle given to a new context (the simulator's handle reuse): cyctx
tells the new context from the old by its id, never by the handle."""

import pytest
from helpers.children import run_child
from helpers.drivers import create_context, current, driver, handed_over, ok, second_device
from helpers.threads import in_thread

import cyctx
from cyctx import ContextDestroyedError, ContextGuard
from cyctx._guard import open_entries

D1 = second_device()


def _replace(ctx, dev=D1):
    """Destroy ``ctx`` (not current anywhere) and make a new context, not current, that the
    driver puts at the same handle: the new context."""
    ok(driver().cuCtxDestroy(ctx))
    new = create_context(dev, current=False)
    assert int(new) == int(ctx), "the simulator did not reuse the handle"
    return new


def test_a_bound_function_refuses_the_new_context_at_its_contexts_handle(sim):
    # In a process of its own: binding a context may build its device's shared guard, whose
    # retain lasts for the process (tests/guard/test_bind.py).
    out = run_child(
        """
        import pytest, cyctx
        from helpers.drivers import create_context, current, driver, handed_over, ok
        from helpers.threads import in_thread
        sim, d = drivers.SIM, driver()
        sim.reuse_handles(True)
        ctx = create_context(0)  # current: what bind binds
        ran = []
        f = cyctx.bind(lambda: ran.append(current()))
        ok(d.cuCtxPopCurrent())
        f()
        assert ran == [int(ctx)]
        ok(d.cuCtxDestroy(ctx))
        new = create_context(D1, current=False)
        assert int(new) == int(ctx), "the simulator did not reuse the handle"
        sets = handed_over()
        for call in (f, lambda: in_thread(f)):  # on this thread, and on a pool's worker
            with pytest.raises(cyctx.ContextDestroyedError, match="destroyed since bind"):
                call()
        assert ran == [int(ctx)], "the body ran in the new context"
        assert handed_over() == sets and current() == 0 and sim.stack_depth() == 0
        print("REFUSED")
        """
    )
    assert "REFUSED" in out.stdout, out


@pytest.mark.parametrize("build", ["ContextGuard(ctx)", "ContextGuard.from_handle"])
def test_a_guard_of_a_created_context_refuses_the_new_one(reuse, build):
    def body():
        ctx = create_context(0, current=False)
        g = (
            ContextGuard(ctx)
            if build == "ContextGuard(ctx)"
            else ContextGuard.from_handle(int(ctx))
        )
        with g:
            assert current() == int(ctx)
        new = _replace(ctx)
        sets = handed_over()
        with pytest.raises(ContextDestroyedError, match="destroyed by its owner"):
            with g:
                pytest.fail("the block ran in the new context")
        assert handed_over() == sets and current() == 0 and open_entries() == 0
        # Its epoch is the new context's, never the id the guard knew.
        assert g.epoch == ok(driver().cuCtxGetId(new)) != g.context_id
        g.close()
        ok(driver().cuCtxDestroy(new))

    in_thread(body)


def test_a_blocks_exit_does_not_restore_the_new_context_in_place_of_the_old(reuse):
    # What was current before the block is destroyed inside it, and a new context takes its
    # handle: the exit must not make the new one current as if it were what it replaced.
    def body():
        d = driver()
        ctx = create_context(0)  # current, depth 1
        g = ContextGuard(D1)
        g.__enter__()  # replaces ctx on top of the stack
        ok(d.cuCtxDestroy(ctx))
        new = create_context(0)  # pushed above the guard's context, at ctx's handle
        assert int(new) == int(ctx)
        ok(d.cuCtxPopCurrent())
        sets = handed_over()
        with pytest.raises(ContextDestroyedError, match="its id changed"):
            g.__exit__(None, None, None)
        assert handed_over() == sets
        assert current() == 0 and reuse.stack_depth() == 0 and open_entries() == 0
        ok(d.cuCtxDestroy(new))
        g.close()

    in_thread(body)


def test_the_epoch_of_a_reused_handle_is_the_new_contexts(reuse):
    d = driver()
    ctx = create_context(0, current=False)
    old = cyctx.context_epoch(int(ctx))
    assert old == ok(d.cuCtxGetId(ctx))
    cache = {old: "module loaded in the old context"}
    ok(d.cuCtxDestroy(ctx))
    assert cyctx.context_epoch(int(ctx)) is None
    new = create_context(0, current=False)
    try:
        assert int(new) == int(ctx)
        now = cyctx.context_epoch(int(ctx))
        assert now == ok(d.cuCtxGetId(new)) and now != old
        assert cyctx.context_epoch(new) == now  # the context object, as the handle
        assert now not in cache
    finally:
        ok(d.cuCtxDestroy(new))


def test_without_reuse_the_same_calls_meet_a_dead_handle(sim):
    # The control: the refusals above are the id's doing, whether or not the handle is reused.
    def body():
        ctx = create_context(0, current=False)
        g = ContextGuard(ctx)
        ok(driver().cuCtxDestroy(ctx))
        new = create_context(0, current=False)
        assert int(new) != int(ctx)
        with pytest.raises(ContextDestroyedError, match="destroyed by its owner"):
            g.__enter__()
        assert cyctx.context_epoch(int(ctx)) is None and g.epoch is None
        g.close()
        ok(driver().cuCtxDestroy(new))

    assert not sim.reuse_handles(False)
    in_thread(body)
