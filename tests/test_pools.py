"""Thread pools and Dask (examples/pools/, docs/thread-pools.md): tasks for several devices,
each inside its device's guard, cyctx.device(k), on a concurrent.futures pool and on a
dask.distributed LocalCluster of process workers with several threads each. Every pool thread
is visited afterwards: none may be left with a context current or a guard entered, and no
retain may leak. Each run is a child process (the shared guards live for the process)."""

import json
import os
import textwrap

import pytest
from helpers.children import run_child
from helpers.drivers import KIND

POOLS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "pools"
)
pytestmark = pytest.mark.skipif(
    not os.path.isdir(POOLS), reason="needs the source tree's examples/"
)


def _child(code, timeout=300):
    proc = run_child(
        f"import sys; sys.path.insert(0, {POOLS!r})\n" + textwrap.dedent(code), timeout=timeout
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_thread_pool_with_tasks_for_several_devices():
    out = _child("""
    import concurrent.futures as cf, json
    from threadpool_example import run, visit_every_thread
    from pool_tasks import careless_task, device_task, thread_state
    res = run(tasks=64, workers=4, devices=[0, D1])
    # The check below can fail: a careless task leaves its context current on its thread,
    # and the next visit finds it there.
    with cf.ThreadPoolExecutor(max_workers=3) as pool:
        visit_every_thread(pool, 3, lambda: None)
        leaker = pool.submit(careless_task, D1).result()
        leaked = visit_every_thread(pool, 3, thread_state)
    print(json.dumps({"run": res, "leaker": leaker, "leaked": leaked}))
    """)
    res = out["run"]
    assert sorted({r["device"] for r in res["results"]}) == sorted({0, out["run"]["devices"][-1]})
    assert len(res["results"]) == 64 and all(
        r["before"] == 0 and r["after"] == 0 for r in res["results"]
    )
    assert len(res["threads"]) == 4 and len({s["thread"] for s in res["threads"]}) == 4
    assert [(s["current"], s["open_entries"]) for s in res["threads"]] == [(0, 0)] * 4
    if KIND == "sim":  # one retain per device the process used: the shared guard's
        assert res["threads"][0]["retains"] == [1, 1]
    dirty = [s for s in out["leaked"] if s["current"] or s["open_entries"]]
    assert [s["thread"] for s in dirty] == [out["leaker"]] and dirty[0]["open_entries"] == 1


def test_threadpool_example_script():
    import subprocess
    import sys

    args = ["--simulate"] if KIND == "sim" else []
    proc = subprocess.run(
        [sys.executable, os.path.join(POOLS, "threadpool_example.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "left with a context current or a guard entered: 0" in proc.stdout


@pytest.mark.slow
def test_dask_local_cluster_with_process_workers_and_threads():
    pytest.importorskip(
        "distributed", reason="dask[distributed] is not installed (pip install '.[dask]')"
    )
    out = _child(f"""
    import json
    from dask_example import cluster, run, visit_every_worker_thread
    from pool_tasks import careless_task
    lc, client = cluster(workers=2, threads=3, simulate={KIND == "sim"!r})
    try:
        res = run(client, tasks=48)
        first = sorted(client.nthreads())[0]
        leaker = client.submit(careless_task, 0, workers=[first], pure=False).result()
        leaked = visit_every_worker_thread(client)
    finally:
        client.close()
        lc.close()
    print(json.dumps({{"run": res, "leaker": leaker, "leaked": leaked}}))
    """)
    res = out["run"]
    n = res["device_count"]
    assert len({r["pid"] for r in res["named"]}) == 2, "both worker processes ran tasks"
    assert all(r["before"] == 0 and r["after"] == 0 for r in res["named"] + res["picked"])
    # The worker picks its device from its number: worker w works on device w % n only.
    assert all(r["device"] == int(r["worker"]) % n for r in res["picked"])
    threads = res["threads"]
    assert len(threads) == 6 and len({(s["pid"], s["thread"]) for s in threads}) == 6
    assert [(s["current"], s["open_entries"]) for s in threads] == [(0, 0)] * 6
    if KIND == "sim":
        # The simulated driver reached the worker processes (they report its counters), and
        # each holds one retain per device it used, its shared guard's: none leaked.
        for s in threads:
            assert s["retains"] is not None and all(r in (0, 1) for r in s["retains"])
            assert s["retains"][int(s["worker"]) % n] == 1
    dirty = [s for s in out["leaked"] if s["current"] or s["open_entries"]]
    assert [s["thread"] for s in dirty] == [out["leaker"]], (
        "the visit finds a careless task's context"
    )


@pytest.mark.slow
def test_dask_task_closing_over_a_shared_guard_gets_the_workers_own():
    # What users write: a task (a closure, cloudpickled by Dask) that uses `cyctx.device(k)`
    # from the client's process. Each worker process unpickles it as ITS shared guard of k.
    pytest.importorskip(
        "distributed", reason="dask[distributed] is not installed (pip install '.[dask]')"
    )
    out = _child(f"""
    import json, os, cyctx
    from dask_example import cluster
    lc, client = cluster(workers=2, threads=2, simulate={KIND == "sim"!r})
    try:
        guard = cyctx.device(D1)
        def task(i):
            with guard:
                inside = cyctx.current_device()
            return {{"pid": os.getpid(), "same": guard is cyctx.device(D1),
                     "shared": guard.is_shared, "inside": inside,
                     "after": cyctx.current_device()}}
        res = client.gather(client.map(task, range(16), pure=False))
        held = client.submit(lambda g: g.device, guard, pure=False).result()
    finally:
        client.close()
        lc.close()
    print(json.dumps({{"res": res, "held": held, "D1": D1, "pid": os.getpid()}}))
    """)
    res = out["res"]
    assert len(res) == 16 and out["held"] == out["D1"]
    assert all(r["pid"] != out["pid"] for r in res), "ran in the workers"
    assert all(r["same"] and r["shared"] for r in res)
    assert all(r["inside"] == out["D1"] and r["after"] is None for r in res)
