"""Input recognition as rules (cyctx._inputs.recognise, no driver call), the bounds of the
valid ordinals and the message that states them, the generator exit told apart from a plain
out-of-order exit, and which side of a fork believes it is the child."""

import pytest
from helpers.children import run_child, run_python
from helpers.drivers import current, device_count
from helpers.fakes import fake
from helpers.finalizers import suspended_in
from helpers.threads import in_thread

from cyctx import ContextGuard, GuardError, InvalidDeviceError
from cyctx._inputs import Kind, Target, recognise

# --- CuPy objects with a .ptr ------------------------------------------------------------------


@pytest.mark.parametrize(
    "module, name",
    [
        ("cupy.cuda.memory", "MemoryPointer"),
        ("cupy.cuda.memory", "PooledMemory"),
        ("cupy.cuda.stream", "Event"),
        ("cupy.cuda.texture", "TextureObject"),
        ("cupy.cuda.graph", "Graph"),
    ],
)
def test_a_cupy_object_with_a_ptr_that_is_not_a_stream_is_refused(module, name, sim):
    # Many CuPy objects carry a device address or a handle in .ptr; only a stream's .ptr is a
    # stream. Anything else is refused by its type (no driver call), never taken for a stream.
    obj = fake(module, name, ptr=0x7F00_0000_1000, device_id=0)
    calls = sim.call_count()
    with pytest.raises(TypeError) as ei:
        recognise(obj)
    assert f"{module}.{name}" in str(ei.value) and "ContextGuard takes" in str(ei.value)
    with pytest.raises(TypeError):
        ContextGuard(obj)
    assert sim.call_count() == calls


@pytest.mark.parametrize("name", ["Stream", "ExternalStream"])
def test_a_cupy_stream_is_a_stream_and_its_default_stream_its_device(name):
    assert recognise(fake("cupy.cuda.stream", name, ptr=0x5000, device_id=1)) == Target(
        Kind.STREAM, 0x5000
    )
    for h in (0, 1, 2):  # the legacy and per-thread default streams: its device's primary
        assert recognise(fake("cupy.cuda.stream", name, ptr=h, device_id=1)) == Target(
            Kind.ORDINAL, 1
        )


# --- cuda.core streams ---------------------------------------------------------------------------


def _core_stream(handle, device_id):
    device = fake("cuda.core._device", "Device", device_id=device_id)
    return fake("cuda.core._stream", "Stream", handle=handle, device=device)


@pytest.mark.parametrize("handle", [0, 1, 2])
def test_a_cuda_core_default_stream_means_its_device(handle):
    # A default stream has no context of its own; a cuda.core Stream knows its device, whose
    # primary context is what the guard takes.
    assert recognise(_core_stream(handle, 1)) == Target(Kind.ORDINAL, 1)
    assert recognise(_core_stream(handle, 0)) == Target(Kind.ORDINAL, 0)


def test_a_cuda_core_stream_of_its_own_is_a_stream_whatever_its_device():
    assert recognise(_core_stream(0x9000, 1)) == Target(Kind.STREAM, 0x9000)


@pytest.mark.parametrize("handle", [0, 1, 2])
def test_a_default_stream_that_knows_no_device_is_refused(handle):
    class Proto:
        def __cuda_stream__(self):
            return (0, handle)

    with pytest.raises(ValueError, match="default stream .* has no context of its own"):
        recognise(Proto())


# --- the bounds of the valid ordinals ----------------------------------------------------------


def test_the_last_ordinal_is_accepted_and_the_next_refused_with_the_bounds_stated(sim):
    # cyctx's own bounds check answers, not cuDeviceGet (-1: before any driver call): the
    # error says which check refused it and how many devices there are.
    n = device_count()
    ContextGuard(n - 1).close()
    ContextGuard(0).close()
    calls, gets = sim.call_count(), sim.call_count("cuDeviceGet")
    with pytest.raises(ValueError, match="must be >= 0, got -1") as ei:
        ContextGuard(-1)  # not the driver's InvalidDeviceError, a ValueError too
    assert type(ei.value) is ValueError and sim.call_count() == calls
    with pytest.raises(InvalidDeviceError) as ei:
        ContextGuard(n)
    assert ei.value.call == "ContextGuard" and ei.value.code == 101
    msg = str(ei.value)
    assert (
        f"Device {n} does not exist" in msg and f"reports {n} device(s), ordinals 0..{n - 1}" in msg
    )
    with pytest.raises(InvalidDeviceError, match=f"Device {n + 1} does not exist"):
        ContextGuard(n + 1)
    assert sim.call_count("cuDeviceGet") == gets


def test_the_bounds_follow_the_device_count():
    out = run_python("""
        from cyctx import testing
        testing.use_simulated_driver(3)
        import cyctx
        cyctx.ContextGuard(2).close()
        try:
            cyctx.ContextGuard(3)
        except cyctx.InvalidDeviceError as e:
            print("REFUSED", "reports 3 device(s), ordinals 0..2" in str(e))
    """)
    assert "REFUSED True" in out.stdout, out.stdout


# --- the generator exit --------------------------------------------------------------------------


def test_a_generator_closed_out_of_order_is_reported_as_such(guard, guard1):
    # The generator's block of guard is open under guard1's; closing the generator leaves it
    # out of order. That is its own case: a generator closed (or collected) with its block open,
    # raised from close() (a note on the GeneratorExit would be lost), not a plain exit.
    def body():
        it = suspended_in(guard)
        with guard1:
            with pytest.raises(GuardError) as ei:
                it.close()
            assert current() == guard1.handle  # the open block keeps its context
        msg = str(ei.value)
        assert "a generator, coroutine or greenlet holding this guard was closed" in msg, msg
        assert "exit out of order" not in msg, msg
        assert current() == 0

    in_thread(body)


def test_a_plain_exit_out_of_order_is_not_reported_as_a_generator(guard, guard1):
    def body():
        guard.__enter__()
        guard1.__enter__()
        with pytest.raises(GuardError) as ei:
            guard.__exit__(None, None, None)
        msg = str(ei.value)
        assert "exit out of order" in msg and "holding this guard was closed" not in msg, msg
        guard1.__exit__(None, None, None)
        assert current() == 0

    in_thread(body)


# --- fork: who is the child -------------------------------------------------------------------


def test_after_a_fork_only_the_child_believes_it_is_one():
    out = run_child("""
        import cyctx
        from cyctx._guard import fork_state
        from helpers.forking import run_forked
        g = cyctx.ContextGuard(0)  # CUDA used before the fork
        def child():
            return fork_state(), "fork" in str(cyctx.DriverError(3)).lower()
        print("CHILD", run_forked(child))
        print("PARENT", (fork_state(), "fork" in str(cyctx.DriverError(3)).lower()))
        with g:  # the parent goes on using CUDA
            print("WORKS", cyctx.current_handle() == g.handle)
        g.close()
    """)
    assert "CHILD ((True, True), True)" in out.stdout, out.stdout
    assert "PARENT ((False, False), False)" in out.stdout, out.stdout
    assert "WORKS True" in out.stdout, out.stdout


# --- handles and torch devices -------------------------------------------------------------------


def test_the_handle_bounds_are_exact_and_stated():
    from cyctx._inputs import context_handle

    assert context_handle(2**64 - 1, "h") == 2**64 - 1 and context_handle(0, "h") == 0
    for bad in (2**64, -1):
        with pytest.raises(ValueError) as ei:
            context_handle(bad, "from_handle: the context handle")
        assert "0 <= handle < 2**64" in str(ei.value), ei.value


@pytest.mark.parametrize("kind", ["cpu", "meta", "mps", "xpu"])
def test_a_torch_device_of_another_kind_than_cuda_is_refused(kind, sim):
    calls = sim.call_count()
    with pytest.raises(ValueError, match="is not a CUDA device"):
        recognise(fake("torch", "device", type=kind, index=0))
    assert sim.call_count() == calls
