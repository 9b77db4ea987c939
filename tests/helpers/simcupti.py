"""The simulated CUPTI (src/cyctx/_sim/simcupti.c, libcupti.so.13 beside the simulated driver)
through ctypes, as a CUPTI client calls it (tests/trace)."""

import ctypes

SUCCESS, INVALID_PARAMETER, INVALID_OPERATION = 0, 1, 7
NOT_INITIALIZED, NOT_SUPPORTED, MULTIPLE_SUBSCRIBERS = 15, 27, 39
# cuptiGetVersion's numbers; NO_VERSION: the simulated CUPTI's cuptiGetVersion then fails.
CUPTI_13_0, CUPTI_13_2, CUPTI_12, NO_VERSION = 130000, 130200, 19, 0
DRIVER, RUNTIME, RESOURCE = 1, 2, 3
CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)


class SubscriberParams(ctypes.Structure):  # CUpti_SubscriberParams of cupti_callbacks.h, 13.2
    _fields_ = [
        ("structSize", ctypes.c_size_t),
        ("subscriberName", ctypes.c_char_p),
        ("oldSubscriberName", ctypes.c_void_p),
        ("oldSubscriberSize", ctypes.c_size_t),
        ("allowMultipleSubscribers", ctypes.c_uint8),
        ("padding", ctypes.c_uint8 * 7),
    ]


# CUpti_SubscriberParams_STRUCT_SIZE: of 13.0 and 13.1 (up to oldSubscriberSize), of 13.2 on.
SIZE_13_0 = SubscriberParams.oldSubscriberSize.offset + ctypes.sizeof(ctypes.c_size_t)
SIZE_13_2 = SubscriberParams.padding.offset + 7


class Seen:
    """A subscriber's callback: the (domain, id) of each call it was given."""

    def __init__(self):
        self.ids = []
        self.cb = CALLBACK(lambda u, dom, cbid, data: self.ids.append((dom, cbid)))


class Cupti:
    """The simulated libcupti, its functions typed as cupti_callbacks.h declares them."""

    def __init__(self, path):
        self.path = path
        lib = self.lib = ctypes.CDLL(path)
        handle_p = ctypes.POINTER(ctypes.c_void_p)
        lib.cuptiSubscribe.argtypes = [handle_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.cuptiSubscribe_v2.argtypes = [
            handle_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.POINTER(SubscriberParams),
        ]
        lib.cuptiUnsubscribe.argtypes = [ctypes.c_void_p]
        lib.cuptiEnableCallback.argtypes = [
            ctypes.c_uint32,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_uint32,
        ]
        lib.cuptiGetCallbackState.argtypes = [
            ctypes.POINTER(ctypes.c_uint32),
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_uint32,
        ]
        lib.cuptiGetResultString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuptiGetVersion.argtypes = [ctypes.POINTER(ctypes.c_uint32)]
        lib.cyctxsim_cupti_set_version.argtypes = [ctypes.c_uint32]
        lib.cyctxsim_cupti_set_version.restype = ctypes.c_uint32

    def __getattr__(self, name):
        return getattr(self.lib, name)

    def result_name(self, code):
        s = ctypes.c_char_p()
        self.lib.cuptiGetResultString(code, ctypes.byref(s))
        return s.value.decode()

    def version(self, v):
        """Makes it the CUPTI of cuptiGetVersion number ``v``."""
        self.lib.cyctxsim_cupti_set_version(v)

    def subscribe_v2(self, callback, name=None, allow=False, size=SIZE_13_2, userdata=None):
        """(result, handle, the other subscriber's name as CUPTI wrote it)."""
        old = ctypes.create_string_buffer(64)
        p = SubscriberParams(
            size, name.encode() if name else None, ctypes.cast(old, ctypes.c_void_p), 64, allow
        )
        h = ctypes.c_void_p()
        r = self.lib.cuptiSubscribe_v2(
            ctypes.byref(h),
            ctypes.cast(callback, ctypes.c_void_p),
            ctypes.c_void_p(userdata),
            ctypes.byref(p),
        )
        return r, h, old.value.decode()
