"""Interpreter exit while daemon threads loop inside guards, on a loaded machine. A daemon thread
that wants the GIL back during finalization is ended there (pthread_exit on 3.11-3.13): the
unwinding must meet no noexcept frame ("terminate called without an active exception") and
leave no native state held, wherever cyctx's native code takes the GIL or runs Python code.
"""

import subprocess
import sys

import pytest
from helpers.children import run_child

CHILD = """
    import gc, threading, time, warnings, cyctx
    from cuda.bindings import driver as d

    warnings.simplefilter("always")
    warnings.showwarning = lambda *a, **k: None  # Python code on every warning, none printed
    shared = cyctx.device(0)
    own = cyctx.ContextGuard(D1)
    dev0 = d.cuDeviceGet(0)[1]

    def nested():
        with shared:
            with own:
                with shared:
                    pass

    def resets():
        d.cuDevicePrimaryCtxReset(dev0)  # the next enter re-activates it, warning
        with own:
            with shared:
                pass

    def orphans():
        with own:
            cyctx.ContextGuard(0).__enter__()  # freed while entered: own's exit drops it, warning

    def misuse():
        own.__exit__(None, None, None)  # no enter on this thread: GuardError

    def temporaries():
        with cyctx.ContextGuard(D1):  # constructed (the GIL released and taken back), collected
            pass
        gc.collect(0)

    def forever(f):
        def loop():
            while True:
                try:
                    f()
                except Exception:  # GuardError; a reset under another thread's block
                    pass
        return loop

    for f in (nested, resets, orphans, misuse, temporaries) * 2:
        threading.Thread(target=forever(f), daemon=True).start()
    time.sleep(0.05)
    print("END", flush=True)
"""

RUNS = 10


@pytest.mark.slow
def test_exit_with_daemon_threads_inside_guards_on_a_loaded_machine():
    # Two busy processes load the (2-core) machine, as a CI runner or a shared host is.
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        results = [run_child(CHILD, check=False, timeout=120) for _ in range(RUNS)]
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    bad = [
        (r.returncode, r.stderr[-400:])
        for r in results
        if r.returncode != 0
        or "END" not in r.stdout
        or "terminate called" in r.stderr
        or "Fatal Python error" in r.stderr
    ]
    assert bad == [], f"{len(bad)} of {RUNS} exits were not clean: {bad[:3]}"
