"""On a free-threaded CPython, cyctx keeps the GIL off: every module of it (the guard, the
tracer's native half, the pytest plugin, cyctx.testing, the command line) declares that it runs
without the GIL, so importing and using them never turns it back on for the process."""

import sysconfig

import pytest
from helpers.children import run_child

FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))

needs_free_threading = pytest.mark.skipif(
    not FREE_THREADED, reason="needs a free-threaded CPython (this interpreter has the GIL)"
)


@needs_free_threading
def test_every_module_of_cyctx_keeps_the_gil_off():
    # A fresh interpreter with the GIL state its build gives (PYTHON_GIL empty, as if unset:
    # off, and not forced), every warning an error: the interpreter warns RuntimeWarning when a
    # module turns the GIL on.
    out = run_child(
        """
        import importlib, pkgutil, sys, warnings
        warnings.simplefilter("error")
        assert sys.flags.gil is None, "the GIL's state is forced (PYTHON_GIL or -X gil)"
        assert not sys._is_gil_enabled(), "the GIL was on before cyctx was imported"
        import cyctx, _cyctx_cli, _cyctx_libcuda, _cyctx_pytest
        names = ["_cyctx_cli", "_cyctx_libcuda", "_cyctx_pytest"]
        for m in pkgutil.walk_packages(cyctx.__path__, "cyctx."):
            if m.name != "cyctx.__main__":  # imported below, without running the command
                names.append(m.name)
        for name in names:
            importlib.import_module(name)
        from cyctx.__main__ import run  # the command line's module
        import cyctx._trace._native, cyctx._guard  # the extensions, by name
        with cyctx.trace(quiet=True) as t:  # the tracer's native half subscribed
            with cyctx.device(0):
                pass
        g = cyctx.ContextGuard(0)
        with g:
            pass
        g.close()
        print("IMPORTED", len(names), "GIL", sys._is_gil_enabled(), "TRACED", t.reason)
        """,
        env={"PYTHON_GIL": ""},
    )
    assert "IMPORTED" in out.stdout and " GIL False " in out.stdout, out.stdout + out.stderr
    assert int(out.stdout.split("IMPORTED ")[1].split()[0]) > 20, out.stdout
