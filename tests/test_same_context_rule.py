""" "The same handle with a new id is another context" is one rule, written once
(``_cyctx_libcuda.same_context``), which the doctor's guard records and the pytest plugin's
comparison both use: a reset is judged alike by both."""

import ast
import inspect

import pytest

import _cyctx_pytest
from _cyctx_libcuda import same_context
from cyctx._doctor import model
from cyctx._doctor.model import GuardInfo
from cyctx.pytest_plugin import ContextState, changes


@pytest.mark.parametrize(
    ("before", "after", "same"),
    [
        ((0x10, 1), (0x10, 1), True),
        ((0x10, 1), (0x10, 2), False),  # reset: the handle stays, the id changes
        ((0x10, 1), (0x10, None), False),  # the id is gone: destroyed
        ((0x10, 1), (0x20, 1), False),
        ((0, None), (0, None), True),  # nothing current, twice
        ((0x10, 1), (0, None), False),
    ],
)
def test_the_rule(before, after, same):
    assert same_context(before, after) is same


def _calls(module):
    tree = ast.parse(inspect.getsource(module))
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "same_context"
    ]


def test_the_doctor_and_the_plugin_both_use_it():
    assert _calls(_cyctx_pytest), "the plugin compares contexts without same_context"
    assert _calls(model), "the doctor's guard records judge a reset without same_context"


@pytest.mark.parametrize(("seen", "now"), [(1, 1), (1, 2), (1, None)])
def test_both_judge_a_reset_alike(seen, now):
    guard = GuardInfo(
        device=0, handle=0x10, seen_id=seen, driver_id=now, driver_id_error=None, shared=False
    )
    plugin = changes(ContextState("ok", 0x10, 0, seen), ContextState("ok", 0x10, 0, now))
    assert guard.reset == bool(plugin) == (not same_context((0x10, seen), (0x10, now)))
