"""What a trace says of the runtime's calls and of the driver calls made inside them, on the
simulated runtime (tests/sim/test_sim_runtime.py), as CUPTI reported them on the H200
(docs/evidence.md, "CUPTI callbacks"): each driver call names the runtime call it ran in
(``via``, ``[in cudaSetDevice]`` in the report), a resource event names the innermost call, and
the runtime call is an event of its own."""

import threading

import pytest
from helpers import drivers
from helpers.lines import line_of
from helpers.threads import in_thread

import cyctx
from cyctx._trace import ContextRef

ok = drivers.ok


@pytest.fixture
def rt(sim):
    """The runtime; its retains given back after the test (a reset per device it set)."""
    assert not sim.primary_active(0) and not sim.primary_active(1), "a primary left active"
    yield sim
    for k in (0, 1):
        if sim.retain_count(k):
            in_thread(lambda k=k: (sim.cuda_set_device(k), sim.cuda_device_reset()))
    assert sim.retain_count(0) == sim.retain_count(1) == 0


def _on_a_thread(fn):
    out = {}

    def body():
        out["tid"] = threading.get_native_id()
        fn()

    in_thread(body)
    return out["tid"]


def test_the_driver_calls_inside_cudaSetDevice_name_it(rt):
    def first():
        assert rt.cuda_set_device(1) == 0  # set-device

    with cyctx.trace() as t:
        tid = _on_a_thread(first)
    p = int(ok(drivers.driver().cuDevicePrimaryCtxRetain(1)))
    cid = ok(drivers.driver().cuCtxGetId(p))
    ok(drivers.driver().cuDevicePrimaryCtxRelease(1))
    ev = [e for e in t.events if e.thread == tid]
    assert [(e.call, e.via, e.domain) for e in ev] == [
        ("cuCtxSetCurrent", "cudaSetDevice", "driver"),
        ("context created", "cuDevicePrimaryCtxRetain", "resource"),
        ("cuDevicePrimaryCtxRetain", "cudaSetDevice", "driver"),
        ("cudaSetDevice", None, "runtime"),
    ]
    set_current, created, retain, set_device = ev
    here = ContextRef(p, cid, 1)
    # The set binds the inactive primary (no id yet); the retain inside activates it.
    assert set_current.before.handle == 0 and set_current.after == ContextRef(p, None, 1)
    assert created.target == here and retain.target == here and retain.device == 1
    assert set_device.device == 1 and set_device.before.handle == 0 and set_device.after == here
    assert all(e.where.line == line_of("set-device") for e in ev)
    # The runtime call made the thread's context current; the report tags what ran inside it.
    assert t.who_made_current(tid) is set_device
    report = [ln for ln in t.report().splitlines() if f" {tid} " in ln]
    assert [ln.split("[in ")[1].split("]")[0] if "[in " in ln else None for ln in report] == [
        "cudaSetDevice",
        "cuDevicePrimaryCtxRetain",
        "cudaSetDevice",
        None,
    ], report
    assert [e["via"] for e in t.to_json()["events"] if e["thread"] == tid] == [
        "cudaSetDevice",
        "cuDevicePrimaryCtxRetain",
        "cudaSetDevice",
        None,
    ]
    assert set_current.describe().startswith("cuCtxSetCurrent inside cudaSetDevice by ")


def test_cudaSetDevice_again_makes_only_the_set_inside_it(rt):
    in_thread(rt.cuda_set_device, 0)  # the runtime's retain, outside the trace
    with cyctx.trace() as t:
        tid = _on_a_thread(lambda: rt.cuda_set_device(0))
    assert [(e.call, e.via) for e in t.events if e.thread == tid] == [
        ("cuCtxSetCurrent", "cudaSetDevice"),
        ("cudaSetDevice", None),
    ]


def test_a_failing_driver_call_inside_cudaSetDevice_is_its_failure(rt):
    def body():
        rt.inject_fault("cuCtxSetCurrent", 999)
        assert rt.cuda_set_device(0) == 999

    with cyctx.trace() as t:
        tid = _on_a_thread(body)
    inner, outer = [e for e in t.events if e.thread == tid]
    assert (inner.call, inner.via, inner.result) == ("cuCtxSetCurrent", "cudaSetDevice", 999)
    assert (outer.call, outer.result, outer.changed) == ("cudaSetDevice", 999, False)


def test_cudaDeviceReset_is_who_destroyed_the_context(rt):
    def body():
        assert rt.cuda_set_device(1) == 0
        assert rt.cuda_device_reset() == 0  # device-reset

    with cyctx.trace() as t:
        tid = _on_a_thread(body)
    ev = [e for e in t.events if e.thread == tid]
    assert [(e.call, e.via) for e in ev][-2:] == [
        ("context destroy starting", "cudaDeviceReset"),
        ("cudaDeviceReset", None),
    ]
    activated = next(e for e in ev if e.call == "context created")
    (gone,) = t.who_destroyed(activated.target)
    assert gone.target == activated.target and gone.where.line == line_of("device-reset")
    assert gone.describe().startswith("context destroy starting inside cudaDeviceReset by ")
    report = t.report()
    assert f"context destroy starting {activated.target} [in cudaDeviceReset]" in report, report
