"""Run after installing the example: its compiled code enters a guard on the simulated driver,
and the thread's context and the retains are as they were afterwards."""

import os

from cyctx.testing import use_simulated_driver

sim = use_simulated_driver(device_count=2)  # before any driver call

import cyctx_minimal  # noqa: E402

import cyctx  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
assert not os.path.abspath(cyctx_minimal.__file__).startswith(here), "imported from the source tree"
g = cyctx.ContextGuard(1)
assert cyctx_minimal.enter_and_leave(g, 1000) == 1000
assert cyctx.current_handle() == 0
g.close()
assert sim.retain_count(1) == 0
print("examples/minimal: ok")
