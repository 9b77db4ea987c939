"""What the guard costs on this interpreter, for comparing a free-threaded CPython (GIL off) with
a GIL build: one process, one line of JSON, ns per enter+exit (aggregate ns per operation for
the 16-thread rows).

    python bench/free_threading.py [--sim] [--build-dir DIR] [--rounds N]

Rows: `with guard:` and `with cyctx.device(0):` from Python; the nogil enter()/exit() from
Cython (bench/_bench.pyx's guard_loop); 16 Python threads each running `with guard:` (one guard
shared); 16 OpenMP threads each running the nogil loop (_bench.threaded). Each row is the median
of --rounds rounds of about 20 ms, the rows interleaved round by round so that they share the
machine's conditions. Run it with each interpreter in turn, on the same machine, and take the
ratios (docs/evidence.md, "Free-threading"). `--sim`: the simulated driver (no GPU; then the
driver calls are the simulator's, and the figures say what cyctx and the interpreter add).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import sysconfig
import tempfile
import threading
import time

from harness import Timer, built

THREADS = 16


def with_loop(cm, n):
    for _ in range(n):
        with cm:
            pass


def device_loop(cyctx, n):
    device = cyctx.device
    for _ in range(n):
        with device(0):
            pass


def python_threads(g, n):
    """THREADS threads, each `with g:` n times, started together."""
    start = threading.Barrier(THREADS + 1)

    def body():
        start.wait()
        with_loop(g, n)

    ts = [threading.Thread(target=body) for _ in range(THREADS)]
    for t in ts:
        t.start()
    start.wait()
    for t in ts:
        t.join()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sim", action="store_true", help="cyctx's simulated driver (no GPU needed)")
    ap.add_argument("--build-dir", help="where _bench is compiled (default: a scratch folder)")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    # OpenMP's idle threads sleep at once rather than spin: on a machine with fewer CPUs than
    # THREADS, spinning ones would take the CPUs from the rows timed after theirs.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    if args.sim:
        from cyctx.testing import use_simulated_driver

        use_simulated_driver(2)  # before any driver call in this process
    import cyctx

    bench = built(args.build_dir or tempfile.mkdtemp(prefix="cyctx-ft-bench-"))
    g = cyctx.ContextGuard(0)
    with g:  # the threads start from no context, each row from the same state
        pass
    # name: (the loop, its threads, the single-threaded row whose size each thread takes: the
    # same work per thread as that row does alone, so no thread start-up is timed as work)
    rows = {
        "with guard": (lambda n: with_loop(g, n), 1, None),
        "with cyctx.device(0)": (lambda n: device_loop(cyctx, n), 1, None),
        "nogil enter+exit": (lambda n: bench.guard_loop(g, n), 1, None),
        f"with guard, {THREADS} Python threads": (
            lambda n: python_threads(g, n),
            THREADS,
            "with guard",
        ),
        f"nogil, {THREADS} OpenMP threads": (
            lambda n: bench.threaded("guard", g, 0, THREADS, n),
            THREADS,
            "nogil enter+exit",
        ),
    }
    calibrate = Timer(quick=False).calibrate  # rounds of about 20 ms
    sizes = {name: calibrate(fn) for name, (fn, _, like) in rows.items() if like is None}
    sizes.update({name: sizes[like] for name, (_, _, like) in rows.items() if like is not None})
    values = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, (fn, threads, _) in rows.items():
            n = sizes[name]
            t0 = time.perf_counter()
            fn(n)
            values[name].append((time.perf_counter() - t0) / (n * threads) * 1e9)
    g.close()
    gil = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
    print(
        json.dumps(
            {
                "python": platform.python_version()
                + ("t" if sysconfig.get_config_var("Py_GIL_DISABLED") else ""),
                "gil": gil,
                "cyctx": cyctx.__version__,
                "driver": "simulated" if args.sim else "real",
                "cpus": len(os.sched_getaffinity(0)),
                "ns": {name: round(statistics.median(v), 1) for name, v in values.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
