"""Which library a traced call is named after (docs/tracing.md, "Who made the call"): the one
the user's line called, whatever it went through; where the frames cannot tell, the name says
what they show and that they were cut, never a pick. The rule on constructed frames first (every
case of it), then on the simulated driver: a call made through the C API of another extension,
and stacks cut at every depth."""

import os
import pickle

import pytest
from helpers import drivers
from helpers.lines import line_of

import cyctx
from cyctx._trace import Frame, NativeFrame
from cyctx._trace.attribution import _attribute

SITE = "/opt/py/lib/python3.12/site-packages/"
DIRS = [
    (SITE + "cuda/bindings/", "cuda-bindings"),
    (SITE + "cuda/core/", "cuda.core"),
    (SITE + "torch/", "torch"),
    (SITE + "cyctx/", "cyctx"),
]
USER = Frame("/home/me/job.py", 12, "main")
LIBPY = NativeFrame(
    "/opt/py/lib/libpython3.12.so.1.0", "PyObject_Vectorcall", "libpython3.12.so.1.0"
)
EVAL, END, CUT, OFF = 0, 1, 2, 3


def nat(owner, path, symbol="f"):
    return NativeFrame(path, symbol, owner)


BINDINGS = nat("cuda-bindings", SITE + "cuda/bindings/_bindings/cydriver.so", "_cuCtxSetCurrent")
CORE = nat("cuda.core", SITE + "cuda/core/_device.so", "set_current")
CYCTX = nat("cyctx", SITE + "cyctx/_guard.so", "enter")
RUNTIME = nat("the CUDA runtime", "/opt/cuda/lib/libcudart.so.13", "cudaSetDevice")
TORCH_CUDA = nat("torch", SITE + "torch/lib/libtorch_cuda.so", "c10::cuda::set_device")
TORCH_PY = nat("torch", SITE + "torch/lib/libtorch_python.so", "THCPModule_setDevice")
LIBC = nat("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6", "start_thread")


def attribute(python, native, state=EVAL, python_cut=False):
    return _attribute(python, python_cut, native, state, DIRS, 7)


def test_a_line_calling_an_extension_names_the_outermost_extension_below_the_eval_loop():
    # cuda.core's compiled module calling cuda.bindings' (directly, or through the C API).
    assert attribute([USER], [BINDINGS, CORE, LIBPY]) == ("cuda.core", False, USER)
    assert attribute([USER], [BINDINGS, LIBPY, CORE, LIBPY]) == ("cuda.core", False, USER)
    assert attribute([USER], [BINDINGS, LIBPY]) == ("cuda-bindings", False, USER)


def test_the_runtime_and_the_system_libraries_are_passed_through():
    assert attribute([USER], [RUNTIME, TORCH_CUDA, TORCH_PY, LIBPY]) == ("torch", False, USER)
    # A thread no Python started: its stack ends in libc, which is not the caller.
    assert attribute([], [RUNTIME, TORCH_CUDA, LIBC], state=END) == ("torch", False, None)


def test_a_library_python_frame_names_the_call_after_that_library():
    core_py = Frame(SITE + "cuda/core/_device.py", 80, "Device.set_current")
    assert attribute([core_py, USER], [BINDINGS, LIBPY]) == ("cuda.core", False, USER)
    # The outermost library frame below the user's line: the library the line called.
    torch_py = Frame(SITE + "torch/cuda/__init__.py", 500, "set_device")
    assert attribute([core_py, torch_py, USER], [BINDINGS, LIBPY]) == ("torch", False, USER)


def test_a_guard_is_cyctx_only_when_cyctx_code_made_the_call():
    assert attribute([USER], [CYCTX, LIBPY]) == ("cyctx", True, USER)
    cyctx_py = Frame(SITE + "cyctx/_bind.py", 40, "bound")
    assert attribute([cyctx_py, USER], [CYCTX, LIBPY]) == ("cyctx", True, USER)
    # A cyctx wrapper that called someone else's function, which made the call: cyctx's line,
    # not a guard's change.
    assert attribute([USER], [BINDINGS, LIBPY, CYCTX, LIBPY]) == ("cyctx", False, USER)


def test_a_native_stack_cut_short_says_what_it_shows_and_that_it_was_cut():
    library, guard, where = attribute([USER], [BINDINGS], state=CUT)
    assert library == (
        f"cuda-bindings (called from {USER}, through native code beyond _cuCtxSetCurrent: the "
        "native stack was cut at native_frames=7)"
    )
    assert not guard and where == USER
    assert attribute([], [], state=CUT)[0] == (
        "? (called from a caller not read: the native stack was cut at native_frames=7)"
    )
    # A walk that found no eval loop (a Python whose frames are not read): native code beyond
    # an interpreter frame is not known to be the caller: said, not picked.
    library, _, _ = attribute([USER], [BINDINGS, LIBPY, CORE, LIBPY], state=END)
    assert library == (
        f"cuda-bindings (called from {USER}, through native code beyond _cuCtxSetCurrent: the "
        "eval loop that ran it was not found)"
    )


def test_python_frames_cut_short_say_so():
    torch_py = Frame(SITE + "torch/cuda/__init__.py", 500, "set_device")
    library, _, where = attribute([torch_py], [TORCH_PY, LIBPY], python_cut=True)
    assert where is None
    assert library == (
        f"torch (called from beyond {torch_py}, the outermost of the 1 Python frames read)"
    )
    # All of the stack read (it ended): no doubt.
    assert attribute([torch_py], [TORCH_PY, LIBPY], python_cut=False)[0] == "torch"


def test_native_frames_off_name_no_library():
    assert attribute([USER], [], state=OFF) == ("?", False, USER)


# --- on the simulated driver ------------------------------------------------------------------


@pytest.fixture
def set_current(sim):
    return drivers.sim_set_current(sim)


_CALLEE = None  # what the pickle below calls (pickle finds it by module and name)


def test_an_extension_calling_another_through_the_c_api_is_named_after_the_outer_one(set_current):
    """_pickle (a compiled module) calls the ctypes function through the C API: interpreter
    frames lie between the two extensions, and the call is _pickle's, the module the line
    called (as cuda.core's compiled code calling cuda.bindings' Python-level functions is
    cuda.core's)."""
    import _pickle

    if not getattr(_pickle, "__file__", None):
        pytest.skip("this Python has _pickle built into the interpreter (no module of its own)")
    global _CALLEE
    _CALLEE = set_current
    # Loaded, it calls _CALLEE(None): opcodes GLOBAL, NONE, TUPLE1, REDUCE, STOP.
    data = b"c" + __name__.encode() + b"\n_CALLEE\nN\x85R."
    with cyctx.trace() as t:
        assert pickle.loads(data) == 0  # pickle-call
    (e,) = [e for e in t.events if e.call == "cuCtxSetCurrent"]
    assert e.native_state == "the eval loop", e
    owners = [n.owner for n in e.native]
    assert os.path.basename(_pickle.__file__) in owners, owners
    assert e.library == os.path.basename(_pickle.__file__), (e.library, owners)
    assert e.where is not None and e.where.line == line_of("pickle-call"), e.where
    assert not e.cyctx_guard


@pytest.mark.parametrize("limit", range(1, 12))
def test_a_stack_cut_at_any_depth_is_said_to_be_cut_or_named_right(sim, limit):
    d = drivers.driver()
    with cyctx.trace(native_frames=limit) as t:
        drivers.ok(d.cuCtxSetCurrent(None))  # cut-call
    (e,) = t.events
    assert e.where is not None and e.where.line == line_of("cut-call")
    if e.native_state == "the eval loop":
        assert e.library == "cuda-bindings", e
    else:
        assert e.native_state == "cut", e
        assert e.library.endswith(f"the native stack was cut at native_frames={limit})"), e
        assert f"(called from {e.where}" in e.library, e
    # Enough frames always reach the eval loop.
    assert limit < 11 or e.native_state == "the eval loop", e


def test_the_interpreter_is_known_however_the_loader_names_it():
    # A Python linked statically (Debian's, Ubuntu's) has its C API in the program itself, which
    # the loader names as it was started ("python3" from PATH); a frame there is the interpreter's
    # own, passed through, never the library that made a call.
    from cyctx._trace.attribution import _interpreter_object, _is_interpreter, _owner_of

    name = _interpreter_object()
    assert name, "dladdr found no object for CPython's C API"
    assert _is_interpreter(name) and _owner_of(name, []) == "the interpreter"
    assert not _is_interpreter("/opt/venv/lib/python3.12/site-packages/cupy/cuda/memory.so")
