"""The ResourceWarning of a guard the collector freed shows exactly where warnings.filters says
it shows: cyctx skips the warn call only where the filters would ignore it whatever code runs,
and decides again whenever the filters change (also when the list is changed in place)."""

import re
import subprocess
import sys
import textwrap

import pytest

PROLOGUE = "from cyctx.testing import use_simulated_driver; sim = use_simulated_driver(2)\n"

COLLECT = """
import cyctx
def collect():
    cyctx.ContextGuard(0)  # made, never closed: freed at once
"""


def _shown(err):
    # Warnings printed by the default showwarning: "<file>:<line>: ResourceWarning: <text>".
    return len(
        re.findall(r"^\S+:\d+: ResourceWarning: cyctx: a ContextGuard of device 0", err, re.M)
    )


def _stderr(code, *flags):
    proc = subprocess.run(
        [sys.executable, *flags, "-c", PROLOGUE + COLLECT + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


def test_default_filters_ignore_it():
    out, err = _stderr("collect(); print('done')")
    assert out == "done\n" and "ResourceWarning" not in err


@pytest.mark.parametrize("flags", [["-X", "dev"], ["-W", "default::ResourceWarning"]])
def test_dev_mode_and_W_show_it(flags):
    _, err = _stderr("collect()", *flags)
    assert _shown(err) == 1, err


def test_a_filter_changed_after_a_decision_is_obeyed():
    _, err = _stderr(
        """
        import warnings
        collect()                                   # ignored (the default filters)
        warnings.simplefilter("default", ResourceWarning)
        collect()                                   # shown
        warnings.resetwarnings()
        warnings.filters[:] = [("ignore", None, ResourceWarning, None, 0)]
        collect()                                   # ignored again
        warnings.filters.insert(0, ("error", None, ResourceWarning, None, 0))  # in place
        collect()                                   # raised: reported as unraisable
        """
    )
    assert _shown(err) == 1, err
    assert err.count("Exception ignored in: 'cyctx._guard.ContextGuard.__dealloc__'") == 1, err


def test_a_filter_naming_a_module_is_left_to_warn():
    # Whether it matches depends on the code running when the guard is freed: warn decides.
    _, err = _stderr(
        """
        import warnings
        warnings.filterwarnings("default", category=ResourceWarning, module="__main__")
        collect()   # freed in __main__: shown
        """
    )
    assert _shown(err) == 1, err
    _, err = _stderr(
        """
        import warnings
        warnings.filterwarnings("default", category=ResourceWarning, module="elsewhere")
        collect()   # freed in __main__: the module filter does not match, the default ignores
        """
    )
    assert "ResourceWarning" not in err, err
    _, err = _stderr(
        """
        import warnings
        warnings.simplefilter("default", ResourceWarning)
        warnings.filterwarnings("ignore", category=ResourceWarning, module="elsewhere")
        collect()   # the ignoring filter is another module's: the next one shows it
        """
    )
    assert _shown(err) == 1, err


def test_a_message_filter_is_matched_against_the_warning_text():
    _, err = _stderr(
        """
        import warnings
        warnings.filterwarnings("default", message="cyctx: a ContextGuard", category=ResourceWarning)
        collect()
        warnings.resetwarnings()
        warnings.filterwarnings("ignore", category=ResourceWarning)
        warnings.filterwarnings("default", message="something else", category=ResourceWarning)
        collect()
        """
    )
    assert _shown(err) == 1, err
