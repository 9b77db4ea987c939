"""cyctx.trace()'s options are checked at the call, each bad one a typed error that names it
(nothing is loaded or started); its buffer is bounded by the memory the process can afford and
takes memory as events fill it, not at the start."""

import os

import pytest
from helpers import drivers

import cyctx

BAD_COUNTS = [
    (1.5, TypeError, "not a float"),
    (2.0, TypeError, "not a float"),
    ("2", TypeError, "not a str"),
    (True, TypeError, "not a bool"),
    (False, TypeError, "not a bool"),
    (None, TypeError, "not a NoneType"),
    (-1, ValueError, "not -1"),
    (1 << 300, ValueError, "<an int of 301 bits>"),
]


@pytest.mark.parametrize("option", ["python_frames", "native_frames", "capacity"])
@pytest.mark.parametrize("value, error, words", BAD_COUNTS)
def test_a_bad_count_is_a_typed_error_naming_the_option(option, value, error, words):
    with pytest.raises(error) as info:
        cyctx.trace(**{option: value})
    text = str(info.value)
    assert text.startswith(f"cyctx.trace({option}="), text
    assert words in text, text


@pytest.mark.parametrize(
    "option, value, limit",
    [("python_frames", 7, "0 to 6"), ("native_frames", 257, "0 to 256"), ("capacity", 0, "1 ")],
)
def test_a_count_out_of_range_names_the_range(option, value, limit):
    with pytest.raises(ValueError, match=rf"^cyctx\.trace\({option}={value}\): .*{limit}"):
        cyctx.trace(**{option: value})


def test_an_int_like_count_is_taken_as_its_value():
    class Three:
        def __index__(self):
            return 3

    t = cyctx.trace(python_frames=Three(), native_frames=Three(), capacity=Three())
    assert (t.python_frames, t.native_frames, t.capacity) == (3, 3, 3)
    assert all(type(v) is int for v in (t.python_frames, t.native_frames, t.capacity))
    t = cyctx.trace(python_frames=6, native_frames=256)  # the top of each range is taken
    assert (t.python_frames, t.native_frames) == (6, 256)


@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_quiet_is_a_bool(value):
    with pytest.raises(TypeError, match=r"^cyctx\.trace\(quiet=.*\): quiet must be True or False"):
        cyctx.trace(quiet=value)


def test_a_bad_option_starts_nothing(sim):
    with pytest.raises(TypeError):
        cyctx.trace(python_frames=1.5).start()
    with cyctx.trace() as t:  # no trace runs: another starts
        pass
    assert t.reason is None, t.reason


def _physical() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_a_buffer_the_process_cannot_afford_is_refused_at_the_call_with_the_figures():
    from cyctx._trace import _native

    slot = _native.slot_bytes(4, 64)
    too_many = _physical() // slot + 1  # more than all of the machine's memory
    with pytest.raises(ValueError) as info:
        cyctx.trace(capacity=too_many)
    text = str(info.value)
    assert text.startswith(f"cyctx.trace(capacity={too_many}): "), text
    # The figures: the buffer it would need, the bound and why, the largest capacity that fits.
    assert f"{slot} bytes an event" in text, text
    assert "a quarter of the memory" in text, text
    fits = int(text.rsplit("at most capacity=", 1)[1])
    assert 0 < fits * slot <= _physical() // 4, (text, slot)
    cyctx.trace(capacity=fits)  # that capacity is accepted, and one more is not
    with pytest.raises(ValueError, match=f"at most capacity={fits}$"):
        cyctx.trace(capacity=fits + 1)
    # Fewer frames make smaller events: more of them fit.
    assert _native.slot_bytes(0, 0) < _native.slot_bytes(1, 0) < _native.slot_bytes(4, 64)
    assert _native.slot_bytes(4, 0) < slot


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_large_buffer_takes_memory_as_events_fill_it(d):
    from cyctx._trace import _native

    # Sixteen times what is touched at the start (all of a default buffer, whose events then
    # take no page fault).
    assert _native.PREFAULT_BYTES >= 16384 * _native.slot_bytes(4, 64)
    cap = 16 * _native.PREFAULT_BYTES // _native.slot_bytes(4, 64)
    before = _rss()
    with cyctx.trace(capacity=cap) as t:
        grown = _rss() - before
        for _ in range(100):
            drivers.ok(d.cuCtxSetCurrent(None))
    assert t.reason is None and len(t.events) == 100
    assert grown < 2 * _native.PREFAULT_BYTES, (
        f"the start took {grown >> 20} MiB for a {cap}-event buffer"
    )


def test_the_events_of_a_default_buffer_take_no_page_fault(d):
    # Its pages are touched at the start: a first touch in the callback would be a page fault
    # there, about doubling that event's cost.
    import ctypes
    import resource

    def fn(name, *args):
        err, pfn, _ = d.cuGetProcAddress(name.encode(), 4000, 0)
        assert err == 0 and pfn, name
        return ctypes.CFUNCTYPE(ctypes.c_int, *args)(pfn)  # called without the GIL

    push, pop = fn("cuCtxPushCurrent", ctypes.c_void_p), fn("cuCtxPopCurrent", ctypes.c_void_p)
    out, bad = ctypes.c_void_p(), 0
    h = int(drivers.ok(d.cuDevicePrimaryCtxRetain(0)))
    try:
        with cyctx.trace() as t:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(2000):  # 4,000 events (10 MB)
                bad |= push(h) | pop(ctypes.addressof(out))
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    finally:
        drivers.ok(d.cuDevicePrimaryCtxRelease(0))
    assert not bad and len(t.events) == 4000 and not t.dropped
    assert faults < 100, f"{faults} page faults while recording 4,000 events"
