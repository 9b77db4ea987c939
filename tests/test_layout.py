"""The package's layout, as the facts that keep it safe to change (docs/design.md, "Layout"): one
extension module owns the native state, only it compiles the private headers (a second one would
hold a second copy of their state, which the first never sees), no import circles
(lazy and type-checking imports included), and the doctor's seams. Each check is a function of
the package directory, also run on a copy with the fact broken, where it must fail."""

from __future__ import annotations

import ast
import os
import re
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "src", "cyctx")
SETUP = os.path.join(ROOT, "setup.py")

# Build outputs that live beside the sources after an in-place build.
_GENERATED = re.compile(r"(\.cpp|\.so|\.so\.\d+|\.pyc)$|^_build_info\.py$")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def source_files(pkg: str = PKG) -> list[str]:
    """Paths relative to the package of every source file in it (build outputs left out)."""
    out = []
    for d, dirs, files in os.walk(pkg):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__" and not x.endswith(".egg-info"))
        out += [
            os.path.relpath(os.path.join(d, f), pkg).replace(os.sep, "/")
            for f in sorted(files)
            if not _GENERATED.search(f)
        ]
    return out


# --- one extension ------------------------------------------------------------------------------


def setup_builds(setup: str = SETUP) -> tuple[list[str], list[str]]:
    """(Cython extension modules, package C sources) that setup.py builds: each ``_ext("name")``
    or ``Extension("cyctx.x", ...)``, and each source under src/ that ``compile([...])`` compiles
    (the build's probes compile files of their own, in temporary folders)."""
    extensions, c_sources = [], []
    for node in ast.walk(ast.parse(_read(setup), setup)):
        if not isinstance(node, ast.Call):
            continue
        fn = (
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        )
        consts = [
            a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
        ]
        if fn == "_ext" and consts:
            extensions.append(f"cyctx.{consts[0]}")
        elif fn == "Extension" and consts:
            extensions.append(consts[0])
        elif fn == "compile" and node.args and isinstance(node.args[0], ast.List):
            c_sources += [
                e.value
                for e in node.args[0].elts
                if isinstance(e, ast.Constant) and str(e.value).startswith("src/")
            ]
    return extensions, c_sources


def test_setup_builds_one_extension_module():
    # Besides the guard, the tracer's module (plain C, its own state: the CUPTI subscription
    # and its buffer; it includes none of _cpp/, checked below like every other file).
    extensions, c_sources = setup_builds()
    assert sorted(extensions) == ["cyctx._guard", "cyctx._trace._native"], (
        f"setup.py builds {extensions}"
    )
    assert c_sources == ["src/cyctx/_sim/simdriver.c", "src/cyctx/_sim/simcupti.c"], (
        f"setup.py compiles {c_sources}"
    )


def test_a_second_extension_is_caught(tmp_path):
    text = _read(SETUP)
    assert '_ext("_guard")' in text
    (tmp_path / "setup.py").write_text(
        text.replace('_ext("_guard")', '_ext("_guard"), _ext("_more")')
    )
    assert sorted(setup_builds(str(tmp_path / "setup.py"))[0]) == [
        "cyctx._guard",
        "cyctx._more",
        "cyctx._trace._native",
    ]


# --- only it includes the private headers -------------------------------------------------------

_EXTERN = re.compile(r'^\s*cdef\s+extern\s+from\s+"([^"]+)"', re.M)
_C_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
_PXI = re.compile(r'^include\s+"([^"]+)"', re.M)
_CIMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+cimport|cimport\s+([\w.]+))", re.M)


def _cimports(text: str) -> set[str]:
    return {(a or b) for a, b in _CIMPORT.findall(text)}


# The folders of private headers: the driver layer's and the Python-protocol layer's.
PRIVATE = ("_cpp/", "_protocol/")


def private_header_users(pkg: str = PKG) -> dict[str, set[str]]:
    """{file: the private headers it names}, for every file outside their folders that names one."""
    out = {}
    for path in source_files(pkg):
        if path.startswith(PRIVATE) and path.endswith(".h"):
            continue
        if not path.endswith((".pyx", ".pxd", ".pxi", ".h", ".c")):
            continue
        text = _read(os.path.join(pkg, path))
        names = set(_EXTERN.findall(text)) | set(_C_INCLUDE.findall(text))
        private = {n for n in names if n.startswith(PRIVATE)}
        if private:
            out[path] = private
    return out


def extension_sources(pkg: str = PKG, module: str = "_guard") -> set[str]:
    """The files compiled into cyctx.<module> alone: its .pyx, the .pxi files it includes, and
    the package's .pxd files that only it cimports (the public ``__init__.pxd`` and what it
    cimports reach every module that cimports cyctx, so they are not its alone)."""
    own = {f"{module}.pyx"}
    own |= set(_PXI.findall(_read(os.path.join(pkg, f"{module}.pyx"))))
    users: dict[str, set[str]] = {}
    for path in source_files(pkg):
        if path.endswith((".pyx", ".pxd", ".pxi")):
            for dotted in _cimports(_read(os.path.join(pkg, path))):
                if dotted.startswith("cyctx."):
                    users.setdefault(dotted[len("cyctx.") :].replace(".", "/") + ".pxd", set()).add(
                        path
                    )
    # To a fixpoint: a .pxd cimported only by the module's own .pxd files is its own too.
    while True:
        own_files = own | {f"{module}.pxd"}
        more = {p for p, by in users.items() if by <= own_files and p != f"{module}.pxd"} - own
        if not more:
            return own
        own |= more


def test_only_the_extension_includes_the_private_headers():
    users = private_header_users()
    assert users, "no file names a _cpp/ header: has the folder moved?"
    strays = {p: h for p, h in users.items() if p not in extension_sources()}
    assert not strays, f"files outside cyctx._guard that compile private headers: {strays}"


def test_a_private_header_named_by_another_file_is_caught(tmp_path):
    copy = tmp_path / "cyctx"
    shutil.copytree(
        PKG, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.so.*", "*.cpp")
    )
    # The public contract names a private header: every consumer would compile its state.
    with open(copy / "_guard.pxd", "a") as f:
        f.write('\ncdef extern from "_cpp/thread_entries.h":\n    pass\n')
    # A .pxd that only _guard.pyx cimports is its own; cimported by the public one, it is not.
    with open(copy / "__init__.pxd", "a") as f:
        f.write("\nfrom cyctx._driver cimport DriverApi\n")
    strays = set(private_header_users(str(copy))) - extension_sources(str(copy))
    assert strays == {"_guard.pxd", "_driver.pxd"}


# --- no import circles --------------------------------------------------------------------------


def _module_of(path: str) -> str:
    parts = path.rsplit(".", 1)[0].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["cyctx", *parts])


_STRING = re.compile(r'"""(?:.|\n)*?"""' + r"|'''(?:.|\n)*?'''")
_IMPORT_LINE = re.compile(r"^(\s*)((?:from\s+[\w.]+\s+import\s|import\s).*)$", re.M)


def _python_source(pkg: str, path: str) -> str:
    """A .py file's text; for a .pyx, its Python import statements (docstrings dropped; a
    statement indented in the source stands inside a function, so it stays lazy)."""
    text = _read(os.path.join(pkg, path))
    if not path.endswith(".pyx"):
        return text
    out = []
    for indent, stmt in _IMPORT_LINE.findall(_STRING.sub("", text)):
        stmt = stmt.split("#", 1)[0].rstrip()
        out.append(f"def _():\n    {stmt}" if indent else stmt)
    return "\n".join(out) + "\n"


def python_imports(pkg: str, path: str) -> set[str]:
    """The cyctx modules a .py file imports, at any depth (lazy ones, and those under
    ``if TYPE_CHECKING:``, too). ``from cyctx.a import b`` counts as ``cyctx.a.b`` when that is a
    module, else as ``cyctx.a``."""
    me = _module_of(path)
    package = me if path.endswith("__init__.py") else me.rpartition(".")[0]
    modules = {_module_of(p) for p in source_files(pkg) if p.endswith((".py", ".pyx"))}
    found = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                mod = child.module or ""
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    mod = ".".join(base + ([mod] if mod else []))
                for a in child.names:
                    found.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod)
            visit(child)

    visit(ast.parse(_python_source(pkg, path), path))
    return {m for m in found if m in modules and m != me}


def import_graph(pkg: str = PKG) -> dict[str, set[str]]:
    """{module: the cyctx modules it imports}, for the .py modules and the extension's .pyx."""
    graph: dict[str, set[str]] = {}
    for path in source_files(pkg):
        if path.endswith((".py", ".pyx")):
            graph.setdefault(_module_of(path), set()).update(python_imports(pkg, path))
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_circles():
    graph = import_graph()
    assert "cyctx._doctor.render" in graph and graph["cyctx._doctor.report"], "the graph is empty?"
    assert import_circles(graph) == []


@pytest.mark.parametrize(
    "extra",
    [
        "from cyctx._doctor.report import Diagnosis\n",  # eager
        "def f():\n    from cyctx._doctor import report\n",  # lazy, relative spelling below
        "def f():\n    from . import report\n",
    ],
)
def test_an_import_circle_is_caught(tmp_path, extra):
    copy = tmp_path / "cyctx"
    shutil.copytree(
        PKG, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.so.*", "*.cpp")
    )
    with open(copy / "_doctor" / "render.py", "a") as f:
        f.write("\n" + extra)
    assert ["cyctx._doctor.render", "cyctx._doctor.report"] in import_circles(
        import_graph(str(copy))
    )


def test_an_import_for_annotations_only_counts_too(tmp_path):
    copy = tmp_path / "cyctx"
    copy.mkdir()
    for name in ("__init__", "a", "b", "c", "d"):
        (copy / f"{name}.py").write_text("")
    (copy / "a.py").write_text(
        "from typing import TYPE_CHECKING\nfrom cyctx import b\n"
        "if TYPE_CHECKING:\n    from cyctx import c\nelse:\n    from cyctx import d\n"
    )
    assert python_imports(str(copy), "a.py") == {"cyctx.b", "cyctx.c", "cyctx.d"}


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module that importing ``start`` may import, ``start`` left out."""
    seen, todo = set(), [start]
    while todo:
        for m in graph.get(todo.pop(), ()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def doctor_seams(graph: dict[str, set[str]]) -> list[str]:
    """The imports that cross the doctor's seams: the census, the fork checks and the tracer
    reaching the doctor; the doctor reaching cyctx.testing (it asks _cyctx_libcuda)."""
    bad = []
    for m in sorted(graph):
        if m in ("cyctx._census", "cyctx._fork", "cyctx._trace") or m.startswith("cyctx._trace."):
            bad += [f"{m} -> {d}" for d in sorted(reach(graph, m)) if d.startswith("cyctx._doctor")]
        if m.startswith("cyctx._doctor"):
            bad += [f"{m} -> cyctx.testing" for d in graph[m] if d == "cyctx.testing"]
    return bad


def test_the_census_fork_checks_and_tracer_import_nothing_of_the_doctor():
    graph = import_graph()
    assert {"cyctx._census", "cyctx._fork", "cyctx._doctor.gather"} <= set(graph)
    assert doctor_seams(graph) == []


@pytest.mark.parametrize(
    ("module", "extra"),
    [
        ("_trace/locate.py", "from cyctx._doctor import words\n"),
        ("_census.py", "def f():\n    from cyctx._doctor.model import Finding\n"),
        ("_doctor/probe.py", "from cyctx.testing import simulated\n"),
    ],
)
def test_a_crossed_seam_is_caught(tmp_path, module, extra):
    copy = tmp_path / "cyctx"
    shutil.copytree(
        PKG, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.so.*", "*.cpp")
    )
    with open(copy / module, "a") as f:
        f.write("\n" + extra)
    assert doctor_seams(import_graph(str(copy))), extra
