"""A trace that did not record says so in every output: one never started (its report, its
JSON, its questions), and one refused for want of libcupti, whose JSON has ``active: false``
and the reason (a refusal beside another CUPTI subscriber: test_trace_subscribers.py)."""

import json
import os
import subprocess
import sys

import pytest

import cyctx

NEVER = "the trace was never started (start it with `with cyctx.trace() as t:` or t.start())"


def test_a_trace_never_started_says_so_in_its_report_and_its_json():
    t = cyctx.trace()
    assert t.report() == f"cyctx trace: not tracing: {NEVER}"
    data = json.loads(json.dumps(t.to_json()))
    assert data["active"] is False and data["reason"] == NEVER
    assert data["events"] == [] and data["schema"] == "cyctx.trace/1"
    assert t.reason is None and not t.active  # nothing refused it: it was not asked


@pytest.mark.parametrize(
    "ask",
    [
        lambda t: t.changes(),
        lambda t: t.who_made_current(),
        lambda t: t.who_destroyed(1),
        lambda t: t.libraries_touching(0),
    ],
    ids=["changes", "who_made_current", "who_destroyed", "libraries_touching"],
)
def test_a_question_to_a_trace_never_started_is_an_error_not_an_empty_answer(ask):
    # An empty answer would say "nothing changed while tracing", and nothing was traced.
    with pytest.raises(cyctx._trace.TraceError, match="never started"):
        ask(cyctx.trace())


NO_CUPTI = """
import json, sys
from cyctx.testing import use_simulated_driver
use_simulated_driver(1)
import cyctx
from cuda.bindings import driver as d
d.cuInit(0)
with cyctx.trace(quiet=True) as t:
    d.cuCtxSetCurrent(None)
assert t.report() == f"cyctx trace: not tracing: {t.reason}", t.report()
json.dump({"json": t.to_json(), "reason": t.reason}, sys.stdout)
"""


def test_a_trace_without_libcupti_writes_its_refusal(sim, tmp_path):
    # In a process of its own: a CUPTI already loaded in this one would be found first.
    missing = tmp_path / "libcupti.so.13"
    env = dict(os.environ, CYCTX_CUPTI=str(missing))
    proc = subprocess.run(
        [sys.executable, "-c", NO_CUPTI], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    data = got["json"]
    assert data["active"] is False and data["events"] == [], data
    assert data["reason"] == got["reason"] == f"$CYCTX_CUPTI names {missing}, which is not a file"
    assert data["driver"] == "simulated" and data["cupti"] is None
