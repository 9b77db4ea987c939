"""Construction: what a new guard holds (a retain of the device's primary context, its handle
and id), what a subclass may change, and construction from contexts on the real driver."""

import pytest
from helpers.children import run_child
from helpers.drivers import current, driver, ok, primary_state, retains
from helpers.finalizers import freed_on_purpose
from helpers.threads import in_thread

from cyctx import ContextGuard


def test_construct_retains_and_activates(guard):
    flags, active = primary_state(0)
    assert active, "the guard's retain must activate the primary context"
    assert guard.device == 0 and not guard.closed
    assert guard.handle != 0
    assert int(guard.context) == guard.handle
    assert guard.context_id == ok(driver().cuCtxGetId(guard.context))
    assert "device=0" in repr(guard) and "closed" not in repr(guard)


def test_handle_is_the_primary_context(guard):
    d = driver()
    ctx = ok(d.cuDevicePrimaryCtxRetain(ok(d.cuDeviceGet(0))))
    try:
        assert int(ctx) == guard.handle
    finally:
        ok(d.cuDevicePrimaryCtxRelease(ok(d.cuDeviceGet(0))))


def test_retain_balance_counted(sim):
    before = sim.retain_count(0)
    g = ContextGuard(0)
    assert sim.retain_count(0) == before + 1
    with g:
        with g:
            assert sim.retain_count(0) == before + 1, "entering must not retain"
    g.close()
    assert sim.retain_count(0) == before
    g.close()  # idempotent: no second release
    assert sim.retain_count(0) == before
    assert g.closed and "closed" in repr(g)


def test_retain_balance_real_driver_in_fresh_process():
    # A fresh process so nothing else holds the primary context: after close it is inactive.
    out = run_child("""
        import cyctx
        g = cyctx.ContextGuard(0)
        a = drivers.primary_state(0)[1]
        for _ in range(1000):
            with g:
                pass
        b = drivers.primary_state(0)[1]
        g.close()
        c = drivers.primary_state(0)[1]
        print(a, b, c)
    """)
    assert out.stdout.split() == ["True", "True", "False"]


def test_construction_helpers_are_not_methods():
    # They would re-initialise a live guard (and leak its retain) if Python could call them.
    for name in ("_init_primary", "_init_context"):
        assert not hasattr(ContextGuard, name)
    # Nor can Python hand the driver an arbitrary integer as a stream or green context handle:
    # resolving one is part of construction, after the input was recognised.
    import cyctx._guard

    for name in ("_context_of", "_stream_context", "_green_context"):
        assert not hasattr(cyctx._guard, name), name


# --- subclasses -------------------------------------------------------------------------------


def test_subclass_works_and_releases(sim):
    base = retains()[0]  # less the retain the process keeps for a collected guard

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
        with freed_on_purpose():
            del g, x

    in_thread(body)
    assert retains()[0] == base


# --- before the first construction ------------------------------------------------------------


def test_current_handle_before_cuInit_is_zero_not_an_error():
    # Found by the adversarial pass: a thread calling current_handle() while another thread
    # constructs the first guard got NotInitializedError or 0 depending on timing.
    out = run_child(
        """
        import cyctx
        from helpers.forking import raised_in_fork
        print("FIRST", cyctx.current_handle())
        g = cyctx.ContextGuard(0)
        with g:
            print("INSIDE", cyctx.current_handle() == g.handle)
        print("CHILD", raised_in_fork(cyctx.current_handle))
        g.close()
    """,
        init=False,
    )
    assert (
        "FIRST 0" in out.stdout and "INSIDE True" in out.stdout and "CHILD ForkError" in out.stdout
    ), out.stdout


# --- on the real driver only ------------------------------------------------------------------


@pytest.mark.gpu
def test_real_construct_from_contexts_keeps_the_stack():
    # The device probe pushes and pops (or, when the context is current, does neither): count
    # the stack by popping it empty afterwards.
    out = run_child(
        """
        import cyctx
        d = drivers.driver()
        holder = cyctx.ContextGuard(0)
        ctx = drivers.create_context(0)                  # pushed: depth 1
        drivers.ok(d.cuCtxPushCurrent(holder.context))   # depth 2, primary on top
        a = cyctx.ContextGuard(ctx)                   # probe push/pop
        b = cyctx.ContextGuard(holder.context)        # current: no push
        c = cyctx.ContextGuard.from_handle(int(ctx))
        print("TOP", drivers.current() == holder.handle, "PRIMARY", a.is_primary, b.is_primary, c.is_primary)
        n = 0
        while drivers.current():
            drivers.ok(d.cuCtxPopCurrent()); n += 1
        print("DEPTH", n)
        for g in (a, b, c, holder):
            g.close()
        drivers.ok(d.cuCtxDestroy(ctx))
    """,
        timeout=120,
    )
    assert "TOP True PRIMARY False True False" in out.stdout and "DEPTH 2" in out.stdout, out.stdout


@pytest.mark.parametrize("below", ["nothing", "primary"])
def test_construction_from_a_context_not_current_leaves_the_stack_as_it_was(below):
    # Construction pushes the context briefly to read its device; the thread's stack after it
    # is the stack before it, whatever was current (nothing, or another context).
    from helpers.drivers import create_context

    def body():
        d = driver()
        holder = ContextGuard(0)
        ctx = create_context(0, current=False)
        if below == "primary":
            ok(d.cuCtxPushCurrent(holder.context))
        before = current()
        g = ContextGuard(ctx)
        try:
            assert current() == before
            if below == "primary":
                assert int(ok(d.cuCtxPopCurrent())) == holder.handle
            assert current() == 0  # nothing else was left pushed below
        finally:
            g.close()
            ok(d.cuCtxDestroy(ctx))
            holder.close()

    in_thread(body)
