"""The smoke check of an installed cyctx, shared by the install checks: on the simulated driver,
a guard of device 1 is entered, makes its context current, is left and closed, and leaves no
retain behind. Run it from outside the checkout, so that the installed cyctx is imported."""

from cyctx.testing import use_simulated_driver

sim = use_simulated_driver(device_count=2)

import cyctx  # noqa: E402  (after the simulated driver is chosen)

g = cyctx.ContextGuard(1)
with g:
    assert cyctx.current_handle() == g.handle
g.close()
assert sim.retain_count(1) == 0
print("guard ok")
