"""cyctx.cuda_initialized() and cyctx.warn_on_fork(): whether CUDA is initialised in this process,
asked of the driver already mapped without loading or initialising it, and the opt-in warning in
the parent of a fork of such a process, for every way Python forks."""

import json
import multiprocessing

import pytest
from helpers.children import run_child, run_python

import cyctx

# --- cuda_initialized ---------------------------------------------------------------------------


def test_false_without_a_mapped_driver_and_maps_none():
    # A fresh interpreter that selected no driver: import cyctx maps no libcuda, and the question
    # must not map one either.
    out = run_python(
        """
        import json, cyctx
        from _cyctx_libcuda import loaded_libcuda
        before = loaded_libcuda()
        answer = cyctx.cuda_initialized()
        print(json.dumps([before, answer, loaded_libcuda()]))
        """
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [None, False, None]


# A child that maps the driver without initialising it, on either driver: the simulator is
# mapped by the prologue's selection; the real libcuda.so.1 is mapped by cuda.bindings only at
# its first call, so the child maps it itself with a plain dlopen (no cuInit) when it is not
# mapped yet. Then: cyctx's answer twice, cuda.bindings' first call (which loads its own view of
# the driver), cyctx's answer, the driver's own cuDeviceGetCount code, cuInit, cyctx's answer.
MAPPED_CHILD = """
    import ctypes, json, cyctx
    from helpers.drivers import driver
    from _cyctx_libcuda import loaded_libcuda
    r = {"mapped by the prologue": loaded_libcuda() is not None}
    if loaded_libcuda() is None:
        ctypes.CDLL("libcuda.so.1")
    r["mapped"] = loaded_libcuda() is not None
    r["answers"] = [cyctx.cuda_initialized(), cyctx.cuda_initialized()]
    d = driver()
    r["cuDriverGetVersion"] = d.cuDriverGetVersion()[0].name
    r["after bindings' first call"] = cyctx.cuda_initialized()
    r["cuDeviceGetCount"] = int(d.cuDeviceGetCount()[0])
    r["cuInit"] = d.cuInit(0)[0].name
    r["after cuInit"] = cyctx.cuda_initialized()
    print("RESULT", json.dumps(r))
"""


def test_mapped_but_not_initialised_then_initialised_by_someone_else():
    # Mapped, no cuInit: False, twice (asking initialises nothing: the driver still answers
    # cuDeviceGetCount CUDA_ERROR_NOT_INITIALIZED), and still False after another library
    # called into the driver without cuInit. After cuda.bindings' cuInit: True.
    from helpers import drivers

    out = run_child(MAPPED_CHILD, init=False)
    r = json.loads(out.stdout.split("RESULT", 1)[1])
    want = {
        # the prologue's selection maps the simulator; nothing maps the real driver
        "mapped by the prologue": drivers.KIND == "sim",
        "mapped": True,
        "answers": [False, False],
        "cuDriverGetVersion": "CUDA_SUCCESS",
        "after bindings' first call": False,
        "cuDeviceGetCount": 3,  # CUDA_ERROR_NOT_INITIALIZED
        "cuInit": "CUDA_SUCCESS",
        "after cuInit": True,
    }
    assert r == want, r


def test_true_here_and_false_in_a_forked_child():
    # This test process initialised CUDA (tests/conftest.py); its forked child cannot use it.
    from helpers.forking import run_forked

    assert cyctx.cuda_initialized() is True
    assert run_forked(cyctx.cuda_initialized) is False
    assert cyctx.cuda_initialized() is True


@pytest.mark.parametrize("code", [999, 4, 46])  # UNKNOWN, DEINITIALIZED, DEVICE_UNAVAILABLE
def test_any_other_driver_answer_is_raised_not_guessed(sim, code):
    sim.inject_fault("cuDeviceGetCount", code)
    try:
        with pytest.raises(cyctx.DriverError) as e:
            cyctx.cuda_initialized()
    finally:
        sim.clear_faults()
    assert e.value.code == code and e.value.call == "cuDeviceGetCount"
    assert cyctx.cuda_initialized() is True  # nothing was left behind


WRONG = [
    ("stub", "CUDA_ERROR_STUB_LIBRARY"),
    ("lacking:cuDeviceGetCount", "has no cuDeviceGetCount"),
    ("old", "(999)"),
]


@pytest.mark.parametrize("kind, words", WRONG, ids=[w[0] for w in WRONG])
def test_a_wrong_driver_library_is_an_error_not_an_answer(tmp_path, kind, words):
    from helpers.fakelibs import fake_libcuda, preload

    out = run_python(
        """
        import cyctx
        try:
            print("ANSWER", cyctx.cuda_initialized())
        except cyctx.CyctxError as e:
            print("ERROR", type(e).__name__, e)
        """,
        preload(fake_libcuda(tmp_path, kind)),
    )
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("ERROR") and words in line, line
    assert "cannot tell" in line or "has no" in line, line


def test_a_mapped_file_that_is_not_a_loaded_library_is_false_and_stays_unloaded(tmp_path):
    # A driver library mapped with mmap (not dlopen): nothing can have called into it, and the
    # question must not load it (this one would answer CUDA_ERROR_STUB_LIBRARY if loaded).
    from helpers.fakelibs import fake_libcuda

    path = fake_libcuda(tmp_path, "stub")
    out = run_python(
        f"""
        import ctypes, mmap, os, cyctx
        from _cyctx_libcuda import loaded_libcuda
        f = open({path!r}, "rb")
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        answer = cyctx.cuda_initialized()
        libc = ctypes.CDLL(None)
        libc.dlopen.restype, libc.dlopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
        loaded = bool(libc.dlopen({path!r}.encode(), os.RTLD_NOLOAD | os.RTLD_LAZY))
        print(loaded_libcuda() == {path!r}, answer, loaded)
        """
    )
    assert out.stdout.split() == ["True", "False", "False"]


def test_a_driver_the_loader_would_find_is_not_loaded_by_the_question(tmp_path):
    # A libcuda.so.1 on the library path but not loaded (a GPU machine before anyone used
    # CUDA): False, and the question loads nothing (this one would answer STUB_LIBRARY).
    import os

    from helpers.fakelibs import fake_libcuda

    path = fake_libcuda(tmp_path, "stub")
    env = {**os.environ, "LD_LIBRARY_PATH": os.path.dirname(path)}
    out = run_python(
        """
        import cyctx
        from _cyctx_libcuda import loaded_libcuda
        print(cyctx.cuda_initialized(), loaded_libcuda())
        """,
        env=env,
    )
    assert out.stdout.split() == ["False", "None"], out.stdout


def test_asking_keeps_no_reference_to_the_driver(tmp_path):
    # The library's one owner closes it: it is unloaded, so cyctx's NOLOAD open was given back.
    from helpers.fakelibs import fake_libcuda

    path = fake_libcuda(tmp_path, "stub")
    out = run_python(
        f"""
        import ctypes, os, cyctx
        libc = ctypes.CDLL(None)
        libc.dlopen.restype, libc.dlopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
        libc.dlclose.argtypes = [ctypes.c_void_p]
        h = libc.dlopen({path!r}.encode(), os.RTLD_NOW)
        for _ in range(3):
            try:
                cyctx.cuda_initialized()
            except cyctx.DriverError:
                pass
        libc.dlclose(h)
        print(bool(libc.dlopen({path!r}.encode(), os.RTLD_NOLOAD | os.RTLD_LAZY)))
        """
    )
    assert out.stdout.split() == ["False"]


# --- warn_on_fork -------------------------------------------------------------------------------

# {fork} forks once, in the parent's main thread; the child leaves at once. The child prints
# the warnings the parent got: category, whether the message has each fact, the line warned.
WARN_CHILD = """
    import json, os, sys, warnings, multiprocessing
    import cyctx
    {setup}
    def nothing():
        pass
    def forked():
        {fork}
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        forked()
    out = [[w.category.__name__, "'spawn'" in str(w.message), str(os.getpid()) in str(w.message),
            "CUDA_ERROR_NOT_INITIALIZED" in str(w.message), os.path.basename(w.filename)]
           for w in got]
    print("WARNINGS", json.dumps(out))
"""

FORKS = {
    "os.fork": """pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)""",
    "multiprocessing-fork": """p = multiprocessing.get_context("fork").Process(target=nothing)
        p.start(); p.join()
        assert p.exitcode == 0""",
    "ProcessPoolExecutor-fork": """from concurrent.futures import ProcessPoolExecutor
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(1, mp_context=ctx) as ex:
            assert ex.submit(sum, [1, 2]).result() == 3""",
}


def _warnings(setup, fork, init=True):
    out = run_child(WARN_CHILD.format(setup=setup, fork=FORKS[fork]), init=init)
    return json.loads(out.stdout.split("WARNINGS", 1)[1])


# The line warned is the one that called os.fork(): the caller's own for os.fork, the
# multiprocessing module's where it forks for the caller.
WARNED_FILE = {
    "os.fork": "<string>",
    "multiprocessing-fork": "popen_fork.py",
    "ProcessPoolExecutor-fork": "popen_fork.py",
}


@pytest.mark.parametrize("fork", list(FORKS))
def test_fork_with_cuda_initialised_warns_in_the_parent(fork):
    got = _warnings("cyctx.warn_on_fork()", fork)
    assert got == [["ForkWarning", True, True, True, WARNED_FILE[fork]]], got


@pytest.mark.parametrize("fork", list(FORKS))
def test_import_cyctx_installs_no_fork_warning(fork):
    assert _warnings("", fork) == []


@pytest.mark.parametrize("fork", list(FORKS))
def test_no_warning_while_cuda_is_not_initialised(fork):
    # The driver is mapped (on the real driver the child maps it, as MAPPED_CHILD does) but
    # nobody called cuInit: the child can use CUDA, so no warning.
    setup = (
        "import ctypes; from _cyctx_libcuda import loaded_libcuda\n"
        "    loaded_libcuda() or ctypes.CDLL('libcuda.so.1')\n"
        "    assert loaded_libcuda(); cyctx.warn_on_fork()"
    )
    assert _warnings(setup, fork, init=False) == []


def test_processpoolexecutor_with_linux_default_start_method():
    # ProcessPoolExecutor() as users write it: Linux's default start method is 'fork' up to
    # Python 3.13 (the parent is forked: it warns) and 'forkserver' from 3.14 (the workers come
    # from a fresh server process, not a fork of this one: the child can use CUDA, no warning).
    out = run_child(
        """
        import json, multiprocessing, warnings
        from concurrent.futures import ProcessPoolExecutor
        import cyctx
        cyctx.warn_on_fork()
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
            with ProcessPoolExecutor(1) as ex:
                assert ex.submit(sum, [1, 2]).result() == 3
        print("RESULT", json.dumps([multiprocessing.get_start_method(),
                                    [w.category.__name__ for w in got]]))
        """
    )
    method, got = json.loads(out.stdout.split("RESULT", 1)[1])
    assert method == multiprocessing.get_all_start_methods()[0]  # the platform's default
    assert got == (["ForkWarning"] if method == "fork" else []), (method, got)


def test_warn_on_fork_false_turns_it_off_and_true_on_again_once():
    got = _warnings("cyctx.warn_on_fork(); cyctx.warn_on_fork(False)\n    ", "os.fork") + _warnings(
        "cyctx.warn_on_fork(); cyctx.warn_on_fork(); cyctx.warn_on_fork()", "os.fork"
    )
    # off after False; a single warning however often it was asked for
    assert got == [["ForkWarning", True, True, True, "<string>"]], got


def test_warn_on_fork_refuses_a_non_bool_and_changes_nothing():
    out = run_child(
        """
        import cyctx, cyctx._fork as f
        for bad in (1, None, "yes"):
            try:
                cyctx.warn_on_fork(bad)
                print("no-error")
            except TypeError as e:
                print("TypeError", "bool" in str(e))
        print(f._installed, f._enabled)
        """
    )
    assert out.stdout.split() == ["TypeError", "True"] * 3 + ["False", "False"]


def test_the_warning_names_the_cuda_libraries_loaded(tmp_path):
    from helpers.fakelibs import fake_cuda_library

    rt = fake_cuda_library(tmp_path, "cudart", 12090)
    rtc = fake_cuda_library(tmp_path, "nvrtc", 13000)
    out = run_child(
        f"""
        import ctypes, os, warnings, cyctx
        ctypes.CDLL({rt!r}); ctypes.CDLL({rtc!r})
        cyctx.warn_on_fork()
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        print("MSG", str(got[0].message))
        """
    )
    msg = out.stdout.split("MSG", 1)[1]
    assert "libcudart.so.12" in msg and "libnvrtc.so.13" in msg, msg
    assert "libcuda.so" not in msg.split("did:", 1)[1], msg  # the driver is no candidate


def test_the_warning_says_so_when_only_the_driver_is_loaded():
    from cyctx._fork import cuda_libraries, fork_message

    msg = fork_message([])
    assert "no CUDA library but the driver" in msg and "'spawn'" in msg
    named = fork_message(["/x/libcublas.so.12"])
    assert "libcublas.so.12" in named and "one of which did" in named
    assert all(not p.endswith("libcuda.so.1") for p in cuda_libraries())


def test_an_error_filter_does_not_stop_the_fork():
    # warnings as errors: Python reports the hook's error as unraisable, and the fork goes on.
    out = run_child(
        """
        import os, sys, warnings, cyctx
        cyctx.warn_on_fork()
        warnings.simplefilter("error", cyctx.ForkWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        print("CHILD", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        """
    )
    assert "CHILD 7" in out.stdout and "ForkWarning" in out.stderr, out.stderr
