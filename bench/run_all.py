"""cyctx's benchmark suite, one command:

    python bench/run_all.py [--quick] [--sim] [--out-dir bench/results] [--tag NAME] [pyperf options]

bench/README.md says what each group measures and what the outputs hold. Options this command
does not know go to pyperf, for the Python-level groups. Exit status: 0 when every group ran (a
missing peer is not a failure), 1 otherwise; missed performance targets are reported, not
turned into a failure: benchmarks are not tests.
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import groups  # noqa: E402
import harness  # noqa: E402
import report  # noqa: E402

# pyperf's options for --quick: one worker per row, a fixed loop count (no calibration run).
QUICK_PYPERF = ["--processes", "1", "--values", "2", "--warmups", "1", "--loops", "1000"]


def spawn(cmd, out, timeout):
    """Run one group's process; its status, and its output's tail when it did not run."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"error: timed out after {timeout} s"}
    tail = (proc.stdout + proc.stderr)[-3000:]
    if proc.returncode == 0 and os.path.isfile(out):
        return {"status": "ok"}
    if proc.returncode == 3:  # python_group.MISSING
        return {"status": proc.stderr.strip().splitlines()[-1]}
    return {"status": f"error: exit {proc.returncode}", "output_tail": tail}


def run_groups(args, pyperf_args, build_dir, work):
    """Each group in its processes; ({name: status}, [pyperf suite files], memory result)."""
    names = list(groups.COMPILED) + list(groups.PYTHON_GROUPS)
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    ran, suites, memory = {}, [], None
    for name in names:
        out = os.path.join(work, re.sub(r"[^a-z_]", "_", name) + ".json")
        pin = [f"--cpu={args.cpu}"] if args.cpu >= 0 else []
        if name in groups.COMPILED:
            cmd = [sys.executable, os.path.join(HERE, "harness.py"), "run", name, "--out", out]
            cmd += (
                ["--build-dir", build_dir] + ["--sim"] * args.sim + ["--quick"] * args.quick + pin
            )
        elif args.sim and name.startswith("peer:") and name != "peer:cuda_bindings":
            # They would load the real driver or runtime, not the simulated one.
            ran[name] = {"status": "missing: simulated driver"}
            print(f"  {name:20s}    -    missing: simulated driver", flush=True)
            continue
        else:
            cmd = [sys.executable, os.path.join(HERE, "python_group.py"), name, "--result", out]
            cmd += ["--build-dir", build_dir] + ["--sim"] * args.sim
            cmd += (QUICK_PYPERF if args.quick else []) + pyperf_args
            cmd += [f"--affinity={args.cpu}"] if args.cpu >= 0 else []
        t0 = time.perf_counter()
        ran[name] = spawn(cmd, out, args.group_timeout)
        ran[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"  {name:20s} {ran[name]['seconds']:6.1f} s  {ran[name]['status']}", flush=True)
        if ran[name]["status"] == "ok":
            if name == "memory":
                with open(out) as f:
                    memory = json.load(f)
            else:
                suites.append(out)
    return ran, suites, memory


def write(suite, info, out_dir):
    """Evaluate the targets, print the table and write bench-TAG.json (the pyperf suite),
    bench-TAG-report.json, .txt, .md and, with matplotlib, the plots into out_dir; returns
    the names written."""
    result = report.build(suite, info)
    report.evaluate(result)
    table = report.text(result)
    print("\n" + table)
    name = f"bench-{info['tag']}"
    written = [name + ".json", name + "-report.json", name + ".txt", name + ".md"]
    if suite:
        suite.dump(os.path.join(out_dir, written[0]), replace=True)
    with open(os.path.join(out_dir, written[2]), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(out_dir, written[3]), "w") as f:
        f.write(report.markdown(result))
    try:
        import plot

        plots = [os.path.basename(p) for p in plot.plot(result, out_dir, info["tag"])]
        written += plots
    except ImportError as exc:
        plots = (
            f"skipped: matplotlib is not installed ({exc}); to draw them later: "
            f"pip install matplotlib && python bench/plot.py {os.path.join(out_dir, written[0])}"
        )
        print(f"run_all: plots {plots}")
    out = dict(info, targets=result["targets"], breakdown=result["breakdown"])
    out["outputs"] = dict(zip(("json", "report", "table", "markdown"), written, strict=False))
    out["outputs"]["plots"] = plots
    with open(os.path.join(out_dir, written[1]), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # what it does not know goes to pyperf, whole
    )
    ap.add_argument("--quick", action="store_true", help="few rounds (a smoke run)")
    ap.add_argument("--sim", action="store_true", help="cyctx's simulated driver (no GPU needed)")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--tag", help="name of the output files (default: sim, or the GPU's name)")
    ap.add_argument(
        "--build-dir", help="where to compile _bench.pyx (default: a temporary directory)"
    )
    ap.add_argument("--only", help="comma-separated groups to run (default: all)")
    ap.add_argument("--group-timeout", type=int, default=600, help="seconds per group")
    ap.add_argument(
        "--cpu",
        type=int,
        help="CPU to pin the single-threaded processes to (default: the "
        "last one this process may use; -1: no pinning)",
    )
    args, pyperf_args = ap.parse_known_args(argv)
    try:
        import pyperf
    except ImportError:
        sys.exit("run_all: pyperf is needed (pip install 'cyctx[bench]', or pip install pyperf)")
    if args.cpu is None:
        args.cpu = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else -1
    t0 = time.perf_counter()
    os.makedirs(args.out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cyctx-bench-") as work:
        build_dir = args.build_dir or os.path.join(work, "build")
        os.makedirs(build_dir, exist_ok=True)
        print(f"run_all: building _bench in {build_dir}", flush=True)
        build = [sys.executable, os.path.join(HERE, "harness.py"), "build", build_dir]
        proc = subprocess.run(build, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(
                f"run_all: building bench/_bench.pyx failed:\n{(proc.stdout + proc.stderr)[-6000:]}"
            )
        print(
            f"run_all: {'simulated' if args.sim else 'real'} driver{', quick' if args.quick else ''}; "
            f"each group in processes of its own",
            flush=True,
        )
        ran, files, memory = run_groups(args, pyperf_args, build_dir, work)
        for name in set(ran) & set(groups.PYTHON_GROUPS):
            if ran[name]["status"] != "ok":  # its rows are listed with why, so none reads as zero
                cases = groups.python_cases(name)
                ran[name]["rows"] = [
                    [c.id, c.layer, c.label] for c in cases if c.layer != "control"
                ]
        suite = None
        for path in files:
            part = pyperf.BenchmarkSuite.load(path)
            if suite is None:
                suite = part
            else:
                for bench in part.get_benchmarks():
                    suite.add_benchmark(bench)
    info = {
        "schema": "cyctx-bench/2",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "mode": {"driver": "simulated" if args.sim else "real", "quick": args.quick},
        "gpu": harness.gpu_info(args.sim),
        "packages": harness.packages(),
        "pyperf_options": (QUICK_PYPERF if args.quick else []) + pyperf_args,
        "pinned_cpu": args.cpu if args.cpu >= 0 else None,
        "restore": groups.peers.RESTORE_NOTES,
        "groups": ran,
        "memory": memory,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if not args.tag:
        names = (
            [b.get_metadata().get("cuda_device_names") for b in suite.get_benchmarks()]
            if suite
            else []
        )
        first = next((n for n in names if n), "gpu").split(";")[0]
        args.tag = "sim" if args.sim else re.sub(r"\W+", "-", first).strip("-").lower()
    info["tag"] = args.tag
    written = write(suite, info, args.out_dir)
    print(f"run_all: wrote {', '.join(written)} in {args.out_dir}")
    failed = [
        n for n, r in ran.items() if r["status"] != "ok" and not r["status"].startswith("missing")
    ]
    if failed:
        print(f"run_all: groups that failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
