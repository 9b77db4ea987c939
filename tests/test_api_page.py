"""docs/api.md: each class documented with ``:members:`` opens with a summary table
(``autosummary``) of exactly those members, so the table cannot leave one out or name one that
the page does not document."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def summaries(text: str) -> dict[str, tuple[list[str], list[str]]]:
    """{class: (its :members: list, the names of the autosummary nested under it)}."""
    out = {}
    for m in re.finditer(
        r"^\.\. autoclass:: ([\w.]+)(?:\(.*?\))?\n   :members:(.*)\n((?:\n|   .*\n)*)", text, re.M
    ):
        members = [x.strip() for x in m.group(2).split(",") if x.strip()]
        body = m.group(3)
        listed = []
        if ".. autosummary::" in body:
            after = body.split(".. autosummary::", 1)[1]
            listed = re.findall(r"^      (\w+)$", after, re.M)
        out[m.group(1)] = (members, listed)
    return out


def test_each_class_has_a_summary_of_its_members():
    with open(os.path.join(ROOT, "docs", "api.md"), encoding="utf-8") as f:
        found = summaries(f.read())
    assert "cyctx.ContextGuard" in found and "cyctx.doctor.Diagnosis" in found, sorted(found)
    for cls, (members, listed) in found.items():
        assert listed, f"{cls}: no summary table"
        if members:  # an explicit :members: list; a bare :members: documents all
            assert listed == members, f"{cls}: the summary lists {listed}, :members: {members}"


def test_a_summary_that_drifts_is_caught():
    text = (
        ".. autoclass:: cyctx.X(a)\n   :members: one, two\n\n   .. autosummary::\n"
        "      :nosignatures:\n\n      one\n\n.. autoclass:: cyctx.Y\n   :members: three\n"
    )
    assert summaries(text) == {"cyctx.X": (["one", "two"], ["one"]), "cyctx.Y": (["three"], [])}
