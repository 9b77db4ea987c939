"""What the benchmarks measure, apart from how they measure it (bench/harness.py).

Each module is one group, plain functions registered by name with `@case`: a case takes the
process's prepared state (`env`) and a start path, and returns the loop to time, `loop(n)`.
Python-level loops are plain functions bound with functools.partial, so a row times exactly
the function written out here. COMPILED groups are timed by the compiled loops, one process
each (`nogil` holds floor and nogil, so that their ratios are taken within one process);
PYTHON_GROUPS through pyperf (bench/python_group.py). Nothing here imports the harness: it
hands each compiled process what it needs (harness.Process).
"""

from collections.abc import Callable
from typing import NamedTuple

PATHS = ("fast", "from_none", "from_other")  # target already current / no context / device 1's
SWITCHING = PATHS[1:]


class Case(NamedTuple):
    id: str
    label: str
    layer: str  # driver, cython, python, peer; control when re-measured beside a peer
    paths: tuple  # the start paths it runs on (from_other only where there are two devices)
    make: Callable  # make(env, path) -> loop(n)
    note: str
    checks: tuple  # what its first run records: "current_inside" (a Python-level body, probed
    # by harness.probe), "restored"


CASES = {}  # group -> [Case], in the order of the tables


def registrar(group, layer, python=False):
    """The `@case(row_id, label, ...)` decorator of one group."""

    def case(row_id, label, paths=("fast",), note="", checks=None):
        if checks is None:
            checks = ("current_inside", "restored") if python else ("restored",)

        def register(make):
            CASES.setdefault(group, []).append(
                Case(row_id, label, layer, paths, make, note, checks)
            )
            return make

        return register

    return case


def cases(*names):
    return [c for name in names for c in CASES[name]]


def control_cases():
    """cyctx's own rows re-measured beside a peer, in its processes: the empty `with`, `with
    guard:` and the nogil enter()/exit(), on the fast path. They show whether a process with
    the peer loaded is slower at the Python level, at the driver, or not at all."""
    wanted = ("python.empty_with", "python.guard", "cython.guard")
    by_id = {c.id: c for c in cases("nogil", "from_python") if c.id in wanted}
    return [by_id[i]._replace(layer="control", paths=("fast",)) for i in wanted]


def python_cases(group):
    """The rows of a Python-level group: `python`, or `peer:NAME` with the control rows."""
    return cases("from_python") if group == "python" else CASES[group] + control_cases()


def open_python(group, bench):
    """The process state of a Python-level group (ImportError when a peer is not installed)."""
    if group == "python":
        return open_core(bench)
    return peers.open_peer(bench, group.removeprefix("peer:"))


def open_core(bench):
    """The state of cyctx's own rows (the nogil and python groups): device 0's guard (and
    device 1's where there is one), the start context of each path, cyctx's current-context
    reader."""
    from types import SimpleNamespace

    from cuda.bindings import driver as d

    import cyctx

    d.cuInit(0)
    ndev = d.cuDeviceGetCount()[1]
    g0 = cyctx.ContextGuard(0)
    g1 = cyctx.ContextGuard(1) if ndev > 1 else None
    starts = {"fast": g0.handle, "from_none": 0}
    created = None
    if g1:
        starts["from_other"] = g1.handle
        other = "device 1's primary context"
    else:
        # One GPU: another context is a created one on device 0. Switching to it is the same
        # driver work (cuCtxSetCurrent to a different context) as to device 1's primary.
        created = _create_context(d)
        starts["from_other"] = int(created)
        other = "a context created on device 0 (cuCtxCreate; one GPU)"
    bench.set_current(0)
    bench.checked()  # also resolves the floor's entry points
    # What the report's header says of the driver; it travels with each row's values.
    info = {
        "cuda_devices": ndev,
        "cuda_driver_api": d.cuDriverGetVersion()[1],
        "cuda_device_names": "; ".join(_device_name(d, i) or "?" for i in range(ndev)),
        "other_context": other,
    }
    return SimpleNamespace(
        bench=bench,
        driver=d,
        ndev=ndev,
        g0=g0,
        g1=g1,
        h0=g0.handle,
        starts=starts,
        created=created,
        empty=bench.Empty(),
        set_start=bench.set_current,
        current=cyctx.current_handle,
        info=info,
    )


def run_nogil(h):
    env = open_core(h.bench)
    rows = h.rows(env, cases("floor", "nogil"), "nogil")
    for g in (env.g1, env.g0):
        if g:
            g.close()
    if env.created is not None:
        env.driver.cuCtxDestroy(env.created)
    return rows


def _create_context(d):
    """A created context on device 0, left current on no thread. cuCtxCreate takes
    (params, flags, dev) in bindings 13 and (flags, dev) in 12; it pushes the new context."""
    dev = d.cuDeviceGet(0)[1]
    try:
        err, ctx = d.cuCtxCreate(None, 0, dev)
    except TypeError:
        err, ctx = d.cuCtxCreate(0, dev)
    if err != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuCtxCreate failed: {err!r}")
    d.cuCtxPopCurrent()
    return ctx


def _device_name(d, i):
    err, name = d.cuDeviceGetName(256, d.cuDeviceGet(i)[1])
    return (
        name.split(b"\0", 1)[0].decode(errors="replace") if err == d.CUresult.CUDA_SUCCESS else None
    )


# The modules register their cases as they are imported (after `registrar` is defined).
from . import floor, from_python, memory, nogil, peers, threads  # noqa: E402,F401

# name -> run(h): the result of one process (h: harness.Process, what the harness lends it):
# pyperf benchmarks (nogil, threads), or a dict (memory).
COMPILED = {"nogil": run_nogil, "threads": threads.run, "memory": memory.run}
PYTHON_GROUPS = ("python", *(f"peer:{name}" for name in peers.PEERS))
