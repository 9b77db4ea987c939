"""Run the installed example on the simulated driver (no GPU), or on the real one with
CYCTX_DOWNSTREAM_DRIVER=real. It must import from site-packages, not from this folder."""

import os
import threading

if os.environ.get("CYCTX_DOWNSTREAM_DRIVER", "sim") == "sim":
    from cyctx.testing import use_simulated_driver

    SIM = use_simulated_driver(device_count=2)  # before any driver call
else:
    SIM = None

import cyctx_downstream
from cuda.bindings import driver

import cyctx

driver.cuInit(0)
LAST = driver.cuDeviceGetCount()[1] - 1  # device 1 where there are two


def test_imported_from_the_installed_package():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert not os.path.abspath(cyctx_downstream.__file__).startswith(here), (
        cyctx_downstream.__file__
    )
    assert cyctx_downstream._work.__file__.endswith(".so")


def test_guard_from_downstream_code():
    g0, g1 = cyctx.ContextGuard(0), cyctx.ContextGuard(LAST)
    try:
        assert cyctx_downstream.current_device(g0) == 0
        assert cyctx_downstream.current_device(g1) == LAST
        assert cyctx.current_handle() == 0
    finally:
        g0.close()
        g1.close()
    if SIM is not None:
        assert SIM.retain_count(0) == SIM.retain_count(LAST) == 0


def test_nogil_threads():
    g = cyctx.ContextGuard(LAST)
    bad = []
    threads = [
        threading.Thread(target=lambda: bad.append(cyctx_downstream.hammer(g, 20000)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    g.close()
    assert bad == [0, 0, 0, 0]
