"""Reliability at the edges: what ordinary user code does that the rest of the suite does
not. Each test is one hazard that would crash, hang or leave the wrong state;
docs/guarantees.md ("At the edges") lists them. Crashes and hangs run in a child with a timeout.
"""

import gc
import subprocess
import sys
import threading
import warnings

import pytest

import cyctx
from cyctx import ContextGuard, ContextResetWarning, DriverError, GuardError

from cyctx._guard import _open_entries

from helpers.children import run_child
from helpers.drivers import create_context, current, driver, ok, reset_primary, second_device
from helpers.fakes import fake
from helpers.finalizers import collect_unraisable, suspended_in
from helpers.threads import in_thread, run_threads

D1 = second_device()  # device 1, or 0 on a one-GPU machine


# --- values of every type: validated before use ------------------------------------------

MALFORMED_STREAMS = [
    "()", "[]", "(1,)", "[0, 5]", "(0, 5, 6)", "None", "7", "'ab'", "(0, '5')", "(0, 1.5)",
    "(0, None)", "(0, True)", "(True, 5)", "(0, -1)", "(0, 2**64)", "(0, 2**200)", "(0, -2**200)",
    "('3', 5)", "(3.0, 5)", "b'ab'", "{0: 1, 1: 2}",
]


def test_malformed_cuda_stream_values_are_typed_errors_not_crashes():
    # Before: () and (1,) read past the end of the tuple (boundscheck=False), a list was
    # indexed blindly, '5' and 1.5 were accepted as handles, -1 and 2**64 gave OverflowError.
    out = run_child(f"""
        import cyctx
        class S:
            def __init__(self, v): self.v = v
            def __cuda_stream__(self): return self.v
        for src in {MALFORMED_STREAMS!r}:
            v = eval(src)
            try:
                cyctx.ContextGuard(S(v))
                print("ACCEPTED", src)
            except (TypeError, ValueError) as e:
                assert type(e) in (TypeError, ValueError), (src, type(e))
                print("OK", src, type(e).__name__)
            except BaseException as e:
                print("WRONG", src, type(e).__name__, e)
        print("DONE")
    """, timeout=120, check=False)
    assert out.returncode == 0, f"child died ({out.returncode}): {out.stderr[-2000:]}"
    bad = [l for l in out.stdout.splitlines() if l.startswith(("ACCEPTED", "WRONG"))]
    assert bad == [] and "DONE" in out.stdout, bad
    # Which error (docs/guarantees.md): a value of the wrong shape or type is a TypeError, a
    # handle out of range a ValueError.
    got = {ln[3:].rsplit(" ", 1)[0]: ln.rsplit(" ", 1)[1] for ln in out.stdout.splitlines() if ln.startswith("OK ")}
    out_of_range = {"(0, -1)", "(0, 2**64)", "(0, 2**200)", "(0, -2**200)"}
    assert got == {src: "ValueError" if src in out_of_range else "TypeError" for src in MALFORMED_STREAMS}


def test_valid_cuda_stream_value_reaches_the_driver(sim):
    # A well-formed (version, handle) gets to cuStreamGetCtx (which the simulated driver lacks)
    # or, for a default stream handle, the documented ValueError. Simulated only: 0x1234 is no
    # stream, and the real driver would dereference it.
    class S:
        def __init__(self, v):
            self.v = v

        def __cuda_stream__(self):
            return self.v

    with pytest.raises(ValueError, match="default stream"):
        ContextGuard(S((0, 2)))
    with pytest.raises((DriverError, ValueError)) as ei:
        ContextGuard(S((0, 0x1234)))
    assert not isinstance(ei.value, (TypeError, OverflowError))


@pytest.mark.parametrize("h", [-1, 2**64, 2**70, -2**70])
def test_out_of_range_handle_is_a_value_error(h):
    # Before: OverflowError from the C conversion.
    with pytest.raises(ValueError, match="handle"):
        ContextGuard.from_handle(h)


@pytest.mark.parametrize("h", [1.5, "1", None, True, b"\x01"])
def test_from_handle_rejects_non_ints(h):
    with pytest.raises(TypeError):
        ContextGuard.from_handle(h)


class _Dev:
    def __init__(self, index):
        self.index = index
        self.device_id = index


@pytest.mark.parametrize("obj, exc", [
    # torch-like stream with a float or out-of-range handle, or a bad fallback device
    (lambda: fake("torch.cuda", "Stream", cuda_stream=1.5, device=_Dev(0)), TypeError),
    (lambda: fake("torch.cuda", "Stream", cuda_stream=2**64, device=_Dev(0)), ValueError),
    (lambda: fake("torch.cuda", "Stream", cuda_stream=-5, device=_Dev(0)), ValueError),
    (lambda: fake("torch.cuda", "Stream", cuda_stream=0, device=_Dev("0")), TypeError),
    (lambda: fake("torch.cuda", "Stream", cuda_stream=0, device=_Dev(-1)), ValueError),
    # torch.device-like with a bad index
    (lambda: fake("torch", "device", type="cuda", index=1.5), TypeError),
    (lambda: fake("torch", "device", type="cuda", index=-1), ValueError),
    # CuPy-like
    (lambda: fake("cupy.cuda.device", "Device", id="0"), TypeError),
    (lambda: fake("cupy.cuda.device", "Device", id=1.9), TypeError),
    (lambda: fake("cupy.cuda.stream", "Stream", ptr=1.5, device_id=0), TypeError),
    (lambda: fake("cupy.cuda.stream", "Stream", ptr=2**65, device_id=0), ValueError),
    (lambda: fake("cupy.cuda.stream", "Stream", ptr=0, device_id=-3), ValueError),
    # cuda.core-like
    (lambda: fake("cuda.core.experimental", "Device", device_id=0.5), TypeError),
    (lambda: fake("cuda.core.experimental", "Context", handle=-1), ValueError),
    (lambda: fake("cuda.core.experimental", "Context", handle="0x1"), TypeError),
])
def test_duck_typed_objects_are_validated(obj, exc, sim):
    base = [sim.retain_count(i) for i in range(2)]
    with pytest.raises(exc):
        ContextGuard(obj())
    assert [sim.retain_count(i) for i in range(2)] == base


# --- shared(): no lock across driver calls or Python code --------------------------------

# sys.settrace's hook runs Python code at a deterministic point inside the first shared():
# the WeakSet.add of the guard registry, after the driver calls, while the old code held its
# non-reentrant lock.
TRACE_INSIDE_SHARED = """
    import sys, cyctx
    fired = []
    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "add" and "weakref" in frame.f_code.co_filename and not fired:
            fired.append(1)
            sys.settrace(None)
            {action}
        return None
    sys.settrace(tracer)
    g = cyctx.ContextGuard.shared(D1)
    sys.settrace(None)
    print("FIRED", bool(fired), "SAME", g is cyctx.ContextGuard.shared(D1))
"""


def test_fork_inside_first_shared_gives_the_child_ForkError_not_a_hang():
    # A hang would be the child's: its timeout is below the whole child's, to be reported.
    action = """
            from helpers.forking import raised_in_fork
            print("CHILD", raised_in_fork(lambda: cyctx.ContextGuard.shared(D1), timeout=30))
    """
    out = run_child(TRACE_INSIDE_SHARED.format(action=action.strip()), timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "CHILD ForkError" in out.stdout and "FIRED True SAME True" in out.stdout, out.stdout


def test_shared_reentered_from_python_code_inside_shared_does_not_deadlock(sim):
    action = """
            inner = cyctx.ContextGuard.shared(D1)
            print("INNER", inner.is_shared)
    """
    out = run_child(TRACE_INSIDE_SHARED.format(action=action.strip()) + """
    print("RETAINS", drivers.SIM.retain_count(1))
    """, timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "INNER True" in out.stdout and "FIRED True SAME True" in out.stdout
    assert "RETAINS 1" in out.stdout, "the loser of the race released its retain"


def test_shared_from_a_finalizer_during_shared(sim):
    # A __del__ that uses shared(), run by the garbage collector inside the first shared().
    out = run_child("""
        import gc, sys, cyctx
        got = []
        class Cyc:
            def __del__(self):
                got.append(cyctx.ContextGuard.shared(D1))
        def tracer(frame, event, arg):
            if event == "call" and frame.f_code.co_name == "add" and "weakref" in frame.f_code.co_filename and not got:
                sys.settrace(None)
                c = Cyc(); c.me = c; del c
                gc.collect()
            return None
        sys.settrace(tracer)
        g = cyctx.ContextGuard.shared(D1)
        sys.settrace(None)
        print("OK", got[0] is g, drivers.SIM.retain_count(1))
    """, timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "OK True 1" in out.stdout


def test_thread_stalled_inside_the_first_shared_does_not_block_others(sim):
    # A thread that stops inside the first shared() (here: forever, as a daemon thread frozen
    # at interpreter shutdown would) must not hold the registry lock, or every other caller hangs.
    out = run_child("""
        import sys, threading, time, cyctx
        inside = threading.Event()
        def tracer(frame, event, arg):
            if event == "call" and frame.f_code.co_name == "add" and "weakref" in frame.f_code.co_filename:
                sys.settrace(None)
                inside.set()
                time.sleep(3600)
            return None
        def stall():
            sys.settrace(tracer)
            cyctx.ContextGuard.shared(D1)
        threading.Thread(target=stall, daemon=True).start()
        inside.wait(30)
        g = cyctx.ContextGuard.shared(D1)
        with g:
            print("MAIN", drivers.current() == g.handle, g.is_shared)
        import os
        os._exit(0)  # the stalled daemon thread never finishes
    """, timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "MAIN True True" in out.stdout


def test_shared_first_use_raced_by_many_threads(sim):
    out = run_child("""
        import threading, cyctx
        from helpers.threads import run_threads
        for k in (0, 1):
            got = []
            b = threading.Barrier(16)
            def f():
                b.wait(); got.append(cyctx.ContextGuard.shared(k))
            run_threads(*[f] * 16)
            assert len(got) == 16 and all(g is got[0] for g in got) and got[0].is_shared
        print("RETAINS", [drivers.SIM.retain_count(i) for i in range(2)])
    """, timeout=60)
    assert "RETAINS [1, 1]" in out.stdout


# --- per-thread entries: never keyed by a reusable address --------------------------------

def test_guard_freed_while_entered_is_not_matched_by_a_new_guard_at_its_address():
    # In a child, on its main thread: the dead guard's entry stays there (orphaned).
    out = run_child("""
        import gc, cyctx
        from cyctx import ContextGuard, GuardError
        base = drivers.SIM.retain_count(0) if drivers.SIM else None
        a = ContextGuard(0)
        a.__enter__()
        addr = id(a)
        del a  # freed while entered
        gc.collect()
        kept = [ContextGuard(0) for _ in range(3000)]
        b = next((x for x in kept if id(x) == addr), None)
        for k in kept:
            if k is not b:
                k.close()
        print("REUSED", b is not None)
        if b is not None:
            # Before: b matched a's entry: exit without enter "succeeded", close() was refused.
            try:
                b.__exit__(None, None, None)
                print("EXIT accepted")
            except GuardError as e:
                print("EXIT refused", "without a matching enter" in str(e))
            b.close()
            print("CLOSED", b.closed)
        if drivers.SIM:
            print("RETAINS", drivers.SIM.retain_count(0) - base)
    """)
    assert "REUSED True" in out.stdout, "the allocator did not reuse the address: test proves nothing"
    assert "EXIT refused True" in out.stdout and "CLOSED True" in out.stdout, out.stdout
    assert "RETAINS" not in out.stdout or "RETAINS 0" in out.stdout


def test_orphaned_entry_does_not_block_the_outer_guard(sim):
    base = [sim.retain_count(i) for i in range(2)]

    def body():
        outer = ContextGuard(D1)
        outer.__enter__()
        inner = ContextGuard(0)
        inner.__enter__()
        del inner
        gc.collect()
        # The outer guard's exit meets the dead guard's entry on top: it is dropped (it can
        # never be left), reported, and the outer exit restores what was current before it.
        with pytest.warns(ResourceWarning, match="freed while entered"):
            outer.__exit__(None, None, None)
        assert _open_entries() == 0 and current() == 0
        outer.close()

    in_thread(body)
    assert [sim.retain_count(i) for i in range(2)] == base


def test_orphaned_entry_dropped_by_an_exit_on_the_fast_path_warns_too(sim):
    # The outer guard's enter took the fast path (its context was current already), so its
    # exit would too; dropping the dead entry above it is reported all the same.
    d = driver()

    def body():
        outer = ContextGuard(0)
        ok(d.cuCtxPushCurrent(outer.context))
        outer.__enter__()
        inner = ContextGuard(D1)
        inner.__enter__()
        del inner
        gc.collect()
        with pytest.warns(ResourceWarning, match="dropped 1 open entry"):
            outer.__exit__(None, None, None)
        restored = (_open_entries(), current() == outer.handle, sim.stack_depth())
        ok(d.cuCtxPopCurrent())
        outer.close()
        return restored

    # No entry left; outer's context current on the one-entry stack, as before its enter.
    assert in_thread(body) == (0, True, 1)


# --- generators and coroutines -----------------------------------------------------------

def test_generator_abandoned_inside_a_guard_collected_under_another_guard(sim):
    base = [sim.retain_count(i) for i in range(2)]

    def body():
        g0, g1 = ContextGuard(0), ContextGuard(D1)

        it = suspended_in(g0)
        g1.__enter__()
        holder = [it]
        del it
        seen = collect_unraisable(holder.clear)  # the last reference: the finalizer runs
        # The late exit is reported (not swallowed with the GeneratorExit) ...
        assert len(seen) == 1 and isinstance(seen[0].exc_value, GuardError), seen
        assert "generator" in str(seen[0].exc_value)
        # ... its entry is gone, and the open guard still sees its own context current.
        assert _open_entries() == 1 and current() == g1.handle
        g1.__exit__(None, None, None)
        # Leaving g1 restores what was current before g0's block, not g0's context.
        assert current() == 0 and _open_entries() == 0
        g0.close()
        g1.close()

    in_thread(body)
    assert [sim.retain_count(i) for i in range(2)] == base


def test_late_exit_hands_its_restore_to_the_entry_just_above_it():
    # A generator's block of g0, then g1, then h (another guard of device 0); the generator is
    # closed late. Its restore (back to no context) goes to g1's entry, the one just above it,
    # not to the innermost: every block left afterwards restores what it should.
    def body():
        g0, g1, h = ContextGuard(0), ContextGuard(D1), ContextGuard(0)
        seen = []
        it = suspended_in(g0)
        with g1:
            with h:
                with pytest.raises(GuardError, match="generator"):
                    it.close()
                seen.append(current() == h.handle)
            seen.append(current() == g1.handle)  # leaving h: back to g1
        seen.append(current() == 0)  # leaving g1: what was before the generator's block
        for g in (g0, g1, h):
            g.close()
        return seen, _open_entries()

    assert in_thread(body) == ([True, True, True], 0)


def test_late_exit_spliced_into_a_fast_path_entry_keeps_the_leaked_push_check(sim):
    # The generator's block pushed onto an empty stack; the block above it (another guard of
    # the same context) entered on the fast path. Spliced, that block now owns the "pop back
    # to empty" restore, and with it the check for pushes its own body leaked.
    d = driver()

    def body():
        g0, g1, h = ContextGuard(0), ContextGuard(D1), ContextGuard(0)
        it = suspended_in(g0)
        with pytest.raises(GuardError, match="pushed 1 context"):
            with h:
                with pytest.raises(GuardError, match="generator"):
                    it.close()
                ok(d.cuCtxPushCurrent(g1.context))
        state = (current(), sim.stack_depth(), _open_entries())
        for g in (g0, g1, h):
            g.close()
        return state

    assert in_thread(body) == (0, 0, 0)


def test_generator_closed_explicitly_under_another_guard_raises_on_close():
    def body():
        g0, g1 = ContextGuard(0), ContextGuard(D1)

        it = suspended_in(g0)
        with g1:
            with pytest.raises(GuardError, match="generator"):
                it.close()
            assert current() == g1.handle
        assert current() == 0
        g0.close()
        g1.close()
        return _open_entries()

    assert in_thread(body) == 0


def test_generator_closed_on_another_thread_raises_and_keeps_the_entering_threads_entry():
    # Documented limit: the guard cannot reach another thread's entries. The close is not
    # silent: a GuardError raised while GeneratorExit propagates must not end up as a mere note
    # on the GeneratorExit, where it is lost.
    g0 = ContextGuard(0)

    def gen():
        with g0:
            yield

    it = gen()

    def body():
        next(it)
        with pytest.raises(GuardError, match="without a matching enter"):
            in_thread(it.close)
        left = _open_entries()
        g0.__exit__(None, None, None)  # the entering thread leaves its entry itself
        return left, current()

    left, cur = in_thread(body)
    assert left == 1 and cur == 0
    g0.close()


def test_generator_finalized_in_order_is_quiet():
    def body():
        g0 = ContextGuard(0)

        holder = [suspended_in(g0)]
        seen = collect_unraisable(holder.clear)
        assert seen == [] and current() == 0
        g0.close()

    in_thread(body)


def test_coroutine_holding_a_guard_across_await_interleaved():
    import asyncio

    def body():
        g0, g1 = ContextGuard(0), ContextGuard(D1)
        errors = []

        async def hold(g, ev_in, ev_out):
            try:
                with g:
                    ev_in.set()
                    await ev_out.wait()
            except GuardError as e:
                errors.append(e)

        async def main():
            a_in, a_out, b_in, b_out = (asyncio.Event() for _ in range(4))
            ta = asyncio.ensure_future(hold(g0, a_in, a_out))
            await a_in.wait()
            tb = asyncio.ensure_future(hold(g1, b_in, b_out))
            await b_in.wait()
            a_out.set()  # a leaves while b is open: out of order
            await ta
            b_out.set()
            await tb

        asyncio.run(main())
        left = _open_entries()
        # a's refused exit left its entry; leave it in order now
        g0.__exit__(None, None, None)
        g0.close()
        g1.close()
        return len(errors), left, current()

    n, left, cur = in_thread(body)
    assert n == 1 and left == 1 and cur == 0


# --- close() racing the reset re-activation -----------------------------------------------

def test_close_during_reset_reactivation_does_not_reopen_or_steal_a_retain(sim):
    # The re-activation warns (Python code runs: a showwarning hook here, another thread in
    # real life) before it retains; a close() at that moment must not be undone: a guard
    # re-opened without a retain of its own would release another guard's at its next close.
    base = sim.retain_count(0)

    def body():
        other = ContextGuard(0)  # another guard's retain that must survive
        g = ContextGuard(0)
        reset_primary(0)
        closed_in_hook = []

        def hook(*a, **k):
            g.close()
            closed_in_hook.append(g.closed)

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            old = warnings.showwarning
            warnings.showwarning = hook
            try:
                with pytest.raises(GuardError, match="closed"):
                    g.__enter__()
            finally:
                warnings.showwarning = old
        assert closed_in_hook == [True]
        assert g.closed, "close() was undone by the re-activation"
        assert current() == 0
        assert sim.retain_count(0) == base + 1, "other's retain only"
        g.close()
        assert sim.retain_count(0) == base + 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ContextResetWarning)
            with other:
                assert current() == other.handle
        other.close()

    in_thread(body)
    assert sim.retain_count(0) == base


def test_reset_again_while_the_reactivation_warns_is_acted_on(sim):
    # The context was reset and re-activated by someone else (the enter sees a new id, so it
    # would only record it); during the warning it is reset once more. The enter must act on
    # the driver's state after the warning, not before: the context is usable inside.
    d = driver()
    base = sim.retain_count(0)

    def body():
        g = ContextGuard(0)
        dev = ok(d.cuDeviceGet(0))
        reset_primary(0)
        ok(d.cuDevicePrimaryCtxRetain(dev))  # someone re-activates it

        def hook(*a, **k):
            ok(d.cuDevicePrimaryCtxRelease(dev))
            reset_primary(0)  # ... and resets it again while cyctx warns

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            old, warnings.showwarning = warnings.showwarning, hook
            try:
                with g:
                    err, _ = d.cuCtxGetApiVersion(None)
                    usable = err == d.CUresult.CUDA_SUCCESS
            finally:
                warnings.showwarning = old
        assert usable, "an inactive primary context was made current inside the guard"
        assert sim.retain_count(0) == base + 1
        g.close()
        return current()

    assert in_thread(body) == 0
    assert sim.retain_count(0) == base


def test_close_from_two_threads_releases_once(sim):
    base = sim.retain_count(0)
    keep = ContextGuard(0)
    for _ in range(200):
        g = ContextGuard(0)
        b = threading.Barrier(4)

        def f():
            b.wait()
            g.close()

        run_threads(*[f] * 4)
        assert g.closed and sim.retain_count(0) == base + 1
    keep.close()
    assert sim.retain_count(0) == base


# --- construction from a context: the device probe under faults --------------------------

def test_probe_pop_failure_leaves_the_stack_as_it_was(sim):
    def body():
        ctx = create_context(current=False)
        depth = sim.stack_depth()
        sim.inject_fault("cuCtxPopCurrent", 999)
        try:
            with pytest.raises(DriverError):
                ContextGuard(ctx)
        finally:
            sim.clear_faults()
        # Before: the probe's push stayed on the stack.
        assert sim.stack_depth() == depth and current() == 0
        ok(driver().cuCtxDestroy(ctx))

    in_thread(body)


def test_probe_release_failure_leaks_no_retain(sim):
    base = sim.retain_count(0)

    def body():
        holder = ContextGuard(0)  # primary active: the probe retains it to compare handles
        ctx = create_context(current=False)
        sim.inject_fault("cuDevicePrimaryCtxRelease", 999)
        try:
            try:
                g = ContextGuard(ctx)
            except DriverError:
                g = None
        finally:
            sim.clear_faults()
        if g is not None:
            assert not g.is_primary
            g.close()
        # Before: the probe's retain was never released.
        assert sim.retain_count(0) == base + 1
        holder.close()
        ok(driver().cuCtxDestroy(ctx))

    in_thread(body)
    assert sim.retain_count(0) == base


# --- messages that say what happened --------------------------------------------------------

def test_unwind_cap_says_what_was_left(sim):
    def body():
        g = ContextGuard(0)
        d = driver()
        with pytest.raises(GuardError) as ei:
            with g:
                for _ in range(4096 + 5):
                    ok(d.cuCtxPushCurrent(g.context))
        msg = str(ei.value)
        left = sim.stack_depth()
        while current():
            ok(d.cuCtxPopCurrent())
        g.close()
        return msg, left

    msg, left = in_thread(body)
    assert left > 0
    assert "4096" in msg and "still" in msg and "were popped to restore" not in msg, msg


def test_unwind_cap_boundary_pops_them_all(sim):
    # Exactly the cap's number of leaked pushes: all popped, and the error says so.
    def body():
        g = ContextGuard(0)
        d = driver()
        with pytest.raises(GuardError) as ei:
            with g:
                for _ in range(4096):
                    ok(d.cuCtxPushCurrent(g.context))
        state = (str(ei.value), sim.stack_depth(), current())
        g.close()
        return state

    msg, depth, cur = in_thread(body)
    assert depth == 0 and cur == 0
    assert "pushed 4096 context(s)" in msg and "were popped to restore" in msg, msg


def test_current_handle_before_cuInit_is_zero_not_an_error():
    # Found by the adversarial pass: a thread calling current_handle() while another thread
    # constructs the first guard got NotInitializedError or 0 depending on timing.
    out = run_child("""
        import cyctx
        from helpers.forking import raised_in_fork
        print("FIRST", cyctx.current_handle())
        g = cyctx.ContextGuard(0)
        with g:
            print("INSIDE", cyctx.current_handle() == g.handle)
        print("CHILD", raised_in_fork(cyctx.current_handle))
        g.close()
    """, init=False)
    assert "FIRST 0" in out.stdout and "INSIDE True" in out.stdout and "CHILD ForkError" in out.stdout, out.stdout


def test_driver_error_blames_fork_only_in_a_forked_process():
    assert "fork" not in str(cyctx.DriverError(3)).lower()
    out = run_child("""
        import cyctx
        from helpers.forking import run_forked
        print("CHILD", run_forked(lambda: "fork" in str(cyctx.DriverError(3)).lower()))
    """, init=False)
    assert "CHILD True" in out.stdout


# --- on the real driver only ---------------------------------------------------------------
# The simulated driver models these; the H200 has the last word (tests/sim/differential/).

@pytest.mark.gpu
def test_real_enter_after_the_owner_destroyed_a_created_context():
    # cuCtxGetId with the handle of a destroyed created context: a typed error, not a crash
    # (docs/evidence.md, "A dead context answers 201 through its handle and 709 through NULL").
    out = run_child("""
        import cyctx
        d = drivers.driver()
        ctx = drivers.create_context(0)
        drivers.ok(d.cuCtxPopCurrent())
        g = cyctx.ContextGuard(ctx)
        drivers.ok(d.cuCtxDestroy(ctx))
        try:
            g.__enter__()
            print("ENTERED")
        except cyctx.DriverError as e:
            print("ERROR", e.code)
        print("CURRENT", drivers.current())
        g.close()
    """, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ERROR" in out.stdout and "CURRENT 0" in out.stdout, out.stdout


@pytest.mark.gpu
def test_real_construct_from_contexts_keeps_the_stack():
    # The device probe pushes and pops (or, when the context is current, does neither): count
    # the stack by popping it empty afterwards.
    out = run_child("""
        import cyctx
        d = drivers.driver()
        holder = cyctx.ContextGuard(0)
        ctx = drivers.create_context(0)                  # pushed: depth 1
        drivers.ok(d.cuCtxPushCurrent(holder.context))   # depth 2, primary on top
        a = cyctx.ContextGuard(ctx)                   # probe push/pop
        b = cyctx.ContextGuard(holder.context)        # current: no push
        c = cyctx.ContextGuard.from_handle(int(ctx))
        print("TOP", drivers.current() == holder.handle, "PRIMARY", a.is_primary, b.is_primary, c.is_primary)
        n = 0
        while drivers.current():
            drivers.ok(d.cuCtxPopCurrent()); n += 1
        print("DEPTH", n)
        for g in (a, b, c, holder):
            g.close()
        drivers.ok(d.cuCtxDestroy(ctx))
    """, timeout=120)
    assert "TOP True PRIMARY False True False" in out.stdout and "DEPTH 2" in out.stdout, out.stdout


@pytest.mark.gpu
def test_real_generator_late_exit_and_orphan_drop():
    out = run_child("""
        import gc, sys, warnings, cyctx
        from cyctx._guard import _open_entries
        n = drivers.device_count()
        g0, g1 = cyctx.ContextGuard(0), cyctx.ContextGuard(1 % n)
        def gen():
            with g0:
                yield
        it = gen(); next(it)
        seen = []
        sys.unraisablehook = seen.append
        with g1:
            h = [it]; del it; h.clear(); gc.collect()
            cyctx.ContextGuard(0).__enter__(); gc.collect()   # an orphan above g1's entry
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                pass
        print("SEEN", len(seen), type(seen[0].exc_value).__name__)
        print("STATE", drivers.current(), _open_entries())
        g0.close(); g1.close()
    """, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "SEEN 1 GuardError" in out.stdout and "STATE 0 0" in out.stdout, out.stdout
