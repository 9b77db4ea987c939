"""The tracer on the real driver (CUPTI): the simulator's subscriber surface against the real
one (the same script traced on both gives the same events), and a process mixing torch, CuPy,
cuda.core and cyctx whose every context change must be named with its line and library. Each
runs in a child process (a trace is one of the process's CUPTI subscribers). The trace beside
another CUPTI subscriber is tested in test_trace_beside_gpu.py."""

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

DIFF_SCRIPT = """
import cyctx
from cuda.bindings import driver as d
d.cuInit(0)
err, p = d.cuDevicePrimaryCtxRetain(0)
d.cuCtxSetCurrent(p)
d.cuCtxSetCurrent(None)
d.cuCtxPushCurrent(p)
d.cuCtxPopCurrent()
d.cuCtxPopCurrent()                 # fails: nothing to pop
g = cyctx.ContextGuard(0)
with g:
    pass
g.close()
import cuda.bindings
if int(cuda.bindings.__version__.split(".")[0]) >= 13:
    err, c = d.cuCtxCreate(None, 0, 0)  # bindings 13: (params, flags, device)
else:
    err, c = d.cuCtxCreate(0, 0)        # bindings 12: (flags, device)
d.cuCtxDestroy(c)
d.cuCtxSetCurrent(p)
d.cuDevicePrimaryCtxReset(0)
d.cuCtxSetCurrent(None)
d.cuDevicePrimaryCtxRelease(0)
err, p = d.cuDevicePrimaryCtxRetain(0)
d.cuDevicePrimaryCtxRelease(0)      # the last reference: destroyed
"""


def _trace(tmp_path, script, simulate, name):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(script))
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, "-m", "cyctx", "trace", "--quiet", "--json", str(out)]
    proc = subprocess.run(
        cmd + (["--simulate"] if simulate else []) + [str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out.exists(), proc.stderr  # no file: the trace could not subscribe (stderr says why)
    return json.loads(out.read_text()), path


def _normalised(data):
    """The events with handles and ids replaced by the order they first appear in."""
    labels = {}

    def label(kind, v):
        if not v:
            return None
        return labels.setdefault((kind, v), f"{kind}{sum(k == kind for k, _ in labels)}")

    out = []
    for e in data["events"]:
        if e["domain"] == "runtime":
            continue
        refs = []
        for key in ("before", "after", "target"):
            r = e[key]
            refs.append(
                None
                if r is None
                else (label("ctx", r["handle"]), label("id", r["id"]), r["device"])
            )
        out.append(
            (
                e["domain"],
                e["call"],
                e["via"],
                e["result"],
                e["device"],
                e["changed"],
                *refs,
                e["where"]["line"] if e["where"] else None,
            )
        )
    return out


def test_the_simulator_traces_a_script_as_the_real_driver_does(tmp_path):
    real, _ = _trace(tmp_path, DIFF_SCRIPT, simulate=False, name="real")
    sim, _ = _trace(tmp_path, DIFF_SCRIPT, simulate=True, name="sim")
    assert real["driver"] == "real" and sim["driver"] == "simulated"
    assert real["dropped"] == sim["dropped"] == 0
    assert _normalised(real) == _normalised(sim)


MIXED = """
import threading
import cupy
import torch
import cyctx
from cuda.core import Device
from cuda.bindings import driver as d

torch.cuda.set_device(0)                       # L torch
x = torch.ones(4, device="cuda")               # L torch
d.cuCtxSetCurrent(None)                        # L cuda-bindings
with cupy.cuda.Device(0):                      # L cupy
    y = cupy.arange(4)                         # L cupy
d.cuCtxSetCurrent(None)                        # L cuda-bindings
Device(0).set_current()                        # L cuda.core
d.cuCtxSetCurrent(None)                        # L cuda-bindings
with cyctx.ContextGuard(0):                    # L cyctx
    pass

done, stay = threading.Event(), threading.Event()

def worker():
    torch.cuda.set_device(0)                   # L torch
    d.cuCtxSetCurrent(None)                    # L cuda-bindings
    done.set()
    stay.wait()  # alive when the trace stops: its events carry its name

threading.Thread(target=worker, name="worker", daemon=True).start()
done.wait()
"""


def _shown(e):
    return json.dumps(e, indent=1)


def test_a_mixed_process_names_each_change_with_its_line_and_library(tmp_path):
    """Each change is named after the library the script's line called (docs/tracing.md, "Who
    made the call"): torch, CuPy's and cuda.core's compiled modules (cuda.core calls the driver
    through cuda-bindings, which it does not become), cuda.bindings called directly, cyctx's
    guard. The native walk must reach the eval loop every time (a cut stack would name what it
    shows and say so, which is not the expected name)."""
    data, path = _trace(tmp_path, MIXED, simulate=False, name="mixed")
    expected = {}
    for i, text in enumerate(textwrap.dedent(MIXED).splitlines(), start=1):
        if "# L " in text:
            expected[i] = text.rsplit("# L ", 1)[1].strip()
    # The script's two threads; threads of the libraries themselves are not the script's lines.
    changes = [
        e for e in data["events"] if e["changed"] and e["thread_name"] in ("MainThread", "worker")
    ]
    assert changes, "no context change traced:\n" + _shown(data)
    assert {e["thread_name"] for e in changes} == {"MainThread", "worker"}, _shown(changes)
    named = {}
    for e in changes:
        where = e["where"]
        assert where is not None and where["file"] == str(path), _shown(e)
        assert where["line"] in expected, f"line {where['line']} changes no context:\n{_shown(e)}"
        assert e["native_state"] == "the eval loop", _shown(e)
        want = expected[where["line"]]
        assert e["library"] == want, f"line {where['line']}: {want} expected\n{_shown(e)}"
        assert e["cyctx_guard"] == (want == "cyctx"), _shown(e)
        named.setdefault(e["library"], set()).add(where["line"])
    # Every library of the script made at least one change that the trace saw.
    assert set(named) == {"torch", "cupy", "cuda.core", "cuda-bindings", "cyctx"}, named


STRESS = """
import json, sys, threading
import cupy
import torch
import cyctx
from cuda.bindings import driver as d

d.cuInit(0)
torch.cuda.init()
ROUNDS = 200
kinds, expected = {}, {}

def bindings(k):
    kinds[threading.get_native_id()] = "cuda-bindings"
    n = 0
    for i in range(ROUNDS):
        err, p = d.cuDevicePrimaryCtxRetain(0)
        d.cuCtxPushCurrent(p); d.cuCtxPopCurrent()
        d.cuCtxSetCurrent(p); d.cuCtxSetCurrent(None)
        d.cuDevicePrimaryCtxRelease(0)
        n += 6
    expected[threading.get_native_id()] = n

def with_cupy(k):
    kinds[threading.get_native_id()] = "cupy"
    for i in range(ROUNDS):
        with cupy.cuda.Device(0):
            cupy.cuda.runtime.setDevice(0)   # the runtime makes the primary context current
        d.cuCtxSetCurrent(None)              # so that the next round makes a change again

def with_torch(k):
    kinds[threading.get_native_id()] = "torch"
    for i in range(ROUNDS):
        torch.cuda.set_device(0)
        torch.ones(1, device="cuda")         # a launch: the runtime binds the primary context
        d.cuCtxSetCurrent(None)

def with_guard(k):
    kinds[threading.get_native_id()] = "cyctx"
    g = cyctx.ContextGuard(0)
    for i in range(ROUNDS):
        with g:
            pass
    g.close()

work = [bindings, with_cupy, with_torch, with_guard]
with cyctx.trace(capacity=1 << 18, quiet=True) as t:
    ts = [threading.Thread(target=work[k % 4], args=(k,)) for k in range(16)]
    for th in ts: th.start()
    for th in ts: th.join()
summary = {"reason": t.reason, "dropped": t.dropped, "threads": {}}
for tid, kind in kinds.items():
    mine = [e for e in t.events if e.thread == tid and e.domain == "driver"]
    summary["threads"][str(tid)] = {
        "kind": kind,
        "events": len(mine),
        "expected": expected.get(tid),
        "changes": sum(e.changed for e in mine),
        "change_libraries": sorted({e.library for e in mine if e.changed}),
        "changes_by": {lib: sum(e.changed and e.library == lib for e in mine)
                       for lib in {e.library for e in mine}},
        "native_states": sorted({e.native_state for e in mine}),
        "first_bad": next((e.as_json() for e in mine if e.native_state != "the eval loop"), None),
    }
print(json.dumps(summary))
"""


def test_sixteen_threads_mixing_bindings_cupy_torch_and_guards_lose_nothing(tmp_path):
    """16 threads, four of each kind, under one trace on the real driver: the process ends (no
    deadlock: a callback waiting for the GIL while the driver holds its locks would hang it),
    nothing is dropped, every cuda.bindings call is recorded once, and each thread's changes
    are named after its library (a thread's own cuCtxSetCurrent(None) resets are
    cuda-bindings')."""
    script = tmp_path / "stress.py"
    script.write_text(textwrap.dedent(STRESS))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["reason"] is None, summary["reason"]
    assert summary["dropped"] == 0, summary
    threads = summary["threads"]
    assert sorted(v["kind"] for v in threads.values()) == sorted(
        ["cuda-bindings", "cupy", "torch", "cyctx"] * 4
    ), threads
    rounds = 200
    for v in threads.values():
        shown = json.dumps(v, indent=1)
        assert v["native_states"] == ["the eval loop"], shown
        by = v["changes_by"]
        if v["kind"] == "cuda-bindings":
            assert v["events"] == v["expected"], shown  # every call once
            assert v["change_libraries"] == ["cuda-bindings"], shown
            assert by["cuda-bindings"] == 4 * rounds, shown  # push, pop, set, unset
        elif v["kind"] == "cyctx":
            assert v["change_libraries"] == ["cyctx"] and by["cyctx"] == 2 * rounds, shown
        else:
            assert set(v["change_libraries"]) == {v["kind"], "cuda-bindings"}, shown
            assert by["cuda-bindings"] == rounds, shown  # the thread's own resets
            # cudaSetDevice after each reset makes a change; torch's launch at least once.
            assert by[v["kind"]] >= (rounds if v["kind"] == "cupy" else 1), shown


NUMBA = """
import numba.cuda
from cuda.bindings import driver as d

d.cuInit(0)
d.cuCtxSetCurrent(None)
with numba.cuda.gpus[0]:                       # L numba
    pass
"""


def test_numba_cudas_device_block_is_named_at_the_users_line(tmp_path):
    """`with numba.cuda.gpus[0]:` reaches the driver through more of numba-cuda's own Python
    frames than an event keeps (python_frames=4): the read goes on past them to the script's
    line, and the changes are numba's, made at that line, not "called from beyond" numba's
    own frames."""
    import importlib.util

    if importlib.util.find_spec("numba") is None:
        pytest.skip("needs numba-cuda")
    # The script is not numba.py: it would shadow numba itself.
    data, path = _trace(tmp_path, NUMBA, simulate=False, name="numba_user")
    line = next(
        i
        for i, text in enumerate(textwrap.dedent(NUMBA).splitlines(), start=1)
        if "# L numba" in text
    )
    mine = [
        e for e in data["events"] if e["domain"] == "driver" and e["thread_name"] == "MainThread"
    ]
    at_line = [e for e in mine if e["where"] and e["where"]["line"] == line]
    assert at_line, "no driver call at the with-block's line:\n" + _shown(mine)
    assert any(e["changed"] for e in at_line), _shown(at_line)
    for e in at_line:
        assert e["where"]["file"] == str(path), _shown(e)
        assert e["library"] == "numba", _shown(e)
    # numba's own frames were read past: the last two kept are the line and the numba frame
    # it called, deeper than the four kept.
    deep = [e for e in at_line if e["python"][-1]["depth"] >= 4]
    assert deep, "the line was within the kept frames: the read past them was not needed\n" + (
        _shown(at_line)
    )
    assert not any("called from beyond" in e["library"] for e in mine), _shown(mine)
