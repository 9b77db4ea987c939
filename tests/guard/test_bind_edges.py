"""cyctx.bind as users compose it: spawn pools, methods, refusing what runs in steps as the
decorator does, contexts the caller made. Each case that binds a device runs in a child."""

import json
import os
import sys
import textwrap

import pytest
from helpers.children import TESTS_DIR, run_child, run_python
from helpers.drivers import second_device
from helpers.stepwise import HIDDEN

import cyctx

# The script a user writes: a decorated module-level function and a class with decorated
# methods, sent to spawn pools. The workers run on this test's driver (the initializer selects
# it, after the worker imported this script as __mp_main__: the decorators at its import must
# ask nothing of a driver).
SPAWN_SCRIPT = """
import concurrent.futures as cf, json, multiprocessing as mp, os, sys
import cyctx
from helpers import travel

@cyctx.bind(device=1)
def work(x):
    return [x, cyctx.current_device(), os.getpid()]

class Worker:
    def __init__(self, k):
        self.k = k

    @cyctx.bind(device=1)
    def run(self, x):
        return [self.k, x, cyctx.current_device(), os.getpid()]

if __name__ == "__main__":
    from helpers import drivers
    kind = drivers.select(os.environ["CYCTX_TEST_DRIVER"])
    spawn = mp.get_context("spawn")
    out = {"here": work(0)[:2], "method here": Worker(5).run(6)[:3]}
    with spawn.Pool(1, initializer=travel.select_driver, initargs=(kind,)) as pool:
        out["pool"] = pool.map(work, [1, 2])
        out["pool method"] = pool.apply(Worker(7).run, (8,))
    with cf.ProcessPoolExecutor(1, mp_context=spawn, initializer=travel.select_driver,
                                initargs=(kind,)) as ex:
        out["executor"] = list(ex.map(work, [3]))
        out["executor method"] = ex.submit(Worker(9).run, 10).result()
    out["pid"] = os.getpid()
    print(json.dumps(out))
"""


@pytest.mark.multigpu
def test_decorated_function_and_bound_method_travel_to_spawn_pools(tmp_path):
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(SPAWN_SCRIPT))
    env = {
        **os.environ,
        "PYTHONPATH": TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    me = out["pid"]
    assert out["here"] == [0, 1] and out["method here"] == [5, 6, 1]
    assert [r[:2] for r in out["pool"]] == [[1, 1], [2, 1]]
    assert out["pool method"][:3] == [7, 8, 1]
    assert [r[:2] for r in out["executor"]] == [[3, 1]]
    assert out["executor method"][:3] == [9, 10, 1]
    workers = {r[-1] for r in out["pool"] + out["executor"]}
    workers |= {out["pool method"][-1], out["executor method"][-1]}
    assert me not in workers and len(workers) == 2, "each ran in its pool's spawned worker"


def test_bind_on_methods_binds_self_with_staticmethod_and_classmethod_either_way():
    proc = run_child(
        """
        import json, pickle, cyctx
        from concurrent.futures import ThreadPoolExecutor

        class C:
            def __init__(self, k):
                self.k = k

            @cyctx.bind(device=D1)
            def plain(self, x):
                return [self.k, x, cyctx.current_device()]

            @cyctx.bind(device=D1)
            @staticmethod
            def s_inside(x):
                return [x, cyctx.current_device()]

            @staticmethod
            @cyctx.bind(device=D1)
            def s_outside(x):
                return [x, cyctx.current_device()]

            @cyctx.bind(device=D1)
            @classmethod
            def c_inside(cls, x):
                return [cls.__name__, x, cyctx.current_device()]

            @classmethod
            @cyctx.bind(device=D1)
            def c_outside(cls, x):
                return [cls.__name__, x, cyctx.current_device()]

        c = C(4)
        out = {
            "plain": c.plain(1),
            "plain via class": C.plain(c, 2),
            "s_inside": [C.s_inside(3), c.s_inside(3)],
            "s_outside": [C.s_outside(3), c.s_outside(3)],
            "c_inside": [C.c_inside(5), c.c_inside(5)],
            "c_outside": [C.c_outside(5), c.c_outside(5)],
            "name": c.plain.__name__,
            "after": cyctx.current_device(),
        }
        with ThreadPoolExecutor(1) as pool:
            out["worker"] = pool.submit(c.plain, 6).result()
            out["worker after"] = pool.submit(cyctx.current_device).result()
        back = pickle.loads(pickle.dumps(c.plain))
        out["pickled"] = back(7)
        print(json.dumps(out))
        """
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    d1 = out["plain"][2]
    assert out["plain"] == [4, 1, d1] and out["plain via class"] == [4, 2, d1]
    assert out["s_inside"] == out["s_outside"] == [[3, d1], [3, d1]]
    assert out["c_inside"] == out["c_outside"] == [["C", 5, d1], ["C", 5, d1]]
    assert out["name"] == "plain" and out["after"] is None
    assert out["worker"] == [4, 6, d1] and out["worker after"] is None
    assert out["pickled"] == [4, 7, d1]


@pytest.mark.parametrize("name", list(HIDDEN))
def test_bind_refuses_what_runs_in_steps_as_the_guard_decorator_does(name):
    # The guard's decorator and bind, each form, refuse with one rule and the same words (the
    # decorator's name apart), before anything is asked of the driver.
    fn = HIDDEN[name]
    g = cyctx.ContextGuard(0)
    try:
        with pytest.raises(TypeError) as by_guard:
            g(fn)
        with g:
            forms = {
                "bind(fn)": lambda: cyctx.bind(fn),
                "bind(fn, device=0)": lambda: cyctx.bind(fn, device=0),
                "@bind(device=0)": lambda: cyctx.bind(device=0)(fn),
            }
            for form, call in forms.items():
                with pytest.raises(TypeError) as by_bind:
                    call()
                assert type(by_bind.value) is type(by_guard.value)
                assert str(by_bind.value) == str(by_guard.value).replace(
                    " with a guard:", " with cyctx.bind:"
                ), form
    finally:
        g.close()
    assert "runs later, in steps" in str(by_guard.value)


def test_bind_of_a_created_context_takes_no_retain_of_the_primary(sim):
    # A context the caller made (cuCtxCreate) is bound as it is: the device's primary context
    # is neither retained nor activated, whether it was inactive or held by someone else.
    proc = run_child(
        """
        import json, cyctx
        from concurrent.futures import ThreadPoolExecutor
        from helpers.drivers import create_context, driver, ok

        sim, d = drivers.SIM, driver()
        def state(dev):
            return [sim.retain_count(dev), sim.primary_active(dev)]

        def where():
            return [cyctx.current_handle(), cyctx.current_device()]

        out = {}
        held = cyctx.ContextGuard(0)  # device 0's primary: active, one retain, held by it
        for dev in (0, 1):
            ctx = create_context(dev)  # pushed: current here
            before = state(dev)
            b = cyctx.bind(where)
            with ThreadPoolExecutor(1) as pool:
                ran = pool.submit(b).result()
            ran_here = b()
            ok(d.cuCtxPopCurrent())
            out[dev] = [before, state(dev), ran == [int(ctx), dev], ran_here == [int(ctx), dev],
                        repr(b)]
            del b
            ok(d.cuCtxDestroy(ctx))
            out[f"{dev} end"] = state(dev)
        held.close()
        print(json.dumps(out))
        """
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["0"][0] == out["0"][1] == [1, True], out
    assert out["1"][0] == out["1"][1] == [0, False], out
    for dev in ("0", "1"):
        assert out[dev][2:4] == [True, True], out
        assert "to context 0x" in out[dev][4]
    assert out["0 end"] == [1, True] and out["1 end"] == [0, False]


def test_bind_of_the_current_primary_binds_its_shared_guard(sim):
    proc = run_child(
        """
        import json, cyctx
        g = cyctx.ContextGuard(1)
        with g:
            b = cyctx.bind(lambda: cyctx.current_device())
        g.close()
        print(json.dumps([repr(b), b(), drivers.SIM.retain_count(1)]))
        """
    )
    shown, ran, retains = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "to device 1" in shown and ran == 1
    assert retains == 1, "the shared guard's retain, taken before the guard's own was released"


# A library whose functions are decorated at its import: importing it must ask nothing of the
# driver, so a forked child that calls them can still use CUDA.
MYLIB = """
import os
import cyctx

D1 = int(os.environ["CYCTX_TEST_D1"])  # run_child's second device, else 0

@cyctx.device(0)
def on_device():
    return cyctx.current_device()

@cyctx.bind(device=D1)
def bound():
    return cyctx.current_device()

class K:
    @cyctx.device(D1)
    def method(self):
        return cyctx.current_device()

    @cyctx.bind(device=0)
    def bound_method(self):
        return cyctx.current_device()
"""

FORK_AFTER_IMPORT = """
import json, os, sys
sys.path.insert(0, DIR)
import cyctx

def state():
    sim = drivers.SIM
    return [cyctx.cuda_initialized(), None if sim is None else
            [sim.retain_count(k) for k in range(2)]]

import mylib
out = {"after import": state()}
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    try:
        k = mylib.K()
        got = [mylib.on_device(), mylib.bound(), k.method(), k.bound_method(), state()]
    except BaseException as e:
        got = f"{type(e).__name__}: {e}"
    os.write(w, json.dumps(got).encode())
    os._exit(0)
os.close(w)
child = b""
while chunk := os.read(r, 65536):
    child += chunk
os.waitpid(pid, 0)
out["child"] = json.loads(child)
out["parent after fork"] = state()
out["parent calls"] = [mylib.on_device(), mylib.bound()]
out["parent end"] = state()
print(json.dumps(out))
"""


def test_decorators_at_import_initialise_nothing_and_a_forked_child_can_call(tmp_path):
    (tmp_path / "mylib.py").write_text(textwrap.dedent(MYLIB))
    proc = run_child(f"DIR = {str(tmp_path)!r}\n" + FORK_AFTER_IMPORT, init=False)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    sim = out["after import"][1] is not None
    assert out["after import"] == [False, [0, 0] if sim else None], out
    assert out["parent after fork"] == out["after import"], "the parent still has done nothing"
    d1 = second_device()
    assert out["child"][:4] == [0, d1, d1, 0], out["child"]
    assert out["child"][4] == [True, [1, 1] if sim else None], "the child's first calls retained"
    assert out["parent calls"] == [0, d1]
    assert out["parent end"] == [True, [1, 1] if sim else None]


def test_a_shared_guard_made_but_not_used_holds_nothing(sim):
    proc = run_child(
        """
        import json, pickle, cyctx
        from cyctx._guard import live_guards
        g = cyctx.device(1)
        before = [cyctx.cuda_initialized(), drivers.SIM.retain_count(1), g.closed, repr(g),
                  g is cyctx.ContextGuard.shared(1), len(live_guards()),
                  pickle.loads(pickle.dumps(g)) is g]
        try:
            g.close()
        except cyctx.GuardError as e:
            before.append("never closed" in str(e))
        h = g.handle  # its first use: the retain
        after = [drivers.SIM.retain_count(1), h == g.handle, len(live_guards()), repr(g)]
        print(json.dumps([before, after]))
        """,
        init=False,
    )
    before, after = json.loads(proc.stdout.strip().splitlines()[-1])
    assert before[:3] == [False, 0, False] and "not used yet" in before[3], before
    assert before[4:] == [True, 0, True, True], before
    assert after[:3] == [1, True, 1] and "ctx=0x" in after[3], after


def test_a_shared_guard_of_a_device_that_does_not_exist_raises_at_its_first_use(sim):
    proc = run_child(
        """
        import cyctx
        g = cyctx.device(7)  # no driver call yet: nothing to check the ordinal against
        print("MADE", cyctx.cuda_initialized())
        for use in (lambda: g.__enter__(), lambda: g.handle, lambda: g(len)([1])):
            try:
                use()
                print("USED")
            except cyctx.InvalidDeviceError as e:
                print("REFUSED", "Device 7 does not exist" in str(e))
        print("RETAINS", [drivers.SIM.retain_count(k) for k in range(2)], g.closed)
        try:
            cyctx.device(1 << 40)  # no device has an ordinal past a C int
        except cyctx.InvalidDeviceError:
            print("REFUSED AT ONCE", cyctx.cuda_initialized())
        """,
        init=False,
    )
    assert proc.stdout.split("\n")[:6] == [
        "MADE False",
        "REFUSED True",
        "REFUSED True",
        "REFUSED True",
        "RETAINS [0, 0] False",
        "REFUSED AT ONCE True",
    ], proc.stdout


def test_refusals_in_a_fresh_process_need_no_driver():
    # Refused at decoration, with no driver selected at all: nothing is loaded for it.
    proc = run_python(
        """
        import cyctx
        from _cyctx_libcuda import loaded_libcuda
        async def a(): pass
        for make in (lambda: cyctx.bind(device=0)(a), lambda: cyctx.device(0)(a)):
            try:
                make()
            except TypeError as e:
                print("REFUSED", "in steps" in str(e))
        print("LOADED", loaded_libcuda())
        """
    )
    assert proc.stdout.split("\n")[:3] == ["REFUSED True", "REFUSED True", "LOADED None"]
