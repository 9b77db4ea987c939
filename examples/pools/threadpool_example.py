"""GPU tasks for every device on a concurrent.futures.ThreadPoolExecutor, each task inside its
device's guard, cyctx.device(k); then every pool thread is visited to show what it was left with.

    python examples/pools/threadpool_example.py [--tasks N] [--workers N] [--simulate]

Prints one line per device and a verdict; exit status 0 when every task ran on its device and
no pool thread was left with a context current or a guard entered.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def visit_every_thread(pool: cf.ThreadPoolExecutor, workers: int, fn):
    """Run ``fn`` once on each of the pool's ``workers`` threads: the calls wait for each other
    at a barrier, so no thread can take two."""
    barrier = threading.Barrier(workers)

    def at_barrier():
        barrier.wait(timeout=60)
        return fn()

    return [f.result() for f in [pool.submit(at_barrier) for _ in range(workers)]]


def run(tasks: int = 64, workers: int = 4, devices: list[int] | None = None) -> dict:
    from pool_tasks import device_count, device_task, thread_state

    devices = devices if devices is not None else list(range(device_count()))
    with cf.ThreadPoolExecutor(max_workers=workers) as pool:
        visit_every_thread(pool, workers, lambda: None)  # start all the threads
        results = list(
            pool.map(device_task, [devices[i % len(devices)] for i in range(tasks)], range(tasks))
        )
        states = visit_every_thread(pool, workers, thread_state)
    return {"devices": devices, "results": results, "threads": states}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=64)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--simulate", action="store_true", help="on cyctx's simulated driver (no GPU)")
    args = p.parse_args(argv)
    if args.simulate:
        from cyctx.testing import use_simulated_driver

        use_simulated_driver(2)
    out = run(args.tasks, args.workers)
    for dev in out["devices"]:
        n = sum(r["device"] == dev for r in out["results"])
        threads = len({r["thread"] for r in out["results"] if r["device"] == dev})
        print(f"device {dev}: {n} tasks, on {threads} thread{'s' if threads != 1 else ''}")
    left = [s for s in out["threads"] if s["current"] or s["open_entries"]]
    print(
        f"pool threads: {len(out['threads'])}; left with a context current or a guard entered: {len(left)}"
    )
    if out["threads"][0]["retains"] is not None:
        print(
            f"primary context retains in this process (simulated driver): {out['threads'][0]['retains']}"
        )
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
