"""Tables of the documentation rendered from the code's own tables, so that a page cannot
disagree with what it describes:

* ``{layout}``: every file under ``src/cyctx``, with the first sentence of its own header
  (module docstring or leading comment);
* ``{findings}``: the doctor's findings, from ``cyctx._doctor.rules.RULES`` (code, severity, and
  each rule's docstring) and ``cyctx._doctor.bindings``;
* ``{spellings}``: what a guard can be made from, from ``cyctx._inputs.SPELLINGS``;

and, for conf.py's ``myst_substitutions``, ``{{ pythons }}`` (pyproject.toml's classifiers),
``{{ bindings_range }}`` and ``{{ cuda_extras }}`` (``cyctx._compat``) and ``{{ diagnosis_schema }}``.
"""

from __future__ import annotations

import os
import re
import tomllib

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "src", "cyctx")
_BUILT = re.compile(r"(\.cpp|\.so|\.so\.\d+|\.pyc)$|^_build_info\.py$")


def _inline(text: str) -> str:
    """reST markup of docstrings (``x``, :func:`~.x`) as Markdown code, cells on one line."""
    text = re.sub(r":\w+:`~?\.?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    return " ".join(text.split()).replace("|", "\\|")


def _first_sentence(text: str) -> str:
    para = " ".join(text.strip().split("\n\n")[0].split())
    m = re.search(r"(?<!e\.g)(?<!i\.e)\.(\s|$)", para)
    return para[: m.start() + 1] if m else para


def file_header(path: str) -> str:
    """What a source file says it is: the first sentence of its docstring or leading comment."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not text.strip():
        return ""
    doc = re.match(r'\s*"""(.*?)"""', text, re.S)
    block = re.match(r"\s*/\*(.*?)\*/", text, re.S)
    if doc:
        body = doc.group(1)
    elif block:
        body = "\n".join(re.sub(r"^\s*\* ?", "", ln) for ln in block.group(1).splitlines())
        body = re.sub(r"^\s*[\w.]+ -- ", "", body)  # "simdriver.c -- what it is"
    else:
        out = []
        for ln in text.splitlines():
            s = ln.strip()
            if s.startswith(("#", "//")) and not re.match(r"#\s*(include|pragma|define|if)", s):
                out.append(re.sub(r"^(#|//)\s?", "", s))
            elif out or s:
                break
        body = "\n".join(out)
    return _first_sentence(body)


def source_files(pkg: str = PKG) -> list[str]:
    out = []
    for d, dirs, files in os.walk(pkg):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__" and not x.endswith(".egg-info"))
        out += [
            os.path.relpath(os.path.join(d, f), pkg).replace(os.sep, "/")
            for f in sorted(files)
            if not _BUILT.search(f)
        ]
    return out


class _Table(SphinxDirective):
    has_content = False

    def rows(self) -> tuple[list[str], list[list[str]]]:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        head, rows = self.rows()
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        box = nodes.container()
        self.state.nested_parse(StringList(lines, "<code_tables>"), self.content_offset, box)
        return box.children


class Layout(_Table):
    def rows(self):
        if not os.path.isdir(PKG):
            raise self.error(f"no source tree at {PKG}")
        rows = []
        for rel in source_files():
            self.env.note_dependency(os.path.join(PKG, rel))
            what = file_header(os.path.join(PKG, rel))
            if not what and rel != "py.typed":
                raise self.error(f"src/cyctx/{rel} does not say what it is (no header)")
            rows.append([f"`{rel}`", _inline(what) or "PEP 561's marker: the package is typed"])
        return ["file", "what it is (its own header)"], rows


class Findings(_Table):
    def rows(self):
        from cyctx._doctor import bindings, rules

        by_code: dict[str, list] = {}
        for rule in rules.RULES:
            by_code.setdefault(rule.code, []).append(rule)
        rows = []
        for code, group in by_code.items():
            docs = []
            for rule in group:
                if not rule.finds.__doc__:
                    raise self.error(f"the doctor's rule {rule.finds.__name__} has no docstring")
                docs.append(_inline(rule.finds.__doc__))
            rows.append([f"`{code}`", group[0].severity, "; ".join(docs)])
        rows.append(
            [f"`{bindings.CODE}`", bindings.SEVERITY, _inline(_first_sentence(bindings.__doc__))]
        )
        return ["code", "severity", "what"], rows


class Spellings(_Table):
    def rows(self):
        from cyctx._inputs import KINDS, SPELLINGS

        rows = []
        for kind in KINDS:
            seen: list[str] = []
            for sp in SPELLINGS:
                if sp.kind == kind:
                    seen += [w for w in sp.docs if w not in seen]
            rows.append([f"a {kind}", ", ".join(seen)])
        return ["kind", "you pass"], rows


def substitutions() -> dict[str, str]:
    from cyctx._compat import SUPPORTED_MAJORS, supported_range
    from cyctx._doctor.report import SCHEMA

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    minors = sorted(
        int(c.rsplit(".", 1)[1])
        for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    return {
        "pythons": f"CPython 3.{minors[0]} to 3.{minors[-1]}",
        "bindings_range": f"`cuda-bindings{supported_range()}`",
        "cuda_extras": ", ".join(f"`cu{m}`" for m in SUPPORTED_MAJORS),
        "diagnosis_schema": f"`{SCHEMA}`",
    }


def setup(app: Sphinx) -> dict:
    app.add_directive("layout", Layout)
    app.add_directive("findings", Findings)
    app.add_directive("spellings", Spellings)
    return {"parallel_read_safe": True, "version": "1"}
