"""The typing stubs (cyctx/__init__.pyi) against the module: the same public names, the same
public members of ContextGuard; the doctor's records (cyctx.doctor, typed Python) typed;
and, where mypy is installed (CI's docs step installs it), mypy's stubtest against the
installed package, and that a type checker rejects what the run time rejects
(ContextGuard("0"))."""

import ast
import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

import cyctx

STUB = os.path.join(os.path.dirname(cyctx.__file__), "__init__.pyi")


def _stub():
    with open(STUB, encoding="utf-8") as f:
        return ast.parse(f.read())


def _public(names):
    return {n for n in names if not n.startswith("_") or n in ("__version__",)}


def test_stub_declares_every_public_name():
    tree = _stub()
    declared = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
        elif isinstance(node, ast.Assign):
            declared.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):  # `import X as X` re-exports X in a stub
            declared.update(a.name for a in node.names if a.asname == a.name)
    missing = set(cyctx.__all__) - declared
    assert not missing, f"in cyctx.__all__ but not in __init__.pyi: {sorted(missing)}"
    extra = {n for n in _public(declared) if n != "DeviceLike"} - set(cyctx.__all__)
    assert not extra, f"in __init__.pyi but not exported by cyctx: {sorted(extra)}"


@pytest.mark.parametrize("cls", ["ContextGuard"])
def test_stub_members_match_the_class(cls):
    node = next(n for n in _stub().body if isinstance(n, ast.ClassDef) and n.name == cls)
    stub_members = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    stub_members |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
    runtime = getattr(cyctx, cls)
    public = {n for n in dir(runtime) if not n.startswith("_")}
    if dataclasses.is_dataclass(runtime):
        public |= {f.name for f in dataclasses.fields(runtime)}
    assert public - stub_members == set(), f"{cls}: public at run time, missing in the stub"
    assert _public(stub_members) - public == set(), f"{cls}: in the stub, missing at run time"
    for dunder in ("__enter__", "__exit__", "__init__"):
        if dunder in stub_members:
            assert hasattr(runtime, dunder)


def test_stub_documents_every_public_name():
    # IDEs show the stub's docstrings on hover, not the compiled module's: each public class,
    # function, method and property of the stub carries one.
    missing = []

    def visit(nodes, prefix):
        for node in nodes:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                name = prefix + node.name
                public = not node.name.startswith("_") or node.name in (
                    "__init__",
                    "__enter__",
                    "__exit__",
                )
                if public and ast.get_docstring(node) is None:
                    missing.append(name)
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    visit(node.body, name + ".")

    visit(_stub().body, "")
    assert missing == []


def test_diagnosis_fields_are_typed():
    # Diagnosis.findings and the other records are their classes, not Any.
    import typing

    import cyctx.doctor as doctor

    hints = typing.get_type_hints(doctor.Diagnosis)
    assert (
        hints["findings"] == list[doctor.Finding] and hints["loaded"] == list[doctor.LoadedLibrary]
    )
    assert hints["devices"] == list[doctor.DeviceInfo]
    assert hints["guards"] == list[doctor.GuardInfo]
    assert hints["runtime"] == doctor.RuntimeInfo | None
    assert hints["context"] == doctor.ContextInfo | None
    assert not [f for f, a in hints.items() if a is typing.Any]


def test_pyright_verifytypes_finds_every_export_typed_and_documented(tmp_path):
    import shutil

    pyright = shutil.which("pyright")
    if pyright is None:
        pytest.skip("pyright is not installed here (CI's docs step runs this)")
    out = subprocess.run(
        [pyright, "--verifytypes", "cyctx", "--outputjson"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    import json

    report = json.loads(out.stdout)["typeCompleteness"]
    assert report["completenessScore"] == 1.0
    undocumented = [
        s["name"]
        for s in report["symbols"]
        if s["isExported"]
        and s["name"].startswith("cyctx.")
        and any("docstring" in d["message"] for d in s["diagnostics"])
    ]
    assert undocumented == []


def test_a_type_checker_rejects_what_the_run_time_rejects(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed here (CI's docs step runs this)")
    src = tmp_path / "use.py"
    src.write_text(
        textwrap.dedent("""
        import cyctx
        cyctx.ContextGuard(0)
        cyctx.ContextGuard.shared(1)
        cyctx.ContextGuard.from_handle(0x1234)
        cyctx.ContextGuard("0")          # line 6
        cyctx.ContextGuard(1.5)          # line 7
        cyctx.ContextGuard.shared("0")   # line 8
        cyctx.device("0")                # line 9
        inc: str = cyctx.get_include()
        dirs: list[str] = cyctx.get_include_dirs()
        dev: int | None = cyctx.current_device()
        @cyctx.device(0)
        def f(a: int) -> int:
            return a
        f("x")                           # line 16: the decorator keeps the signature
        bad: int = cyctx.current_device()  # line 17: it may be None
        cyctx.ContextGuard.shared(torch_like)
    """).replace(
            "import cyctx\n",
            "import cyctx\nclass _T:\n    index = 1\n    type = 'cuda'\ntorch_like = _T()\n",
            1,
        )
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--ignore-missing-imports",
            "--follow-imports=silent",
            "--no-error-summary",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = sorted({int(ln.split(":")[1]) for ln in out.stdout.splitlines() if ": error:" in ln})
    assert lines == [10, 11, 12, 13, 20, 21], out.stdout  # the lines above, after _T


# stubtest type-checks every module of the package before it compares the stub with the
# imported package: cuda.bindings and cyctx's compiled modules have no stubs of their own, and
# testing.py and _cuda_headers.py, outside the stub, are not held to it here.
STUBTEST_CONFIG = """\
[mypy]
[mypy-cuda.*,torch.*,cyctx._guard,cyctx._build_info]
ignore_missing_imports = True
[mypy-cyctx.testing,cyctx._cuda_headers]
ignore_errors = True
"""

# What stubtest cannot see, or reads differently from the stub, one reason each.
STUBTEST_ALLOWLIST = """\
# A Cython extension type: introspection sees __init__(self, *args, **kwargs).
cyctx.ContextGuard.__init__
# A Cython extension type is a disjoint base (PEP 800); the stub does not say @disjoint_base,
# which type checkers older than PEP 800 do not know.
cyctx.ContextGuard
# Only in the stub: the type of what ContextGuard() accepts.
cyctx.DeviceLike
# The stub declares each name of cyctx.__all__ (test_stub_declares_every_public_name checks)
# rather than repeating the list.
cyctx.__all__
# ctypes.c_longlong is ctypes.c_long at run time on 64-bit Linux.
cyctx.testing.CONTROL_API
"""


def test_stubtest_against_the_installed_package(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed here (CI's docs step runs this)")
    (tmp_path / "mypy.ini").write_text(STUBTEST_CONFIG)
    (tmp_path / "allowlist.txt").write_text(STUBTEST_ALLOWLIST)
    # From tmp_path, so that `cyctx` is the installed package. --ignore-unused-allowlist: mypy
    # releases before PEP 800 do not report the disjoint base at all.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy.stubtest",
            "cyctx",
            "--concise",
            "--mypy-config-file",
            "mypy.ini",
            "--allowlist",
            "allowlist.txt",
            "--ignore-unused-allowlist",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=dict(os.environ, MYPY_CACHE_DIR=str(tmp_path / "cache")),
    )
    assert out.returncode == 0, out.stdout + out.stderr
