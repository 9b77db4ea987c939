"""The documented lookup order of cuda.h (docs/install.md): an explicit CUDA_HOME, then
CUDA_PATH, which wins and must work, else the header wheels on sys.path, then cuda-pathfinder.
Each explicit variable set to each kind of unusable folder stops with an error naming the
variable, while a good header is on sys.path (so a silent fallback would be taken)."""

import os
import subprocess
import sys

import pytest

from cyctx import _cuda_headers as hdrs

VARS = ("CUDA_HOME", "CUDA_PATH")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _toolkit(root, version, headers=None):
    """A folder laid out as a toolkit: include/ with the headers cydriver.pxd includes."""
    inc = root / "include"
    inc.mkdir(parents=True)
    for h in hdrs.required_headers() if headers is None else headers:
        (inc / h).write_text("/* fake */\n")
    (inc / "cuda.h").write_text(f"/* fake */\n#define CUDA_VERSION {version}\n")
    return root


def _matching():
    bmaj, bmin, _ = hdrs.bindings_version()
    return bmaj * 1000 + bmin * 10


@pytest.fixture
def wheel_on_sys_path(tmp_path, monkeypatch):
    """A good header in the wheel layout on sys.path: what a silent fallback would take."""
    bmaj = hdrs.bindings_version()[0]
    root = _toolkit(tmp_path / "wheel", _matching())
    site = tmp_path / "site"
    layout = site / "nvidia" / ("cu13" if bmaj >= 13 else "cuda_runtime")
    layout.mkdir(parents=True)
    os.rename(root / "include", layout / "include")
    (layout / "include" / "cudaProfiler.h").write_text("/* fake */\n")  # every case's needs
    monkeypatch.syspath_prepend(str(site))
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    assert hdrs.find_cuda_header().include_dir == str(layout / "include")
    return layout / "include"


def _bad_folders(tmp_path):
    bmaj, bmin, _ = hdrs.bindings_version()
    no_include = tmp_path / "no_include"
    no_include.mkdir()
    empty_include = tmp_path / "empty_include"
    (empty_include / "include").mkdir(parents=True)
    cuda_h_is_a_folder = tmp_path / "dir_cuda_h"
    (cuda_h_is_a_folder / "include" / "cuda.h").mkdir(parents=True)
    no_define = _toolkit(tmp_path / "no_define", 0)
    (no_define / "include" / "cuda.h").write_text("/* not CUDA's */\n")
    older = bmaj * 1000 + (bmin - 1) * 10 if bmin > 0 else (bmaj - 1) * 1000 + 90
    return {
        "missing": (tmp_path / "does_not_exist", "no cuda.h"),
        "no include/": (no_include, "no cuda.h"),
        "include/ without cuda.h": (empty_include, "no cuda.h"),
        "cuda.h a folder": (cuda_h_is_a_folder, "no cuda.h"),
        "cuda.h without CUDA_VERSION": (no_define, "no CUDA_VERSION define"),
        "older header": (_toolkit(tmp_path / "older", older), "older than"),
        "other major": (_toolkit(tmp_path / "other", (bmaj + 1) * 1000), "another major"),
        "lacking a header cydriver includes": (
            _toolkit(tmp_path / "lacking", _matching(), headers=[]),
            "lacks",
        ),
    }


KINDS = [
    "missing",
    "no include/",
    "include/ without cuda.h",
    "cuda.h a folder",
    "cuda.h without CUDA_VERSION",
    "older header",
    "other major",
    "lacking a header cydriver includes",
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("var", VARS)
def test_explicit_variable_with_an_unusable_folder_is_an_error_naming_it(
    var, kind, tmp_path, monkeypatch, wheel_on_sys_path
):
    if kind == "lacking a header cydriver includes":
        monkeypatch.setattr(hdrs, "required_headers", lambda: ["cuda.h", "cudaProfiler.h"])
    folder, what = _bad_folders(tmp_path)[kind]
    monkeypatch.setenv(var, str(folder))
    with pytest.raises(hdrs.HeaderError) as ei:
        hdrs.find_cuda_header()
    msg = str(ei.value)
    assert f"${var}" in msg and what in msg, msg
    assert str(folder) in msg, msg
    assert f"{var}" in msg.split(what, 1)[1] or f"unset {var}" in msg, msg  # and how to fix
    bmaj, bmin, _ = hdrs.bindings_version()
    if kind == "older header":  # and the wheel whose headers match
        assert hdrs.runtime_wheel_requirement(bmaj, bmin) in msg, msg
    if kind == "lacking a header cydriver includes":  # and the wheel that ships it
        assert "cudaProfiler.h" in msg and "nvidia-cuda-profiler-api" in msg, msg


@pytest.mark.parametrize("var", VARS)
def test_explicit_variable_with_a_matching_toolkit_is_taken(
    var, tmp_path, monkeypatch, wheel_on_sys_path
):
    root = _toolkit(tmp_path / "tk", _matching())
    monkeypatch.setenv(var, str(root))
    h = hdrs.find_cuda_header()
    assert (h.include_dir, h.found_via) == (str(root / "include"), f"${var}")


def test_cuda_home_wins_over_cuda_path(tmp_path, monkeypatch, wheel_on_sys_path):
    good_home = _toolkit(tmp_path / "home", _matching())
    good_path = _toolkit(tmp_path / "path", _matching())
    monkeypatch.setenv("CUDA_HOME", str(good_home))
    monkeypatch.setenv("CUDA_PATH", str(good_path))
    assert hdrs.find_cuda_header().found_via == "$CUDA_HOME"
    # A bad CUDA_HOME is not skipped for a good CUDA_PATH: the first explicit choice stands.
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nothing"))
    with pytest.raises(hdrs.HeaderError, match=r"\$CUDA_HOME: no cuda.h"):
        hdrs.find_cuda_header()
    # A good CUDA_HOME with a bad CUDA_PATH: CUDA_PATH is never looked at.
    monkeypatch.setenv("CUDA_HOME", str(good_home))
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "nothing"))
    assert hdrs.find_cuda_header().found_via == "$CUDA_HOME"


@pytest.mark.parametrize("var", VARS)
def test_an_empty_variable_counts_as_unset(var, monkeypatch, wheel_on_sys_path):
    monkeypatch.setenv(var, "")
    h = hdrs.find_cuda_header()
    assert h.include_dir == str(wheel_on_sys_path) and h.found_via.startswith("sys.path")


def test_sys_path_wheel_comes_before_cuda_pathfinder(monkeypatch, wheel_on_sys_path):
    # cuda-pathfinder is asked only when nothing on sys.path has the header.
    import cuda.pathfinder

    def refuse(*a, **k):
        raise AssertionError("cuda-pathfinder asked although sys.path had the header")

    monkeypatch.setattr(cuda.pathfinder, "locate_nvidia_header_directory", refuse)
    assert hdrs.find_cuda_header().include_dir == str(wheel_on_sys_path)


@pytest.mark.skipif(
    not os.path.isfile(os.path.join(REPO, "setup.py")), reason="needs the source tree"
)
def test_setup_py_refuses_a_mismatched_header(tmp_path):
    bmaj, bmin, _ = hdrs.bindings_version()
    env = dict(os.environ, CUDA_HOME=str(_toolkit(tmp_path / "tk", (bmaj - 1) * 1000 + 80)))
    proc = subprocess.run(
        [sys.executable, "setup.py", "--version"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "cyctx build:" in proc.stderr and "pip install" in proc.stderr
