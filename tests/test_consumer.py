"""A Cython consumer compiled against the INSTALLED cyctx (its .pxd files and get_include()),
not the source tree, then run: guards entered without the GIL from several OpenMP threads."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from helpers.children import run_child

import cyctx

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_SRC = os.path.realpath(os.path.join(HERE, "..", "src"))

SETUP = textwrap.dedent("""
    import cyctx
    from Cython.Build import cythonize
    from setuptools import Extension, setup
    # numpy's spelling: cyctx.get_include() (a str) in a list beside other directories.
    inc = [cyctx.get_include(), *cyctx.get_include_dirs()[1:]]
    ext = Extension("cyctx_consumer", ["cyctx_consumer.pyx"], include_dirs=inc,
                    language="c++", extra_compile_args=["-fopenmp", "-O1"], extra_link_args=["-fopenmp"])
    setup(name="cyctx_consumer", ext_modules=cythonize([ext], quiet=True),
          script_args=["build_ext", "--inplace"])
""")


@pytest.fixture(scope="module")
def consumer_dir(tmp_path_factory):
    installed = os.path.realpath(os.path.dirname(cyctx.__file__))
    assert not installed.startswith(REPO_SRC), (
        f"cyctx imported from the source tree ({installed}), not installed"
    )
    for f in ("__init__.pxd", "_guard.pxd"):
        assert os.path.isfile(os.path.join(installed, f)), f"installed cyctx lacks {f}"
    d = tmp_path_factory.mktemp("consumer")
    shutil.copy(os.path.join(HERE, "consumer", "cyctx_consumer.pyx"), d)
    (d / "setup_consumer.py").write_text(SETUP)
    # Outside the repo, and with no path into its source tree: Cython can only find the
    # installed .pxd files (PYTHONPATH itself may be how cyctx was installed).
    keep = [
        p
        for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if p and not os.path.realpath(p).startswith(REPO_SRC)
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(keep))
    proc = subprocess.run(
        [sys.executable, "setup_consumer.py"],
        cwd=d,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    cpp = (d / "cyctx_consumer.cpp").read_text()
    assert "cyctx" in cpp
    return str(d)


@pytest.fixture
def in_consumer(consumer_dir):
    """run_child of its argument with cyctx and the compiled consumer imported."""
    head = f"import sys; sys.path.insert(0, {consumer_dir!r})\nimport cyctx, cyctx_consumer\n"
    return lambda body: run_child(head + textwrap.dedent(body))


def test_consumer_runs_guard_in_nogil_threads(in_consumer):
    out = in_consumer("""
        g = cyctx.ContextGuard(0)
        bad, used = cyctx_consumer.run_parallel(g, 20000, 4)
        print("RESULT", bad, used, drivers.current())
        g.close()
    """)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][0].split()
    bad, used, after = int(line[1]), int(line[2]), int(line[3])
    assert bad == 0
    assert used >= 2, "the loop must really run on several threads"
    assert after == 0


def test_consumer_errors_cross_nogil(in_consumer):
    out = in_consumer("""
        g = cyctx.ContextGuard(0)
        try:
            cyctx_consumer.exit_without_enter(g)
        except cyctx.GuardError as e:
            print("GUARD", "without a matching enter" in str(e))
        g.close()
        try:
            cyctx_consumer.enter_closed(g)
        except cyctx.GuardError as e:
            print("CLOSED", "closed" in str(e))
        print("DEV", cyctx_consumer.device_get_checked(0))
        try:
            cyctx_consumer.device_get_checked(10**6)
        except cyctx.InvalidDeviceError as e:
            print("BADDEV", e.code, e.call)
    """)
    assert "GUARD True" in out.stdout and "CLOSED True" in out.stdout
    assert "DEV 0" in out.stdout and "BADDEV 101 cuDeviceGet" in out.stdout


def test_nogil_exit_out_of_order_is_refused_and_changes_nothing(in_consumer):
    # Unlike Python's `with`, a Cython caller can call exit() again: the refused exit keeps
    # its entry, so leaving the inner guard and then retrying restores everything.
    out = in_consumer("""
        from cyctx._guard import open_entries
        g0, g1 = cyctx.ContextGuard(0), cyctx.ContextGuard(D1)
        before = drivers.current()
        cyctx_consumer.enter_nogil(g0)
        cyctx_consumer.enter_nogil(g1)
        try:
            cyctx_consumer.exit_nogil(g0)
            print("NOT REFUSED")
        except cyctx.GuardError as e:
            print("REFUSED", "out of order" in str(e), "Nothing was changed" in str(e))
        print("KEPT", drivers.current() == g1.handle, open_entries())
        cyctx_consumer.exit_nogil(g1)
        print("INNER LEFT", drivers.current() == g0.handle, open_entries())
        cyctx_consumer.exit_nogil(g0)            # the retry, now in order
        print("END", drivers.current() == before, open_entries())
        g0.close(); g1.close()
    """)
    assert "REFUSED True True" in out.stdout, out.stdout
    assert "KEPT True 2" in out.stdout and "INNER LEFT True 1" in out.stdout, out.stdout
    assert "END True 0" in out.stdout, out.stdout


@pytest.mark.parametrize("start", ["none", "other", "target"])
def test_raw_layer_switch_to_under_every_fault(in_consumer, start, sim):
    # switch_to is reachable from Cython only: every driver call it makes is failed once with
    # each code, from each starting state, and it changes nothing when it fails. (switch_back
    # under every fault: tests/guard/test_exit_faults.py, with the exits.)
    out = in_consumer(f"""
        from cuda.bindings import driver as d
        sim = drivers.SIM
        FUNCS = ("cuCtxGetCurrent", "cuCtxSetCurrent")
        g0, g1 = cyctx.ContextGuard(0), cyctx.ContextGuard(1)
        start = {start!r}
        def prepare():
            d.cuCtxSetCurrent(None)
            if start == "other":
                d.cuCtxSetCurrent(g1.context)
            elif start == "target":
                d.cuCtxSetCurrent(g0.context)
            return (drivers.current(), sim.stack_depth())
        tried = 0
        prepare()
        c0 = {{f: sim.call_count(f) for f in FUNCS}}
        s = cyctx_consumer.switch_to_only(g0.handle)
        made = {{f: sim.call_count(f) - c0[f] for f in FUNCS}}
        cyctx_consumer.switch_back_only(*s)
        for f, n in made.items():
            for nth in range(1, n + 1):
                for code in (201, 709, 999):
                    before = prepare()
                    sim.inject_fault(f, code, nth=nth)
                    try:
                        cyctx_consumer.switch_to_only(g0.handle)
                        raise SystemExit("no error")
                    except cyctx.DriverError as e:
                        assert e.code == code
                    finally:
                        sim.clear_faults()
                    assert (drivers.current(), sim.stack_depth()) == before, (f, nth, code)
                    tried += 1
        d.cuCtxSetCurrent(None)
        g0.close(); g1.close()
        print("TRIED", tried, "RETAINS", [sim.retain_count(i) for i in range(2)])
    """)
    assert "RETAINS [0, 0]" in out.stdout
    assert int(out.stdout.split("TRIED")[1].split()[0]) >= 3


def test_switch_back_never_hands_a_destroyed_context_to_the_driver(in_consumer, sim):
    # The raw layer keeps the guard's rule: a context that died between switch_to and
    # switch_back is not made current again; the switch's place on the stack is popped.
    out = in_consumer("""
        from cuda.bindings import driver as d
        sim = drivers.SIM
        ctx = drivers.create_context(0)                  # current, depth 1
        g = cyctx.ContextGuard(1)
        s = cyctx_consumer.switch_to_only(g.handle)      # replaces ctx on top
        assert s[1] != 0, s                              # its id was recorded
        drivers.ok(d.cuCtxDestroy(ctx))
        sets = sim.call_count("cuCtxSetCurrent")
        try:
            cyctx_consumer.switch_back_only(*s)
            raise SystemExit("no error")
        except cyctx.ContextDestroyedError as e:
            assert "did not survive" in str(e), e
        assert sim.call_count("cuCtxSetCurrent") == sets
        print("STATE", drivers.current(), sim.stack_depth())
        g.close()
    """)
    assert "STATE 0 0" in out.stdout


def test_switch_back_without_a_switch_never_hands_back_a_target_destroyed_in_between(
    in_consumer, sim
):
    # switch_to finds its target current and switches nothing; the code in between destroys
    # that context (the driver pops it). The way back must not make the dead handle current.
    out = in_consumer("""
        from cuda.bindings import driver as d
        sim = drivers.SIM
        ctx = drivers.create_context(0)                  # current, depth 1
        s = cyctx_consumer.switch_to_only(int(ctx))
        assert s[2] == 0, s                              # nothing was switched
        drivers.ok(d.cuCtxDestroy(ctx))                  # popped: nothing current
        handed = lambda: sim.call_count("cuCtxSetCurrent") + sim.call_count("cuCtxPushCurrent")
        before = handed()
        try:
            cyctx_consumer.switch_back_only(*s)
            raise SystemExit("no error")
        except cyctx.ContextDestroyedError as e:
            assert "did not survive" in str(e), e
        assert handed() == before
        print("STATE", drivers.current(), sim.stack_depth())
    """)
    assert "STATE 0 0" in out.stdout


def test_close_during_a_nogil_reset_reactivation_refuses(in_consumer, sim):
    # Thread A enters without the GIL after a reset; its re-activation is held inside
    # cuDevicePrimaryCtxRetain. close() on this thread meanwhile must refuse (or wait): it may
    # neither release the retain under the re-activation nor be undone by it (a guard open
    # without its retain, whose next close releases someone else's).
    out = in_consumer("""
        import time, warnings
        from helpers.threads import running
        sim = drivers.SIM
        keep = cyctx.ContextGuard(0)  # another retain, which must survive
        g = cyctx.ContextGuard(0)
        drivers.reset_primary(0)
        warnings.simplefilter("ignore", cyctx.ContextResetWarning)
        sim.stall("cuDevicePrimaryCtxRetain")
        with running(lambda: cyctx_consumer.enter_and_exit_nogil(g)):
            deadline = time.monotonic() + 60
            while not sim.stalled() and time.monotonic() < deadline:
                time.sleep(0.005)
            print("HELD", sim.stalled())
            try:
                g.close()
                print("CLOSE returned", g.closed)
            except cyctx.GuardError as e:
                print("CLOSE refused", "re-activating" in str(e))
            print("DURING", g.closed, sim.retain_count(0))
            sim.unstall()
        print("AFTER", g.closed, g.resets, sim.retain_count(0))
        g.close()
        print("CLOSED", g.closed, sim.retain_count(0))
        keep.close()
        print("END", sim.retain_count(0))
    """)
    assert "HELD 1" in out.stdout, out.stdout
    if "CLOSE refused" in out.stdout:
        assert "CLOSE refused True" in out.stdout and "DURING False 2" in out.stdout, out.stdout
        assert "AFTER False 1 2" in out.stdout, out.stdout
    else:  # a close() that waited for the re-activation: closed, with its own retain released
        assert "CLOSE returned True" in out.stdout and "AFTER True" in out.stdout, out.stdout
    assert "CLOSED True 1" in out.stdout and "END 0" in out.stdout, out.stdout


def test_switch_to_a_null_target_is_refused_and_changes_nothing(in_consumer, sim):
    # NULL is no context: switch_to refuses it before any driver call, whether the stack is
    # empty (where a NULL switch would look like "already current") or holds a context (where
    # cuCtxSetCurrent(NULL) would pop it).
    out = in_consumer("""
        sim = drivers.SIM
        g = cyctx.ContextGuard(0)
        for start in (None, g.context):
            drivers.ok(drivers.driver().cuCtxSetCurrent(start))
            before = (drivers.current(), sim.stack_depth())
            calls = sim.call_count()
            try:
                cyctx_consumer.switch_to_only(0)
                print("ACCEPTED")
            except ValueError as e:
                print("REFUSED", "target context is NULL" in str(e))
            made = sim.call_count() - calls
            print("SAME", (drivers.current(), sim.stack_depth()) == before, made == 0)
        drivers.ok(drivers.driver().cuCtxSetCurrent(None))
        g.close()
    """)
    assert out.stdout.count("REFUSED True") == 2, out.stdout
    assert out.stdout.count("SAME True True") == 2 and "ACCEPTED" not in out.stdout, out.stdout


def test_switch_back_without_a_switch_restores_the_target_after_the_code_switched_away(
    in_consumer, sim
):
    # switch_to finds its target current (nothing switched); the code in between makes another
    # context current. The way back makes the target, which is alive and unchanged, current again.
    out = in_consumer("""
        g0, g1 = cyctx.ContextGuard(0), cyctx.ContextGuard(D1)
        drivers.ok(drivers.driver().cuCtxSetCurrent(g0.context))
        s = cyctx_consumer.switch_to_only(g0.handle)
        print("RECORDED", s[2] == 0, s[1] == g0.context_id)
        drivers.ok(drivers.driver().cuCtxSetCurrent(g1.context))   # the code switches away
        cyctx_consumer.switch_back_only(*s)
        print("BACK", drivers.current() == g0.handle, drivers.SIM.stack_depth())
        drivers.ok(drivers.driver().cuCtxSetCurrent(None))
        g0.close(); g1.close()
    """)
    assert "RECORDED True True" in out.stdout and "BACK True 1" in out.stdout, out.stdout


def test_cython_generator_and_coroutine_blocks_are_their_own(in_consumer):
    # A Cython-compiled generator or coroutine has no Python frame: its block is still its own,
    # also when it is closed inside the caller's block of the same guard, collected from another
    # function, or when two Cython coroutines hold the guard across await.
    out = in_consumer("""
        import asyncio, gc
        from cyctx._guard import open_entries
        g, h = cyctx.ContextGuard(0), cyctx.ContextGuard(D1)
        before = drivers.current()
        it = cyctx_consumer.hold(g)
        next(it)
        with h:
            with g:
                try:
                    it.close()
                    print("NOT RAISED")
                except cyctx.GuardError as e:
                    print("RAISED", "out of order" in str(e))
                print("INSIDE", drivers.current() == g.handle, open_entries())
            print("AFTER", drivers.current() == h.handle, open_entries())
        print("END", drivers.current() == before, open_entries())

        it = cyctx_consumer.hold(g)
        next(it)
        seen = []
        def elsewhere():
            global it
            with g:
                old, sys.unraisablehook = sys.unraisablehook, seen.append
                try:
                    del it
                    gc.collect()
                finally:
                    sys.unraisablehook = old
                print("KEPT", drivers.current() == g.handle, open_entries())
        elsewhere()
        print("COLLECTED", [type(s.exc_value).__name__ for s in seen], open_entries())

        it = cyctx_consumer.hold(g)
        print("IN ORDER", next(it), next(it), list(it), open_entries())

        errors = []
        async def task(ev_in, ev_out):
            try:
                ev_in.set()
                await cyctx_consumer.hold_async(g, ev_out)
            except cyctx.GuardError as e:
                errors.append(str(e))
        async def main():
            a_in, a_out, b_in, b_out = (asyncio.Event() for _ in range(4))
            ta = asyncio.ensure_future(task(a_in, a_out)); await a_in.wait(); await asyncio.sleep(0)
            tb = asyncio.ensure_future(task(b_in, b_out)); await b_in.wait(); await asyncio.sleep(0)
            a_out.set(); await ta
            between = (drivers.current() == g.handle, open_entries())
            b_out.set(); await tb
            return between
        between = asyncio.run(main())
        same = all("same guard" in e for e in errors)
        print("TASKS", len(errors), same, between, open_entries())
        g.close(); h.close()
        print("CLOSED", drivers.current() == before)
    """)
    assert "RAISED True" in out.stdout, out.stdout
    assert "INSIDE True 2" in out.stdout and "AFTER True 1" in out.stdout, out.stdout
    assert "END True 0" in out.stdout, out.stdout
    assert "KEPT True 1" in out.stdout and "COLLECTED ['GuardError'] 0" in out.stdout, out.stdout
    assert "IN ORDER None None [] 0" in out.stdout, out.stdout
    assert "TASKS 1 True (True, 1) 0" in out.stdout and "CLOSED True" in out.stdout, out.stdout


def test_decorators_refuse_cython_generators_and_coroutines(in_consumer):
    # Compiled by Cython, a generator or coroutine function is no Python function: decorating
    # one is refused all the same (its body would run after the guard's block ended).
    out = in_consumer("""
        import functools
        g = cyctx.ContextGuard(0)
        for f in (cyctx_consumer.hold, cyctx_consumer.hold_async,
                  functools.partial(cyctx_consumer.hold_async)):
            try:
                g(f)
                print("ACCEPTED", f)
            except TypeError as e:
                print("REFUSED", str(e).split(" (")[0])
        g.close()
    """)
    assert out.stdout.splitlines() == [
        "REFUSED cannot decorate a generator function",
        "REFUSED cannot decorate an async def function",
        "REFUSED cannot decorate an async def function",
    ], out.stdout


def test_context_epoch_through_the_cimport_without_the_gil(in_consumer, sim):
    # The cimported epoch is the Python one's: the driver's id now, 0 once destroyed, and a
    # driver failure other than "destroyed" crosses nogil as the typed error.
    out = in_consumer("""
        from helpers.drivers import create_context, driver, ok
        ctx = create_context(0, current=False)
        r = [cyctx_consumer.epoch_nogil(int(ctx)) == cyctx.context_epoch(ctx)
             == ok(driver().cuCtxGetId(ctx))]
        drivers.SIM.inject_fault("cuCtxGetId", 999)
        try:
            cyctx_consumer.epoch_nogil(int(ctx))
            r.append("no-error")
        except cyctx.DriverError as e:
            r.append(e.code == 999 and e.call == "cuCtxGetId")
        ok(driver().cuCtxDestroy(ctx))
        r += [cyctx_consumer.epoch_nogil(int(ctx)), cyctx.context_epoch(ctx),
              cyctx_consumer.epoch_nogil(0)]
        print("RESULT", r)
    """)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][0]
    assert line == "RESULT [True, True, 0, None, 0]", line
