"""ContextGuard.shared(): one guard per device for the life of the process, never closed. Making
it asks nothing of the driver; its first use (a `with`, its handle) retains, and holds no lock
across driver calls or Python code: re-entered, raced, stalled or forked inside, it neither
hangs nor takes a second retain. Hangs are tried in a child with a timeout."""

from helpers.children import run_child


def test_shared_guard_is_one_object_and_not_closable():
    # In a child: the shared guard holds its retain until the process ends.
    out = run_child("""
        import cyctx
        from cyctx import ContextGuard, GuardError
        from helpers.threads import run_threads
        got = run_threads(*[lambda: ContextGuard.shared(0)] * 8)
        a = ContextGuard.shared(0)
        assert all(g is a for g in got) and a.is_shared
        try:
            a.close()
        except GuardError as e:
            print("REFUSED", "shared" in str(e))
        with a:
            print("CURRENT", drivers.current() == a.handle)
        if drivers.SIM:
            print("RETAINS", drivers.SIM.retain_count(0))
    """)
    assert "REFUSED True" in out.stdout and "CURRENT True" in out.stdout
    if "RETAINS" in out.stdout:
        assert "RETAINS 1" in out.stdout


# --- the first shared(): no lock across driver calls or Python code ---------------------------

# sys.settrace's hook runs Python code at a deterministic point inside the first shared(): the
# recognition of its argument (cyctx/_inputs.py), the one Python code it runs (the construction
# runs none): a lock held there (a non-reentrant one) would deadlock a shared() called from that
# point. Inside the driver calls, where the GIL is released, other threads run: the stall tests.
TRACE_INSIDE_SHARED = """
    import sys, cyctx
    fired = []
    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "shared_ordinal" and not fired:
            fired.append(1)
            sys.settrace(None)
            {action}
        return None
    sys.settrace(tracer)
    g = cyctx.ContextGuard.shared(D1)
    sys.settrace(None)
    print("FIRED", bool(fired), "SAME", g is cyctx.ContextGuard.shared(D1))
"""


def test_fork_inside_first_shared_gives_the_child_ForkError_not_a_hang():
    # A hang would be the child's: its timeout is below the whole child's, to be reported.
    action = """
            from helpers.forking import raised_in_fork
            print("CHILD", raised_in_fork(lambda: cyctx.ContextGuard.shared(D1).handle, timeout=30))
    """
    out = run_child(TRACE_INSIDE_SHARED.format(action=action.strip()), timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "CHILD ForkError" in out.stdout and "FIRED True SAME True" in out.stdout, out.stdout


def test_shared_reentered_from_python_code_inside_shared_does_not_deadlock(sim):
    action = """
            inner = cyctx.ContextGuard.shared(D1)
            print("INNER", inner.is_shared)
    """
    out = run_child(
        TRACE_INSIDE_SHARED.format(action=action.strip())
        + """
    with g:
        print("RETAINS", drivers.SIM.retain_count(1))
    """,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "INNER True" in out.stdout and "FIRED True SAME True" in out.stdout
    assert "RETAINS 1" in out.stdout, "one retain held: the shared guard's"


def test_shared_from_a_finalizer_during_shared(sim):
    # A __del__ that uses shared(), run by the garbage collector inside the first shared().
    out = run_child(
        """
        import gc, sys, cyctx
        got = []
        class Cyc:
            def __del__(self):
                got.append(cyctx.ContextGuard.shared(D1))
        def tracer(frame, event, arg):
            if event == "call" and frame.f_code.co_name == "shared_ordinal" and not got:
                sys.settrace(None)
                c = Cyc(); c.me = c; del c
                gc.collect()
            return None
        sys.settrace(tracer)
        g = cyctx.ContextGuard.shared(D1)
        sys.settrace(None)
        with got[0]:
            print("OK", got[0] is g, drivers.SIM.retain_count(1))
    """,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "OK True 1" in out.stdout


def test_thread_stalled_inside_the_first_shared_does_not_block_others(sim):
    # A thread that stops inside the shared guard's first use (here: forever, as a daemon thread
    # frozen at interpreter shutdown would) must hold no lock, or every other caller hangs.
    out = run_child(
        """
        import threading, time, cyctx
        sim = drivers.SIM
        sim.stall("cuDevicePrimaryCtxRetain")  # the first use's retain never returns
        threading.Thread(target=lambda: cyctx.ContextGuard.shared(D1).handle, daemon=True).start()
        deadline = time.monotonic() + 30
        while not sim.stalled() and time.monotonic() < deadline:
            time.sleep(0.001)
        g = cyctx.ContextGuard.shared(D1)
        with g:
            print("MAIN", drivers.current() == g.handle, g.is_shared)
        import os
        os._exit(0)  # the stalled daemon thread never finishes
    """,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "MAIN True True" in out.stdout


def test_first_use_lost_by_a_stalled_thread_publishes_only_the_winner(sim):
    # Deterministic race: the first thread's construction is held in its retain (the driver
    # call releases the GIL) while 15 others race first use and one of them publishes; the
    # held thread then loses for certain, after the winner. Its guard is closed and freed:
    # it must reach neither shared() nor the fast array cyctx.device() reads, on any thread,
    # and its retain must be released. First use through device() on one ordinal and
    # through shared() on the other.
    out = run_child(
        """
        import threading, time, cyctx
        from cyctx import ContextGuard
        from helpers.threads import running, run_threads
        sim = drivers.SIM
        for k, first in ((0, cyctx.device), (1, ContextGuard.shared)):
            base = sim.retain_count(k)
            got = [None] * 16
            def use(i, fn):
                g = fn(k)
                with g:  # the first use, raced
                    got[i] = g
            sim.stall("cuDevicePrimaryCtxRetain")
            with running(lambda: use(0, first)):
                deadline = time.monotonic() + 30
                while not sim.stalled():
                    assert time.monotonic() < deadline, "the first construction never stalled"
                    time.sleep(0.001)
                b = threading.Barrier(15)
                def racer(i):
                    b.wait()
                    use(i, cyctx.device if i % 2 else ContextGuard.shared)
                run_threads(*[lambda i=i: racer(i) for i in range(1, 16)])
                winner = got[1]
                assert all(g is winner for g in got[1:]), "the 15 racers got one guard"
                sim.unstall()
            assert got[0] is winner, "the held thread, which lost, got the winner's guard"
            seen = run_threads(*[lambda: (cyctx.device(k), ContextGuard.shared(k))] * 16)
            assert all(d is winner and s is winner for d, s in seen), (
                f"device({k}) or shared({k}) is not the published guard on some thread")
            assert winner.is_shared and not winner.closed
            with cyctx.device(k):
                assert drivers.current() == winner.handle
            assert sim.retain_count(k) == base + 1, (k, base, sim.retain_count(k))
        print("OK")
    """,
        timeout=90,
    )
    assert "OK" in out.stdout


def test_fork_while_another_thread_is_inside_the_first_use(sim):
    # The parent's first use is held inside its retain on another thread when it forks: the
    # child's use of the same guard (not used yet in the child either) is ForkError, not a
    # hang; the parent's first use completes with its one retain.
    out = run_child(
        """
        import threading, time, cyctx
        from helpers.forking import raised_in_fork
        sim = drivers.SIM
        g = cyctx.ContextGuard.shared(D1)
        sim.stall("cuDevicePrimaryCtxRetain")
        t = threading.Thread(target=lambda: g.handle)
        t.start()
        deadline = time.monotonic() + 30
        while not sim.stalled():
            assert time.monotonic() < deadline, "the first use never stalled"
            time.sleep(0.001)
        print("CHILD", raised_in_fork(lambda: g.__enter__(), timeout=30))
        sim.unstall()
        t.join()
        with g:
            print("PARENT", drivers.current() == g.handle, sim.retain_count(1))
        """,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "CHILD ForkError" in out.stdout and "PARENT True 1" in out.stdout, out.stdout
