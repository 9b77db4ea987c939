"""The mutation tool (scripts/quality/mutate.py) run for real on a small suite: a mutant of a
header that only the compiler's include path reaches (cyctx/switch.h, under include/) is rebuilt
into the extension and killed, and a mutant that hangs is reported with the test that hung."""

import json
import os
import subprocess
import sys

import pytest
from helpers import drivers

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TOOL = os.path.join(REPO, "scripts", "quality", "mutate.py")

# Killed only when the extension is rebuilt with the mutated header: an id that the driver
# did not know at the enter (CYCTX_PREV_UNKNOWN) becomes the one of a context dead at the enter
# (0), which the exit makes current again.
UNKNOWN_TEST = (
    "tests/guard/test_dead_contexts.py::"
    "test_a_handle_unknown_to_the_driver_at_the_enter_is_not_restored_when_a_context_answers_there"
)
# Formats an ordinal for its message (int_text): the hang mutant loops there for ever.
BOUND_TEST = (
    "tests/guard/test_bad_inputs.py::"
    "test_one_past_the_last_device_is_refused_before_the_driver_is_asked"
)

MUTANTS = f'''
[[mutant]]
id = "header-prev-unknown-is-dead"
file = "src/cyctx/include/cyctx/switch.h"
find = "#define CYCTX_PREV_UNKNOWN (~0ULL)"
replace = "#define CYCTX_PREV_UNKNOWN (0ULL)"
why = "a handle the driver did not know at the enter is taken for a dead one, and restored"
tests = ["{UNKNOWN_TEST}"]

[[mutant]]
id = "python-hang"
file = "src/cyctx/_inputs.py"
find = """    if n.bit_length() <= 256:
        return str(n)"""
replace = """    while n.bit_length() <= 256:
        pass"""
why = "formatting an ordinal for a message never ends"
tests = ["{BOUND_TEST}"]
'''


@pytest.mark.slow
def test_a_header_mutant_is_rebuilt_and_killed_and_a_hang_names_its_test(tmp_path):
    if os.environ.get("CYCTX_MUTATION_RUN"):
        pytest.skip("inside a mutation run: the tool itself is not what a mutant changes")
    if drivers.SIM is None:
        pytest.skip("the tool runs its suites on the simulated driver")
    if not os.path.isfile(TOOL):
        pytest.skip("no scripts/quality/mutate.py here: a checkout's tool, not in the sdist")
    toml = tmp_path / "mutants.toml"
    toml.write_text(MUTANTS)
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            TOOL,
            "--mutants",
            str(toml),
            "--json",
            str(report),
            "--suite",
            UNKNOWN_TEST,
            BOUND_TEST,
            "--timeout",
            "40",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert report.exists(), out[-4000:]
    data = json.loads(report.read_text())
    got = {r["id"]: r for r in data["mutants"]}
    header = got["header-prev-unknown-is-dead"]
    assert header["status"] == "killed" and header["by"] == UNKNOWN_TEST, (header, out[-3000:])
    hang = got["python-hang"]
    assert hang["status"] == "timeout" and hang["by"] == BOUND_TEST, (hang, out[-3000:])
    assert hang["note"].startswith(f"hung in {BOUND_TEST}: no result after 40 s"), hang
    assert f"python-hang: timeout hung in {BOUND_TEST}" in proc.stdout, proc.stdout[-3000:]
    assert data["counts"]["killed"] == 1 and data["counts"]["timeout"] == 1, data["counts"]
    assert data["score"] == 1.0 and proc.returncode == 0, out[-3000:]
