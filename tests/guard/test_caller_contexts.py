"""A guard of the caller's own context (cuCtxCreate) takes no retain of the device's primary
context: not to compare, not when it is collected; and a NULL handle is no context at all."""

import gc

import pytest
from helpers.drivers import create_context, current, driver, ok
from helpers.threads import in_thread

from cyctx import ContextGuard


def test_a_guard_of_a_created_context_collected_without_close_releases_no_primary(sim):
    def body():
        holder = ContextGuard(0)  # the primary context is active, with one retain
        base = sim.retain_count(0)
        ctx = create_context(0, current=False)
        g = ContextGuard(ctx)
        assert not g.is_primary and sim.retain_count(0) == base
        del g  # no close(): it had no retain of its own to give back
        gc.collect()
        assert sim.retain_count(0) == base and sim.primary_active(0)
        ok(driver().cuCtxDestroy(ctx))
        holder.close()

    in_thread(body)


def test_a_guard_of_a_created_context_does_not_activate_an_inactive_primary(sim):
    dev = next((i for i in range(sim.device_count) if not sim.primary_active(i)), None)
    if dev is None:
        pytest.skip("every device's primary context is active in this process")

    def body():
        ctx = create_context(dev, current=False)
        retains = sim.call_count("cuDevicePrimaryCtxRetain")
        g = ContextGuard(ctx)
        # Only an active primary can be this context: an inactive one is not even retained
        # to compare (that would create a context nobody asked for).
        assert sim.call_count("cuDevicePrimaryCtxRetain") == retains
        assert not g.is_primary and not sim.primary_active(dev) and sim.retain_count(dev) == 0
        g.close()
        ok(driver().cuCtxDestroy(ctx))

    in_thread(body)


def test_a_null_context_handle_is_refused_whatever_is_current(sim):
    # The driver reads a NULL context as "the current one": a guard must not silently become
    # a guard of whatever happens to be current.
    from cuda.bindings.driver import CUcontext

    def body():
        g0 = ContextGuard(0)
        for start in (None, g0.context):
            ok(driver().cuCtxSetCurrent(start))
            ids = sim.call_count("cuCtxGetId")
            for make in (lambda: ContextGuard(CUcontext(0)), lambda: ContextGuard.from_handle(0)):
                with pytest.raises(ValueError, match="the context handle is NULL"):
                    make()
            assert sim.call_count("cuCtxGetId") == ids  # the driver never asked about NULL
        ok(driver().cuCtxSetCurrent(None))
        assert current() == 0
        g0.close()

    in_thread(body)
