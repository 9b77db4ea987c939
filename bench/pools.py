"""The cost per task of the three ways to run tasks in a device's context on a thread pool
(docs/thread-pools.md): bind per task, a pool initializer, a guard per worker; each beside the
same tasks with no context work, on one pool of the same size. Then the cost per call, on one
thread, of what crosses those boundaries: a bound function's call beside the plain call,
making a binding, the context epoch, cuda_initialized() and a relaxed_capture() block.

    python bench/pools.py --sim [--quick]                 # the simulated driver (any machine)
    python bench/pools.py --device 0 --out results/pools  # the real driver (a GPU machine)

Prints one JSON object on stdout and the same figures as a table on stderr; --out PREFIX also
writes PREFIX.json and PREFIX.txt. For each pool pattern: the median over repeats of the time
per task (ns) and the same minus the no-context baseline; for each call: the median ns per
call. Timings only: nothing here is an assertion.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sim", action="store_true", help="use cyctx's simulated driver")
    ap.add_argument("--quick", action="store_true", help="few tasks (a smoke run)")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--out", metavar="PREFIX", help="also write PREFIX.json and PREFIX.txt")
    args = ap.parse_args(argv)
    if args.sim:
        from cyctx.testing import use_simulated_driver

        use_simulated_driver(2)  # before any driver call
    from cuda.bindings import driver

    import cyctx

    n, repeats = (200, 3) if args.quick else (20000, 7)
    dev = args.device
    shared = cyctx.device(dev)
    with shared:  # its first use: the primary context's retain, held for the process
        pass

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
    out["calls"] = calls(cyctx, dev, task, bound, 2000 if args.quick else 200000, repeats)
    shared_h = shared.handle
    out["device"] = dev
    out["context"] = hex(shared_h)
    text = json.dumps(out, indent=1)
    print(text)
    table = render(out, list(patterns))
    print(table, file=sys.stderr)
    if args.out:
        with open(args.out + ".json", "w") as f:
            f.write(text + "\n")
        with open(args.out + ".txt", "w") as f:
            f.write(table + "\n")


def per_call(fn, n, repeats):
    """Median over repeats of ns per fn() call, the loop's own cost included (the
    "plain_call" row is that loop around a plain function)."""
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter_ns() - t0) / n)
    return round(statistics.median(runs), 1)


def calls(cyctx, dev, task, bound, n, repeats):
    """ns per call on this thread: bind's per-task cost, the epoch, cuda_initialized,
    relaxed_capture. Made with nothing current on the thread, as a pool's worker starts."""
    guard = cyctx.device(dev)
    handle = guard.handle
    relaxed = cyctx.relaxed_capture

    def relaxed_block():
        with relaxed():
            pass

    rows = {
        "plain_call": lambda: task(1),
        "bound_call": lambda: bound(1),
        "bind_and_call": lambda: cyctx.bind(task, device=dev)(1),
        "guard_epoch": lambda: guard.epoch,
        "context_epoch_of_handle": lambda: cyctx.context_epoch(handle),
        "relaxed_capture_block": relaxed_block,
    }
    out = {name: per_call(fn, n, repeats) for name, fn in rows.items()}
    # cuda_initialized() reads /proc/self/maps and asks the driver through ctypes: far slower
    # per call, so fewer calls.
    out["cuda_initialized"] = per_call(cyctx.cuda_initialized, max(20, n // 200), repeats)
    return out


def render(out, patterns):
    lines = [
        f"bench/pools.py: {out['driver']} driver, device {out['device']}, "
        f"{out['workers']} workers, {out['tasks']} tasks per run",
        "",
        f"{'pool pattern':<24}{'ns/task':>12}{'over baseline':>16}",
    ]
    for name in patterns:
        r = out[name]
        lines.append(f"{name:<24}{r['ns_per_task']:>12.1f}{r['over_baseline_ns']:>16.1f}")
    lines += ["", f"{'call (one thread)':<24}{'ns/call':>12}"]
    for name, ns in out["calls"].items():
        lines.append(f"{name:<24}{ns:>12.1f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
