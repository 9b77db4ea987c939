"""cyctx.trace() with many threads at once (and, on a free-threaded CPython, without the GIL):
each thread's events point at its own line, and the trace's buffer is drained and freed once
however many threads collect and stop it."""

import threading

import pytest
from helpers import drivers
from helpers.lines import line_of
from helpers.threads import run_threads, running

import cyctx

ROUNDS = 40


def _push_pop(d, ctx, start):
    # The same code on every thread: on a free-threaded CPython each thread runs its own copy
    # of a function's bytecode once it is warm, which the tracer reads the line through.
    start.wait()
    for _ in range(ROUNDS):
        drivers.ok(d.cuCtxPushCurrent(ctx))  # push-here
        drivers.ok(d.cuCtxPopCurrent())  # pop-here
    return threading.get_native_id()


def test_each_threads_events_point_at_its_own_line(d, primary):
    start = threading.Barrier(8)
    with cyctx.trace(capacity=1 << 14) as t:
        tids = run_threads(*[lambda: _push_pop(d, primary, start)] * 8)
    assert t.reason is None and t.dropped == 0
    for tid in tids:
        mine = [e for e in t.events if e.thread == tid]
        assert [e.call for e in mine] == ["cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2"] * ROUNDS
        lines = {(e.call, e.where.file, e.where.line, e.where.function) for e in mine}
        assert lines == {
            ("cuCtxPushCurrent_v2", __file__, line_of("push-here"), "_push_pop"),
            ("cuCtxPopCurrent_v2", __file__, line_of("pop-here"), "_push_pop"),
        }, lines


@pytest.mark.parametrize("attempt", range(5))
def test_collect_and_stop_from_many_threads_take_each_event_once(d, primary, attempt):
    # Threads collect while others make events, then two stop the trace at once: the buffer is
    # drained by one at a time and freed once, and every event is in the trace exactly once.
    start = threading.Barrier(8)
    made = threading.Event()
    try:
        t = cyctx.trace(capacity=1 << 14).start()

        def collector():
            start.wait()
            while not made.is_set():
                t.collect()

        def stopper(at):
            at.wait()
            t.stop()

        with running(*[collector] * 4):
            tids = run_threads(*[lambda: _push_pop(d, primary, start)] * 4)
            made.set()
        at = threading.Barrier(2)
        run_threads(lambda: stopper(at), lambda: stopper(at))
        assert t.finished and t.reason is None and t.dropped == 0
        ours = [e for e in t.events if e.thread in set(tids)]
        assert len(ours) == 4 * 2 * ROUNDS
        seqs = [e.seq for e in t.events]
        assert len(seqs) == len(set(seqs)), "an event was drained twice"
    finally:
        made.set()
