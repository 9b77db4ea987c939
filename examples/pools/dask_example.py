"""GPU tasks on a dask.distributed LocalCluster of process workers with several threads each.

    python examples/pools/dask_example.py [--workers N] [--threads N] [--tasks N] [--simulate]

Two ways to give a task its device, both inside the device's guard of the worker process,
``cyctx.device(k)``:

* the task names its device (``client.map(device_task, devices, ...)``);
* the worker picks it: each worker takes device ``(worker number) % (device count)`` from its
  name (``worker_device``), so that one process works on one GPU, as dask-cuda arranges with
  ``CUDA_VISIBLE_DEVICES``.

Then every thread of every worker is visited: none may be left with a context current or a
guard entered. With ``--simulate`` the workers run on cyctx's simulated driver: a worker plugin
selects it in each worker process before that process's first driver call.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from distributed import Client, LocalCluster, WorkerPlugin, get_worker  # noqa: E402


class SimulatedDriver(WorkerPlugin):
    """Routes a worker process's driver calls to cyctx's simulated driver (for tests without a
    GPU). Runs when the worker starts, before any task can call the driver."""

    def __init__(self, device_count: int = 2) -> None:
        self.device_count = device_count

    def setup(self, worker) -> None:
        from cyctx.testing import use_simulated_driver

        use_simulated_driver(self.device_count)


def worker_device() -> int:
    """This worker's device: its number (LocalCluster names workers 0, 1, ...) modulo the
    device count."""
    from pool_tasks import device_count

    return int(get_worker().name) % device_count()


def task_on_worker_device(i: int) -> dict:
    from pool_tasks import device_task

    return {**device_task(worker_device(), i), "worker": get_worker().name, "pid": os.getpid()}


def task_on_named_device(device: int, i: int) -> dict:
    from pool_tasks import device_task

    return {**device_task(device, i), "worker": get_worker().name, "pid": os.getpid()}


def _state_at_barrier(token: str, nthreads: int) -> dict:
    # One Barrier per worker process and visit, kept on the worker object (a task's globals are
    # its own copy): dict.setdefault is atomic, so every thread of the worker gets the same one.
    from pool_tasks import thread_state

    barriers = get_worker().__dict__.setdefault("_pool_example_barriers", {})
    barriers.setdefault(token, threading.Barrier(nthreads)).wait(timeout=60)
    return {**thread_state(), "worker": get_worker().name, "pid": os.getpid()}


def visit_every_worker_thread(client: Client) -> list[dict]:
    """thread_state() of every thread of every worker: per worker, one task per thread, held at
    a barrier until all of them run, so that no thread takes two."""
    token = uuid.uuid4().hex
    futures = []
    for addr, nthreads in client.nthreads().items():
        futures += [
            client.submit(
                _state_at_barrier,
                token,
                nthreads,
                workers=[addr],
                allow_other_workers=False,
                pure=False,
            )
            for _ in range(nthreads)
        ]
    return client.gather(futures)


def cluster(workers: int, threads: int, simulate: bool) -> tuple[LocalCluster, Client]:
    lc = LocalCluster(
        n_workers=workers,
        threads_per_worker=threads,
        processes=True,
        dashboard_address=None,
        worker_dashboard_address=None,
    )
    client = Client(lc)
    if simulate:
        client.register_plugin(SimulatedDriver())
    return lc, client


def run(client: Client, tasks: int) -> dict:
    from pool_tasks import device_count

    n = client.submit(device_count, pure=False).result()
    named = client.gather(
        client.map(task_on_named_device, [i % n for i in range(tasks)], range(tasks), pure=False)
    )
    picked = client.gather(client.map(task_on_worker_device, range(tasks), pure=False))
    return {
        "device_count": n,
        "named": named,
        "picked": picked,
        "threads": visit_every_worker_thread(client),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--tasks", type=int, default=64)
    p.add_argument("--simulate", action="store_true", help="on cyctx's simulated driver (no GPU)")
    args = p.parse_args(argv)
    lc, client = cluster(args.workers, args.threads, args.simulate)
    try:
        out = run(client, args.tasks)
    finally:
        client.close()
        lc.close()
    for key, what in (
        ("named", "the task names its device"),
        ("picked", "the worker picks its device"),
    ):
        per = {}
        for r in out[key]:
            per.setdefault(r["worker"], set()).add(r["device"])
        print(
            f"{what}: "
            + ", ".join(f"worker {w} ran devices {sorted(d)}" for w, d in sorted(per.items()))
        )
    left = [s for s in out["threads"] if s["current"] or s["open_entries"]]
    print(
        f"worker threads: {len(out['threads'])}; left with a context current or a guard entered: {len(left)}"
    )
    for worker, retains in sorted({s["worker"]: s["retains"] for s in out["threads"]}.items()):
        if retains is not None:
            print(
                f"  worker {worker}: primary context retains per device (simulated driver) {retains}"
            )
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
