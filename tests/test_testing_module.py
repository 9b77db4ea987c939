"""cyctx.testing's choice of driver, each case in a fresh interpreter (the choice lasts for the
process): a second, different driver library is refused; a bad device count is refused before
anything is loaded; a second call must agree with the first."""

import os
import shutil

import pytest
from helpers.children import run_python

from cyctx import testing


def child(code, **kw):
    proc = run_python(code, **kw)
    return proc.stdout.split("\n")


def test_a_second_different_simulated_driver_is_refused(tmp_path):
    # A copy of the simulator (the same soname, another file) is loaded first, as another
    # library of the process might load its own: use_simulated_driver() must refuse the one it
    # would load, naming what is loaded, and load nothing more.
    other = tmp_path / "libcuda.so.1"
    shutil.copy(testing.sim_library_path(), other)
    out = child(f"""
        import ctypes
        from cyctx import testing
        ctypes.CDLL({str(other)!r}, mode=ctypes.RTLD_GLOBAL)
        try:
            testing.use_simulated_driver(2)
            print("ACCEPTED")
        except RuntimeError as e:
            print("REFUSED", {str(other)!r} in str(e), "before the first driver call" in str(e))
        maps = [l.split(None, 5)[-1].strip() for l in open("/proc/self/maps") if "libcuda" in l]
        print("MAPPED", sorted(set(maps)) == [{str(other)!r}], testing.simulated() is None)
    """)
    assert "REFUSED True True" in out and "MAPPED True True" in out, out


def test_the_same_simulated_driver_loaded_first_is_accepted():
    path = testing.sim_library_path()
    out = child(f"""
        import ctypes
        from cyctx import testing
        ctypes.CDLL({path!r}, mode=ctypes.RTLD_GLOBAL)
        sim = testing.use_simulated_driver(2)
        print("SIM", sim.device_count, testing.simulated() is sim)
    """)
    assert "SIM 2 True" in out, out


@pytest.mark.parametrize(
    "count, error, words",
    [
        (0, "ValueError", "from 1 to 64"),
        (65, "ValueError", "from 1 to 64"),
        (-1, "ValueError", "from 1 to 64"),
        (True, "TypeError", "must be an int"),
        (2.0, "TypeError", "must be an int"),
        ("2", "TypeError", "must be an int"),
    ],
)
def test_a_bad_device_count_is_refused_and_loads_nothing(count, error, words):
    out = child(f"""
        from cyctx import testing
        try:
            testing.use_simulated_driver({count!r})
            print("ACCEPTED")
        except Exception as e:
            print("ERR", type(e).__name__, {words!r} in str(e), repr(str(e)))
        print("LOADED", testing.loaded_libcuda(), testing.simulated())
        sim = testing.use_simulated_driver(64)  # still free to choose, and the largest works
        from cuda.bindings import driver as d
        d.cuInit(0)
        print("AFTER", sim.device_count, int(d.cuDeviceGetCount()[1]))
    """)
    line = next(ln for ln in out if ln.startswith(("ERR", "ACCEPTED")))
    assert line.startswith(f"ERR {error} True"), out
    assert "LOADED None None" in out and "AFTER 64 64" in out, out


def test_a_second_call_must_ask_for_the_same_device_count():
    out = child("""
        from cyctx import testing
        sim = testing.use_simulated_driver(2)
        print("SAME", testing.use_simulated_driver(2) is sim)
        try:
            testing.use_simulated_driver(3)
            print("ACCEPTED")
        except RuntimeError as e:
            print("REFUSED", "in use with 2 device(s)" in str(e))
        print("STILL", sim.device_count, testing.simulated() is sim)
    """)
    assert "SAME True" in out and "REFUSED True" in out and "STILL 2 True" in out, out


def _initialised_elsewhere(devices, ask):
    # The simulator loaded and initialised by someone else first (ctypes, with its device
    # count from CYCTX_SIM_DEVICES), then use_simulated_driver(ask).
    path = testing.sim_library_path()
    return child(
        f"""
        import ctypes
        from cyctx import testing
        lib = ctypes.CDLL({path!r}, mode=ctypes.RTLD_GLOBAL)
        assert lib.cuInit(0) == 0
        try:
            sim = testing.use_simulated_driver({ask})
            print("SIM", sim.device_count)
        except RuntimeError as e:
            print("REFUSED", str(e))
        """,
        env={**os.environ, "CYCTX_SIM_DEVICES": str(devices)},
    )


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_a_simulator_initialised_elsewhere_is_taken_with_the_count_asked_only(devices):
    # Fewer or more devices than asked: either way the caller would not get what it asked for.
    out = _initialised_elsewhere(devices, 2)
    line = next(ln for ln in out if ln.startswith(("SIM", "REFUSED")))
    refused = f"REFUSED simulated driver already initialised with {devices} devices"
    assert line == ("SIM 2" if devices == 2 else refused), out


def test_the_state_of_a_device_that_does_not_exist_is_an_error(sim):
    n = sim.device_count
    for bad in (n, -1):
        with pytest.raises(ValueError, match=f"no simulated device {bad}"):
            sim.retain_count(bad)
        with pytest.raises(ValueError, match=f"no simulated device {bad}"):
            sim.primary_active(bad)
    assert sim.retain_count(n - 1) >= 0


def test_the_plugin_and_cyctx_testing_share_one_libcuda_lookup():
    # One implementation, importable without cyctx: the plugin gets it with cyctx unimported,
    # and cyctx.testing's is the same function, which finds the driver the process chose.
    out = child("""
        import sys
        import _cyctx_pytest
        print("CYCTX", any(m.split(".")[0] == "cyctx" for m in sys.modules))
        from cyctx import testing
        print("SAME", testing.loaded_libcuda is _cyctx_pytest.loaded_libcuda)
        print("NAMED", testing.loaded_libcuda.__module__)  # where users import it from
        print("BEFORE", testing.loaded_libcuda())
        sim = testing.use_simulated_driver(2)
        import os
        print("AFTER", os.path.realpath(_cyctx_pytest.loaded_libcuda()) == os.path.realpath(sim.path))
    """)
    assert "CYCTX False" in out and "SAME True" in out and "NAMED cyctx.testing" in out, out
    assert "BEFORE None" in out and "AFTER True" in out, out
