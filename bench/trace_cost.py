"""What cyctx.trace() costs (docs/tracing.md, "Cost"): a traced context change native-only
(no Python frames), with the Python stack, and bare; calls the trace does not watch; a
Python `with guard:` that switches, traced and not; and the naming of the events (the table
"naming", alone with --naming).

    python bench/trace_cost.py [--simulate] [--n 200000] [--naming] [--json FILE]
                               [--build-dir DIR]

Each push+pop figure is the best of 5 runs of n rounds, made in C without the GIL (the loops of
bench/_bench.pyx, compiled against the installed cyctx in --build-dir as the benchmarks do),
so the difference between traced and untraced rows is the tracer's cost per call: a push+pop
round is two traced calls, each an entry and an exit callback. The switching
guard's block is two traced changes (a push at its entry, a pop at its exit), made by cyctx's
compiled module holding the GIL. Each is measured in parts: bare (the driver's questions and
the record), native frames only, Python frames only, both. Every traced call is recorded (runs
are cut into pieces the buffer holds; a run that lost an event is an error). On the real driver
the callbacks are CUPTI's; with --simulate the simulated driver's (no GPU). Prints a table and
writes the figures as JSON. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time

from harness import built


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--simulate", action="store_true", help="on cyctx's simulated driver")
    ap.add_argument("--n", type=int, default=200_000, help="rounds per run (default 200000)")
    ap.add_argument("--json", metavar="FILE", help="write the figures here")
    ap.add_argument("--naming", action="store_true", help="the naming table only")
    ap.add_argument("--build-dir", help="where _bench is compiled (default: a scratch folder)")
    args = ap.parse_args()
    if args.simulate:
        from cyctx.testing import use_simulated_driver

        use_simulated_driver(1)
    from cuda.bindings import driver as d

    import cyctx

    assert d.cuInit(0)[0] == 0
    err, p = d.cuDevicePrimaryCtxRetain(0)
    assert err == 0
    ctx = int(p)
    n = args.n
    if args.naming:
        naming = naming_table(d, p)
        d.cuDevicePrimaryCtxRelease(0)
        _write(args, {"naming": naming})
        return 0

    bench = built(args.build_dir or tempfile.mkdtemp(prefix="cyctx-trace-bench-"))
    bench.checked()  # the loops do not check the driver's results: each call once, checked

    def timed(loop, *a) -> float:
        t0 = time.perf_counter_ns()
        loop(*a)
        return (time.perf_counter_ns() - t0) * 1e-9

    def run(mode: int, k: int) -> float:
        # mode 0: a cuCtxPushCurrent + cuCtxPopCurrent round (traced calls); mode 1: a
        # cuCtxGetCurrent + cuCtxGetId round (calls a trace does not watch), as two loops.
        if mode == 0:
            return timed(bench.pushpop, ctx, k)
        return timed(bench.getcurrent, k) + timed(bench.getid, ctx, k)

    def best(mode: int) -> float:
        return min(run(mode, n) for _ in range(5)) / n * 1e9

    # Every traced call must be recorded: a full buffer drops events, and a dropped event costs
    # far less than a recorded one. So each run is made of chunks the buffer holds, collected
    # in between (outside the timed part), and a run that dropped any is an error.
    cap = 1 << 15
    chunk = cap // 2 - 16

    def traced_bench(t: cyctx.Trace) -> float:
        total, left = 0.0, n
        while left:
            k = min(chunk, left)
            total += run(0, k)
            left -= k
            t.collect()
            t._forget()  # a benchmark keeps no events
        return total

    def guard_loop(blocks: int) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(blocks):
            with g:
                pass
        return (time.perf_counter_ns() - t0) / blocks

    def traced_guard(t: cyctx.Trace) -> float:
        vals = []
        for _ in range(3):
            vals.append(guard_loop(min(chunk // 2, max(1, n // 10))))
            t.collect()
            t._forget()
        return min(vals)

    rows: dict[str, float] = {}
    rows["untraced push+pop"] = best(0)
    rows["untraced get_current+get_id"] = best(1)
    configs = {
        "bare (no frames)": dict(python_frames=0, native_frames=0),
        "native-only (native frames to the eval loop)": dict(python_frames=0, native_frames=64),
        "Python stack only (4 Python frames, no native)": dict(python_frames=4, native_frames=0),
        "with Python stack (4 Python frames, native to the eval loop)": dict(
            python_frames=4, native_frames=64
        ),
    }
    for name, kw in configs.items():
        with cyctx.trace(capacity=cap, quiet=True, **kw) as t:
            rows[f"traced push+pop, {name}"] = min(traced_bench(t) for _ in range(5)) / n * 1e9
            rows["traced run: get_current+get_id (not watched)"] = best(1)
        if t.reason:
            print(f"cannot trace: {t.reason}", file=sys.stderr)
            return 1
        if t.dropped:
            print(
                f"the benchmark lost {t.dropped} events: its figures would be wrong",
                file=sys.stderr,
            )
            return 1
    g = cyctx.ContextGuard(0)
    untraced_guard = min(guard_loop(max(1, n // 10)) for _ in range(3))
    rows["Python with guard (switching), untraced"] = untraced_guard
    for name, kw in configs.items():
        with cyctx.trace(capacity=cap, quiet=True, **kw) as t:
            rows[f"Python with guard (switching), traced, {name}"] = traced_guard(t)
        if t.dropped:
            print(
                f"the benchmark lost {t.dropped} events: its figures would be wrong",
                file=sys.stderr,
            )
            return 1
    g.close()
    d.cuDevicePrimaryCtxRelease(0)

    base = rows["untraced push+pop"]

    def per_change(k: str, v: float) -> float | None:
        # Two traced calls a round (push and pop), two traced changes a switching block.
        if k.startswith("traced push+pop"):
            return (v - base) / 2
        if k.startswith("Python with guard (switching), traced"):
            return (v - untraced_guard) / 2
        return None

    naming = naming_table(d, p)
    print(f"{'case':<92} {'ns/round':>9} {'per traced call':>16}")
    for k, v in rows.items():
        pc = per_change(k, v)
        extra = f"{pc:16.1f}" if pc is not None else ""
        print(f"{k:<92} {v:9.1f} {extra}")
    _write(
        args,
        {
            "n": n,
            "ns_per_round": rows,
            "ns_per_traced_call": {
                k: per_change(k, v) for k, v in rows.items() if per_change(k, v) is not None
            },
            "naming": naming,
        },
    )
    return 0


def naming_table(d, ctx) -> list[dict[str, float]]:
    """The stop of a trace of N events, timed (best of 3): drain, naming and building; in
    seconds of the clock and of the process's CPU (on a loaded machine the clock's include
    the time other processes had the CPU)."""
    import cyctx

    rows = []
    print(f"{'naming: events':<24} {'stop (s)':>10} {'us/event':>10} {'CPU us/event':>13}")
    for events in (1000, 4000, 16000):
        wall, cpu = [], []
        for _ in range(3):
            t = cyctx.trace(capacity=events, quiet=True).start()
            if t.reason:
                raise SystemExit(f"cannot trace: {t.reason}")
            for _ in range(events // 2):
                d.cuCtxSetCurrent(ctx)
                d.cuCtxSetCurrent(None)
            c0, t0 = time.process_time(), time.perf_counter()
            t.stop()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            if len(t.events) != events or t.dropped:
                raise SystemExit(f"the trace kept {len(t.events)} of {events} events")
        s, c = min(wall), min(cpu)
        rows.append({"events": events, "stop_s": s, "us_per_event": s / events * 1e6, "cpu_s": c})
        print(f"{events:<24} {s:10.3f} {s / events * 1e6:10.1f} {c / events * 1e6:13.1f}")
    return rows


def _write(args: argparse.Namespace, figures: dict) -> None:
    import cyctx

    out = {
        "schema": "cyctx.bench.trace_cost/1",
        "driver": "simulated" if args.simulate else "real",
        "machine": platform.node(),
        "python": sys.version.split()[0],
        "cyctx": cyctx.__version__,
        **figures,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
