"""Process-wide state published on first use, raced deterministically: the simulated driver's
stall holds the first thread inside the publication (its driver call releases the GIL) while
others race past it and publish, so the held thread loses for certain, after the winner.
(The shared guards and cyctx.device()'s array: tests/guard/test_shared.py.)"""

from helpers.children import run_child


def test_driver_table_first_load_lost_by_a_stalled_thread(sim):
    # The driver table of _cpp/driver.h is resolved on first use and published by a
    # compare-and-swap: a thread that resolved its own and lost must use the winner's table
    # (its own is freed), and every thread's guard works, with every retain released.
    out = run_child(
        """
        import time
        from helpers.threads import running, run_threads
        sim = drivers.SIM
        sim.stall("cuGetProcAddress")  # the first resolution of the table (no driver call yet)
        import cyctx
        works = [None] * 16
        def use(i):
            g = cyctx.ContextGuard(D1)
            with g:
                works[i] = drivers.current() == g.handle
            g.close()
            works[i] = works[i] and g.closed
        with running(lambda: use(0)):
            deadline = time.monotonic() + 30
            while not sim.stalled():
                assert time.monotonic() < deadline, "the first load never stalled"
                time.sleep(0.001)
            run_threads(*[lambda i=i: use(i) for i in range(1, 16)])
            assert works[1:] == [True] * 15, works
            sim.unstall()
        assert works[0] is True, "the thread that lost the table's publication"
        with cyctx.device(D1):
            assert drivers.current() != 0
        print("RETAINS", sim.retain_count(D1))
    """,
        init=False,
        timeout=60,
    )
    assert "RETAINS 1" in out.stdout, out.stdout
