"""Naming a trace's events costs what it should: each distinct file or library is looked up
once (not once per event), the events are built as they are collected and never again (a
snapshot, the doctor's, the stop), so stopping a trace costs in proportion to its events."""

import os
import time

from helpers import drivers

import cyctx


def _events(d, n):
    p = drivers.ok(d.cuDevicePrimaryCtxRetain(0))
    try:
        for _ in range(n // 2):
            d.cuCtxSetCurrent(p)
            d.cuCtxSetCurrent(None)
    finally:
        drivers.ok(d.cuDevicePrimaryCtxRelease(0))


def _lookups_to_stop(d, n, monkeypatch):
    calls = []
    real = os.path.realpath

    def counting(path, *a, **kw):
        calls.append(path)
        return real(path, *a, **kw)

    t = cyctx.trace(capacity=n + 16).start()
    _events(d, n)
    with monkeypatch.context() as m:
        m.setattr(os.path, "realpath", counting)
        t.stop()
    assert len(t.events) >= n and not t.dropped
    return len(calls)


def test_each_path_is_looked_up_once_however_many_events(d, monkeypatch):
    few = _lookups_to_stop(d, 100, monkeypatch)
    many = _lookups_to_stop(d, 1000, monkeypatch)
    assert many == few, (few, many)
    assert few < 50, few


def test_events_are_built_once_snapshots_and_the_stop_reuse_them(d):
    with cyctx.trace() as t:
        _events(d, 10)
        first = t.snapshot()
        _events(d, 10)
        second = t.snapshot()
        # Ten changes each time, with the retain and the release around them.
        assert len(second) == 2 * len(first) and len(first) >= 12
        assert all(a is b for a, b in zip(first, second[: len(first)], strict=True))
    assert all(a is b for a, b in zip(second, t.events, strict=True))


def test_events_built_in_pieces_are_those_built_at_once(d):
    """A collection can fall anywhere: between a "context created" and the exit of the call it
    ran inside (which names its id and device), between a handle's events. Built in two
    pieces, split at every record, the events are those built from all records at once."""
    p = drivers.ok(d.cuDevicePrimaryCtxRetain(1))
    with cyctx.trace() as t:
        drivers.ok(d.cuCtxSetCurrent(p))
        drivers.ok(d.cuDevicePrimaryCtxReset(1))  # destroyed: its id and device were seen
        drivers.ok(d.cuDevicePrimaryCtxRetain(1))  # created again: a new id
        drivers.ok(d.cuCtxSetCurrent(None))
        drivers.ok(d.cuDevicePrimaryCtxRelease(1))
    drivers.ok(d.cuDevicePrimaryCtxRelease(1))
    whole = [e.as_json() for e in t.events]
    assert any(e["call"] == "context created" and e["target"]["id"] for e in whole), whole
    for k in range(len(t._raw) + 1):
        built = t._build_in_pieces([t._raw[:k], t._raw[k:]])
        assert [e.as_json() for e in built] == whole, k


def test_stopping_a_trace_of_thousands_of_events_takes_a_fraction_of_a_second_each(d):
    # Loose on purpose (a shared, loaded machine): a stop that looked every path up again for
    # each event took over a millisecond an event here; bench/trace_cost.py --naming measures.
    t = cyctx.trace(capacity=4100).start()
    _events(d, 4000)
    t0 = time.perf_counter()
    t.stop()
    took = time.perf_counter() - t0
    assert len(t.events) >= 4000
    assert took < 2.0, f"{took:.2f} s to stop a trace of 4000 events"
