"""The suite's own collection hook (tests/conftest.py), run in a pytest of its own: the tools'
tests are skipped unless --tooling, and under pytest-run-parallel a test that reads or changes
what all its copies share runs on one thread. One hook does both (a second definition of it in
the conftest would replace the first)."""

import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
# A test of the tools (marked tooling through its module) and one that takes the sim fixture.
TOOLING_TEST = os.path.join(
    TESTS, "test_bench_smoke.py::test_the_free_threading_costs_run_and_say_which_interpreter"
)
SIM_TEST = os.path.join(TESTS, "guard", "test_close.py::test_close_from_two_threads_releases_once")


def pytest_run(tmp_path, *args):
    return subprocess.run(
        # pytest-benchmark, where installed beside xdist, warns at configure: an error here.
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:benchmark",
            "-rs",
            "-v",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # outside the checkout, as the suite is run
        timeout=300,
    )


def test_a_tools_test_is_skipped_without_tooling(tmp_path):
    proc = pytest_run(tmp_path, TOOLING_TEST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 skipped" in proc.stdout and "run with --tooling" in proc.stdout, proc.stdout


def test_under_run_parallel_the_tools_are_still_skipped_and_a_sim_test_runs_on_one_thread(tmp_path):
    pytest.importorskip("pytest_run_parallel", reason="needs pytest-run-parallel (the test extra)")
    proc = pytest_run(tmp_path, "--parallel-threads=2", TOOLING_TEST, SIM_TEST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 skipped" in proc.stdout and "run with --tooling" in proc.stdout, proc.stdout
    assert "was not run in parallel" in proc.stdout and "(sim)" in proc.stdout, proc.stdout
