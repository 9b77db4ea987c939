"""The labels the doctor's human report puts on the caller's thread, called in the user's program
(cyctx.diagnose())."""

import threading

import cyctx


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
