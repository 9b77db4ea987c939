"""Fixtures of the tracer's tests."""

import os

import pytest
from helpers import drivers
from helpers.simcupti import CUPTI_13_2, Cupti


@pytest.fixture
def d(sim):
    """The driver (cuda.bindings), on the simulated one."""
    return drivers.driver()


@pytest.fixture
def primary(d):
    """Device 0's primary context, retained for the test and released after."""
    yield drivers.ok(d.cuDevicePrimaryCtxRetain(0))
    drivers.ok(d.cuDevicePrimaryCtxRelease(0))


@pytest.fixture
def cupti(sim):
    """The simulated driver's CUPTI (tests/helpers/simcupti.py); a CUPTI 13.2 again after the
    test."""
    c = Cupti(os.path.join(os.path.dirname(sim.path), "libcupti.so.13"))
    c.version(CUPTI_13_2)
    yield c
    c.version(CUPTI_13_2)
