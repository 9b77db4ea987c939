"""The tracer in fresh processes: off means free (nothing of it or of CUPTI loaded by
`import cyctx`), 16 threads under a trace (no deadlock, nothing lost), and `cyctx trace`."""

import json
import os
import subprocess
import sys

import pytest
from helpers import children, drivers

SIM_PROLOGUE = "from cyctx.testing import use_simulated_driver; sim = use_simulated_driver(2)\n"


def _needs_sim():
    if drivers.SIM is None:
        pytest.skip("runs its child on the simulated driver")


def test_import_cyctx_loads_nothing_of_the_tracer():
    proc = children.run_child(
        """
        import sys, cyctx
        g = cyctx.ContextGuard(0)
        with g:
            pass
        g.close()
        maps = open("/proc/self/maps").read()
        print(sorted(m for m in sys.modules if m.startswith("cyctx._trace")), "libcupti" in maps)
        """
    )
    assert proc.stdout.split("\n")[-2] == "[] False"


def test_a_simulated_trace_loads_the_simulators_libcupti_found_beside_its_driver():
    _needs_sim()
    proc = children.run_python(
        """
        import os, cyctx
        with cyctx.trace() as t:
            pass
        maps = {l.split()[-1] for l in open("/proc/self/maps") if "libcupti" in l}
        print(t.reason, maps == {t.cupti}, t.cupti_found_via,
              os.path.dirname(t.cupti) == os.path.dirname(sim.path))
        """,
        SIM_PROLOGUE,
    )
    d = os.path.dirname(drivers.SIM.path)
    assert proc.stdout.split("\n")[-2] == f"None True beside the loaded driver ({d}) True"


STRESS = """
import threading, sys, time
import cyctx
from cuda.bindings import driver as d
d.cuInit(0)
N_THREADS, ROUNDS = 16, 150
calls = [0] * N_THREADS
barrier = threading.Barrier(N_THREADS)

def work(k):
    barrier.wait()
    dev = k % 2
    g = cyctx.ContextGuard(dev)   # made inside the trace: its retain is traced too
    n = 1
    for i in range(ROUNDS):
        if k % 4 == 0:            # the guard: GIL held in the callback
            with g:
                pass
            n += 2
        elif k % 4 == 1:          # cuda.bindings: the GIL released
            err, p = d.cuDevicePrimaryCtxRetain(dev)
            d.cuCtxPushCurrent(p); d.cuCtxPopCurrent(); d.cuDevicePrimaryCtxRelease(dev)
            n += 4
        elif k % 4 == 2:          # created contexts: resource events under the driver's lock
            try:                  # bindings 13 take (params, flags, dev), 12 (flags, dev)
                err, c = d.cuCtxCreate(None, 0, dev)
            except TypeError:
                err, c = d.cuCtxCreate(0, dev)
            d.cuCtxDestroy(c)
            n += 2
        else:
            err, p = d.cuDevicePrimaryCtxRetain(dev)
            d.cuCtxSetCurrent(p); d.cuCtxSetCurrent(None); d.cuDevicePrimaryCtxRelease(dev)
            n += 4
    g.close()
    n += 1
    calls[k] = n

errors = []
threading.excepthook = lambda a: errors.append(f"{a.thread.name}: {a.exc_type.__name__}: {a.exc_value}")
with cyctx.trace(capacity=1 << 16) as t:
    ts = [threading.Thread(target=work, args=(k,)) for k in range(N_THREADS)]
    for th in ts: th.start()
    for th in ts: th.join()
api = [e for e in t.events if e.domain == "driver"]
print("errors", errors)
print("threads", len({e.thread for e in api}), "api", len(api), "expected", sum(calls), "dropped", t.dropped)
print("where", sorted({e.where.function for e in api if e.where}))
print("python", sorted({e.python_state for e in t.events}))
print("native", sorted({e.native_state for e in t.events}))
print("libraries", sorted({(e.library, e.cyctx_guard) for e in api}))
"""


def test_sixteen_threads_under_a_trace_finish_and_lose_nothing():
    _needs_sim()
    # No deadlock: the child must end well within its timeout (a callback that waited for the
    # GIL while the simulator holds its lock, as the real driver holds its own, would hang).
    proc = children.run_python(STRESS, SIM_PROLOGUE, timeout=120)
    lines = proc.stdout.strip().split("\n")
    # Every native walk reached the eval loop; the guards' calls are cyctx's, the rest
    # cuda-bindings'.
    assert lines[-2] == "native ['the eval loop']", proc.stdout
    assert lines[-1] == "libraries [('cuda-bindings', False), ('cyctx', True)]", proc.stdout
    lines = lines[:-2]
    assert lines[-4] == "errors []", lines[-4]  # a thread that died would be missing its calls
    head = lines[-3].split()
    assert head[0] == "threads" and head[1] == "16"
    assert head[3] == head[5] and int(head[3]) > 16 * 150 * 2  # every traced call, once
    assert head[7] == "0"
    assert lines[-2] == "where ['work']"
    assert lines[-1] == "python ['read']"


def test_command_line_trace_of_a_missing_script(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "cyctx", "trace", str(tmp_path / "nope.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_the_mixed_trace_script_fills_the_docs_page(tmp_path):
    """scripts/gpu/trace_mixed.py, on the simulator (its cuda.bindings and cyctx lines alone):
    it prints the workload and its trace, names each change's line, and pastes the block
    between the page's markers and nowhere else."""
    _needs_sim()
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- trace-mixed:begin -->\nold\n<!-- trace-mixed:end -->\nafter\n")
    out = tmp_path / "t.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(root / "scripts/gpu/trace_mixed.py"),
            "--simulate",
            "--json",
            str(out),
            "--fill-docs",
            str(page),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    assert text.startswith("before\n<!-- trace-mixed:begin -->\nTraced with Python ")
    assert text.endswith("\n```\n<!-- trace-mixed:end -->\nafter\n") and "old" not in text
    assert proc.stdout.strip() in text
    data = json.loads(out.read_text())
    workload = proc.stdout.split("# mixed.py\n", 1)[1].split("```", 1)[0].splitlines()
    changes = [e for e in data["events"] if e["changed"]]
    assert {e["thread_name"] for e in changes} == {"MainThread", "worker"}
    for e in changes:
        line = workload[e["where"]["line"] - 1]
        want = "cyctx" if "cyctx.ContextGuard" in line else "cuda-bindings"
        assert "d.cuCtxSetCurrent" in line or want == "cyctx", (line, e)
        assert e["library"] == want and e["cyctx_guard"] == (want == "cyctx"), (line, e)
