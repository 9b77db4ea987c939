"""What each of these errors says: what happened and what to do, in at most two sentences,
and only what is true (a refused re-activation does not claim one; a missing driver library
is not a missing device)."""

import itertools
import os
import subprocess
import sys
import warnings

import pytest
from helpers.drivers import current, reset_primary
from helpers.threads import in_thread
from helpers.words import sentences

import cyctx
from cyctx import ContextGuard, ContextResetWarning, GuardError, _errors

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sentences_helper_counts_sentences():
    assert sentences("a b. c d.") == ["a b.", "c d."]
    assert len(sentences("<cyctx.ContextGuard device=0>: x (libcuda.so.1). Do y.")) == 2
    assert len(sentences("One. Two. Three")) == 3


# --- the reset refused ---------------------------------------------------------------------


@pytest.mark.parametrize("reactivated_elsewhere", [False, True])
def test_a_refused_reset_says_it_was_refused(sim, reactivated_elsewhere):
    from helpers.drivers import driver, ok

    def body():
        g = ContextGuard(0)
        reset_primary(0)
        d = driver()
        dev = ok(d.cuDeviceGet(0))
        if reactivated_elsewhere:
            ok(d.cuDevicePrimaryCtxRetain(dev))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", ContextResetWarning)
                with pytest.raises(ContextResetWarning) as ei:
                    with g:
                        pass
            assert sim.primary_active(0) == reactivated_elsewhere, "refused: nothing changed"
            with pytest.warns(ContextResetWarning):  # the reset is still seen by the next enter
                with g:
                    pass
        finally:
            if reactivated_elsewhere:
                ok(d.cuDevicePrimaryCtxRelease(dev))
            g.close()
        return str(ei.value), current()

    msg, cur = in_thread(body)
    assert cur == 0
    assert "re-activates it" not in msg and "refused to re-activate it" in msg, msg
    assert "changed nothing" in msg and "device 0's primary context was reset" in msg, msg
    assert len(sentences(msg)) <= 2, msg


def test_an_allowed_reset_still_says_it_is_re_activated(sim):
    def body():
        g = ContextGuard(0)
        reset_primary(0)
        with pytest.warns(ContextResetWarning) as rec:
            with g:
                pass
        g.close()
        return str(rec[0].message)

    msg = in_thread(body)
    assert "cyctx re-activates it" in msg and "refused" not in msg, msg
    assert len(sentences(msg)) <= 2, msg


# --- exit without enter, handed a value that is not an exception ------------------------------


@pytest.mark.parametrize(
    "args",
    [
        (str, "boom", None),
        (ValueError, ValueError, None),  # the class, not an instance
        (int, 1, None),
        (None, object(), None),
    ],
    ids=["str", "exception class", "int", "object"],
)
def test_exit_without_enter_is_raised_whatever_the_exception_value(guard, args, capfd):
    with pytest.raises(GuardError, match="exit without a matching enter on this thread"):
        guard.__exit__(*args)
    assert "exit without" not in capfd.readouterr().err, "raised, not only written to stderr"


def test_exit_without_enter_with_a_real_exception_rides_on_it(guard):
    # A real exception in flight wins, and carries the failure as a note (docs/guarantees.md).
    exc = KeyError("k")
    assert guard.__exit__(KeyError, exc, None) is False
    assert any("exit without a matching enter" in n for n in exc.__notes__), exc.__notes__


def test_a_hand_made_exit_of_an_entered_guard_leaves_it(guard):
    guard.__enter__()
    assert current() == guard.handle
    assert guard.__exit__(str, "boom", None) is False
    assert current() == 0


# --- the out-of-order exit ---------------------------------------------------------------------


def test_the_out_of_order_exit_says_it_in_two_sentences(guard, guard1):
    def body():
        guard.__enter__()
        guard1.__enter__()
        with pytest.raises(GuardError) as ei:
            guard.__exit__(None, None, None)
        guard1.__exit__(None, None, None)
        return str(ei.value), current()

    msg, cur = in_thread(body)
    assert cur == 0
    assert "exit out of order" in msg and "Its entry was removed" in msg, msg
    assert "reverse order of entry" in msg, msg
    assert len(sentences(msg)) == 2, msg


@pytest.mark.parametrize(
    "entered_here, same_on_top, dropped, removed, generator",
    list(itertools.product([True, False], [True, False], [0, 1, 3], [True, False], [True, False])),
)
def test_every_exit_misuse_message_has_at_most_two_sentences(
    entered_here, same_on_top, dropped, removed, generator
):
    guard = "<cyctx.ContextGuard device=0 ctx=0x7f00 id=1>"
    msg = str(_errors.exit_misuse(guard, entered_here, same_on_top, 2, dropped, removed, generator))
    assert len(sentences(msg)) <= 2, msg
    if dropped:
        assert f"{dropped} entr" in msg and "freed while entered" in msg, msg


# --- diagnose(cudart=...) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", [1.5, 0, ["/lib/libcudart.so"], object()], ids=["float", "int", "list", "object"]
)
def test_diagnose_refuses_a_cudart_that_is_not_a_path(bad):
    with pytest.raises(TypeError, match=r"diagnose\(cudart=\.\.\.\) takes a path") as ei:
        cyctx.diagnose(cudart=bad)
    assert type(bad).__name__ in str(ei.value)


def test_diagnose_refuses_an_empty_cudart_path():
    with pytest.raises(ValueError, match="the path is empty"):
        cyctx.diagnose(cudart="")


@pytest.mark.parametrize("how", ["str", "bytes", "pathlike", "pathlike-bytes"])
def test_diagnose_takes_bytes_and_path_likes_as_paths(tmp_path, how):
    import pathlib

    missing = str(tmp_path / "libcudart.so.99")
    arg = {
        "str": missing,
        "bytes": os.fsencode(missing),
        "pathlike": pathlib.Path(missing),
        "pathlike-bytes": _BytesPath(os.fsencode(missing)),
    }[how]
    report = cyctx.diagnose(cudart=arg)
    if report.runtime is not None and not report.simulated:  # the runtime was looked for
        assert missing in (report.runtime.note or ""), report.runtime
    else:  # on the simulated driver no libcudart is asked; the path still reached the doctor
        from cyctx._doctor.findings import _cudart_path

        assert _cudart_path(arg) == missing


class _BytesPath:
    def __init__(self, b):
        self.b = b

    def __fspath__(self):
        return self.b


# --- no driver library -------------------------------------------------------------------------


def test_a_missing_driver_library_says_the_library_is_missing():
    probe = subprocess.run(
        [sys.executable, "-c", "import ctypes; ctypes.CDLL('libcuda.so.1')"], capture_output=True
    )
    if probe.returncode == 0:
        pytest.skip("a libcuda.so.1 is installed on this machine")
    code = (
        "import cyctx\ntry:\n    cyctx.ContextGuard(0)\nexcept cyctx.NoDeviceError as e:\n"
        "    print(e.code, e.name, e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CYCTX_TEST_DRIVER"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout.startswith("100 CUDA_ERROR_NO_DEVICE "), proc
    msg = proc.stdout.strip().split(" ", 2)[2]
    assert "unrecognised" not in msg, msg
    assert "libcuda.so.1, the NVIDIA driver's library, is missing" in msg, msg
    assert "CUDA-capable" not in msg and "Dlopen" not in msg, msg
    assert "cyctx doctor --simulate" in msg and len(sentences(msg)) <= 2, msg


# --- pytest --driver=real without a driver -------------------------------------------------------


def test_pytest_driver_real_without_a_gpu_is_a_usage_error():
    from cyctx import testing

    if testing.real_driver_available():
        pytest.skip("this machine has an NVIDIA driver")
    env = {k: v for k, v in os.environ.items() if k != "CYCTX_TEST_DRIVER"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--driver=real",
            "-p",
            "no:cacheprovider",
            "-q",
            os.path.join(TESTS, "test_layout.py"),
        ],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(TESTS),
        env=env,
        timeout=120,
    )
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "INTERNALERROR" not in proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "ERROR: --driver=real, but no NVIDIA driver with a GPU loads here: run on a GPU "
        "machine, or use --driver=sim (or auto)"
    ], proc.stderr


class _ReprRaises(ContextGuard):
    def __repr__(self):
        raise RuntimeError("repr of a guard subclass")


def test_a_closed_guard_whose_repr_raises_is_still_closed_and_the_doctor_skips_it():
    # A subclass may override __repr__; the error for a closed guard names its type instead,
    # and the doctor, which reads every live guard's handle while other threads may close
    # them, leaves the closed one out.
    g = _ReprRaises(0)
    g.close()
    with pytest.raises(GuardError, match=r"<_ReprRaises object> is closed"):
        _ = g.handle
    with pytest.raises(GuardError, match="is closed"):
        with g:
            pass
    report = cyctx.diagnose(cudart=False)
    assert all(info.handle for info in report.guards)
