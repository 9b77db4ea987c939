"""fork and multiprocessing: a child forked after CUDA was used gets ForkError before any driver
call, also when other threads held cyctx's locks at the fork; a child that inherited no CUDA
state, and spawn, work."""

import os

from helpers.children import run_child

import cyctx

# {child} runs in a forked child and notes what it saw in msgs; the driver calls it made are
# counted on the simulated driver.
FORK_CHILD = """
    import cyctx
    from helpers.forking import run_forked
    {setup}
    def child():
        msgs = []
        calls0 = drivers.SIM.call_count() if drivers.SIM else None
        {child}
        if drivers.SIM:
            msgs.append(f"driver-calls={{drivers.SIM.call_count() - calls0}}")
        return "|".join(msgs)
    print("CHILD", run_forked(child))
"""


def test_fork_after_cuda_refuses_before_any_driver_call():
    out = run_child(
        FORK_CHILD.format(
            setup="g = cyctx.ContextGuard(0)\n    s = cyctx.ContextGuard.shared(0)",
            child="""
        for what, fn in (("enter", lambda: g.__enter__()), ("shared", lambda: s.__enter__()),
                         ("new", lambda: cyctx.ContextGuard(0))):
            try:
                fn()
                msgs.append(what + "=no-error")
            except cyctx.ForkError as e:
                msgs.append(what + "=ForkError:" + str("spawn" in str(e) and "fork" in str(e)))
        g.close()
        msgs.append("closed=" + str(g.closed))
        """,
        )
    )
    line = out.stdout.split("CHILD", 1)[1]
    assert (
        "enter=ForkError:True" in line
        and "shared=ForkError:True" in line
        and "new=ForkError:True" in line
    )
    assert "closed=True" in line
    if "driver-calls=" in line:
        assert "driver-calls=0" in line


def test_fork_inside_a_block_leaves_quietly():
    out = run_child(
        FORK_CHILD.format(
            setup="g = cyctx.ContextGuard(0)\n    g.__enter__()",
            child="""
        g.__exit__(None, None, None)
        msgs.append("exited")
        """,
        )
        + "    g.__exit__(None, None, None)\n    print('PARENT', drivers.current())\n"
    )
    assert "CHILD exited" in out.stdout and "PARENT 0" in out.stdout


def test_fork_after_cuda_used_by_someone_else():
    # The parent used the driver directly, not through cyctx: the child's cuInit fails with 3
    # and cyctx still names fork.
    out = run_child(
        FORK_CHILD.format(
            setup=(
                "d = drivers.driver(); drivers.ok(d.cuInit(0)); "
                "drivers.ok(d.cuDevicePrimaryCtxRetain(drivers.ok(d.cuDeviceGet(0))))"
            ),
            child="""
        try:
            cyctx.ContextGuard(0)
            msgs.append("no-error")
        except cyctx.ForkError as e:
            msgs.append("ForkError")
        """,
        ),
        init=False,
    )
    assert "CHILD ForkError" in out.stdout


def test_child_without_inherited_cuda_is_unaffected():
    out = run_child(
        FORK_CHILD.format(
            setup="pass",
            child="""
        g = cyctx.ContextGuard(0)
        with g:
            msgs.append("ok=" + str(drivers.current() == g.handle))
        g.close()
        """,
        ),
        init=False,
    )
    assert "ok=True" in out.stdout


def test_driver_error_blames_fork_only_in_a_forked_process():
    assert "fork" not in str(cyctx.DriverError(3)).lower()
    out = run_child(
        """
        import cyctx
        from helpers.forking import run_forked
        print("CHILD", run_forked(lambda: "fork" in str(cyctx.DriverError(3)).lower()))
    """,
        init=False,
    )
    assert "CHILD True" in out.stdout


def test_fork_while_other_threads_construct_and_free_guards():
    # The live-guard registry's mutex is held across fork by the atfork handlers: a child
    # never inherits it locked, so a dealloc, an exit's slow path or a listing of the live
    # guards in the child cannot hang. (Without the GIL the other threads run during the fork:
    # a lock of the interpreter's own that one of them held, a dict's, would stay held.)
    out = run_child(
        """
        import threading, cyctx
        from cyctx._guard import live_guards
        from helpers.forking import run_forked
        from helpers.threads import running
        stop = threading.Event()
        def churn():
            while not stop.is_set():
                cyctx.ContextGuard(0).__enter__()  # freed while entered: registry traffic
        def child():
            global g
            try:
                cyctx.ContextGuard(0)
                return "no ForkError"
            except cyctx.ForkError:
                pass
            if not any(x is g for x in live_guards()):
                return "g not listed"
            g.__exit__(None, None, None)
            del g
            return "left"
        g = cyctx.ContextGuard(D1)
        seen = []
        with running(*[churn] * 3):
            for _ in range(30):
                g.__enter__()
                seen.append(run_forked(child))
                g.__exit__(None, None, None)
            stop.set()
        print("SEEN", set(seen))
    """,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "SEEN {'left'}" in out.stdout, out.stdout


# --- multiprocessing --------------------------------------------------------------------------


def _pool_target(_):
    import cyctx

    with cyctx.ContextGuard(0):
        return 1


def test_fork_pool_worker_gets_ForkError_in_the_parent():
    out = run_child(
        """
        import multiprocessing as mp, warnings, cyctx
        from guard import test_fork
        warnings.simplefilter("ignore", DeprecationWarning)
        g = cyctx.ContextGuard(0)
        with mp.get_context("fork").Pool(1) as pool:
            try:
                pool.apply(test_fork._pool_target, (0,))
                print("NO ERROR")
            except cyctx.ForkError as e:
                print("FORKERROR", "spawn" in str(e))
        g.close()
    """,
        timeout=120,
    )
    assert "FORKERROR True" in out.stdout


def _spawn_target(q):
    from helpers import drivers

    drivers.select(os.environ["CYCTX_TEST_DRIVER"])
    import cyctx

    g = cyctx.ContextGuard(0)
    with g:
        q.put(cyctx.current_handle() == g.handle)
    g.close()


def test_spawn_is_the_way():

    out = run_child("""
        import multiprocessing as mp, cyctx
        from guard import test_fork
        g = cyctx.ContextGuard(0)
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=test_fork._spawn_target, args=(q,))
        p.start(); got = q.get(timeout=120); p.join()
        print("SPAWN", got, p.exitcode)
    """)
    assert "SPAWN True 0" in out.stdout
