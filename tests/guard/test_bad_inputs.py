"""Bad inputs and misuse: every row gets its typed error and leaves no state behind (the autouse
fixture checks the thread's context state, retains_unchanged the retain counts); messages stay
short and typed for values that cannot be printed."""

import builtins
import warnings

import pytest
from helpers.children import run_child
from helpers.drivers import SIM_DEVICES, current, device_count, driver, ok, retains_unchanged
from helpers.threads import in_thread

import cyctx
from cyctx import ContextGuard, DriverError, InvalidDeviceError
from cyctx._guard import open_entries


def _closed():
    g = ContextGuard(0)
    g.close()
    return g


def _with(g):
    with g:
        pass


def _exit_on_other_thread():
    g = ContextGuard(0)
    g.__enter__()
    try:
        in_thread(g.__exit__, None, None, None)  # its error is the row's
    finally:
        g.__exit__(None, None, None)
        g.close()


def _out_of_order():
    # a's exit is reported and removes a's entry (Python never calls it again); leaving b, the
    # open block, then restores what was current before a's. Nothing is left open: both close.
    a, b = ContextGuard(0), ContextGuard(0)
    a.__enter__()
    b.__enter__()
    try:
        a.__exit__(None, None, None)
    finally:
        b.__exit__(None, None, None)
        a.close()
        b.close()


def _close_inside():
    g = ContextGuard(0)
    try:
        with g:
            g.close()
    finally:
        g.close()


def _leaked_push():
    g = ContextGuard(0)
    d = driver()

    def body():
        with g:
            ok(d.cuCtxPushCurrent(g.context))

    try:
        in_thread(body)  # its error is the row's
    finally:
        g.close()


def _reset_as_error():
    g = ContextGuard(0)
    ok(driver().cuDevicePrimaryCtxReset(ok(driver().cuDeviceGet(0))))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", cyctx.ContextResetWarning)
            _with(g)
    finally:
        g.close()


def _fork_child():
    out = run_child("""
        import cyctx
        from helpers.forking import raised_in_fork
        g = cyctx.ContextGuard(0)
        print("CHILD", raised_in_fork(g.__enter__))
    """)
    if "CHILD ForkError" in out.stdout:
        raise cyctx.ForkError("seen in the child")


def _all_raise(exc_name, calls):
    # A row that lists several inputs: each must raise the row's error on its own; the last
    # one's error is what the row's test sees.
    expected = getattr(cyctx, exc_name, None) or getattr(builtins, exc_name)
    for call in calls[:-1]:
        with pytest.raises(expected):
            call()
    calls[-1]()


def _not_devices():
    from cuda.bindings import driver as d
    from cuda.bindings import runtime as r

    return [d.CUevent(0), d.CUmodule(0), d.CUgraph(0), r.cudaEvent_t(0), d.CUresult.CUDA_SUCCESS]


class _Index:
    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


class _BadRepr:
    def __repr__(self):
        raise RuntimeError("repr of a user object")


# (the table's wording of the input, how to try it, the error the table names)
def _bindings():
    from cuda.bindings import driver

    return driver


def _unbound_on_non_guards():
    # Each method, called through the class with an object that is no guard, refuses it by
    # name; nothing is read from it as if it were a guard. Only then the TypeError is raised.
    calls = {
        "__enter__": lambda x: ContextGuard.__enter__(x),
        "__exit__": lambda x: ContextGuard.__exit__(x, None, None, None),
        "close": ContextGuard.close,
        "__reduce__": ContextGuard.__reduce__,
        "__copy__": ContextGuard.__copy__,
        "__deepcopy__": lambda x: ContextGuard.__deepcopy__(x, {}),
        "the slot of __enter__": lambda x: ContextGuard.__dict__["__enter__"](x),
        "the slot of __exit__": lambda x: ContextGuard.__dict__["__exit__"](x, None, None, None),
    }
    before = (current(), open_entries())
    for name, call in calls.items():
        for bad in (None, object(), 0, "guard"):
            with pytest.raises(TypeError, match=r"needs a ContextGuard, got") as ei:
                call(bad)
            assert f"ContextGuard.{name.split()[-1]}()" in str(ei.value), (name, ei.value)
    assert (current(), open_entries()) == before
    raise TypeError("every method refused every non-guard")


ROWS = [
    ("`ContextGuard(-1)`", lambda: ContextGuard(-1), "ValueError"),
    ("`ContextGuard(10**9)`", lambda: ContextGuard(10**9), "InvalidDeviceError"),
    (
        "`ContextGuard(n)` with n = device count",
        lambda: ContextGuard(device_count()),
        "InvalidDeviceError",
    ),
    ("`ContextGuard(2**40)`", lambda: ContextGuard(2**40), "InvalidDeviceError"),
    ("`ContextGuard(10**30)`", lambda: ContextGuard(10**30), "InvalidDeviceError"),
    ('`ContextGuard("0")`', lambda: ContextGuard("0"), "TypeError"),
    ("`ContextGuard(None)`", lambda: ContextGuard(None), "TypeError"),
    ("`ContextGuard(1.5)`", lambda: ContextGuard(1.5), "TypeError"),
    ("`ContextGuard(True)`", lambda: ContextGuard(True), "TypeError"),
    (
        "`ContextGuard(CUevent(0))`, `CUmodule`, `CUgraph`, `cudaEvent_t`, `CUresult.CUDA_SUCCESS` or any other "
        "cuda.bindings or cuda.core object that is not a device, context, stream or green context",
        lambda: _all_raise("TypeError", [lambda o=o: ContextGuard(o) for o in _not_devices()]),
        "TypeError",
    ),
    (
        "`ContextGuard(10**5000)` (more than 4300 digits, also through `__index__`)",
        lambda: _all_raise(
            "InvalidDeviceError",
            [lambda: ContextGuard(10**5000), lambda: ContextGuard(_Index(10**5000))],
        ),
        "InvalidDeviceError",
    ),
    ("`ContextGuard(-10**5000)`", lambda: ContextGuard(-(10**5000)), "ValueError"),
    ("a non-device whose `__repr__` raises", lambda: ContextGuard(_BadRepr()), "TypeError"),
    ('`ContextGuard.shared("0")`', lambda: ContextGuard.shared("0"), "TypeError"),
    ('`cyctx.device("0")`', lambda: cyctx.device("0"), "TypeError"),
    (
        "`shared()` or `cyctx.device()` of a context, a stream (also a framework's default "
        "stream) or a green context",
        lambda: ContextGuard.shared(_bindings().CUcontext(0x1000)),
        "TypeError",
    ),
    ("`ContextGuard.shared(True)`", lambda: ContextGuard.shared(True), "TypeError"),
    ("`with` a closed guard", lambda: _with(_closed()), "GuardError"),
    ("`.handle` of a closed guard", lambda: _closed().handle, "GuardError"),
    ("exit without enter", lambda: _closed().__exit__(None, None, None), "GuardError"),
    ("exit on another thread than the enter", _exit_on_other_thread, "GuardError"),
    ("exit out of LIFO order (generators, coroutines)", _out_of_order, "GuardError"),
    ("`close()` inside the guard's own `with`", _close_inside, "GuardError"),
    ("block pushes a context and leaves it, from an empty stack", _leaked_push, "GuardError"),
    (
        "enter after a reset, with `ContextResetWarning` as an error",
        _reset_as_error,
        "ContextResetWarning",
    ),
    ("enter in a child forked after CUDA was used", _fork_child, "ForkError"),
    (
        "a method called through the class on something else: `ContextGuard.close(None)`, "
        "`ContextGuard.__exit__(obj, None, None, None)`, ...",
        _unbound_on_non_guards,
        "TypeError",
    ),
]


@pytest.mark.parametrize("what, fn, exc", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_row(what, fn, exc):
    with retains_unchanged():
        expected = getattr(cyctx, exc, None) or getattr(builtins, exc)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", cyctx.ContextResetWarning)
            with pytest.raises(expected):
                fn()


def test_close_of_shared_guard_row():
    # Its own child: a shared guard keeps its retain for the life of the process.
    out = run_child("""
        import cyctx
        try:
            cyctx.ContextGuard.shared(0).close()
        except cyctx.GuardError:
            print("GuardError")
    """)
    assert "GuardError" in out.stdout


# --- device arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spelled, hint",
    [
        ("cuda:1", "; for 'cuda:1' pass the ordinal 1 or torch.device('cuda:1')"),
        ("cuda:01", "; for 'cuda:01' pass the ordinal 1 or torch.device('cuda:01')"),
        ("cuda", ""),  # torch's current device: which library's current device is unknown
        ("cuda:-1", ""),
        ("cuda:1.0", ""),
        ("1", ""),
    ],
)
def test_a_string_is_never_parsed_and_torchs_spelling_is_named(spelled, hint):
    # A torch user types "cuda:1": refused (a str is no device), the message says what to pass.
    for make in (ContextGuard, cyctx.device, ContextGuard.shared):
        with pytest.raises(TypeError) as e:
            make(spelled)
        assert str(e.value).endswith(f"got builtins.str {spelled!r}{hint}"), str(e.value)


@pytest.mark.parametrize("bad", [10**9, SIM_DEVICES + 40, 10**30])
def test_nonexistent_device(bad, sim):
    with retains_unchanged():
        retains = sim.call_count("cuDevicePrimaryCtxRetain")
        with pytest.raises(InvalidDeviceError) as ei:
            ContextGuard(bad)
        assert isinstance(ei.value, DriverError) and isinstance(ei.value, ValueError)
        assert ei.value.code == 101 and ei.value.name == "CUDA_ERROR_INVALID_DEVICE"
        assert str(bad) in str(ei.value)
    assert sim.call_count("cuDevicePrimaryCtxRetain") == retains


# --- messages never format unbounded user values ----------------------------------------------
# Python refuses to turn an int of more than 4300 digits into text (ValueError): a message that
# formats such a value raised that instead of the documented error.

HUGE = 10**5000


class _Stream:
    def __init__(self, v):
        self.v = v

    def __cuda_stream__(self):
        return self.v


HUGE_CASES = {
    "ordinal": (lambda: ContextGuard(HUGE), "InvalidDeviceError", "does not exist"),
    "index": (lambda: ContextGuard(_Index(HUGE)), "InvalidDeviceError", "does not exist"),
    "shared": (lambda: ContextGuard.shared(HUGE), "InvalidDeviceError", "does not exist"),
    "negative": (lambda: ContextGuard(-HUGE), "ValueError", ">= 0"),
    "negative index": (lambda: ContextGuard(_Index(-HUGE)), "ValueError", ">= 0"),
    "negative shared": (lambda: ContextGuard.shared(-HUGE), "ValueError", ">= 0"),
    "from_handle": (lambda: ContextGuard.from_handle(HUGE), "ValueError", "out of range"),
    "negative from_handle": (lambda: ContextGuard.from_handle(-HUGE), "ValueError", "out of range"),
    "stream handle": (lambda: ContextGuard(_Stream((0, HUGE))), "ValueError", "out of range"),
    "stream both": (lambda: ContextGuard(_Stream((HUGE, HUGE))), "ValueError", "out of range"),
    "stream list": (lambda: ContextGuard(_Stream([HUGE, 1])), "TypeError", "tuple"),
    "stream version": (lambda: ContextGuard(_Stream(([HUGE], 1))), "TypeError", "version"),
    "stream handle list": (lambda: ContextGuard(_Stream((0, [HUGE]))), "TypeError", "handle"),
    "list": (lambda: ContextGuard([HUGE]), "TypeError", "ContextGuard takes"),
    "from_handle list": (lambda: ContextGuard.from_handle([HUGE]), "TypeError", "from_handle"),
}


@pytest.mark.parametrize("make, exc, match", HUGE_CASES.values(), ids=HUGE_CASES)
def test_huge_values_get_the_documented_error_not_int_to_str(make, exc, match):
    expected = getattr(cyctx, exc, None) or getattr(builtins, exc)
    with pytest.raises(expected, match=match) as ei:
        make()
    assert "4300" not in str(ei.value) and len(str(ei.value)) < 1000


def test_huge_values_read_from_framework_objects_get_the_documented_error():
    from helpers.fakes import fake

    for obj, exc in [
        (fake("torch", "device", type="cuda", index=HUGE), cyctx.InvalidDeviceError),
        (fake("cupy.cuda.device", "Device", id=HUGE), cyctx.InvalidDeviceError),
        (fake("cuda.core._device", "Device", device_id=-HUGE), ValueError),
        (fake("cupy.cuda.stream", "Stream", ptr=HUGE, device_id=0), ValueError),
        (fake("cuda.core._context", "Context", handle=_Index(HUGE)), ValueError),
    ]:
        with pytest.raises(exc) as ei:
            ContextGuard(obj)
        assert "4300" not in str(ei.value), ei.value


# --- a value whose __repr__ raises ------------------------------------------------------------


class _BadModule:
    pass


_BadModule.__module__ = 42  # not a str: read as no module


_CPU = type("device", (_BadRepr,), {"__module__": "torch", "type": "cpu", "index": 0})
REPR_CASES = {
    "guard": (lambda: ContextGuard(_BadRepr()), TypeError),
    "shared": (lambda: ContextGuard.shared(_BadRepr()), TypeError),
    "from_handle": (lambda: ContextGuard.from_handle(_BadRepr()), TypeError),
    "stream value": (lambda: ContextGuard(_Stream(_BadRepr())), TypeError),
    "stream version": (lambda: ContextGuard(_Stream((_BadRepr(), 5))), TypeError),
    "stream handle": (lambda: ContextGuard(_Stream((0, _BadRepr()))), TypeError),
    "torch cpu device": (lambda: ContextGuard(_CPU()), ValueError),
    "type with a non-str module": (lambda: ContextGuard(_BadModule()), TypeError),
}


@pytest.mark.parametrize("make, exc", REPR_CASES.values(), ids=REPR_CASES)
def test_a_value_whose_repr_raises_still_gets_the_typed_error(make, exc):
    with pytest.raises(exc) as ei:
        make()
    assert "repr of a user object" not in str(ei.value)


# --- __cuda_stream__ returning a tuple subclass that lies about its items ---------------------


class _LyingTuple(tuple):
    """Its items are (0, 2), a default stream; iterating it says otherwise."""

    def __iter__(self):
        return iter(self.lie)

    def __getitem__(self, i):
        return "lie"

    def __len__(self):
        return 3


@pytest.mark.parametrize(
    "lie", [(0, "x"), (0, 1, 2), (), (0, 2**70)], ids=["str", "three", "empty", "huge"]
)
def test_cuda_stream_tuple_subclass_is_read_by_its_real_items(lie):
    v = _LyingTuple((0, 2))
    v.lie = lie
    with pytest.raises(ValueError, match="default stream"):
        ContextGuard(_Stream(v))
