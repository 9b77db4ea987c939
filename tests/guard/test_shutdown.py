"""Interpreter exit with guards alive: module-level guards, threads ended or still running
inside blocks, suspended generators, orphaned entries, atexit handlers and finalizers that
use guards. The process exits cleanly and releases what it can."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers.children import run_child

SHUTDOWN = """
    import threading, time, cyctx
    from cuda.bindings import driver as d
    d.cuInit(0)
    last = d.cuDeviceGetCount()[1] - 1             # device 1 where there are two
    g = cyctx.ContextGuard(0)                      # module global, never closed
    s = cyctx.ContextGuard.shared(0)
    h = cyctx.ContextGuard(last)
    def ends_inside():
        g.__enter__()                             # the thread ends while entered
        h.__enter__()
    t = threading.Thread(target=ends_inside); t.start(); t.join()
    def daemon():
        while True:
            with g:
                with h:
                    time.sleep(0.0005)
    threading.Thread(target=daemon, daemon=True).start()
    time.sleep(0.01)
    h.__enter__()                                  # the main thread exits inside a guard
    print("END")
"""


def _shutdown_once(_):
    return run_child(SHUTDOWN, check=False, timeout=120)


@pytest.mark.slow
def test_shutdown_with_live_guards_100_runs():
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(_shutdown_once, range(100)))
    bad = [
        (r.returncode, r.stderr[-500:])
        for r in results
        if r.returncode != 0 or r.stderr.strip() or "END" not in r.stdout
    ]
    assert bad == [], f"{len(bad)} of 100 runs did not exit cleanly: {bad[:3]}"


def test_shutdown_with_suspended_generators_orphans_and_atexit_users(sim):
    out = run_child(
        """
        import atexit, cyctx
        g = cyctx.ContextGuard(0)
        def gen():
            with g:
                yield
        it = gen(); next(it)                       # suspended inside a block at exit
        cyctx.ContextGuard(D1).__enter__()          # an orphaned entry at exit
        def at_exit():
            with cyctx.ContextGuard.shared(D1):
                with g:
                    pass
        atexit.register(at_exit)
        class Late:
            def __del__(self):
                with g:
                    pass
        late = Late()
        print("END")
    """,
        timeout=120,
        check=False,
        env={"CYCTX_SIM_REPORT_AT_EXIT": "1"},
    )
    assert out.returncode == 0 and "END" in out.stdout, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "Fatal" not in out.stderr, out.stderr[-2000:]
    assert "cyctxsim at exit:" in out.stderr
