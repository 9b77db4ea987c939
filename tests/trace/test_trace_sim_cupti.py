"""The simulated CUPTI (libcupti.so.13 beside the simulated driver, simcupti.c), through ctypes
as a CUPTI client would call it: callbacks enabled one id at a time, entry and exit data with
CUPTI's layout, nothing for calls not enabled; subscribers as each CUPTI version has them (one,
or several that all allow others from 13.2), a refusal naming the other where
cuptiSubscribe_v2 can. Its resource events are read through cyctx.trace() (test_trace_api.py:
the created, destroyed, reset and released-to-zero contexts, by handle)."""

import ctypes
import threading

import pytest
from helpers import drivers
from helpers.simcupti import (
    CALLBACK,
    CUPTI_12,
    CUPTI_13_0,
    CUPTI_13_2,
    DRIVER,
    INVALID_OPERATION,
    INVALID_PARAMETER,
    MULTIPLE_SUBSCRIBERS,
    NOT_SUPPORTED,
    SIZE_13_0,
    SIZE_13_2,
    SUCCESS,
    Seen,
)

CB = {  # cupti_driver_cbid.h of CUDA 13
    "cuCtxSetCurrent": 303,
    "cuCtxPushCurrent_v2": 323,
    "cuCtxPopCurrent_v2": 324,
}


class CallbackData(ctypes.Structure):  # CUpti_CallbackData
    _fields_ = [
        ("callbackSite", ctypes.c_int),
        ("functionName", ctypes.c_char_p),
        ("functionParams", ctypes.c_void_p),
        ("functionReturnValue", ctypes.c_void_p),
        ("symbolName", ctypes.c_char_p),
        ("context", ctypes.c_void_p),
        ("contextUid", ctypes.c_uint32),
        ("correlationData", ctypes.c_void_p),
        ("correlationId", ctypes.c_uint32),
    ]


class Recorder:
    def __init__(self, cupti):
        self.cupti = cupti
        self.seen = []
        self.cb = CALLBACK(self._on)
        self.handle = ctypes.c_void_p()

    def _on(self, user, domain, cbid, data):
        d = CallbackData.from_address(data)
        ret = (
            ctypes.c_int.from_address(d.functionReturnValue).value if d.callbackSite == 1 else None
        )
        first = ctypes.c_void_p.from_address(d.functionParams).value or 0
        self.seen.append(
            (
                "exit" if d.callbackSite else "enter",
                cbid,
                d.functionName.decode(),
                d.context or 0,
                ret,
                first,
            )
        )

    def __enter__(self):
        cb = ctypes.cast(self.cb, ctypes.c_void_p)
        assert self.cupti.cuptiSubscribe(ctypes.byref(self.handle), cb, None) == 0
        return self

    def enable(self, domain, cbid, on=1):
        return self.cupti.cuptiEnableCallback(on, self.handle, domain, cbid)

    def __exit__(self, *exc):
        assert self.cupti.cuptiUnsubscribe(self.handle) == SUCCESS


@pytest.mark.parametrize("version", [CUPTI_12, CUPTI_13_0, CUPTI_13_2])
def test_one_subscriber_a_second_is_refused(cupti, version):
    cupti.version(version)
    with Recorder(cupti):
        other = ctypes.c_void_p()
        cb = CALLBACK(lambda *a: None)
        r = cupti.cuptiSubscribe(ctypes.byref(other), ctypes.cast(cb, ctypes.c_void_p), None)
        assert r == MULTIPLE_SUBSCRIBERS
        assert cupti.result_name(r) == "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
        assert other.value is None
        if version >= CUPTI_13_2:  # nor one that allows others: this one does not
            r, h, name = cupti.subscribe_v2(cb, "second", allow=True)
            assert (r, h.value, name) == (MULTIPLE_SUBSCRIBERS, None, "")
    # Once unsubscribed, another may subscribe.
    with Recorder(cupti):
        pass


def test_entry_and_exit_of_an_enabled_call_with_its_data(cupti, primary):
    with Recorder(cupti) as rec:
        assert rec.enable(DRIVER, CB["cuCtxPushCurrent_v2"]) == SUCCESS
        drivers.ok(drivers.driver().cuCtxPushCurrent(primary))
        drivers.ok(drivers.driver().cuCtxPopCurrent())
    h = int(primary)
    assert rec.seen == [
        ("enter", 323, "cuCtxPushCurrent_v2", 0, None, h),
        ("exit", 323, "cuCtxPushCurrent_v2", h, 0, h),  # exit: the context current then
    ]


def test_failed_calls_report_their_result(cupti):
    with Recorder(cupti) as rec:
        rec.enable(DRIVER, CB["cuCtxPopCurrent_v2"])
        err = drivers.driver().cuCtxPopCurrent()[0]
    assert int(err) == 201
    assert [s[0] for s in rec.seen] == ["enter", "exit"]
    assert rec.seen[1][4] == 201


def test_calls_not_enabled_give_nothing_and_disable_works(cupti, primary):
    with Recorder(cupti) as rec:
        rec.enable(DRIVER, CB["cuCtxSetCurrent"])
        drivers.ok(drivers.driver().cuCtxPushCurrent(primary))  # not enabled
        drivers.ok(drivers.driver().cuCtxPopCurrent())
        assert rec.seen == []
        state = ctypes.c_uint32(7)
        assert cupti.cuptiGetCallbackState(ctypes.byref(state), rec.handle, DRIVER, 303) == 0
        assert state.value == 1
        rec.enable(DRIVER, CB["cuCtxSetCurrent"], on=0)
        drivers.ok(drivers.driver().cuCtxSetCurrent(None))
        assert rec.seen == []


@pytest.mark.parametrize(
    "domain, cbid", [(0, 303), (7, 303), (DRIVER, 0), (DRIVER, 1024), (-1, 303)]
)
def test_bad_enable_is_refused(cupti, domain, cbid):
    with Recorder(cupti) as rec:
        assert rec.enable(domain, cbid) == INVALID_PARAMETER


def test_a_foreign_handle_is_refused(cupti):
    with Recorder(cupti):
        assert cupti.cuptiEnableCallback(1, ctypes.c_void_p(8), DRIVER, 303) == INVALID_PARAMETER
        assert cupti.cuptiUnsubscribe(ctypes.c_void_p(8)) == INVALID_PARAMETER
    h = ctypes.c_void_p()
    assert cupti.cuptiSubscribe(ctypes.byref(h), None, None) == INVALID_PARAMETER


def test_unsubscribing_inside_a_callback_is_refused(cupti):
    answers = []
    rec = Recorder(cupti)
    rec.cb = CALLBACK(lambda *a: answers.append(cupti.cuptiUnsubscribe(rec.handle)))
    with rec:
        rec.enable(DRIVER, CB["cuCtxSetCurrent"])
        drivers.ok(drivers.driver().cuCtxSetCurrent(None))
    assert answers == [INVALID_OPERATION, INVALID_OPERATION]  # entry and exit


# --- several subscribers (cuptiSubscribe_v2) ----------------------------------------------------


def test_from_13_2_subscribers_that_all_allow_it_each_get_their_own_callbacks(cupti):
    a, b = Seen(), Seen()
    ra, ha, told_a = cupti.subscribe_v2(a.cb, "first", allow=True)
    assert (ra, told_a) == (SUCCESS, "")
    try:
        rb, hb, told_b = cupti.subscribe_v2(b.cb, "second", allow=True)
        # One that joins others is told the first one's name, as CUPTI names it.
        assert (rb, told_b) == (SUCCESS, "CUPTI for first")
        try:
            assert cupti.cuptiEnableCallback(1, ha, DRIVER, CB["cuCtxSetCurrent"]) == SUCCESS
            assert cupti.cuptiEnableCallback(1, hb, DRIVER, CB["cuCtxPushCurrent_v2"]) == SUCCESS
            d = drivers.driver()
            drivers.ok(d.cuCtxSetCurrent(None))
            ctx = drivers.ok(d.cuDevicePrimaryCtxRetain(0))
            drivers.ok(d.cuCtxPushCurrent(ctx))
            drivers.ok(d.cuCtxPopCurrent())
            drivers.ok(d.cuDevicePrimaryCtxRelease(0))
        finally:
            assert cupti.cuptiUnsubscribe(hb) == SUCCESS
        assert a.ids == [(DRIVER, 303)] * 2 and b.ids == [(DRIVER, 323)] * 2
        # The one left still gets its own.
        drivers.ok(drivers.driver().cuCtxSetCurrent(None))
        assert a.ids == [(DRIVER, 303)] * 4 and b.ids == [(DRIVER, 323)] * 2
    finally:
        assert cupti.cuptiUnsubscribe(ha) == SUCCESS


@pytest.mark.parametrize("first_allows", [False, True], ids=["first-alone", "second-alone"])
def test_from_13_2_one_that_allows_no_other_keeps_it_out_and_is_named(cupti, first_allows):
    a, b = Seen(), Seen()
    ra, ha, _ = cupti.subscribe_v2(a.cb, "profiler", allow=first_allows)
    assert ra == SUCCESS
    try:
        rb, hb, told = cupti.subscribe_v2(b.cb, "tracer", allow=not first_allows)
        assert (rb, hb.value, told) == (MULTIPLE_SUBSCRIBERS, None, "CUPTI for profiler")
    finally:
        assert cupti.cuptiUnsubscribe(ha) == SUCCESS


def test_13_0_takes_its_own_params_size_only_and_allows_one_subscriber(cupti):
    cupti.version(CUPTI_13_0)
    a = Seen()
    # As libcupti 13.0.85 answers: the 13.2 structure is a bad parameter there.
    assert cupti.subscribe_v2(a.cb, "tracer", allow=True)[0] == INVALID_PARAMETER
    ra, ha, _ = cupti.subscribe_v2(a.cb, "profiler", size=SIZE_13_0)
    assert ra == SUCCESS
    try:
        r, h, told = cupti.subscribe_v2(Seen().cb, "tracer", size=SIZE_13_0)
        assert (r, h.value, told) == (MULTIPLE_SUBSCRIBERS, None, "CUPTI for profiler")
    finally:
        assert cupti.cuptiUnsubscribe(ha) == SUCCESS


@pytest.mark.parametrize("version, size", [(CUPTI_13_0, SIZE_13_0), (CUPTI_13_2, SIZE_13_2)])
def test_one_that_allows_no_other_refused_by_an_unnamed_subscriber_is_told_a_placeholder(
    cupti, version, size
):
    """A cuptiSubscribe subscriber has no name: a refused request that allows no other is told
    CUPTI's placeholder, as libcupti 13.0.85 and 13.5.25 answered beside torch's profiler (one
    that allows others is told nothing: test_one_subscriber_a_second_is_refused)."""
    cupti.version(version)
    with Recorder(cupti):
        r, h, told = cupti.subscribe_v2(Seen().cb, "tracer", allow=False, size=size)
        assert (r, h.value, told) == (MULTIPLE_SUBSCRIBERS, None, "CUPTI for <not provided>")


def test_eight_subscribers_fit_and_a_slot_taken_again_starts_afresh(cupti):
    """The simulated CUPTI holds eight subscribers, a ninth is told
    CUPTI_ERROR_MAX_LIMIT_REACHED; a slot freed and taken again has none of the old
    subscriber's callbacks enabled and passes the new one's userdata."""
    got = []
    cb = CALLBACK(lambda u, dom, cbid, data: got.append(u))

    def subscribe(userdata):
        r, h, _ = cupti.subscribe_v2(cb, "s", allow=True, userdata=userdata)
        return r, h

    handles = []
    try:
        for k in range(8):
            r, h = subscribe(100 + k)
            assert r == SUCCESS, k
            handles.append(h)
        r, h = subscribe(999)
        assert (r, h.value, cupti.result_name(r)) == (12, None, "CUPTI_ERROR_MAX_LIMIT_REACHED")
        assert cupti.cuptiEnableCallback(1, handles[0], DRIVER, CB["cuCtxSetCurrent"]) == SUCCESS
        assert cupti.cuptiUnsubscribe(handles.pop(0)) == SUCCESS
        r, h = subscribe(200)  # the one free slot
        assert r == SUCCESS
        handles.append(h)
        drivers.set_current(None)
        assert got == []
        assert cupti.cuptiEnableCallback(1, h, DRIVER, CB["cuCtxSetCurrent"]) == SUCCESS
        drivers.set_current(None)
        assert got == [200, 200]  # entry and exit
    finally:
        for h in handles:
            assert cupti.cuptiUnsubscribe(h) == SUCCESS


def test_before_13_0_there_is_no_subscribe_v2(cupti):
    cupti.version(CUPTI_12)
    v = ctypes.c_uint32()
    assert cupti.cuptiGetVersion(ctypes.byref(v)) == SUCCESS and v.value == CUPTI_12
    assert cupti.subscribe_v2(Seen().cb, "tracer", size=SIZE_13_0)[0] == NOT_SUPPORTED
    assert cupti.result_name(NOT_SUPPORTED) == "CUPTI_ERROR_NOT_SUPPORTED"


def test_a_params_size_of_neither_version_is_refused(cupti):
    for size in (0, SIZE_13_0 - 8, SIZE_13_0 + 1, SIZE_13_2 + 8):
        assert cupti.subscribe_v2(Seen().cb, "tracer", size=size)[0] == INVALID_PARAMETER, size


def test_unsubscribe_waits_for_a_callback_running_on_another_thread(cupti):
    # The tracer frees its buffer once cuptiUnsubscribe returns: no callback of it may still run.
    inside, leave, order = threading.Event(), threading.Event(), []

    def on(u, dom, cbid, data):
        inside.set()
        leave.wait(5)
        order.append("callback returned")

    cb = CALLBACK(on)
    r, h, _ = cupti.subscribe_v2(cb, "slow", allow=True)
    assert r == SUCCESS
    assert cupti.cuptiEnableCallback(1, h, DRIVER, CB["cuCtxSetCurrent"]) == SUCCESS
    t = threading.Thread(target=lambda: drivers.driver().cuCtxSetCurrent(None))
    t.start()
    assert inside.wait(5)
    u = threading.Thread(target=lambda: order.append(("unsubscribed", cupti.cuptiUnsubscribe(h))))
    u.start()
    u.join(0.2)
    assert u.is_alive(), "cuptiUnsubscribe returned while a callback ran"
    leave.set()
    u.join(5)
    t.join(5)
    assert order[0] == "callback returned" and order[-1] == ("unsubscribed", SUCCESS), order
