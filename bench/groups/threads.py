"""Thread scaling: each of 1 to 16 OpenMP threads runs the same nogil loop (weak scaling),
from bench/_bench.pyx's threaded(); aggregate time per operation at each thread count."""

import os
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
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out = []
    for kind_id, kind, path in THREAD_KINDS:
        start = starts[path]

        def loop(n, t=1, kind=kind, start=start):
            bench.threaded(kind, g0, start, t, n)

        # Weak scaling: the same work per thread at every thread count, sized on one thread.
        n = timer.calibrate(loop, round_s=round_s)
        loop(n, THREAD_COUNTS[-1])  # warm-up: the whole team started, the clocks up
        for t in THREAD_COUNTS:
            loop(max(n // 10, 1), t)  # warm-up: starts the team, first-touch of each thread's state
            values = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                loop(n, t)
                values.append((time.perf_counter() - t0) / (n * t))
            meta = {
                "group": "threads",
                "row": kind_id,
                "kind": kind,
                "path": path,
                "threads": t,
                "team": bench.team_size(t),
                "usable_cpus": usable,
                "inner_loops": t,
            }
            out.append(h.benchmark(f"threads/{kind_id}/{t}", values, n, meta))
    # The same work on this process's main thread, outside any OpenMP region: tells a
    # difference between the harness's one thread and the nogil group's loop apart from one
    # between processes.
    plain = (
        ("guard.fast", lambda n: bench.guard_loop(g0, n), starts["fast"]),
        ("driver.pushpop", lambda n: bench.pushpop(starts["fast"], n), 0),
    )
    timed = timer.rounds_of([(fn, lambda s=start: bench.set_current(s)) for _, fn, start in plain])
    for (row, _, _), (n, warm, values) in zip(plain, timed, strict=True):
        meta = {"group": "threads", "row": row, "threads": 1, "openmp": "no", "usable_cpus": usable}
        out.append(h.benchmark(f"threads/{row}/main", values, n, meta, warm))
    bench.set_current(0)
    if cyctx.current_handle() != 0:
        raise RuntimeError("the thread group left a context current on its main thread")
    g0.close()
    return out
