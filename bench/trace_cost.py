"""What cyctx.trace() costs (docs/tracing.md, "Cost"): a traced context change native-only
(no Python frames), with the Python stack, and bare; calls the trace does not watch; and a
Python `with guard:` that switches, traced and not.

    python bench/trace_cost.py [--simulate] [--n 200000] [--json FILE]

Each figure is the best of 5 runs of n rounds, made in C without the GIL (the tracer module's
`bench`), so the difference between traced and untraced rows is the tracer's cost per call: a
push+pop round is two traced calls, each an entry and an exit callback. On the real driver the
callbacks are CUPTI's; with --simulate the simulated driver's (no GPU). Prints a table and
writes the figures as JSON. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--simulate", action="store_true", help="on cyctx's simulated driver")
    ap.add_argument("--n", type=int, default=200_000, help="rounds per run (default 200000)")
    ap.add_argument("--json", metavar="FILE", help="write the figures here")
    args = ap.parse_args()
    if args.simulate:
        from cyctx.testing import use_simulated_driver

        use_simulated_driver(1)
    from cuda.bindings import driver as d

    import cyctx
    from cyctx._trace import _native

    assert d.cuInit(0)[0] == 0
    err, p = d.cuDevicePrimaryCtxRetain(0)
    assert err == 0
    ctx = int(p)
    n = args.n

    def best(mode: int) -> float:
        return min(_native.bench(ctx, n, mode) for _ in range(5)) / n * 1e9

    rows: dict[str, float] = {}
    rows["untraced push+pop"] = best(0)
    rows["untraced get_current+get_id"] = best(1)
    configs = {
        "bare (no frames)": dict(python_frames=0, native_frames=0),
        "native-only (native frames to the eval loop)": dict(python_frames=0, native_frames=32),
        "with Python stack (4 Python frames, native to the eval loop)": dict(
            python_frames=4, native_frames=32
        ),
    }
    for name, kw in configs.items():
        with cyctx.trace(capacity=1 << 16, quiet=True, **kw) as t:
            times = []
            for _ in range(5):
                times.append(_native.bench(ctx, n, 0))
                t.collect()
                t._raw.clear()  # a benchmark keeps no events
            rows[f"traced push+pop, {name}"] = min(times) / n * 1e9
            rows["traced run: get_current+get_id (not watched)"] = best(1)
        if t.reason:
            print(f"cannot trace: {t.reason}", file=sys.stderr)
            return 1
    g = cyctx.ContextGuard(0)

    def guard_loop() -> float:
        t0 = time.perf_counter_ns()
        for _ in range(n // 10):
            with g:
                pass
        return (time.perf_counter_ns() - t0) / (n // 10)

    rows["Python with guard (switching), untraced"] = min(guard_loop() for _ in range(3))
    with cyctx.trace(capacity=1 << 16, quiet=True) as t:
        vals = []
        for _ in range(3):
            vals.append(guard_loop())
            t.collect()
            t._raw.clear()
        rows["Python with guard (switching), traced with Python stack"] = min(vals)
    g.close()
    d.cuDevicePrimaryCtxRelease(0)

    base = rows["untraced push+pop"]
    print(f"{'case':<70} {'ns/round':>10} {'per traced call':>16}")
    for k, v in rows.items():
        extra = f"{(v - base) / 2:16.1f}" if k.startswith("traced push+pop") else " " * 16
        print(f"{k:<70} {v:10.1f} {extra}")
    out = {
        "schema": "cyctx.bench.trace_cost/1",
        "driver": "simulated" if args.simulate else "real",
        "machine": platform.node(),
        "python": sys.version.split()[0],
        "cyctx": cyctx.__version__,
        "n": n,
        "ns_per_round": rows,
        "ns_per_traced_call": {
            k: (v - base) / 2 for k, v in rows.items() if k.startswith("traced push+pop")
        },
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
