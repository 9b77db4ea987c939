"""Two points of the doctor's output, called in the user's program (cyctx.diagnose()): the JSON
of the calling thread's current context (null when none is current, an object when the driver
could not say; the one of a current context is test_doctor.py's schema test), and the labels
the human report puts on the caller's thread."""

import threading

from helpers.drivers import driver, ok
from helpers.threads import in_thread

import cyctx


def test_the_json_says_null_when_no_context_is_current():
    def body():
        assert int(ok(driver().cuCtxGetCurrent())) == 0  # a new thread: nothing current
        return cyctx.diagnose(cudart=False).to_dict()["thread"]

    thread = in_thread(body)
    assert thread["current_context"] is None, thread


def test_the_json_says_when_the_driver_could_not_tell_what_is_current(sim):
    # Not "none": a failed cuCtxGetCurrent is reported as the error it is.
    def body():
        sim.inject_fault("cuCtxGetCurrent", 999, count=1000)
        try:
            return cyctx.diagnose(cudart=False).to_dict()["thread"]["current_context"]
        finally:
            sim.clear_faults()

    ctx = in_thread(body)
    assert ctx is not None and ctx["error"], ctx


def test_the_report_labels_the_callers_thread():
    # diagnose() on a worker thread describes that thread (its name and OS thread id), not the
    # main thread; and in the user's program it does not claim to run in a new process.
    seen = {}

    def body():
        seen["native"] = threading.get_native_id()
        r = cyctx.diagnose(cudart=False)
        return r.to_dict()["thread"], r.render(), r.render(cli=True)

    t = threading.Thread(target=lambda: seen.update(out=body()), name="cyctx-worker-7")
    t.start()
    t.join(120)
    thread, text, cli_text = seen["out"]
    assert seen["native"] != threading.get_native_id()
    assert thread["name"] == "cyctx-worker-7" and thread["native_id"] == seen["native"], thread
    assert f"This thread: cyctx-worker-7 (native id {seen['native']})" in text, text
    assert "none (cuCtxGetCurrent returned NULL)" in text, text
    assert "the doctor runs in a new process" not in " ".join(text.split()), text
    # The CLI's report is of its own new process, and says so where it explains what is seen.
    assert "the doctor runs in a new process" in " ".join(cli_text.split()), cli_text
