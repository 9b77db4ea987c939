"""Thread scaling: each of 1 to 16 OpenMP threads runs the same nogil loop (weak scaling),
from bench/_bench.pyx's threaded(); aggregate ns per operation at each thread count."""

import os
import statistics
import time

THREAD_COUNTS = (1, 2, 4, 8, 16)
# (row id, _bench.threaded kind, which context each thread starts from)
THREAD_KINDS = (
    ("guard.fast", "guard", "fast"),
    ("guard.switch", "guard", "from_none"),
    ("driver.pushpop", "pushpop", "from_none"),
    ("switch.fast", "switch", "fast"),
    ("driver.getid", "getid", "fast"),
)


def run(h):
    import cyctx

    bench, timer = h.bench, h.timer
    g0 = cyctx.ContextGuard(0)
    starts = {"fast": g0.handle, "from_none": 0}
    round_s = 0.0005 if h.quick else 0.01
    rounds = 2 if h.quick else 5
    rows = []
    for kind_id, kind, path in THREAD_KINDS:
        start = starts[path]

        def loop(n, t=1, kind=kind, start=start):
            bench.threaded(kind, g0, start, t, n)

        # Weak scaling: the same work per thread at every thread count, sized on one thread.
        n = timer.calibrate(loop, round_s=round_s)
        loop(n, THREAD_COUNTS[-1])  # warm-up: the whole team started, the clocks up
        for t in THREAD_COUNTS:
            loop(max(n // 10, 1), t)  # warm-up: starts the team, first-touch of each thread's state
            samples = []
            for _ in range(rounds):
                t0 = time.perf_counter_ns()
                loop(n, t)
                samples.append((time.perf_counter_ns() - t0) / (n * t))
            rows.append(
                {
                    "id": kind_id,
                    "kind": kind,
                    "path": path,
                    "threads": t,
                    "team": bench.team_size(t),
                    "n_per_thread": n,
                    "rounds": rounds,
                    "aggregate_ns_per_op": round(statistics.median(samples), 3),
                }
            )
    # The same work on this process's main thread, outside any OpenMP region: tells a
    # difference between the harness's one thread and the core group's loop apart from one
    # between processes.
    plain = timer.measure_many(
        [
            (lambda n: bench.guard_loop(g0, n), lambda: bench.set_current(starts["fast"])),
            (lambda n: bench.pushpop(starts["fast"], n), lambda: bench.set_current(0)),
        ]
    )
    bench.set_current(0)
    restored = cyctx.current_handle() == 0
    g0.close()
    return {
        "rows": rows,
        "restored": restored,
        "cpu_count": os.cpu_count(),
        "main_thread_no_openmp_ns": {
            "guard.fast": plain[0].get("ns"),
            "driver.pushpop": plain[1].get("ns"),
        },
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
