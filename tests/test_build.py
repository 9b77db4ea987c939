"""The package as built and installed: versions recorded, header discovery, the import-time
bindings check, shipped files, the simulated driver's soname."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

import cyctx
from cyctx import _cuda_headers as hdrs
from cyctx._compat import IncompatibleBindingsError, check_bindings, installed_bindings_version

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PKG = os.path.dirname(cyctx.__file__)


def test_build_info_matches_installed_bindings():
    info = cyctx.BUILD_INFO
    assert info["cuda_bindings"] == installed_bindings_version()
    hmaj = info["cuda_header_version"] // 1000
    hmin = (info["cuda_header_version"] % 1000) // 10
    bmaj, bmin = info["cuda_bindings_major_minor"]
    assert hmaj == bmaj and hmin >= bmin, "built with a header older than the bindings"


@pytest.mark.parametrize(
    "built, installed, ok",
    [("13.5.0", "13.5.0", True), ("13.5.0", "13.6.1", True), ("13.3.1", "13.3.0", True),
     ("13.5.0", "13.4.4", False), ("13.5.0", "12.9.6", False), ("12.9.6", "13.0.0", False),
     ("13.5.0", None, False)],
)
def test_check_bindings(built, installed, ok):
    if ok:
        check_bindings(built, installed)
    else:
        with pytest.raises(IncompatibleBindingsError, match="pip install"):
            check_bindings(built, installed)


def test_import_with_other_major_bindings_is_a_clear_error(tmp_path):
    # A cuda-bindings of the other major shadowing the real one, as importlib.metadata sees it.
    other = "12.9.6" if cyctx.BUILD_INFO["cuda_bindings_major_minor"][0] == 13 else "13.5.0"
    dist = tmp_path / f"cuda_bindings-{other}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: cuda-bindings\nVersion: {other}\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", "import cyctx"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode != 0
    assert "IncompatibleBindingsError" in proc.stderr
    assert other in proc.stderr and cyctx.BUILD_INFO["cuda_bindings"] in proc.stderr
    assert "Segmentation" not in proc.stderr


def _fake_toolkit(root, version):
    """A toolkit dir with every header the installed cydriver.pxd includes."""
    inc = root / "include"
    inc.mkdir(parents=True)
    for h in hdrs.required_headers():
        (inc / h).write_text("/* fake */\n")
    (inc / "cuda.h").write_text(f"/* fake */\n#define CUDA_VERSION {version}\n")
    return root


def test_header_too_old_stops_with_the_fix(tmp_path, monkeypatch):
    bmaj, bmin, full = hdrs.bindings_version()
    old = bmaj * 1000 + max(bmin - 1, 0) * 10 if bmin > 0 else (bmaj - 1) * 1000 + 90
    monkeypatch.setenv("CUDA_HOME", str(_fake_toolkit(tmp_path / "old", old)))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    with pytest.raises(hdrs.HeaderError) as ei:
        hdrs.find_cuda_header()
    assert hdrs.runtime_wheel_requirement(bmaj, bmin) in str(ei.value)
    assert "$CUDA_HOME" in str(ei.value)


def test_header_other_major_stops(tmp_path, monkeypatch):
    bmaj, bmin, _ = hdrs.bindings_version()
    monkeypatch.setenv("CUDA_HOME", str(_fake_toolkit(tmp_path / "other", (bmaj + 1) * 1000)))
    with pytest.raises(hdrs.HeaderError, match="another major"):
        hdrs.find_cuda_header()


def test_header_matching_toolkit_is_taken(tmp_path, monkeypatch):
    bmaj, bmin, _ = hdrs.bindings_version()
    root = _fake_toolkit(tmp_path / "good", bmaj * 1000 + bmin * 10)
    monkeypatch.setenv("CUDA_HOME", str(root))
    h = hdrs.find_cuda_header()
    assert h.include_dir == str(root / "include") and h.found_via == "$CUDA_HOME"


def test_default_discovery_finds_the_runtime_wheel(monkeypatch):
    # Without CUDA_HOME/CUDA_PATH: the wheel headers on sys.path, then cuda-pathfinder. What
    # it finds must match the bindings; if this machine has none that does (a GPU image with
    # bindings 13.3 and a 13.0 runtime wheel), it must refuse and name the fix.
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    bmaj, bmin, _ = hdrs.bindings_version()
    try:
        h = hdrs.find_cuda_header()
    except hdrs.HeaderError as e:
        assert hdrs.runtime_wheel_requirement(bmaj, bmin) in str(e)
    else:
        assert os.path.isfile(os.path.join(h.include_dir, "cuda.h"))
        assert h.major_minor[0] == bmaj and h.major_minor[1] >= bmin
        assert h.found_via.startswith(("sys.path", "cuda-pathfinder"))


@pytest.mark.skipif(not os.path.isfile(os.path.join(REPO, "setup.py")), reason="needs the source tree")
def test_setup_py_refuses_a_mismatched_header(tmp_path):
    bmaj, bmin, _ = hdrs.bindings_version()
    env = dict(os.environ, CUDA_HOME=str(_fake_toolkit(tmp_path / "tk", (bmaj - 1) * 1000 + 80)))
    proc = subprocess.run([sys.executable, "setup.py", "--version"], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "cyctx build:" in proc.stderr and "pip install" in proc.stderr


def test_installed_package_ships_cimport_surface_and_stubs():
    for f in ("__init__.pxd", "_guard.pxd", "_errors.pxd", "__init__.pyi", "py.typed", "_tls.h"):
        assert os.path.isfile(os.path.join(PKG, f)), f


def test_simulated_driver_has_the_driver_soname():
    from cyctx.testing import sim_library_path

    path = sim_library_path()
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("readelf not available")
    assert "Library soname: [libcuda.so.1]" in out.stdout
    syms = subprocess.run(["readelf", "--dyn-syms", "-W", path], capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in syms.splitlines() if " FUNC " in line and " GLOBAL " in line and " UND " not in line}
    assert {"cuGetProcAddress_v2", "cuDriverGetVersion", "cyctxsim_inject_fault"} <= exported
    assert not any(s.startswith("sim_") for s in exported), "internals must stay hidden"


def test_simulated_driver_selected_in_a_fresh_process():
    code = textwrap.dedent("""
        from cyctx.testing import use_simulated_driver
        sim = use_simulated_driver(device_count=3)
        from cuda.bindings import driver as d
        d.cuInit(0)
        err, n = d.cuDeviceGetCount()
        print(int(err), n, sim.call_count("cuDeviceGetCount"))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "3", "1"]


def test_header_wheel_found_on_sys_path_first(tmp_path, monkeypatch):
    # pip's isolated build env is on sys.path but not in site.getsitepackages() (where
    # cuda-pathfinder looks): the wheel layout on sys.path must be found.
    bmaj, bmin, _ = hdrs.bindings_version()
    root = _fake_toolkit(tmp_path / "env", bmaj * 1000 + bmin * 10)
    layout = tmp_path / "site" / "nvidia" / ("cu13" if bmaj >= 13 else "cuda_runtime")
    layout.parent.mkdir(parents=True)
    os.rename(root / "include", tmp_path / "inc")
    layout.mkdir()
    os.rename(tmp_path / "inc", layout / "include")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    h = hdrs.find_cuda_header()
    assert h.include_dir == str(layout / "include") and h.found_via.startswith("sys.path")


def test_header_dir_lacking_a_header_cydriver_includes(tmp_path, monkeypatch):
    # cuda-bindings 13.3's cydriver.pxd also includes cudaProfiler.h, shipped by another wheel.
    bmaj, bmin, _ = hdrs.bindings_version()
    root = _fake_toolkit(tmp_path / "tk", bmaj * 1000 + bmin * 10)
    (root / "include" / "cudaProfiler.h").unlink(missing_ok=True)
    monkeypatch.setattr(hdrs, "required_headers", lambda: ["cuda.h", "cudaProfiler.h"])
    monkeypatch.setenv("CUDA_HOME", str(root))
    with pytest.raises(hdrs.HeaderError, match="cudaProfiler.h.*nvidia-cuda-profiler-api"):
        hdrs.find_cuda_header()
    (tmp_path / "tk" / "include" / "cudaProfiler.h").write_text("/* fake */\n")
    assert hdrs.find_cuda_header().found_via == "$CUDA_HOME"


def test_required_headers_come_from_the_installed_bindings():
    needed = hdrs.required_headers()
    assert "cuda.h" in needed and all(h.endswith(".h") for h in needed)
