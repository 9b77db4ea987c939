"""`cyctx trace -m MODULE ARGS` runs the module as `python -m MODULE ARGS` does (it was a usage
error): the same sys.argv, sys.path[0], __file__, __name__, __spec__ and __package__, relative
imports inside its package, a package's __main__, the same status and account of a module
that is missing, cannot be run or raises, and the report and --json as for a script."""

import json
import sys
import textwrap

import pytest
from helpers.children import run_as_a_user

MOD = """
import json, sys
from cyctx.testing import use_simulated_driver
use_simulated_driver(2)
import cyctx
from . import helper
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "file": __file__, "name": __name__,
                  "spec": __spec__.name, "package": __package__, "helper": helper.VALUE}),
      flush=True)
with cyctx.ContextGuard(0):
    pass
if sys.argv[1:2] == ["raise"]:
    raise ValueError("the module failed")
"""


@pytest.fixture
def project(tmp_path):
    pkg = tmp_path / "apppkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("VALUE = 42\n")
    (pkg / "mod.py").write_text(textwrap.dedent(MOD))
    (pkg / "__main__.py").write_text("from apppkg import mod\n")
    (tmp_path / "nomain").mkdir()
    (tmp_path / "nomain" / "__init__.py").write_text("")
    return tmp_path


def _run(cmd, cwd):
    return run_as_a_user(cmd, cwd, pythonpath=False)  # the module is found from the cwd


def _trace(cwd, *args):
    return _run([sys.executable, "-m", "cyctx", "trace", "--simulate", *args], cwd)


@pytest.mark.parametrize(
    "module, args",
    [("apppkg.mod", ["a", "--", "-x"]), ("apppkg", ["b"])],
    ids=["module", "package"],
)
def test_a_module_runs_as_python_dash_m_runs_it(project, module, args):
    ref = _run([sys.executable, "-m", module, *args], project)
    got = _trace(project, "--json", "t.json", "-m", module, *args)
    assert ref.returncode == got.returncode == 0, got.stderr[-3000:]
    assert json.loads(got.stdout) == json.loads(ref.stdout)
    assert "cyctx trace: 4 events on 1 thread" in got.stderr
    assert len(json.loads((project / "t.json").read_text())["events"]) == 4


def test_a_module_that_raises_ends_as_under_python_dash_m(project):
    ref = _run([sys.executable, "-m", "apppkg.mod", "raise"], project)
    got = _trace(project, "-m", "apppkg.mod", "raise")
    assert ref.returncode == got.returncode == 1, got.stderr[-3000:]
    account = ref.stderr[ref.stderr.index("Traceback") :]
    assert got.stderr.startswith(account), (account, got.stderr[:3000])
    assert "cyctx trace: 4 events" in got.stderr


@pytest.mark.parametrize("module", ["nomodule", "nomain", "apppkg.helper.sub"])
def test_a_module_that_cannot_run_says_what_python_dash_m_says(project, module):
    ref = _run([sys.executable, "-m", module], project)
    got = _trace(project, "-m", module)
    assert ref.returncode == got.returncode == 1, got.stderr
    assert got.stderr.startswith(ref.stderr), (ref.stderr, got.stderr)


def test_dash_m_without_a_module_is_a_usage_error(project):
    got = _trace(project, "-m")
    assert got.returncode == 2 and "usage:" in got.stderr and "-m" in got.stderr, got.stderr
