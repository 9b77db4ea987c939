"""The context-leak checker for pytest: ``pytest --cyctx-check-contexts``.

The plugin is the top-level package ``_cyctx_pytest``, which pytest loads through cyctx's
``pytest11`` entry point (named ``cyctx.pytest_plugin``): it lives outside this package so
that loading it imports neither cyctx nor cuda-bindings, in every pytest process of the
environment. This module gives its public names their documented home; ``-p cyctx.pytest_plugin``
and ``-p no:cyctx.pytest_plugin`` name the entry point. docs/testing.md tells what is checked.
"""

from _cyctx_pytest import (
    ContextState,
    ContextStateChanged,
    Observer,
    changes,
    check_thread,
    pytest_addoption,
    pytest_configure,
)

# Named where users import them from (docs, reprs, tracebacks).
for _obj in (ContextState, ContextStateChanged, Observer, changes, check_thread):
    _obj.__module__ = __name__
del _obj

__all__ = ["ContextState", "ContextStateChanged", "Observer", "changes", "check_thread"]
# Hooks, so that a conftest's `pytest_plugins = ["cyctx.pytest_plugin"]` is the plugin too (with
# the entry point loaded, pytest finds the name registered and loads nothing twice).
_HOOKS = (pytest_addoption, pytest_configure)
