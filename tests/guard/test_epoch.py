"""The context-lifetime epoch (ContextGuard.epoch, cyctx.context_epoch): the driver's id of the
context behind a handle now, new after a reset (same handle) and for every new context, None for
a destroyed context; every spelling of a context gives the same value; bad input is refused."""

import warnings

import pytest
from helpers.drivers import create_context, driver, ok, reset_primary
from helpers.threads import in_thread

import cyctx
from cyctx import ContextGuard, ContextResetWarning


def driver_id(handle):
    """cuCtxGetId through cuda.bindings: the driver's own answer, not cyctx's."""
    return ok(driver().cuCtxGetId(driver().CUcontext(handle)))


def test_epoch_is_the_drivers_id_in_every_spelling(guard):
    d = driver()
    e = driver_id(guard.handle)
    assert guard.epoch == e
    assert cyctx.context_epoch(guard) == e
    assert cyctx.context_epoch(guard.handle) == e
    assert cyctx.context_epoch(d.CUcontext(guard.handle)) == e
    assert cyctx.context_epoch(guard.context) == e


@pytest.mark.gpu  # the simulated driver has no streams
def test_a_stream_gives_its_contexts_epoch(guard):
    d = driver()
    with guard:
        stream = ok(d.cuStreamCreate(0))
    try:
        seen = (cyctx.context_epoch(stream), guard.epoch, driver_id(guard.handle))
        assert seen[0] == seen[1] == seen[2], seen
    finally:
        with guard:
            ok(d.cuStreamDestroy(stream))


def test_reset_keeps_the_handle_and_changes_the_epoch():
    g = ContextGuard(0)
    try:
        before, handle = g.epoch, g.handle
        reset_primary(0)
        # Destroyed until re-activated: None, through the guard and through the raw handle.
        assert g.epoch is None and cyctx.context_epoch(handle) is None
        with pytest.warns(ContextResetWarning):
            with g:
                pass
        assert g.handle == handle, "the driver reuses the handle"
        after = g.epoch
        assert after is not None and after != before and after == driver_id(handle)
        assert cyctx.context_epoch(handle) == after
    finally:
        g.close()


def test_a_destroyed_context_is_none_and_new_contexts_never_repeat_an_epoch():
    d = driver()
    seen = set()
    for _ in range(8):
        ctx = create_context(0, current=False)
        e = cyctx.context_epoch(ctx)
        assert e is not None and e == driver_id(int(ctx)) and e not in seen
        seen.add(e)
        ok(d.cuCtxDestroy(ctx))
        assert cyctx.context_epoch(ctx) is None
        assert cyctx.context_epoch(int(ctx)) is None  # again: asking changes nothing


def test_epoch_is_read_now_not_remembered(guard):
    # context_id is what enter last saw; epoch asks the driver at each read.
    reset_primary(0)
    assert guard.context_id is not None and guard.epoch is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContextResetWarning)
        with guard:
            pass
    assert guard.epoch == guard.context_id == driver_id(guard.handle)


def test_closed_guard_is_a_guard_error():
    g = ContextGuard(0)
    g.close()
    with pytest.raises(cyctx.GuardError):
        _ = g.epoch
    with pytest.raises(cyctx.GuardError):
        cyctx.context_epoch(g)


@pytest.mark.parametrize(
    "bad, error, words",
    [
        (None, TypeError, "takes a context"),
        (True, TypeError, "takes a context"),
        (1.5, TypeError, "context_epoch takes a context"),
        ("0x1", TypeError, "context_epoch takes a context"),
        (object(), TypeError, "context_epoch takes a context"),
        (0, ValueError, "NULL"),
        (-1, ValueError, "out of range"),
        (2**64, ValueError, "out of range"),
    ],
    ids=["None", "True", "float", "str", "object", "NULL", "negative", "2**64"],
)
def test_bad_input_is_refused_in_cyctxs_words(sim, bad, error, words):
    calls = sim.call_count("cuCtxGetId")
    with pytest.raises(error, match=words):
        cyctx.context_epoch(bad)
    assert sim.call_count("cuCtxGetId") == calls, "refused before any driver call"


def test_a_device_is_not_a_context():
    d = driver()
    with pytest.raises(TypeError, match=r"shared\(device\)\.epoch"):
        cyctx.context_epoch(ok(d.cuDeviceGet(0)))


@pytest.mark.parametrize("code", [999, 201, 4])
def test_other_driver_failures_are_raised_not_taken_for_dead(sim, guard, code):
    sim.inject_fault("cuCtxGetId", code)
    try:
        with pytest.raises(cyctx.DriverError) as e:
            cyctx.context_epoch(guard.handle)
    finally:
        sim.clear_faults()
    assert e.value.code == code and e.value.call == "cuCtxGetId"
    assert guard.epoch == driver_id(guard.handle)


def test_epoch_in_a_forked_child_is_a_fork_error(guard):
    from helpers.forking import run_forked

    h = guard.handle

    def child():
        try:
            cyctx.context_epoch(h)
        except cyctx.ForkError as e:
            return "ForkError" + str("spawn" in str(e))
        return "no-error"

    assert run_forked(child) == "ForkErrorTrue"


def test_epoch_from_another_thread_is_the_same(guard):
    assert in_thread(lambda: cyctx.context_epoch(guard.handle)) == guard.epoch
