"""`cyctx trace SCRIPT ARGS` against `python SCRIPT ARGS`, as users run it: the script gets the
same arguments, ends with the same status and traceback however it ends (an exception,
sys.exit, KeyboardInterrupt, os._exit), and the report and --json are written in every case; --json is
checked before the script runs (`-` is refused), relative to where cyctx trace ran; --simulate
N and the script's own choice of the simulated driver; `python -m cyctx trace` and the `cyctx`
console script alike. Each script picks the simulated driver itself, so that `python SCRIPT`
runs it too (the real driver's trace is tests/trace/test_trace_gpu.py's)."""

import json
import os
import shutil
import sys
import textwrap

import pytest
from helpers.children import run_as_a_user
from helpers.lines import line_of

CONSOLE = shutil.which("cyctx", path=os.path.dirname(sys.executable))
INVOCATIONS = {
    "python -m cyctx": [sys.executable, "-m", "cyctx"],
    "cyctx": [CONSOLE] if CONSOLE else None,
}

# Picks the simulated driver itself (4 devices), prints what it was given, makes a context
# change, then ends as its first argument says.
APP = """
import json, os, sys
from cyctx.testing import use_simulated_driver
sim = use_simulated_driver(DEVICES)
import cyctx
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "file": __file__, "name": __name__,
                  "devices": sim.device_count}), flush=True)
with cyctx.ContextGuard(0):  # guard-line
    pass
end = sys.argv[1] if len(sys.argv) > 1 else "fine"
if end == "raise":
    def inner():
        raise ValueError("the script failed")
    inner()
elif end == "exit":
    sys.exit(int(sys.argv[2]))
elif end == "exit-text":
    sys.exit("stopped: out of things to do")
elif end == "exit-none":
    sys.exit()
elif end == "interrupt":
    raise KeyboardInterrupt
elif end == "os-exit":
    os._exit(4)
elif end == "chdir":
    os.chdir(sys.argv[2])
"""
GUARD_LINE = line_of("guard-line", textwrap.dedent(APP))


def _app(tmp_path, devices=4):
    d = tmp_path / "scripts"
    d.mkdir(exist_ok=True)
    path = d / "app.py"
    path.write_text(textwrap.dedent(APP).replace("DEVICES", str(devices)))
    return path


def _trace(invocation, *args, cwd):
    cmd = INVOCATIONS[invocation]
    if cmd is None:
        pytest.skip("the cyctx console script is not installed beside this Python")
    return run_as_a_user([*cmd, "trace", *args], cwd)


def _said(proc):
    return json.loads(proc.stdout.splitlines()[0])


def _traceback(stderr):
    # Python's account of how the script ended: from "Traceback" to the exception line.
    lines = stderr.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Traceback"))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    return lines[start : end + 1]


@pytest.mark.parametrize(
    "args",
    [
        ["fine", "--", "-1"],
        ["fine", "-x", "--json", "y.json", "--simulate", "3"],
        ["fine", "a b", "", "--", "--"],
        ["fine", "-"],
    ],
    ids=["dashdash", "options-of-the-script", "spaces-and-empty", "dash"],
)
@pytest.mark.parametrize("invocation", list(INVOCATIONS))
def test_the_script_gets_its_arguments_as_python_gives_them(tmp_path, invocation, args):
    app = _app(tmp_path)
    ref = run_as_a_user([sys.executable, str(app), *args], tmp_path)
    got = _trace(invocation, "--simulate", str(app), *args, cwd=tmp_path)
    assert ref.returncode == got.returncode == 0, got.stderr[-3000:]
    assert _said(got) == _said(ref)
    assert "cyctx trace: 4 events on 1 thread" in got.stderr


ENDINGS = {
    "raise": (["raise"], 1),
    "sys.exit(3)": (["exit", "3"], 3),
    "sys.exit(256)": (["exit", "256"], 0),
    "sys.exit(text)": (["exit-text"], 1),
    "sys.exit()": (["exit-none"], 0),
    "KeyboardInterrupt": (["interrupt"], -2),  # killed by SIGINT, as Python does (shell: 130)
    "os._exit(4)": (["os-exit"], 4),  # no atexit handler runs: the report is written before
}


@pytest.mark.parametrize("ending", list(ENDINGS))
@pytest.mark.parametrize("invocation", list(INVOCATIONS))
def test_however_the_script_ends_its_status_and_account_and_the_report(
    tmp_path, invocation, ending
):
    args, status = ENDINGS[ending]
    app = _app(tmp_path)
    ref = run_as_a_user([sys.executable, str(app), *args], tmp_path)
    got = _trace(invocation, "--simulate", "--json", "t.json", str(app), *args, cwd=tmp_path)
    assert ref.returncode == got.returncode == status, (ref.stderr, got.stderr[-3000:])
    if "Traceback" in ref.stderr:
        assert _traceback(got.stderr) == _traceback(ref.stderr)
        assert "_trace_cli" not in got.stderr and "runpy" not in got.stderr
    else:
        assert got.stderr.startswith(ref.stderr), (ref.stderr, got.stderr)  # sys.exit(text)
    if ref.stderr:  # the script's ending first, then the report
        ending_line = ref.stderr.splitlines()[-1]
        assert got.stderr.index(ending_line) < got.stderr.index("cyctx trace: 4 events")
    # The collected guard hands its retain to the process: no release, no destroy.
    assert f"by cyctx guard at {app}:{GUARD_LINE} (<module>)" in got.stderr
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["active"] is True and len(data["events"]) == 4
    assert data["schema"] == "cyctx.trace/1"
    changed = [e["call"] for e in data["events"] if e["changed"]]
    assert changed == ["cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2"]


def test_json_is_relative_to_where_cyctx_trace_ran_though_the_script_moves(tmp_path):
    app = _app(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    got = _trace(
        "python -m cyctx",
        "--simulate",
        "--json",
        "t.json",
        str(app),
        "chdir",
        str(elsewhere),
        cwd=tmp_path,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    assert json.loads((tmp_path / "t.json").read_text())["active"] is True
    assert not (elsewhere / "t.json").exists()


@pytest.mark.parametrize("bad", ["missing/t.json", "a-directory", "a-file/t.json", "-"])
def test_a_json_path_that_cannot_be_written_is_a_usage_error_before_the_script(tmp_path, bad):
    app = _app(tmp_path)
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "a-file").write_text("")
    got = _trace("python -m cyctx", "--simulate", "--json", bad, str(app), cwd=tmp_path)
    assert got.returncode == 2, got.stderr
    assert got.stdout == "", "the script did not start"
    assert "usage:" in got.stderr
    if bad == "-":
        # The script's own output goes to stdout, which the JSON would be mixed into, and a
        # file named '-' is what nobody who types '-' means (it was written, silently).
        assert "--json -: " in got.stderr and "stdout" in got.stderr
        assert not (tmp_path / "-").exists()
    else:
        assert f"--json {bad}: cannot write {tmp_path / bad}" in got.stderr, got.stderr


@pytest.mark.parametrize(
    "options, script_asks, devices, status",
    [
        (["--simulate"], 4, 4, 0),  # the script's own count
        (["--simulate", "4"], 4, 4, 0),
        (["--simulate"], 1, 1, 0),
        (["--simulate", "3"], 4, None, 1),  # --simulate N wins: the script's call is refused
    ],
    ids=["script-4", "both-4", "script-1", "option-3-script-4"],
)
def test_simulate_and_the_scripts_own_choice(tmp_path, options, script_asks, devices, status):
    app = _app(tmp_path, devices=script_asks)
    got = _trace("python -m cyctx", *options, "--json", "t.json", str(app), cwd=tmp_path)
    assert got.returncode == status, got.stderr[-3000:]
    if devices is None:
        assert "RuntimeError: the simulated driver is in use with 3 device(s)" in got.stderr
    else:
        assert _said(got)["devices"] == devices
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["driver"] == "simulated" and data["active"] is True


@pytest.mark.parametrize("value", ["0", "65", "x"])
def test_simulate_takes_1_to_64(tmp_path, value):
    app = _app(tmp_path)
    got = _trace("python -m cyctx", f"--simulate={value}", str(app), cwd=tmp_path)
    assert got.returncode == 2 and got.stdout == "" and "--simulate" in got.stderr, got.stderr


def test_without_a_driver_it_says_how_to_simulate_and_writes_the_refusal(tmp_path):
    from cyctx import testing

    if testing.real_driver_available():
        pytest.skip("this machine has an NVIDIA driver")
    script = tmp_path / "plain.py"
    script.write_text("print('ran')\n")
    got = _trace("python -m cyctx", "--json", "t.json", str(script), cwd=tmp_path)
    assert got.returncode == 0 and got.stdout == "ran\n", got.stderr
    (line,) = [ln for ln in got.stderr.splitlines() if ln.startswith("cyctx trace:")]
    assert "not tracing" in line and f"cyctx trace --simulate {script}" in line, line
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["active"] is False and data["reason"] and data["events"] == []


# Starts a spawn pool and a subprocess; each child says which driver it has and its devices.
CHILDREN = """
import json, multiprocessing, subprocess, sys
from concurrent.futures import ProcessPoolExecutor

ASK = '''
import json
from cuda.bindings import driver as d
from _cyctx_libcuda import simulated_libcuda
d.cuInit(0)
print(json.dumps([simulated_libcuda() is not None, d.cuDeviceGetCount()[1]]))
'''

def child():
    return json.loads(subprocess.run([sys.executable, "-c", ASK], capture_output=True,
                                     text=True, check=True).stdout)

if __name__ == "__main__":
    OWN
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        in_pool = pool.submit(child).result()
    print(json.dumps({"pool": in_pool, "subprocess": child()}))
"""


@pytest.mark.parametrize(
    "options, own, devices",
    [(["--simulate", "3"], "", 3), (["--simulate"], "", 2), (["--simulate"], 4, 4)],
    ids=["option-3", "default-2", "script-4"],
)
def test_the_scripts_child_processes_run_on_the_same_simulated_driver(
    tmp_path, options, own, devices
):
    # A spawn pool's worker and a subprocess (and the pool worker's own subprocess) have the
    # simulated driver with the same count, not whatever driver the machine has, or none.
    app = tmp_path / "children.py"
    ask = f"from cyctx.testing import use_simulated_driver; use_simulated_driver({own})"
    app.write_text(textwrap.dedent(CHILDREN).replace("OWN", ask if own else "pass"))
    got = _trace("python -m cyctx", *options, str(app), cwd=tmp_path)
    assert got.returncode == 0, got.stderr[-3000:]
    said = json.loads(got.stdout.splitlines()[-1])
    assert said == {"pool": [True, devices], "subprocess": [True, devices]}, said


def test_where_the_simulators_path_cannot_go_in_ld_preload_the_children_are_said_to_lack_it(
    tmp_path, monkeypatch
):
    # A copy of the simulated driver under a directory whose name holds a space (CYCTX_SIM_LIBRARY
    # names it): LD_PRELOAD cannot carry that path, so cyctx trace says the script's children
    # will not have the simulator, and the script itself still runs on it.
    from cyctx import testing

    where = tmp_path / "my sims"
    where.mkdir()
    shutil.copy(testing.sim_library_path(), where / "libcuda.so.1")
    app = tmp_path / "app.py"
    app.write_text("import os\nprint('PRELOAD', repr(os.environ.get('LD_PRELOAD')))\n")
    monkeypatch.setenv("CYCTX_SIM_LIBRARY", str(where / "libcuda.so.1"))
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    got = run_as_a_user(
        [sys.executable, "-m", "cyctx", "trace", "--quiet", "--simulate", "2", str(app)], tmp_path
    )
    assert got.returncode == 0, got.stderr[-3000:]
    assert "PRELOAD None" in got.stdout, got.stdout  # nothing was exported
    assert "will not have the simulated driver: its path (" in got.stderr, got.stderr
    assert "holds a space or ':', which separate LD_PRELOAD's items" in got.stderr, got.stderr
