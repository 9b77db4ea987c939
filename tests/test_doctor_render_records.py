"""The doctor's human report prints a Diagnosis, and nothing else declares what it reads.

``render`` (cyctx._doctor.render) is annotated with the record a ``Diagnosis`` is made of
(``DiagnosisRecord``, of the doctor's model, which it imports without importing the report),
rather than with a protocol that repeats the record's fields (a copy that can drift from them).
What it reads of the report is checked here from its source, every branch included, against
the record's own fields and properties; a type checker (CI's stubtest run) checks the types of
the same reads.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect

from cyctx._doctor import render as render_module
from cyctx._doctor.model import DiagnosisRecord
from cyctx._doctor.report import Diagnosis


def _tree() -> ast.Module:
    return ast.parse(inspect.getsource(render_module))


def _render(tree: ast.Module) -> ast.FunctionDef:
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "render")


def _members(cls: type) -> set[str]:
    props = {n for n, v in inspect.getmembers(cls) if isinstance(v, property)}
    return {f.name for f in dataclasses.fields(cls)} | props


def test_render_takes_the_diagnosis_record_itself():
    # A Diagnosis is the record and its forms: no field of its own.
    assert issubclass(Diagnosis, DiagnosisRecord)
    assert dataclasses.fields(Diagnosis) == dataclasses.fields(DiagnosisRecord)
    tree = _tree()
    report = _render(tree).args.args[0]
    assert report.annotation is not None and ast.unparse(report.annotation) == "DiagnosisRecord"
    imported = {
        (node.module, alias.name, alias.asname)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert ("cyctx._doctor.model", "DiagnosisRecord", None) in imported, imported
    # No class of the module declares the record's fields over again.
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            declared = {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
            assert not declared & _members(DiagnosisRecord), (node.name, declared)


def test_everything_render_reads_of_the_report_is_a_member_of_diagnosis():
    fn = _render(_tree())
    name = fn.args.args[0].arg
    reads, loose, attribute_values = set(), 0, set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == name:
                reads.add(node.attr)
                attribute_values.add(id(node.value))
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id == name and id(node) not in attribute_values:
            loose += 1  # the report handed on whole: what is read of it would be out of sight
    assert loose == 0, f"render uses {name!r} other than by reading an attribute"
    assert reads, "render reads nothing of its report?"
    assert reads <= _members(DiagnosisRecord), sorted(reads - _members(DiagnosisRecord))
