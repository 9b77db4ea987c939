"""`cyctx trace` writes one report and one --json, the traced process's, however that process
ends: os._exit (from the main thread or another) as well as sys.exit or an exception; a child
the script forks is the script's, and ends as the script says without a report of its own
(which repeated the parent's events and wrote a second document into the parent's JSON)."""

import json
import sys
import textwrap

import pytest
from helpers.children import run_as_a_user

# Picks the simulated driver, makes one context change, then does what its arguments say:
# `parent ENDING` ends the traced process so; `child ENDING` forks a child that ends so, waits
# for it, makes another change and exits with the child's status.
APP = """
import os, sys, threading
from cyctx.testing import use_simulated_driver
use_simulated_driver(2)
import cyctx

def end(how):
    if how == "os._exit":
        os._exit(7)
    if how == "os._exit-from-a-thread":
        t = threading.Thread(target=os._exit, args=(7,))
        t.start()
        t.join()
    if how == "sys.exit":
        sys.exit(7)
    if how == "raise":
        raise ValueError("the child failed")
    # "returns": falls off the end of the script

with cyctx.ContextGuard(0):
    pass
who, how = sys.argv[1:3]
if who == "parent":
    end(how)
else:
    pid = os.fork()
    if pid == 0:
        end(how)
    else:
        _, status = os.waitpid(pid, 0)
        with cyctx.ContextGuard(1):
            pass
        print("child status", os.waitstatus_to_exitcode(status), flush=True)
        sys.exit(os.waitstatus_to_exitcode(status))
"""


def _trace(tmp_path, *args):
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(APP))
    cmd = [sys.executable, "-m", "cyctx", "trace", "--simulate", "--json", "t.json"]
    return run_as_a_user([*cmd, str(app), *args], tmp_path)


def _one_report(tmp_path, got, events):
    reports = [ln for ln in got.stderr.splitlines() if ln.startswith("cyctx trace:")]
    assert reports == [f"cyctx trace: {events} events on 1 thread, through the simulated driver"], (
        got.stderr[-3000:]
    )
    data = json.loads((tmp_path / "t.json").read_text())  # one document, whole
    assert data["active"] is True and len(data["events"]) == events


@pytest.mark.parametrize("how", ["os._exit", "os._exit-from-a-thread"])
def test_the_traced_process_ending_by_os_exit_writes_the_report_and_json(tmp_path, how):
    got = _trace(tmp_path, "parent", how)
    assert got.returncode == 7, got.stderr[-3000:]
    _one_report(tmp_path, got, 4)


@pytest.mark.parametrize("how", ["returns", "sys.exit", "raise", "os._exit"])
def test_a_forked_child_ends_as_the_script_says_and_writes_no_report(tmp_path, how):
    got = _trace(tmp_path, "child", how)
    status = {"returns": 0, "sys.exit": 7, "raise": 1, "os._exit": 7}[how]
    assert got.returncode == status, got.stderr[-3000:]
    assert f"child status {status}" in got.stdout
    if how == "raise":
        assert "ValueError: the child failed" in got.stderr  # the child's account is its own
    _one_report(tmp_path, got, 8)
