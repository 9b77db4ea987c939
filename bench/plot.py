"""PNG plots of a run_all.py result: cost per enter+exit as bars, thread scaling as lines.

    python bench/plot.py bench/results/bench-TAG.json [--out-dir DIR]

matplotlib (Agg, no display) is optional: run_all.py skips this step, saying why, when it is
not installed, and the JSON holds every number.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402
from report import THREADS16_SPEEDUP_GOAL  # noqa: E402  the report's goal, drawn as is

PATH_STYLE = {
    "fast": ("already current", "#2a7ab0"),
    "from_none": ("from no context", "#e08a1e"),
    "from_other": ("from another context", "#6a9f3a"),
}


def _cost_panel(ax, rows, title):
    import numpy as np

    labels, seen = [], {}
    for r in rows:
        key = (r["id"], r["label"], r.get("group") if r.get("layer") == "control" else "")
        if key not in seen:
            seen[key] = len(labels)
            labels.append(
                r["label"]
                if r.get("layer") != "control"
                else f"{r['label']} [in the {r['group'][5:]} process]"
            )
    paths = [p for p in PATH_STYLE if any(r["path"] == p for r in rows)]
    h = 0.8 / max(len(paths), 1)
    y = np.arange(len(labels))
    finite = [r["ns"] for r in rows if r.get("ns")]
    for i, p in enumerate(paths):
        for r in rows:
            if r["path"] != p:
                continue
            k = seen[(r["id"], r["label"], r.get("group") if r.get("layer") == "control" else "")]
            yy = y[k] - 0.4 + h * (i + 0.5)
            if r.get("ns") is None:
                # Never a zero-length bar: a missing peer is labelled, once per row, with why.
                if i == 0:
                    ax.text(
                        min(finite or [1]),
                        y[k],
                        "  " + r.get("status", "missing"),
                        va="center",
                        fontsize=7,
                        color="0.4",
                    )
                continue
            hatch = (
                "///" if r.get("restored") is False or r.get("current_inside") is False else None
            )
            ax.barh(
                yy,
                r["ns"],
                height=h,
                color=PATH_STYLE[p][1],
                hatch=hatch,
                edgecolor="white",
                label=PATH_STYLE[p][0],
            )
            ax.text(r["ns"], yy, f" {r['ns']:.0f}", va="center", fontsize=7)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ns per enter+exit (median), log scale")
    ax.set_title(title, fontsize=10)
    handles, names = ax.get_legend_handles_labels()
    uniq = dict(zip(names, handles, strict=True))
    ax.legend(uniq.values(), uniq.keys(), fontsize=7, loc="best")


def plot(result, out_dir, tag):
    """Write the two PNGs; returns their paths. ImportError when matplotlib is missing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cost = result["cost"]
    py = [
        r
        for r in cost
        if (r.get("layer") in ("python", "peer") and r["id"] != "python.loop")
        or (r.get("layer") == "control" and r["id"] == "python.guard")
    ]
    compiled = [r for r in cost if r.get("layer") in ("driver", "cython")]
    fig, axes = plt.subplots(
        2,
        1,
        figsize=(11, 4 + 0.32 * (len(py) + len(compiled))),
        gridspec_kw={
            "height_ratios": [
                max(len({r["label"] for r in py}), 1),
                max(len({r["label"] for r in compiled}), 1),
            ]
        },
    )
    _cost_panel(
        axes[0],
        py,
        "From Python: make device 0's context current, then restore\n"
        "(hatched: does less than a guard or does not restore; see the table)",
    )
    _cost_panel(axes[1], compiled, "Compiled nogil loops: driver floor and cyctx from Cython")
    fig.suptitle(_title(result), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    cost_png = os.path.join(out_dir, f"bench-{tag}-cost.png")
    fig.savefig(cost_png, dpi=110)
    plt.close(fig)

    rows = result["threads"].get("rows", [])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for kind, label in report.THREAD_LABELS.items():
        pts = sorted((r["threads"], r["aggregate_ns_per_op"]) for r in rows if r["id"] == kind)
        if not pts:
            continue
        ts, ns = zip(*pts, strict=True)
        a1.plot(ts, ns, marker="o", label=label)
        a2.plot(ts, [ns[0] / x for x in ns], marker="o", label=label)
    counts = sorted({r["threads"] for r in rows}) or [1]
    a2.plot(counts, counts, color="0.7", linestyle=":", label="ideal")
    a2.axhline(
        THREADS16_SPEEDUP_GOAL,
        color="red",
        linewidth=0.8,
        linestyle="--",
        label=f"target at 16 threads: {THREADS16_SPEEDUP_GOAL}x",
    )
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.set_xlabel("threads")
        ax.grid(alpha=0.3)
    a1.set_yscale("log")
    a2.set_yscale("log", base=2)
    ticks = [0.25, 0.5, 1, 2, 4, 8, 16]
    a2.set_yticks(ticks, [f"{x:g}x" for x in ticks])
    a1.set_ylabel("aggregate ns per operation (wall / ops)")
    a1.set_title("Cost per operation, all threads together", fontsize=10)
    a2.set_ylabel("throughput / 1-thread throughput")
    a2.set_title("Speed-up over one thread", fontsize=10)
    a2.legend(fontsize=7)
    fig.suptitle(_title(result), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    threads_png = os.path.join(out_dir, f"bench-{tag}-threads.png")
    fig.savefig(threads_png, dpi=110)
    plt.close(fig)
    return [cost_png, threads_png]


def _title(result):
    g, p = result["gpu"], result["packages"]
    drv = (
        "simulated driver (numbers meaningless)"
        if g["driver"] == "simulated"
        else f"driver {g.get('driver_version')}"
    )
    return (
        f"cyctx {p.get('cyctx')} | {g.get('device_names')} | {drv} | "
        f"Python {result['machine']['python']} | {result['date']}"
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("result")
    ap.add_argument("--out-dir")
    args = ap.parse_args()
    result = report.load(args.result)
    for path in plot(
        result, args.out_dir or os.path.dirname(os.path.abspath(args.result)), result["tag"]
    ):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
