"""One benchmark group, run in its own process by bench/run_all.py:

    python bench/_worker.py GROUP --out FILE.json --build-dir DIR [--sim] [--quick]

GROUP is `core` (driver floor, cyctx from Cython and from Python, the empty `with`),
`threads`, `memory`, or `peer:NAME` (NAME in PEERS). The result goes to FILE.json, not to
stdout, which the peers' libraries may write to.

Why a process per group: a peer library (torch, CuPy, numba) must not share a process with
the floor measurements (it loads its own runtime, threads and allocator), the memory group
checks that no primary context is left active, which only means something in a process that
nothing else retained in, and idle OpenMP threads of the thread group must not run beside
single-thread timings.
"""

import argparse
import json
import os
import statistics
import sys
import time
import traceback

# Each peer's rows (id, label); its process makes device 0's context current, then restores
# the previous one, as a guard does.
PEER_ROWS = {
    "cuda_bindings": (("cuda_bindings.pushpop", "cuda.bindings.driver push+pop, from Python"),
                      ("cuda_bindings.full", "cuda.bindings.driver retain+push+pop+release, from Python")),
    "cupy": (("cupy.device", "cupy: with d0 (a pre-built cupy.cuda.Device(0))"),
             ("cupy.device_new", "cupy: with cupy.cuda.Device(0) (constructed each time)")),
    "cuda_core": (("cuda_core.set_current", "cuda.core: d0.set_current(), then restore the previous"),),
    "torch": (("torch.device", "torch: with torch.cuda.device(0)"),
              ("torch.device_prebuilt", "torch: with td0 (a pre-built torch.cuda.device(0))")),
    "numba": (("numba.gpus", "numba: with cuda.gpus[0]"),),
}
PEERS = tuple(PEER_ROWS)
PATHS = ("fast", "from_none", "from_other")  # target already current / no context / device 1's
THREAD_COUNTS = (1, 2, 4, 8, 16)
# Thread-scaling kinds: (id, _bench.threaded kind, which context each thread starts from).
THREAD_KINDS = (
    ("guard.fast", "guard", "fast"),
    ("guard.switch", "guard", "from_none"),
    ("driver.pushpop", "pushpop", "from_none"),
    ("switch.fast", "switch", "fast"),
    ("driver.getid", "getid", "fast"),
)


class Timer:
    """Median of repeated rounds after a warm-up; each round's size is calibrated so that it
    lasts about `round_s` seconds, whatever the operation costs (10 ns or 10 us)."""

    def __init__(self, quick):
        # Many short rounds rather than a few long ones: on a shared machine the slow spells
        # come and go, and a median over more rounds is less at their mercy.
        self.round_s = 0.002 if quick else 0.02
        self.rounds = 3 if quick else 15

    @staticmethod
    def _time(fn, n, setup):
        if setup:
            setup()
        t0 = time.perf_counter_ns()
        fn(n)
        return time.perf_counter_ns() - t0

    def calibrate(self, fn, setup=None, round_s=None):
        round_s = round_s or self.round_s
        n = 1
        while True:
            t = self._time(fn, n, setup)
            if t >= round_s * 1e9 / 10 or n >= 1 << 32:
                return max(1, int(n * round_s * 1e9 / max(t, 1)))
            n *= 8

    def measure_many(self, specs):
        """ns per operation of each fn(n) (which runs n operations) in specs [(fn, setup)].

        Rounds are interleaved: round r of every spec runs before round r+1 of any, after a
        warm-up round of each. Slow drift (clock ramp-up at the start of a process, a noisy
        neighbour) then spreads over all rows alike instead of landing on whichever ran first;
        ratios are taken between rows of one such set. A spec that raises gets an "error".
        """
        out = [{} for _ in specs]
        ns = []
        for (fn, setup), res in zip(specs, out):
            try:
                ns.append(self.calibrate(fn, setup))
            except Exception as exc:
                ns.append(None)
                res["error"] = f"{type(exc).__name__}: {exc}"
        samples = [[] for _ in specs]
        for r in range(self.rounds + 1):  # round 0 is the warm-up
            for i, ((fn, setup), n) in enumerate(zip(specs, ns)):
                if "error" in out[i]:
                    continue
                try:
                    t = self._time(fn, n, setup)
                except Exception as exc:
                    out[i]["error"] = f"{type(exc).__name__}: {exc}"
                    continue
                if r:
                    samples[i].append(t / n)
        for res, smp, n in zip(out, samples, ns):
            if "error" not in res:
                res.update(ns=round(statistics.median(smp), 2), min=round(min(smp), 2),
                           max=round(max(smp), 2), n=n, rounds=self.rounds)
        return out


def python_loop(body, names):
    """A function `loop(n)` running `body` n times in a plain `for` loop, compiled from
    source the way timeit does it, so every Python-level row pays the same loop overhead."""
    src = "def loop(n):\n    for _ in range(n):\n" + "".join(f"        {line}\n" for line in body)
    scope = dict(names)
    exec(compile(src, "<bench>", "exec"), scope)
    return scope["loop"]


def _bodies_with(expr):
    return lambda inside: [f"with {expr}:", f"    {inside or 'pass'}"]


def _bodies_pair(enter, leave):
    return lambda inside: [enter] + ([inside] if inside else []) + [leave]


class Rows:
    """The rows of one process: each checked once as it is added, then all timed together
    (Timer.measure_many) so that the ones compared with each other share the conditions.

    set_start(h) makes context h current (0: none); current() reads it; target is device
    0's context, which every row makes current.
    """

    def __init__(self, timer, set_start, current, target):
        self.timer, self.set_start, self.current, self.target = timer, set_start, current, target
        self.rows, self.specs = [], []

    def _add(self, row, fn, start):
        self.rows.append(row)
        if row.get("status") is None:
            self.specs.append((row, fn, start))

    def compiled(self, row_id, label, layer, path, start, fn, note=""):
        """A compiled loop fn(n); checked: the starting context is current after it."""
        row = {"id": row_id, "label": label, "path": path, "layer": layer, "note": note}
        self.set_start(start)
        fn(1)
        row["restored"] = self.current() == start
        self.set_start(0)
        self._add(row, fn, start)

    def python(self, row_id, label, layer, path, start, body_for, names, note=""):
        """A Python-level enter+exit, run once with a probe first: is device 0's context
        current inside, and the starting one after? (Does it do the guard's work?)"""
        row = {"id": row_id, "label": label, "path": path, "layer": layer, "note": note}
        loop = None
        try:
            seen = []
            self.set_start(start)
            python_loop(body_for("_seen.append(_cur())"), dict(names, _seen=seen, _cur=self.current))(1)
            row["current_inside"] = seen[0] == self.target
            row["restored"] = self.current() == start
            loop = python_loop(body_for(None), names)
        except Exception as exc:  # a peer failing is a result to report, not a crash
            row.update(ns=None, status=f"error: {type(exc).__name__}: {exc}")
        finally:
            self.set_start(0)
        self._add(row, loop, start)

    def measure(self):
        specs = [(fn, lambda start=start: self.set_start(start)) for _, fn, start in self.specs]
        for (row, _, _), res in zip(self.specs, self.timer.measure_many(specs)):
            if "error" in res:
                row.update(ns=None, status=f"error: {res['error']}")
            else:
                row.update(res, status="ok")
        self.set_start(0)
        return self.rows


def add_controls(rows, _bench, g0, h0, names):
    """cyctx's own rows re-measured beside a peer: the empty `with`, `with guard:` and the
    nogil enter()/exit(), all on the fast path. They show whether a process with the peer
    loaded is slower at the Python level, at the driver, or not at all."""
    names = dict(names, g0=g0, empty=_bench.Empty())
    rows.python("python.empty_with", "with Empty(): an extension type doing nothing", "control", "fast", h0,
                _bodies_with("empty"), names)
    rows.python("python.guard", "with guard: (pre-built ContextGuard)", "control", "fast", h0,
                _bodies_with("g0"), names)
    rows.compiled("cython.guard", "guard.enter()/exit() (nogil)", "control", "fast", h0,
                  lambda n: _bench.guard_loop(g0, n))


# --- groups ---------------------------------------------------------------------------------

def group_core(args, timer):
    import _bench
    import cyctx
    from cuda.bindings import driver as d

    d.cuInit(0)
    ndev = d.cuDeviceGetCount()[1]
    g0 = cyctx.ContextGuard(0)
    g1 = cyctx.ContextGuard(1) if ndev > 1 else None
    h0 = g0.handle
    starts = {"fast": h0, "from_none": 0}
    if g1:
        starts["from_other"] = g1.handle
    _bench.set_current(0)
    _bench.checked()  # also resolves the floor's entry points
    rows = Rows(timer, _bench.set_current, cyctx.current_handle, h0)

    for path, start in starts.items():
        if path != "fast":
            rows.compiled("driver.pushpop", "push+pop (cuCtxPushCurrent/cuCtxPopCurrent)", "driver", path, start,
                          lambda n: _bench.pushpop(h0, n))
            rows.compiled("driver.pushpop_cydriver", "push+pop through cuda.bindings' cydriver", "driver", path,
                          start, lambda n: _bench.pushpop_cydriver(h0, n), "what a Cython caller of cydriver pays")
            rows.compiled("driver.setset", "cuCtxSetCurrent(target)+cuCtxSetCurrent(previous)", "driver", path,
                          start, lambda n, other=start: _bench.setset(h0, other, n),
                          "the switch a guard makes, at the driver")
    rows.compiled("driver.full", "retain+push+pop+release", "driver", "from_none", 0, lambda n: _bench.full(0, n),
                  "the primary context is held by a guard meanwhile, as in the lab")
    rows.compiled("driver.getcurrent", "cuCtxGetCurrent", "driver", "fast", h0, _bench.getcurrent)
    rows.compiled("driver.getid", "cuCtxGetId (the guard's per-enter reset check)", "driver", "fast", h0,
                  lambda n: _bench.getid(h0, n))
    rows.compiled("cython.tls", "thread-local entry push+pop (as a guard keeps, in an extension module)",
                  "cython", "fast", h0, _bench.tls_loop)
    for path, start in starts.items():
        rows.compiled("cython.guard", "guard.enter()/exit() (nogil)", "cython", path, start,
                      lambda n: _bench.guard_loop(g0, n))
        rows.compiled("cython.switch", "switch_to()/switch_back() (no reset check, no bookkeeping)", "cython",
                      path, start, lambda n: _bench.switch_loop(h0, n))
        rows.compiled("cython.switch_id", "cuCtxGetId + switch_to()/switch_back()", "cython", path, start,
                      lambda n: _bench.switch_id_loop(h0, n))

    names = {"g0": g0, "empty": _bench.Empty()}
    rows.python("python.loop", "empty loop iteration (for _ in range(n): pass)", "python", "fast", h0,
                lambda inside: [inside or "pass"], names)
    rows.python("python.empty_with", "with Empty(): an extension type doing nothing", "python", "fast", h0,
                _bodies_with("empty"), names)
    for path, start in starts.items():
        rows.python("python.guard", "with guard: (pre-built ContextGuard)", "python", path, start,
                    _bodies_with("g0"), names)
    out = rows.measure()
    for r in out:
        if r["id"] == "python.loop":  # a loop does no context work: nothing to check
            r.pop("current_inside", None), r.pop("restored", None)
        elif r["id"] == "python.empty_with":
            r.pop("current_inside", None)
    result = {"rows": out, "devices": ndev, "driver_api_version": d.cuDriverGetVersion()[1],
              "device_names": [_device_name(d, i) for i in range(ndev)]}
    if g1:
        g1.close()
    g0.close()
    return result


def _device_name(d, i):
    err, name = d.cuDeviceGetName(256, d.cuDeviceGet(i)[1])
    return name.split(b"\0", 1)[0].decode(errors="replace") if err == d.CUresult.CUDA_SUCCESS else None


def group_threads(args, timer):
    import _bench
    import cyctx

    g0 = cyctx.ContextGuard(0)
    starts = {"fast": g0.handle, "from_none": 0}
    round_s = 0.0005 if args.quick else 0.01
    rounds = 2 if args.quick else 5
    rows = []
    for kind_id, kind, path in THREAD_KINDS:
        start = starts[path]

        def run(n, t=1, kind=kind, start=start):
            _bench.threaded(kind, g0, start, t, n)

        # Weak scaling: the same work per thread at every thread count, sized on one thread.
        n = timer.calibrate(run, round_s=round_s)
        run(n, THREAD_COUNTS[-1])  # warm-up: the whole team started, the clocks up
        for t in THREAD_COUNTS:
            run(max(n // 10, 1), t)  # warm-up: starts the team, first-touch of each thread's state
            samples = []
            for _ in range(rounds):
                t0 = time.perf_counter_ns()
                run(n, t)
                samples.append((time.perf_counter_ns() - t0) / (n * t))
            rows.append({"id": kind_id, "kind": kind, "path": path, "threads": t, "team": _bench.team_size(t),
                         "n_per_thread": n, "rounds": rounds,
                         "aggregate_ns_per_op": round(statistics.median(samples), 3)})
    # The same work on this process's main thread, outside any OpenMP region: tells a
    # difference between the harness's one thread and the core group's loop apart from one
    # between processes.
    plain = timer.measure_many([
        (lambda n: _bench.guard_loop(g0, n), lambda: _bench.set_current(starts["fast"])),
        (lambda n: _bench.pushpop(starts["fast"], n), lambda: _bench.set_current(0)),
    ])
    _bench.set_current(0)
    restored = cyctx.current_handle() == 0
    g0.close()
    return {"rows": rows, "restored": restored, "cpu_count": os.cpu_count(),
            "main_thread_no_openmp_ns": {"guard.fast": plain[0].get("ns"), "driver.pushpop": plain[1].get("ns")},
            "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}


def _rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def group_memory(args, timer):
    import _bench
    import cyctx
    from cyctx._guard import _open_entries
    from cuda.bindings import driver as d

    from cyctx.testing import simulated

    sim = simulated()
    d.cuInit(0)
    ndev = d.cuDeviceGetCount()[1]
    guards = [cyctx.ContextGuard(i) for i in range(ndev)]
    g0 = guards[0]
    h0 = g0.handle
    cycles = 100_000 if args.quick else 10_000_000
    py_cycles = 10_000 if args.quick else 1_000_000
    loop = python_loop(_bodies_with("g0")(None), {"g0": g0})
    _bench.guard_loop(g0, 10_000)  # warm-up: this thread's entry stack and the driver's state
    loop(10_000)
    runs = []
    for label, start, fn, k in (
        ("cython guard.enter()/exit(), switching from no context", 0, lambda k: _bench.guard_loop(g0, k), cycles),
        ("cython guard.enter()/exit(), already current", h0, lambda k: _bench.guard_loop(g0, k), cycles),
        ("python with guard:, switching from no context", 0, loop, py_cycles),
    ):
        _bench.set_current(start)
        before = _rss_kib()
        t0 = time.perf_counter()
        fn(k)
        secs = time.perf_counter() - t0
        after = _rss_kib()
        runs.append({"what": label, "cycles": k, "seconds": round(secs, 3), "rss_kib_before": before,
                     "rss_kib_after": after, "growth_kib": after - before,
                     "restored": cyctx.current_handle() == start})
        _bench.set_current(0)
    open_entries = _open_entries()
    retains_during = [sim.retain_count(i) for i in range(ndev)] if sim else None
    for g in guards:
        g.close()
    active = [bool(d.cuDevicePrimaryCtxGetState(d.cuDeviceGet(i)[1])[2]) for i in range(ndev)]
    retains_after = [sim.retain_count(i) for i in range(ndev)] if sim else None
    return {
        "runs": runs,
        "open_entries_after": open_entries,
        "retains_during": retains_during,  # simulated driver only: the guards' own, 1 each
        "retains_after_close": retains_after,
        "primary_active_after_close": active,
        "balanced": not any(active) and open_entries == 0
                    and (retains_after is None or not any(retains_after))
                    and (retains_during is None or retains_during == [1] * ndev),
        "check": "every guard closed; no device's primary context is still active (nothing else "
                 "in this process retained one), no guard entry left open"
                 + ("; the simulated driver's refcounts are 1 during and 0 after" if sim else ""),
    }


# --- peers: each makes device 0's context current, then restores the previous one ---------

def peer_setup(name, ndev):
    """(names, bodies) for a peer, bodies[row_id][path] giving the loop body; raises
    ImportError when the peer is not installed. Set-up work (runtime initialisation, device
    enumeration) happens here, untimed."""
    from cuda.bindings import driver as d

    names = {"_driver": d, "_null": d.CUcontext(0)}
    every = lambda body_for: {p: body_for for p in PATHS}  # noqa: E731
    if name == "cuda_bindings":
        names["dev0"] = d.cuDeviceGet(0)[1]
        names["c0"] = d.cuDevicePrimaryCtxRetain(names["dev0"])[1]  # held until the process ends
        return names, {
            "cuda_bindings.pushpop": every(_bodies_pair("_driver.cuCtxPushCurrent(c0)", "_driver.cuCtxPopCurrent()")),
            "cuda_bindings.full": every(_bodies_pair(
                "_driver.cuCtxPushCurrent(_driver.cuDevicePrimaryCtxRetain(dev0)[1])",
                "_driver.cuCtxPopCurrent(); _driver.cuDevicePrimaryCtxRelease(dev0)")),
        }
    if name == "cupy":
        import cupy

        cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(1))
        names.update(cupy=cupy, d0=cupy.cuda.Device(0))
        return names, {"cupy.device": every(_bodies_with("d0")),
                       "cupy.device_new": every(_bodies_with("cupy.cuda.Device(0)"))}
    if name == "cuda_core":
        try:
            from cuda.core import Device
        except ImportError:  # cuda.core before 1.0
            from cuda.core.experimental import Device

        names["d0"] = Device(0)
        names["d0"].set_current()
        if ndev > 1:
            names["d1"] = Device(1)
            names["d1"].set_current()
        # No context manager in cuda.core: restore with the previous device's set_current(),
        # and with cuda.bindings' cuCtxSetCurrent(NULL) where there was no context.
        restore = {"fast": "d0.set_current()", "from_other": "d1.set_current()",
                   "from_none": "_driver.cuCtxSetCurrent(_null)"}
        return names, {"cuda_core.set_current": {p: _bodies_pair("d0.set_current()", restore[p]) for p in PATHS}}
    if name == "torch":
        import torch

        torch.cuda.init()
        torch.empty(1, device="cuda:0")
        names.update(torch=torch, td0=torch.cuda.device(0))
        return names, {"torch.device": every(_bodies_with("torch.cuda.device(0)")),
                       "torch.device_prebuilt": every(_bodies_with("td0"))}
    if name == "numba":
        from numba import cuda

        len(cuda.gpus)
        names["cuda"] = cuda
        return names, {"numba.gpus": every(_bodies_with("cuda.gpus[0]"))}
    raise SystemExit(f"unknown peer {name!r}; known: {', '.join(PEERS)}")


def group_peer(args, timer, name):
    import _bench
    from cuda.bindings import driver as d

    try:
        d.cuInit(0)
        ndev = d.cuDeviceGetCount()[1]
        names, bodies = peer_setup(name, ndev)
    except ImportError as exc:
        return {"status": f"missing: {exc}", "rows": []}
    import cyctx  # after the peer: cyctx joins a process the peer set up

    # The contexts each path starts from: the primary contexts, which the peers use too.
    ctx = [d.cuDevicePrimaryCtxRetain(d.cuDeviceGet(i)[1])[1] for i in range(min(ndev, 2))]
    starts = {"fast": int(ctx[0]), "from_none": 0}
    if ndev > 1:
        starts["from_other"] = int(ctx[1])
    by_int = {int(c): c for c in ctx}
    by_int[0] = d.CUcontext(0)

    def set_start(h):
        err, = d.cuCtxSetCurrent(by_int[h])
        if err != d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuCtxSetCurrent failed: {err!r}")

    set_start(0)
    rows = Rows(timer, set_start, cyctx.current_handle, starts["fast"])
    for row_id, label in PEER_ROWS[name]:
        for path, start in starts.items():
            rows.python(row_id, label, "peer", path, start, bodies[row_id][path], names)
    g0 = cyctx.ContextGuard(0)
    add_controls(rows, _bench, g0, starts["fast"], names)
    out = rows.measure()
    g0.close()
    for i in range(len(ctx)):
        d.cuDevicePrimaryCtxRelease(d.cuDeviceGet(i)[1])
    return {"status": "ok", "rows": out}


RESTORE_NOTES = {
    "cuda_core": "cuda.core has no context manager: d0.set_current(), then the previous device's "
                 "set_current() (d0 again on the fast path, d1 from device 1), or "
                 "cuda.bindings.driver.cuCtxSetCurrent(NULL) from no context; the previous device "
                 "is known to the loop, not looked up (favours cuda.core)",
    "cuda_bindings": "push+pop restores by popping; retain+push+pop+release as a naive guard does it",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("group")
    ap.add_argument("--out", required=True)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--sim", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cpu", type=int, help="pin this process to one CPU (not the threads group)")
    args = ap.parse_args()
    pinned = None
    if args.cpu is not None and args.group != "threads" and hasattr(os, "sched_setaffinity"):
        # Every single-threaded group on the same CPU: no migrations mid-round, and the
        # processes compared with each other ran where each other ran.
        os.sched_setaffinity(0, {args.cpu})
        pinned = args.cpu
    if args.sim:
        from cyctx.testing import use_simulated_driver

        use_simulated_driver(2)  # before any driver call in this process
    sys.path.insert(0, args.build_dir)
    timer = Timer(args.quick)
    t0 = time.perf_counter()
    try:
        if args.group.startswith("peer:"):
            result = group_peer(args, timer, args.group[5:])
        else:
            result = {"core": group_core, "threads": group_threads, "memory": group_memory}[args.group](args, timer)
        result.setdefault("status", "ok")
    except Exception as exc:
        result = {"status": f"error: {type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    result.update(group=args.group, pid=os.getpid(), cpu=pinned, seconds=round(time.perf_counter() - t0, 2))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0 if result["status"] == "ok" or result["status"].startswith("missing") else 1


if __name__ == "__main__":
    sys.exit(main())
