"""Memory: millions of enter/exit cycles per path, nogil and from Python, with the RSS before
and after each, then a check that every retain was released and no entry was left open.

Its own process: the check that no primary context is left active only means something in a
process that nothing else retained in."""

import os
import time
from functools import partial

from .from_python import with_object


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def run(h):
    from cuda.bindings import driver as d

    import cyctx
    from cyctx._guard import open_entries
    from cyctx.testing import simulated

    bench = h.bench
    sim = simulated()
    d.cuInit(0)
    ndev = d.cuDeviceGetCount()[1]
    guards = [cyctx.ContextGuard(i) for i in range(ndev)]
    g0 = guards[0]
    h0 = g0.handle
    cycles = 100_000 if h.quick else 10_000_000
    py_cycles = 10_000 if h.quick else 1_000_000
    loop = partial(with_object, g0)
    bench.guard_loop(g0, 10_000)  # warm-up: this thread's entry stack and the driver's state
    loop(10_000)
    runs = []
    for label, start, fn, k in (
        (
            "cython guard.enter()/exit(), switching from no context",
            0,
            partial(bench.guard_loop, g0),
            cycles,
        ),
        ("cython guard.enter()/exit(), already current", h0, partial(bench.guard_loop, g0), cycles),
        ("python with guard:, switching from no context", 0, loop, py_cycles),
    ):
        bench.set_current(start)
        before = rss_kib()
        t0 = time.perf_counter()
        fn(k)
        secs = time.perf_counter() - t0
        after = rss_kib()
        runs.append(
            {
                "what": label,
                "cycles": k,
                "seconds": round(secs, 3),
                "rss_kib_before": before,
                "rss_kib_after": after,
                "growth_kib": after - before,
                "restored": cyctx.current_handle() == start,
            }
        )
        bench.set_current(0)
    open_entries = open_entries()
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
        "balanced": not any(active)
        and open_entries == 0
        and (retains_after is None or not any(retains_after))
        and (retains_during is None or retains_during == [1] * ndev),
        "check": "every guard closed; no device's primary context is still active (nothing else "
        "in this process retained one), no guard entry left open"
        + ("; the simulated driver's refcounts are 1 during and 0 after" if sim else ""),
    }
