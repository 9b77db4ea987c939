"""What `with cyctx.device(k):` costs beside `with guard:` on a guard kept and held.

    python scripts/gpu/device_cost.py [--simulate] [--rounds N]

Both blocks take the guard's fast path (the context is already current: an outer block of the
kept guard holds it), so the difference is the lookup: the call of cyctx.device and its read of
the shared guard. Prints each one's best time (the minimum over rounds of timeit, interleaved so
that a noisy moment hits both) and their ratio; the target is a ratio of at most 1.15.
"""

import argparse
import json
import timeit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simulate", action="store_true", help="on cyctx's simulated driver")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--number", type=int, default=100_000)
    args = ap.parse_args()
    if args.simulate:
        from cyctx.testing import use_simulated_driver

        use_simulated_driver(device_count=1)
    import cyctx

    with cyctx.device(0):  # made and used before timing: its retain taken, its fast slot set
        pass
    kept = cyctx.ContextGuard(0)
    env = {"cyctx": cyctx, "guard": kept}
    guard_ns, device_ns = [], []
    try:
        with kept:
            for _ in range(args.rounds):
                for out, stmt in (
                    (guard_ns, "with guard:\n    pass"),
                    (device_ns, "with cyctx.device(0):\n    pass"),
                ):
                    t = timeit.timeit(stmt, globals=env, number=args.number)
                    out.append(t / args.number * 1e9)
    finally:
        kept.close()
    a, b = min(guard_ns), min(device_ns)
    print(
        json.dumps(
            {
                "with_guard_ns": round(a, 1),
                "with_cyctx_device_ns": round(b, 1),
                "ratio": round(b / a, 3),
                "target": 1.15,
                "met": b / a <= 1.15,
                "simulated": args.simulate,
            }
        )
    )


if __name__ == "__main__":
    main()
