"""ContextGuard cost against the driver floor and the Python floor, and thread scaling.

    python bench/bench_guard.py [--quick] [--out bench/results/guard-<tag>.json]

Builds bench/_bench.pyx in place (against the installed cyctx), then measures, per
enter+exit, the median of repeated rounds after a warm-up, all in one process:
  * driver floor: cuCtxPushCurrent+cuCtxPopCurrent and retain+push+pop+release in nogil loops,
    and cuCtxSetCurrent(A)+cuCtxSetCurrent(B) (what a guard's switch costs at the driver);
  * cyctx from Cython, nogil enter()/exit() and switch_to()/switch_back(), switching
    (from no context, and from another device's context) and already current;
  * cyctx from Python, `with guard:` both paths, and an empty extension type's `with`;
  * thread scaling 1..16 threads: guard fast path, guard switching, raw push/pop.
Prints a table and writes JSON with the machine, GPU, driver and package versions.
On the simulated driver (--sim) the numbers only prove the script runs.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def build():
    subprocess.run(
        [sys.executable, "-c", (
            "import cyctx\n"
            "from Cython.Build import cythonize\n"
            "from setuptools import Extension, setup\n"
            "ext = Extension('_bench', ['_bench.pyx'], include_dirs=cyctx.get_include(), language='c++',"
            " extra_compile_args=['-O2', '-fopenmp'], extra_link_args=['-fopenmp'])\n"
            "setup(name='_bench', ext_modules=cythonize([ext], quiet=True), script_args=['build_ext', '--inplace', '-q'])\n"
        )],
        cwd=HERE, check=True,
    )
    sys.path.insert(0, HERE)


def median_ns(fn, n, rounds):
    fn(max(n // 10, 1))  # warm-up
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        fn(n)
        samples.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(samples)


def versions():
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for mod in ("cyctx", "cuda.bindings", "Cython"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            out[mod] = getattr(m, "__version__", "?")
        except ImportError:
            out[mod] = None
    from cuda.bindings import driver as d

    err, v = d.cuDriverGetVersion()
    out["driver_cuda_version"] = v
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
        out["gpus"] = smi
    except (OSError, subprocess.SubprocessError):
        out["gpus"] = None
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="few iterations (smoke run)")
    ap.add_argument("--sim", action="store_true", help="run on cyctx's simulated driver")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.sim:
        from cyctx.testing import use_simulated_driver

        use_simulated_driver(device_count=2)
    build()
    import _bench
    from cuda.bindings import driver as d

    import cyctx

    n, rounds = (20_000, 3) if args.quick else (2_000_000, 7)
    d.cuInit(0)
    ndev = d.cuDeviceGetCount()[1]
    g0 = cyctx.ContextGuard(0)
    g1 = cyctx.ContextGuard(1) if ndev > 1 else None
    h0 = g0.handle
    other = g1.handle if g1 else None
    rows = []

    def row(name, ns, note=""):
        rows.append({"name": name, "ns": round(ns, 1), "note": note})

    def with_ctx(start, fn):
        # Run fn with `start` current on this thread (0: none), then restore none.
        _bench.set_current(start)
        try:
            return fn()
        finally:
            _bench.set_current(0)

    row("driver: push+pop (from no context)", with_ctx(0, lambda: median_ns(lambda k: _bench.pushpop(h0, k), n, rounds)))
    if other:
        row("driver: push+pop (over dev1's context)", with_ctx(other, lambda: median_ns(lambda k: _bench.pushpop(h0, k), n, rounds)))
        row("driver: SetCurrent(dev0)+SetCurrent(dev1)", with_ctx(other, lambda: median_ns(lambda k: _bench.setset(h0, other, k), n, rounds)))
    row("driver: retain+push+pop+release", with_ctx(0, lambda: median_ns(lambda k: _bench.full(0, k), n // 4, rounds)))
    row("driver: cuCtxGetCurrent", median_ns(_bench.getcurrent, n, rounds))
    row("cython: guard enter+exit, switching from no context", with_ctx(0, lambda: median_ns(lambda k: _bench.guard_loop(g0, k), n, rounds)))
    if other:
        row("cython: guard enter+exit, switching from dev1", with_ctx(other, lambda: median_ns(lambda k: _bench.guard_loop(g0, k), n, rounds)))
    row("cython: guard enter+exit, already current", with_ctx(h0, lambda: median_ns(lambda k: _bench.guard_loop(g0, k), n, rounds)))
    row("cython: switch_to+switch_back, switching from no context", with_ctx(0, lambda: median_ns(lambda k: _bench.switch_loop(h0, k), n, rounds)))
    row("cython: switch_to+switch_back, already current", with_ctx(h0, lambda: median_ns(lambda k: _bench.switch_loop(h0, k), n, rounds)))
    pn = n // 4
    row("python: empty extension-type with", median_ns(lambda k: _bench.py_with(_bench.Empty(), k), pn, rounds))
    row("python: with guard, already current", with_ctx(h0, lambda: median_ns(lambda k: _bench.py_with(g0, k), pn, rounds)))
    row("python: with guard, switching from no context", with_ctx(0, lambda: median_ns(lambda k: _bench.py_with(g0, k), pn, rounds)))

    threads = []
    tn = n // 4
    for t in (1, 2, 4, 8, 16):
        for kind, start, label in (("guard", h0, "guard fast path"), ("guard", 0, "guard switching"),
                                   ("pushpop", 0, "driver push+pop")):
            def run(k, kind=kind, start=start, t=t):
                _bench.threaded(kind, g0, start, t, k)
            samples = []
            run(tn // 10)
            for _ in range(max(rounds // 2, 1)):
                t0 = time.perf_counter_ns()
                run(tn)
                samples.append((time.perf_counter_ns() - t0) / (tn * t))
            threads.append({"threads": t, "what": label, "aggregate_ns_per_op": round(statistics.median(samples), 2)})

    by = {r["name"]: r["ns"] for r in rows}
    ratios = {
        "python_with_vs_empty_with (target <= 1.3)": by["python: with guard, already current"] / by["python: empty extension-type with"],
        "cython_switching_vs_pushpop (target <= 1.10)": by["cython: guard enter+exit, switching from no context"] / by["driver: push+pop (from no context)"],
        "cython_fast_vs_pushpop (target <= 0.5)": by["cython: guard enter+exit, already current"] / by["driver: push+pop (from no context)"],
    }
    if other:
        ratios["cython_switching_from_dev1_vs_pushpop_over_dev1 (target <= 1.10)"] = (
            by["cython: guard enter+exit, switching from dev1"] / by["driver: push+pop (over dev1's context)"])
    one = {x["what"]: x["aggregate_ns_per_op"] for x in threads if x["threads"] == 1}
    sixteen = {x["what"]: x["aggregate_ns_per_op"] for x in threads if x["threads"] == 16}
    ratios["guard_fast_path_16_threads_speedup (target >= 10)"] = one["guard fast path"] / sixteen["guard fast path"]

    print(f"\n{'what':64s} {'ns per enter+exit':>18s}")
    for r in rows:
        print(f"{r['name']:64s} {r['ns']:18.1f}")
    print(f"\n{'threads':>7s} {'what':24s} {'aggregate ns/op':>16s}")
    for x in threads:
        print(f"{x['threads']:7d} {x['what']:24s} {x['aggregate_ns_per_op']:16.2f}")
    print()
    for k, v in ratios.items():
        print(f"{k:70s} {v:6.2f}")

    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "driver": "simulated" if args.sim else "real",
        "iterations": n, "rounds": rounds, "versions": versions(),
        "rows": rows, "threads": threads, "ratios": {k: round(v, 3) for k, v in ratios.items()},
    }
    out = args.out or os.path.join(HERE, "results", f"guard-{'sim' if args.sim else 'real'}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out}")
    g0.close()
    if g1:
        g1.close()


if __name__ == "__main__":
    main()
