"""The error classes: exported and named as users import them, pickled across processes with
their advice, one documented class per driver code; and what a driver library that cannot
be loaded is reported as."""

import pytest
from helpers.threads import in_thread

import cyctx
from cyctx import ContextGuard, DriverError, GuardError, InvalidDeviceError


def test_python_facade_exports():
    for name in ("ContextGuard", "CyctxError", "DriverError", "GuardError", "InvalidDeviceError"):
        assert hasattr(cyctx, name)
    assert issubclass(GuardError, cyctx.CyctxError) and issubclass(DriverError, cyctx.CyctxError)


def test_errors_are_named_as_users_import_them():
    import pickle
    import traceback
    import warnings

    public = [getattr(cyctx, n) for n in cyctx.__all__]
    errors = [c for c in public if isinstance(c, type) and issubclass(c, (Exception, Warning))]
    assert len(errors) == 13
    for cls in errors:
        assert f"{cls.__module__}.{cls.__qualname__}" == f"cyctx.{cls.__name__}"
    with pytest.raises(InvalidDeviceError) as ei:
        ContextGuard(10**9)
    text = "".join(traceback.format_exception(ei.value))
    assert "\ncyctx.InvalidDeviceError: " in text, text
    assert "_errors" not in text.splitlines()[-1]
    back = pickle.loads(pickle.dumps(ei.value))
    assert type(back) is InvalidDeviceError and back.code == ei.value.code
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # `-W error::cyctx.ContextResetWarning` names the class by its public path.
        warnings.filterwarnings("error", category=cyctx.ContextResetWarning)
        assert repr(cyctx.ContextResetWarning("x")) == "ContextResetWarning('x')"


def test_driver_error_survives_a_trip_through_another_process():
    # Errors of a worker process reach the parent pickled: the class, the code, the call and
    # the advice (detail) all survive, so the parent sees the same message.
    import concurrent.futures
    import multiprocessing

    err = cyctx.InvalidDeviceError(101, "ContextGuard", "Device 7 does not exist: 2 device(s)")
    with concurrent.futures.ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn")
    ) as ex:
        back = ex.submit(_echo, err).result()
    assert type(back) is cyctx.InvalidDeviceError
    assert (back.code, back.call, back.detail) == (101, "ContextGuard", err.detail)
    assert str(back) == str(err) and "Device 7 does not exist" in str(back)


def _echo(x):
    return x


# Each code cyctx maps, the class it is documented to raise (docs/guarantees.md, "Errors"), and
# the documented classes an `except` clause may name to catch it.
CLASSES = [
    (3, "NotInitializedError", ("NotInitializedError",)),
    (4, "NotInitializedError", ("NotInitializedError",)),  # DEINITIALIZED: interpreter exit
    (100, "NoDeviceError", ("NoDeviceError",)),
    (101, "InvalidDeviceError", ("InvalidDeviceError", "ValueError")),
    (201, "InvalidContextError", ("InvalidContextError",)),
    (709, "ContextDestroyedError", ("ContextDestroyedError", "InvalidContextError")),
    (1, "DriverError", ()),  # not mapped: the base class
    (999, "DriverError", ()),
]


@pytest.mark.parametrize("code, cls, caught_by", CLASSES, ids=[str(c[0]) for c in CLASSES])
def test_each_mapped_code_raises_its_documented_class(sim, code, cls, caught_by):
    import builtins

    def body():
        g = ContextGuard(0)
        try:
            sim.inject_fault("cuCtxGetCurrent", code)
            try:
                with g:
                    pass
            except cyctx.CyctxError as e:
                return e
            finally:
                sim.clear_faults()
        finally:
            g.close()

    exc = in_thread(body)
    assert type(exc).__name__ == cls and type(exc) is getattr(cyctx, cls), repr(exc)
    assert exc.code == code and exc.call == "cuCtxGetCurrent"
    for name in ("DriverError", "CyctxError", *caught_by):
        catcher = getattr(cyctx, name, None) or getattr(builtins, name)
        try:
            raise exc
        except catcher:
            pass
    # ... and nothing it is not documented to be.
    others = {
        "NotInitializedError",
        "NoDeviceError",
        "InvalidDeviceError",
        "InvalidContextError",
        "ContextDestroyedError",
        "GuardError",
        "ForkError",
    } - {cls, *caught_by}
    assert not any(isinstance(exc, getattr(cyctx, o)) for o in others), type(exc).__mro__
    assert isinstance(exc, ValueError) == ("ValueError" in caught_by)


# --- the driver library itself is wrong -------------------------------------------------------
# cyctx loads libcuda.so.1 itself; when that fails the code is cyctx's own choice, the driver
# cannot be asked for its name or text, and the message must still say what the code means and
# what is wrong: not "unrecognised error code", and not "too old" for a library that is simply
# not a complete driver.

LOAD_CHILD = """
import json, cyctx
try:
    cyctx.ContextGuard(0)
    print(json.dumps(None))
except cyctx.DriverError as e:
    print(json.dumps([type(e).__name__, e.code, e.name, e.call, str(e)]))
"""


@pytest.mark.parametrize(
    "kind, code, name, says, not_said",
    [
        ("stub", 34, "CUDA_ERROR_STUB_LIBRARY", ["stub", "LD_LIBRARY_PATH"], ["too old"]),
        ("old", 801, "CUDA_ERROR_NOT_SUPPORTED", ["older than CUDA 12.0", "install a driver"], []),
        (
            "lacking:cuGetErrorName",
            500,
            "CUDA_ERROR_NOT_FOUND",
            ["cuGetErrorName", "not a complete NVIDIA driver"],
            ["too old", "older than"],
        ),
        (
            "lacking:cuCtxGetId",
            500,
            "CUDA_ERROR_NOT_FOUND",
            ["cuCtxGetId", "not a complete NVIDIA driver"],
            ["too old", "older than"],
        ),
    ],
)
def test_driver_load_errors_say_what_their_code_means(tmp_path, kind, code, name, says, not_said):
    from helpers.children import run_python
    from helpers.fakelibs import compiler, fake_libcuda, preload

    if compiler() is None:
        pytest.skip("no C compiler")
    import json

    out = run_python(LOAD_CHILD, preload(fake_libcuda(tmp_path, kind)))
    cls, got_code, got_name, call, msg = json.loads(out.stdout.strip().splitlines()[-1])
    assert (cls, got_code, got_name, call) == (
        "DriverError",
        code,
        name,
        "loading the CUDA driver",
    ), msg
    assert "unrecognised" not in msg, msg
    for s in says:
        assert s in msg, msg
    for s in not_said:
        assert s not in msg, msg


def test_error_names_and_texts_without_a_driver_cover_cyctxs_own_codes():
    # Every code the load can return has a name and a text of its own, without a driver to ask.
    from cyctx import _errors

    for code in (34, 100, 500, 801, 2):
        name, text = _errors.fallback_name_and_string(code)
        assert name.startswith("CUDA_ERROR_") and text and "unrecognised" not in text, code
