"""The forms users bring from other libraries: cyctx.device(k), decorators, shared() of a
framework's device, pickling, constructor arguments, current_device(), and the ResourceWarning
of a collected guard. Shared guards live for the process: made in children."""

import asyncio
import copy
import gc
import json
import pickle
import sys
import warnings

import pytest
from helpers import drivers
from helpers.children import run_child
from helpers.drivers import retains_unchanged, second_device
from helpers.fakes import fake

import cyctx
from cyctx import ContextGuard

D1 = second_device()

# --- cyctx.device(k) -------------------------------------------------------------------------


def test_device_is_the_shared_guard_for_every_device_spelling():
    out = run_child("""
        import json, cyctx
        from cyctx import ContextGuard
        from cuda.bindings import driver as d
        from helpers.fakes import fake
        spellings = [D1, fake("torch", "device", type="cuda", index=D1),
                     fake("cupy.cuda.device", "Device", id=D1),
                     fake("cuda.core.experimental._device", "Device", device_id=D1),
                     d.CUdevice(D1)]
        zero = cyctx.device(0)  # another device's shared guard exists: never confused
        with zero:  # and is used (published to the fast array)
            pass
        shared = ContextGuard.shared(D1)
        got = [cyctx.device(s) is shared for s in spellings]
        got += [cyctx.device(0) is zero is ContextGuard.shared(0)]
        got += [ContextGuard.shared(s) is shared for s in spellings]
        with cyctx.device(D1):
            inside = cyctx.current_device()
        print(json.dumps({"same": got, "inside": inside, "after": cyctx.current_device(),
                          "retains": drivers.retains(), "shared": shared.is_shared}))
    """)
    res = json.loads(out.stdout.splitlines()[-1])
    assert res["same"] == [True] * 11
    assert res["inside"] == D1 and res["after"] is None and res["shared"]
    if res["retains"] is not None:  # one retain per device, its shared guard's
        assert res["retains"] == [1, 1]


def test_device_keeps_the_primary_context_between_blocks(sim):
    # The trap `with ContextGuard(0):` falls into (each block destroys and re-creates the
    # primary context) is what cyctx.device(0) avoids.
    out = run_child("""
        import cyctx
        for _ in range(5):
            with cyctx.device(0):
                pass
        print(drivers.SIM.call_count("cuDevicePrimaryCtxRetain"), drivers.SIM.primary_active(0))
    """)
    assert out.stdout.split()[-2:] == ["1", "True"]


@pytest.mark.parametrize(
    "bad, error",
    [("0", TypeError), (None, TypeError), (1.5, TypeError), (True, TypeError), (-1, ValueError)],
)
def test_device_refuses_what_is_no_device(bad, error):
    with retains_unchanged():
        with pytest.raises(error):
            cyctx.device(bad)


# --- shared() refuses contexts and streams ------------------------------------------------


def _refused_by_shared():
    from cuda.bindings import driver as d

    return [
        ("context", d.CUcontext(0x1000)),
        ("stream", d.CUstream(0x1000)),
        ("green context", d.CUgreenCtx(0x1000)),
        (
            "stream",
            fake(
                "torch.cuda.streams",
                "Stream",
                cuda_stream=0x1000,
                device=fake("torch", "device", type="cuda", index=0),
            ),
        ),
        ("stream", fake("cupy.cuda.stream", "Stream", ptr=0, device_id=0)),  # a default stream
        ("context", fake("cuda.core.experimental._context", "Context", handle=0x1000)),
    ]


@pytest.mark.parametrize("i", range(6))
@pytest.mark.parametrize("entry", ["ContextGuard.shared", "cyctx.device"])
def test_shared_refuses_a_context_or_stream_saying_why(entry, i):
    entry = ContextGuard.shared if entry == "ContextGuard.shared" else cyctx.device
    what, obj = _refused_by_shared()[i]
    with retains_unchanged():
        with pytest.raises(TypeError) as ei:
            entry(obj)
    msg = str(ei.value)
    assert f"got a {what}" in msg and "primary context" in msg and "ContextGuard(it)" in msg


# --- the decorator ------------------------------------------------------------------------------


def test_guard_decorates_each_call(guard):
    seen = []

    @guard
    def work(x, *, y):
        """Doc."""
        seen.append(cyctx.current_handle())
        if x == "raise":
            raise KeyError(y)
        return x + y

    assert work.__name__ == "work" and work.__doc__ == "Doc." and work.__wrapped__ is not None
    assert cyctx.current_handle() == 0
    assert work(1, y=2) == 3
    with pytest.raises(KeyError):
        work("raise", y=5)
    assert seen == [guard.handle] * 2 and cyctx.current_handle() == 0
    with guard:  # nested in an open block of the same guard: restores to it
        assert work(2, y=2) == 4 and cyctx.current_handle() == guard.handle


def test_decorated_function_keeps_its_guard_alive(sim):
    before = drivers.retains()[0]  # less the process's retain of collected guards
    f = ContextGuard(0)(lambda: cyctx.current_device())
    gc.collect()
    assert drivers.retains()[0] == before + 1 and f() == 0  # the guard lives as long as f
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        del f
        gc.collect()
    assert drivers.retains()[0] == before
    assert [x.category for x in w] == [ResourceWarning]


def test_device_used_as_a_bare_decorator_says_to_call_it():
    def work():
        pass

    with retains_unchanged():
        with pytest.raises(TypeError, match=r"@cyctx.device\(0\)"):
            cyctx.device(work)


def test_decorator_refuses_what_is_not_callable(guard):
    with pytest.raises(TypeError, match="decorates a function"):
        guard(3)


def test_with_inside_async_tasks_interleaving(guard, guard1):
    # What the refusal sends users to: `with guard:` inside the coroutine, around the driver
    # work between awaits. Tasks interleave on one thread; each finds its device current.
    async def task(g):
        seen = []
        for _ in range(3):
            with g:
                seen.append(cyctx.current_handle() == g.handle)
            await asyncio.sleep(0)
            seen.append(cyctx.current_handle())
        return seen

    async def main():
        return await asyncio.gather(task(guard), task(guard1))

    assert asyncio.run(main()) == [[True, 0] * 3] * 2 and cyctx.current_handle() == 0


def test_device_decorator_from_16_threads():
    out = run_child("""
        import json, threading, cyctx
        from helpers.threads import run_threads
        @cyctx.device(D1)
        def work(i):
            return cyctx.current_device(), i
        got = run_threads(*[lambda i=i: [work(i) for _ in range(50)] for i in range(16)])
        print(json.dumps({"ok": all(r == [(D1, i)] * 50 for i, r in enumerate(got)),
                          "after": cyctx.current_device(), "retains": drivers.retains()}))
    """)
    res = json.loads(out.stdout.splitlines()[-1])
    assert res["ok"] and res["after"] is None
    if res["retains"] is not None:
        assert sum(res["retains"]) == 1


# --- constructor arguments -----------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kwargs, words",
    [
        ((), {}, "missing 1 required argument: 'device'"),
        ((0, 1), {}, "takes 1 argument (device) but 2 were given"),
        ((0,), {"flags": 1}, "unexpected keyword argument 'flags'"),
        ((), {"device": 0, "x": 1}, "unexpected keyword argument 'x'"),
        ((0,), {"device": 0}, "multiple values for argument 'device'"),
    ],
)
def test_constructor_arguments_are_named(args, kwargs, words):
    with retains_unchanged():
        with pytest.raises(TypeError) as ei:
            ContextGuard(*args, **kwargs)
    assert words in str(ei.value) and "__cinit__" not in str(ei.value)
    assert str(ei.value).startswith("ContextGuard()")


def test_device_keyword_and_a_subclass_with_its_own_arguments():
    class Named(ContextGuard):
        def __init__(self, device, name):
            self.name = name

    with retains_unchanged():
        g = ContextGuard(device=0)
        n = Named(0, "nvtx")
        m = Named(device=0, name="kw")
        assert g.device == n.device == m.device == 0 and (n.name, m.name) == ("nvtx", "kw")
        with pytest.raises(TypeError, match=r"Named\(\) missing 1 required argument: 'device'"):
            Named()
        for x in (g, n, m):
            x.close()


# --- pickling and copying ------------------------------------------------------------------


def test_a_guard_of_its_own_does_not_travel_and_says_what_to_do(guard):
    # A copy would be a second owner of one retain (a double release at close).
    with retains_unchanged():
        _refuse_to_travel(guard)
    assert not guard.closed


def _refuse_to_travel(guard):
    for act, word in [
        (pickle.dumps, "pickle"),
        (lambda g: pickle.dumps(g, protocol=0), "pickle"),
        (copy.copy, "copy"),
        (copy.deepcopy, "copy"),
        (lambda g: copy.deepcopy({"g": [g]}), "copy"),
    ]:
        with pytest.raises(TypeError) as ei:
            act(guard)
        msg = str(ei.value)
        assert msg.startswith(f"cannot {word} <cyctx.ContextGuard device=0")
        assert "cyctx.device(0)" in msg and "non-trivial __cinit__" not in msg


def test_shared_guard_copies_as_itself_and_pickles_as_the_shared_guard():
    out = run_child("""
        import copy, pickle, cyctx
        g = cyctx.device(D1)
        nested = copy.deepcopy({"a": [g]})
        back = pickle.loads(pickle.dumps(g))
        print(copy.copy(g) is g, copy.deepcopy(g) is g, nested["a"][0] is g, back is g,
              pickle.loads(pickle.dumps([g, g], protocol=0))[1] is g)
    """)
    assert out.stdout.split() == ["True"] * 5


def test_shared_guard_travels_to_a_spawned_process():
    # The receiving process gets ITS shared guard of the same device (its own retain), made on
    # unpickling; the spawned worker runs on this test's driver (helpers.travel.select_driver).
    out = run_child("""
        import json, multiprocessing, os, cyctx
        from helpers import travel
        mp = multiprocessing.get_context("spawn")
        with mp.Pool(1, initializer=travel.select_driver,
                     initargs=(os.environ["CYCTX_TEST_DRIVER"],)) as pool:
            res = pool.apply(travel.inside, (cyctx.device(D1),))
        print(json.dumps({**res, "parent": os.getpid(), "D1": D1}))
    """)
    res = json.loads(out.stdout.splitlines()[-1])
    assert res["pid"] != res["parent"]
    assert res["shared"] and res["same"] and res["device"] == res["inside"] == res["D1"]
    assert res["after"] is None


def test_a_closure_over_a_guard_pickles_by_reference_to_the_shared_guard():
    # What Dask does with a task: the guard inside a closure's cell travels as the shared guard
    # (cloudpickle when present, else a plain pickle of a partial).
    out = run_child("""
        import functools, pickle, cyctx
        from helpers import travel
        task = functools.partial(travel.inside, cyctx.device(0))
        again = pickle.loads(pickle.dumps(task))
        print(again.args[0] is cyctx.device(0), again()["inside"])
    """)
    assert out.stdout.split() == ["True", "0"]


# --- current_device() ---------------------------------------------------------------------


def test_current_device_neither_initialises_nor_creates(sim):
    out = run_child(
        """
        import json, cyctx
        before = cyctx.current_device()
        sim = drivers.SIM
        calls = {f: sim.call_count(f) for f in
                 ("cuInit", "cuDevicePrimaryCtxRetain", "cuCtxCreate", "cuDeviceGet",
                  "cuCtxGetCurrent")}
        print(json.dumps({"before": before, "calls": calls, "depth": sim.stack_depth()}))
        """,
        init=False,
    )
    res = json.loads(out.stdout.splitlines()[-1])
    assert res["before"] is None and res["depth"] == 0
    # One cuCtxGetCurrent (answered CUDA_ERROR_NOT_INITIALIZED), nothing else.
    assert res["calls"] == {**dict.fromkeys(res["calls"], 0), "cuCtxGetCurrent": 1}


def test_current_device_follows_the_current_context(guard, guard1):
    from helpers import drivers

    assert cyctx.current_device() is None
    with guard:
        assert cyctx.current_device() == 0
        with guard1:
            assert cyctx.current_device() == 1
        assert cyctx.current_device() == 0
    assert cyctx.current_device() is None
    ctx = drivers.create_context(1)  # a context the caller made, current on this thread
    try:
        assert cyctx.current_device() == 1
    finally:
        d = drivers.driver()
        drivers.ok(d.cuCtxPopCurrent())
        drivers.ok(d.cuCtxDestroy(ctx))
    assert cyctx.current_device() is None


# --- ResourceWarning for a guard the garbage collector releases ----------------------------


def _collected(make):
    """The warnings of making a guard with `make` and letting it go."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        make()
        gc.collect()
    return [x for x in w if x.category is ResourceWarning]


def test_temporary_guard_warns_that_the_process_keeps_the_primary_context(sim):
    # Whoever held device 1's context before (nobody, or the shared guard), it stays active.
    def temporary():
        with ContextGuard(1):
            pass

    w = _collected(temporary)
    assert sim.primary_active(1)
    assert len(w) == 1
    msg = str(w[0].message)
    assert "device 1's primary context and what was made in it stay" in msg
    assert "destroyed" not in msg and "cyctx.device(1)" in msg and "close()" in msg
    assert w[0].filename == __file__  # pointed at the user's code


def test_collected_guard_says_the_same_when_something_else_holds_the_context(guard1):
    w = _collected(lambda: ContextGuard(1))
    assert len(w) == 1 and "primary context and what was made in it stay" in str(w[0].message)
    assert "destroyed" not in str(w[0].message)


def test_closed_guard_does_not_warn():
    def closed():
        g = ContextGuard(0)
        with g:
            pass
        g.close()

    with retains_unchanged():
        assert _collected(closed) == []


def test_guard_of_a_callers_context_does_not_warn():
    from helpers import drivers

    ctx = drivers.create_context(0, current=False)
    try:
        assert _collected(lambda: ContextGuard(drivers.driver().CUcontext(int(ctx)))) == []
    finally:
        drivers.ok(drivers.driver().cuCtxDestroy(ctx))


def test_warning_under_error_filter_is_unraisable_and_the_retain_is_released(sim):
    # -W error::ResourceWarning (the suite's own setting): raised from the deallocation, so it
    # reaches sys.unraisablehook (pytest reports it there); the release happened all the same.
    seen = []
    old = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        with retains_unchanged(), warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            g = ContextGuard(1)
            del g
            gc.collect()
    finally:
        sys.unraisablehook = old
    assert len(seen) == 1 and isinstance(seen[0].exc_value, ResourceWarning)


@pytest.mark.parametrize("filt", ["error", "error::ResourceWarning"])
def test_pytest_run_sees_a_test_that_leaks_a_guard(tmp_path, filt):
    (tmp_path / "test_leak.py").write_text(
        "import cyctx\n"
        "def test_leak():\n"
        "    with cyctx.ContextGuard(0):\n"
        "        pass\n"
        "def test_shared():\n"
        "    with cyctx.device(0):\n"
        "        pass\n"
    )
    out = run_child(
        f"""
        import pytest, sys
        # Other plugins of the environment stay out (pytest-benchmark warns when it thinks
        # xdist runs, an internal error under -W error): only the leak is this run's subject.
        sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:benchmark", "-W", {filt!r},
                              "-W", "ignore::pytest.PytestAssertRewriteWarning",
                              "--rootdir", {str(tmp_path)!r}, {str(tmp_path / "test_leak.py")!r}]))
        """,
        check=False,
    )
    # Both ways the leak is seen; under the suite's "error" the leaking test fails.
    assert "garbage collection" in out.stdout and "device 0's primary context and" in out.stdout
    if filt == "error":
        assert out.returncode == 1, out.stdout + out.stderr
        assert "1 failed, 1 passed" in out.stdout and "FAILED" in out.stdout
    else:
        assert out.returncode == 0 and "PytestUnraisableExceptionWarning" in out.stdout


def test_no_warning_for_shared_guards_or_at_interpreter_shutdown():
    # A guard still referenced when the interpreter exits (a module global, a cycle) is freed
    # during finalization: no Python call, so no warning, whatever the filters (the child
    # shows every ResourceWarning, were one warned).
    shown = {"PYTHONWARNINGS": "always::ResourceWarning"}
    out = run_child(
        """
        import cyctx, threading
        kept = cyctx.ContextGuard(0)
        cycle = [cyctx.ContextGuard(D1)]
        cycle.append(cycle)
        shared = cyctx.device(0)
        local = threading.local()
        local.g = cyctx.ContextGuard(0)
        class Holder:  # drops its guard from Python code run during finalization
            def __init__(self):
                self.g = cyctx.ContextGuard(D1)
            def __del__(self):
                self.g = None
        holder = Holder()
        print("END")
    """,
        env=shown,
    )
    assert out.stdout.strip().endswith("END")
    assert "ResourceWarning" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr
    # A thread's own guard, freed as the thread exits: test_natural.py's thread-exit case.
    out = run_child("""
        import warnings, cyctx
        warnings.simplefilter("error")
        for _ in range(3):
            with cyctx.device(0):
                pass
        print("OK")
    """)
    assert out.stdout.split() == ["OK"] and out.stderr == ""


@pytest.mark.gpu
def test_gpu_temporary_guard_leaves_the_primary_context_alive():
    # On a GPU, in a fresh process: nothing else holds device 0's primary context; the
    # collected temporary hands its retain to the process, so the context stays active (the
    # driver's own state says so) and the warning does not claim it was destroyed.
    out = run_child("""
        import gc, warnings, cyctx
        from cuda.bindings import driver as d
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with cyctx.ContextGuard(0):
                pass
            gc.collect()
        err, flags, active = d.cuDevicePrimaryCtxGetState(d.CUdevice(0))
        print(len(w), "destroyed" in str(w[0].message), active)
    """)
    assert out.stdout.split() == ["1", "False", "1"]


@pytest.mark.gpu
def test_gpu_device_in_a_fresh_process_beside_torch_and_cupy():
    # Each framework's device names the one shared guard; inside it the framework's own
    # current device and context are the guard's; torch and CuPy work inside and after.
    pytest.importorskip("torch")
    pytest.importorskip("cupy")
    out = run_child("""
        import json, warnings
        warnings.simplefilter("error")
        import torch, cupy, cyctx
        from cuda.bindings import driver as d
        g = cyctx.device(0)
        same = [cyctx.device(x) is g for x in (torch.device("cuda", 0), cupy.cuda.Device(0))]
        with cyctx.device(0):
            t = torch.ones(1024, device="cuda:0") * 2
            c = cupy.arange(1024) * 2
            inside = {"device": cyctx.current_device(),
                      "handle": cyctx.current_handle() == g.handle,
                      "torch": float(t.sum()), "cupy": int(c.sum())}
        after = {"device": cyctx.current_device(), "torch": float((t * 2).sum())}
        print(json.dumps({"same": same, "inside": inside, "after": after}))
    """)
    res = json.loads(out.stdout.splitlines()[-1])
    assert res["same"] == [True, True]
    assert res["inside"] == {"device": 0, "handle": True, "torch": 2048.0, "cupy": 1047552}
    assert res["after"]["torch"] == 4096.0
