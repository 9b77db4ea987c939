"""Construction's re-activation loop (simulated driver): a reset between the retain and the id
read (a 709 injected into cuCtxGetId) is re-activated a bounded number of times, and every
retain taken on the way is given back, whether the construction fails, succeeds (at close())
or the guard is collected."""

import sys
import warnings

import pytest
from helpers.drivers import current, driver, ok, reset_primary, retains_unchanged
from helpers.finalizers import freed_on_purpose

from cyctx import ContextDestroyedError, ContextGuard, ContextResetWarning, DriverError, GuardError

# The re-activations a construction tries before it gives up (the first id read, then one more
# per try): the bound the construction's error states.
TRIES = 64


def calls(sim):
    return {
        f: sim.call_count(f)
        for f in ("cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease", "cuCtxGetId")
    }


def made(sim, before):
    return {f: n - before[f] for f, n in calls(sim).items()}


def test_the_last_allowed_reactivation_still_succeeds(sim):
    # The first id read and the next TRIES - 1 reads after a re-activation all see a reset;
    # the read after the last allowed re-activation succeeds: the guard is constructed.
    with retains_unchanged() as base:
        before = calls(sim)
        sim.inject_fault("cuCtxGetId", 709, nth=1, count=TRIES)
        try:
            g = ContextGuard(0)
        finally:
            sim.clear_faults()
        n = made(sim, before)
        assert n["cuDevicePrimaryCtxRetain"] == 1 + TRIES, n
        assert n["cuDevicePrimaryCtxRelease"] == TRIES, n
        assert n["cuCtxGetId"] == 1 + TRIES, n
        assert sim.retain_count(0) == base[0] + 1  # the guard's own retain, no other
        with g:
            assert current() == g.handle
        g.close()


def test_one_reset_more_than_the_bound_gives_up_with_the_number_of_tries(sim):
    with retains_unchanged():
        before = calls(sim)
        sim.inject_fault("cuCtxGetId", 709, nth=1, count=TRIES + 1)
        try:
            with pytest.raises(ContextDestroyedError) as ei:
                ContextGuard(0)
        finally:
            sim.clear_faults()
        n = made(sim, before)
        assert n["cuCtxGetId"] == 1 + TRIES, n  # no read after the last try
        # Every retain is given back: the re-activations' and the construction's own.
        assert n["cuDevicePrimaryCtxRetain"] == 1 + TRIES, n
        assert n["cuDevicePrimaryCtxRelease"] == 1 + TRIES, n
        msg = str(ei.value)
        assert "reset again" in msg and f"re-activated ({TRIES} times)" in msg, msg
        assert "no retain is kept" in msg, msg


@pytest.mark.parametrize("given_back_by", ["close", "collection"])
def test_a_release_failing_in_the_loop_is_kept_and_given_back(sim, given_back_by):
    with retains_unchanged() as base:  # given back: by close(), or by the deallocation
        sim.inject_fault("cuCtxGetId", 709, nth=1)
        sim.inject_fault("cuDevicePrimaryCtxRelease", 999, nth=1)  # the re-activation's release
        try:
            g = ContextGuard(0)
        finally:
            sim.clear_faults()
        # The retain that could not be given back is the guard's now: counted, not lost.
        assert sim.retain_count(0) == base[0] + 2
        with g:
            pass
        assert sim.retain_count(0) == base[0] + 2
        if given_back_by == "close":
            g.close()
        else:
            with freed_on_purpose():
                del g


def test_a_failed_construction_gives_back_the_retain_whose_release_failed_in_the_loop(sim):
    # Retain (the construction's), id read: reset; re-activation: retain, release FAILS (one
    # retain more), id read: reset; re-activation: retain FAILS. The error names that retain
    # and the construction keeps nothing: the extra retain is released with its own.
    with retains_unchanged():
        sim.inject_fault("cuCtxGetId", 709, nth=1, count=2)
        sim.inject_fault("cuDevicePrimaryCtxRelease", 999, nth=1)
        sim.inject_fault("cuDevicePrimaryCtxRetain", 2, nth=3)
        try:
            with pytest.raises(DriverError) as ei:
                ContextGuard(0)
        finally:
            sim.clear_faults()
        assert ei.value.code == 2 and ei.value.call == "cuDevicePrimaryCtxRetain", ei.value
        assert "keeps" not in str(ei.value), ei.value


@pytest.mark.parametrize(
    "faults",
    [
        # The extra retain's give-back fails too (then the construction's own release succeeds).
        [("cuCtxGetId", 709, 1, 2), ("cuDevicePrimaryCtxRelease", 999, 1, 2)]
        + [("cuDevicePrimaryCtxRetain", 2, 3, 1)],
        # No extra retain: the re-activation's retain fails, then the construction's release.
        [("cuCtxGetId", 709, 1, 1), ("cuDevicePrimaryCtxRetain", 2, 2, 1)]
        + [("cuDevicePrimaryCtxRelease", 999, 1, 1)],
    ],
    ids=["extra retain", "own retain"],
)
def test_a_failed_construction_says_how_many_retains_it_could_not_give_back(sim, faults):
    # One retain is left, and the error says so (naming the release that failed, with its
    # code, not the one after it that succeeded) instead of claiming none.
    base = sim.retain_count(0)
    for func, code, nth, count in faults:
        sim.inject_fault(func, code, nth=nth, count=count)
    try:
        with pytest.raises(DriverError) as ei:
            ContextGuard(0)
    finally:
        sim.clear_faults()
    try:
        assert ei.value.code == 2 and ei.value.call == "cuDevicePrimaryCtxRetain", ei.value
        assert "keeps 1 retain(s) more" in str(ei.value), ei.value
        assert "(cuDevicePrimaryCtxRelease: 999)" in str(ei.value), ei.value
        assert sim.retain_count(0) == base + 1
    finally:
        while sim.retain_count(0) > base:  # what the error said is left, given back here
            ok(driver().cuDevicePrimaryCtxRelease(ok(driver().cuDeviceGet(0))))


def test_a_failed_construction_gives_back_every_retain_whose_release_failed_in_the_loop(sim):
    # Two re-activations whose releases fail (two retains more), then a retain that fails: the
    # failed construction gives back both extra retains and its own, not one of them.
    with retains_unchanged():
        sim.inject_fault("cuCtxGetId", 709, nth=1, count=3)
        sim.inject_fault("cuDevicePrimaryCtxRelease", 999, nth=1, count=2)
        sim.inject_fault("cuDevicePrimaryCtxRetain", 2, nth=4)
        before = calls(sim)
        try:
            with pytest.raises(DriverError) as ei:
                ContextGuard(0)
        finally:
            sim.clear_faults()
        assert ei.value.code == 2 and "keeps" not in str(ei.value), ei.value
        assert made(sim, before)["cuDevicePrimaryCtxRelease"] == 2 + 3, made(sim, before)


# --- what the enter's re-activation and a racing close() say ------------------------------------


def test_the_reset_warning_says_who_reactivated_the_context(sim):
    d = driver()
    g = ContextGuard(0)
    try:
        reset_primary(0)  # inactive: this enter re-activates it
        with pytest.warns(ContextResetWarning) as w:
            with g:
                pass
        assert "it is inactive; cyctx re-activates it" in str(w[0].message), w[0].message
        assert "someone re-activated it since" not in str(w[0].message)
        reset_primary(0)
        ok(d.cuDevicePrimaryCtxRetain(ok(d.cuDeviceGet(0))))  # someone else re-activates it
        with pytest.warns(ContextResetWarning) as w:
            with g:
                pass
        assert "someone re-activated it since" in str(w[0].message), w[0].message
        ok(d.cuDevicePrimaryCtxRelease(ok(d.cuDeviceGet(0))))
        assert g.resets == 2
    finally:
        g.close()


def during_a_failed_close(sim, g, action):
    """close() of g with its release failing; ``action()`` runs once, from a trace hook, while
    that close() builds the error in Python, still holding the guard. Returns what it returned.

    With the GIL that is the only way other code meets a close() in flight: a trace hook, a
    finalizer or a signal handler run while it builds the error of a failed release."""
    seen = []

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "driver_error" and not seen:
            sys.settrace(None)
            seen.append(action())
        return None

    sim.inject_fault("cuDevicePrimaryCtxRelease", 999)
    sys.settrace(tracer)
    try:
        with pytest.raises(DriverError):
            g.close()
    finally:
        sys.settrace(None)
        sim.clear_faults()
    assert seen, "the close() never built its error"
    return seen[0]


def test_a_close_during_a_close_says_one_is_in_flight_and_does_nothing(sim):
    g = ContextGuard(0)
    base = sim.retain_count(0)

    def close_again():
        calls = sim.call_count("cuDevicePrimaryCtxRelease")
        try:
            g.close()
            said = "closed"
        except GuardError as e:
            said = str(e)
        return said, sim.call_count("cuDevicePrimaryCtxRelease") - calls

    said, released = during_a_failed_close(sim, g, close_again)
    assert "while another thread is closing it; nothing was done" in said, said
    assert released == 0 and sim.retain_count(0) == base  # the inner close released nothing
    g.close()  # the failed close kept the guard open: this one releases its retain
    assert g.closed and sim.retain_count(0) == base - 1


def test_a_close_whose_release_of_an_extra_retain_fails_keeps_it_for_the_next_close(sim):
    with retains_unchanged() as base:
        sim.inject_fault("cuCtxGetId", 709, nth=1)
        sim.inject_fault("cuDevicePrimaryCtxRelease", 999, nth=1)
        try:
            g = ContextGuard(0)  # one retain more, from the re-activation's failed release
        finally:
            sim.clear_faults()
        assert sim.retain_count(0) == base[0] + 2
        sim.inject_fault("cuDevicePrimaryCtxRelease", 999, nth=1)  # close()'s first release
        try:
            with pytest.raises(DriverError):
                g.close()
        finally:
            sim.clear_faults()
        assert not g.closed and sim.retain_count(0) == base[0] + 2  # both still the guard's
        g.close()
        assert g.closed


def test_a_reactivation_while_a_close_holds_the_guard_is_refused(sim):
    # Code run while a failed close() builds its error enters the guard after a reset. The
    # re-activation must not go ahead under the close (it would re-open what close() releases).
    g = ContextGuard(0)
    base = sim.retain_count(0)
    reset_primary(0)

    def enter():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ContextResetWarning)
            try:
                with g:
                    return "entered"
            except GuardError as e:
                return str(e)

    said = during_a_failed_close(sim, g, enter)
    assert said != "entered", said
    assert not sim.primary_active(0) and sim.retain_count(0) == base  # not re-activated
    g.close()
    assert sim.retain_count(0) == base - 1
