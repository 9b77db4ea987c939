"""Fixtures of the guard's tests: a guard of device 0 and one of device 1, closed after the test.
(tests/conftest.py, which selects the driver and checks each test's context state, applies here
too.)"""

import pytest
from helpers.drivers import device_count

from cyctx import ContextGuard


@pytest.fixture
def guard():
    g = ContextGuard(0)
    yield g
    g.close()


@pytest.fixture
def guard1():
    if device_count() < 2:
        pytest.skip("needs 2 devices")
    g = ContextGuard(1)
    yield g
    g.close()
