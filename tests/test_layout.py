"""docs/design.md's "Layout" section against the package: the files it lists are the files of
src/cyctx, its "who imports whom" column is what the sources import, its import circles are the
ones there are, and its extension list is what setup.py builds.

The section is written in a fixed format between HTML comments, so this test can read it:

* ``<!-- layout -->`` ... ``<!-- /layout -->``: a table, one row per file under src/cyctx,
  ``| `path` | what it is | imports |``. The path is relative to src/cyctx. The imports cell
  lists, comma-separated and each in backticks, the cyctx modules and headers the file
  imports, cimports or includes (``cyctx`` for the package itself, ``_doctor.model`` for a
  module, ``_cpp/thread_entries.h`` for a header); one imported inside a function is followed by
  ``(lazy)``; ``—`` for none. An import under ``if TYPE_CHECKING:`` is left out: it never
  runs, it only names a type for an annotation. Generated files say "(generated)" in the middle cell and may be
  absent.
* ``<!-- circles -->`` ... ``<!-- /circles -->``: the import circles, lazy imports included:
  "none", or each circle as its modules in backticks joined by `` ↔ ``, one per ``*`` item.
* ``<!-- extensions -->`` ... ``<!-- /extensions -->``: ``| `built` | `source` |`` rows: the
  extension modules (``cyctx._guard``) and the simulated driver library.

After changing the package, `python tests/test_layout.py` prints the table as the sources say it
should be (the middle cells kept from design.md, "TODO" for new files) and the circles.
"""

from __future__ import annotations

import ast
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "src", "cyctx")
DESIGN = os.path.join(ROOT, "docs", "design.md")
SETUP = os.path.join(ROOT, "setup.py")

# Build outputs that live beside the sources after an in-place build; never listed.
_GENERATED = re.compile(r"(\.cpp|\.so|\.so\.\d+|\.pyc)$")
_SOURCE_KINDS = (".py", ".pyx", ".pxd", ".pyi", ".h", ".c", ".typed")

pytestmark = pytest.mark.skipif(
    not (os.path.isdir(PKG) and os.path.isfile(DESIGN) and os.path.isfile(SETUP)),
    reason="needs the source tree (src/cyctx, docs/design.md, setup.py): a checkout or the sdist",
)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


# --- the document -------------------------------------------------------------------------------


def _block(text: str, name: str) -> str:
    m = re.search(rf"<!-- {name} -->\n(.*?)<!-- /{name} -->", text, re.S)
    assert m, f"docs/design.md has no <!-- {name} --> ... <!-- /{name} --> block"
    return m.group(1)


def _rows(block: str) -> list[list[str]]:
    rows = []
    for line in block.splitlines():
        line = line.strip()
        if not line.startswith("|") or re.fullmatch(r"\|[-|: ]+\|", line):
            continue
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows[1:]  # the header


def _ticked(cell: str) -> str:
    m = re.fullmatch(r"`([^`]+)`", cell)
    assert m, f"expected one name in backticks, got {cell!r}"
    return m.group(1)


def documented_layout(text: str | None = None):
    """{path: (what, eager imports, lazy imports)} as design.md states them."""
    text = text if text is not None else _read(DESIGN)
    out = {}
    for row in _rows(_block(text, "layout")):
        assert len(row) == 3, f"a layout row has three cells: {row}"
        path, what, imports = _ticked(row[0]), row[1], row[2]
        assert path not in out, f"{path} is listed twice"
        eager, lazy = set(), set()
        if imports not in ("—", "-", ""):
            for item in imports.split(","):
                m = re.fullmatch(r"\s*`([^`]+)`( \(lazy\))?\s*", item)
                assert m, f"{path}: cannot read {item!r} in {imports!r}"
                (lazy if m.group(2) else eager).add(m.group(1))
        out[path] = (what, eager, lazy)
    return out


def documented_circles(text: str | None = None) -> set[frozenset[str]]:
    text = text if text is not None else _read(DESIGN)
    block = _block(text, "circles").strip()
    if re.fullmatch(r"(?i)none\.?", block):
        return set()
    circles = set()
    for line in block.splitlines():
        line = line.strip()
        if not line:
            continue
        assert line.startswith("* "), f"a circle is a '* ' item: {line!r}"
        circles.add(frozenset(re.findall(r"`([^`]+)`", line)))
    return circles


def documented_extensions(text: str | None = None) -> dict[str, str]:
    text = text if text is not None else _read(DESIGN)
    return {_ticked(r[0]): _ticked(r[1]) for r in _rows(_block(text, "extensions"))}


# --- the sources --------------------------------------------------------------------------------


def source_files() -> list[str]:
    """Paths relative to src/cyctx of every source file there (build outputs left out)."""
    out = []
    for d, dirs, files in os.walk(PKG):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__" and not x.endswith(".egg-info"))
        for f in sorted(files):
            if _GENERATED.search(f):
                continue
            out.append(os.path.relpath(os.path.join(d, f), PKG).replace(os.sep, "/"))
    return out


def module_of(path: str) -> str:
    """The import graph's node for a file: `cyctx`, `_guard` (.pyx and .pxd alike), `_doctor`,
    `_doctor.model`; a header or C file is its own node."""
    if path.endswith((".h", ".c")):
        return path
    stem = path.rsplit(".", 1)[0]
    parts = stem.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "cyctx"


def _is_module(dotted: str) -> bool:
    base = os.path.join(PKG, *dotted.split("."))
    return os.path.isdir(base) or any(os.path.isfile(base + e) for e in (".py", ".pyx", ".pxd"))


def _resolve(module: str, names: list[str]) -> set[str]:
    """cyctx nodes named by `from <module> import <names>` (`import <module>`: names=[])."""
    if module != "cyctx" and not module.startswith("cyctx."):
        return set()
    rel = module[len("cyctx.") :] if module != "cyctx" else ""
    out = set()
    for n in names:
        sub = f"{rel}.{n}" if rel else n
        if _is_module(sub):
            out.add(sub)
        else:
            out.add(rel or "cyctx")
    if not names:
        out.add(rel or "cyctx")
    return out


def _is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    if not isinstance(node, ast.If):
        return False
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _py_imports(path: str) -> tuple[set[str], set[str]]:
    tree = ast.parse(_read(os.path.join(PKG, path)), path)
    package = (
        module_of(path) if path.endswith("__init__.py") else module_of(path).rpartition(".")[0]
    )
    eager, lazy = set(), set()

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                for other in child.orelse:
                    visit(ast.Module(body=[other], type_ignores=[]), in_function)
                continue
            inner = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            found = set()
            if isinstance(child, ast.Import):
                for a in child.names:
                    found |= _resolve(a.name, [])
            elif isinstance(child, ast.ImportFrom):
                mod = child.module or ""
                if child.level:
                    base = ["cyctx"] + ([p for p in package.split(".") if p and p != "cyctx"])
                    base = base[: len(base) - (child.level - 1)]
                    mod = ".".join(base + ([mod] if mod else []))
                found = _resolve(mod, [a.name for a in child.names])
            (lazy if in_function else eager).update(found)
            visit(child, inner)

    visit(tree, False)
    return eager, lazy - eager


_CY_FROM = re.compile(r"^(\s*)from\s+([\w.]+)\s+c?import\s+(.*)$")
_CY_IMPORT = re.compile(r"^(\s*)c?import\s+([\w.]+)")
_EXTERN = re.compile(r'^\s*cdef\s+extern\s+from\s+"([^"]+)"')
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def _header(path: str, name: str) -> str | None:
    # Where the compiler looks: beside the includer, then setup.py's include_dirs (the package
    # and its include/, where get_include() points Cython code that cimports cyctx).
    for cand in (os.path.join(os.path.dirname(path), name), name, os.path.join("include", name)):
        cand = os.path.normpath(cand).replace(os.sep, "/")
        if os.path.isfile(os.path.join(PKG, cand)):
            return cand
    return None


def _text_imports(path: str) -> tuple[set[str], set[str]]:
    """Cython and C files, by regex: an indented Python import counts as lazy (it is inside a
    function); text inside triple-quoted strings (docstring examples) is skipped."""
    eager, lazy = set(), set()
    lines = _read(os.path.join(PKG, path)).splitlines()
    in_string = False
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        quotes = line.count('"""') + line.count("'''")
        was_in_string = in_string
        if quotes % 2:
            in_string = not in_string
        if was_in_string or quotes:
            continue
        code = line.split("#", 1)[0] if not path.endswith((".h", ".c")) else line
        m = _INCLUDE.match(line) if path.endswith((".h", ".c")) else _EXTERN.match(code)
        if m:
            h = _header(path, m.group(1))
            if h:
                eager.add(h)
            continue
        m = _CY_FROM.match(code)
        if m:
            names = m.group(3)
            while "(" in names and ")" not in names and i < len(lines):
                names += " " + lines[i].split("#", 1)[0]
                i += 1
            names = [
                n.split(" as ")[0].strip()
                for n in names.strip("() ").replace("(", "").replace(")", "").split(",")
            ]
            found = _resolve(m.group(2), [n for n in names if n])
            (lazy if m.group(1) else eager).update(found)
            continue
        m = _CY_IMPORT.match(code)
        if m:
            (lazy if m.group(1) else eager).update(_resolve(m.group(2), []))
    return eager, lazy - eager


def source_imports(path: str) -> tuple[set[str], set[str]]:
    """(eager, lazy) cyctx nodes a source file imports, leaving out itself."""
    if path.endswith((".py", ".pyi")):
        eager, lazy = _py_imports(path)
    elif path.endswith((".pyx", ".pxd", ".h", ".c")):
        eager, lazy = _text_imports(path)
    else:
        return set(), set()
    me = module_of(path)
    return eager - {me}, lazy - {me}


def import_circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), set()

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.add(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def source_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in source_files():
        eager, lazy = source_imports(path)
        graph.setdefault(module_of(path), set()).update(eager | lazy)
    for v in list(graph):
        graph[v].discard(v)
    return graph


def setup_extensions() -> dict[str, str]:
    """{built: source} from setup.py: each `_ext("name")` (cyctx.name from name.pyx) or
    `Extension("cyctx.x", ["src/cyctx/x.pyx"])`, and the library `link_shared_object` makes
    from the C file `compiler.compile` compiles."""
    tree = ast.parse(_read(SETUP), "setup.py")
    out = {}
    c_sources, libraries = [], []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = (
            node.func.attr
            if isinstance(node.func, ast.Attribute)
            else getattr(node.func, "id", None)
        )
        consts = [
            a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
        ]
        if fn == "_ext" and consts:
            out[f"cyctx.{consts[0]}"] = f"{consts[0]}.pyx"
        elif fn == "Extension" and consts and isinstance(node.args[1], ast.List):
            src = [e.value for e in node.args[1].elts if isinstance(e, ast.Constant)]
            out[consts[0]] = src[0].removeprefix("src/cyctx/")
        elif fn == "compile" and node.args and isinstance(node.args[0], ast.List):
            c_sources += [e.value for e in node.args[0].elts if isinstance(e, ast.Constant)]
        elif fn == "link_shared_object" and consts:
            libraries += consts
    for lib, src in zip(libraries, c_sources):
        rel = src.removeprefix("src/cyctx/")
        out[f"cyctx/{os.path.dirname(rel)}/{lib}"] = rel
    return out


# --- the tests ----------------------------------------------------------------------------------


def test_every_source_file_is_listed_and_every_listed_file_exists():
    doc = documented_layout()
    files = set(source_files())
    unlisted = sorted(files - set(doc))
    missing = sorted(
        p for p, (what, _, _) in doc.items() if p not in files and "(generated)" not in what
    )
    assert not unlisted, (
        f"files in src/cyctx that docs/design.md's layout does not list: {unlisted}"
    )
    assert not missing, f"docs/design.md's layout lists files that do not exist: {missing}"


def test_who_imports_whom_is_what_the_sources_import():
    doc = documented_layout()
    wrong = []
    for path in source_files():
        if path not in doc:
            continue  # reported by the test above
        eager, lazy = source_imports(path)
        _, d_eager, d_lazy = doc[path]
        if (eager, lazy) != (d_eager, d_lazy):
            wrong.append(
                f"{path}: design.md says {_cell(d_eager, d_lazy)}; the source: {_cell(eager, lazy)}"
            )
    assert not wrong, "docs/design.md's layout disagrees with the imports:\n" + "\n".join(wrong)


def test_the_import_circles_are_the_documented_ones():
    found = import_circles(source_graph())
    assert found == documented_circles(), (
        f"import circles in the sources: {sorted(map(sorted, found))}; "
        f"docs/design.md says: {sorted(map(sorted, documented_circles()))}"
    )


def test_the_extensions_listed_are_the_ones_setup_py_builds():
    built = setup_extensions()
    assert built, "found no extension in setup.py"
    assert documented_extensions() == built
    for src in built.values():
        assert os.path.isfile(os.path.join(PKG, src)), src


# The checks above must catch a module added without its row, a changed import and a new circle:
# run them on a copy of the real layout with each change made.


def test_an_undocumented_module_is_caught(tmp_path, monkeypatch):
    import shutil

    copy = tmp_path / "cyctx"
    shutil.copytree(
        PKG, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.so.*", "*.cpp")
    )
    (copy / "_doctor" / "words.py").write_text("from cyctx._doctor import model\n")
    monkeypatch.setattr(sys.modules[__name__], "PKG", str(copy))
    with pytest.raises(AssertionError, match="_doctor/words.py"):
        test_every_source_file_is_listed_and_every_listed_file_exists()


def test_a_changed_import_and_a_new_circle_are_caught():
    text = _read(DESIGN)
    doc = documented_layout(text)
    # Drop one documented import of a file that has one: the table no longer matches.
    path = next(p for p in sorted(doc) if doc[p][1])
    eager, lazy = doc[path][1], doc[path][2]
    assert source_imports(path) == (eager, lazy)
    assert source_imports(path) != (set(sorted(eager)[1:]), lazy)
    # A new edge back from a leaf closes a circle that is not documented.
    graph = source_graph()
    graph["_compat"] = graph.get("_compat", set()) | {"cyctx"}
    assert import_circles(graph) != documented_circles(text)


def test_an_import_for_annotations_only_is_left_out(tmp_path, monkeypatch):
    for name in ("_errors", "_inputs", "_compat"):
        (tmp_path / f"{name}.py").write_text("")
    (tmp_path / "words.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from cyctx import _errors\n"
        "if TYPE_CHECKING:\n"
        "    from cyctx import _inputs\n"
        "else:\n"
        "    from cyctx import _compat\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PKG", str(tmp_path))
    assert _py_imports("words.py") == ({"_errors", "_compat"}, set())


def _cell(eager: set[str], lazy: set[str]) -> str:
    items = [f"`{m}`" for m in sorted(eager)] + [f"`{m}` (lazy)" for m in sorted(lazy)]
    return ", ".join(items) or "—"


def main() -> None:
    """Print the layout table and the circles as the sources say they should be."""
    try:
        doc = documented_layout()
    except AssertionError:
        doc = {}
    print("| file | what it is | imports |\n|---|---|---|")
    for path in source_files():
        what = doc.get(path, ("TODO",))[0]
        print(f"| `{path}` | {what} | {_cell(*source_imports(path))} |")
    for path, (what, eager, lazy) in doc.items():
        if "(generated)" in what and path not in source_files():
            print(f"| `{path}` | {what} | {_cell(eager, lazy)} |")
    circles = import_circles(source_graph())
    print("\ncircles:", "none" if not circles else "")
    for c in sorted(map(sorted, circles)):
        print("* " + " ↔ ".join(f"`{m}`" for m in c))
    print("\nextensions:", setup_extensions())


if __name__ == "__main__":
    sys.exit(main())
