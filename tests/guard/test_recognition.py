"""What the guard takes an object for: an ordinal (an int or an __index__), a device, context,
stream or green context of cuda.bindings, cuda.core or a framework, a __cuda_stream__ value,
or a context handle (from_handle). Every other kind of object is refused by its type, before
any retain; malformed values are typed errors, never crashes."""

import decimal
import enum
import fractions
import operator
import warnings

import pytest
from helpers.children import run_child
from helpers.drivers import device_count, ok, retains_unchanged
from helpers.fakes import fake
from helpers.threads import in_thread

import cyctx
from cyctx import ContextGuard, DriverError

# --- values of every type as a device ---------------------------------------------------------


class _Ord(enum.IntEnum):
    ONE = 1


class _BigIndex:
    def __index__(self):
        return 2**100


class _RaisingIndex:
    def __index__(self):
        raise RuntimeError("boom from __index__")


@pytest.mark.parametrize(
    "value, exc",
    [
        (b"0", TypeError),
        (bytearray(b"0"), TypeError),
        (0j, TypeError),
        (decimal.Decimal(0), TypeError),
        (fractions.Fraction(0), TypeError),
        ([0], TypeError),
        ((0,), TypeError),
        ({0}, TypeError),
        (object(), TypeError),
        (type, TypeError),
        (float("nan"), TypeError),
        (float("inf"), TypeError),
        (_BigIndex(), cyctx.InvalidDeviceError),
        (-(2**100), ValueError),
        (_RaisingIndex(), RuntimeError),
    ],
)
def test_every_kind_of_value_as_a_device(value, exc, sim):
    with retains_unchanged():
        with pytest.raises(exc):
            ContextGuard(value)
        with pytest.raises(exc):
            ContextGuard.shared(value)


def test_int_like_values_are_accepted(sim):
    for v in (_Ord.ONE, 1):
        g = ContextGuard(v)
        assert g.device == 1 and type(g.device) is int
        g.close()


def test_index_defined_as_a_classmethod_or_staticmethod_is_called_as_python_does():
    class ByClass:
        @classmethod
        def __index__(cls):
            return 0

    class Static:
        @staticmethod
        def __index__():
            return 0

    for obj in (ByClass(), Static()):
        g = ContextGuard(obj)
        try:
            assert g.device == operator.index(obj) == 0
        finally:
            g.close()

    class Meta(type):
        def __index__(cls):
            return 0

    class OnlyTheMetaclass(metaclass=Meta):  # the class is an index, its instances are not
        pass

    with pytest.raises(TypeError):
        operator.index(OnlyTheMetaclass())
    with pytest.raises(TypeError):
        ContextGuard(OnlyTheMetaclass())


def test_index_returning_a_bool_is_a_bool():
    class Flag:
        def __index__(self):
            return True

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not a DeprecationWarning about __index__ either
        with pytest.raises(TypeError, match="bool"):
            ContextGuard(Flag())
        with pytest.raises(TypeError, match="bool"):
            ContextGuard.shared(Flag())


def test_index_returning_an_int_subclass_is_taken_without_a_warning():
    import enum

    class Ordinal(enum.IntEnum):
        ZERO = 0

    class Dev:
        def __index__(self):
            return Ordinal.ZERO

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = ContextGuard(Dev())
    try:
        assert type(g.device) is int and g.device == 0
    finally:
        g.close()


# --- objects of cuda.bindings and cuda.core that are not a device, context, stream or green context ---
# Most cuda.bindings handle types (CUevent, CUmodule, ...) and every cuda.bindings enum have
# __index__: taken as an ordinal, CUevent(0) silently guarded device 0. Only the types that mean
# a device, a context, a stream or a green context are accepted; every other one is refused by
# its type, whatever its value. Discovered from the installed modules, so both bindings majors
# are covered by whichever is installed.

ACCEPTED_BINDINGS = {
    "CUdevice",
    "CUdevice_v1",
    "CUcontext",
    "CUstream",
    "cudaStream_t",
    "CUgreenCtx",
}


# Named in the promise (and present in both majors): the discovery below must find them.
MUST_REFUSE = {
    "CUevent",
    "CUmodule",
    "CUfunction",
    "CUgraph",
    "CUlibrary",
    "CUmemoryPool",
    "CUarray",
    "CUkernel",
    "CUdeviceptr",
    "CUgraphExec",
    "CUresult",
    "cudaEvent_t",
    "cudaGraph_t",
    "cudaMemPool_t",
    "cudaError_t",
}


def _bindings_objects():
    """(label, object) for every int-like type of cuda.bindings.driver and .runtime that is not
    an accepted one: handle types built with the value 1 (device 1 exists on the simulator and
    on a two-GPU machine, 0 on any), enums by a member of value 0 or 1."""
    import enum

    from cuda.bindings import driver as d
    from cuda.bindings import runtime as r

    out = []
    for mod in (d, r):
        for name in sorted(dir(mod)):
            t = getattr(mod, name)
            if not isinstance(t, type) or name.startswith("_") or name in ACCEPTED_BINDINGS:
                continue
            if issubclass(t, enum.Enum):
                members = [m for m in t if int(m) in (0, 1)] or list(t)[:1]
                out += [(f"{mod.__name__}.{name}.{m.name}", m) for m in members[:1]]
            elif hasattr(t, "__index__") or hasattr(t, "__int__"):
                try:
                    out.append((f"{mod.__name__}.{name}(1)", t(1)))
                except Exception:  # noqa: BLE001 - a type that takes no int is not tried
                    pass
    return out


BINDINGS_OBJECTS = _bindings_objects()


def test_the_discovery_finds_the_named_types():
    found = {label.split(".")[3].split("(")[0] for label, _ in BINDINGS_OBJECTS}
    assert MUST_REFUSE - found == set()
    assert len(BINDINGS_OBJECTS) > 100


@pytest.mark.parametrize("label, obj", BINDINGS_OBJECTS, ids=[b[0] for b in BINDINGS_OBJECTS])
def test_bindings_objects_that_mean_no_device_are_type_errors(label, obj):
    with retains_unchanged():
        with pytest.raises(TypeError) as ei:
            ContextGuard(obj)
        assert type(obj).__name__ in str(ei.value), ei.value
        with pytest.raises(TypeError):
            ContextGuard.shared(obj)


def test_a_user_subclass_of_a_bindings_handle_is_refused_by_its_bindings_type():
    from cuda.bindings import driver as d

    class MyEvent(d.CUevent):
        pass

    with pytest.raises(TypeError, match="CUevent"):
        ContextGuard(MyEvent(0))


def test_bindings_types_that_mean_a_device_or_a_stream_are_accepted():
    from cuda.bindings import driver as d
    from cuda.bindings import runtime as r

    d1 = min(1, device_count() - 1)
    for dev in (d.CUdevice(d1), d.CUdevice_v1(d1)):
        g = ContextGuard(dev)
        try:
            assert g.device == d1 and g.is_primary
        finally:
            g.close()
    # The runtime's stream type is the driver's (cudaStream_t is CUstream_st*): a stream. Its
    # default handles have no context of their own, as for CUstream.
    for s in (d.CUstream(2), r.cudaStream_t(2)):
        with pytest.raises(ValueError, match="default stream"):
            ContextGuard(s)


@pytest.mark.parametrize(
    "name",
    [
        "cuda.core._event.Event",
        "cuda.core._memory.Buffer",
        "cuda.core.experimental._module.Kernel",
        "cuda.core._launch_config.LaunchConfig",
    ],
)
def test_cuda_core_objects_that_mean_no_device_are_type_errors(name):
    # A cuda.core object of another kind, even one that converts to an int (an index, a
    # handle attribute), is refused by its type.
    mod, cls = name.rsplit(".", 1)
    obj = type(
        cls,
        (),
        {
            "__module__": mod,
            "__index__": lambda self: 0,
            "__int__": lambda self: 0,
            "handle": 0,
            "device_id": 0,
        },
    )()
    with pytest.raises(TypeError, match=cls):
        ContextGuard(obj)


# --- framework look-alikes --------------------------------------------------------------------


class _Dev:
    def __init__(self, index):
        self.index = index
        self.device_id = index


@pytest.mark.parametrize(
    "obj, exc",
    [
        # torch-like stream with a float or out-of-range handle, or a bad fallback device
        (lambda: fake("torch.cuda", "Stream", cuda_stream=1.5, device=_Dev(0)), TypeError),
        (lambda: fake("torch.cuda", "Stream", cuda_stream=2**64, device=_Dev(0)), ValueError),
        (lambda: fake("torch.cuda", "Stream", cuda_stream=-5, device=_Dev(0)), ValueError),
        (lambda: fake("torch.cuda", "Stream", cuda_stream=0, device=_Dev("0")), TypeError),
        (lambda: fake("torch.cuda", "Stream", cuda_stream=0, device=_Dev(-1)), ValueError),
        # torch.device-like with a bad index
        (lambda: fake("torch", "device", type="cuda", index=1.5), TypeError),
        (lambda: fake("torch", "device", type="cuda", index=-1), ValueError),
        # CuPy-like
        (lambda: fake("cupy.cuda.device", "Device", id="0"), TypeError),
        (lambda: fake("cupy.cuda.device", "Device", id=1.9), TypeError),
        (lambda: fake("cupy.cuda.stream", "Stream", ptr=1.5, device_id=0), TypeError),
        (lambda: fake("cupy.cuda.stream", "Stream", ptr=2**65, device_id=0), ValueError),
        (lambda: fake("cupy.cuda.stream", "Stream", ptr=0, device_id=-3), ValueError),
        # cuda.core-like
        (lambda: fake("cuda.core.experimental", "Device", device_id=0.5), TypeError),
        (lambda: fake("cuda.core.experimental", "Context", handle=-1), ValueError),
        (lambda: fake("cuda.core.experimental", "Context", handle="0x1"), TypeError),
    ],
)
def test_duck_typed_objects_are_validated(obj, exc, sim):
    with retains_unchanged():
        with pytest.raises(exc):
            ContextGuard(obj())


# --- context handles: from_handle -------------------------------------------------------------


@pytest.mark.parametrize(
    "h, exc",
    [(h, ValueError) for h in (-1, 2**64, 2**70, -(2**70))]
    + [(h, TypeError) for h in (1.5, "1", None, True, b"\x01")],
)
def test_from_handle_refuses_what_is_no_handle(h, exc):
    # Out of range: a ValueError naming the handle, not OverflowError from the C conversion.
    with retains_unchanged():
        with pytest.raises(exc, match="handle" if exc is ValueError else None):
            ContextGuard.from_handle(h)


def test_from_handle_refuses_bindings_objects_that_are_not_contexts():
    # from_handle takes a context's address: a CUstream or a CUevent is not one, whatever int
    # it converts to (the driver would be handed a stream or an event as a context).
    from cuda.bindings import driver as d
    from cuda.bindings import runtime as r

    for obj in (d.CUstream(5), d.CUevent(3), r.cudaEvent_t(3), d.CUgreenCtx(7)):
        with pytest.raises(TypeError, match=type(obj).__name__):
            ContextGuard.from_handle(obj)


# --- __cuda_stream__ --------------------------------------------------------------------------

MALFORMED_STREAMS = [
    "()",
    "[]",
    "(1,)",
    "[0, 5]",
    "(0, 5, 6)",
    "None",
    "7",
    "'ab'",
    "(0, '5')",
    "(0, 1.5)",
    "(0, None)",
    "(0, True)",
    "(True, 5)",
    "(0, -1)",
    "(0, 2**64)",
    "(0, 2**200)",
    "(0, -2**200)",
    "('3', 5)",
    "(3.0, 5)",
    "b'ab'",
    "{0: 1, 1: 2}",
]


def test_malformed_cuda_stream_values_are_typed_errors_not_crashes():
    # Before: () and (1,) read past the end of the tuple (boundscheck=False), a list was
    # indexed blindly, '5' and 1.5 were accepted as handles, -1 and 2**64 gave OverflowError.
    out = run_child(
        f"""
        import cyctx
        class S:
            def __init__(self, v): self.v = v
            def __cuda_stream__(self): return self.v
        for src in {MALFORMED_STREAMS!r}:
            v = eval(src)
            try:
                cyctx.ContextGuard(S(v))
                print("ACCEPTED", src)
            except (TypeError, ValueError) as e:
                assert type(e) in (TypeError, ValueError), (src, type(e))
                print("OK", src, type(e).__name__)
            except BaseException as e:
                print("WRONG", src, type(e).__name__, e)
        print("DONE")
    """,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, f"child died ({out.returncode}): {out.stderr[-2000:]}"
    bad = [ln for ln in out.stdout.splitlines() if ln.startswith(("ACCEPTED", "WRONG"))]
    assert bad == [] and "DONE" in out.stdout, bad
    # Which error (docs/guarantees.md): a value of the wrong shape or type is a TypeError, a
    # handle out of range a ValueError.
    got = {
        ln[3:].rsplit(" ", 1)[0]: ln.rsplit(" ", 1)[1]
        for ln in out.stdout.splitlines()
        if ln.startswith("OK ")
    }
    out_of_range = {"(0, -1)", "(0, 2**64)", "(0, 2**200)", "(0, -2**200)"}
    assert got == {
        src: "ValueError" if src in out_of_range else "TypeError" for src in MALFORMED_STREAMS
    }


def test_valid_cuda_stream_value_reaches_the_driver(sim):
    # A well-formed (version, handle) gets to cuStreamGetCtx (which the simulated driver lacks)
    # or, for a default stream handle, the documented ValueError. Simulated only: 0x1234 is no
    # stream, and the real driver would dereference it.
    class S:
        def __init__(self, v):
            self.v = v

        def __cuda_stream__(self):
            return self.v

    with pytest.raises(ValueError, match="default stream"):
        ContextGuard(S((0, 2)))
    with pytest.raises((DriverError, ValueError)) as ei:
        ContextGuard(S((0, 0x1234)))
    assert not isinstance(ei.value, (TypeError, OverflowError))


def test_cuda_stream_protocol_edge_objects():
    class Raises:
        def __cuda_stream__(self):
            raise KeyError("from the user")

    class NotCallable:
        __cuda_stream__ = (0, 5)

    class NamedTuple(tuple):
        pass

    class Sub:
        def __cuda_stream__(self):
            return NamedTuple((0, 2))

    with pytest.raises(KeyError):  # the user's own error, unchanged
        ContextGuard(Raises())
    with pytest.raises(TypeError):
        ContextGuard(NotCallable())
    with pytest.raises(ValueError, match="default stream"):  # a tuple subclass is a tuple
        ContextGuard(Sub())


# --- on the real driver only ------------------------------------------------------------------


@pytest.mark.gpu
def test_real_runtime_stream_is_a_stream_and_cuda_core_objects_are_refused():
    # On the real driver: a cudaStream_t of a live stream gives its context; cuda.core's
    # Event and Buffer (objects of cuda.core that are no device, context or stream) are
    # TypeErrors naming their type, its Device and Stream are accepted. On a new thread:
    # cuda.core's set_current() changes that thread's current context.
    from cuda.bindings import driver as d
    from cuda.bindings import runtime as r

    def body():
        out = {}
        g = ContextGuard(0)
        try:
            with g:
                s = ok(d.cuStreamCreate(0))
            try:
                g2 = ContextGuard(r.cudaStream_t(int(s)))
                out["runtime stream"] = g2.handle == g.handle
                g2.close()
            finally:
                with g:
                    ok(d.cuStreamDestroy(s))
        finally:
            g.close()
        try:
            from cuda.core import Device
        except ImportError:
            try:
                from cuda.core.experimental import Device
            except ImportError:
                return out
        dev = Device(0)
        dev.set_current()
        made = []
        try:
            stream = dev.create_stream()
            made += [stream, dev.create_event(), dev.allocate(64, stream=stream)]
            for obj in made[1:]:
                try:
                    ContextGuard(obj)
                    out[type(obj).__name__] = "accepted"
                except TypeError as e:
                    out[type(obj).__name__] = type(obj).__name__ in str(e)
            for obj in (dev, stream):
                g3 = ContextGuard(obj)
                out["core " + type(obj).__name__] = g3.device == 0
                g3.close()
        finally:
            for obj in reversed(made):  # while their context is current
                obj.close()
            ok(d.cuCtxSetCurrent(None))
        return out

    out = in_thread(body)
    assert out and all(v is True for v in out.values()), out
