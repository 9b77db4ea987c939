"""How the benchmarks measure, apart from what they measure (bench/groups/).

Python-level rows go through pyperf (bench/python_group.py): their cost moves from one process
to the next, so each row runs in worker processes of its own. The compiled rows (the nogil
loops of bench/_bench.pyx) keep their own timer (Timer), one process per group, their rounds
interleaved across rows, since their ratios are taken between rows that must share the
machine's conditions. Both are written as pyperf benchmarks, one suite.

    python bench/harness.py run GROUP --out FILE.json --build-dir DIR [--sim] [--quick] [--cpu N]
    python bench/harness.py build DIR

GROUP is a name in groups.COMPILED; its result goes to FILE.json, not to stdout, which the
peers' libraries may write to. A group has a process of its own because a peer library loads
its own runtime, threads and allocator, the memory group's check that no primary context is
left active means something only where nothing else retained, and idle OpenMP threads must not
run beside single-thread timings.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import types
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))


class Timer:
    """The compiled rows' rounds, each sized by calibration to last about `round_s` seconds,
    whatever the operation costs (10 ns or 10 us)."""

    def __init__(self, quick):
        # Many short rounds rather than a few long ones: on a shared machine the slow spells
        # come and go, and a median over more rounds is less at their mercy.
        self.round_s = 0.002 if quick else 0.02
        self.rounds = 3 if quick else 15

    @staticmethod
    def _time(fn, n, setup):
        if setup:
            setup()
        t0 = time.perf_counter()
        fn(n)
        return time.perf_counter() - t0

    def calibrate(self, fn, setup=None, round_s=None):
        round_s = round_s or self.round_s
        n = 1
        while True:
            t = self._time(fn, n, setup)
            if t >= round_s / 10 or n >= 1 << 32:
                return max(1, int(n * round_s / max(t, 1e-9)))
            n *= 8

    def rounds_of(self, specs):
        """[(n, warm-up, [seconds per operation of each round])] of each fn(n) (which runs n
        operations) in specs [(fn, setup)].

        Rounds are interleaved: round r of every spec runs before round r+1 of any, after a
        warm-up round of each. Slow drift (clock ramp-up at the start of a process, a noisy
        neighbour) then spreads over all rows alike instead of landing on whichever ran first.
        """
        ns = [self.calibrate(fn, setup) for fn, setup in specs]
        values = [[] for _ in specs]
        for _ in range(self.rounds + 1):  # the first is the warm-up
            for (fn, setup), n, vals in zip(specs, ns, values, strict=True):
                vals.append(self._time(fn, n, setup) / n)
        return [(n, vals[0], vals[1:]) for n, vals in zip(ns, values, strict=True)]


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


def check(env, case, loop, start):
    """Run a row once from its start context; what its checks found, as metadata (1: yes).

    `restored`: the start context is current after it; `current_inside`: device 0's context
    (env.h0) is current inside the block (probe). A row that raises stops its group.
    """
    env.set_start(start)
    try:
        found = {}
        if "current_inside" in case.checks:
            found["current_inside"] = int(probe(loop, env.current) == env.h0)
        else:
            loop(1)
        if "restored" in case.checks:
            found["restored"] = int(env.current() == start)
        return found
    finally:
        env.set_start(0)


def describe(group, case, path):
    """A row's metadata: which row of which group, on which start path."""
    meta = {"group": group, "row": case.id, "path": path, "layer": case.layer}
    meta.update({k: v for k, v in (("label", case.label), ("note", case.note)) if v})
    return meta


def benchmark(name, values, loops, metadata, warmup=None):
    """One process's values (seconds per operation) as a pyperf benchmark."""
    import pyperf

    meta = dict(metadata, name=name, loops=loops, unit="second")
    warmups = [(loops, warmup)] if warmup is not None else None
    return pyperf.Benchmark([pyperf.Run(values, warmups=warmups, metadata=meta)])


def rows(timer, env, cases, group):
    """The compiled rows of `cases`, each on every path env has a start context for: checked
    one by one, then timed together (Timer.rounds_of); pyperf benchmarks."""
    specs, names = [], []
    for c in cases:
        for path in c.paths:
            if path not in env.starts:
                continue
            start = env.starts[path]
            loop = c.make(env, path)
            meta = describe(group, c, path) | check(env, c, loop, start) | env.info
            names.append((f"{group}/{c.id}/{path}", meta))
            specs.append((loop, partial(env.set_start, start)))
    timed = timer.rounds_of(specs)
    env.set_start(0)
    return [
        benchmark(name, values, n, meta, warm)
        for (name, meta), (n, warm, values) in zip(names, timed, strict=True)
    ]


class Process(NamedTuple):
    """What the harness lends one compiled group's process (groups.COMPILED)."""

    bench: Any  # the compiled loops, bench/_bench.pyx
    timer: Timer
    quick: bool
    rows: Callable  # rows(env, cases, group) -> [pyperf.Benchmark]
    benchmark: Callable  # benchmark(name, values, loops, metadata, warmup=None)


# --- a compiled group's worker process ---------------------------------------------------------


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


def built(build_dir):
    """The _bench module, compiled in build_dir unless it is there already (by `harness.py
    build`, in a process of its own: build_here changes directory), imported."""
    if not os.path.exists(build_dir) or not any(
        f.startswith("_bench.") and f.endswith(".so") for f in os.listdir(build_dir)
    ):
        os.makedirs(build_dir, exist_ok=True)
        subprocess.run(
            [sys.executable, os.path.join(HERE, "harness.py"), "build", build_dir],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    sys.path.insert(0, build_dir)
    import _bench

    return _bench


def run_group(args):
    import pyperf

    if args.cpu is not None and args.group != "threads" and hasattr(os, "sched_setaffinity"):
        # Every single-threaded process on the same CPU (pyperf's workers too: --affinity):
        # no migrations mid-round, and the processes compared ran where each other ran.
        os.sched_setaffinity(0, {args.cpu})
    if args.sim:
        from cyctx.testing import use_simulated_driver

        use_simulated_driver(2)  # before any driver call in this process
    sys.path.insert(0, args.build_dir)
    import _bench
    import groups

    timer = Timer(args.quick)
    result = groups.COMPILED[args.group](
        Process(_bench, timer, args.quick, partial(rows, timer), benchmark)
    )
    if isinstance(result, dict):
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    else:
        pyperf.BenchmarkSuite(result).dump(args.out, replace=True)
    return 0


def worker(argv=None):
    ap = argparse.ArgumentParser(
        description="One compiled benchmark group in this process (bench/run_all.py runs these)."
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


# --- run_all.py's side: what the report says of the machine -------------------------------------


def gpu_info(sim):
    """GPU and driver as the machine reports them (nvidia-smi, /proc), not through the driver
    library: this process never loads libcuda, so it cannot pick the wrong one."""
    if sim:
        return {"driver": "simulated"}
    info = {"driver": "real"}
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
        "pyperf",
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


if __name__ == "__main__":
    sys.exit(worker())
