"""Signatures with types for autodoc, from cyctx's typing stub.

cyctx's compiled classes carry their signatures in their docstrings without types
(``shared(device)``); the stub ``cyctx/__init__.pyi`` has the types. This fills autodoc's
signature and return annotation, and a property's type, from the stub of the installed
package, so the reference shows what an IDE shows and the two cannot drift apart.
"""

from __future__ import annotations

import ast
import os

from sphinx.application import Sphinx

_STUB: dict[str, ast.AST] = {}


def _load() -> dict[str, ast.AST]:
    if not _STUB:
        import cyctx

        with open(
            os.path.join(os.path.dirname(cyctx.__file__), "__init__.pyi"), encoding="utf-8"
        ) as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                _STUB[f"cyctx.{node.name}"] = node
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef):
                        _STUB[f"cyctx.{node.name}.{sub.name}"] = sub
    return _STUB


def _args(fn: ast.FunctionDef) -> str:
    a = fn.args
    if (
        a.args
        and a.args[0].arg in ("self", "cls")
        and not any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    ):
        a = ast.arguments(
            posonlyargs=a.posonlyargs,
            args=a.args[1:],
            vararg=a.vararg,
            kwonlyargs=a.kwonlyargs,
            kw_defaults=a.kw_defaults,
            kwarg=a.kwarg,
            defaults=a.defaults,
        )
    return f"({ast.unparse(a)})"


def _is_property(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)


def process_signature(app, what, name, obj, options, signature, return_annotation):
    node = _load().get(name)
    if node is None:
        return None
    if isinstance(node, ast.ClassDef):
        # A compiled class has no signature for autodoc to replace, so its page names a
        # placeholder one (`.. autoclass:: cyctx.ContextGuard(device)`); either way the
        # stub's __init__ is what is shown.
        init = _load().get(f"{name}.__init__")
        if isinstance(init, ast.FunctionDef) and signature is not None:
            return _args(init), None
        if any(isinstance(d, ast.Name) and d.id == "dataclass" for d in node.decorator_list):
            return "", None  # a report users receive, never build: its fields are listed below
        return None
    if isinstance(node, ast.FunctionDef):
        ret = ast.unparse(node.returns) if node.returns else None
        if _is_property(node):
            return None  # the type goes in the docstring's header (process_docstring)
        return _args(node), ret
    return None


def process_docstring(app, what, name, obj, options, lines):
    node = _load().get(name)
    # A Python property shows its type already; a compiled class's (autodoc calls it an
    # attribute: a getset descriptor) does not.
    if (
        what in ("property", "attribute")
        and not isinstance(obj, property)
        and isinstance(node, ast.FunctionDef)
        and node.returns is not None
    ):
        # A compiled property without a docstring of its own gets the stub's.
        doc = ast.get_docstring(node)
        if not any(line.strip() for line in lines) and doc:
            lines[:] = doc.splitlines()
        # After the text, so that the first line, which summaries show, stays the docstring's.
        lines.extend(["", f"*Type:* ``{ast.unparse(node.returns)}``"])


def setup(app: Sphinx) -> dict:
    app.connect("autodoc-process-signature", process_signature)
    app.connect("autodoc-process-docstring", process_docstring)
    return {"parallel_read_safe": True, "version": "1"}
