"""Run code in a fresh interpreter.

`run_child` is for code that uses cyctx: a prologue repeats this process's driver choice
(drivers.select) before the code makes any driver call, so the child runs on the same
driver. `run_python` is the runner under it, for children with a prologue of their own
(tests/sim/ starts them on the simulator library alone).
"""

import os
import subprocess
import sys
import textwrap

from . import drivers

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code, prologue="", env=None, timeout=120, check=True, cwd=None):
    """`python -c` of prologue + dedented code; returns the CompletedProcess.
    check: a non-zero exit fails the test, with the child's output."""
    proc = subprocess.run(
        [sys.executable, "-c", prologue + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_child(code, timeout=120, check=True, init=True, env=None):
    """Run `code` on this process's driver in a fresh interpreter; returns CompletedProcess.

    The code finds `drivers` (this module's sibling, its choice repeated) and D1 defined, and
    tests/ on sys.path and as the working directory, so it can import helpers and test
    modules. init=False: the prologue selects the driver without calling cuInit. env: more
    environment variables for the child."""
    # D1: the second device where there are two, else device 0 (a one-GPU machine); passed
    # down so that a child that must not initialise the driver has it too.
    prologue = (
        f"import os; from helpers import drivers; "
        f"drivers.select(os.environ['CYCTX_TEST_DRIVER'], init={init}); "
        f"D1 = int(os.environ['CYCTX_TEST_D1'])\n"
    )
    env = {
        **os.environ,
        **(env or {}),
        "CYCTX_TEST_D1": str(drivers.second_device()),
        "PYTHONPATH": TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    return run_python(code, prologue, env=env, timeout=timeout, check=check, cwd=TESTS_DIR)


def run_as_a_user(cmd, cwd, pythonpath=True, timeout=120):
    """Run `cmd` in `cwd` as a user would: without this run's driver choice (CYCTX_TEST_DRIVER:
    a script picks its own) or NO_COLOR; pythonpath=False: without PYTHONPATH too (a module is
    then found from the working directory, as `python -m` finds it)."""
    drop = {"CYCTX_TEST_DRIVER", "NO_COLOR"} | (set() if pythonpath else {"PYTHONPATH"})
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
