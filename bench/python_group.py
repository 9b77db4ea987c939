"""One Python-level group through pyperf: cyctx's own `with` rows (`python`), or a peer's rows
beside cyctx's control rows (`peer:NAME`). run_all.py runs it once per group:

    python bench/python_group.py GROUP --build-dir DIR --result FILE.json [--sim] [pyperf options]

This process is pyperf's manager: it sets the group up, runs each row once, checked
(harness.check), and has pyperf time each row in worker processes (this script again, which
time and never trace); it writes the suite to FILE.json. pyperf's options apply; the defaults
below (6 processes, not pyperf's 20) keep a peer that takes seconds to load (torch) from being
loaded a hundred times.

Exit status 3: the group's library is not installed (its set-up raised ImportError).
"""

import os
import sys
import time

import pyperf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness  # noqa: E402

MISSING = 3


def timed(loops, loop, set_start, start):
    """pyperf's time function: `loops` operations from the row's start context, in seconds."""
    set_start(start)
    t0 = time.perf_counter()
    loop(loops)
    return time.perf_counter() - t0


def main():
    def to_workers(cmd, args):
        cmd += [args.group, "--build-dir", args.build_dir] + ["--sim"] * args.sim

    runner = pyperf.Runner(processes=6, values=3, min_time=0.02, add_cmdline_args=to_workers)
    ap = runner.argparser
    ap.add_argument("group", help="python, or peer:NAME")
    ap.add_argument("--build-dir", required=True, help="where _bench was compiled")
    ap.add_argument("--result", help="the suite, with each row's checks (the manager writes it)")
    ap.add_argument("--sim", action="store_true", help="cyctx's simulated driver")
    # The workers need the driver's environment (a container's LD_LIBRARY_PATH,
    # CUDA_VISIBLE_DEVICES, CYCTX_SIM_LIBRARY, ...), which pyperf would otherwise strip.
    ap.set_defaults(copy_env=True)
    args = runner.parse_args()
    if not args.worker and not args.result:
        ap.error("the manager needs --result FILE")
    if args.sim:
        from cyctx.testing import use_simulated_driver

        use_simulated_driver(2)  # before any driver call in this process
    sys.path.insert(0, args.build_dir)
    import _bench
    import groups

    try:
        env = groups.open_python(args.group, _bench)
    except ImportError as exc:
        print(f"missing: {exc}", file=sys.stderr)
        return MISSING
    done = []
    for case in groups.python_cases(args.group):
        for path in case.paths:
            if path not in env.starts:
                continue
            start = env.starts[path]
            loop = case.make(env, path)
            meta = None
            if not args.worker:  # the manager checks; a row that raises stops the group here
                meta = harness.describe(args.group, case, path)
                meta |= harness.check(env, case, loop, start) | env.info
            name = f"{args.group}/{case.id}/{path}"
            bench = runner.bench_time_func(name, timed, loop, env.set_start, start)
            if meta is not None:
                done.append(described(bench, meta))
    if not args.worker:
        pyperf.BenchmarkSuite(done).dump(args.result, replace=True)
    return 0


def described(bench, meta):
    """bench with `meta` added to each of its runs (the workers' runs know only the timing)."""
    return pyperf.Benchmark(
        [
            pyperf.Run(
                run.values,
                warmups=run.warmups,
                metadata=run.get_metadata() | meta,
                collect_metadata=False,
            )
            for run in bench.get_runs()
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
