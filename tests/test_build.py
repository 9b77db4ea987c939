"""The package as built and installed: versions recorded, header discovery, the import-time
bindings check, shipped files, the simulated driver's soname."""

import glob
import os
import platform
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
from helpers.bindings_env import env_of, fake_bindings
from helpers.children import run_child

import cyctx
from cyctx import _cuda_headers as hdrs
from cyctx._compat import IncompatibleBindingsError, check_bindings, installed_bindings_version

PKG = os.path.dirname(cyctx.__file__)


@pytest.fixture
def readelf():
    import shutil

    path = shutil.which("readelf")
    if path is None:
        pytest.skip("readelf (binutils) is not installed")
    return path


def test_build_info_records_a_matching_header():
    info = cyctx.BUILD_INFO
    hmaj = info["cuda_header_version"] // 1000
    hmin = (info["cuda_header_version"] % 1000) // 10
    bmaj, bmin = info["cuda_bindings_major_minor"]
    assert hmaj == bmaj and hmin >= bmin, "built with a header older than the bindings"


@pytest.mark.parametrize(
    "installed, fix",
    [
        ("13.5.0", None),
        ("13.0.0", None),
        ("13.3.1", None),
        ("12.9.0", None),
        ("12.9.10", None),
        ("12.8.0", "pip install 'cuda-bindings>=12.9,<13'"),
        ("11.8.7", "pip install 'cuda-bindings>=12.9,<13'"),
        (None, "pip install 'cuda-bindings>=13,<14'"),
    ],
)
def test_check_bindings(installed, fix):
    if fix is None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a supported version warns nothing either
            check_bindings(installed)
    else:
        with pytest.raises(IncompatibleBindingsError) as ei:
            check_bindings(installed)
        assert fix in str(ei.value)
        if installed and installed.startswith("12."):
            assert "cuda-bindings>=13" not in str(ei.value), "a CUDA 12 user is never sent to 13"


@pytest.mark.parametrize("installed", ["14.0.0", "15.2.1"])
def test_check_bindings_of_a_newer_major_warns_and_does_not_refuse(installed):
    with pytest.warns(cyctx.UntestedBindingsWarning) as w:
        check_bindings(installed)
    msg = str(w[0].message)
    assert len(w) == 1 and installed in msg and ">=12.9,<14" in msg
    assert "pip install --upgrade cyctx" in msg


def _import_with_fake_bindings(tmp_path, version, code="import cyctx", how="package"):
    # A cuda-bindings shadowing the real one (helpers/bindings_env.py), whose _version.py says
    # `version` (what cyctx reads; how="dist-info": a cuda-bindings without that file, its
    # dist-info read instead). Importing cyctx imports neither.
    root = fake_bindings(tmp_path, version)
    if how != "package":
        os.remove(root / "cuda" / "bindings" / "_version.py")
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", code],
        env=env_of(root),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )


def test_import_reads_the_version_without_importlib_metadata():
    code = (
        "import sys, cyctx, cyctx._compat as c; "
        "print('importlib.metadata' in sys.modules, 'cuda.bindings' in sys.modules, "
        "c.installed_bindings_version())"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    from importlib.metadata import version

    assert proc.stdout.split() == ["False", "False", version("cuda-bindings")]


def test_import_with_a_newer_major_warns_once_and_works(tmp_path):
    proc = _import_with_fake_bindings(
        tmp_path,
        "14.1.0",
        "import cyctx; print(cyctx.__version__, cyctx.get_include())",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("UntestedBindingsWarning") == 1, proc.stderr
    assert "cuda-bindings 14.1.0 is newer than this cyctx was tested with" in proc.stderr
    assert proc.stdout.split()[0] == cyctx.__version__


def test_what_needs_a_newer_major_says_it_may_be_why(tmp_path):
    # The doctor (cyctx.diagnose(), cyctx.doctor) imports cuda.bindings.driver and
    # get_include_dirs() needs a matching cuda.h:
    # with the (fake) 14.x neither works, and each error names the untested version.
    # (The command line reports it as a finding instead: tests/test_doctor_bindings.py.)
    proc = _import_with_fake_bindings(
        tmp_path,
        "14.1.0",
        "import importlib, warnings, cyctx\n"
        "for f in (lambda: cyctx.diagnose(cudart=False),\n"
        "          lambda: importlib.import_module('cyctx.doctor'), cyctx.get_include_dirs):\n"
        "    try:\n"
        "        f()\n"
        "    except Exception as e:\n"
        "        print(type(e).__name__, '|', e)\n",
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    kinds = [ln.split(" |")[0] for ln in lines]
    assert kinds == ["ImportError", "ImportError", "HeaderError"], proc.stdout
    for ln in lines:
        assert "cuda-bindings 14.1.0 is newer than this cyctx was tested with" in ln
        assert "pip install 'cuda-bindings>=13,<14'" in ln


@pytest.mark.parametrize("how", ["package", "dist-info"])  # dist-info: no _version.py to read
def test_import_with_unsupported_bindings_is_a_clear_error(tmp_path, how):
    proc = _import_with_fake_bindings(tmp_path, "12.8.0", how=how)
    assert proc.returncode != 0
    assert "IncompatibleBindingsError" in proc.stderr
    assert "12.8.0" in proc.stderr and "pip install 'cuda-bindings>=12.9,<13'" in proc.stderr
    assert "Segmentation" not in proc.stderr


def test_import_with_the_other_major_works(tmp_path):
    # The compiled modules do not bind to cuda-bindings, so what the metadata says of the other
    # supported major changes nothing (CI also runs the whole suite with each major installed).
    other = "12.9.6" if installed_bindings_version().startswith("13.") else "13.0.0"
    proc = _import_with_fake_bindings(tmp_path, other, "import cyctx; print(cyctx.__version__)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == cyctx.__version__


def test_compiled_modules_do_not_import_cuda_bindings():
    # The driver is resolved by cyctx (_cpp/driver.h): a guard's whole life runs without any
    # cuda.bindings module, so no C signature of any cuda-bindings version is imported.
    code = textwrap.dedent("""
        import sys
        from cyctx.testing import use_simulated_driver
        sim = use_simulated_driver(device_count=2)
        for name in ("cuda.bindings.cydriver", "cuda.bindings._bindings.cydriver",
                     "cuda.bindings.driver", "cuda.bindings._internal.driver"):
            sys.modules[name] = None   # any import of them fails
        import cyctx
        g = cyctx.ContextGuard(1)
        with g:
            assert cyctx.current_handle() == g.handle
        g.close()
        print(sim.call_count("cuCtxGetId") > 0, sim.retain_count(1),
              sorted(m for m in sys.modules if m.startswith("cuda.bindings") and sys.modules[m] is not None))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().split(None, 2) == ["True", "0", "[]"]


def test_compiled_modules_share_no_state_through_exported_symbols(readelf):
    # The headers' namespace-scope state (driver table, fork flags, live-guard mutex) must be
    # per module: exported, GCC makes it STB_GNU_UNIQUE and the loader merges it across
    # modules, and two modules' fork handlers then locked one mutex twice (a hang at fork).
    pkg = os.path.dirname(cyctx.__file__)
    mods = [m for m in glob.glob(os.path.join(pkg, "_*.so")) if "_sim" not in m]
    assert mods, pkg
    for mod in mods:
        out = subprocess.run(
            [readelf, "-sW", "--dyn-syms", mod], capture_output=True, text=True, check=True
        ).stdout
        rows = [
            f for f in (line.split() for line in out.splitlines()) if len(f) >= 8 and f[6] != "UND"
        ]
        # Binding "<OS specific>: 10" is STB_GNU_UNIQUE (readelf splits it into two fields).
        unique = [f[-1] for f in rows if f[4] == "<OS"]
        ours = [f[-1] for f in rows if "5cyctx" in f[-1] or f[-1].startswith("__pyx")]
        assert unique == [] and ours == [], (mod, unique, ours)
        assert any(f[-1].startswith("PyInit_") for f in rows), mod


@pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or platform.machine() not in ("x86_64", "aarch64")
    or os.environ.get("CYCTX_COMPAT_STUBS") == "0",
    reason="builds link against glibc's old symbol versions on x86-64 and aarch64 Linux only",
)
def test_compiled_modules_need_no_glibc_newer_than_2_28(readelf):
    # The manylinux_2_28 wheels: every shared object (the extensions, the tracer, the simulated
    # driver) loads on glibc 2.28, whichever glibc built it. A build on glibc 2.34+ binds dlopen
    # and pthread_key_create to GLIBC_2.34 unless it links against the base version's stubs.
    objs = [
        p for p in glob.glob(os.path.join(PKG, "**", "*.so*"), recursive=True) if os.path.isfile(p)
    ]
    assert len(objs) >= 3, objs
    needed = {}
    for obj in objs:
        out = subprocess.run(
            [readelf, "-W", "--version-info", obj], capture_output=True, text=True, check=True
        ).stdout
        for major, minor in re.findall(r"Name: GLIBC_(\d+)\.(\d+)", out):
            needed.setdefault((int(major), int(minor)), []).append(os.path.basename(obj))
    assert needed, "no glibc symbol version needed at all: readelf's output changed?"
    assert max(needed) <= (2, 28), {f"GLIBC_{a}.{b}": o for (a, b), o in needed.items()}


def test_one_extension_module_owns_the_native_state():
    # The driver table, the fork flags and their pthread_atfork handler, the token registry and
    # the per-thread entries are compiled into one module: a second module including the
    # headers would resolve its own table, install a second fork handler and keep a second
    # registry (docs/design.md, "One owner of native state").
    pkg = os.path.dirname(cyctx.__file__)
    mods = sorted(os.path.basename(m).split(".")[0] for m in glob.glob(os.path.join(pkg, "*.so")))
    assert mods == ["_guard"], mods
    from cyctx import _errors

    assert _errors.__file__.endswith(".py")  # the words: pure Python


def test_no_driver_is_a_typed_error():
    # No libcuda.so.1 at all (LD_LIBRARY_PATH cannot hide a system one, so only where none is
    # installed, e.g. CI): NoDeviceError naming the library and the fix, not a crash.
    code = textwrap.dedent("""
        import cyctx
        try:
            cyctx.ContextGuard(0)
        except cyctx.NoDeviceError as e:
            print("NoDeviceError", e.code, e.call, str(e))
    """)
    probe = subprocess.run(
        [sys.executable, "-c", "import ctypes; ctypes.CDLL('libcuda.so.1')"], capture_output=True
    )  # in a fresh process: this one may hold the simulator
    if probe.returncode == 0:
        pytest.skip("a libcuda.so.1 is installed on this machine")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "CYCTX_TEST_DRIVER"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("NoDeviceError 100 loading the CUDA driver")
    assert "libcuda.so.1" in proc.stdout and "simulate" in proc.stdout


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


def test_installed_package_ships_cimport_surface_and_stubs():
    for f in (
        "__init__.pxd",
        "_guard.pxd",
        "__init__.pyi",
        "py.typed",
        "_cpp/thread_entries.h",
        "include/cuda.h",  # cyctx's words where no cuda.h is on the path
    ):
        assert os.path.isfile(os.path.join(PKG, f)), f


def test_get_include_finds_the_header_the_pxd_declares_switch_from():
    # _guard.pxd declares Switch from "cyctx/switch.h": a module that cimports cyctx compiles
    # only if one of get_include()'s directories holds it, the installed package's.
    with open(os.path.join(PKG, "_guard.pxd"), encoding="utf-8") as f:
        pxd = f.read()
    headers = set(re.findall(r'cdef extern from "([^"]+)"', pxd))
    assert headers, "the .pxd declares nothing from a header"
    for h in headers:
        found = [d for d in cyctx.get_include_dirs() if os.path.isfile(os.path.join(d, h))]
        assert found == [cyctx.get_include()], (h, cyctx.get_include_dirs())
        assert os.path.realpath(found[0]).startswith(os.path.realpath(PKG))


def test_get_include_is_a_str_and_get_include_dirs_adds_cuda_h():
    # numpy's and pyarrow's convention: include_dirs=[cyctx.get_include(), np.get_include()].
    inc = cyctx.get_include()
    assert type(inc) is str and os.path.isfile(os.path.join(inc, "cyctx", "switch.h"))
    dirs = cyctx.get_include_dirs()
    assert type(dirs) is list and all(type(d) is str for d in dirs)
    assert dirs[0] == inc and len(dirs) == 2
    assert os.path.isfile(os.path.join(dirs[1], "cuda.h"))
    # What setuptools does with include_dirs (a list of str, hashed on the way).
    assert len({inc, *dirs}) == 2


def test_simulated_driver_has_the_driver_soname(readelf):
    from cyctx.testing import sim_library_path

    path = sim_library_path()
    out = subprocess.run([readelf, "-d", path], capture_output=True, text=True)
    assert "Library soname: [libcuda.so.1]" in out.stdout
    syms = subprocess.run(
        [readelf, "--dyn-syms", "-W", path], capture_output=True, text=True
    ).stdout
    exported = {
        line.split()[-1]
        for line in syms.splitlines()
        if " FUNC " in line and " GLOBAL " in line and " UND " not in line
    }
    # cuGetExportTable: NVRTC calls it unchecked when a libcuda.so.1 is loaded (simdriver.c).
    assert {
        "cuGetProcAddress_v2",
        "cuDriverGetVersion",
        "cuGetExportTable",
        "cyctxsim_inject_fault",
    } <= exported
    assert not any(s.startswith("sim_") for s in exported), "internals must stay hidden"


def test_required_headers_come_from_the_installed_bindings():
    needed = hdrs.required_headers()
    assert "cuda.h" in needed and all(h.endswith(".h") for h in needed)


def test_header_error_inside_a_pep517_build_names_build_system_requires(monkeypatch):
    # A package that cimports cyctx, built by pip in isolation with plain `cyctx` in its build
    # requirements, gets cuda-bindings without headers: `pip install` cannot fix that
    # environment, the package's [build-system] requires can.
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("_PYPROJECT_HOOKS_BUILD_BACKEND", raising=False)
    monkeypatch.delenv("PEP517_BUILD_BACKEND", raising=False)
    monkeypatch.setattr(hdrs, "_candidates", lambda: iter(()))  # no header anywhere
    bmaj, bmin, _ = hdrs.bindings_version()
    with pytest.raises(hdrs.HeaderError) as shell:
        hdrs.find_cuda_header()
    assert hdrs.runtime_wheel_requirement(bmaj, bmin) in str(shell.value)
    assert "[build-system] requires" not in str(shell.value)

    monkeypatch.setenv("_PYPROJECT_HOOKS_BUILD_BACKEND", "setuptools.build_meta")
    with pytest.raises(hdrs.HeaderError) as build:
        hdrs.find_cuda_header()
    msg = str(build.value)
    assert msg.startswith(str(shell.value))
    assert "[build-system] requires" in msg and f"'cyctx[cu{bmaj}]'" in msg


def test_the_guard_module_keeps_its_thread_locals_to_a_few_static_bytes(readelf):
    # The per-thread stack's address is an initial-exec thread-local (one load per enter and
    # exit), which puts the module's whole TLS block into the static TLS glibc keeps for loaded
    # modules, a few hundred bytes for the whole process: a module that cannot get its block
    # fails to import. So the block stays tiny (the stack itself is on the heap).
    (mod,) = glob.glob(os.path.join(os.path.dirname(cyctx.__file__), "_guard*.so"))
    phdrs = subprocess.run([readelf, "-lW", mod], capture_output=True, text=True, check=True)
    (tls,) = [line.split() for line in phdrs.stdout.splitlines() if line.split()[:1] == ["TLS"]]
    memsz = int(tls[5], 16)  # Type Offset VirtAddr PhysAddr FileSiz MemSiz Flg Align
    assert 8 <= memsz <= 64, f"the _guard module's TLS block is {memsz} bytes: {tls}"
    # The initial-exec access is there: its dynamic relocation (x86-64's TPOFF, aarch64's
    # TLS_TPREL) has the thread pointer's offset filled in at load. x86-64's linker also marks
    # such a module STATIC_TLS; aarch64's does not.
    rel = subprocess.run([readelf, "-rW", mod], capture_output=True, text=True, check=True)
    ie = re.findall(r"\bR_(?:X86_64_TPOFF(?:64|32)|AARCH64_TLS_TPREL(?:64)?)\b", rel.stdout)
    assert ie, f"no initial-exec TLS relocation in {os.path.basename(mod)}:\n{rel.stdout}"


# A libcuda.so.1 that hides one function: cuGetProcAddress_v2 answers "symbol not found" for
# the name set with shim_hide(), and a stand-in that fails with CUDA_ERROR_UNKNOWN (999) for
# every other name (nothing may call them: the table is refused before any call).
SHIM_C = r"""
#include <string.h>
typedef int CUresult;
static char hidden[128];
static CUresult stand_in(void) { return 999; }
void shim_hide(const char *name) { strncpy(hidden, name, sizeof hidden - 1); }
CUresult cuGetProcAddress_v2(const char *s, void **p, int v, unsigned long long f, int *st) {
    (void)v; (void)f;
    if (strcmp(s, hidden) == 0) { *p = 0; if (st) *st = 1; return 0; }  /* SYMBOL_NOT_FOUND */
    *p = (void *)stand_in; if (st) *st = 0; return 0;
}
CUresult cuInit(unsigned int flags) { (void)flags; return 999; }
"""

# Every function cyctx needs (src/cyctx/_cpp/driver.h, kProcs); the optional ones are not here.
REQUIRED = (
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxGetState",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxPushCurrent",
    "cuCtxPopCurrent",
    "cuCtxGetDevice",
    "cuCtxGetId",
    "cuGetErrorName",
    "cuGetErrorString",
)


def test_driver_lacking_a_required_function_is_named_and_never_called(tmp_path):
    from helpers.fakelibs import shared_library

    lib = shared_library(SHIM_C, tmp_path / "libcuda.so.1", "libcuda.so.1")
    code = textwrap.dedent(f"""
        import ctypes
        shim = ctypes.CDLL({str(lib)!r}, mode=ctypes.RTLD_GLOBAL)  # loaded first: cyctx's dlopen finds it
        import cyctx
        for name in {REQUIRED!r}:
            shim.shim_hide(name.encode())
            try:
                cyctx.ContextGuard(0)
                print(name, "no error")
            except cyctx.DriverError as e:
                print(name, type(e).__name__, e.code, e.name, name in str(e), "|", e)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr  # a call through a null pointer would crash it
    lines = proc.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == list(REQUIRED), proc.stdout
    for ln in lines:
        assert ln.split("|")[0].split()[1:] == [
            "DriverError",
            "500",
            "CUDA_ERROR_NOT_FOUND",
            "True",
        ], ln


def test_primary_release_is_the_abi_whose_unbalanced_call_fails(sim):
    # cuDevicePrimaryCtxRelease has two ABIs: the CUDA 7.0 one accepts a release with no
    # retain left in silence, the 11.0 one fails (201). cyctx resolves the 11.0 one, so a
    # close() whose retain someone else already released says so instead of "succeeding".
    out = run_child("""
        import cyctx
        from cuda.bindings import driver as d
        g = cyctx.ContextGuard(0)
        d.cuDevicePrimaryCtxRelease(0)  # another library releases one retain too many
        try:
            g.close()
            print("CLOSED")
        except cyctx.DriverError as e:
            print("REFUSED", type(e).__name__, e.code, e.call, g.closed)
    """)
    assert "REFUSED InvalidContextError 201 cuDevicePrimaryCtxRelease False" in out.stdout, (
        out.stdout
    )
