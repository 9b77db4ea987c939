"""Differential test: the simulated driver against what the real driver did.

The scenarios (``tests/sim/differential/scenarios.py``) run each in a fresh subprocess, so this
module never calls the driver in the pytest process and is indifferent to which driver the
session selected. The committed real records are made on the GPU machine with
``run.py record --driver real``; the comparer's self-tests need no driver at all.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

DIFF_DIR = Path(__file__).resolve().parent / "differential"


def _bindings_major() -> int:
    from importlib.metadata import version

    return int(version("cuda-bindings").split(".")[0])


# One real record per cuda-bindings major: the scenarios call what the installed bindings
# expose (CUDA 13 added entry points), so a run is compared with a record of its own major.
REAL_RECORD = DIFF_DIR / (
    "real_h200.json" if _bindings_major() >= 13 else f"real_h200_cu{_bindings_major()}.json"
)
KNOWN_DIFFERENCES = DIFF_DIR / "known_differences.json"


def _load(name: str):
    # By path: tests/sim/differential is not a package, and run.py must stay runnable as a script.
    mod_name = f"_cyctx_differential_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, DIFF_DIR / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod


run = _load("run")
scn = _load("scenarios")


def _sim_library() -> str:
    path = run.find_sim_library()
    if not path or not Path(path).is_file():
        pytest.skip(
            "simulated driver library not built (cyctx.testing.sim_library_path(), "
            "$CYCTX_SIM_LIBRARY or src/cyctx/_sim/libcuda.so.1)"
        )
    return path


def _real_record() -> dict | None:
    if not REAL_RECORD.is_file():
        return None
    with open(REAL_RECORD) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def sim_record():
    """All scenarios on the simulated driver, once per module (about 45 subprocesses)."""
    real = _real_record()
    # Same device count as the real record, so two-device scenarios are compared or skipped
    # on both sides alike; 2 without a record, so they at least run on the simulation.
    devices = (real or {}).get("meta", {}).get("device_count") or 2
    return run.record("sim", _sim_library(), devices=devices)


def _assert_clean(record: dict, what: str):
    problems = [
        f"{n}: {s['error'].strip().splitlines()[-1]}"
        for n, s in record["scenarios"].items()
        if s["error"]
    ]
    assert not problems, f"scenarios raised or crashed on the {what} driver:\n" + "\n".join(
        problems
    )


def test_sim_scenarios_run_clean(sim_record):
    """No scenario raises, crashes or runs on the wrong library with the simulated driver."""
    _assert_clean(sim_record, "simulated")
    missing = sorted(
        {
            ev["call"]
            for s in sim_record["scenarios"].values()
            for ev in s["events"]
            if ev.get("exc") == "missing-binding"
        }
    )
    assert not missing, f"cuda.bindings lacks entry points the scenarios use: {missing}"
    ran = [n for n, s in sim_record["scenarios"].items() if not s["skipped"]]
    assert len(ran) >= 30, f"only {len(ran)} scenarios ran"


def test_sim_matches_real_record(sim_record):
    real = _real_record()
    if real is None:
        pytest.skip(
            f"no real-driver record yet: run `python {DIFF_DIR / 'run.py'} record "
            f"--driver real --out {REAL_RECORD}` on the GPU machine and commit it"
        )
    rows = run.compare(real, sim_record, run.load_known(KNOWN_DIFFERENCES))
    table = run.format_table(rows, real.get("meta"), sim_record.get("meta"))
    assert not any(r["fails"] for r in rows), (
        "simulated driver differs from the real one:\n" + table
    )


@pytest.mark.gpu
def test_real_vs_sim_live(tmp_path):
    """On a GPU machine: record both drivers now and compare them."""
    real = run.record("real")
    _assert_clean(real, "real")
    sim = run.record("sim", _sim_library(), devices=real["meta"].get("device_count") or 1)
    for name, data in (("real.json", real), ("sim.json", sim)):
        (tmp_path / name).write_text(json.dumps(data, indent=1))
    rows = run.compare(real, sim, run.load_known(KNOWN_DIFFERENCES))
    table = run.format_table(rows, real.get("meta"), sim.get("meta"))
    assert not any(r["fails"] for r in rows), (
        f"simulated driver differs from the real one (records in {tmp_path}):\n{table}"
    )


# --- The facts C probes measured on the H200 (docs/evidence.md, "Driver behaviour") ---------
# As events each scenario must contain in this order (other events may come between). They hold
# for the real record too, which checks that the scenarios really capture what the lab saw.

OK, E201, E709, E3 = (
    "CUDA_SUCCESS",
    "CUDA_ERROR_INVALID_CONTEXT",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    "CUDA_ERROR_NOT_INITIALIZED",
)


def _ev(call, rc=OK, **kw):
    return {"call": call, "rc": rc, **kw}


LAB_FACTS = {
    # probe2: "after driver retain only (not current) cur=(nil) ... active=1".
    "primary_refcount": [
        _ev("cuDevicePrimaryCtxRetain", out="ctx#1"),
        _ev("cuDevicePrimaryCtxGetState", out=[0, 1]),
        _ev("cuCtxGetCurrent", out=None),
    ],
    # probe2, cudaDeviceReset with a driver retain held: id -> 709, apiver -> 201, same
    # pointer and a new id on re-retain, two releases to deactivate, the third -> 201.
    "reset_while_retained": [
        _ev("cuDevicePrimaryCtxRetain", out="ctx#1"),
        _ev("cuCtxGetId", out="id#1"),
        _ev("cuDevicePrimaryCtxReset"),
        _ev("cuDevicePrimaryCtxGetState", out=[0, 0]),
        _ev("cuCtxGetId", rc=E709),
        _ev("cuCtxGetApiVersion", rc=E201),
        _ev("cuDevicePrimaryCtxRetain", out="ctx#1"),
        _ev("cuCtxGetId", out="id#2"),
        _ev("cuDevicePrimaryCtxRelease"),
        _ev("cuDevicePrimaryCtxGetState", out=[0, 1]),
        _ev("cuDevicePrimaryCtxRelease"),
        _ev("cuDevicePrimaryCtxGetState", out=[0, 0]),
        _ev("cuDevicePrimaryCtxRelease", rc=E201),
    ],
    # probe + probe2 with the reset primary current: cur unchanged, ctxdev=0 r0, apiver r201,
    # id r709, "push stale handle: r0", re-retain revives it (apiver 3020).
    "reset_stale_current": [
        _ev("cuDevicePrimaryCtxReset"),
        _ev("cuCtxGetCurrent", out="ctx#1"),
        _ev("cuCtxGetDevice", out=0),
        _ev("cuCtxGetApiVersion", rc=E201),
        _ev("cuCtxGetId", rc=E709),
        _ev("cuCtxPushCurrent", args=["ctx#1"]),
        _ev("cuDevicePrimaryCtxRetain", out="ctx#1"),
        _ev("cuCtxGetApiVersion", out=3020),
    ],
    # probe2: after releasing to zero the next retain gave the same pointer and a new id.
    "primary_retain_after_full_release": [
        _ev("cuDevicePrimaryCtxRetain", out="ctx#1"),
        _ev("cuCtxGetId", out="id#1"),
        _ev("cuCtxGetApiVersion", out=3020),
        _ev("cuDevicePrimaryCtxRetain", out="ctx#1"),
        _ev("cuCtxGetId", out="id#2"),
    ],
    # probe: "new thread, nothing called cur=(nil)".
    "thread_starts_empty": [{"thread": "T", **_ev("cuCtxGetCurrent", out=None)}],
    # probe2: "child: getcurrent r3 cur=(nil); cuInit r3; retain r3".
    "fork_after_init_with_context": [
        {"thread": "child", **_ev("cuInit", rc=E3)},
        {"thread": "child", **_ev("cuCtxGetCurrent", rc=E3)},
        {"thread": "child", **_ev("cuDevicePrimaryCtxRetain", rc=E3)},
    ],
    # probe2 on 2 x H200: the pushed primary of device 1 reports device 1.
    "two_devices_primary": [
        _ev("cuCtxPushCurrent", args=["ctx#2"]),
        _ev("cuCtxGetDevice", out=1),
    ],
}


def _contains_in_order(events, expected):
    """Index into ``expected`` of the first fact not found (len(expected) when all are)."""
    i = 0
    for ev in events:
        if i < len(expected) and all(k in ev and ev[k] == v for k, v in expected[i].items()):
            i += 1
    return i


@pytest.mark.parametrize("which", ["sim", "real"])
def test_lab_facts(which, request):
    if which == "real":
        record = _real_record()
        if record is None:
            pytest.skip("no real-driver record yet (tests/sim/differential/real_h200.json)")
    else:
        record = request.getfixturevalue("sim_record")
    failures = []
    for name, expected in LAB_FACTS.items():
        s = record["scenarios"].get(name)
        if s is None or s.get("skipped"):
            continue
        got = _contains_in_order(s["events"], expected)
        if got < len(expected):
            failures.append(
                f"{name}: lab fact {got} not found: {expected[got]}\n"
                + "\n".join("    " + run.format_event(e) for e in s["events"])
            )
    assert not failures, f"{which} record contradicts the lab logs:\n" + "\n".join(failures)


# --- Self-tests of the comparer: these must be able to fail, so they use hand-made records ---


def _record(events, skipped=None, error=None, name="s"):
    return {"meta": {}, "scenarios": {name: {"events": events, "skipped": skipped, "error": error}}}


EVENTS = [
    {"call": "cuInit", "args": [0], "rc": "CUDA_SUCCESS"},
    {"call": "cuDevicePrimaryCtxRetain", "args": [0], "rc": "CUDA_SUCCESS", "out": "ctx#1"},
    {"call": "cuCtxGetApiVersion", "args": ["ctx#1"], "rc": "CUDA_SUCCESS", "out": 3020},
]


def test_compare_reports_one_differing_event(tmp_path):
    changed = json.loads(json.dumps(EVENTS))
    changed[2]["rc"] = "CUDA_ERROR_INVALID_CONTEXT"
    del changed[2]["out"]
    rows = run.compare(_record(EVENTS), _record(changed))
    assert [(r["status"], r["index"], r["fails"]) for r in rows] == [("differs", 2, True)]
    assert rows[0]["real"] == EVENTS[2] and rows[0]["sim"] == changed[2]
    # The CLI exits 1 for it, and 0 once a justification lists the scenario.
    (tmp_path / "real.json").write_text(json.dumps(_record(EVENTS)))
    (tmp_path / "sim.json").write_text(json.dumps(_record(changed)))
    args = ["compare", str(tmp_path / "real.json"), str(tmp_path / "sim.json")]
    assert run.main(args) == 1
    (tmp_path / "known.json").write_text(json.dumps({"_comment": "x", "s": "because"}))
    assert run.main([*args, "--known-differences", str(tmp_path / "known.json")]) == 0


def test_compare_same_ignores_info_and_tags_but_not_length():
    noisy = [dict(ev, info="NVIDIA H200", tag="reworded") for ev in EVENTS]
    assert run.compare(_record(EVENTS), _record(noisy))[0]["status"] == "same"
    short = run.compare(_record(EVENTS), _record(EVENTS[:2]))[0]
    assert (short["status"], short["index"], short["sim"]) == ("differs", 2, None)


def test_compare_skipped_error_missing():
    assert (
        run.compare(_record([], skipped="needs 2 devices"), _record(EVENTS))[0]["status"]
        == "skipped"
    )
    err = run.compare(_record(EVENTS), _record([], error="Traceback\nRuntimeError: boom"))[0]
    assert (err["status"], err["fails"]) == ("error", True)
    miss = run.compare(_record(EVENTS), {"scenarios": {}})[0]
    assert (miss["status"], miss["fails"]) == ("missing", True)
    new = run.compare({"scenarios": {}}, _record(EVENTS))[0]
    assert (new["status"], new["fails"]) == ("unrecorded", False)


def test_known_differences_need_a_justification(tmp_path):
    p = tmp_path / "k.json"
    p.write_text(json.dumps({"s": ""}))
    with pytest.raises(ValueError):
        run.load_known(p)
    assert run.load_known(tmp_path / "absent.json") == {}
    # The JSON-free form: "scenario: justification" lines, # comments.
    p.write_text("# why the sim may differ\n\ns: flags: the driver adds bit 8\n")
    assert run.load_known(p) == {"s": "flags: the driver adds bit 8"}
    p.write_text("s:\n")
    with pytest.raises(ValueError):
        run.load_known(p)


class _FakeCtx:
    def __init__(self, v):
        self.v = v

    def __int__(self):
        return self.v


class _FakeDev(_FakeCtx):
    pass


class _FakeResult(int):
    @property
    def name(self):
        return {0: "CUDA_SUCCESS", 201: "CUDA_ERROR_INVALID_CONTEXT"}[int(self)]


def _fake_driver(handles, ids):
    """A stand-in for cuda.bindings.driver that hands out the given raw values in order."""
    hs, ids_ = iter(handles), iter(ids)
    ok = _FakeResult(0)
    return types.SimpleNamespace(
        CUcontext=_FakeCtx,
        CUdevice=_FakeDev,
        cuDevicePrimaryCtxRetain=lambda dev: (ok, _FakeCtx(next(hs))),
        cuCtxGetId=lambda ctx: (ok, next(ids_)),
        cuCtxGetApiVersion=lambda ctx: (_FakeResult(201),),
    )


def _drive(driver):
    r = scn.Recorder(driver)
    a = r.call("cuDevicePrimaryCtxRetain", 0)
    r.call("cuCtxGetId", a.val, out="id")
    b = r.call("cuDevicePrimaryCtxRetain", 0)
    r.call("cuCtxGetId", b.val, out="id")
    c = r.call("cuDevicePrimaryCtxRetain", 0)
    r.call("cuCtxGetApiVersion", c.val)
    return r.events


def test_labels_preserve_equality_not_values():
    # Equal raw handles get equal labels, in order of first appearance; NULL is None.
    r = scn.Recorder(_fake_driver([], []))
    assert [r.norm(_FakeCtx(v)) for v in (0x7F00, 0x9A00, 0x7F00, 0)] == [
        "ctx#1",
        "ctx#2",
        "ctx#1",
        None,
    ]
    assert [r.norm(v, "id") for v in (41, 7, 41)] == ["id#1", "id#2", "id#1"]
    # Two processes with different pointer and id values but the same equalities record the
    # same events ...
    one = _drive(_fake_driver([0x1000, 0x1000, 0x2000], [5, 9]))
    two = _drive(_fake_driver([0xBEEF0, 0xBEEF0, 0x77770], [1000, 1001]))
    assert one == two
    assert [e.get("out") for e in one[:5]] == ["ctx#1", "id#1", "ctx#1", "id#2", "ctx#2"]
    assert one[5] == {
        "call": "cuCtxGetApiVersion",
        "args": ["ctx#2"],
        "rc": "CUDA_ERROR_INVALID_CONTEXT",
    }
    # ... and a different equality (the second retain returns a new handle; the id repeats)
    # is a difference the comparer reports.
    three = _drive(_fake_driver([0x1000, 0x3000, 0x2000], [5, 5]))
    rows = run.compare(
        {"scenarios": {"s": {"events": one}}}, {"scenarios": {"s": {"events": three}}}
    )
    assert rows[0]["status"] == "differs" and rows[0]["index"] == 2
