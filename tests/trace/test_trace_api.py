"""cyctx.trace() on the simulated driver: what each event says (call, thread, contexts before
and after, the line and the library), the questions it answers, its report and JSON, and how
it refuses when it cannot subscribe."""

import ctypes
import ctypes.util
import json
import os
import sys
import threading

import pytest
from helpers import drivers
from helpers.lines import line_of

import cyctx

HERE = __file__


def api(t, call):
    return [e for e in t.events if e.call == call]


def test_a_set_current_names_the_line_the_thread_and_both_contexts(d, primary):
    p, pid = primary, drivers.ok(d.cuCtxGetId(primary))
    with cyctx.trace() as t:
        drivers.ok(d.cuCtxSetCurrent(p))  # set-here
        drivers.ok(d.cuCtxSetCurrent(None))  # unset-here
    assert t.reason is None and t.dropped == 0
    on, off = api(t, "cuCtxSetCurrent")
    assert on.where.file == HERE and on.where.line == line_of("set-here")
    assert off.where.line == line_of("unset-here")
    assert on.thread == threading.get_native_id() and on.thread_name == "MainThread"
    assert on.before.handle == 0 and on.after == cyctx._trace.ContextRef(int(p), pid, 0)
    assert off.before == on.after and off.after.handle == 0
    assert on.changed and off.changed
    assert on.library == "cuda-bindings" and not on.cyctx_guard
    assert on.domain == "driver" and on.result == 0
    assert not on.held_gil  # cuda.bindings releases the GIL: the line is still there


def test_a_thread_is_named_by_its_thread_state_not_by_its_os_id(d):
    # The kernel gives an OS thread id again once the thread that had it ended (after pid_max
    # others): an event is named after a living thread only if it was that thread's own. Here
    # an ended thread's event is given the main thread's id, as the kernel could have.
    named = {}

    def worker():
        drivers.ok(d.cuCtxSetCurrent(None))  # an event of a thread that ends before the stop
        named["tid"] = threading.get_native_id()

    with cyctx.trace() as t:
        th = threading.Thread(target=worker, name="ended")
        th.start()
        th.join()
        drivers.ok(d.cuCtxSetCurrent(None))  # the main thread's
    gone, mine = t._raw
    assert gone["tid"] == named["tid"] and mine["tid"] == threading.get_native_id()
    assert gone["ts"] != mine["ts"] and gone["ts"][1] and mine["ts"][1]
    assert [e.thread_name for e in t.events] == [None, "MainThread"]
    gone["tid"] = mine["tid"]  # the ended thread's id given again, to the main thread
    reused, main = t._build(t._raw)
    assert reused.thread == main.thread == threading.get_native_id()
    assert (reused.thread_name, main.thread_name) == (None, "MainThread")


def test_a_guard_appears_as_cyctx_with_its_block(d):
    g = cyctx.ContextGuard(1)
    with cyctx.trace() as t:
        with g:  # guard-block
            pass
    ev = t.changes()
    assert len(ev) == 2
    for e in ev:
        assert e.cyctx_guard and e.library == "cyctx"
        assert e.where.file == HERE and e.where.line == line_of("guard-block")
        assert e.held_gil
    assert ev[0].after.device == 1 and ev[1].after.handle == 0
    g.close()


def test_retain_create_destroy_reset_and_their_resource_events(d):
    with cyctx.trace() as t:
        p = drivers.ok(d.cuDevicePrimaryCtxRetain(1))  # retain-here
        c = drivers.create_context(1, flags=4)
        drivers.ok(d.cuCtxDestroy(c))
        drivers.ok(d.cuDevicePrimaryCtxReset(1))  # reset-here
        drivers.ok(d.cuDevicePrimaryCtxRelease(1))
    calls = [e.call for e in t.events]
    # Which entry point cuda-bindings' cuCtxCreate reaches (v2 or v4) depends on its release: it
    # asks cuGetProcAddress at a version of its own, and the simulator answers as the driver.
    created = calls[3] if calls[3] in ("cuCtxCreate_v2", "cuCtxCreate_v4") else "a cuCtxCreate"
    assert calls == [
        "context created",
        "cuDevicePrimaryCtxRetain",
        "context created",
        created,
        "context destroy starting",
        "cuCtxDestroy_v2",
        "context destroy starting",
        "cuDevicePrimaryCtxReset_v2",
        "cuDevicePrimaryCtxRelease_v2",
    ]
    retain = api(t, "cuDevicePrimaryCtxRetain")[0]
    assert retain.device == 1 and retain.target.handle == int(p)
    assert retain.where.line == line_of("retain-here")
    create = api(t, created)[0]
    assert create.after.handle == int(c) and create.changed and create.device == 1
    destroy = api(t, "cuCtxDestroy_v2")[0]
    assert destroy.target.handle == int(c) and destroy.target.id == create.after.id
    (gone_c,) = t.who_destroyed(int(c))
    assert gone_c.via == "cuCtxDestroy_v2" and gone_c.target.id == create.after.id
    (gone_p,) = t.who_destroyed(int(p))
    assert gone_p.via == "cuDevicePrimaryCtxReset_v2" and gone_p.where.line == line_of("reset-here")
    assert gone_p.target.id == retain.target.id and gone_p.target.device == 1
    # By ContextRef: the id must match too.
    assert t.who_destroyed(gone_p.target) == [gone_p]
    assert t.who_destroyed(cyctx._trace.ContextRef(int(p), 10**9, None)) == []


def test_who_made_current_per_thread(d):
    p0 = drivers.ok(d.cuDevicePrimaryCtxRetain(0))
    p1 = drivers.ok(d.cuDevicePrimaryCtxRetain(1))
    tids = {}

    def worker():
        tids["w"] = threading.get_native_id()
        drivers.ok(d.cuCtxSetCurrent(p1))  # worker-set
        drivers.ok(d.cuCtxSetCurrent(None))
        drivers.ok(d.cuCtxPushCurrent(p1))  # worker-push
        # left current on the worker (its thread ends with it)

    try:
        with cyctx.trace() as t:
            drivers.ok(d.cuCtxPushCurrent(p0))  # main-push
            th = threading.Thread(target=worker, name="w")
            th.start()
            th.join()
            drivers.ok(d.cuCtxPopCurrent())  # main-pop
        main = t.who_made_current()
        assert main.call == "cuCtxPopCurrent_v2" and main.where.line == line_of("main-pop")
        w = t.who_made_current(tids["w"])
        assert w.call == "cuCtxPushCurrent_v2" and w.where.line == line_of("worker-push")
        assert w.after.handle == int(p1) and w.after.device == 1
        assert [e.where.line for e in t.changes(tids["w"])] == [
            line_of("worker-set"),
            line_of("worker-set") + 1,
            line_of("worker-push"),
        ]
        assert t.who_made_current(thread=123456789) is None
    finally:
        drivers.ok(d.cuDevicePrimaryCtxRelease(0))
        drivers.ok(d.cuDevicePrimaryCtxRelease(1))


def test_libraries_touching_a_device(d):
    g = cyctx.ContextGuard(1)
    with cyctx.trace() as t:
        with g:
            pass
        p = drivers.ok(d.cuDevicePrimaryCtxRetain(0))
        drivers.ok(d.cuDevicePrimaryCtxRelease(0))
    g.close()
    assert t.libraries_touching(1) == {"cyctx guard": 2}
    # created, the retain, destroy starting, the release
    assert t.libraries_touching(0) == {"cuda-bindings": 4}
    assert t.libraries_touching(5) == {}
    for bad in (-1, "0", True, 1.0):
        with pytest.raises(ValueError, match="device must be an ordinal"):
            t.libraries_touching(bad)
    assert p


def test_python_frames_off_and_native_frames_off(d):
    with cyctx.trace(python_frames=0, native_frames=0) as t:
        drivers.ok(d.cuCtxSetCurrent(None))
    (e,) = t.events
    assert e.python == [] and e.python_state == "Python frames off" and e.where is None
    assert e.native == [] and e.library == "?"


def test_a_full_buffer_counts_what_it_lost(d, primary, capfd):
    try:
        with cyctx.trace(capacity=3) as t:
            for _ in range(5):
                drivers.ok(d.cuCtxSetCurrent(primary))
        assert len(t.events) == 3 and t.dropped == 2
        assert "2 events were lost" in capfd.readouterr().err
        assert "2 LOST" in t.report()
    finally:
        drivers.ok(d.cuCtxSetCurrent(None))


def test_collect_keeps_a_long_trace_within_a_small_buffer(d):
    with cyctx.trace(capacity=2) as t:
        for _ in range(6):
            drivers.ok(d.cuCtxSetCurrent(None))
            t.collect()
    assert len(t.events) == 6 and t.dropped == 0


def test_a_second_trace_says_so_and_changes_nothing(d, capfd):
    with cyctx.trace() as t:
        with cyctx.trace() as t2:
            drivers.ok(d.cuCtxSetCurrent(None))
        assert t.active and not t2.active
    err = capfd.readouterr().err
    assert err.count("\n") == 1
    assert err == "cyctx trace: not tracing: a cyctx trace is already running in this process\n"
    assert t2.reason and t2.events == [] and len(t.events) == 1
    assert t2.report() == f"cyctx trace: not tracing: {t2.reason}"


def test_asking_while_running_and_restarting_are_errors(d):
    t = cyctx.trace()
    with t:
        with pytest.raises(cyctx._trace.TraceError, match="still running"):
            t.changes()
    with pytest.raises(cyctx._trace.TraceError, match="runs once"):
        t.start()
    with pytest.raises(TypeError, match="who_destroyed"):
        t.who_destroyed("0x1")


def test_json_has_the_schema_and_every_event(d):
    with cyctx.trace() as t:
        drivers.ok(d.cuCtxSetCurrent(None))  # json-line
    data = json.loads(json.dumps(t.to_json()))
    assert data["schema"] == "cyctx.trace/1" and data["driver"] == "simulated"
    assert data["active"] is True and data["dropped"] == 0
    (e,) = data["events"]
    assert set(e) == {
        "seq",
        "time_s",
        "duration_s",
        "thread",
        "thread_name",
        "domain",
        "call",
        "via",
        "result",
        "before",
        "after",
        "target",
        "device",
        "changed",
        "held_gil",
        "python",
        "python_state",
        "native_state",
        "native",
        "library",
        "where",
        "cyctx_guard",
    }
    assert e["call"] == "cuCtxSetCurrent" and e["where"]["line"] == line_of("json-line")
    assert e["where"]["file"] == HERE and e["changed"] is False


def test_report_names_each_event_and_the_answers(d):
    g = cyctx.ContextGuard(1)
    with cyctx.trace() as t:
        with g:  # report-block
            pass
    g.close()
    text = t.report()
    assert text.startswith("cyctx trace: 2 events on 1 thread, through the simulated driver")
    assert f"by cyctx guard at {HERE}:{line_of('report-block')}" in text
    assert "libraries per device:\n  device 1: cyctx guard (2)" in text


def test_a_reset_of_the_current_primary_is_a_change(d, primary):
    drivers.ok(d.cuCtxSetCurrent(primary))
    try:
        with cyctx.trace() as t:
            drivers.ok(d.cuDevicePrimaryCtxReset(0))  # reset-current
        (reset,) = api(t, "cuDevicePrimaryCtxReset_v2")
        # Same handle, current before and after; its id is gone (destroyed): a change.
        assert reset.before.handle == reset.after.handle == int(primary)
        assert reset.before.id is not None and reset.after.id is None
        assert reset.changed and t.who_made_current() is reset
    finally:
        drivers.ok(d.cuCtxSetCurrent(None))


def test_the_library_named_is_the_one_the_caller_entered(d, sim):
    """A call through two libraries (ctypes' module, then libffi, then the driver) is named
    after the one Python entered, as cuda.core's calls through cuda-bindings are cuda.core's."""
    import _ctypes

    set_current = drivers.sim_set_current(sim)
    with cyctx.trace() as t:
        assert set_current(None) == 0  # ctypes-call
    (e,) = t.events
    owners = [n.owner for n in e.native]
    assert owners[0].startswith("libffi") and os.path.basename(_ctypes.__file__) in owners
    assert e.library == os.path.basename(_ctypes.__file__)
    assert e.where.line == line_of("ctypes-call") and not e.cyctx_guard


def test_a_reactivated_primary_is_created_with_its_new_id(d):
    with cyctx.trace() as t:
        drivers.ok(d.cuDevicePrimaryCtxRetain(0))
        drivers.ok(d.cuDevicePrimaryCtxRelease(0))  # the last reference: destroyed
        drivers.ok(d.cuDevicePrimaryCtxRetain(0))  # a new activation, a new id
        drivers.ok(d.cuDevicePrimaryCtxRelease(0))
    created = [e.target for e in t.events if e.call == "context created"]
    gone = [e.target for e in t.events if e.call == "context destroy starting"]
    retains = [e.target for e in api(t, "cuDevicePrimaryCtxRetain")]
    assert created == retains and created[0].id != created[1].id
    assert gone == created and all(r.device == 0 for r in created)


def test_libcupti_is_found_in_the_order_documented(tmp_path, monkeypatch):
    from cyctx._trace import locate

    wheel13 = tmp_path / "a" / "nvidia" / "cu13" / "lib"
    wheel12 = tmp_path / "b" / "nvidia" / "cuda_cupti" / "lib"
    for d, name in ((wheel13, "libcupti.so.13"), (wheel12, "libcupti.so.12")):
        d.mkdir(parents=True)
        (d / name).write_bytes(b"")
    env = tmp_path / "env" / "libcupti.so.13"
    system = tmp_path / "system"  # where a system's packages put the driver and its CUPTI
    system.mkdir()
    for name in ("libcuda.so.580.159.04", "libcupti.so.12", "libcupti.so", "libcuptix.so.12"):
        (system / name).write_bytes(b"")
    monkeypatch.setattr(locate, "mapped_paths", lambda: [str(system / "libcuda.so.580.159.04")])
    monkeypatch.setattr(sys, "path", [str(tmp_path / "a"), str(tmp_path / "b")])
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("CYCTX_CUPTI", str(env))
    found = [x for x in locate.candidates() if not x[0].startswith("/usr/local/cuda")]
    assert found == [
        (str(env), "$CYCTX_CUPTI"),
        (str(system / "libcupti.so.12"), f"beside the loaded driver ({system})"),
        (str(wheel13 / "libcupti.so.13"), "the nvidia-cuda-cupti wheel"),
        (str(wheel12 / "libcupti.so.12"), "the nvidia-cuda-cupti wheel"),
    ]
    # A CUPTI newer than the driver is passed over; the one loaded already always wins.
    monkeypatch.setattr(locate, "mapped_paths", lambda: [])
    monkeypatch.delenv("CYCTX_CUPTI")
    assert locate.find_cupti(12)[0] == str(wheel12 / "libcupti.so.12")
    assert locate.find_cupti(13)[0] == str(wheel13 / "libcupti.so.13")
    monkeypatch.setattr(locate, "mapped_paths", lambda: ["/x/libcupti.so.13.0.85"])
    assert locate.find_cupti(12) == ("/x/libcupti.so.13.0.85", "already loaded in this process")


def test_a_library_that_is_not_cupti_is_refused_and_nothing_changes(tmp_path):
    from cyctx._trace import _native

    missing = _native.start(str(tmp_path / "libcupti.so.13"), 4, 12, 8)
    assert missing.startswith("libcupti could not be loaded: ")
    libc = ctypes.util.find_library("c")
    assert _native.start(libc, 4, 12, 8) == "the CUPTI library has no callback API (cuptiSubscribe)"
    with cyctx.trace() as t:  # and a trace still starts after them: none runs
        pass
    assert t.reason is None or drivers.SIM is None


def test_a_call_in_flight_when_the_trace_starts_is_left_out(d, sim, primary):
    """Its exit comes without its entry: not an event, and that thread's later calls are
    recorded as any other's (nothing of the lone exit is left on the thread)."""
    p, lines = primary, {}

    def worker():
        drivers.ok(d.cuCtxSetCurrent(p))  # held by the stall, in flight when the trace starts
        drivers.ok(d.cuCtxPushCurrent(p))  # after-1
        drivers.ok(d.cuCtxPopCurrent())
        drivers.ok(d.cuCtxSetCurrent(None))  # after-3
        lines["tid"] = threading.get_native_id()

    sim.stall("cuCtxSetCurrent")
    th = threading.Thread(target=worker)
    try:
        th.start()
        for _ in range(2000):
            if sim.stalled():
                break
            threading.Event().wait(0.005)
        assert sim.stalled()
        with cyctx.trace() as t:
            sim.unstall()
            th.join()
        mine = [e for e in t.events if e.thread == lines["tid"]]
        assert [e.call for e in mine] == [
            "cuCtxPushCurrent_v2",
            "cuCtxPopCurrent_v2",
            "cuCtxSetCurrent",
        ]
        assert [e.where.line for e in mine] == [
            line_of("after-1"),
            line_of("after-1") + 1,
            line_of("after-3"),
        ]
        assert all(e.via is None for e in mine)
    finally:
        sim.unstall()
        th.join()
