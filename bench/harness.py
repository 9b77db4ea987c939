"""How the benchmarks measure, apart from what they measure (bench/groups/).

  Timer           rounds sized by calibration, interleaved across the rows of a process,
                  the median of each row after a warm-up round
  probe, measure  each row run once and checked (does it do a guard's work?), then all the
                  rows of a process timed together
  build           compile bench/_bench.pyx against the installed cyctx, into a scratch folder
  spawn, merge    one group's process (a worker, below), and the median over its processes
  assemble, write the result: machine, GPU, driver, package versions, the method, every row;
                  bench-TAG.json, .txt, .md and the plots

run_all.py drives it. A worker is one group in its own process:

    python bench/harness.py run GROUP --out FILE.json --build-dir DIR [--sim] [--quick] [--cpu N]
    python bench/harness.py build DIR

GROUP is a name in groups.PROCESSES. The result goes to FILE.json, not to stdout, which the
peers' libraries may write to. Why a process per group: a peer library (torch, CuPy, numba)
must not share a process with the floor measurements (it loads its own runtime, threads and
allocator), the memory group checks that no primary context is left active, which only means
something in a process that nothing else retained in, and idle OpenMP threads of the thread
group must not run beside single-thread timings.
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
import time
import traceback
import types
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(HERE, "harness.py")
SCHEMA = "cyctx-bench/1"


class Timer:
    """Median of repeated rounds after a warm-up; each round's size is calibrated so that it
    lasts about `round_s` seconds, whatever the operation costs (10 ns or 10 us)."""

    def __init__(self, quick):
        # Many short rounds rather than a few long ones: on a shared machine the slow spells
        # come and go, and a median over more rounds is less at their mercy.
        self.round_s = 0.002 if quick else 0.02
        self.rounds = 3 if quick else 15

    @staticmethod
    def _time(fn, n, setup):
        if setup:
            setup()
        t0 = time.perf_counter_ns()
        fn(n)
        return time.perf_counter_ns() - t0

    def calibrate(self, fn, setup=None, round_s=None):
        round_s = round_s or self.round_s
        n = 1
        while True:
            t = self._time(fn, n, setup)
            if t >= round_s * 1e9 / 10 or n >= 1 << 32:
                return max(1, int(n * round_s * 1e9 / max(t, 1)))
            n *= 8

    def measure_many(self, specs):
        """ns per operation of each fn(n) (which runs n operations) in specs [(fn, setup)].

        Rounds are interleaved: round r of every spec runs before round r+1 of any, after a
        warm-up round of each. Slow drift (clock ramp-up at the start of a process, a noisy
        neighbour) then spreads over all rows alike instead of landing on whichever ran first;
        ratios are taken between rows of one such set. A spec that raises gets an "error".
        """
        out = [{} for _ in specs]
        ns = []
        for (fn, setup), res in zip(specs, out, strict=True):
            try:
                ns.append(self.calibrate(fn, setup))
            except Exception as exc:
                ns.append(None)
                res["error"] = f"{type(exc).__name__}: {exc}"
        samples = [[] for _ in specs]
        for r in range(self.rounds + 1):  # round 0 is the warm-up
            for i, ((fn, setup), n) in enumerate(zip(specs, ns, strict=True)):
                if "error" in out[i]:
                    continue
                try:
                    t = self._time(fn, n, setup)
                except Exception as exc:
                    out[i]["error"] = f"{type(exc).__name__}: {exc}"
                    continue
                if r:
                    samples[i].append(t / n)
        for res, smp, n in zip(out, samples, ns, strict=True):
            if "error" not in res:
                res.update(
                    ns=round(statistics.median(smp), 2),
                    min=round(min(smp), 2),
                    max=round(max(smp), 2),
                    n=n,
                    rounds=self.rounds,
                )
        return out


def probe(loop, current):
    """Run a Python-level loop once (n=1) and return what current() read inside its block.

    The body is `for _ in range(n):`, its enter on the next line, then the rest (bench/groups/
    from_python.py); the third line event of its frame is the first line after the enter, so
    that is where the context is read. What runs is the timed function's own bytecode, not a
    copy with a probe written into it, so the check is of what the numbers measure; but in a
    fresh code object (code.replace()), because tracing a code object leaves it about 1%
    slower on Python 3.12 (instrumented bytecode), and the timed one must stay untraced.
    """
    func = getattr(loop, "func", loop)  # a body bound to its objects with partial
    code = func.__code__.replace()
    twin = types.FunctionType(
        code, func.__globals__, func.__name__, func.__defaults__, func.__closure__
    )
    lines, seen = [], []

    def trace(frame, event, arg):
        if frame.f_code is not code:
            return None
        if event == "line":
            lines.append(frame.f_lineno)
            if len(lines) == 3:
                seen.append(current())
        return trace

    old = sys.gettrace()
    sys.settrace(trace)
    try:
        twin(*getattr(loop, "args", ()), 1)
    finally:
        sys.settrace(old)
    if not seen:
        raise RuntimeError(f"{func.__name__}: not a `for` loop with its enter on the next line")
    return seen[0]


def measure(timer, env, cases):
    """The rows of `cases` (groups.Case), each on every path env has a start context for.

    Each is run once from its start context and checked: `restored`, the start context is
    current after it; `current_inside`, device 0's context (env.h0) is current inside the
    block (probe). Then all are timed together (Timer.measure_many), so that the rows compared
    with each other share the conditions. A Python-level row that raises (a peer failing) is
    a result to report; anything else that raises stops the process.
    """
    rows, timed = [], []
    for c in cases:
        for path in c.paths:
            if path not in env.starts:
                continue
            start = env.starts[path]
            row = {"id": c.id, "label": c.label, "path": path, "layer": c.layer, "note": c.note}
            rows.append(row)
            try:
                loop = c.make(env, path)
                env.set_start(start)
                if "current_inside" in c.checks:
                    row["current_inside"] = probe(loop, env.current) == env.h0
                else:
                    loop(1)
                if "restored" in c.checks:
                    row["restored"] = env.current() == start
            except Exception as exc:
                if not c.python:
                    raise
                row.update(ns=None, status=f"error: {type(exc).__name__}: {exc}")
                continue
            finally:
                env.set_start(0)
            timed.append((row, loop, start))
    results = timer.measure_many(
        [(loop, partial(env.set_start, start)) for _, loop, start in timed]
    )
    for (row, _, _), res in zip(timed, results, strict=True):
        if "error" in res:
            row.update(ns=None, status=f"error: {res['error']}")
        else:
            row.update(res, status="ok")
    env.set_start(0)
    return rows


class Process(NamedTuple):
    """What the harness lends one group's process (groups.PROCESSES)."""

    bench: Any  # the compiled loops, bench/_bench.pyx
    timer: Timer
    quick: bool
    measure: Callable  # measure(env, cases) -> rows


# --- the worker: one group in this process --------------------------------------------------


def build_here(build_dir):
    """Compile _bench.pyx in build_dir (never in the source tree, which others share).

    Against the installed cyctx: its .pxd files, cuda.h (cyctx.get_include_dirs()) and its
    package directory, for the _cpp/thread_entries.h whose tls_push/tls_pop_own the `cython.tls` row
    times. That header ships in the wheel (pyproject.toml's package data, with the other
    headers), so this works wherever cyctx is installed, and it is the header the installed
    cyctx was built from: the other rows time that cyctx, and the report sets the stack's cost
    beside theirs. A checkout's src/cyctx/_cpp/thread_entries.h need not be: scripts/gpu/run.sh, for one,
    installs a release wheel and runs bench/ from the checkout.
    """

    from Cython.Build import cythonize
    from setuptools import Extension, setup

    import cyctx

    shutil.copy(os.path.join(HERE, "_bench.pyx"), build_dir)
    os.chdir(build_dir)
    ext = Extension(
        "_bench",
        ["_bench.pyx"],
        include_dirs=[*cyctx.get_include_dirs(), os.path.dirname(cyctx.__file__)],
        language="c++",
        extra_compile_args=["-std=c++17", "-O2", "-fopenmp"],
        extra_link_args=["-fopenmp"],
    )
    setup(
        name="_bench",
        ext_modules=cythonize([ext], quiet=True),
        script_args=["build_ext", "--inplace"],
    )


def run_group(args):
    pinned = None
    if args.cpu is not None and args.group != "threads" and hasattr(os, "sched_setaffinity"):
        # Every single-threaded group on the same CPU: no migrations mid-round, and the
        # processes compared with each other ran where each other ran.
        os.sched_setaffinity(0, {args.cpu})
        pinned = args.cpu
    if args.sim:
        from cyctx.testing import use_simulated_driver

        use_simulated_driver(2)  # before any driver call in this process
    sys.path.insert(0, args.build_dir)
    timer = Timer(args.quick)
    t0 = time.perf_counter()
    try:
        import _bench
        import groups

        run = groups.PROCESSES[args.group]
        result = run(Process(_bench, timer, args.quick, partial(measure, timer)))
        result.setdefault("status", "ok")
    except Exception as exc:
        result = {
            "status": f"error: {type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    result.update(
        group=args.group, pid=os.getpid(), cpu=pinned, seconds=round(time.perf_counter() - t0, 2)
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0 if result["status"] == "ok" or result["status"].startswith("missing") else 1


def worker(argv=None):
    ap = argparse.ArgumentParser(
        description="One benchmark group in this process (bench/run_all.py runs these)."
    )
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile bench/_bench.pyx into DIR")
    b.add_argument("dir")
    r = sub.add_parser("run", help="run one group, its result to --out")
    r.add_argument("group")
    r.add_argument("--out", required=True)
    r.add_argument("--build-dir", required=True)
    r.add_argument("--sim", action="store_true")
    r.add_argument("--quick", action="store_true")
    r.add_argument("--cpu", type=int, help="pin this process to one CPU (not the threads group)")
    args = ap.parse_args(argv)
    if args.command == "build":
        build_here(args.dir)
        return 0
    return run_group(args)


# --- run_all.py's side --------------------------------------------------------------------


def build(build_dir):
    proc = subprocess.run(
        [sys.executable, HARNESS, "build", build_dir], capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(
            f"run_all: building bench/_bench.pyx failed:\n{(proc.stdout + proc.stderr)[-6000:]}"
        )


def spawn(group, args, build_dir, work, rep=0):
    """Run `group` in a worker process; its result, with the output's tail when it failed."""
    out = os.path.join(work, f"{re.sub(r'[^a-z_]', '_', group)}-{rep}.json")
    cmd = [sys.executable, HARNESS, "run", group, "--out", out, "--build-dir", build_dir]
    cmd += (
        ["--sim"] * args.sim
        + ["--quick"] * args.quick
        + ([f"--cpu={args.cpu}"] if args.cpu >= 0 else [])
    )
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
    by_key = [
        {(row["layer"], row["id"], row["path"]): row for row in r.get("rows", [])} for r in results
    ]
    rows = []
    for row in results[0].get("rows", []):
        key = (row["layer"], row["id"], row["path"])
        same = [b.get(key) or {} for b in by_key]
        vals = [r.get("ns") for r in same]
        good = [v for v in vals if v is not None]
        m = dict(row, per_process_ns=vals)
        if good:
            m.update(
                ns=round(statistics.median(good), 2),
                status="ok",
                min=min(r["min"] for r in same if r.get("ns") is not None),
                max=max(r["max"] for r in same if r.get("ns") is not None),
            )
        for check in ("current_inside", "restored"):
            if check in row:
                m[check] = all(r.get(check, True) for r in same)
        rows.append(m)
    merged["rows"] = rows
    return merged


def machine():
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "cpu_count": os.cpu_count(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None
            )
    except OSError:
        info["cpu"] = None
    return info


def gpu_info(sim, core):
    """GPU and driver as the machine reports them (nvidia-smi, /proc), not through the driver
    library: this process never loads libcuda, so it cannot pick the wrong one."""
    info = {
        "driver": "simulated" if sim else "real",
        "devices": core.get("devices"),
        "device_names": core.get("device_names"),
        "cuda_driver_api_version": core.get("driver_api_version"),
    }
    if sim:
        return info
    try:
        smi = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=index,name,driver_version,memory.total,pci.bus_id",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        info["nvidia_smi"] = [ln.strip() for ln in smi.stdout.splitlines() if ln.strip()]
        info["driver_version"] = (
            info["nvidia_smi"][0].split(",")[2].strip() if info["nvidia_smi"] else None
        )
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

    wanted = (
        "cyctx",
        "cuda-bindings",
        "cuda-core",
        "cuda-pathfinder",
        "nvidia-cuda-runtime",
        "Cython",
        "setuptools",
        "torch",
        "numba",
        "numba-cuda",
        "matplotlib",
    )
    out = {}
    for name in wanted:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    # CuPy's distribution is named after its CUDA flavour (cupy-cuda13x, cupy-cuda12x, cupy).
    cupy = sorted(
        {
            d.metadata["Name"]: d.version
            for d in metadata.distributions()
            if (d.metadata["Name"] or "").lower().startswith("cupy")
        }.items()
    )
    out["cupy"] = " ".join(f"{n}=={v}" for n, v in cupy) or None
    try:
        from cyctx._build_info import BUILD_INFO

        out["cyctx_build_info"] = BUILD_INFO
    except ImportError:
        out["cyctx_build_info"] = None
    return out


def assemble(args, groups_run, seconds):
    """The result of a run: what was measured, how, where, and every row."""
    from groups import PATHS, peers

    core = groups_run["core"] if groups_run["core"]["status"] == "ok" else {}
    paths = [
        p
        for p in PATHS
        if p != "from_other" or core.get("other_context") or (core.get("devices") or 0) > 1
    ]
    cost = []
    for name, res in groups_run.items():
        for row in res.get("rows", []) if name != "threads" else []:
            cost.append(dict(row, group=name))
        if name.startswith("peer:") and not res.get("rows"):
            # Listed, with the reason, so a missing peer can never read as zero.
            for row_id, label in peers.rows(name[5:]):
                cost += [
                    {
                        "id": row_id,
                        "label": label,
                        "path": p,
                        "layer": "peer",
                        "group": name,
                        "ns": None,
                        "status": res["status"],
                    }
                    for p in paths
                ]
    timer = Timer(args.quick)
    return {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "tag": args.tag,
        "mode": {"driver": "simulated" if args.sim else "real", "quick": args.quick},
        "machine": machine(),
        "gpu": gpu_info(args.sim, core),
        "packages": packages(),
        "method": {
            "timer": "time.perf_counter_ns around a loop of n operations",
            "statistic": "median ns per operation over rounds, after one discarded warm-up round",
            "rounds": timer.rounds,
            "processes": args.repeat,
            "across_processes": "core and each peer ran in `processes` processes one after another; a "
            "row's ns is the median over them, per_process_ns lists each; ratios "
            "are taken within each process, then the median",
            "pinned_cpu": args.cpu if args.cpu >= 0 else None,
            "round_seconds": timer.round_s,
            "paths": {
                "fast": "the target context already current",
                "from_none": "no context current before the enter",
                "from_other": "another context current before the enter: "
                + (core.get("other_context") or "device 1's primary context"),
            },
            "python_loop": "a plain Python function per row (bench/groups/): for _ in range(n): <the "
            "enter+exit>, its objects passed in as arguments; `python.loop` is that "
            "loop's own cost",
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
            "checks": "each Python-level row ran once first, traced: current_inside (device 0's "
            "context current inside the block) and restored (the starting context "
            "current after it); a peer that fails them does different work and is flagged",
            "restore": peers.RESTORE_NOTES,
        },
        "groups": {
            n: {k: r.get(k) for k in ("status", "pid", "cpu", "seconds", "output_tail") if k in r}
            for n, r in groups_run.items()
        },
        "seconds": round(seconds, 1),
        "cost": cost,
        "threads": groups_run["threads"],
        "memory": groups_run["memory"],
    }


def write(result, out_dir):
    """Evaluate the targets (report.py), print the table and write bench-TAG.json, .txt, .md
    and, with matplotlib, the plots into out_dir; returns the names written."""
    import report

    report.evaluate(result)
    text = report.text(result)
    print("\n" + text)
    name = f"bench-{result['tag']}"
    with open(os.path.join(out_dir, name + ".txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out_dir, name + ".md"), "w") as f:
        f.write(report.markdown(result))
    try:
        import plot

        plots = [os.path.basename(p) for p in plot.plot(result, out_dir, result["tag"])]
    except ImportError as exc:
        plots = (
            f"skipped: matplotlib is not installed ({exc}); to draw them later: "
            f"pip install matplotlib && python bench/plot.py {os.path.join(out_dir, name + '.json')}"
        )
        print(f"run_all: plots {plots}")
    # File names, relative to the output directory.
    result["outputs"] = {
        "json": name + ".json",
        "table": name + ".txt",
        "markdown": name + ".md",
        "plots": plots,
    }
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    return [name + ext for ext in (".json", ".txt", ".md")] + (
        plots if isinstance(plots, list) else []
    )


if __name__ == "__main__":
    sys.exit(worker())
