"""The native walk (docs/tracing.md, "How it works"): the driver's and the tracer's own frames
below the caller are not counted against native_frames; a native chain deeper than the default
limit still reaches the eval loop, and one past the hard maximum says it was cut, at the right
line; a library unloaded between a walk and its naming puts the event in doubt; a frame in no
loaded object (a JIT's) is named as such.

The deep chains come from a recursive C function that the test compiles (frames of a library
of its own between the line and the driver, as CuPy's runtime calls are)."""

import ctypes
import os
import platform
import shutil
import sys

import pytest
from helpers import drivers, fakelibs
from helpers.lines import line_of

import cyctx
from cyctx._trace import _native

DEEP_C = r"""
typedef int (*set_fn)(void *);
/* Not a tail call (the result is used): each level is a frame of its own. */
__attribute__((noinline)) int cyctx_test_deep(int n, set_fn f) {
    if (n <= 0) return f((void *)0);
    int r = cyctx_test_deep(n - 1, f);
    return r + (n & 0);
}
"""


def _compile_deep(tmp_path_factory, name, flags=(), source=DEEP_C):
    """``source`` (DEEP_C) compiled as lib<name>.so (not loaded): its path."""
    if fakelibs.compiler() is None:
        pytest.skip("no C compiler")
    so = tmp_path_factory.mktemp(name) / f"lib{name}.so"
    return fakelibs.shared_library(source, so, flags=("-O1", "-fno-optimize-sibling-calls", *flags))


@pytest.fixture(scope="module")
def deep_so(tmp_path_factory):
    """The compiled library's path (not loaded)."""
    return _compile_deep(tmp_path_factory, "cyctxdeep")


def _load(path):
    lib = ctypes.CDLL(path)
    lib.cyctx_test_deep.argtypes = [ctypes.c_int, ctypes.c_void_p]
    lib.cyctx_test_deep.restype = ctypes.c_int
    return lib


@pytest.fixture(scope="module")
def deep_lib(deep_so):
    return _load(deep_so), deep_so


@pytest.fixture
def set_current_ptr(sim):
    fn = drivers.sim_set_current(sim)
    return ctypes.cast(fn, ctypes.c_void_p).value


def _deep_event(lib, fn, depth, **kw):
    with cyctx.trace(**kw) as t:
        assert lib.cyctx_test_deep(depth, fn) == 0  # deep-call
    (e,) = [e for e in t.events if e.call == "cuCtxSetCurrent"]
    return e


def test_a_chain_deeper_than_the_old_limit_reaches_the_eval_loop_by_default(
    deep_lib, set_current_ptr
):
    lib, path = deep_lib
    e = _deep_event(lib, set_current_ptr, 40)
    assert e.native_state == "the eval loop", e
    assert e.where is not None and e.where.line == line_of("deep-call"), e
    assert sum(n.library == path for n in e.native) == 41, [n.library for n in e.native]
    # The library the line called: ctypes' compiled module (libffi is passed through).
    import _ctypes

    assert e.library == os.path.basename(_ctypes.__file__), e.library


def test_the_driver_side_frames_are_not_counted_against_the_limit(deep_lib, set_current_ptr):
    # 3 frames of the test's library, libffi, _ctypes, the interpreter's up to the eval loop:
    # the limit is the caller's frames; the tracer's, CUPTI's and the driver's are not kept.
    lib, path = deep_lib
    e = _deep_event(lib, set_current_ptr, 2)
    assert e.native[0].library == path, e.native
    n = len(e.native)
    assert e.native_state == "the eval loop"
    exact = _deep_event(lib, set_current_ptr, 2, native_frames=n)
    assert exact.native_state == "the eval loop", exact
    assert [f.library for f in exact.native] == [f.library for f in e.native]
    short = _deep_event(lib, set_current_ptr, 2, native_frames=n - 1)
    assert short.native_state == "cut", short


def test_a_chain_past_the_hard_maximum_says_cut_at_the_right_line(deep_lib, set_current_ptr):
    lib, path = deep_lib
    e = _deep_event(lib, set_current_ptr, 300, native_frames=_native.MAX_NATIVE)
    assert _native.MAX_NATIVE == 256
    assert e.native_state == "cut", e
    assert len(e.native) == 256 and all(n.library == path for n in e.native)
    assert e.where is not None and e.where.line == line_of("deep-call"), e
    assert e.library == (
        f"libcyctxdeep.so (called from {e.where}, through native code beyond cyctx_test_deep: "
        "the native stack was cut at native_frames=256)"
    ), e.library
    assert e.describe() == f"cuCtxSetCurrent by {e.library} at {e.where}"


# --- a library unloaded while a trace runs -------------------------------------------------------

UNLOADED = "a library was unloaded between this walk and its naming: its native frames may be wrong"


def _maps():
    with open("/proc/self/maps") as f:
        return f.read()


def _unload(lib, path):
    import _ctypes

    _ctypes.dlclose(lib._handle)
    assert path not in _maps(), "the test's library stayed loaded"


def _calls(t):
    return [e for e in t.events if e.call == "cuCtxSetCurrent"]


def test_an_unload_puts_in_doubt_only_the_events_walked_before_it_and_named_after(
    deep_so, set_current_ptr, tmp_path, capfd
):
    # B is A's copy: loaded where A was (the loader reuses the hole), the same code at the same
    # addresses, so the names a walk in A gets after the unload would be B's. The mark does not
    # depend on that: it follows the loader's count of unloads, read at each walk and at the
    # naming.
    a_path, b_path = str(tmp_path / "libcyctxdeep_a.so"), str(tmp_path / "libcyctxdeep_b.so")
    shutil.copy(deep_so, a_path)  # not the module's loaded copy: this one can go
    shutil.copy(deep_so, b_path)
    g = cyctx.ContextGuard(0)
    try:
        with cyctx.trace(quiet=False) as t:
            a = _load(a_path)
            assert a.cyctx_test_deep(3, set_current_ptr) == 0  # named-before
            t.collect()
            assert a.cyctx_test_deep(3, set_current_ptr) == 0  # walked-before
            with g:  # the guard's push and pop, walked before the unload too
                pass
            _unload(a, a_path)
            b = _load(b_path)
            assert b.cyctx_test_deep(3, set_current_ptr) == 0  # walked-after
            t.collect()
            assert b.cyctx_test_deep(3, set_current_ptr) == 0  # after-check
    finally:
        g.close()
    _unload(b, b_path)
    named, walked, after, checked = _calls(t)
    where = lambda e, marker: e.where is not None and e.where.line == line_of(marker)  # noqa: E731
    assert where(named, "named-before") and where(walked, "walked-before")
    assert where(after, "walked-after") and where(checked, "after-check")
    # Walked and named while A was loaded (named at its collection, not at the stop).
    assert named.native_state == "the eval loop", named
    assert sum(n.library == a_path for n in named.native) == 4, named.native
    # Walked after the unload (B loaded), named with B loaded: exact, B's frames.
    for e in (after, checked):
        assert e.native_state == "the eval loop", e
        assert sum(n.library == b_path for n in e.native) == 4, e.native
    # Walked in A, named after A went: said to be in doubt, its library not given as known.
    import _ctypes

    assert walked.native_state == UNLOADED, walked
    assert walked.library.startswith(f"{os.path.basename(_ctypes.__file__)} (called from "), (
        walked.library
    )
    assert walked.library.endswith(f": {UNLOADED})"), walked.library
    # And so are the guard's push and pop, walked before the unload too.
    assert [e.native_state == UNLOADED for e in t.events if e.call != "cuCtxSetCurrent"] == [
        True,
        True,
    ], t.events
    assert t.unloaded == 3
    report = t.report()
    assert "; 3 with native frames that may be wrong (a library was unloaded)" in report
    # Its three events, the pop again as who made the thread's context current last, and the
    # device's libraries (the guard's, named as in doubt).
    assert sum(UNLOADED in line for line in report.splitlines()) == 5, report
    data = t.to_json()
    states = [e["native_state"] for e in data["events"] if e["call"] == "cuCtxSetCurrent"]
    assert states == ["the eval loop", UNLOADED, "the eval loop", "the eval loop"]
    err = capfd.readouterr().err
    assert "a library was unloaded while tracing: the native frames of 3 events may be wrong" in (
        err
    ), err


@pytest.mark.parametrize(
    "unloaded", [True, False], ids=["loaded-and-unloaded", "loaded-and-called"]
)
def test_another_library_loaded_puts_nothing_in_doubt(
    deep_so, set_current_ptr, tmp_path, capfd, unloaded
):
    # A library loaded between two collections, and unloaded again (as an import's probe does)
    # or called: the events walked after it are exact. (Those walked before an unload and named
    # after it are in doubt: the count cannot say which library went.)
    other = str(tmp_path / "libcyctxdeep_other.so")
    shutil.copy(deep_so, other)
    with cyctx.trace(quiet=False) as t:
        a = _load(deep_so)
        assert a.cyctx_test_deep(3, set_current_ptr) == 0
        t.collect()
        o = _load(other)
        if unloaded:
            _unload(o, other)
            assert a.cyctx_test_deep(3, set_current_ptr) == 0
        else:
            assert o.cyctx_test_deep(3, set_current_ptr) == 0
        t.collect()
        assert a.cyctx_test_deep(3, set_current_ptr) == 0
    events = _calls(t)
    assert [e.native_state for e in events] == ["the eval loop"] * 3, events
    paths = [deep_so, deep_so if unloaded else other, deep_so]
    counts = [sum(n.library == p for n in e.native) for e, p in zip(events, paths, strict=True)]
    assert counts == [4, 4, 4], events
    assert t.unloaded == 0 and "may be wrong" not in t.report()
    assert "unloaded" not in capfd.readouterr().err


def test_a_cyctx_frame_in_doubt_is_not_called_a_guard():
    from cyctx._trace import Frame, NativeFrame
    from cyctx._trace.attribution import _attribute

    cyctx_py = os.path.join(os.path.dirname(cyctx.__file__), "x.py")
    native = [NativeFrame(cyctx.__file__, "f", "cyctx")]
    dirs = [(os.path.dirname(os.path.realpath(cyctx.__file__)) + os.sep, "cyctx")]
    python = [Frame(cyctx_py, 1, "f"), Frame("/app/main.py", 3, "main")]
    assert _attribute(python, False, native, 0, dirs) == ("cyctx", True, python[1])
    assert _attribute(python, False, native, 4, dirs) == (
        f"cyctx (whether a cyctx guard made the call is not known: {UNLOADED})",
        False,
        python[1],
    )


# --- a frame without unwind information ----------------------------------------------------------
# The walk cannot step past it (no FDE: the unwinder stops there), so it never reaches the eval
# loop although the thread has one. The event must not
# present that as a complete walk nor name the frame's library as the one the line called: the
# line called _ctypes, which called the library without unwind information.


def test_a_walk_stopped_by_a_frame_without_unwind_info_is_not_called_complete(
    tmp_path_factory, sim
):
    flags = ("-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-fno-exceptions")
    lib = _load(_compile_deep(tmp_path_factory, "cyctxnounwind", flags))
    fn = ctypes.cast(drivers.sim_set_current(sim), ctypes.c_void_p).value
    with cyctx.trace() as t:
        assert lib.cyctx_test_deep(3, fn) == 0
    (e,) = [e for e in t.events if e.call == "cuCtxSetCurrent"]
    import _ctypes

    # Either the walk says it did not reach the eval loop and the library is not given as
    # known, or it reached it and names _ctypes.
    if e.native_state == "the eval loop":
        assert e.library == os.path.basename(_ctypes.__file__), e
    else:
        assert e.native_state == "stopped before the eval loop (a frame without unwind information)"
        assert "libcyctxnounwind.so (called from" in e.library, e.library
        assert "stopped before the eval loop" in e.library, e.library


# Code a JIT writes into an anonymous mapping, with its unwind information registered at run
# time (__register_frame), then replaced by other code with other unwind information at the
# same address: two functions whose call returns at the same offset (12), one keeping its frame
# in rbp, the other in rsp. Each walk must use the information registered when it walks (a walk
# that kept the first one's for that address would compute the frame from the caller's rbp and
# skip the caller, cyctx_jit_call, compiled with a frame pointer), and mark the frame as in no
# loaded object.
JIT_C = r"""
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
extern void __register_frame(void *);
extern void __deregister_frame(void *);
typedef int (*set_fn)(void *);
typedef int (*jit_fn)(set_fn, void *);

/* A: push rbp; mov rbp,rsp; mov rax,rdi; mov rdi,rsi; call rax; pop rbp; ret */
static const unsigned char CODE_A[] = {0x55, 0x48, 0x89, 0xe5, 0x48, 0x89, 0xf8, 0x48, 0x89,
                                       0xf7, 0xff, 0xd0, 0x5d, 0xc3};
/* B: sub rsp,8; mov rax,rdi; mov rdi,rsi; call rax; add rsp,8; ret */
static const unsigned char CODE_B[] = {0x48, 0x83, 0xec, 0x08, 0x48, 0x89, 0xf8, 0x48, 0x89,
                                       0xf7, 0xff, 0xd0, 0x48, 0x83, 0xc4, 0x08, 0xc3};
/* CFA programs: A's frame moves to rbp after its prologue; B's stays on rsp. */
static const unsigned char CFA_A[] = {0x41, 0x0e, 0x10, 0x86, 0x02, 0x43, 0x0d, 0x06,
                                      0x49, 0x0c, 0x07, 0x08};
static const unsigned char CFA_B[] = {0x44, 0x0e, 0x10, 0x4c, 0x0e, 0x08};

static unsigned char *g_code;
static unsigned char g_eh[2][128] __attribute__((aligned(8)));
static int g_registered = -1;

/* A CIE (zR, pointers absolute, CFA rsp+8, return address at CFA-8), one FDE, a terminator. */
static void build(unsigned char *eh, const unsigned char *cfa, size_t ncfa, size_t ncode) {
    static const unsigned char cie[] = {20, 0, 0, 0, 0, 0, 0, 0, 1, 'z', 'R', 0, 1, 0x78, 16,
                                        1, 0, 0x0c, 7, 8, 0x90, 1, 0, 0};
    memset(eh, 0, 128);
    memcpy(eh, cie, sizeof cie);
    unsigned char *f = eh + sizeof cie;
    uint32_t len = (uint32_t)((4 + 8 + 8 + 1 + ncfa + 3) & ~(size_t)3);
    uint32_t back = (uint32_t)(f + 4 - eh);
    uint64_t begin = (uint64_t)(uintptr_t)g_code, range = ncode;
    memcpy(f, &len, 4);
    memcpy(f + 4, &back, 4);
    memcpy(f + 8, &begin, 8);
    memcpy(f + 16, &range, 8);
    f[24] = 0;
    memcpy(f + 25, cfa, ncfa);
}

/* Writes variant v (0: A, 1: B) at the one address and registers its unwind information in
 * place of the other's. 0 on success. */
int cyctx_jit_make(int v) {
    if (!g_code) {
        void *p = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return -1;
        g_code = p;
    }
    if (g_registered >= 0) __deregister_frame(g_eh[g_registered]);
    g_registered = -1;
    if (mprotect(g_code, 4096, PROT_READ | PROT_WRITE)) return -2;
    memset(g_code, 0xcc, 64);
    memcpy(g_code, v ? CODE_B : CODE_A, v ? sizeof CODE_B : sizeof CODE_A);
    if (mprotect(g_code, 4096, PROT_READ | PROT_EXEC)) return -3;
    __builtin___clear_cache((char *)g_code, (char *)g_code + 64);
    build(g_eh[v], v ? CFA_B : CFA_A, v ? sizeof CFA_B : sizeof CFA_A,
          v ? sizeof CODE_B : sizeof CODE_A);
    __register_frame(g_eh[v]);
    g_registered = v;
    return 0;
}

void cyctx_jit_drop(void) {
    if (g_registered >= 0) __deregister_frame(g_eh[g_registered]);
    g_registered = -1;
}

uintptr_t cyctx_jit_address(void) { return (uintptr_t)g_code; }

__attribute__((noinline)) int cyctx_jit_call(set_fn f) {
    int r = ((jit_fn)g_code)(f, (void *)0);
    return r + (int)((uintptr_t)f & 0);
}
"""


@pytest.fixture(scope="module")
def jit_lib(tmp_path_factory):
    """JIT_C compiled (with a frame pointer) and loaded: (the library, its path)."""
    so = _compile_deep(tmp_path_factory, "cyctxjit", ["-fno-omit-frame-pointer"], JIT_C)
    lib = ctypes.CDLL(so)
    lib.cyctx_jit_call.argtypes = [ctypes.c_void_p]
    lib.cyctx_jit_address.restype = ctypes.c_size_t
    return lib, so


X86_64_LINUX = pytest.mark.skipif(
    platform.machine() != "x86_64" or sys.platform != "linux",
    reason="the test's JIT code is x86-64 machine code",
)


@X86_64_LINUX
def test_code_replaced_at_a_jit_address_is_walked_with_its_own_unwind_info(
    jit_lib, set_current_ptr, sim
):
    lib, so = jit_lib
    try:
        with cyctx.trace(native_frames=64) as t:
            for variant in (0, 1, 0, 1):
                assert lib.cyctx_jit_make(variant) == 0
                assert lib.cyctx_jit_call(set_current_ptr) == 0
    finally:
        lib.cyctx_jit_drop()
    jit = lib.cyctx_jit_address()
    assert [e.call for e in t.events] == ["cuCtxSetCurrent"] * 4
    for variant, e, raw in zip((0, 1, 0, 1), t.events, t._raw, strict=True):
        # The JIT frame (in no library), then its caller: the test's library.
        (i,) = [k for k, a in enumerate(raw["native"]) if jit <= a < jit + 64]
        assert raw["native"][i] == jit + 12, (variant, hex(raw["native"][i]))
        assert raw["outside"] == [i], raw["outside"]  # the only frame in no loaded object
        assert raw["names"][i][0] is None, raw["names"][i]
        assert raw["names"][i + 1] == (so, "cyctx_jit_call"), (variant, raw["names"][i + 1])
        assert e.native_state == "the eval loop", e


@X86_64_LINUX
def test_a_jit_frame_is_named_as_in_no_library_whatever_is_loaded_there_by_the_naming(
    jit_lib, set_current_ptr, sim, monkeypatch
):
    # A JIT's code freed and a library loaded at its address before the events are collected:
    # dladdr would then name that library. Here the loader's answer at the naming is made so
    # (resolve names the JIT's address after a library); the walk saw no object there.
    lib, so = jit_lib
    assert lib.cyctx_jit_make(1) == 0
    jit = lib.cyctx_jit_address()
    real = _native.resolve
    asked = []

    def resolve(addrs):
        asked.extend(addrs)
        return [
            ("/tmp/libloaded-since.so", "f") if jit <= a < jit + 64 else r
            for a, r in zip(addrs, real(addrs), strict=True)
        ]

    monkeypatch.setattr(_native, "resolve", resolve)
    try:
        with cyctx.trace(native_frames=64) as t:
            assert lib.cyctx_jit_call(set_current_ptr) == 0
    finally:
        lib.cyctx_jit_drop()
    ((e, raw),) = zip(t.events, t._raw, strict=True)
    (i,) = [k for k, a in enumerate(raw["native"]) if jit <= a < jit + 64]
    assert raw["outside"] == [i], raw["outside"]
    assert raw["names"][i] == (None, None), raw["names"][i]
    assert raw["names"][i + 1] == (so, "cyctx_jit_call"), raw["names"][i + 1]
    assert all(not jit <= a < jit + 64 for a in asked), "the JIT's address was looked up"
    assert "libloaded-since" not in e.library, e.library
    assert all(n.library != "/tmp/libloaded-since.so" for n in e.native), e.native


THREAD_C = r"""
#include <pthread.h>
typedef int (*set_fn)(void *);
static void *run(void *f) { return (void *)(long)((set_fn)f)((void *)0); }
/* A thread no Python code started: it calls the driver and ends. */
int cyctx_test_thread(set_fn f) {
    pthread_t t;
    void *r;
    if (pthread_create(&t, 0, run, (void *)f) != 0) return -1;
    pthread_join(t, &r);
    return (int)(long)r;
}
"""


def test_a_thread_no_python_code_started_is_walked_to_the_end_of_its_stack(
    tmp_path_factory, set_current_ptr
):
    so = _compile_deep(tmp_path_factory, "cyctxthread", ("-pthread",), THREAD_C)
    lib = ctypes.CDLL(so)
    lib.cyctx_test_thread.argtypes = [ctypes.c_void_p]
    with cyctx.trace() as t:
        assert lib.cyctx_test_thread(set_current_ptr) == 0
    (e,) = [e for e in t.events if e.call == "cuCtxSetCurrent"]
    assert (e.python_state, e.native_state) == ("not a Python thread", "the end of the stack"), e
    assert e.where is None and e.native[0].library == so, e
    assert (
        e.describe()
        == "cuCtxSetCurrent by libcyctxthread.so (no Python frames: not a Python thread)"
    )
    assert e.as_json()["native_state"] == "the end of the stack"
