"""Driver selection and the per-test context-state check.

`--driver` (or env CYCTX_TEST_DRIVER) picks the driver for the whole run:
  real  the NVIDIA driver; fails if none loads
  sim   cyctx's simulated driver with 2 devices (CI has no GPU)
  auto  real when a GPU driver loads, else sim (default)
The choice must be made before the first driver call, so it happens in pytest_configure.
Subprocess tests inherit it through CYCTX_TEST_DRIVER and the prologue of
`helpers.children.run_child` (tests/helpers/children.py).
"""

import os
import sys
import types

import pytest

# tests/ on sys.path, so that `helpers` imports as a package whatever pytest's import mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers import drivers  # noqa: E402


def pytest_addoption(parser):
    parser.addoption(
        "--driver",
        choices=("auto", "real", "sim"),
        default=os.environ.get("CYCTX_TEST_DRIVER", "auto"),
        help="driver to test against: real NVIDIA driver, cyctx's simulated one, or auto",
    )
    parser.addoption(
        "--tooling",
        action="store_true",
        help="also run the tests of the project's own tools (marked tooling; CI runs them)",
    )


def pytest_configure(config):
    from cyctx import testing

    if config.getoption("--driver") == "real" and not testing.real_driver_available():
        # A usage error (exit status 4, one line), as for any option that cannot be honoured.
        raise pytest.UsageError(
            "--driver=real, but no NVIDIA driver with a GPU loads here: run on a GPU machine, "
            "or use --driver=sim (or auto)"
        )
    kind = drivers.select(config.getoption("--driver"))
    config._cyctx_driver = kind


# What all the copies of a test share, which pytest-run-parallel's many threads running one
# test at once would read and change under each other: such a test runs on one thread (its
# report lists it).
_PROCESS_WIDE_FIXTURES = {"sim": "reads or changes the simulated driver's counters (sim)"}
_PROCESS_WIDE_CALLS = {
    "retains_unchanged": "counts the process's retains (retains_unchanged)",
    "reset_primary": "resets a device's primary context, which every copy uses (reset_primary)",
    "collect_unraisable": "replaces sys.unraisablehook, which every copy shares (collect_unraisable)",
    "getrefcount": "counts the references to an object its copies share (sys.getrefcount)",
}


def _names_called(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # a function or lambda defined in the test
            names |= _names_called(const)
    return names


def pytest_collection_modifyitems(config, items):
    # The suite a user runs is the product's; the tools' tests take minutes (a mutation run,
    # wheel builds) and CI runs them in a stage of their own.
    if not config.getoption("--tooling"):
        skip = pytest.mark.skip(
            reason="a test of the project's own tools (mutation, benchmarks, wheel building): "
            "run with --tooling; CI does"
        )
        for item in items:
            if item.get_closest_marker("tooling"):
                item.add_marker(skip)
    if config.pluginmanager.has_plugin("run-parallel"):
        for item in items:
            code = getattr(getattr(item, "obj", None), "__code__", None)
            called = _names_called(code) if code is not None else set()
            reasons = [r for f, r in _PROCESS_WIDE_FIXTURES.items() if f in item.fixturenames]
            reasons += [r for f, r in _PROCESS_WIDE_CALLS.items() if f in called]
            if reasons:
                item.add_marker(pytest.mark.thread_unsafe(reason="; ".join(reasons)))


def pytest_report_header(config):
    return drivers.describe()


def pytest_runtest_setup(item):
    kind = drivers.KIND
    if kind != "real":
        for mark in ("gpu", "cudart"):
            if item.get_closest_marker(mark):
                pytest.skip(
                    f"needs the real NVIDIA driver ({mark}); this run uses the simulated driver"
                )
    if item.get_closest_marker("cudart") and drivers.cudart() is None:
        pytest.skip("needs a loadable libcudart (nvidia-cuda-runtime wheel or toolkit)")
    if item.get_closest_marker("strands"):
        from cyctx._guard import PLAIN_PROTOCOL

        if PLAIN_PROTOCOL:
            pytest.skip(
                "the plain build tells no strand from another (its refusals: "
                "guard/test_block_family.py and test_plain_protocol.py)"
            )
    if item.get_closest_marker("multigpu") and drivers.device_count() < 2:
        pytest.skip(f"needs 2 devices, this machine has {drivers.device_count()}")


@pytest.fixture
def sim():
    """The simulated driver's control handle; skips on the real driver."""
    if drivers.SIM is None:
        pytest.skip("needs the simulated driver's counters (this run uses the real driver)")
    return drivers.SIM


@pytest.fixture
def reuse(sim):
    """The simulated driver's handle reuse on for the test, off again after it."""
    assert sim.reuse_handles(True) is False, "handle reuse was left on"
    yield sim
    assert sim.reuse_handles(False) is True


@pytest.fixture(autouse=True)
def _thread_state_unchanged():
    """Every test leaves the calling thread's context state as it found it."""
    before = drivers.thread_state()
    yield
    after = drivers.thread_state()
    # A guard the test let the collector free left its retain to the process: released here,
    # so each test starts from the driver's own state.
    drivers.drop_process_retains()
    assert after == before, f"test changed this thread's context state: {before} -> {after}"
