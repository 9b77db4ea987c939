"""Threads and signals: one guard used by many threads at once, the first use of the driver raced
by many threads in a fresh process, and a signal handler that uses guards between any two
bytecodes of other blocks."""

import threading
from functools import partial

from helpers.children import run_child
from helpers.drivers import current, driver, ok
from helpers.threads import run_threads


def test_one_guard_shared_by_many_threads(guard, guard1):
    errors = []
    barrier = threading.Barrier(8)

    def worker(k):
        try:
            d = driver()
            base = guard1 if k % 2 else None  # half the threads start inside another context
            if base is not None:
                ok(d.cuCtxSetCurrent(base.context))
            expect = current()
            barrier.wait()
            for _ in range(2000):
                with guard:
                    if current() != guard.handle:
                        errors.append(("inside", k))
                if current() != expect:
                    errors.append(("after", k))
            if base is not None:
                ok(d.cuCtxSetCurrent(None))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    run_threads(*(partial(worker, k) for k in range(8)))
    assert errors == []


def test_many_short_lived_threads_racing_first_use_in_a_fresh_process(sim):
    # Driver-table load, cuInit and first retains raced by 32 threads at once.
    out = run_child(
        """
        import functools, threading, cyctx
        from helpers.threads import run_threads
        b = threading.Barrier(32)
        errs, got = [], []
        def f(i):
            try:
                b.wait()
                if i % 4 == 0:
                    assert cyctx.current_handle() == 0  # before or after the first cuInit
                g = cyctx.ContextGuard(i % 2)
                with g:
                    got.append(cyctx.current_handle() == g.handle)
                g.close()
                with cyctx.ContextGuard.shared(i % 2):
                    pass
            except BaseException as e:
                errs.append(repr(e))
        run_threads(*(functools.partial(f, i) for i in range(32)))
        print("ERRS", errs)
        print("RETAINS", [drivers.SIM.retain_count(i) for i in range(2)])
    """,
        init=False,
        timeout=120,
    )
    assert "ERRS []" in out.stdout and "RETAINS [1, 1]" in out.stdout, out.stdout


def test_signal_handler_using_guards_during_enter_exit_loops():
    # A handler that uses a guard and shared() (first use included) runs at every instruction
    # boundary of a loop of other guards' blocks, and of any Python code those blocks run: where
    # a signal handler can run, each one visited once, deterministically (instruction events,
    # not a timer, so that load cannot change what is covered). Instruction events come from
    # sys.monitoring from 3.12 (3.12.0-3.12.1 send no opcode events to a settrace function).
    out = run_child(
        """
        import sys, cyctx
        g0, g1 = cyctx.ContextGuard(0), cyctx.ContextGuard(D1)
        hits, busy = [0], [False]
        def handler():
            busy[0] = True
            try:
                with cyctx.ContextGuard.shared(D1):
                    with g0:
                        hits[0] += 1
            finally:
                busy[0] = False
        def trace(frame, event, arg):
            if busy[0]:
                return None
            frame.f_trace_opcodes = True
            if event == "opcode":
                handler()
            return trace
        def on_instruction(code, offset):
            if not busy[0]:
                handler()
        def loop(n):
            for i in range(n):
                with g1:
                    with g0:
                        pass
        if sys.version_info >= (3, 12):
            M = sys.monitoring
            M.use_tool_id(M.DEBUGGER_ID, "test")
            M.register_callback(M.DEBUGGER_ID, M.events.INSTRUCTION, on_instruction)
            M.set_events(M.DEBUGGER_ID, M.events.INSTRUCTION)
            loop(3)
            M.set_events(M.DEBUGGER_ID, 0)
            M.free_tool_id(M.DEBUGGER_ID)
        else:
            sys.settrace(trace)
            loop(3)
            sys.settrace(None)
        from cyctx._guard import open_entries
        print("HITS", hits[0], "STATE", drivers.current(), open_entries())
        g0.close(); g1.close()
    """,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    hits, state = out.stdout.split("HITS ")[1].split(" STATE ")
    assert int(hits) >= 3 * 10, out.stdout  # every boundary of three iterations of two blocks
    assert state.strip() == "0 0", out.stdout
