"""The doctor: `cyctx._doctor.diagnose()` and `python -m cyctx doctor [--json|--demo]`.

States that break the process (an inactive primary context made current, a reset, a fork) are
set up in a fresh interpreter (`run_child`) so that no other test's guards see them.
"""

import itertools
import json
import os
import pickle
import re
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest
from helpers.children import TESTS_DIR, run_child, run_python
from helpers.drivers import KIND, current, device_count, primary_state

import cyctx
from cyctx import ContextGuard, _doctor
from cyctx._doctor import Finding, diagnose
from cyctx._doctor.report import empty_report
from cyctx._doctor.runtime import wheel_version

# Prepended to child code: a snapshot of everything observable, on the simulated driver (the
# doctor only queries, so it must make none of the driver calls that change state).
SNAPSHOT = """
import json, os, threading
from cuda.bindings import driver as d
from helpers import drivers as _drv
from cyctx._doctor import diagnose
def snapshot():
    sim = _drv.SIM
    n = _drv.device_count()
    s = {"current": _drv.current(), "primary": [_drv.primary_state(i) for i in range(n)],
         "mapped": cuda_mapped()}
    if sim is not None:
        s.update(calls={f: sim.call_count(f) for f in _drv.STATE_CHANGING}, depth=sim.stack_depth(),
                 retains=[sim.retain_count(i) for i in range(n)], live=sim.live_contexts())
    return s
def cuda_mapped():
    # The CUDA libraries and CUDA modules mapped in this process: the census loads none.
    with open("/proc/self/maps") as f:
        paths = {line.split(None, 5)[-1].strip() for line in f}
    return sorted(p for p in paths if any(w in p for w in ("cuda", "nvrtc", "nvJitLink")))
def codes(r):
    return [f.code for f in r.findings]
"""


def child(body, **kw):
    """run_child with the SNAPSHOT helpers in front of ``body``."""
    return run_child(SNAPSHOT + textwrap.dedent(body), **kw)


def diagnosed(setup, after=""):
    """The report's dict of a diagnosis in a fresh interpreter (`child`), between ``setup`` and
    ``after`` (child code)."""
    code = f"{textwrap.dedent(setup)}\nr = diagnose(cudart=False).to_dict()\n"
    return last_json(child(f"{code}{textwrap.dedent(after)}\nprint(json.dumps(r))\n"))


def cli(*args, env=None, timeout=120):
    """`python -m cyctx ARGS` in a fresh interpreter; (returncode, stdout, stderr)."""
    e = dict(os.environ, **(env or {}))
    e.pop("NO_COLOR", None)
    p = subprocess.run(
        [sys.executable, "-m", "cyctx", *args],
        capture_output=True,
        text=True,
        env=e,
        timeout=timeout,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    return p.returncode, p.stdout, p.stderr


def last_json(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def no_driver_machine():
    """Skips unless this machine has no NVIDIA driver (then plain `doctor` sees none)."""
    from cyctx import testing

    if testing.real_driver_available():
        pytest.skip("this machine has an NVIDIA driver")


# --- the report ---------------------------------------------------------------------------


def test_report_content():
    r = diagnose(cudart=False)
    n = device_count()
    assert r.driver_version and r.driver_version >= 12000
    assert r.driver_library and "libcuda" in r.driver_library
    assert r.simulated == (KIND == "sim")
    assert [dv.ordinal for dv in r.devices] == list(range(n))
    for dv in r.devices:
        assert dv.name and dv.error is None
        assert dv.compute_capability and dv.compute_capability[0] >= 3
        flags, active = primary_state(dv.ordinal)
        assert (dv.primary_flags, dv.primary_active) == (flags, active)
    assert r.thread_name == threading.current_thread().name
    assert r.context.handle == current()
    assert r.versions["cuda-bindings"] and r.versions["python"]
    text = str(r)
    for heading in ("Versions", "Devices", "This thread", "ContextGuards", "Findings", "Result"):
        assert heading in text
    assert ("[SIMULATED]" in text) == r.simulated
    assert "\x1b[" not in text, "no colour unless asked"


# A report's findings are about the whole process: these two run in a fresh one, where nothing
# but the guard was done (a test process that imported a framework built for another CUDA
# major than its cuda-bindings has, rightly, a finding about that).


def test_report_inside_a_guard_is_healthy():
    proc = child(
        """
        from cyctx import ContextGuard
        g = ContextGuard(0)
        try:
            with g:
                r = diagnose(cudart=False)
            c = r.context
            assert c.handle == g.handle and c.device == 0
            assert c.primary is True and "ContextGuard" in c.primary_why
            assert c.usable and c.api_version and c.id == g.context_id
            assert r.ok and r.exit_status == 0 and r.findings == [], r.findings
            mine = [x for x in r.guards if x.handle == g.handle]
            assert mine and not mine[0].reset and mine[0].seen_id == mine[0].driver_id
            assert "nothing wrong" in str(r)
        finally:
            g.close()
        print("checked")
        """
    )
    assert proc.stdout.split() == ["checked"], proc.stdout


def test_new_thread_has_no_current_context():
    proc = child(
        """
        from cyctx import ContextGuard
        g = ContextGuard(0)
        out = {}
        try:
            with g:  # another thread holding a context does not give this one a context
                t = threading.Thread(target=lambda: out.update(r=diagnose(cudart=False)))
                t.start()
                t.join()
        finally:
            g.close()
        r = out["r"]
        assert r.context.handle == 0 and r.thread_name != threading.current_thread().name
        assert r.to_dict()["thread"]["current_context"] is None
        (f,) = r.findings
        assert f.code == "no_current_context" and f.severity == "info"
        assert "new thread" in f.explanation and "ContextGuard" in f.fix
        assert r.ok and r.exit_status == 0
        print("checked")
        """
    )
    assert proc.stdout.split() == ["checked"], proc.stdout


def test_the_report_labels_the_callers_thread():
    # diagnose() on a worker thread describes that thread (its name and OS thread id), not the
    # main thread; and in the user's program it does not claim to run in a new process.
    seen = {}

    def body():
        seen["native"] = threading.get_native_id()
        r = diagnose(cudart=False)
        return r.to_dict()["thread"], r.render(), r.render(cli=True)

    t = threading.Thread(target=lambda: seen.update(out=body()), name="cyctx-worker-7")
    t.start()
    t.join(120)
    thread, text, cli_text = seen["out"]
    assert seen["native"] != threading.get_native_id()
    assert thread["name"] == "cyctx-worker-7" and thread["native_id"] == seen["native"], thread
    assert f"This thread: cyctx-worker-7 (native id {seen['native']})" in text, text
    assert "none (cuCtxGetCurrent returned NULL)" in text, text
    assert "the doctor runs in a new process" not in " ".join(text.split()), text
    # The CLI's report is of its own new process, and says so where it explains what is seen.
    assert "the doctor runs in a new process" in " ".join(cli_text.split()), cli_text


def test_json_schema():
    d = json.loads(diagnose(cudart=False).to_json())
    assert d["schema"] == "cyctx.diagnosis/2"
    assert set(d) == {
        "loaded",
        "schema",
        "ok",
        "exit_status",
        "simulated",
        "versions",
        "process",
        "driver",
        "runtime",
        "other_runtimes",
        "devices",
        "thread",
        "guards",
        "findings",
    }
    assert isinstance(d["ok"], bool) and isinstance(d["exit_status"], int)
    assert set(d["process"]) == {"pid", "forked_from"} and d["process"]["pid"] == os.getpid()
    assert set(d["driver"]) == {"library", "version", "version_str", "error"}
    assert isinstance(d["driver"]["version"], int) and d["driver"]["version_str"].count(".") == 1
    for dev in d["devices"]:
        assert set(dev) == {
            "ordinal",
            "name",
            "compute_capability",
            "pci_bus_id",
            "total_memory",
            "primary_context",
            "error",
        }
        assert set(dev["primary_context"]) == {"active", "flags"}
        assert isinstance(dev["primary_context"]["active"], bool)
        major, minor = dev["compute_capability"].split(".")
        assert major.isdigit() and minor.isdigit()
    assert set(d["thread"]) == {"name", "native_id", "current_context", "runtime_current_device"}
    for f in d["findings"]:
        assert set(f) == {"code", "severity", "title", "explanation", "fix"}
        assert f["severity"] in ("error", "warning", "info", "unavailable")


def test_json_schema_with_a_context_and_a_guard():
    g = ContextGuard(0)
    handle, context_id = g.handle, g.context_id
    try:
        with g:
            d = diagnose(cudart=False).to_dict()
    finally:
        g.close()
    c = d["thread"]["current_context"]
    assert set(c) == {
        "handle",
        "id",
        "id_error",
        "device",
        "primary",
        "primary_why",
        "usable",
        "flags",
        "api_version",
        "why",
        "error",
    }
    assert c["handle"] == handle and c["usable"] is True and c["error"] is None, c
    assert c["id"] == context_id and c["device"] == 0, c
    (mine,) = [x for x in d["guards"] if x["handle"] == handle]
    assert set(mine) == {
        "device",
        "handle",
        "seen_id",
        "driver_id",
        "driver_id_error",
        "shared",
        "primary",
        "reset",
    }
    json.dumps(d)


def test_exit_status_and_ok():
    def diag(*severities):
        r = empty_report({})
        r.findings = [Finding("x", s, "t", "e", "f") for s in severities]
        return r

    assert diag().exit_status == 0 and diag().ok
    assert diag("warning").exit_status == 0 and diag("warning").ok
    assert diag("info").exit_status == 0 and diag("info").ok
    assert "Result: OK (exit status 0)" in str(diag("info")), "a note is not a warning"
    assert diag("error").exit_status == 1 and not diag("error").ok
    assert diag("warning", "error").exit_status == 1
    assert diag("unavailable").exit_status == 3 and not diag("unavailable").ok


def test_colour_only_on_a_terminal(monkeypatch):
    class Tty:
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    assert _doctor.use_colour(Tty())
    with open(os.devnull, "w") as devnull:
        assert not _doctor.use_colour(devnull)
    monkeypatch.setenv("NO_COLOR", "1")
    assert not _doctor.use_colour(Tty())
    r = diagnose(cudart=False)
    assert "\x1b[" in r.render(colour=True) and "\x1b[" not in r.render(colour=False)


def test_import_cyctx_does_not_import_the_doctor():
    # The doctor is imported by cyctx.diagnose()'s first call (cyctx/__init__.py), not before.
    code = """
    import json, sys
    import cyctx
    doctor = lambda: sorted(m for m in sys.modules if m.startswith("cyctx._doctor"))
    before = doctor(), "cyctx.doctor" in sys.modules, "cuda.bindings.driver" in sys.modules
    r = cyctx.diagnose(cudart=False)
    import cyctx.doctor
    print(json.dumps([before, doctor(), isinstance(r, cyctx.doctor.Diagnosis),
                      r.to_dict()["schema"], "diagnose" in dir(cyctx)]))
    """
    p = run_python(code, cwd=TESTS_DIR)
    before, after, is_diagnosis, schema, listed = last_json(p)
    assert before == [[], False, False], f"`import cyctx` imported the doctor: {before}"
    assert "cyctx._doctor" in after and is_diagnosis and schema == "cyctx.diagnosis/2" and listed


def test_cyctx_has_no_module_getattr():
    # A module with a __getattr__ in its namespace is never given the interpreter's quick
    # attribute load (CPython's specializer refuses it), so every `cyctx.device` in
    # `with cyctx.device(0):` would take the slow path. The doctor's names live in cyctx.doctor
    # instead; an unknown name is a plain AttributeError.
    assert "__getattr__" not in vars(cyctx)
    with pytest.raises(AttributeError, match="Finding"):
        cyctx.Finding  # noqa: B018


def test_the_records_of_a_diagnosis_are_public():
    # A Diagnosis holds these records; users annotate and check with the names cyctx.doctor
    # exports, each the class the report holds, named as users import it.
    code = """
    import json
    import cyctx, cyctx.doctor
    from cyctx._doctor import model, report
    r = cyctx.diagnose(cudart=False)
    held = {"Diagnosis": [r], "Finding": r.findings, "DeviceInfo": r.devices,
            "ContextInfo": [r.context], "GuardInfo": r.guards,
            "RuntimeInfo": r.other_runtimes + [r.runtime], "LoadedLibrary": r.loaded}
    out = {}
    for name, objs in held.items():
        cls = getattr(cyctx.doctor, name)
        real = getattr(model, name, None) or getattr(report, name)
        out[name] = [cls is real, name in cyctx.doctor.__all__, cls.__module__,
                     all(isinstance(x, cls) for x in objs if x)]
    print(json.dumps([out, cyctx.doctor.diagnose is cyctx._doctor.diagnose]))
    """
    out, same = last_json(run_python(code, cwd=TESTS_DIR))
    assert same and len(out) == 7, out
    assert all(got == [True, True, "cyctx.doctor", True] for got in out.values()), out


def test_a_diagnosis_pickles_under_its_public_name():
    r = cyctx.diagnose(cudart=False)
    back = pickle.loads(pickle.dumps(r))
    assert type(back) is type(r) and back.to_dict() == r.to_dict()
    assert b"cyctx.doctor" in pickle.dumps(r.findings[0] if r.findings else r)


# --- no state change ----------------------------------------------------------------------


def test_diagnose_changes_nothing(sim, stand_ins):
    """Counted on the simulated driver: no retain, release, push, pop, set; same stack depth,
    refcounts and activity, and no CUDA library loaded, in a clean thread, in each broken
    state, and with runtimes of three majors, NVRTC and cuda.bindings.runtime loaded."""
    load = [stand_ins[k] for k in ("torch13", "cu12", "cu11", "nvrtc13", "jitlink13")]
    out = child(f"""
    import ctypes, sys
    sys.path.append({stand_ins["site"]!r})
    from cyctx import ContextGuard
    from cyctx._doctor import StandInRuntime
    results = []
    def check(label):
        before = snapshot()
        r = diagnose(cudart=False)
        str(r); r.to_json()
        results.append([label, before == snapshot(), before, snapshot()])
    check("fresh")
    g = ContextGuard(0)
    with g:
        check("inside a guard")
    check("guard alive, not entered")
    d.cuDevicePrimaryCtxReset(0)
    check("after a reset, guard alive")
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore")
        with g:
            pass
    g.close()
    StandInRuntime(11080).set_device(1)
    check("inactive primary current")
    d.cuCtxSetCurrent(d.CUcontext(0))
    t = threading.Thread(target=check, args=("new thread",))
    t.start(); t.join()
    libs = [ctypes.CDLL(p) for p in {load!r}]
    from cuda.bindings import runtime
    check("census: three runtimes, NVRTC, nvJitLink, cuda.bindings.runtime")
    g = ContextGuard(1)
    with g:
        check("census, inside a guard")
    g.close()
    print(json.dumps(results))
    """)
    results = last_json(out)
    assert [r[0] for r in results] == [
        "fresh",
        "inside a guard",
        "guard alive, not entered",
        "after a reset, guard alive",
        "inactive primary current",
        "new thread",
        "census: three runtimes, NVRTC, nvJitLink, cuda.bindings.runtime",
        "census, inside a guard",
    ]
    for label, same, before, after in results:
        assert same, f"{label}: diagnose changed state: {before} -> {after}"


def test_diagnose_changes_nothing_on_either_driver():
    n = device_count()
    before = (current(), [primary_state(i) for i in range(n)])
    diagnose(cudart=False)
    assert (current(), [primary_state(i) for i in range(n)]) == before


# --- other threads at work while the doctor looks ------------------------------------------------


def test_diagnose_while_other_threads_create_close_and_free_guards():
    # The doctor lists the live guards and reads each one's handle while other threads create,
    # close and drop guards: a guard closed between the look and the read, or the set of guards
    # changing during the listing, must never fail the diagnosis. Switching threads as often as
    # the interpreter allows makes both windows likely.
    stop = threading.Event()
    errors = []

    def churn():
        try:
            while not stop.is_set():
                gs = [ContextGuard(0) for _ in range(20)]
                for g in gs[::2]:
                    g.close()
                del gs
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    keep = [ContextGuard(0) for _ in range(200)]  # a long listing
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=churn, daemon=True) for _ in range(3)]
    # The dropped guards warn ResourceWarning (released by the collector): not this test's
    # subject. The filters are the process's, so the churning threads see this one.
    ignore = warnings.catch_warnings()
    ignore.__enter__()
    warnings.simplefilter("ignore", ResourceWarning)
    try:
        for t in threads:
            t.start()
        for _ in range(300):
            r = diagnose(cudart=False)
            assert r.context is not None and len(r.guards) >= 200
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        for t in threads:
            t.join(60)
        ignore.__exit__(None, None, None)
        for g in keep:
            g.close()
    assert errors == []


class _ClosedRightAfterTheLook(ContextGuard):
    """Says it is open, and is closed at that moment: what another thread's close() between
    the doctor's look and its read of the handle does."""

    @property
    def closed(self):
        was = ContextGuard.closed.__get__(self)
        if not was:
            self.close()
        return was


def test_diagnose_when_a_guard_is_closed_between_the_look_and_the_use():
    g = _ClosedRightAfterTheLook(0)
    try:
        r = diagnose(cudart=False)
    finally:
        g.close()
    assert g.closed and all(x.handle for x in r.guards)


# --- broken states, recognised and explained ------------------------------------------------


def test_inactive_primary_current_is_the_classic_report():
    # The state a pre-12 cudaSetDevice leaves (docs/evidence.md, "Before CUDA 12.0, cudaSetDevice
    # leaves the primary context inactive"), made with driver calls alone:
    # a primary handle retained and released (inactive again), then made current.
    d = diagnosed("""
    from cyctx._doctor import StandInRuntime
    assert not _drv.primary_state(0)[1]
    assert StandInRuntime(11080).set_device(0) == 0
    """)
    c = d["thread"]["current_context"]
    assert c["handle"] and c["device"] == 0 and c["usable"] is False
    assert c["primary"] is None and c["primary_why"].startswith("probably")
    assert c["why"] and c["id"] is None and c["id_error"]
    (f,) = d["findings"]
    assert f["code"] == "inactive_primary_current" and f["severity"] == "error"
    assert "older than 12.0" in f["explanation"] and "cudaDeviceReset" in f["explanation"]
    assert "CUDA_ERROR_INVALID_CONTEXT (201)" in f["explanation"]
    assert "ContextGuard(0)" in f["fix"]
    assert d["ok"] is False and d["exit_status"] == 1


def test_reset_since_a_guard_last_saw_it():
    out = child("""
    import warnings
    from cyctx import ContextGuard, ContextResetWarning
    g = ContextGuard(0)
    seen = g.context_id
    d.cuDevicePrimaryCtxReset(0)
    inactive = diagnose(cudart=False).to_dict()
    e, ctx = d.cuDevicePrimaryCtxRetain(0)          # someone re-activates it: a new id
    d.cuDevicePrimaryCtxRelease(0)
    reactivated = diagnose(cudart=False).to_dict()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with g:                                       # the guard catches up
            pass
    after = diagnose(cudart=False).to_dict()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with g:                                       # reset inside the block
            d.cuDevicePrimaryCtxReset(0)
            inside = diagnose(cudart=False).to_dict()
    g.close()
    print(json.dumps([seen, inactive, reactivated, after, [str(x.category.__name__) for x in w], inside]))
    """)
    seen, inactive, reactivated, after, warned, inside = last_json(out)
    (g,) = inactive["guards"]
    assert g["reset"] and g["seen_id"] == seen and g["driver_id"] is None
    assert g["driver_id_error"].startswith("CUDA_ERROR_CONTEXT_IS_DESTROYED")
    f = [f for f in inactive["findings"] if f["code"] == "context_reset"]
    assert f and f[0]["severity"] == "error" and "destroyed" in f[0]["explanation"]
    assert "ContextResetWarning" in f[0]["fix"]
    (g,) = reactivated["guards"]
    assert g["reset"] and g["driver_id"] not in (None, seen)
    assert (
        "re-activated"
        in [f for f in reactivated["findings"] if f["code"] == "context_reset"][0]["explanation"]
    )
    assert warned == ["ContextResetWarning"]
    assert not after["guards"][0]["reset"]
    assert "context_reset" not in [f["code"] for f in after["findings"]]
    # Reset inside the block: the current context is the guard's handle, certainly primary.
    c = inside["thread"]["current_context"]
    assert c["primary"] is True and c["usable"] is False
    assert [f["code"] for f in inside["findings"]] == ["inactive_primary_current", "context_reset"]
    f = inside["findings"][0]
    assert "leave the `with guard:` block and enter it again" in f["fix"]
    assert "cuCtxDestroy" not in f["explanation"]


@pytest.mark.parametrize("primary_held", [False, True])
def test_destroyed_context_still_current(sim, primary_held):
    # Simulated only: on the real driver the destroyed context is freed. To the driver it
    # looks like an inactive primary (real_h200.json); it is told apart only when the
    # device's primary context is active.
    r = diagnosed(
        f"""
        if {primary_held}:
            e, pc = d.cuDevicePrimaryCtxRetain(0)
        ctx = _drv.create_context()
        t = threading.Thread(target=lambda: d.cuCtxDestroy(ctx)); t.start(); t.join()
        """,
        "d.cuCtxPopCurrent()",
    )
    c = r["thread"]["current_context"]
    assert c["usable"] is False and c["device"] == 0 and "709" in c["why"]
    (f,) = r["findings"]
    if primary_held:
        assert c["primary"] is False and "cuCtxDestroy" in c["primary_why"]
        assert f["code"] == "dead_current_context" and "cuCtxDestroy" in f["explanation"]
    else:
        assert c["primary"] is None and c["primary_why"].startswith("probably")
        assert f["code"] == "inactive_primary_current" and "cuCtxDestroy" in f["explanation"]


def test_created_context_is_not_primary():
    r = diagnosed("ctx = _drv.create_context()", "d.cuCtxDestroy(ctx)")
    c = r["thread"]["current_context"]
    assert c["usable"] is True and c["primary"] is False and "cuCtxCreate" in c["primary_why"]
    (f,) = r["findings"]
    assert f["code"] == "current_not_primary" and f["severity"] == "warning", f
    assert "not device 0's primary context" in f["title"] and r["exit_status"] == 0
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in f["explanation"] and "cuCtxCreate" in f["fix"]


@pytest.mark.parametrize("import_before_fork", [True, False])
def test_forked_child(import_before_fork):
    out = run_child(f"""
    import json, os
    import cyctx
    {"import cyctx._doctor" if import_before_fork else ""}
    from helpers.forking import run_forked
    g = cyctx.ContextGuard(0)                 # CUDA is in use in the parent

    def in_child():
        from cyctx._doctor import diagnose
        r = diagnose(cudart=False)
        return [r.to_dict(), str(r), os.getppid()]

    print(json.dumps(run_forked(in_child)))
    g.close()
    """)
    d, text, parent = last_json(out)
    (f,) = d["findings"]
    assert f["code"] == "forked_child" and f["severity"] == "error"
    assert "use spawn" in f["title"].lower() and "spawn" in f["fix"]
    assert "CUDA_ERROR_NOT_INITIALIZED (3)" in f["explanation"]
    assert d["exit_status"] == 1 and "Forked child: use spawn" in text
    if import_before_fork:
        assert d["process"]["forked_from"] == parent and f"pid {parent}" in f["explanation"]


def test_forked_child_of_a_process_that_never_imported_cyctx():
    # The parent used CUDA through cuda.bindings alone: no fork handler of cyctx's ran, so
    # nothing but the driver's answer (NOT_INITIALIZED to cuInit) tells the child it is one.
    # That is still the fork diagnosis, not a generic cuInit failure.
    from helpers.children import run_python

    out = run_python(
        """
    import ctypes, importlib.util, json, os, sys
    if os.environ["CYCTX_TEST_DRIVER"] == "sim":  # the simulator, loaded without importing cyctx
        pkg = importlib.util.find_spec("cyctx").submodule_search_locations[0]
        path = os.environ.get("CYCTX_SIM_LIBRARY") or os.path.join(pkg, "_sim", "libcuda.so.1")
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL).cyctxsim_configure(2)
    from cuda.bindings import driver as d
    d.cuInit(0)
    assert "cyctx" not in sys.modules
    from helpers.forking import run_forked

    def in_child():
        from cyctx._doctor import diagnose
        return diagnose(cudart=False).to_dict()

    print(json.dumps(run_forked(in_child)))
    """,
        env={**os.environ, "CYCTX_TEST_DRIVER": KIND},
        cwd=TESTS_DIR,
    )
    d = last_json(out)
    assert [f["code"] for f in d["findings"]] == ["forked_child"], d["findings"]
    assert "spawn" in d["findings"][0]["fix"] and d["exit_status"] == 1


def test_findings_are_listed_worst_first():
    # An error (a guard's context reset) found after a note (no current context on this
    # thread) is still listed first.
    setup = "from cyctx import ContextGuard\ng = ContextGuard(0)\nd.cuDevicePrimaryCtxReset(0)"
    found = [(f["severity"], f["code"]) for f in diagnosed(setup, "g.close()")["findings"]]
    assert found == [("error", "context_reset"), ("info", "no_current_context")], found


def test_guard_of_a_live_created_context_is_not_reported_destroyed():
    r = diagnosed(
        """
        import cyctx
        ctx = _drv.create_context()
        d.cuCtxPopCurrent()
        g = cyctx.ContextGuard(ctx)
        """,
        "g.close()\nd.cuCtxDestroy(ctx)",
    )
    (g,) = r["guards"]
    assert g["primary"] is False and g["driver_id"] == g["seen_id"] and not g["reset"]
    assert r["findings"] == [] or [f["code"] for f in r["findings"]] == ["no_current_context"], r[
        "findings"
    ]


@pytest.mark.parametrize(
    "setup, after, primary, sim_only",
    [
        # No guard knows this handle: another library retained the primary context and made it
        # current. It is live, so nothing about it is dead or destroyed.
        (
            "e, pc = d.cuDevicePrimaryCtxRetain(0)\nd.cuCtxPushCurrent(pc)",
            "d.cuCtxPopCurrent()\nd.cuDevicePrimaryCtxRelease(0)",
            (True, None),
            False,
        ),
        # A created context the caller gave a guard on purpose: not reported.
        (
            "import cyctx\nctx = _drv.create_context()\ng = cyctx.ContextGuard(ctx)",
            "g.close()\nd.cuCtxDestroy(ctx)",
            (False,),
            False,
        ),
        # A created context with MAP_HOST beside an active primary: its flags cannot tell.
        (
            "import cyctx\ng = cyctx.ContextGuard(0)\n"
            "ctx = _drv.create_context(flags=int(d.CUctx_flags.CU_CTX_MAP_HOST))",
            "d.cuCtxDestroy(ctx)\ng.close()",
            (None,),
            True,
        ),
    ],
    ids=["primary made current by another library", "created, held by a guard", "map host"],
)
def test_a_live_current_context_is_not_reported(request, setup, after, primary, sim_only):
    if sim_only:
        request.getfixturevalue("sim")
    r = diagnosed(setup, after)
    c = r["thread"]["current_context"]
    assert c["usable"] is True and c["primary"] in primary, c
    assert "cuCtxDestroy" not in (c["primary_why"] or ""), c
    assert r["findings"] == [], r["findings"]


# --- the command line -----------------------------------------------------------------------


def _headings(text):
    """The title and every section heading: unindented lines after a blank line."""
    lines = text.splitlines()
    return [lines[0]] + [
        ln for prev, ln in itertools.pairwise(lines) if not prev.strip() and ln[:1].strip()
    ]


@pytest.mark.parametrize(
    "args", [(), ("--json",), ("--demo",), ("--demo", "--sim-runtime", "13.0")]
)
def test_simulate_is_labelled_on_every_screen(args):
    rc, out, err = cli("doctor", "--simulate", *args)
    assert rc == 0, out + err
    assert "\x1b[" not in out, "colour only on a terminal"
    if "--json" in args:
        d = json.loads(out)
        assert d["simulated"] is True and d["driver"]["library"].endswith(
            os.path.join("_sim", "libcuda.so.1")
        )
        assert [lib["kind"] for lib in d["loaded"]] == ["driver"]
        assert d["loaded"][0]["version"] == 13000
        return
    heads = _headings(out)
    assert len(heads) >= 5
    for h in heads:
        assert "[SIMULATED]" in h, f"heading without the simulated label: {h!r}"
    assert out.splitlines()[1].startswith("SIMULATED:")


def test_the_demos_state_lines_follow_one_handle_through_its_contexts():
    # The classic failure as the demo walks it: one handle, current throughout once made; a
    # live context answers its id (new after each reset, from one counter) with its primary
    # context active, a reset one answers 709 to cuCtxGetId with the primary inactive.
    rc, out, err = cli("doctor", "--simulate", "--demo")
    assert rc == 0, out + err
    states = re.findall(
        r"state: current (\S+)(?: \((.*?)\))? \| device 0 primary context: (\w+)", out
    )
    assert states[0] == ("NULL", "", "inactive"), states
    handles = {h for h, _, _ in states[1:]}
    assert len(handles) == 1, states
    ids = []
    for _, cid, primary in states[1:]:
        if cid.startswith("id "):
            assert primary == "active", states
            ids.append(int(cid[3:]))
        else:
            assert (cid, primary) == ("destroyed: cuCtxGetId -> 709", "inactive"), states
    assert len(ids) >= 2 and ids == sorted(ids), states


def test_cli_report_on_the_simulator():
    rc, out, _ = cli("doctor", "--simulate")
    assert rc == 0
    assert "cyctx simulated GPU" in out and "cc 9.0" in out
    assert "primary context: inactive" in out
    assert "NOTE  No current context on this thread" in out and "cyctx.diagnose()" in out
    # The doctor's own new thread has no context, as every new thread: a note, not a warning.
    assert "WARNING" not in out
    assert "Result  [SIMULATED]: OK (exit status 0)" in out
    # The census of its own fresh process: the simulated driver alone.
    section = out.split("\nLoaded", 1)[1].split("\n\n", 1)[0]
    assert "fresh Python process" in section and "cyctx.diagnose()" in section
    (line,) = [ln for ln in section.splitlines() if ln.strip().startswith("driver")]
    assert "CUDA 13.0" in line and os.path.join("_sim", "libcuda.so.1") in line


def test_cli_exit_status_1_when_something_is_wrong():
    out = run_child("""
    import sys
    from cyctx._doctor import StandInRuntime
    from cyctx.__main__ import main
    StandInRuntime(11080).set_device(0)          # the classic state on this thread
    sys.stdout.flush()
    rc = main(["doctor"])
    print("RC", rc)
    """)
    assert out.stdout.strip().endswith("RC 1")
    assert "PROBLEMS FOUND: 1 error (exit status 1)" in out.stdout
    assert (
        "ERROR  The current context is device 0's primary context, and it is not active"
        in out.stdout
    )


DOCTOR_USAGE = "usage: python -m cyctx doctor [-h] [--json] [--demo] [--simulate]"


@pytest.mark.parametrize(
    "args, says",
    [
        (("--bogus",), "unrecognized arguments: --bogus"),
        (("--json", "extra"), "unrecognized arguments: extra"),
        # A flag that only the demo (or the simulated demo) reads is refused elsewhere.
        (("--device", "1"), "--device N is the demo's device: use it with --demo"),
        (("--device", "0", "--json"), "--device N is the demo's device: use it with --demo"),
        (("--sim-runtime", "13.0"), "--sim-runtime is the stand-in runtime of --simulate --demo"),
        (("--simulate", "--sim-runtime", "13.0"), "--sim-runtime is the stand-in runtime"),
        (("--demo", "--sim-runtime", "13.0"), "--sim-runtime is the stand-in runtime"),
        (("--device", "x"), "argument --device: invalid int value: 'x'"),
        (("--sim-runtime", "12.0"), "argument --sim-runtime: invalid choice: '12.0'"),
        (("--json", "--demo"), "--json is for the report, not --demo"),
        (("--cudart", "/nonexistent/libcudart.so"), "/nonexistent/libcudart.so: no such file"),
        (("--simulate", "--cudart", __file__), "--cudart needs the real driver"),
        (("--device", "-1"), "--device N is the demo's device: use it with --demo"),
    ],
)
def test_doctor_usage_errors_print_the_doctors_usage(args, says):
    rc, out, err = cli("doctor", *args)
    assert rc == 2 and out == "", (rc, out, err)
    first, *_, last = err.strip().splitlines()
    assert first.startswith(DOCTOR_USAGE), err
    assert last.startswith("python -m cyctx doctor: error: ") and says in last, err


@pytest.mark.parametrize(
    "args, usage, says",
    [
        (("trace", "--bogus", "x.py"), "python -m cyctx trace [-h]", "trace: error: unrecognized"),
        (("--bogus",), "python -m cyctx [-h] [-V] COMMAND", "cyctx: error: unrecognized"),
    ],
)
def test_other_usage_errors_print_their_own_usage(args, usage, says):
    rc, out, err = cli(*args)
    assert rc == 2 and err.startswith(f"usage: {usage}") and f"{says} arguments: --bogus" in err, (
        err
    )


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_flags(flag):
    rc, out, err = cli(flag)
    assert rc == 0, err
    assert out.startswith(f"cyctx {cyctx.__version__} (compiled with cuda-bindings "), out
    assert len(out.strip().splitlines()) == 1, out  # usable bindings: one line


@pytest.mark.parametrize(
    "args",
    [
        ("--demo", "--simulate", "--device", "1"),
        ("--demo", "--simulate", "--sim-runtime", "11.8", "--device", "0"),
    ],
)
def test_demo_flags_work_with_the_demo(args):
    rc, out, err = cli("doctor", *args)
    assert rc == 0, out + err
    if "1" in args:
        assert "device 1" in out, out


def _not_the_simulator():
    # A shared library that loads but is not the simulator: one of cyctx's own extensions.
    import cyctx._guard

    return cyctx._guard.__file__


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda tmp: str(tmp / "missing.so"), "not found"),
        (
            lambda tmp: (
                (tmp / "notalib.so").write_text("not a library") and str(tmp / "notalib.so")
            ),
            "not a library",
        ),
        (lambda tmp: _not_the_simulator(), "not cyctx's simulated driver"),
    ],
    ids=["missing", "not a library", "not the simulator"],
)
def test_simulate_with_an_unusable_sim_library_is_a_clear_error(tmp_path, make, says):
    # Exit status 3 ("no usable driver"), one line that names the library, and no traceback.
    path = make(tmp_path)
    for args in (
        ("doctor", "--simulate"),
        ("doctor", "--simulate", "--json"),
        ("doctor", "--demo", "--simulate"),
    ):
        rc, out, err = cli(*args, env={"CYCTX_SIM_LIBRARY": path})
        assert rc == 3, (args, rc, out, err)
        assert (
            "Traceback" not in err and says in err and path in err and "CYCTX_SIM_LIBRARY" in err
        ), err


def test_help_lists_every_exit_status():
    rc, out, _ = cli("doctor", "--help")
    text = " ".join(out.split())  # argparse wraps the description
    assert rc == 0
    for status in (
        "0 nothing wrong",
        "1 a problem found",
        "2 bad command line",
        "3 no usable driver or GPU",
    ):
        assert status in text, status


def test_packages_line_lists_the_installed_frameworks(tmp_path):
    # A framework is listed from its metadata alone (never imported): a bare dist-info is enough.
    for name, ver in (("torch", "9.8.7"), ("cupy-cuda13x", "99.1.0")):
        info = tmp_path / f"{name.replace('-', '_')}-{ver}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\n")
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    }
    rc, out, err = cli("doctor", "--simulate", env=env)
    assert rc == 0, err
    (line,) = [ln for ln in out.splitlines() if ln.strip().startswith("packages")]
    assert "torch 9.8.7" in line and "cupy-cuda13x 99.1.0" in line, line
    assert line.rstrip().endswith(f"Python {sys.version.split()[0]}"), line
    rc, out, err = cli("doctor", "--simulate", "--json", env=env)
    versions = json.loads(out)["versions"]
    assert versions["torch"] == "9.8.7" and versions["cupy-cuda13x"] == "99.1.0"
    from importlib.metadata import PackageNotFoundError, version

    for name in set(_doctor.gather.FRAMEWORK_DISTRIBUTIONS) - set(versions):
        with pytest.raises(PackageNotFoundError):  # only what is installed is listed
            version(name)


def test_advice_names_the_console_script():
    # The README teaches `cyctx doctor`; the doctor's advice says the same.
    from cyctx._doctor import words

    for f in (words.no_driver("OSError: x"), words.no_device()):
        assert "`cyctx doctor --simulate`" in f.fix and "python -m" not in f.fix, f.fix


def test_cli_without_a_command_prints_help():
    rc, out, _ = cli()
    assert rc == 2 and "doctor" in out


def test_demo_on_the_simulator_pre12():
    rc, out, err = cli("doctor", "--demo", "--simulate")
    assert rc == 0, out + err
    assert "stand-in runtime modelling libcudart 11.8" in out
    part1, rest = out.split("2. The reset variant", 1)
    part2, part3 = rest.split("3. The same steps inside a ContextGuard(0)", 1)
    assert "cudaSetDevice(0)" in part1 and "primary context: inactive" in part1
    assert "CUDA_ERROR_INVALID_CONTEXT (201)   FAILS, as in the report" in part1
    assert "older than 12.0" in part1 and "cuCtxRetain" in part1
    assert "cudaDeviceReset()" in part2 and "CUDA_ERROR_INVALID_CONTEXT (201)   FAILS" in part2
    assert "ContextResetWarning" in part3 and part3.count("3020   works") == 2
    assert "FAILS" not in part3.split("Summary")[0]
    assert "Inside ContextGuard(0): the same steps work" in " ".join(out.split())


def test_demo_on_the_simulator_12_plus():
    rc, out, err = cli("doctor", "--demo", "--simulate", "--sim-runtime", "13.0")
    assert rc == 0, out + err
    assert "stand-in runtime modelling libcudart 13.0" in out, out
    part1, rest = out.split("2. The reset variant", 1)
    assert "No failure with this runtime: since CUDA 12.0" in " ".join(part1.split())
    assert "(201)" not in part1
    assert "CUDA_ERROR_INVALID_CONTEXT (201)   FAILS" in rest.split("3. The same steps")[0]


# --- no GPU, and the CUDA 11 runtime ----------------------------------------------------------


def test_no_gpu_says_so_plainly(no_driver_machine):
    rc, out, _ = cli("doctor")
    assert rc == 3
    assert "No NVIDIA driver: this machine has no usable GPU for CUDA" in out
    assert "--simulate" in out and "[SIMULATED]" not in out
    rc, out, _ = cli("doctor", "--json")
    d = json.loads(out)
    assert rc == 3 and d["findings"][0]["code"] == "no_driver" and d["driver"]["error"]
    assert d["simulated"] is False and d["devices"] == []
    rc, out, _ = cli("doctor", "--demo")
    assert rc == 3 and "--demo --simulate" in out


def test_no_device_on_the_simulator():
    # The simulated driver with 0 devices: cuInit says CUDA_ERROR_NO_DEVICE.
    code = """
    import ctypes, json, os
    from cyctx import testing
    ctypes.CDLL(testing.sim_library_path(), mode=ctypes.RTLD_GLOBAL)
    from cyctx._doctor import diagnose
    r = diagnose(cudart=False)
    print(json.dumps([r.to_dict(), str(r)]))
    """
    p = run_python(code, env=dict(os.environ, CYCTX_SIM_DEVICES="0", CUDA_VISIBLE_DEVICES=""))
    d, text = last_json(p)
    assert d["simulated"] is True and d["exit_status"] == 3
    (f,) = d["findings"]
    assert f["code"] == "no_device" and "CUDA_VISIBLE_DEVICES is ''" in f["explanation"]
    assert "[SIMULATED]" in text.splitlines()[0]


def test_a_device_the_driver_will_not_name_is_listed_with_that_error_alone(sim):
    # cuDeviceGet failing for an ordinal the count included (a device gone mid-diagnosis): its
    # entry says so, and nothing else is asked of a device there is no handle for.
    from helpers.threads import in_thread

    def body():
        sim.inject_fault("cuDeviceGet", 999, count=1000)
        try:
            return diagnose(cudart=False).to_dict()
        finally:
            sim.clear_faults()

    devices = in_thread(body)["devices"]
    assert devices and all(d["error"] == "cuDeviceGet: CUDA_ERROR_UNKNOWN (999)" for d in devices)
    asked = ("name", "compute_capability", "pci_bus_id", "total_memory")
    assert all(d[k] is None for d in devices for k in asked), devices
    assert all(d["primary_context"] == {"active": None, "flags": None} for d in devices), devices


@pytest.mark.parametrize("function", ["cuInit", "cuCtxGetCurrent"])
def test_a_driver_query_that_fails_is_a_driver_error(sim, function):
    # The driver fails a query with an error the doctor has no other words for: the finding
    # names the call and the error. A failed cuInit ends the report's driver part (no devices,
    # no context); a failed cuCtxGetCurrent is not taken for "no current context".
    from helpers.threads import in_thread

    def body():
        sim.inject_fault(function, 999, count=1000)
        try:
            r = diagnose(cudart=False)
        finally:
            sim.clear_faults()
        return r.to_dict(), str(r)

    d, text = in_thread(body)
    (f,) = [f for f in d["findings"] if f["code"] == "driver_error"]
    assert f["severity"] == "error", f
    assert f["title"] == f"{function} failed with CUDA_ERROR_UNKNOWN (999)", f
    assert f["explanation"].startswith(
        f"The driver answered {function} with CUDA_ERROR_UNKNOWN (999);"
    ), f
    assert d["exit_status"] == 1 and d["ok"] is False
    assert f"ERROR  {function} failed with CUDA_ERROR_UNKNOWN (999)" in text, text
    codes = [x["code"] for x in d["findings"]]
    if function == "cuInit":
        assert codes == ["driver_error"], codes
        assert d["driver"]["error"] == "CUDA_ERROR_UNKNOWN (999)", d["driver"]
        assert d["devices"] == [] and d["thread"]["current_context"] is None, d
        assert "Devices (" not in text
    else:
        assert "no_current_context" not in codes, codes
        assert d["devices"] and d["driver"]["error"] is None, d
        assert d["thread"]["current_context"]["error"] == "CUDA_ERROR_UNKNOWN (999)", d


def test_a_driver_library_refused_for_another_reason_is_driver_unusable(monkeypatch):
    # cyctx's loader refuses a library with a CUresult of no finding of its own (it runs out of
    # memory resolving the table, CUDA_ERROR_OUT_OF_MEMORY): the general finding, with the
    # reason and fix of cyctx's own error; nothing past the library is described.
    from cyctx._doctor import gather
    from cyctx._errors import load_fix

    monkeypatch.setattr(gather, "load_problem", lambda: (2, "Out of memory"))
    r = diagnose(cudart=False)
    (f,) = r.findings
    assert (f.code, f.severity) == ("driver_unusable", "unavailable"), f
    assert f.title == "The CUDA driver library cannot be used", f
    assert "fails with CUDA_ERROR_OUT_OF_MEMORY (2). Out of memory." in f.explanation, f
    assert f.fix == load_fix(2) + ".", f
    assert r.exit_status == 3 and r.driver_error == "CUDA_ERROR_OUT_OF_MEMORY (2): Out of memory"
    assert r.devices == [] and r.context is None and r.guards == []


# A wrong libcuda.so.1 first on the library path: the doctor says what cyctx's own error says
# (tests/helpers/fakelibs.py builds the stand-ins), and that CUDA is not usable here.
WRONG_LIBRARIES = [
    # kind, finding code, what the title says, what cyctx's error says too
    ("stub", "driver_stub", "stub", "LD_LIBRARY_PATH"),
    ("old", "driver_too_old", "too old", "install a driver of CUDA 12.0 or newer"),
    (
        "lacking:cuGetErrorName",
        "driver_incomplete",
        "not a complete NVIDIA driver",
        "cuGetErrorName",
    ),
]


@pytest.mark.parametrize(
    "kind, code, title, fix", WRONG_LIBRARIES, ids=[w[0] for w in WRONG_LIBRARIES]
)
def test_wrong_driver_library_is_diagnosed_as_cyctx_reports_it(tmp_path, kind, code, title, fix):
    from helpers.fakelibs import fake_libcuda, preload

    lib = fake_libcuda(tmp_path, kind)
    from helpers.children import run_python

    out = run_python(
        """
        import json, cyctx
        from cyctx._doctor import diagnose
        try:
            cyctx.ContextGuard(0)
            err = None
        except cyctx.DriverError as e:
            err = str(e)
        r = diagnose(cudart=False)
        print(json.dumps([r.to_dict(), str(r), err]))
    """,
        preload(lib),
    )
    d, text, err = json.loads(out.stdout.strip().splitlines()[-1])
    assert d["exit_status"] == 3 and d["simulated"] is False, text
    (f,) = d["findings"]
    assert f["code"] == code and f["severity"] == "unavailable", f
    assert title in f["title"] and "No NVIDIA driver" not in text and "without a GPU" not in text, (
        text
    )
    assert fix in f["explanation"] + f["fix"] and fix in err, (f, err)
    # The same reason as the guard's error, word for word.
    # (`loading the CUDA driver failed (NAME, code): why. fix.`; the finding's sentence
    # starts with it, capitalised.)
    why = err.split("): ", 1)[1].split(". ")[0]
    assert why[:1].upper() + why[1:] in f["explanation"], (why, f)
    # And from the command line, with the library first on the path (LD_LIBRARY_PATH).
    rc, cli_out, _ = cli("doctor", env={"LD_LIBRARY_PATH": os.path.dirname(lib)})
    assert rc == 3 and title in cli_out and "No NVIDIA driver" not in cli_out, cli_out


def test_cu11_runtime_is_discovered():
    found = _doctor.cu11_candidates()
    if not found:
        pytest.skip("the nvidia-cuda-runtime-cu11 wheel is not installed")
    assert found[0].endswith(os.path.join("nvidia", "cuda_runtime", "lib", "libcudart.so.11.0"))
    version, wheel = wheel_version(found[0])
    assert version // 1000 == 11 and wheel.startswith("nvidia_cuda_runtime_cu11-11.")
    r = diagnose(cudart=False)
    assert [o.library for o in r.other_runtimes] == found
    assert "--demo --cudart" in r.other_runtimes[0].note


def test_cu11_demo_without_a_gpu_says_so(no_driver_machine):
    found = _doctor.cu11_candidates()
    if not found:
        pytest.skip("the nvidia-cuda-runtime-cu11 wheel is not installed")
    rc, out, _ = cli("doctor", "--demo", "--cudart", found[0])
    assert rc == 3 and "No NVIDIA driver" in out


def test_cudart_version_from_the_wheel():
    from cyctx._doctor import find_cudart

    path, source, err = find_cudart()
    if path is None:
        pytest.skip(f"no libcudart: {err}")
    rt = _doctor.Cudart(path, source)
    assert rt.version and rt.version >= 12000, (rt.version, rt.version_from)


# --- the real runtime (H200) ------------------------------------------------------------------


@pytest.mark.cudart
def test_runtime_in_the_report():
    g = ContextGuard(0)
    try:
        with g:
            r = diagnose()
        assert (
            r.runtime
            and r.runtime.version >= 12000
            and r.runtime.version_from == "cudaRuntimeGetVersion"
        )
        assert r.runtime.current_device == 0, (
            "inside a guard for k, cudaGetDevice says k (docs/design.md: the runtime follows it)"
        )
    finally:
        g.close()


@pytest.mark.cudart
def test_demo_with_the_installed_runtime():
    rc, out, err = cli("doctor", "--demo")
    assert rc == 0, out + err
    assert "[SIMULATED]" not in out
    part1, rest = out.split("2. The reset variant", 1)
    assert "No failure with this runtime" in " ".join(part1.split())
    assert "CUDA_ERROR_INVALID_CONTEXT (201)   FAILS" in rest.split("3. The same steps")[0]
    assert "ContextResetWarning" in rest


@pytest.mark.cudart
def test_demo_with_the_cuda11_runtime():
    found = _doctor.cu11_candidates() or [p for p in [os.environ.get("CYCTX_CUDART11")] if p]
    if not found:
        pytest.skip("no CUDA 11 runtime (nvidia-cuda-runtime-cu11 wheel, or CYCTX_CUDART11=path)")
    rc, out, err = cli("doctor", "--demo", "--cudart", found[0])
    assert rc == 0, out + err
    part1 = out.split("2. The reset variant", 1)[0]
    assert "CUDA_ERROR_INVALID_CONTEXT (201)   FAILS, as in the report" in part1
    assert "active = 0" in part1


def test_cudart_that_does_not_load_is_reported():
    rc, out, _ = cli("doctor", "--cudart", __file__)
    assert rc in (0, 3) and "none loadable: cannot load" in out and __file__ in out


def test_guard_of_a_created_context_destroyed_by_its_owner_is_not_a_reset():
    # A guard made from a cuCtxCreate context whose owner destroyed it looks like a reset (the
    # id is gone), but it is not one: "the next enter re-activates it" would be false advice,
    # since nothing can re-activate a destroyed created context.
    r = diagnosed(
        """
        import cyctx
        ctx = _drv.create_context()
        d.cuCtxPopCurrent()
        g = cyctx.ContextGuard(ctx)
        assert not g.is_primary
        d.cuCtxDestroy(ctx)
        """,
        "g.close()",
    )
    (g,) = r["guards"]
    assert g["primary"] is False
    codes = [f["code"] for f in r["findings"]]
    assert "context_reset" not in codes, codes
    (f,) = [f for f in r["findings"] if f["code"] == "guard_context_destroyed"]
    assert "cuCtxDestroy" in f["explanation"] and "reset" not in f["title"].lower()
    assert "close the guard" in f["fix"].lower() and "ContextResetWarning" not in f["fix"]


def test_guard_findings_follow_the_guards_order():
    # Two kinds of guard finding, a reset primary context and a destroyed created one: they are
    # listed guard by guard, in the order of the report's guards, not grouped by kind.
    r = diagnosed(
        """
        import cyctx
        created = [_drv.create_context(current=False) for _ in range(2)]
        guards = [cyctx.ContextGuard(created[0]), cyctx.ContextGuard(0), cyctx.ContextGuard(created[1])]
        for ctx in created:
            d.cuCtxDestroy(ctx)
        d.cuDevicePrimaryCtxReset(0)
        """,
        "for g in guards:\n    g.close()",
    )
    kinds = [("context_reset" if g["primary"] else "guard_context_destroyed") for g in r["guards"]]
    assert sorted(kinds) == ["context_reset"] + ["guard_context_destroyed"] * 2, r["guards"]
    # The guards' order is their handles' (the driver's to choose): whether it interleaves the
    # kinds is the next test's, which picks the order.
    found = [f for f in r["findings"] if f["code"] in set(kinds)]
    assert [f["code"] for f in found] == kinds, found
    for f, g in zip(found, r["guards"], strict=True):
        assert f"handle 0x{g['handle']:x})" in f["explanation"], (f, g)


def test_guard_findings_are_not_grouped_by_kind():
    # The report's guards in an order that interleaves the two kinds of guard finding: the
    # findings keep it (grouped by the rules' order, the reset one would come first).
    from cyctx._doctor import rules
    from cyctx._doctor.gather import Seen
    from cyctx._doctor.model import GuardInfo

    def guard(handle, primary):  # the driver gives no id now: reset or destroyed, by kind
        return GuardInfo(0, handle, 1, None, "CUDA_ERROR_CONTEXT_IS_DESTROYED", False, primary)

    r = empty_report({})
    r.guards = [guard(0x30, False), guard(0x10, True), guard(0x20, False)]
    pair = [x for x in rules.RULES if x.code in ("context_reset", "guard_context_destroyed")]
    found = rules.findings_of(Seen(r, "described"), pair)
    assert [f.code for f in found] == [
        "guard_context_destroyed",
        "context_reset",
        "guard_context_destroyed",
    ], found
    for f, handle in zip(found, (0x30, 0x10, 0x20), strict=True):
        assert f"handle 0x{handle:x})" in f.explanation, f


# --- the census: the CUDA libraries loaded in the process ---------------------------------------

# Stand-in libraries (tests/helpers/fakelibs.py), each in a site folder under the path an
# installed wheel gives it, with the distribution that ships it (None: none does).
STAND_INS = {
    # key: (library, version, path under the site folder, distribution)
    "torch13": ("cudart", 13000, "torch/lib/libcudart.so.13", ("torch", "9.9.0")),
    "nvrtc13": ("nvrtc", 13010, "torch/lib/libnvrtc.so.13", ("torch", "9.9.0")),
    "jitlink13": ("nvJitLink", 13020, "torch/lib/libnvJitLink.so.13", ("torch", "9.9.0")),
    "cu12": (
        "cudart",
        12090,
        "nvidia/cuda_runtime/lib/libcudart.so.12",
        ("nvidia-cuda-runtime-cu12", "12.9.79"),
    ),
    "cu11": (
        "cudart",
        11080,
        "nvidia/cuda_runtime/lib/libcudart.so.11.0",  # where the cu11 wheel puts it
        ("nvidia-cuda-runtime-cu11", "11.8.89"),
    ),
    "newer14": ("cudart", 14000, "opt/cuda-14/lib/libcudart.so.14", None),
    "minor13": ("cudart", 13020, "opt/cuda-13.2/lib/libcudart.so.13", None),
}


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """{key: path} of every stand-in, and "site": the folder to put on PYTHONPATH."""
    from helpers.fakelibs import fake_cuda_library, fake_distribution

    site = tmp_path_factory.mktemp("site")
    paths = {"site": str(site)}
    owned = {}
    for key, (lib, version, rel, dist) in STAND_INS.items():
        where = site / rel
        paths[key] = fake_cuda_library(where.parent, lib, version, soname=where.name)
        if dist:
            owned.setdefault(dist, []).append(paths[key])
    # CuPy's extension that holds its runtime (linked in statically): a file its wheel ships.
    ext = site / "cupy_backends" / "cuda" / "api" / "runtime.cpython-3-x86_64-linux-gnu.so"
    ext.parent.mkdir(parents=True)
    ext.write_bytes(b"")
    paths["cupy_ext"] = str(ext)
    owned[("cupy-cuda12x", "13.6.0")] = [str(ext)]
    for (name, version), files in owned.items():
        fake_distribution(site, name, version, files)
    return paths


# A stand-in for CuPy's runtime module, whose runtime is linked in: imported, it answers
# runtimeGetVersion like CuPy's (child code; EXT is the file of the extension).
FAKE_CUPY_RUNTIME = """
import types
_m = types.ModuleType("cupy_backends.cuda.api.runtime")
_m.__file__ = EXT
_m.runtimeGetVersion = lambda: 12090
sys.modules[_m.__name__] = _m
"""


def census_child(stand_ins, load, body="", guard=True):
    """In a fresh interpreter on this driver: load the stand-ins ``load`` (keys) with ctypes,
    run ``body``, then diagnose (inside a guard of device 0 unless ``guard`` is false).
    Returns (to_dict(), str(), {key: calls into the stand-in's version function})."""
    code = f"""
    import ctypes, sys
    sys.path.append({stand_ins["site"]!r})  # where the stand-ins' distributions are installed
    libs = {{k: ctypes.CDLL(p) for k, p in {[(k, stand_ins[k]) for k in load]!r}}}
    {body}
    from cyctx import ContextGuard
    if {guard}:
        g = ContextGuard(0)
        with g:
            r = diagnose()
        g.close()
    else:
        r = diagnose()
    calls = {{k: ctypes.c_int.in_dll(lib, "census_calls").value for k, lib in libs.items()}}
    print(json.dumps([r.to_dict(), str(r), calls]))
    """
    return last_json(child(code))


def loaded_of(d, kind):
    return [lib for lib in d["loaded"] if lib["kind"] == kind]


def test_census_of_a_healthy_process(stand_ins):
    # torch's runtime, NVRTC and nvJitLink, and cuda.bindings' static runtime (a newer minor
    # of the driver's major), inside a guard: every library listed, nothing found.
    from cyctx._compat import installed_bindings_version

    if not (installed_bindings_version() or "").startswith("13."):
        pytest.skip(
            "the stand-ins are CUDA 13's: beside CUDA 12 bindings, whose static runtime is of "
            "another major, the census rightly finds two majors (tested on its own)"
        )
    d, text, calls = census_child(
        stand_ins,
        ["torch13", "nvrtc13", "jitlink13"],
        body="from cuda.bindings import runtime as _rt; STATIC = _rt.cudaRuntimeGetVersion()[1]",
    )
    assert d["findings"] == [], d["findings"]
    assert d["exit_status"] == 0
    (drv,) = loaded_of(d, "driver")
    assert drv["version"] == d["driver"]["version"] and drv["version_from"] == "cuDriverGetVersion"
    assert os.path.realpath(drv["path"]) == os.path.realpath(d["driver"]["library"])
    shared, static = loaded_of(d, "runtime")
    assert shared["path"] == stand_ins["torch13"] and shared["version"] == 13000
    assert shared["version_from"] == "cudaRuntimeGetVersion" and shared["version_str"] == "13.0"
    assert shared["distribution"] == "torch 9.9.0" and not shared["static"]
    assert static["static"] and static["distribution"].startswith("cuda-bindings ")
    assert static["version"] // 1000 == 13 and "cuda.bindings.runtime" in static["name"]
    (nvrtc,) = loaded_of(d, "nvrtc")
    (jit,) = loaded_of(d, "nvjitlink")
    assert (nvrtc["version"], nvrtc["version_from"], nvrtc["path"]) == (
        13010,
        "nvrtcVersion",
        stand_ins["nvrtc13"],
    )
    assert (jit["version"], jit["version_from"]) == (13020, "nvJitLinkVersion")
    assert nvrtc["distribution"] == jit["distribution"] == "torch 9.9.0"
    assert not any(lib["by_doctor"] for lib in d["loaded"])
    # Not loaded, not listed: the other stand-ins exist on disk beside these.
    assert {lib["path"] for lib in d["loaded"]}.isdisjoint(
        {stand_ins[k] for k in ("cu12", "cu11", "newer14")}
    )
    assert calls == {"torch13": 1, "nvrtc13": 1, "jitlink13": 1}, "asked once each"
    section = text.split("\nLoaded", 1)[1].split("\n\n", 1)[0]
    assert stand_ins["torch13"] in section and "[torch 9.9.0]" in section
    assert "cuda.bindings.runtime" in section and "nothing wrong" in text


def test_census_of_one_runtime(stand_ins):
    # torch's runtime alone, without cuda.bindings.runtime: no static runtime listed, the CUDA 11
    # one found installed but not loaded, nothing wrong; every library's record complete.
    d, _, _ = census_child(stand_ins, ["torch13"])
    assert [lib["path"] for lib in loaded_of(d, "runtime")] == [stand_ins["torch13"]]
    (o,) = d["other_runtimes"]
    assert o["library"] == stand_ins["cu11"] and o["note"].startswith("not loaded"), o
    assert d["findings"] == [], d["findings"]
    assert d["schema"] == "cyctx.diagnosis/2"
    for lib in d["loaded"]:
        assert set(lib) == {
            "kind",
            "name",
            "path",
            "version",
            "version_str",
            "version_from",
            "distribution",
            "static",
            "by_doctor",
            "note",
            "file",
            "on_disk",
        }
        assert lib["file"] == "same" and lib["on_disk"] is None
        assert lib["kind"] in ("driver", "runtime", "nvrtc", "nvjitlink", "library")


def test_census_sees_cupys_static_runtime_beside_torchs(stand_ins):
    # The report of cupy/cupy#9827's setup: torch's CUDA 13 runtime beside CuPy built for 12.9,
    # whose runtime is linked into its extension (no libcudart in the memory map).
    body = f"EXT = {stand_ins['cupy_ext']!r}\n" + FAKE_CUPY_RUNTIME
    d, _, _ = census_child(stand_ins, ["torch13"], body=body.replace("\n", "\n    "))
    (cp,) = [lib for lib in loaded_of(d, "runtime") if lib["static"]]
    assert cp["path"] == stand_ins["cupy_ext"] and cp["version"] == 12090
    assert cp["distribution"] == "cupy-cuda12x 13.6.0" and "cupy_backends" in cp["name"]
    (f,) = d["findings"]
    assert f["code"] == "runtime_majors_mixed"
    assert "cupy-cuda12x 13.6.0" in f["explanation"] and "torch 9.9.0" in f["explanation"]
    assert "`pip install cupy-cuda13x` in place of cupy-cuda12x" in f["fix"], f["fix"]


def test_census_two_majors_names_each_distribution(stand_ins):
    d, text, _ = census_child(stand_ins, ["torch13", "cu12"])
    (f,) = d["findings"]
    assert f["code"] == "runtime_majors_mixed" and f["severity"] == "warning", f
    assert "CUDA 12" in f["title"] and "CUDA 13" in f["title"]
    for key, dist in (("torch13", "torch 9.9.0"), ("cu12", "nvidia-cuda-runtime-cu12 12.9.79")):
        assert stand_ins[key] in f["explanation"] and dist in f["explanation"], f
    # The fix names the distribution of the odd major, not the other one.
    assert "nvidia-cuda-runtime-cu12" in f["fix"] and "torch" not in f["fix"]
    assert "the CUDA 13 build" in f["fix"]
    assert d["exit_status"] == 0 and "WARNING  CUDA runtimes of different majors" in text


@pytest.mark.parametrize(
    "key, finding",
    [("newer14", "runtime_newer_than_driver"), ("minor13", None)],
    ids=["newer major", "newer minor"],
)
def test_census_runtime_newer_than_driver(stand_ins, key, finding):
    # The simulated driver is CUDA 13.0: a 14.0 runtime cannot run on it; a 13.2 one can,
    # under minor version compatibility, and the report only says so beside it.
    d, text, _ = census_child(stand_ins, [key])
    assert d["driver"]["version"] == 13000
    if finding is None:
        assert d["findings"] == [], d["findings"]
        lines = text.splitlines()
        start = next(i for i, ln in enumerate(lines) if ln.startswith("Loaded"))
        end = next(i for i in range(start, len(lines)) if not lines[i].strip())
        (line,) = [ln for ln in lines[start:end] if stand_ins[key] in ln]  # in "Loaded"
        assert "minor version compatibility" in line and "CUDA 13.2" in line, line
        return
    (f,) = d["findings"]
    assert f["code"] == finding and f["severity"] == "error", f
    assert "CUDA 14.0" in f["title"] and "CUDA 13.0" in f["title"]
    assert stand_ins[key] in f["explanation"] and "cudaErrorInsufficientDriver" in f["explanation"]
    assert "CUDA 14.0 or newer" in f["fix"] and "the CUDA 13 build" in f["fix"]
    assert d["exit_status"] == 1 and "PROBLEMS FOUND" in text


def test_census_cuda11_runtime_loaded(stand_ins):
    d, _, _ = census_child(stand_ins, ["cu11", "torch13"])
    codes = sorted(f["code"] for f in d["findings"])
    assert codes == ["cuda11_runtime_loaded", "runtime_majors_mixed"], d["findings"]
    (f,) = [f for f in d["findings"] if f["code"] == "cuda11_runtime_loaded"]
    assert f["severity"] == "warning" and stand_ins["cu11"] in f["explanation"]
    assert "nvidia-cuda-runtime-cu11 11.8.89" in f["explanation"]
    assert "CUDA_ERROR_INVALID_CONTEXT (201)" in f["explanation"]
    assert "ContextGuard" in f["fix"] and "nvidia-cuda-runtime-cu11" in f["fix"]
    assert "the CUDA 13 build" in f["fix"], "the driver's major"
    (m,) = [f for f in d["findings"] if f["code"] == "runtime_majors_mixed"]
    assert "CUDA 11" in m["title"] and "nvidia-cuda-runtime-cu11" in m["fix"]
    # Also found installed beside the others (other_runtimes): said to be loaded, not "not loaded".
    (o,) = d["other_runtimes"]
    assert o["library"] == stand_ins["cu11"] and o["note"].startswith("loaded in this process")


def test_census_cuda11_alone_is_not_a_mix(stand_ins):
    d, _, _ = census_child(stand_ins, ["cu11"])
    assert [f["code"] for f in d["findings"]] == ["cuda11_runtime_loaded"], d["findings"]


def test_census_marks_what_the_doctor_loaded(stand_ins):
    # A library mapped after the doctor started (its own runtime lookup, in a process with no
    # runtime) is the doctor's: listed as such, and no part of the program's mix of majors.
    out = child(
        f"""
    import ctypes, sys
    sys.path.append({stand_ins["site"]!r})
    from cyctx import _census as census
    from cyctx._doctor import rules
    from cyctx._doctor.gather import Seen
    ctypes.CDLL({stand_ins["torch13"]!r})
    before = census.mapped_paths()
    ctypes.CDLL({stand_ins["cu12"]!r})
    libs = census.census(before)
    r = diagnose()
    r.loaded = libs
    mix = [x for x in rules.RULES if x.code in ("runtime_majors_mixed", "cuda11_runtime_loaded")]
    print(json.dumps([[(l.path, l.by_doctor) for l in libs if l.kind == "runtime"],
                      [f.code for f in rules.findings_of(Seen(r, "described"), mix)], str(r)]))
    """
    )
    runtimes, codes, text = last_json(out)
    assert sorted(runtimes) == sorted([[stand_ins["torch13"], False], [stand_ins["cu12"], True]])
    assert codes == [], codes
    (line,) = [
        ln
        for ln in text.splitlines()
        if ln.endswith("libcudart.so.12  [nvidia-cuda-runtime-cu12 12.9.79; loaded by the doctor]")
    ]
    assert "loaded by the doctor" in line, text


# --- contexts and flags the census's findings recognise ------------------------------------------


def test_created_context_while_the_primary_is_active_is_not_primary(sim):
    # The primary is active (a guard retains it) and another context is current: only its
    # flags tell, without retaining anything (an active primary always reports MAP_HOST).
    r = diagnosed(
        "import cyctx\ng = cyctx.ContextGuard(0)\nctx = _drv.create_context()",
        "d.cuCtxDestroy(ctx)\ng.close()",
    )
    c = r["thread"]["current_context"]
    assert c["primary"] is False and "CU_CTX_MAP_HOST" in c["primary_why"] and c["flags"] == 0
    (f,) = r["findings"]
    assert f["code"] == "current_not_primary" and f["severity"] == "warning"
    assert "ContextGuard(0)" in f["fix"] and "primary context" in f["explanation"]


def test_primary_context_inside_a_guard_reports_map_host():
    g = ContextGuard(0)
    try:
        with g:
            c = diagnose(cudart=False).context
    finally:
        g.close()
    assert c.flags is not None and c.flags & 0x08 and c.primary is True


@pytest.mark.parametrize("activate", [True, False], ids=["active", "inactive"])
def test_primary_context_activated_with_other_flags(sim, activate):
    setup = "d.cuDevicePrimaryCtxSetFlags(0, int(d.CUctx_flags.CU_CTX_SCHED_BLOCKING_SYNC))\n"
    if activate:  # diagnosed inside the guard
        setup += "import cyctx\ng = cyctx.ContextGuard(0)\ng.__enter__()"
    r = diagnosed(setup, "g.__exit__(None, None, None)\ng.close()" if activate else "")
    if not activate:  # flags waiting for the next activation: nothing runs with them yet
        assert [f["code"] for f in r["findings"]] == ["no_current_context"], r["findings"]
        return
    (f,) = r["findings"]
    assert f["code"] == "primary_flags" and f["severity"] == "info" and r["exit_status"] == 0
    assert "Device 0" in f["title"] and "SCHED_BLOCKING_SYNC" in f["title"]
    assert "cudaSetDeviceFlags" in f["explanation"] and "SCHED_AUTO" in f["explanation"]


# --- the census on the real driver (H200) --------------------------------------------------------


@pytest.mark.gpu
def test_an_active_primary_reports_map_host_and_a_created_context_does_not():
    # The read-only tell of a non-primary context, on the real driver: inside a guard the
    # primary reports CU_CTX_MAP_HOST; a cuCtxCreate(0) context beside it does not.
    out = child("""
    import cyctx
    g = cyctx.ContextGuard(0)
    with g:
        e, primary_flags = d.cuCtxGetFlags()
    ctx = _drv.create_context(0)
    e2, created_flags = d.cuCtxGetFlags()
    r = diagnose(cudart=False).to_dict()
    d.cuCtxDestroy(ctx)
    g.close()
    print(json.dumps([int(e), int(primary_flags), int(e2), int(created_flags), r]))
    """)
    e, primary_flags, e2, created_flags, r = last_json(out)
    assert e == e2 == 0 and primary_flags & 0x08 and not created_flags & 0x08
    c = r["thread"]["current_context"]
    assert c["primary"] is False and "CU_CTX_MAP_HOST" in c["primary_why"], c
    assert [f["code"] for f in r["findings"]] == ["current_not_primary"], r["findings"]


@pytest.mark.cudart
def test_census_with_torch_cupy_and_cuda_bindings_runtime():
    import importlib.util

    missing = [m for m in ("torch", "cupy") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")
    out = child(
        """
    import torch, cupy
    from cuda.bindings import runtime
    torch.zeros(1, device="cuda"); cupy.zeros(1)          # both runtimes initialised
    static = runtime.cudaRuntimeGetVersion()[1]
    cupy_rt = cupy.cuda.runtime.runtimeGetVersion()
    r = diagnose()
    print(json.dumps([r.to_dict(), str(r), static, cupy_rt, torch.version.cuda]))
    """,
        timeout=300,
    )
    d, text, static, cupy_rt, torch_cuda = last_json(out)
    runtimes = loaded_of(d, "runtime")
    (drv,) = loaded_of(d, "driver")
    assert drv["version"] == d["driver"]["version"]
    # cuda.bindings' static runtime, and CuPy's beside it.
    (st,) = [lib for lib in runtimes if lib["static"] and "cuda.bindings.runtime" in lib["name"]]
    assert st["version"] == static and st["distribution"].startswith("cuda-bindings ")
    shared = [lib for lib in runtimes if not lib["static"]]
    assert shared and all(lib["version"] and lib["distribution"] for lib in shared), shared
    assert cupy_rt in [lib["version"] for lib in runtimes], (cupy_rt, runtimes)
    assert int(torch_cuda.split(".")[0]) in {lib["version"] // 1000 for lib in shared}
    codes = [f["code"] for f in d["findings"]]
    # torch leaves its primary context current: never called a non-primary one.
    assert d["thread"]["current_context"]["primary"] is not False
    assert "current_not_primary" not in codes and "runtime_newer_than_driver" not in codes
    majors = {lib["version"] // 1000 for lib in runtimes}
    assert ("runtime_majors_mixed" in codes) == (len(majors) > 1), (majors, codes)
    assert "\nLoaded" in text


def _cuda11_runtime():
    found = _doctor.cu11_candidates() or [p for p in [os.environ.get("CYCTX_CUDART11")] if p]
    if not found:
        pytest.skip("no CUDA 11 runtime (nvidia-cuda-runtime-cu11 wheel, or CYCTX_CUDART11=path)")
    return found[0]


@pytest.mark.cudart
def test_census_cuda11_runtime_beside_cuda13s():
    path = _cuda11_runtime()
    # Where the wheel was installed (its dist-info beside nvidia/): on sys.path last, so that
    # its `nvidia` folder does not hide the CUDA 13 wheels'.
    root = path.split(os.sep + "nvidia" + os.sep)[0]
    out = child(f"""
    import ctypes, sys
    sys.path.append({root!r})
    from cyctx._doctor import load_cudart
    rt13, why = load_cudart()
    assert rt13 is not None, why
    cu11 = ctypes.CDLL({path!r})
    r = diagnose(cudart=False)
    print(json.dumps([r.to_dict(), str(r), rt13.path]))
    """)
    d, text, path13 = last_json(out)
    (lib11,) = [lib for lib in loaded_of(d, "runtime") if lib["path"].endswith("libcudart.so.11.0")]
    assert lib11["version"] // 1000 == 11 and not lib11["by_doctor"]
    assert os.path.realpath(lib11["path"]) == os.path.realpath(path)
    assert any(os.path.realpath(lib["path"]) == os.path.realpath(path13) for lib in d["loaded"])
    codes = [f["code"] for f in d["findings"]]
    assert "cuda11_runtime_loaded" in codes and "runtime_majors_mixed" in codes, codes
    (f,) = [f for f in d["findings"] if f["code"] == "cuda11_runtime_loaded"]
    assert lib11["path"] in f["explanation"]
    if lib11["distribution"]:
        assert lib11["distribution"].startswith("nvidia-cuda-runtime-cu11 ")
