"""The installed distribution: one version, the supported cuda-bindings range written once,
the console script, the license; and what the wheel holds."""

import importlib.metadata as md
import os
import re
import subprocess
import sys
import sysconfig

import cyctx
from cyctx import _compat

PKG = os.path.dirname(cyctx.__file__)


def test_one_version():
    assert cyctx.__version__ == md.version("cyctx")
    from cyctx._version import __version__

    assert __version__ == cyctx.__version__


def test_dependency_range_is_the_import_checks_range():
    reqs = [
        r for r in md.requires("cyctx") if r.startswith("cuda-bindings") and "extra ==" not in r
    ]
    assert len(reqs) == 1, reqs
    spec = sorted(re.findall(r"([<>=!]+)\s*([\d.]+)", reqs[0]))
    want = sorted(re.findall(r"([<>=!]+)\s*([\d.]+)", _compat.supported_range()))
    assert spec == want, (reqs[0], _compat.supported_range())


def test_license_metadata():
    meta = md.metadata("cyctx")
    assert meta["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in (meta.get_all("License-File") or [])


def test_python_versions_are_declared_once_and_consistently():
    # The classifiers are the one list (the docs and the release scripts read it): an unbroken
    # run of minors from requires-python's, the running interpreter among them.
    meta = md.metadata("cyctx")
    declared = sorted(
        int(c.rsplit(".", 1)[1])
        for c in meta.get_all("Classifier")
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert declared and declared == list(range(declared[0], declared[-1] + 1)), declared
    assert meta["Requires-Python"] == f">=3.{declared[0]}"
    assert sys.version_info[0] == 3 and sys.version_info[1] in declared


def test_metadata_names_no_url_that_does_not_exist():
    # No public repository or documentation site exists yet: each Project-URL is a file of the
    # source distribution (a path from its root), never an address that may not exist.
    urls = dict(u.split(", ", 1) for u in md.metadata("cyctx").get_all("Project-URL") or [])
    assert set(urls) == {"Documentation", "Changelog", "Source"}, urls
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for label, target in urls.items():
        assert "://" not in target, (label, target)
        if os.path.isfile(os.path.join(root, "pyproject.toml")):  # a checkout or the sdist
            assert os.path.exists(os.path.join(root, target)), (label, target)


def test_build_info_names_no_path_of_the_build_machine():
    # pip builds in a temporary directory: a path recorded there is meaningless (and leaks
    # the build machine) in an installed wheel.
    from cyctx import BUILD_INFO

    for key, value in BUILD_INFO.items():
        if isinstance(value, str):
            assert "/" not in value and "\\" not in value, (key, value)


def _script():
    path = os.path.join(sysconfig.get_path("scripts"), "cyctx")
    assert os.path.isfile(path), f"console script missing: {path}"
    return path


def test_console_script_version():
    out = subprocess.run([_script(), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith(f"cyctx {cyctx.__version__} (") and "\n" not in line
    assert f"running with cuda-bindings {md.version('cuda-bindings')}" in line


def test_console_script_is_the_doctor():
    # `cyctx doctor` and `python -m cyctx doctor` are one program: same report, same status.
    a = subprocess.run(
        [_script(), "doctor", "--simulate", "--json"], capture_output=True, text=True, timeout=120
    )
    b = subprocess.run(
        [sys.executable, "-m", "cyctx", "doctor", "--simulate", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert a.returncode == b.returncode == 0, (a.stderr, b.stderr)

    def strip(s):  # the pid and the thread's native id differ between two processes
        return re.sub(r'"(pid|native_id|process)": \d+', '"pid": 0', s)

    assert strip(a.stdout) == strip(b.stdout)


def test_installed_files_are_sources_and_binaries_only():
    names = set(os.listdir(PKG))
    assert not [n for n in names if n.endswith((".cpp", ".c"))], "generated C++ shipped"
    assert {"__init__.pxd", "_guard.pxd", "_driver.pxd", "py.typed"} <= names
    assert os.path.isfile(os.path.join(PKG, "_sim", "libcuda.so.1"))
    assert os.path.isfile(os.path.join(PKG, "_sim", "libcupti.so.13"))  # its CUPTI, beside it


def test_every_top_level_package_under_src_is_built_and_in_the_sdist():
    # The plugin and cyctx.testing share top-level packages beside cyctx: each must be in the
    # wheel (setuptools' packages, its py.typed as package data) and in the sdist (MANIFEST.in).
    import tomllib

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
    src = os.path.join(root, "src")
    tops = sorted(n for n in os.listdir(src) if os.path.isfile(os.path.join(src, n, "__init__.py")))
    assert {"cyctx", "_cyctx_pytest", "_cyctx_libcuda"} <= set(tops), tops
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        tool = tomllib.load(f)["tool"]["setuptools"]
    with open(os.path.join(root, "MANIFEST.in"), encoding="utf-8") as f:
        manifest = f.read().splitlines()
    for name in tops:
        assert name in tool["packages"], name
        assert "py.typed" in tool["package-data"].get(name, []), name
        assert any(
            line.startswith(f"recursive-include src/{name} ") and "*.py" in line.split()
            for line in manifest
        ), name
