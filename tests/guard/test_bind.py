"""cyctx.bind, through its cases in tests/helpers/bind_cases.py, run by pytest in a child process
on this run's driver: a device binding holds the device's shared guard, whose retain lasts for
the process, so the cases must not share a process with tests that count retains."""

import os
import re
import subprocess
import sys

import pytest
from helpers.children import TESTS_DIR

CASES = os.path.join(TESTS_DIR, "helpers", "bind_cases.py")


@pytest.mark.multigpu  # the cases bind devices 0 and 1
def test_bind_cases_pass_in_a_process_of_their_own():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:benchmark",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            "-q",
            "-o",
            "python_files=bind_cases.py",
            CASES,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=TESTS_DIR,
        env={**os.environ, "PYTHONPATH": TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    n = int(re.search(r"(\d+) passed", tail).group(1))
    with open(CASES, encoding="utf-8") as f:
        cases = f.read().count("\ndef test_")
    assert n >= cases and "failed" not in tail and "error" not in tail, tail
