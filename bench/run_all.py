"""cyctx's benchmark suite, one command:

    python bench/run_all.py [--quick] [--sim] [--out-dir bench/results] [--tag NAME]

Builds bench/_bench.pyx (compiled nogil loops) against the installed cyctx in a scratch
directory, then runs each group of bench/groups/ in its own process of this run, on this
machine, through bench/harness.py (how it measures):

  core     per enter+exit, groups floor, nogil and from_python in one process: driver floor
           (push+pop, retain+push+pop+release), cyctx from Cython (nogil enter()/exit(), the
           raw switch_to()/switch_back() with and without the reset check, the _cpp/thread_entries.h stack),
           cyctx from Python (`with guard:`) and an empty extension-type `with`
  threads  1..16 OpenMP threads: guard fast path and switching path, raw push+pop
  memory   10 million nogil enter/exit cycles per path and 1 million `with guard:`: RSS
           before/after, every retain released
  peer:*   CuPy, cuda.core, torch, numba, cuda.bindings from Python, where installed

and writes to --out-dir: bench-TAG.json (numbers, machine, GPU, driver, package versions),
bench-TAG.txt (the table printed here), bench-TAG.md (the same as Markdown) and, when
matplotlib is installed, bench-TAG-cost.png and bench-TAG-threads.png (or later:
`python bench/plot.py bench-TAG.json`).

core and each peer run in --repeat processes (default 3) and report the median; the
single-threaded groups are pinned to one CPU (--cpu). --sim runs on cyctx's simulated driver
(smoke runs without a GPU; its numbers mean nothing, and the peers other than cuda.bindings are
reported as missing). --quick: few iterations, one process per group.
Exit status: 0 when every group ran (a missing peer is not a failure), 1 otherwise. Missed
performance targets are reported, not turned into a failure: benchmarks are not tests.
"""

import argparse
import os
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import groups  # noqa: E402
import harness  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="few iterations (a smoke run)")
    ap.add_argument("--sim", action="store_true", help="cyctx's simulated driver (no GPU needed)")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--tag", help="name of the output files (default: sim, or the GPU's name)")
    ap.add_argument(
        "--build-dir", help="where to compile _bench.pyx (default: a temporary directory)"
    )
    ap.add_argument("--only", help="comma-separated groups to run (default: all)")
    ap.add_argument("--group-timeout", type=int, default=600, help="seconds per group")
    ap.add_argument(
        "--repeat", type=int, help="processes per single-threaded group (default 3, --quick 1)"
    )
    ap.add_argument(
        "--cpu",
        type=int,
        help="CPU to pin the single-threaded groups to (default: the "
        "last one this process may use; -1: no pinning)",
    )
    args = ap.parse_args(argv)
    args.repeat = args.repeat or (1 if args.quick else 3)
    if args.cpu is None:
        args.cpu = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else -1
    t0 = time.perf_counter()
    os.makedirs(args.out_dir, exist_ok=True)
    names = list(groups.PROCESSES)  # core, threads, memory, then one per peer
    if args.only:
        wanted = set(args.only.split(","))
        names = [n for n in names if n in wanted or n in ("core",)]
    with tempfile.TemporaryDirectory(prefix="cyctx-bench-") as work:
        build_dir = args.build_dir or os.path.join(work, "build")
        os.makedirs(build_dir, exist_ok=True)
        print(f"run_all: building _bench in {build_dir}", flush=True)
        harness.build(build_dir)
        print(
            f"run_all: {'simulated' if args.sim else 'real'} driver{', quick' if args.quick else ''}; "
            f"each group in its own process",
            flush=True,
        )
        ran = {}
        for name in names:
            if args.sim and name.startswith("peer:") and name != "peer:cuda_bindings":
                # They would load the real driver or runtime, not the simulated one.
                ran[name] = {"status": "missing: simulated driver", "rows": []}
                print(f"  {name:20s}    -    missing: simulated driver", flush=True)
                continue
            # Python-level timings differ from one process to the next on some machines (the
            # H200 VM: up to 1.8x, steady within a process): the single-threaded groups run in
            # several processes and report the median.
            reps = [harness.spawn(name, args, build_dir, work)]
            while (
                name not in ("threads", "memory")
                and len(reps) < args.repeat
                and reps[-1]["status"] == "ok"
            ):
                reps.append(harness.spawn(name, args, build_dir, work, len(reps)))
            ran[name] = harness.merge(reps) if name not in ("threads", "memory") else reps[0]
        for name in ("threads", "memory"):
            ran.setdefault(name, {"status": "not run (--only)", "rows": []})
    result = harness.assemble(args, ran, time.perf_counter() - t0)
    if not args.tag:
        first = (result["gpu"].get("device_names") or [None])[0]
        args.tag = "sim" if args.sim else re.sub(r"\W+", "-", first or "gpu").strip("-").lower()
    result["tag"] = args.tag
    written = harness.write(result, args.out_dir)
    print(f"run_all: wrote {', '.join(written)} in {args.out_dir}")
    failed = [
        n
        for n, r in ran.items()
        if r["status"] != "ok" and not r["status"].startswith(("missing", "not run"))
    ]
    if failed:
        print(f"run_all: groups that failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
