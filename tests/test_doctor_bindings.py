"""`cyctx doctor` and `cyctx --version` where cuda-bindings is missing, too old or of an
untested major: the doctor is what a user runs because something is wrong, so each says what
and the pip command that fixes it, with the exit status of the doctor's table (1: a problem
found; 3 for --demo: it cannot run here), and no traceback. The children find cuda-bindings as
the import system does: a site without it (`python -S`), or a fake package shadowing it."""

import json
import os
import subprocess
import sys

import pytest
from helpers.bindings_env import env_of, fake_bindings, site_without_cuda_bindings

import cyctx

SCRIPT = os.path.join(os.path.dirname(sys.executable), "cyctx")

# What each environment is, and the fix the user is told (written out: what a user types).
CASES = {
    "missing": (
        None,
        "pip install 'cuda-bindings>=13,<14' (or 'cuda-bindings>=12.9,<13' for CUDA 12)",
    ),
    "11.8.0": ("11.8.0", "pip install 'cuda-bindings>=12.9,<13'"),
    "12.8.0": ("12.8.0", "pip install 'cuda-bindings>=12.9,<13'"),
    "14.1.0": ("14.1.0", "pip install --upgrade cyctx, or pip install 'cuda-bindings>=13,<14'"),
}


@pytest.fixture(params=sorted(CASES))
def bad_bindings(request, tmp_path):
    name = request.param
    installed, fix = CASES[name]
    if installed is None:
        path, flags = site_without_cuda_bindings(tmp_path), ["-S"]
    else:
        path, flags = fake_bindings(tmp_path, installed), []
    return name, installed, fix, env_of(path), flags


@pytest.fixture(params=["script", "-m"])
def launcher(request):
    if request.param == "script":
        if not os.path.isfile(SCRIPT):
            pytest.skip(f"no console script at {SCRIPT}")
        return [SCRIPT]
    return ["-m", "cyctx"]


def _run(bad, launcher, *args):
    _, _, _, env, flags = bad
    return subprocess.run(
        [sys.executable, *flags, *launcher, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(SCRIPT),
    )


def _no_traceback(proc):
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_the_environment_is_what_it_says(bad_bindings):
    name, installed, fix, env, flags = bad_bindings
    proc = subprocess.run(
        [sys.executable, *flags, "-c", "import cyctx"], env=env, capture_output=True, text=True
    )
    if name == "14.1.0":  # a newer major imports, with a warning
        assert proc.returncode == 0 and "UntestedBindingsWarning" in proc.stderr, proc.stderr
    else:  # outside the command line, `import cyctx` still stops with the fix
        assert proc.returncode != 0 and "IncompatibleBindingsError" in proc.stderr, proc.stderr
        assert fix in proc.stderr, proc.stderr


def test_doctor_reports_unusable_bindings_as_a_finding(bad_bindings, launcher):
    name, installed, fix, _, _ = bad_bindings
    proc = _run(bad_bindings, launcher, "doctor")
    _no_traceback(proc)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    title = (
        "cuda-bindings is not installed"
        if installed is None
        else f"cuda-bindings {installed} cannot be used"
    )
    assert f"ERROR  {title}" in proc.stdout, proc.stdout
    assert "Fix: " + fix in " ".join(proc.stdout.split()), proc.stdout
    assert "not queried: cuda-bindings is not usable" in proc.stdout, proc.stdout
    assert "Result: PROBLEMS FOUND: 1 error (exit status 1)" in proc.stdout, proc.stdout


def test_doctor_json_reports_unusable_bindings(bad_bindings, launcher):
    name, installed, fix, _, _ = bad_bindings
    proc = _run(bad_bindings, launcher, "doctor", "--json")
    _no_traceback(proc)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["schema"] == "cyctx.diagnosis/2" and report["exit_status"] == 1
    assert report["ok"] is False and report["versions"]["cuda-bindings"] == installed
    assert [(f["code"], f["severity"], f["fix"]) for f in report["findings"]] == [
        ("bindings_unusable", "error", fix)
    ], report["findings"]


def test_doctor_demo_cannot_run_without_usable_bindings(bad_bindings, launcher):
    proc = _run(bad_bindings, launcher, "doctor", "--demo", "--simulate")
    _no_traceback(proc)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "The demo needs a usable cuda-bindings too" in proc.stdout, proc.stdout


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_says_why_the_bindings_are_not_usable(bad_bindings, launcher, flag):
    name, installed, fix, _, _ = bad_bindings
    proc = _run(bad_bindings, launcher, flag)
    _no_traceback(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second = proc.stdout.strip().splitlines()
    assert first.startswith(f"cyctx {cyctx.__version__} (compiled with cuda-bindings "), first
    assert f"running with cuda-bindings {installed}," in first, first
    assert second.startswith("cuda-bindings is not usable: ") and second.endswith(fix), second


def test_only_cyctx_own_command_line_defers_the_import_error(tmp_path):
    # `python -m othermodule` importing cyctx is not cyctx's command line: the import stops.
    # A package whose __init__ imports cyctx is imported while `-m` locates its module, the
    # moment `python -m cyctx` is told apart by (sys.argv[0] is "-m" then).
    root = fake_bindings(tmp_path, "11.8.0")
    (root / "uses_cyctx.py").write_text("import cyctx\n")
    (root / "pkg_using_cyctx").mkdir()
    (root / "pkg_using_cyctx" / "__init__.py").write_text("import cyctx\n")
    (root / "pkg_using_cyctx" / "mod.py").write_text("")
    for args in (
        ["-m", "uses_cyctx"],
        ["-m", "pkg_using_cyctx.mod"],
        ["-mpkg_using_cyctx.mod"],
        ["-c", "import cyctx", "-m", "cyctx"],
    ):
        proc = subprocess.run(
            [sys.executable, *args], env=env_of(root), capture_output=True, text=True, cwd=root
        )
        assert proc.returncode != 0, (args, proc.stdout, proc.stderr)
        assert "IncompatibleBindingsError: cuda-bindings 11.8.0 is installed" in proc.stderr, (
            args,
            proc.stderr,
        )
