"""The documented lookup orders, step by step, each variable also set to a bad value: which
simulated driver (docs/simulator.md, "How it plugs in"), how many devices it has, which libcudart
the doctor asks (docs/doctor.md, `--cudart`), which libcupti a trace loads (docs/tracing.md).
(libcuda.so.1 itself: tests/guard/test_errors.py, one test per way its loading fails; the
headers: tests/test_cuda_headers.py.)"""

import os
import shutil
import sys

import pytest
from helpers.children import run_python

from cyctx import testing
from cyctx._doctor import runtime
from cyctx._trace import locate

PACKAGED = os.path.join(os.path.dirname(testing.__file__), "_sim", "libcuda.so.1")

# --- the simulated driver: $CYCTX_SIM_LIBRARY, else the package's -----------------------------


def _select(env_value):
    """use_simulated_driver() in a fresh interpreter with CYCTX_SIM_LIBRARY as given (None:
    unset): what it loaded, or the error, and what is mapped afterwards."""
    env = {k: v for k, v in os.environ.items() if k != "CYCTX_SIM_LIBRARY"}
    if env_value is not None:
        env["CYCTX_SIM_LIBRARY"] = env_value
    proc = run_python(
        """
        import os
        from cyctx import testing
        try:
            sim = testing.use_simulated_driver(2)
            print("LOADED", os.path.realpath(sim.path))
        except Exception as e:
            print("ERROR", type(e).__name__, e)
        print("MAPPED", testing.loaded_libcuda())
        """,
        env=env,
    )
    return proc.stdout


@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_sim_library_unset_or_empty_is_the_packaged_one(value):
    out = _select(value)
    assert f"LOADED {os.path.realpath(PACKAGED)}" in out, out


def test_sim_library_named_is_the_one_loaded(tmp_path):
    copy = tmp_path / "libcuda.so.1"
    shutil.copy(PACKAGED, copy)
    out = _select(str(copy))
    assert f"LOADED {os.path.realpath(copy)}" in out, out
    assert f"MAPPED {copy}" in out, out


def _junk(tmp_path):
    (tmp_path / "libcuda.so.1").write_bytes(b"not an ELF file")
    return str(tmp_path / "libcuda.so.1")


@pytest.mark.parametrize(
    "make, error",
    [
        (
            lambda tmp: str(tmp / "nowhere" / "libcuda.so.1"),
            "FileNotFoundError simulated driver not found at {} (from CYCTX_SIM_LIBRARY)",
        ),
        (_junk, "RuntimeError {} (from CYCTX_SIM_LIBRARY) is not a library that loads"),
        # Refused before any call.
        (
            lambda tmp: _mapped("libm.so.6"),
            "RuntimeError {} (from CYCTX_SIM_LIBRARY) is not cyctx's simulated driver: "
            "it has no cyctxsim_",
        ),
        # A bare soname is not searched for on the loader's path: it names a file (from the
        # working directory), here one that does not exist.
        (
            lambda tmp: "libm.so.6",
            "FileNotFoundError simulated driver not found at {} (from CYCTX_SIM_LIBRARY)",
        ),
    ],
    ids=["missing", "not a library", "not the simulator", "a name, not a path"],
)
def test_sim_library_unusable_is_a_clear_error_and_loads_nothing(tmp_path, make, error):
    value = make(tmp_path)
    out = _select(value)
    assert f"ERROR {error.format(value)}" in out, out
    assert "MAPPED None" in out, out


def _mapped(name):
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split(None, 5)[-1].strip()
            if os.path.basename(path) == name:
                return path
    raise AssertionError(f"{name} is not mapped in this process")


# --- the simulated driver's device count: $CYCTX_SIM_DEVICES ---------------------------------


@pytest.mark.parametrize(
    ("value", "devices"),
    [
        (None, 1),  # unset: one device
        ("", 1),  # empty: as unset
        ("1", 1),
        ("3", 3),
        ("64", 64),  # the most
        ("0", 0),  # a machine without GPUs
        ("65", 0),  # past the most
        ("-1", 0),
        ("3x", 0),  # not a number: no device, never a guess at one
        ("2.0", 0),
        ("two", 0),
    ],
    ids=lambda v: repr(v),
)
def test_sim_devices_from_the_environment(value, devices):
    # Without cyctxsim_configure (use_simulated_driver calls it), cuInit takes the count from
    # the variable; 0 devices is cuInit's CUDA_ERROR_NO_DEVICE (100), as on a GPU-less machine.
    env = {k: v for k, v in os.environ.items() if k != "CYCTX_SIM_DEVICES"}
    if value is not None:
        env["CYCTX_SIM_DEVICES"] = value
    proc = run_python(
        f"""
        import ctypes
        lib = ctypes.CDLL({PACKAGED!r}, mode=ctypes.RTLD_GLOBAL)
        from cuda.bindings import driver as d  # finds the library above by its soname
        rc = lib.cuInit(0)
        print("INIT", rc, "DEVICES", lib.cyctxsim_device_count(), d.cuDeviceGetCount()[1])
        """,
        env=env,
    )
    want = f"INIT 0 DEVICES {devices} {devices}" if devices else "INIT 100"
    assert want in proc.stdout, proc.stdout


# --- the doctor's libcudart: given, else already loaded, else cuda-pathfinder's ---------------


class _Pathfinder:
    """cuda.pathfinder's load_nvidia_dynamic_lib, answering or failing as told, and counting."""

    def __init__(self, answer=None, error=None):
        self.answer, self.error, self.calls = answer, error, 0

    def install(self, monkeypatch):
        import types

        mod = types.ModuleType("cuda.pathfinder")

        def load(name):
            self.calls += 1
            assert name == "cudart", name
            if self.error:
                raise self.error
            return types.SimpleNamespace(abs_path=self.answer)

        mod.load_nvidia_dynamic_lib = load
        monkeypatch.setitem(sys.modules, "cuda.pathfinder", mod)
        return self


def test_cudart_given_wins_over_loaded_and_loaded_over_pathfinder(monkeypatch):
    pf = _Pathfinder(answer="/pf/libcudart.so.13").install(monkeypatch)
    monkeypatch.setattr(runtime, "loaded_cudart", lambda: "/loaded/libcudart.so.12")
    given = "/given/libcudart.so.11.0"
    assert runtime.find_cudart(given) == (given, "given", None)
    loaded = ("/loaded/libcudart.so.12", "already loaded in this process", None)
    assert runtime.find_cudart() == loaded
    # Given empty: refused, not taken for none given.
    assert runtime.load_cudart("") == (None, "no libcudart found (given: the path is empty)")
    assert pf.calls == 0


def test_cudart_pathfinders_when_none_is_loaded(monkeypatch):
    _Pathfinder(answer="/pf/libcudart.so.13").install(monkeypatch)
    monkeypatch.setattr(runtime, "loaded_cudart", lambda: None)
    assert runtime.find_cudart() == ("/pf/libcudart.so.13", "cuda-pathfinder", None)


def test_cudart_pathfinder_failing_is_the_reason(monkeypatch):
    _Pathfinder(error=RuntimeError("no cudart in this environment")).install(monkeypatch)
    monkeypatch.setattr(runtime, "loaded_cudart", lambda: None)
    assert runtime.load_cudart() == (
        None,
        "no libcudart found (cuda-pathfinder: RuntimeError: no cudart in this environment)",
    )


def test_cudart_given_missing_or_not_a_cudart_is_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "loaded_cudart", lambda: "/loaded/libcudart.so.12")
    missing = str(tmp_path / "libcudart.so.13")
    rt, why = runtime.load_cudart(missing)
    assert rt is None and why.startswith(f"cannot load {missing}: "), why
    libm = _mapped("libm.so.6")
    rt, why = runtime.load_cudart(libm)
    assert (
        rt is None and why.startswith(f"cannot load {libm}: ") and "cudaRuntimeGetVersion" in why
    ), why


def test_cudart_given_empty_on_the_command_line_is_a_usage_error():
    proc = run_python(
        "import sys; from cyctx.__main__ import main; sys.exit(main(['doctor', '--cudart', '']))",
        check=False,
    )
    assert proc.returncode == 2 and "--cudart : no such file" in proc.stderr, proc.stderr


# --- libcupti: loaded, $CYCTX_CUPTI, the wheels, the toolkit ----------------------------------


def _cupti(d, name):
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(b"")
    return str(d / name)


@pytest.fixture
def nowhere(monkeypatch):
    """No libcupti mapped, none on sys.path, no CUDA variables, no /usr/local/cuda."""
    monkeypatch.setattr(locate, "mapped_paths", lambda: [])
    monkeypatch.setattr(sys, "path", [])
    for var in ("CYCTX_CUPTI", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    real_isdir = os.path.isdir
    monkeypatch.setattr(
        # (os.fspath: from 3.14 pathlib asks it with a Path, in mkdir(exist_ok=True))
        locate.os.path,
        "isdir",
        lambda p: not os.fspath(p).startswith("/usr/local/cuda") and real_isdir(p),
    )
    return monkeypatch


def test_cupti_toolkit_order_cuda_home_cuda_path_then_usr_local(tmp_path, nowhere):
    home = _cupti(tmp_path / "home" / "extras" / "CUPTI" / "lib64", "libcupti.so.13")
    path = _cupti(tmp_path / "path" / "extras" / "CUPTI" / "lib64", "libcupti.so.12")
    nowhere.setenv("CUDA_HOME", str(tmp_path / "home"))
    nowhere.setenv("CUDA_PATH", str(tmp_path / "path"))
    assert [p for p, _ in locate.candidates()] == [home, path]
    assert locate.find_cupti(13) == (home, f"the CUDA toolkit ({tmp_path / 'home'})")
    # CUDA_HOME's is newer than a 12 driver: passed over for CUDA_PATH's.
    assert locate.find_cupti(12) == (path, f"the CUDA toolkit ({tmp_path / 'path'})")
    # So is a CUDA_HOME without CUPTI.
    (tmp_path / "bare").mkdir()
    nowhere.setenv("CUDA_HOME", str(tmp_path / "bare"))
    assert locate.find_cupti(13)[0] == path


def test_cupti_beside_the_loaded_driver_after_the_env_before_the_wheels(tmp_path, nowhere):
    # A system's packages put the driver and its CUPTI in one directory (so does the simulator).
    system = tmp_path / "system"
    driver = _cupti(system, "libcuda.so.580.159.04")
    beside = _cupti(system, "libcupti.so.12")
    _cupti(tmp_path / "site" / "nvidia" / "cu13" / "lib", "libcupti.so.13")
    nowhere.setattr(sys, "path", [str(tmp_path / "site")])
    nowhere.setattr(locate, "mapped_paths", lambda: [driver])
    assert locate.find_cupti(13) == (beside, f"beside the loaded driver ({system})")
    named = _cupti(tmp_path / "mine", "libcupti.so.12")
    nowhere.setenv("CYCTX_CUPTI", named)
    assert locate.find_cupti(13) == (named, "$CYCTX_CUPTI")
    # Newer than the driver: passed over like any other.
    nowhere.delenv("CYCTX_CUPTI")
    assert locate.find_cupti(11)[0] is None


def test_cupti_wheel_wins_over_the_toolkit(tmp_path, nowhere):
    wheel = _cupti(tmp_path / "site" / "nvidia" / "cu13" / "lib", "libcupti.so.13")
    _cupti(tmp_path / "home" / "extras" / "CUPTI" / "lib64", "libcupti.so.13")
    nowhere.setattr(sys, "path", [str(tmp_path / "site")])
    nowhere.setenv("CUDA_HOME", str(tmp_path / "home"))
    assert locate.find_cupti(13) == (wheel, "the nvidia-cuda-cupti wheel")


def test_cupti_env_wins_over_wheels_and_empty_env_is_unset(tmp_path, nowhere):
    named = _cupti(tmp_path / "mine", "libcupti.so.13")
    wheel = _cupti(tmp_path / "site" / "nvidia" / "cu13" / "lib", "libcupti.so.13")
    nowhere.setattr(sys, "path", [str(tmp_path / "site")])
    nowhere.setenv("CYCTX_CUPTI", named)
    assert locate.find_cupti(13) == (named, "$CYCTX_CUPTI")
    nowhere.setenv("CYCTX_CUPTI", "")
    assert locate.find_cupti(13) == (wheel, "the nvidia-cuda-cupti wheel")


def test_cupti_env_missing_is_refused_naming_it_not_passed_over(tmp_path, nowhere):
    _cupti(tmp_path / "site" / "nvidia" / "cu13" / "lib", "libcupti.so.13")
    nowhere.setattr(sys, "path", [str(tmp_path / "site")])
    missing = str(tmp_path / "mine" / "libcupti.so.13")
    nowhere.setenv("CYCTX_CUPTI", missing)
    assert locate.find_cupti(13) == (None, f"$CYCTX_CUPTI names {missing}, which is not a file")
    nowhere.setenv("CYCTX_CUPTI", str(tmp_path))  # a folder
    assert locate.find_cupti(13) == (None, f"$CYCTX_CUPTI names {tmp_path}, which is not a file")


def test_cupti_env_newer_than_the_driver_is_refused_naming_it(tmp_path, nowhere):
    named = _cupti(tmp_path / "mine", "libcupti.so.13")
    _cupti(tmp_path / "site" / "nvidia" / "cuda_cupti" / "lib", "libcupti.so.12")
    nowhere.setattr(sys, "path", [str(tmp_path / "site")])
    nowhere.setenv("CYCTX_CUPTI", named)
    path, why = locate.find_cupti(12)
    assert path is None and why == (
        f"$CYCTX_CUPTI names {named}, a CUPTI of CUDA 13, newer than the driver (CUDA 12), "
        f"which it would refuse"
    )


def test_cupti_already_loaded_wins_over_env(tmp_path, nowhere):
    # A second CUPTI in the process would be a second subscriber: the one mapped is used.
    named = _cupti(tmp_path / "mine", "libcupti.so.12")
    nowhere.setattr(locate, "mapped_paths", lambda: ["/opt/torch/libcupti.so.13.0.85"])
    nowhere.setenv("CYCTX_CUPTI", named)
    assert locate.find_cupti(13) == (
        "/opt/torch/libcupti.so.13.0.85",
        "already loaded in this process",
    )


def test_cupti_none_anywhere_says_how_to_get_one(nowhere):
    path, why = locate.find_cupti(13)
    assert path is None and why == (
        "no libcupti found (install it with `pip install cyctx[trace]`, or point $CYCTX_CUPTI at it)"
    )
