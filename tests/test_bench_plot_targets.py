"""bench/plot.py draws the targets of bench/report.py's table, not numbers of its own: a plot that
draws a goal the table does not require makes a missed target look met."""

import ast
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
pytestmark = [
    pytest.mark.tooling,
    pytest.mark.skipif(not os.path.isdir(BENCH), reason="needs the source tree's bench/"),
]


def _plot_source():
    with open(os.path.join(BENCH, "plot.py"), encoding="utf-8") as f:
        return f.read()


def test_plot_draws_no_target_line_at_a_literal_value():
    literal = [
        node.lineno
        for node in ast.walk(ast.parse(_plot_source()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", None) in ("axhline", "axvline")
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ]
    assert literal == [], (
        f"target lines drawn at literal values on lines {literal} of bench/plot.py"
    )


def test_plot_draws_the_16_thread_target_the_report_requires(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    for name in ("report", "plot"):
        sys.modules.pop(name, None)
    import plot
    import report

    assert plot.THREADS16_SPEEDUP_GOAL is report.THREADS16_SPEEDUP_GOAL
    drawn = re.search(r"axhline\(\s*(\w+)", _plot_source()).group(1)
    assert drawn == "THREADS16_SPEEDUP_GOAL"
