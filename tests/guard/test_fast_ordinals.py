"""cyctx.device(k) for an int reads a C array of the first 64 shared guards, unchecked: its bound
`0 <= k < 64` is tested where a missing check shows, on 64 simulated devices and with ordinals
whose byte offset wraps to a published slot (k * 8 = 0 mod 2**64)."""

import pytest
from helpers.children import run_python

pytestmark = pytest.mark.usefixtures("sim")

CHILD = """
import cyctx
from cyctx import ContextGuard, InvalidDeviceError
from cyctx.testing import use_simulated_driver
sim = use_simulated_driver(device_count=64)
LONG_MIN, LONG_MAX = -2**63, 2**63 - 1
published = {k: cyctx.device(k) for k in (0, 1, 62, 63)}  # the first, the last fast slot
for k, g in published.items():
    with g:  # the first use publishes it to the fast array
        pass
    assert g is ContextGuard.shared(k) and g.is_shared and g.device == k, k
    assert cyctx.device(k) is g, f"device({k}) again is another object"
retains = [sim.retain_count(i) for i in range(64)]

def refused(k, cls, match):
    try:
        got = cyctx.device(k)
        # An ordinal past the devices makes a guard of its own (nothing is asked of the
        # driver), which its first use refuses; one past a C int is refused at once.
        assert got.device == k and got not in published.values(), (k, got)
        with got:
            pass
    except cls as e:
        assert match in str(e), (k, str(e))
    else:
        raise AssertionError(f"device({k}) returned {got!r}, not {cls.__name__}")
    assert [sim.retain_count(i) for i in range(64)] == retains, f"device({k}) changed retains"

for k in (-1, -2, -63, -64, -65, -2**31, -2**61, -2**61 + 1, -2**61 + 63, -2**62,
          LONG_MIN + 1, LONG_MIN, LONG_MIN - 1, -2**64, -2**200):
    refused(k, ValueError, "must be >= 0")
for k in (64, 65, 2**31, 2**61, 2**61 + 1, 2**61 + 63, 2**62, LONG_MAX, LONG_MAX + 1,
          2**64, 2**64 + 63, 2**200):
    refused(k, InvalidDeviceError, f"Device {k} does not exist")
for k, g in published.items():  # nothing was overwritten by a refused ordinal
    assert cyctx.device(k) is g and ContextGuard.shared(k) is g, k
print("OK")
"""


def test_device_bounds_of_the_fast_array():
    out = run_python(CHILD, timeout=60)
    assert "OK" in out.stdout, out.stdout + out.stderr
