"""Process-wide state published on first use, raced deterministically: the simulated driver's
stall holds the first thread inside the publication while others publish, so it loses for
certain (the shared guards: test_shared.py)."""

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


def test_plugin_observer_first_read_lost_by_a_stalled_thread(sim):
    # An Observer builds its driver reader on its first read (cuGetProcAddress_v2 through
    # ctypes, which releases the GIL). 16 threads race it: the stalled one built last, so it
    # must drop its reader (its library reference given back) and read through the winner's;
    # every read of every thread goes through the one published reader.
    out = run_child(
        """
        import threading, time
        from helpers.threads import running, run_threads
        import _cyctx_pytest as plugin
        sim = drivers.SIM
        built, closed, used = [], [], []
        lock = threading.Lock()
        class Counted(plugin._Reader):
            def __init__(self, path):
                super().__init__(path)
                with lock:  # the stalled thread's comes last: it resumes after the others
                    built.append(self)
            def close(self):
                with lock:
                    closed.append(self)
                super().close()
            def read(self):
                with lock:
                    used.append(self)
                return super().read()
        plugin._Reader = Counted
        obs = plugin.Observer()
        states = [None] * 16
        def read(i):
            states[i] = obs.read()
        sim.stall("cuGetProcAddress")  # the stalled thread's reader is half built
        with running(lambda: read(0)):
            deadline = time.monotonic() + 30
            while not sim.stalled():
                assert time.monotonic() < deadline, "the first read never stalled"
                time.sleep(0.001)
            run_threads(*[lambda i=i: read(i) for i in range(1, 16)])
            sim.unstall()
        # The first free thread to finish publishes; the others that built before it (any
        # number: they raced it) and the stalled one lose.
        assert len(built) >= 2, f"readers built: {len(built)}"
        winners = [r for r in built if r not in closed]
        assert winners == [obs._reader], f"{len(winners)} readers kept, not the one published"
        assert len(closed) == len(built) - 1, f"losers closed: {len(closed)} of {len(built) - 1}"
        assert built[-1] in closed, "the stalled thread's reader was kept"
        assert set(map(id, used)) == {id(obs._reader)}, f"{len(set(map(id, used)))} readers read"
        assert all(s is not None and s.driver == states[1].driver for s in states), states
        print("OK", states[0].driver)
    """,
        init=False,
        timeout=60,
    )
    assert "OK " in out.stdout, out.stdout


def test_doctor_file_owner_first_ask_raced_by_16_threads(tmp_path, monkeypatch):
    # The doctor keeps each file's owning distribution for the process's life. 16 censuses
    # asking about the same file for the first time all miss the cache (the barrier holds each
    # inside the search until all are there); each finds an answer of its own, and every one
    # must return the one answer kept.
    import threading

    from helpers.threads import run_threads

    from cyctx import _census as census

    lib = tmp_path / "libcudart.so.13"
    lib.write_bytes(b"")
    monkeypatch.setattr(census, "_OWNER_OF", {})
    barrier = threading.Barrier(16, timeout=30)

    def find(self, real):
        barrier.wait()
        return "".join(["nvidia-cuda-runtime ", str(threading.get_ident())])  # one per thread

    monkeypatch.setattr(census.Owners, "_find", find)
    answers = [None] * 16

    def ask(i):
        answers[i] = census.Owners().owner(str(lib))

    run_threads(*[lambda i=i: ask(i) for i in range(16)])
    (kept,) = census._OWNER_OF.values()
    assert all(a is kept for a in answers), f"{len({id(a) for a in answers})} answers: {answers}"


def test_plugin_readers_are_per_observer_and_doctor_records_per_census(sim, monkeypatch):
    # Not process-wide, so not raced across instances: each Observer builds its own reader
    # (the plugin's and a check_thread's do not share one), and each census lists the
    # distributions afresh (one installed meanwhile is seen by the next diagnosis).
    import _cyctx_pytest as plugin
    from cyctx import _census as census

    a, b = plugin.Observer(), plugin.Observer()
    a.read(), b.read()
    assert a._reader is not None and b._reader is not None and a._reader is not b._reader
    listed = []
    monkeypatch.setattr("importlib.metadata.distributions", lambda: listed.append(1) or iter(()))
    one, two = census.Owners(), census.Owners()
    one._all(), one._all(), two._all()
    assert len(listed) == 2, f"distributions listed {len(listed)} times for two censuses"
