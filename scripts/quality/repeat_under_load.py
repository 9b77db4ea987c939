#!/usr/bin/env python3
"""Run the test suite N times under load and report the tests that failed in some runs only.

A test that passes alone can fail when its threads are scheduled late: on a loaded 2-core
machine, which is what CI runs on. Each run is `pytest -n 2 -p no:benchmark` beside CPU hogs
(busy processes, one per core by default), with a JUnit report read back per run, so each
failure is named with the run it happened in.

    python scripts/quality/repeat_under_load.py               # 20 runs, one hog per core
    python scripts/quality/repeat_under_load.py -n 5 --hogs 4 -- tests/guard
                                                              # arguments after -- go to pytest

Exit status: 0 when every run passed, 1 when some test failed in some runs (intermittent) or
in all of them (a plain failure: reported too, apart), 2 when a run broke (no report).
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _hog(stop) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def failures(junit_path: str) -> list[str]:
    """The ids (file::name) of the tests that failed or errored in one JUnit report."""
    bad = []
    for case in ET.parse(junit_path).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            path = case.get("classname", "").replace(".", "/")
            bad.append(f"{path}.py::{case.get('name')}")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--runs", type=int, default=20, help="how many runs (default 20)")
    ap.add_argument(
        "--hogs",
        type=int,
        default=os.cpu_count() or 2,
        help="busy processes beside the suite (default: one per core)",
    )
    ap.add_argument("--workers", default="2", help="pytest-xdist workers (-n), default 2")
    ap.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.hogs < 0:
        ap.error("--runs must be at least 1 and --hogs at least 0")

    stop = multiprocessing.Event()
    hogs = [
        multiprocessing.Process(target=_hog, args=(stop,), daemon=True) for _ in range(args.hogs)
    ]
    for h in hogs:
        h.start()
    failed_in: dict[str, list[int]] = collections.defaultdict(list)
    broken = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for run in range(1, args.runs + 1):
                junit = os.path.join(tmp, f"run{run}.xml")
                cmd = [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-n",
                    args.workers,
                    "-p",
                    "no:benchmark",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    f"--junitxml={junit}",
                    *args.pytest_args,
                ]
                t0 = time.monotonic()
                proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
                took = time.monotonic() - t0
                if not os.path.exists(junit):
                    broken.append(run)
                    print(
                        f"run {run}: broke (rc {proc.returncode}, no report)\n"
                        f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}",
                        flush=True,
                    )
                    continue
                bad = failures(junit)
                for test in bad:
                    failed_in[test].append(run)
                summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
                print(
                    f"run {run}/{args.runs}: {took:.0f} s, {len(bad)} failed  {summary}", flush=True
                )
    finally:
        stop.set()
        for h in hogs:
            h.join(5)
            if h.is_alive():
                h.kill()

    done = args.runs - len(broken)
    always = {t: r for t, r in failed_in.items() if len(r) == done}
    sometimes = {t: r for t, r in failed_in.items() if len(r) < done}
    print(
        f"\n{args.runs} runs under load ({args.hogs} hogs, -n {args.workers}): "
        f"{len(sometimes)} intermittent, {len(always)} failing in every run, "
        f"{len(broken)} broken runs"
    )
    for t, r in sorted(sometimes.items()):
        print(f"  intermittent: {t}  (failed in runs {r})")
    for t in sorted(always):
        print(f"  always fails: {t}")
    if broken:
        return 2
    return 1 if failed_in else 0


if __name__ == "__main__":
    sys.exit(main())
