"""The simulated driver's CUPTI subscriber surface (simdriver.h, "Callbacks"), through ctypes as
a CUPTI client would call it: one subscriber, callbacks enabled one id at a time, entry and exit
data with CUPTI's layouts, resource events, nothing for calls not enabled."""

import ctypes

import pytest
from helpers import drivers

SUCCESS, INVALID_PARAMETER, MULTIPLE_SUBSCRIBERS = 0, 1, 39
DRIVER, RUNTIME, RESOURCE = 1, 2, 3
CB = {  # cupti_driver_cbid.h of CUDA 13
    "cuCtxSetCurrent": 303,
    "cuCtxPushCurrent_v2": 323,
    "cuCtxPopCurrent_v2": 324,
    "cuDevicePrimaryCtxRetain": 386,
    "cuDevicePrimaryCtxRelease_v2": 544,
    "cuDevicePrimaryCtxReset_v2": 545,
    "cuCtxCreate_v4": 757,
    "cuCtxDestroy_v2": 322,
}
CREATED, DESTROY_STARTING = 1, 2


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


class ResourceData(ctypes.Structure):  # CUpti_ResourceData
    _fields_ = [
        ("context", ctypes.c_void_p),
        ("stream", ctypes.c_void_p),
        ("descriptor", ctypes.c_void_p),
    ]


CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)


@pytest.fixture
def lib(sim):
    lib = sim._lib
    lib.cyctxsim_cuptiSubscribe.argtypes = [
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    lib.cyctxsim_cuptiUnsubscribe.argtypes = [ctypes.c_void_p]
    lib.cyctxsim_cuptiEnableCallback.argtypes = [
        ctypes.c_uint32,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_uint32,
    ]
    lib.cyctxsim_cuptiGetCallbackState.argtypes = [
        ctypes.POINTER(ctypes.c_uint32),
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_uint32,
    ]
    lib.cyctxsim_cuptiGetResultString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


class Recorder:
    def __init__(self, lib):
        self.lib = lib
        self.seen = []
        self.cb = CALLBACK(self._on)
        self.handle = ctypes.c_void_p()

    def _on(self, user, domain, cbid, data):
        if domain == RESOURCE:
            r = ResourceData.from_address(data)
            self.seen.append(("resource", cbid, r.context or 0))
        else:
            d = CallbackData.from_address(data)
            ret = (
                ctypes.c_int.from_address(d.functionReturnValue).value
                if d.callbackSite == 1
                else None
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
        assert (
            self.lib.cyctxsim_cuptiSubscribe(
                ctypes.byref(self.handle), ctypes.cast(self.cb, ctypes.c_void_p), None
            )
            == 0
        )
        return self

    def enable(self, domain, cbid, on=1):
        return self.lib.cyctxsim_cuptiEnableCallback(on, self.handle, domain, cbid)

    def __exit__(self, *exc):
        assert self.lib.cyctxsim_cuptiUnsubscribe(self.handle) == SUCCESS


def _name(lib, code):
    s = ctypes.c_char_p()
    lib.cyctxsim_cuptiGetResultString(code, ctypes.byref(s))
    return s.value.decode()


def test_one_subscriber_a_second_is_refused(lib):
    with Recorder(lib):
        other = ctypes.c_void_p()
        cb = CALLBACK(lambda *a: None)
        r = lib.cyctxsim_cuptiSubscribe(ctypes.byref(other), ctypes.cast(cb, ctypes.c_void_p), None)
        assert r == MULTIPLE_SUBSCRIBERS
        assert _name(lib, r) == "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
        assert other.value is None
    # Once unsubscribed, another may subscribe.
    with Recorder(lib):
        pass


def test_entry_and_exit_of_an_enabled_call_with_its_data(lib):
    ctx = drivers.ok(drivers.driver().cuDevicePrimaryCtxRetain(0))
    try:
        with Recorder(lib) as rec:
            assert rec.enable(DRIVER, CB["cuCtxPushCurrent_v2"]) == SUCCESS
            drivers.ok(drivers.driver().cuCtxPushCurrent(ctx))
            drivers.ok(drivers.driver().cuCtxPopCurrent())
        h = int(ctx)
        assert rec.seen == [
            ("enter", 323, "cuCtxPushCurrent_v2", 0, None, h),
            ("exit", 323, "cuCtxPushCurrent_v2", h, 0, h),  # exit: the context current then
        ]
    finally:
        drivers.ok(drivers.driver().cuDevicePrimaryCtxRelease(0))


def test_failed_calls_report_their_result(lib):
    with Recorder(lib) as rec:
        rec.enable(DRIVER, CB["cuCtxPopCurrent_v2"])
        err = drivers.driver().cuCtxPopCurrent()[0]
    assert int(err) == 201
    assert [s[0] for s in rec.seen] == ["enter", "exit"]
    assert rec.seen[1][4] == 201


def test_calls_not_enabled_give_nothing_and_disable_works(lib):
    ctx = drivers.ok(drivers.driver().cuDevicePrimaryCtxRetain(0))
    try:
        with Recorder(lib) as rec:
            rec.enable(DRIVER, CB["cuCtxSetCurrent"])
            drivers.ok(drivers.driver().cuCtxPushCurrent(ctx))  # not enabled
            drivers.ok(drivers.driver().cuCtxPopCurrent())
            assert rec.seen == []
            state = ctypes.c_uint32(7)
            assert (
                lib.cyctxsim_cuptiGetCallbackState(ctypes.byref(state), rec.handle, DRIVER, 303)
                == 0
            )
            assert state.value == 1
            rec.enable(DRIVER, CB["cuCtxSetCurrent"], on=0)
            drivers.ok(drivers.driver().cuCtxSetCurrent(None))
            assert rec.seen == []
    finally:
        drivers.ok(drivers.driver().cuDevicePrimaryCtxRelease(0))


def test_resource_events_for_created_and_destroyed_contexts(lib):
    d = drivers.driver()
    with Recorder(lib) as rec:
        rec.enable(RESOURCE, CREATED)
        rec.enable(RESOURCE, DESTROY_STARTING)
        ctx = drivers.create_context(0)
        drivers.ok(d.cuCtxDestroy(ctx))
        p = drivers.ok(d.cuDevicePrimaryCtxRetain(1))
        drivers.ok(d.cuDevicePrimaryCtxReset(1))
        drivers.ok(d.cuDevicePrimaryCtxRelease(1))
    h, ph = int(ctx), int(p)
    assert rec.seen == [
        ("resource", CREATED, h),
        ("resource", DESTROY_STARTING, h),
        ("resource", CREATED, ph),  # the retain activated it
        ("resource", DESTROY_STARTING, ph),  # the reset; the release then finds it inactive
    ]


def test_release_to_zero_destroys_the_primary(lib):
    d = drivers.driver()
    with Recorder(lib) as rec:
        rec.enable(RESOURCE, DESTROY_STARTING)
        p = drivers.ok(d.cuDevicePrimaryCtxRetain(1))
        drivers.ok(d.cuDevicePrimaryCtxRelease(1))
    assert rec.seen == [("resource", DESTROY_STARTING, int(p))]


@pytest.mark.parametrize(
    "domain, cbid", [(0, 303), (7, 303), (DRIVER, 0), (DRIVER, 1024), (-1, 303)]
)
def test_bad_enable_is_refused(lib, domain, cbid):
    with Recorder(lib) as rec:
        assert rec.enable(domain, cbid) == INVALID_PARAMETER


def test_a_foreign_handle_is_refused(lib):
    with Recorder(lib):
        assert (
            lib.cyctxsim_cuptiEnableCallback(1, ctypes.c_void_p(8), DRIVER, 303)
            == INVALID_PARAMETER
        )
        assert lib.cyctxsim_cuptiUnsubscribe(ctypes.c_void_p(8)) == INVALID_PARAMETER
    h = ctypes.c_void_p()
    assert lib.cyctxsim_cuptiSubscribe(ctypes.byref(h), None, None) == INVALID_PARAMETER
