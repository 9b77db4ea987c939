"""The cost per task of the three ways to run tasks in a device's context on a thread pool
(docs/thread-pools.md): bind per task, a pool initializer, a guard per worker; each beside the
same tasks with no context work, on one pool of the same size.

    python bench/pools.py --sim [--quick]      # the simulated driver (any machine)
    python bench/pools.py [--device 0]         # the real driver (a GPU machine)

Prints one JSON object: for each pattern, the median over repeats of the time per task (ns) and
the same minus the no-context baseline. Timings only: nothing here is an assertion.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sim", action="store_true", help="use cyctx's simulated driver")
    ap.add_argument("--quick", action="store_true", help="few tasks (a smoke run)")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args(argv)
    if args.sim:
        from cyctx.testing import use_simulated_driver

        use_simulated_driver(2)  # before any driver call
    from cuda.bindings import driver

    import cyctx

    n, repeats = (200, 3) if args.quick else (20000, 7)
    dev = args.device
    shared = cyctx.device(dev)  # holds the primary context's retain for the process

    def task(i):
        return i

    def set_current():  # the initializer pattern: the worker keeps the context current
        (err,) = driver.cuCtxSetCurrent(shared.context)
        assert err == driver.CUresult.CUDA_SUCCESS, err

    local = threading.local()

    def guarded(i):  # a guard per worker, entered around each task
        g = getattr(local, "guard", None)
        if g is None:
            g = local.guard = cyctx.ContextGuard(dev)
        with g:
            return i

    bound = cyctx.bind(task, device=dev)
    patterns = {
        "baseline": (lambda: task, None),
        "bind_once": (lambda: bound, None),
        "bind_per_task": (lambda: cyctx.bind(task, device=dev), None),
        "initializer": (lambda: task, set_current),
        "guard_per_worker": (lambda: guarded, None),
    }
    out = {"driver": "simulated" if args.sim else "real", "tasks": n, "workers": args.workers}
    for name, (make, init) in patterns.items():
        runs = []
        for _ in range(repeats):
            with ThreadPoolExecutor(args.workers, initializer=init) as pool:
                list(pool.map(make(), range(args.workers * 4)))  # start every worker first
                t0 = time.perf_counter_ns()
                futures = [pool.submit(make(), i) for i in range(n)]
                for f in futures:
                    f.result()
                runs.append((time.perf_counter_ns() - t0) / n)
        out[name] = {"ns_per_task": round(statistics.median(runs), 1)}
    base = out["baseline"]["ns_per_task"]
    for name in patterns:
        out[name]["over_baseline_ns"] = round(out[name]["ns_per_task"] - base, 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
