"""A guard nothing closed never destroys a context: the collector hands its retain to the process
(once per device); close() and closing release at once. Each case runs in a fresh interpreter."""

import textwrap

import pytest
from helpers.children import run_child

# The child's view of device 1 on the simulated driver: driver refcount, active, the process's.
STATE = """
import gc, warnings, cyctx
from cyctx import ContextGuard
from cyctx._guard import process_retains
sim = drivers.SIM
def state(k=1):
    return (sim.retain_count(k), sim.primary_active(k), process_retains(k))
"""


def _child(code, **kw):
    return run_child(STATE + textwrap.dedent(code), **kw)


def _lines(out):
    return [line for line in out.stdout.splitlines() if line.startswith("STATE")]


def test_temporary_guard_leaves_the_context_and_its_id_to_the_process(sim):
    out = _child(
        """
        print("STATE", state())
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with ContextGuard(1) as g:
                first = g.context_id
            del g
            gc.collect()
        print("STATE", state())
        print("WARN", len(w), w[0].category.__name__, str(w[0].message))
        later = ContextGuard(1)
        print("SAMEID", later.context_id == first)  # not destroyed and re-created
        later.close()
        print("STATE", state())
        """
    )
    assert _lines(out) == ["STATE (0, False, 0)", "STATE (1, True, 1)", "STATE (1, True, 1)"]
    assert "SAMEID True" in out.stdout
    warn = next(line for line in out.stdout.splitlines() if line.startswith("WARN"))
    assert warn.startswith("WARN 1 ResourceWarning cyctx: a ContextGuard of device 1")
    msg = warn.split("ResourceWarning ", 1)[1]
    assert "garbage collection" in msg and "stay" in msg and "destroyed" not in msg
    assert "close()" in msg and "cyctx.device(1)" in msg
    assert msg.count(". ") <= 1 and not msg.endswith(".")  # two sentences at most


def test_many_temporaries_hold_the_retain_once(sim):
    out = _child(
        """
        warnings.simplefilter("ignore", ResourceWarning)
        for _ in range(100):
            with ContextGuard(1):
                pass
        gc.collect()
        print("STATE", state())
        """
    )
    assert _lines(out) == ["STATE (1, True, 1)"]


def test_the_shared_guard_takes_over_the_process_retain(sim):
    # Before the shared guard's first use: the slot holds it; the first use publishes the
    # guard and releases the slot's (its own retain stands); after it, a collected guard's
    # retain is released.
    out = _child(
        """
        warnings.simplefilter("ignore", ResourceWarning)
        with ContextGuard(1):
            pass
        print("STATE", state())
        s = cyctx.device(1)
        print("STATE", state())
        with s:
            pass
        print("STATE", state())
        with ContextGuard(1):
            pass
        gc.collect()
        print("STATE", state())
        """
    )
    assert _lines(out) == [
        "STATE (1, True, 1)",
        "STATE (1, True, 1)",  # made, not used: nothing asked of the driver
        "STATE (1, True, 0)",
        "STATE (1, True, 0)",
    ]


@pytest.mark.parametrize(
    "spelling",
    [
        "g = ContextGuard(1)\ng.close()",
        "with contextlib.closing(ContextGuard(1)) as g:\n    with g:\n        pass",
        "g = ContextGuard(1)\nwith g:\n    pass\ng.close()",
    ],
)
def test_close_and_closing_still_release_at_once(sim, spelling):
    body = "\n".join("        " + line for line in spelling.splitlines())
    out = _child(
        f"""
        import contextlib
        warnings.simplefilter("error", ResourceWarning)
{body}
        print("STATE", state())
        del g
        gc.collect()
        print("STATE", state())
        """
    )
    assert _lines(out) == ["STATE (0, False, 0)", "STATE (0, False, 0)"]


def test_extra_retains_are_released_and_the_own_one_kept(sim):
    # A re-activation whose balancing release failed left an extra retain: the collector
    # releases that one, and only the guard's own goes to the process.
    out = _child(
        """
        from cyctx import ContextResetWarning
        from cuda.bindings import driver as d
        warnings.simplefilter("ignore", ResourceWarning)
        warnings.simplefilter("ignore", ContextResetWarning)
        g = ContextGuard(1)
        d.cuDevicePrimaryCtxReset(d.cuDeviceGet(1)[1])
        sim.inject_fault("cuDevicePrimaryCtxRelease", 999)
        with g:
            pass
        sim.clear_faults()
        print("STATE", state())
        del g
        gc.collect()
        print("STATE", state())
        """
    )
    assert _lines(out) == ["STATE (2, True, 0)", "STATE (1, True, 1)"]


def test_at_thread_exit_the_retain_goes_to_the_process_silently(sim):
    # A guard in a thread's locals is freed as the thread's state is cleared (no Python frame):
    # no warning can be made there; the retain goes to the process all the same.
    out = _child(
        """
        import threading
        warnings.simplefilter("error", ResourceWarning)
        local = threading.local()
        def work():
            local.g = ContextGuard(1)
            with local.g:
                pass
        t = threading.Thread(target=work); t.start(); t.join()
        gc.collect()
        print("STATE", state())
        """
    )
    assert _lines(out) == ["STATE (1, True, 1)"]
    assert "Warning" not in out.stderr, out.stderr


def test_at_interpreter_shutdown_the_retains_are_held_once(sim):
    # Guards in globals, a cycle and a thread ended inside one, freed during finalization:
    # after the interpreter is gone the simulated driver reports one retain per device.
    out = run_child(
        """
        import threading, cyctx
        g = cyctx.ContextGuard(0)
        g2 = cyctx.ContextGuard(0)
        cycle = [cyctx.ContextGuard(1)]
        cycle.append(cycle)
        threading.Thread(target=g.__enter__).start()
        print("END")
        """,
        env={"CYCTX_SIM_REPORT_AT_EXIT": "1", "PYTHONWARNINGS": "always::ResourceWarning"},
    )
    assert "END" in out.stdout
    assert "cyctxsim at exit: retains=[1, 1] active=[1, 1]" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "Warning" not in out.stderr, out.stderr


def test_a_forked_child_hands_nothing_and_releases_nothing(sim):
    # The parent's retains are the parent's: a guard freed in the child makes no driver call.
    out = _child(
        """
        import os
        warnings.simplefilter("ignore", ResourceWarning)
        with ContextGuard(1):
            pass
        g = ContextGuard(1)
        print("STATE", state())
        pid = os.fork()
        if pid == 0:
            calls = sim.call_count()
            del g
            gc.collect()
            ok = sim.call_count() == calls and state() == (2, True, 1)
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        print("CHILD", os.waitstatus_to_exitcode(status))
        del g
        gc.collect()
        print("STATE", state())
        """
    )
    assert _lines(out) == ["STATE (2, True, 1)", "STATE (1, True, 1)"]
    assert "CHILD 0" in out.stdout
