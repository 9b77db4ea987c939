"""Load test: many threads, two devices, randomly nested guards, random exceptions.

    python bench/stress.py [--threads 16] [--pairs 1000000] [--seed 1] [--sim] [--edges] [--out FILE.json]

Every thread nests guards of random devices to a random depth, raises random exceptions from
inside (some caught at an inner level, some at the top), and after every exit checks that the
thread's current context is what it was before that enter. Reports violations (must be 0),
the retain balance (the simulated driver's counters, or the primary contexts' active flags
on a real driver once the guards are closed), and RSS before and after (must stay flat).

--edges adds, inside random blocks, the edges of docs/guarantees.md: ContextGuard.shared()
blocks, guards freed while entered (orphaned entries, dropped by the enclosing exit), and
generators abandoned inside a guard and collected under another (a late exit, spliced and
reported through sys.unraisablehook). The checks are the same: every exit restores.
"""

import argparse
import json
import random
import sys
import threading
import time
import warnings

from groups.memory import rss_kib


class Boom(Exception):
    pass


def worker(guards, pairs, seed, shared_guard, stats, lock, edges=False):
    import cyctx

    current = cyctx.current_handle
    rng = random.Random(seed)
    done = violations = raised = orphans = late = 0

    def held_by_generator(g):
        with g:
            yield

    def edge(g):
        # Inside g's block: one of the edges; afterwards g's context must be current again.
        nonlocal orphans, late, violations
        r = rng.random()
        k = rng.randrange(len(guards))
        if r < 0.4:
            with cyctx.ContextGuard.shared(k):
                pass
        elif r < 0.7:
            cyctx.ContextGuard(k).__enter__()  # freed while entered: an orphaned entry
            orphans += 1
            # Left by g's exit (which drops it); nothing here may exit it.
        else:
            it = held_by_generator(guards[k])
            next(it)
            with rng.choice(guards):
                holder = [it]
                del it
                holder.clear()  # the finalizer runs a late exit: spliced, reported
                late += 1
            if current() != g.handle:
                violations += 1

    def nest(depth):
        nonlocal done, violations, raised
        g = shared_guard if rng.random() < 0.1 else rng.choice(guards)
        before = current()
        try:
            with g:
                done += 1
                if current() != g.handle:
                    violations += 1
                if depth > 1 and rng.random() < 0.6:
                    nest(depth - 1)
                if edges and rng.random() < 0.01:
                    edge(g)
                if rng.random() < 0.05:
                    raised += 1
                    raise Boom
        except Boom:
            if rng.random() < 0.5 and depth < 4:
                raise  # let an outer level see it too
        if current() != before:
            violations += 1

    start = current()
    while done < pairs:
        try:
            nest(rng.randint(1, 4))
        except Boom:
            pass
    if current() != start:
        violations += 1
    with lock:
        stats["pairs"] += done
        stats["violations"] += violations
        stats["exceptions"] += raised
        stats["orphaned_entries"] += orphans
        stats["late_generator_exits"] += late


def run(threads=16, pairs=1_000_000, seed=1, sim=None, edges=False):
    """Run the load; returns a dict of results. `sim`: a cyctx.testing.Sim or None."""
    from cuda.bindings import driver as d

    import cyctx

    d.cuInit(0)
    ndev = min(d.cuDeviceGetCount()[1], 2)
    base = [sim.retain_count(i) for i in range(ndev)] if sim else None
    guards = [cyctx.ContextGuard(i) for i in range(ndev)]
    shared = guards[0]
    per = max(pairs // threads, 1)
    if edges:
        for i in range(ndev):
            with cyctx.ContextGuard.shared(i):  # used up front: the retain accounting is exact
                pass
    stats = {
        "pairs": 0,
        "violations": 0,
        "exceptions": 0,
        "orphaned_entries": 0,
        "late_generator_exits": 0,
    }
    lock = threading.Lock()
    reported = []
    old_hook = sys.unraisablehook
    if edges:
        # Late exits are reported through the hook as GuardError; anything else is a failure.
        sys.unraisablehook = lambda u: reported.append(type(u.exc_value).__name__)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)  # the dropped orphans
            # Each thread warms up first, and the RSS baseline is read once all have: it holds
            # the interpreter's steady-state allocations and what each thread costs once (the C
            # library's per-thread malloc arena; under an emulator such as qemu-user also its
            # per-thread state and translated code), so the growth measured is what the load's
            # pairs leave. The same threads then run the load.
            warm, n = dict(stats, pairs=0), max(1000 // threads, 50)
            ready, go = threading.Barrier(threads + 1), threading.Barrier(threads + 1)

            def run_thread(k):
                try:
                    worker(guards, n, seed - 1 - k, shared, warm, lock, edges)
                    ready.wait()
                    go.wait()
                except threading.BrokenBarrierError:
                    return
                except BaseException:
                    ready.abort()
                    go.abort()
                    raise
                worker(guards, per, seed + k, shared, stats, lock, edges)

            ts = [threading.Thread(target=run_thread, args=(k,)) for k in range(threads)]
            for t in ts:
                t.start()
            ready.wait()  # raises BrokenBarrierError when a warm-up failed
            rss0 = rss_kib()
            t0 = time.perf_counter()
            go.wait()
            for t in ts:
                t.join()
            secs = time.perf_counter() - t0
    finally:
        sys.unraisablehook = old_hook
    if edges:
        stats["violations"] += sum(1 for r in reported if r != "GuardError")
    rss1 = rss_kib()
    shared_held = [i for i in range(ndev) if edges]  # shared guards stay: one retain each
    held = (
        [sim.retain_count(i) - base[i] - (i in shared_held) for i in range(ndev)] if sim else None
    )
    for g in guards:
        g.close()
    after = (
        [sim.retain_count(i) - base[i] - (i in shared_held) for i in range(ndev)] if sim else None
    )
    # With --edges the shared guards keep every device's primary context active, by design.
    active = [bool(d.cuDevicePrimaryCtxGetState(d.cuDeviceGet(i)[1])[2]) for i in range(ndev)]
    return {
        "threads": threads,
        "devices": ndev,
        "seed": seed,
        "pairs": stats["pairs"],
        "violations": stats["violations"],
        "exceptions": stats["exceptions"],
        "seconds": round(secs, 2),
        "rss_kib_before": rss0,
        "rss_kib_after": rss1,
        "rss_growth_kib": rss1 - rss0,
        "retains_held_during": held,
        "retains_after_close": after,
        "primary_active_after_close": active,
        "driver": "simulated" if sim else "real",
        "edges": edges,
        "orphaned_entries": stats["orphaned_entries"],
        "late_generator_exits": stats["late_generator_exits"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sim", action="store_true")
    ap.add_argument(
        "--edges", action="store_true", help="also exercise the edges of docs/guarantees.md"
    )
    ap.add_argument("--out")
    args = ap.parse_args()
    sim = None
    if args.sim:
        from cyctx.testing import use_simulated_driver

        sim = use_simulated_driver(device_count=2)
    res = run(args.threads, args.pairs, args.seed, sim, args.edges)
    print(json.dumps(res, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    ok = res["violations"] == 0 and (
        sim is None or res["retains_after_close"] == [0] * res["devices"]
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
