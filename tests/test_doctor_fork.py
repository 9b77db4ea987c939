"""cyctx.diagnose(before_fork=True), asked from a process about to fork: "CUDA is initialised; a
forked child cannot use it" where anyone initialised CUDA, and where nobody has, a note that a
child can use it, without the doctor initialising CUDA itself (a child forked after the question
can still use CUDA)."""

import json

import pytest
from helpers.children import run_child

import cyctx
from cyctx._doctor.words import fork_ahead

TITLE = "CUDA is initialised; a forked child cannot use it"

# The child prints the findings, whether CUDA was initialised before and after the question,
# whether devices were described, and (fork) what a child forked after it got from cuInit.
CHILD = """
    import json, os, ctypes
    import cyctx
    from _cyctx_libcuda import loaded_libcuda
    {setup}
    before = cyctx.cuda_initialized()
    r = cyctx.diagnose(cudart=False{flag})
    text = str(r)
    after = cyctx.cuda_initialized()
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        from cuda.bindings import driver as d
        os.write(wfd, d.cuInit(0)[0].name.encode())
        os._exit(0)
    os.close(wfd)
    child = os.read(rfd, 200).decode()
    os.waitpid(pid, 0)
    out = {{"before": before, "after": after, "devices": len(r.devices), "child cuInit": child,
           "findings": [[f.code, f.severity, f.title, f.explanation, f.fix] for f in r.findings],
           "text": text, "exit": r.exit_status, "pid": os.getpid()}}
    print("RESULT", json.dumps(out))
"""


def ask(setup="", flag=", before_fork=True", init=True):
    out = run_child(CHILD.format(setup=setup, flag=flag), init=init)
    return json.loads(out.stdout.split("RESULT", 1)[1])


def codes(r):
    return [f[0] for f in r["findings"]]


def test_initialised_it_warns_with_the_fix_and_the_report_is_whole():
    r = ask()
    (f,) = [f for f in r["findings"] if f[0] == "cuda_initialised_before_fork"]
    code, severity, title, explanation, fix = f
    assert (severity, title) == ("warning", TITLE), f
    assert f"pid {r['pid']}" in explanation and "CUDA_ERROR_NOT_INITIALIZED" in explanation, f
    assert "'spawn'" in fix and "warn_on_fork" in fix, f
    assert TITLE in r["text"]
    # what the warning says is true: the forked child's cuInit is refused
    assert (r["before"], r["after"], r["child cuInit"]) == (
        True,
        True,
        "CUDA_ERROR_NOT_INITIALIZED",
    ), r
    assert r["devices"] >= 1 and r["exit"] == 0, r  # a warning; the usual report besides


# Maps the driver without initialising it (as tests/test_fork_checks.py's MAPPED_CHILD does),
# so the question is asked of a loaded driver on both drivers.
MAP = "loaded_libcuda() or ctypes.CDLL('libcuda.so.1')"


@pytest.mark.parametrize("setup", ["", MAP], ids=["driver-not-mapped", "driver-mapped"])
def test_not_initialised_the_doctor_does_not_initialise_it_and_a_child_can_use_cuda(setup):
    r = ask(setup, init=False)
    assert codes(r) == ["fork_safe"], r["findings"]
    (f,) = r["findings"]
    assert f[1] == "info" and f[2] == "CUDA is not initialised; a forked child can use it", f
    assert (r["before"], r["after"], r["devices"]) == (False, False, 0), r
    assert r["child cuInit"] == "CUDA_SUCCESS", r  # the fork after the question can use CUDA
    assert "The doctor did not initialise it" in r["text"] and r["exit"] == 0, r["text"]


@pytest.mark.parametrize("bad", [1, None, "yes"])
def test_before_fork_must_be_a_bool(bad):
    with pytest.raises(TypeError, match="a bool"):
        cyctx.diagnose(before_fork=bad)


def test_the_warning_names_the_cuda_libraries_or_says_there_are_none():
    named = fork_ahead(["/x/libcublas.so.12", "/y/libcudart.so.13"])
    assert "libcublas.so.12, libcudart.so.13" in named.explanation
    bare = fork_ahead([])
    assert "No CUDA library but the driver" in bare.explanation
    assert named.title == bare.title == TITLE


def test_an_unusable_driver_is_reported_and_no_fork_answer_is_guessed(tmp_path):
    # The toolkit's stub as libcuda.so.1: cuda_initialized() cannot tell (it raises); the
    # report says what is wrong with the library and gives no fork finding either way.
    from helpers.children import run_python
    from helpers.fakelibs import fake_libcuda, preload

    out = run_python(
        """
        import json, cyctx
        r = cyctx.diagnose(cudart=False, before_fork=True)
        print("RESULT", json.dumps([[f.code, f.severity] for f in r.findings]))
        """,
        preload(fake_libcuda(tmp_path, "stub")),
    )
    found = json.loads(out.stdout.split("RESULT", 1)[1])
    assert [s for _, s in found] == ["unavailable"], found
    assert not {"cuda_initialised_before_fork", "fork_safe"} & {c for c, _ in found}, found
