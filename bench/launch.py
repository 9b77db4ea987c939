"""The guard in a real workload: kernel launches from nogil threads, with and without guards.

    python bench/launch.py [--out-dir bench/results] [--tag NAME] [--quick]

Builds examples/kernels (an NVRTC kernel launched through cydriver from nogil threads, each
thread on its own stream) against the installed cyctx in a scratch folder, then measures the
aggregate launch rate for 1, 2, 4, 8 and 16 threads, on one GPU and, where there are several,
spread over all of them, with each of the example's modes around the launches:

  guard_per_launch   `with guard:` around every launch (enter + exit + launch)
  guard_per_batch    one `with guard:` around the whole loop (the launch alone)
  raw_push_pop       cuCtxPushCurrent/cuCtxPopCurrent around every launch, no guard
  raw_set_current    cuCtxSetCurrent(ctx)/cuCtxSetCurrent(NULL) around every launch, no guard
                     (what the guard's switching path does from a thread with no context)
  guard_launch_sync  `with guard:` around launch + cuStreamSynchronize

bench/README.md, "The guard in a real workload", tells the method and reads a run. Needs a GPU
and the nvidia-cuda-nvrtc wheel. Writes launch-TAG.json (every round), launch-TAG.txt and, with
matplotlib, launch-TAG.png. Not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join(os.path.dirname(HERE), "examples", "kernels")
THREADS = (1, 2, 4, 8, 16)
MODES = (
    "guard_per_launch",
    "guard_per_batch",
    "raw_push_pop",
    "raw_set_current",
    "guard_launch_sync",
)


def build(scratch: str):
    dst = os.path.join(scratch, "kernels")
    shutil.copytree(KERNELS, dst)
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=dst,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    sys.path.insert(0, os.path.join(dst, "src"))
    import cyctx_kernels

    return cyctx_kernels


def measure(ck, kernels, threads, mode, launches):
    """One round of one mode: launches per second, the results checked on the device."""
    r = ck.run_threads(kernels, threads, launches, n=256, mode=mode)
    if any(r["wrong"]):
        raise SystemExit(f"wrong results: {mode} x{threads}: {r['wrong']}")
    return r["launches_per_s"]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--tag", default=None)
    ap.add_argument(
        "--quick", action="store_true", help="few launches: a smoke run, numbers mean little"
    )
    args = ap.parse_args(argv)

    from cuda.bindings import driver as d

    import cyctx

    scratch = tempfile.mkdtemp(prefix="cyctx-launch-")
    ck = build(scratch)
    d.cuInit(0)
    ndev = d.cuDeviceGetCount()[1]
    name = d.cuDeviceGetName(64, 0)[1].split(b"\0")[0].decode()
    tag = args.tag or name.lower().replace(" ", "-")
    device_sets = [[0]] + ([list(range(ndev))] if ndev > 1 else [])
    launches = {"guard_launch_sync": 200 if args.quick else 2000}
    default_launches = 500 if args.quick else 20000

    # Rounds outside, modes inside: every round measures each mode once, in turn, so a drift of
    # the machine (clocks, the driver's queues) spreads over all modes instead of landing on
    # whichever ran first; the figure is the median over the rounds.
    rounds = 1 if args.quick else 5
    rows = []
    for devs in device_sets:
        kernels = ck.load(devs)
        for t in THREADS:
            samples = {m: [] for m in MODES}
            for _ in range(rounds):
                for mode in MODES:
                    n = launches.get(mode, default_launches)
                    samples[mode].append(measure(ck, kernels, t, mode, n))
            for mode in MODES:
                rate_ = statistics.median(samples[mode])
                rows.append(
                    {
                        "gpus": len(devs),
                        "mode": mode,
                        "threads": t,
                        "launches_per_thread": launches.get(mode, default_launches),
                        "launches_per_s": rate_,
                        "ns_per_launch_aggregate": 1e9 / rate_,
                        "rounds": [round(x) for x in samples[mode]],
                    }
                )
                print(
                    f"{len(devs)} GPU(s)  {mode:18s} {t:2d} threads  {rate_ / 1e6:7.3f} M launches/s  "
                    f"{1e9 / rate_:8.1f} ns/launch  (rounds: {', '.join(f'{x / 1e6:.3f}' for x in samples[mode])})",
                    flush=True,
                )
        for k in kernels:
            k.close()

    def rate(g, m, t):
        return next(
            r["launches_per_s"]
            for r in rows
            if r["gpus"] == g and r["mode"] == m and r["threads"] == t
        )

    cost = []
    for devs in device_sets:
        g = len(devs)
        for t in THREADS:
            per_launch = 1e9 / rate(g, "guard_per_launch", t) * t  # ns per launch, per thread
            batch = 1e9 / rate(g, "guard_per_batch", t) * t
            raw = 1e9 / rate(g, "raw_push_pop", t) * t
            setc = 1e9 / rate(g, "raw_set_current", t) * t
            cost.append(
                {
                    "gpus": g,
                    "threads": t,
                    "launch_ns_per_thread": batch,
                    "guard_ns_per_launch": per_launch - batch,
                    "guard_fraction_of_launch": (per_launch - batch) / batch,
                    "raw_push_pop_fraction_of_launch": (raw - batch) / batch,
                    "raw_set_current_fraction_of_launch": (setc - batch) / batch,
                }
            )

    lines = [
        f"Kernel launches from nogil threads (aggregate, median of {rounds} interleaved rounds)",
        "",
    ]
    lines.append(
        f"{'GPUs':>4}  {'threads':>7}  "
        + "  ".join(f"{m:>18}" for m in MODES)
        + "   (M launches/s)"
    )
    for devs in device_sets:
        for t in THREADS:
            lines.append(
                f"{len(devs):>4}  {t:>7}  "
                + "  ".join(f"{rate(len(devs), m, t) / 1e6:>18.3f}" for m in MODES)
            )
    lines += [
        "",
        "The guard's cost as a fraction of a launch ((per launch - per batch) / per batch):",
    ]
    for c in cost:
        lines.append(
            f"  {c['gpus']} GPU(s), {c['threads']:2d} threads: launch {c['launch_ns_per_thread']:7.1f} ns/thread, "
            f"guard {c['guard_ns_per_launch']:7.1f} ns = {100 * c['guard_fraction_of_launch']:5.1f}% "
            f"(raw push/pop instead: {100 * c['raw_push_pop_fraction_of_launch']:5.1f}%, "
            f"raw cuCtxSetCurrent pair: {100 * c['raw_set_current_fraction_of_launch']:5.1f}%)"
        )
    text = "\n".join(lines)
    print(text)

    os.makedirs(args.out_dir, exist_ok=True)
    import cuda.bindings

    meta = {
        "schema": "cyctx-launch/1",
        "gpu": name,
        "devices": ndev,
        "driver_api_version": d.cuDriverGetVersion()[1],
        "cyctx": cyctx.__version__,
        "cuda_bindings": cuda.bindings.__version__,
        "python": platform.python_version(),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "quick": args.quick,
        "kernel": "add(float* x, int n=256, float v): one block of 256 threads",
    }
    with open(os.path.join(args.out_dir, f"launch-{tag}.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "guard_cost": cost}, f, indent=1)
    with open(os.path.join(args.out_dir, f"launch-{tag}.txt"), "w") as f:
        f.write(text + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("launch: matplotlib not installed, no plot")
    else:
        fig, axes = plt.subplots(
            1, len(device_sets), figsize=(6 * len(device_sets), 4), squeeze=False
        )
        for ax, devs in zip(axes[0], device_sets, strict=True):
            for m in MODES:
                ax.plot(
                    THREADS, [rate(len(devs), m, t) / 1e6 for t in THREADS], marker="o", label=m
                )
            ax.set_xscale("log", base=2)
            ax.set_xticks(THREADS, [str(t) for t in THREADS])
            ax.set_xlabel("nogil threads")
            ax.set_ylabel("M launches/s (aggregate)")
            ax.set_title(f"{name}: {len(devs)} GPU(s)")
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out_dir, f"launch-{tag}.png"), dpi=110)
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
