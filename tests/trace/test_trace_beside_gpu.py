"""cyctx.trace() beside another CUPTI subscriber on the real driver and CUPTI: a subscriber that
allows others (CUPTI 13.2 and newer), and torch.profiler before and after a trace starts. Each
case runs in a child process: a trace, and torch's profiler once it has profiled, are CUPTI
subscribers of the process. Whether torch's subscriber admits another is CUPTI's answer, asked
directly; docs/tracing.md ("Beside a profiler") says what follows from its answer today, that it
admits none."""

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

CHILD = """
import ctypes, json, sys
from collections import Counter
import cyctx
from cuda.bindings import driver as d
from cyctx._trace.locate import find_cupti

MODE = sys.argv[1]
d.cuInit(0)
path, _ = find_cupti(d.cuDriverGetVersion()[1] // 1000)
cupti = ctypes.CDLL(path)
version = ctypes.c_uint32()
assert cupti.cuptiGetVersion(ctypes.byref(version)) == 0, path
version = version.value
out = {"version": version, "path": path}


class Params(ctypes.Structure):  # CUpti_SubscriberParams of cupti_callbacks.h, 13.2
    _fields_ = [("structSize", ctypes.c_size_t), ("subscriberName", ctypes.c_char_p),
                ("oldSubscriberName", ctypes.c_char_p), ("oldSubscriberSize", ctypes.c_size_t),
                ("allowMultipleSubscribers", ctypes.c_uint8), ("padding", ctypes.c_uint8 * 7)]


# The driver API's domain, and its push and pop (cupti_driver_cbid.h): the first ABI and _v2.
DRIVER, NAMES = 1, {14: "cuCtxPushCurrent", 323: "cuCtxPushCurrent", 15: "cuCtxPopCurrent", 324: "cuCtxPopCurrent"}
CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)
seen = []
other = CALLBACK(lambda userdata, domain, cbid, data: seen.append(cbid))


def subscribe():
    # Another subscriber that allows others where CUPTI has several (13.2 and newer), as a
    # profiler on cuptiSubscribe_v2 would subscribe. (result, handle)
    h = ctypes.c_void_p()
    if version >= 130000:
        size = ctypes.sizeof(Params) if version >= 130200 else Params.oldSubscriberSize.offset + 8
        p = Params(size, b"other", None, 0, 1)
        return cupti.cuptiSubscribe_v2(ctypes.byref(h), other, None, ctypes.byref(p)), h
    return cupti.cuptiSubscribe(ctypes.byref(h), other, None), h


def switch():
    d.cuCtxSetCurrent(None)  # so that the guard switches: a push and a pop
    with cyctx.ContextGuard(0):
        pass


def changes(t):
    return [e.call.split("_")[0] for e in t.events if e.changed and e.cyctx_guard]


if MODE == "beside-v2":
    r, h = subscribe()
    assert r == 0, r
    for cbid in NAMES:
        assert cupti.cuptiEnableCallback(1, h, DRIVER, cbid) == 0
    with cyctx.trace(quiet=True) as t:
        before = len(seen)
        switch()
        during = [NAMES[c] for c in seen[before:]]
    out.update(reason=t.reason, guard=changes(t), other=during)
    assert cupti.cuptiUnsubscribe(h) == 0
    with cyctx.trace(quiet=True) as t:
        switch()
    out["alone"] = [t.reason, changes(t)]
    print(json.dumps(out))
    sys.exit(0)

import torch
from torch.profiler import ProfilerActivity, profile

x = torch.ones(1024, device="cuda")


def work():
    y = x
    for _ in range(4):
        y = torch.relu(y * 2 - 1)
    torch.cuda.synchronize()
    switch()


def profiled():
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        work()
    return Counter(f"{e.device_type}:{e.name}" for e in prof.events())


t = cyctx.trace(quiet=True).start() if MODE == "trace-first" else None
work()
profiled()  # the one-time setup of the work and of the profiler is in neither
if MODE == "alone":
    out["profile"] = profiled()
    r, h = subscribe()  # once the profiler has profiled: does it admit another?
    if r == 0:
        assert cupti.cuptiUnsubscribe(h) == 0
    out["admits"] = r == 0
elif MODE == "profiler-first":
    with cyctx.trace(quiet=True) as t:
        out["profile"] = profiled()
else:
    out["profile"] = profiled()
    t.stop()
    r, h = subscribe()
    if r == 0:
        assert cupti.cuptiUnsubscribe(h) == 0
    out["free_after_stop"] = r == 0
if t is not None:
    out.update(reason=t.reason, guard=changes(t))
print(json.dumps(out))
"""

PUSH_POP = ["cuCtxPushCurrent", "cuCtxPopCurrent"]


def _child(tmp_path, mode):
    script = tmp_path / "beside.py"
    script.write_text(textwrap.dedent(CHILD))
    proc = subprocess.run(
        [sys.executable, str(script), mode], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """torch.profiler's profile of the work without a trace. Its subscriber, once it has
    profiled, admits no other (CUPTI's answer to a subscriber that allows others): what the
    tests below and the docs rely on."""
    pytest.importorskip("torch")
    out = _child(tmp_path_factory.mktemp("alone"), "alone")[0]
    assert not out["admits"], (
        "torch.profiler's CUPTI subscriber now admits another: a trace can run beside it, and "
        "docs/tracing.md ('Beside a profiler') and these tests say otherwise"
    )
    return out


def test_beside_a_subscriber_that_allows_others_both_get_their_calls(tmp_path):
    out, _ = _child(tmp_path, "beside-v2")
    if out["version"] < 130200:
        pytest.skip(
            f"CUPTI {out['version']} ({out['path']}) has one subscriber; several need 13.2 or "
            "newer (the nvidia-cuda-cupti package)"
        )
    assert out["reason"] is None and out["guard"] == PUSH_POP, out
    # The other got the guard's push and pop, entry and exit, while the trace got them too.
    assert out["other"] == [PUSH_POP[0]] * 2 + [PUSH_POP[1]] * 2
    assert out["alone"] == [None, PUSH_POP]  # once the other is gone, a trace runs alone


def test_a_trace_started_after_the_process_has_profiled_is_refused_and_the_profile_unchanged(
    tmp_path, alone
):
    """The profiler, having profiled, is a subscriber of the process that admits no other: the
    trace is refused, saying why, and records nothing; the next profile, made inside the
    refused trace, is the same as without it."""
    out, _ = _child(tmp_path, "profiler-first")
    assert out["profile"] == alone["profile"]
    rule = (
        "it allows no second subscriber"
        if out["version"] >= 130200
        else "this CUPTI (older than 13.2) allows one subscriber"
    )
    assert out["reason"].startswith("another CUPTI subscriber holds this process ("), out
    assert out["reason"].endswith(f"); {rule}; it is left undisturbed"), out
    assert out["guard"] == [], out


def test_a_trace_started_before_a_process_profiles_keeps_a_one_subscriber_profiler_out(
    tmp_path, alone
):
    """A trace started before the process's first profile holds CUPTI: the profiler, which
    admits no other, is kept out, its profile without the GPU's events, and torch says so on
    stderr. The trace records every change, and its stop leaves CUPTI free for the next
    subscriber."""
    out, err = _child(tmp_path, "trace-first")
    assert out["reason"] is None and out["guard"] == PUSH_POP * 3, out  # three work() calls
    assert out["free_after_stop"], out
    assert any(k.startswith("DeviceType.CUDA:") for k in alone["profile"]), alone  # the kernels
    assert not any(k.startswith("DeviceType.CUDA:") for k in out["profile"]), out["profile"]
    assert "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED" in err, err
    assert "CUDA profiler activities will be missing" in err, err
