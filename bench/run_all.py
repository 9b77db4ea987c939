"""cyctx's benchmark suite, one command:

    python bench/run_all.py [--quick] [--sim] [--out-dir bench/results] [--tag NAME]

Builds bench/_bench.pyx (compiled nogil loops) against the installed cyctx in a scratch
directory, then runs each group in its own process of this run, on this machine:

  core     per enter+exit: driver floor (push+pop, retain+push+pop+release), cyctx from
           Cython (nogil enter()/exit(), and the raw switch_to()/switch_back() with and without
           the reset check), cyctx from Python (`with guard:`) and an empty extension-type `with`
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
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _worker  # noqa: E402
import report  # noqa: E402

SCHEMA = "cyctx-bench/1"
BUILD = """
import cyctx
from Cython.Build import cythonize
from setuptools import Extension, setup
ext = Extension("_bench", ["_bench.pyx"], include_dirs=cyctx.get_include(), language="c++",
                extra_compile_args=["-std=c++17", "-O2", "-fopenmp"], extra_link_args=["-fopenmp"])
setup(name="_bench", ext_modules=cythonize([ext], quiet=True), script_args=["build_ext", "--inplace"])
"""


def build(build_dir):
    """Compile _bench.pyx into build_dir (never into the source tree, which others share)."""
    shutil.copy(os.path.join(HERE, "_bench.pyx"), build_dir)
    proc = subprocess.run([sys.executable, "-c", BUILD], cwd=build_dir, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"run_all: building bench/_bench.pyx failed:\n{(proc.stdout + proc.stderr)[-6000:]}")


def run_group(group, args, build_dir, work, rep=0):
    out = os.path.join(work, f"{re.sub(r'[^a-z_]', '_', group)}-{rep}.json")
    cmd = [sys.executable, os.path.join(HERE, "_worker.py"), group, "--out", out, "--build-dir", build_dir]
    cmd += ["--sim"] * args.sim + ["--quick"] * args.quick + ([f"--cpu={args.cpu}"] if args.cpu >= 0 else [])
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.group_timeout)
        tail = (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired:
        proc, tail = None, f"timed out after {args.group_timeout} s"
    if os.path.isfile(out):
        with open(out) as f:
            res = json.load(f)
    else:
        code = proc.returncode if proc else "timeout"
        res = {"status": f"error: the worker wrote no result (exit {code})", "group": group}
    if res["status"] != "ok" and not res["status"].startswith("missing"):
        res["output_tail"] = tail
    print(f"  {group:20s} {time.perf_counter() - t0:6.1f} s  {res['status']}", flush=True)
    return res


def merge(results):
    """One group's result from its repeated processes: each row's ns is the median over the
    processes (each a median of rounds); per_process_ns keeps them, in process order, so that
    ratios can be taken within each process first (report.py)."""
    merged = dict(results[0])
    merged["status"] = next((r["status"] for r in results if r["status"] != "ok"), "ok")
    merged["pid"] = [r.get("pid") for r in results]
    merged["seconds"] = round(sum(r.get("seconds") or 0 for r in results), 2)
    by_key = [{(row["layer"], row["id"], row["path"]): row for row in r.get("rows", [])} for r in results]
    rows = []
    for row in results[0].get("rows", []):
        key = (row["layer"], row["id"], row["path"])
        same = [b.get(key) or {} for b in by_key]
        vals = [r.get("ns") for r in same]
        good = [v for v in vals if v is not None]
        m = dict(row, per_process_ns=vals)
        if good:
            m.update(ns=round(statistics.median(good), 2), status="ok",
                     min=min(r["min"] for r in same if r.get("ns") is not None),
                     max=max(r["max"] for r in same if r.get("ns") is not None))
        for check in ("current_inside", "restored"):
            if check in row:
                m[check] = all(r.get(check, True) for r in same)
        rows.append(m)
    merged["rows"] = rows
    return merged


def machine():
    info = {"platform": platform.platform(), "machine": platform.machine(),
            "python": sys.version.split()[0], "python_implementation": platform.python_implementation(),
            "cpu_count": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        info["cpu"] = None
    return info


def gpu_info(sim, core):
    """GPU and driver as the machine reports them (nvidia-smi, /proc), not through the driver
    library: this process never loads libcuda, so it cannot pick the wrong one."""
    info = {"driver": "simulated" if sim else "real",
            "devices": core.get("devices"), "device_names": core.get("device_names"),
            "cuda_driver_api_version": core.get("driver_api_version")}
    if sim:
        return info
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,pci.bus_id", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=60)
        info["nvidia_smi"] = [ln.strip() for ln in smi.stdout.splitlines() if ln.strip()]
        info["driver_version"] = info["nvidia_smi"][0].split(",")[2].strip() if info["nvidia_smi"] else None
    except (OSError, subprocess.SubprocessError, IndexError) as exc:
        info["nvidia_smi"] = f"unavailable: {exc}"
    if not info.get("driver_version"):
        try:
            with open("/proc/driver/nvidia/version") as f:
                m = re.search(r"Kernel Module\s+(\S+)", f.read())
                info["driver_version"] = m.group(1) if m else None
        except OSError:
            info["driver_version"] = None
    return info


def packages():
    """Installed versions (None: not installed), read from the installed distributions."""
    from importlib import metadata

    wanted = ("cyctx", "cuda-bindings", "cuda-core", "cuda-pathfinder", "nvidia-cuda-runtime", "Cython",
              "setuptools", "torch", "numba", "numba-cuda", "matplotlib")
    out = {}
    for name in wanted:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    # CuPy's distribution is named after its CUDA flavour (cupy-cuda13x, cupy-cuda12x, cupy).
    cupy = sorted({d.metadata["Name"]: d.version for d in metadata.distributions()
                   if (d.metadata["Name"] or "").lower().startswith("cupy")}.items())
    out["cupy"] = " ".join(f"{n}=={v}" for n, v in cupy) or None
    try:
        from cyctx._build_info import BUILD_INFO

        out["cyctx_build_info"] = BUILD_INFO
    except ImportError:
        out["cyctx_build_info"] = None
    return out


def assemble(args, groups, seconds):
    core = groups["core"] if groups["core"]["status"] == "ok" else {}
    paths = [p for p in _worker.PATHS if p != "from_other" or (core.get("devices") or 0) > 1]
    cost = []
    for name, res in groups.items():
        for row in res.get("rows", []) if name != "threads" else []:
            cost.append(dict(row, group=name))
        if name.startswith("peer:") and not res.get("rows"):
            # Listed, with the reason, so a missing peer can never read as zero.
            for row_id, label in _worker.PEER_ROWS[name[5:]]:
                cost += [{"id": row_id, "label": label, "path": p, "layer": "peer", "group": name,
                          "ns": None, "status": res["status"]} for p in paths]
    return {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "tag": args.tag,
        "mode": {"driver": "simulated" if args.sim else "real", "quick": args.quick},
        "machine": machine(),
        "gpu": gpu_info(args.sim, core),
        "packages": packages(),
        "method": {
            "timer": "time.perf_counter_ns around a loop of n operations",
            "statistic": "median ns per operation over rounds, after one discarded warm-up round",
            "rounds": _worker.Timer(args.quick).rounds,
            "processes": args.repeat,
            "across_processes": "core and each peer ran in `processes` processes one after another; a "
                                "row's ns is the median over them, per_process_ns lists each; ratios "
                                "are taken within each process, then the median",
            "pinned_cpu": args.cpu if args.cpu >= 0 else None,
            "round_seconds": _worker.Timer(args.quick).round_s,
            "paths": {"fast": "the target context already current",
                      "from_none": "no context current before the enter",
                      "from_other": "device 1's primary context current before the enter"},
            "python_loop": "for _ in range(n): <the peer's enter+exit>, compiled like timeit; "
                           "`python.loop` is that loop's own cost",
            "compiled_loop": "a nogil Cython loop (bench/_bench.pyx); raw driver loops do not check "
                             "return codes, cyctx does",
            "isolation": "each group ran in its own subprocess of run_all.py, in this run, on this "
                         "machine: core (driver floor, cyctx from Cython and Python, empty with), "
                         "threads, memory, and one process per peer. No peer shares a process with "
                         "the floor or with another peer. Each peer process re-measures cyctx's own "
                         "rows (layer 'control': the empty with, `with guard:`, nogil enter/exit) to "
                         "show the spread between processes; a peer target must be met against the "
                         "core group's `with guard:` and against the one in the peer's process. "
                         "The single-threaded groups are pinned to one CPU (pinned_cpu).",
            "checks": "each Python-level row ran once with a probe: current_inside (device 0's "
                      "context current inside the block) and restored (the starting context "
                      "current after it); a peer that fails them does different work and is flagged",
            "restore": _worker.RESTORE_NOTES,
        },
        "groups": {n: {k: r.get(k) for k in ("status", "pid", "cpu", "seconds", "output_tail") if k in r}
                   for n, r in groups.items()},
        "seconds": round(seconds, 1),
        "cost": cost,
        "threads": groups["threads"],
        "memory": groups["memory"],
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few iterations (a smoke run)")
    ap.add_argument("--sim", action="store_true", help="cyctx's simulated driver (no GPU needed)")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--tag", help="name of the output files (default: sim, or the GPU's name)")
    ap.add_argument("--build-dir", help="where to compile _bench.pyx (default: a temporary directory)")
    ap.add_argument("--only", help="comma-separated groups to run (default: all)")
    ap.add_argument("--group-timeout", type=int, default=600, help="seconds per group")
    ap.add_argument("--repeat", type=int, help="processes per single-threaded group (default 3, --quick 1)")
    ap.add_argument("--cpu", type=int, help="CPU to pin the single-threaded groups to (default: the "
                                            "last one this process may use; -1: no pinning)")
    args = ap.parse_args(argv)
    args.repeat = args.repeat or (1 if args.quick else 3)
    if args.cpu is None:
        args.cpu = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else -1
    t0 = time.perf_counter()
    os.makedirs(args.out_dir, exist_ok=True)
    names = ["core", "threads", "memory"] + [f"peer:{p}" for p in _worker.PEERS]
    if args.only:
        wanted = set(args.only.split(","))
        names = [n for n in names if n in wanted or n in ("core",)]
    with tempfile.TemporaryDirectory(prefix="cyctx-bench-") as work:
        build_dir = args.build_dir or os.path.join(work, "build")
        os.makedirs(build_dir, exist_ok=True)
        print(f"run_all: building _bench in {build_dir}", flush=True)
        build(build_dir)
        print(f"run_all: {'simulated' if args.sim else 'real'} driver{', quick' if args.quick else ''}; "
              f"each group in its own process", flush=True)
        groups = {}
        for name in names:
            if args.sim and name.startswith("peer:") and name != "peer:cuda_bindings":
                # They would load the real driver or runtime, not the simulated one.
                groups[name] = {"status": "missing: simulated driver", "rows": []}
                print(f"  {name:20s}    -    missing: simulated driver", flush=True)
                continue
            # Python-level timings differ from one process to the next on some machines (the
            # H200 VM: up to 1.8x, steady within a process): the single-threaded groups run in
            # several processes and report the median.
            reps = [run_group(name, args, build_dir, work)]
            while name not in ("threads", "memory") and len(reps) < args.repeat and reps[-1]["status"] == "ok":
                reps.append(run_group(name, args, build_dir, work, len(reps)))
            groups[name] = merge(reps) if name not in ("threads", "memory") else reps[0]
        for name in ("threads", "memory"):
            groups.setdefault(name, {"status": "not run (--only)", "rows": []})
    result = assemble(args, groups, time.perf_counter() - t0)
    if not args.tag:
        first = (result["gpu"].get("device_names") or [None])[0]
        args.tag = "sim" if args.sim else re.sub(r"\W+", "-", first or "gpu").strip("-").lower()
    result["tag"] = args.tag
    report.evaluate(result)
    text = report.text(result)
    print("\n" + text)
    name = f"bench-{args.tag}"
    with open(os.path.join(args.out_dir, name + ".txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out_dir, name + ".md"), "w") as f:
        f.write(report.markdown(result))
    try:
        import plot

        plots = [os.path.basename(p) for p in plot.plot(result, args.out_dir, args.tag)]
    except ImportError as exc:
        plots = (f"skipped: matplotlib is not installed ({exc}); to draw them later: "
                 f"pip install matplotlib && python bench/plot.py {os.path.join(args.out_dir, name + '.json')}")
        print(f"run_all: plots {plots}")
    # File names, relative to the output directory.
    result["outputs"] = {"json": name + ".json", "table": name + ".txt", "markdown": name + ".md", "plots": plots}
    with open(os.path.join(args.out_dir, name + ".json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    written = [name + ext for ext in (".json", ".txt", ".md")] + (plots if isinstance(plots, list) else [])
    print(f"run_all: wrote {', '.join(written)} in {args.out_dir}")
    failed = [n for n, r in groups.items() if r["status"] != "ok" and not r["status"].startswith(("missing", "not run"))]
    if failed:
        print(f"run_all: groups that failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
