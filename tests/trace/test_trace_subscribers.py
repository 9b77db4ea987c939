"""cyctx.trace() beside another CUPTI subscriber, on the simulated CUPTI: where the CUPTI has
several subscribers (13.2 and newer) the trace subscribes allowing others and both get their
callbacks; where it cannot, it records nothing, leaves the other undisturbed, and its reason
names the other where CUPTI does (cuptiSubscribe_v2, 13.0 and newer) or says that it cannot."""

import ctypes
import json

import pytest
from helpers import drivers
from helpers.lines import line_of
from helpers.simcupti import (
    CUPTI_12,
    CUPTI_13_0,
    CUPTI_13_2,
    DRIVER,
    MULTIPLE_SUBSCRIBERS,
    NO_VERSION,
    SIZE_13_0,
    SUCCESS,
    Seen,
)

import cyctx

SET_CURRENT = 303


def _subscribe_v1(cupti, seen):
    h = ctypes.c_void_p()
    r = cupti.cuptiSubscribe(ctypes.byref(h), ctypes.cast(seen.cb, ctypes.c_void_p), None)
    return r, h


def test_beside_a_subscriber_that_allows_others_both_get_every_call(cupti, d, capfd):
    other = Seen()
    r, h, _ = cupti.subscribe_v2(other.cb, "profiler", allow=True)
    assert r == SUCCESS
    try:
        assert cupti.cuptiEnableCallback(1, h, DRIVER, SET_CURRENT) == SUCCESS
        with cyctx.trace() as t:
            drivers.ok(d.cuCtxSetCurrent(None))  # beside
        assert t.reason is None and capfd.readouterr().err == ""
        (e,) = t.events
        assert e.call == "cuCtxSetCurrent" and e.where.line == line_of("beside")
        drivers.ok(d.cuCtxSetCurrent(None))
        # The other got the call made beside the trace and the one after it, entry and exit.
        assert other.ids == [(DRIVER, SET_CURRENT)] * 4
    finally:
        assert cupti.cuptiUnsubscribe(h) == SUCCESS


def test_one_that_joins_a_running_trace_is_told_its_name_and_one_alone_is_kept_out(cupti, d):
    joining, alone = Seen(), Seen()
    with cyctx.trace() as t:
        r, h, told = cupti.subscribe_v2(joining.cb, "profiler", allow=True)
        assert (r, told) == (SUCCESS, "CUPTI for cyctx.trace")
        assert _subscribe_v1(cupti, alone)[0] == MULTIPLE_SUBSCRIBERS
        try:
            assert cupti.cuptiEnableCallback(1, h, DRIVER, SET_CURRENT) == SUCCESS
            drivers.ok(d.cuCtxSetCurrent(None))
        finally:
            assert cupti.cuptiUnsubscribe(h) == SUCCESS
    assert [e.call for e in t.events] == ["cuCtxSetCurrent"]
    assert joining.ids == [(DRIVER, SET_CURRENT)] * 2 and alone.ids == []


UNDISTURBED = "it is left undisturbed"
NOT_SEVERAL = "this CUPTI (older than 13.2) allows one subscriber"


@pytest.mark.parametrize(
    "version, how, reason",
    [
        (
            CUPTI_13_2,
            "v2-alone",
            f"(CUPTI for profiler); it allows no second subscriber; {UNDISTURBED}",
        ),
        (
            CUPTI_13_2,
            "v1",
            f"(CUPTI did not name it); it allows no second subscriber; {UNDISTURBED}",
        ),
        (CUPTI_13_0, "v2-13.0", f"(CUPTI for profiler); {NOT_SEVERAL}; {UNDISTURBED}"),
        # torch's profiler with libcupti 13.0.85: a subscriber without a name.
        (CUPTI_13_0, "v1", f"(CUPTI for <not provided>); {NOT_SEVERAL}; {UNDISTURBED}"),
        (
            CUPTI_12,
            "v1",
            "(a CUPTI older than 13.0 cannot name it: a profiler such as Nsight Systems or "
            f"torch.profiler); {NOT_SEVERAL}; {UNDISTURBED}",
        ),
        (
            NO_VERSION,
            "v1",
            "(this CUPTI did not say its version, so it was not asked who); a CUPTI older than "
            f"13.2 allows one subscriber; {UNDISTURBED}",
        ),
    ],
    ids=[
        "13.2-named",
        "13.2-unnamed",
        "13.0-named",
        "13.0-unnamed",
        "12-cannot-name",
        "version-unknown",
    ],
)
def test_where_it_cannot_subscribe_it_names_the_other_if_cupti_can(
    cupti, d, capfd, version, how, reason
):
    cupti.version(version)
    other = Seen()
    if how == "v1":
        r, h = _subscribe_v1(cupti, other)
    else:
        size = SIZE_13_0 if how == "v2-13.0" else None
        r, h, _ = cupti.subscribe_v2(
            other.cb, "profiler", allow=False, **({"size": size} if size else {})
        )
    assert r == SUCCESS
    try:
        assert cupti.cuptiEnableCallback(1, h, DRIVER, SET_CURRENT) == SUCCESS
        with cyctx.trace() as t:
            drivers.ok(d.cuCtxSetCurrent(None))
        reason = f"another CUPTI subscriber holds this process {reason}"
        assert (t.active, t.events, t.reason) == (False, [], reason)
        assert capfd.readouterr().err == f"cyctx trace: not tracing: {reason}\n"
        assert t.report() == f"cyctx trace: not tracing: {reason}"
        data = json.loads(json.dumps(t.to_json()))
        assert (data["active"], data["events"], data["reason"]) == (False, [], reason)
        drivers.ok(d.cuCtxSetCurrent(None))
        assert other.ids == [(DRIVER, SET_CURRENT)] * 4  # both calls, entry and exit: still its
    finally:
        assert cupti.cuptiUnsubscribe(h) == SUCCESS
    with cyctx.trace() as t:  # once it is gone, a trace runs
        drivers.ok(d.cuCtxSetCurrent(None))
    assert t.reason is None and [e.call for e in t.events] == ["cuCtxSetCurrent"]
