"""Load test: many threads, two devices, randomly nested guards, random exceptions.

    python bench/stress.py [--threads 16] [--pairs 1000000] [--seed 1] [--sim] [--out FILE.json]

Every thread nests guards of random devices to a random depth, raises random exceptions from
inside (some caught at an inner level, some at the top), and after every exit checks that the
thread's current context is what it was before that enter. Reports violations (must be 0),
the retain balance (the simulated driver's counters, or the primary contexts' active flags
on a real driver once the guards are closed), and RSS before and after (must stay flat).
"""

import argparse
import json
import os
import random
import sys
import threading
import time


class Boom(Exception):
    pass


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def worker(guards, pairs, seed, shared_guard, stats, lock):
    import cyctx

    current = cyctx.current_handle
    rng = random.Random(seed)
    done = violations = raised = 0

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


def run(threads=16, pairs=1_000_000, seed=1, sim=None):
    """Run the load; returns a dict of results. `sim`: a cyctx.testing.Sim or None."""
    import cyctx
    from cuda.bindings import driver as d

    d.cuInit(0)
    ndev = min(d.cuDeviceGetCount()[1], 2)
    base = [sim.retain_count(i) for i in range(ndev)] if sim else None
    guards = [cyctx.ContextGuard(i) for i in range(ndev)]
    shared = guards[0]
    per = max(pairs // threads, 1)
    stats = {"pairs": 0, "violations": 0, "exceptions": 0}
    lock = threading.Lock()
    # Warm up, so the RSS baseline includes the interpreter's steady-state allocations.
    worker(guards, 1000, seed - 1, shared, dict(pairs=0, violations=0, exceptions=0), lock)
    rss0 = rss_kib()
    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker, args=(guards, per, seed + k, shared, stats, lock)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    secs = time.perf_counter() - t0
    rss1 = rss_kib()
    held = [sim.retain_count(i) - base[i] for i in range(ndev)] if sim else None
    for g in guards:
        g.close()
    after = [sim.retain_count(i) - base[i] for i in range(ndev)] if sim else None
    active = [bool(d.cuDevicePrimaryCtxGetState(d.cuDeviceGet(i)[1])[2]) for i in range(ndev)]
    return {
        "threads": threads, "devices": ndev, "seed": seed, "pairs": stats["pairs"],
        "violations": stats["violations"], "exceptions": stats["exceptions"], "seconds": round(secs, 2),
        "rss_kib_before": rss0, "rss_kib_after": rss1, "rss_growth_kib": rss1 - rss0,
        "retains_held_during": held, "retains_after_close": after, "primary_active_after_close": active,
        "driver": "simulated" if sim else "real",
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sim", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    sim = None
    if args.sim:
        from cyctx.testing import use_simulated_driver

        sim = use_simulated_driver(device_count=2)
    res = run(args.threads, args.pairs, args.seed, sim)
    print(json.dumps(res, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    ok = res["violations"] == 0 and (sim is None or res["retains_after_close"] == [0] * res["devices"])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
